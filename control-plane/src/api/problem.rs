//! Errors at the HTTP edge, as `application/problem+json` (RFC 9457).
//!
//! Every error a handler can return is an [`ApiError`]; this is the one place errors become
//! status codes. Bodies name the offending field where there is one and never carry internal
//! details: a database failure is logged here with its cause and answered with a plain 500.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use spotplane_core::{FieldError, FieldErrors};
use utoipa::ToSchema;

use crate::store::StoreError;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem, e.g. `urn:spotplane:problem:validation`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The first offending field, when the problem is about a field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The offending fields with what is wrong with each: the first
    /// [`MAX_PROBLEM_ERRORS`], in the order the rules were checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// How many more offending fields there were beyond those listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub errors_omitted: usize,
    /// The named input limit the request is over (`spotplane_core::limits`), when that is the
    /// problem: `body_bytes` on a 413, the first field's limit on a 422.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// At most this many field errors are listed in a problem; the rest are counted in
/// `errors_omitted`, so a large bad request cannot make a larger answer.
pub const MAX_PROBLEM_ERRORS: usize = 20;
/// Field paths and messages are cut to this many characters (they can quote the request).
const MAX_ERROR_TEXT: usize = 256;
/// A problem's `detail` is cut to this many characters.
const MAX_DETAIL: usize = 1024;

/// `text`, cut to at most `max` characters with an ellipsis where it was cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// Everything a handler can answer besides success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing or invalid bearer token")]
    Unauthenticated,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// The request is well-formed but breaks rules; every broken rule is listed.
    #[error("invalid request: {0}")]
    Validation(FieldErrors),
    /// The request cannot be read (malformed JSON, a bad query string).
    #[error("{detail}")]
    BadRequest {
        detail: String,
        field: Option<String>,
        /// The named limit ([`spotplane_core::limits`]) the field is over, if that is the problem.
        limit: Option<&'static str>,
    },
    #[error("request body larger than {limit} bytes (limit body_bytes)")]
    PayloadTooLarge { limit: usize },
    #[error("expected a JSON body (Content-Type: application/json)")]
    UnsupportedMediaType,
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Over a rate limit; `Retry-After` says when to come back.
    #[error("{detail}")]
    TooManyRequests {
        detail: String,
        retry_after: std::time::Duration,
    },
    #[error("the server is not ready: {0}")]
    Unavailable(String),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = FieldErrors::new();
        e.push(field, message);
        ApiError::Validation(e)
    }

    pub fn forbidden() -> Self {
        ApiError::Forbidden("this token's role may not do this".into())
    }

    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::Unauthenticated => (
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "Authentication required",
            ),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict", "Conflict"),
            ApiError::Validation(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation",
                "Invalid request",
            ),
            ApiError::BadRequest { .. } => {
                (StatusCode::BAD_REQUEST, "bad-request", "Malformed request")
            }
            ApiError::PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Request body too large",
            ),
            ApiError::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
            ),
            ApiError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            ApiError::TooManyRequests { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-requests",
                "Too many requests",
            ),
            ApiError::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal server error",
            ),
        }
    }

    pub fn to_problem(&self) -> Problem {
        let (status, kind, title) = self.parts();
        let (detail, errors) = match self {
            ApiError::Validation(errs) => {
                let shown: Vec<FieldError> =
                    errs.iter().take(MAX_PROBLEM_ERRORS).cloned().collect();
                let mut detail = shown
                    .iter()
                    .map(|e| {
                        format!(
                            "{}: {}",
                            cut(&e.field, MAX_ERROR_TEXT),
                            cut(&e.message, MAX_ERROR_TEXT)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                let omitted = errs.len().saturating_sub(shown.len());
                if omitted > 0 {
                    detail.push_str(&format!("; and {omitted} more"));
                }
                (Some(detail), shown)
            }
            ApiError::BadRequest {
                detail,
                field,
                limit,
            } => (
                Some(detail.clone()),
                field
                    .iter()
                    .map(|f| FieldError {
                        field: f.clone(),
                        message: detail.clone(),
                        limit: limit.map(str::to_owned),
                    })
                    .collect(),
            ),
            ApiError::Internal(_) => (
                Some("the error was logged; retrying may help".into()),
                Vec::new(),
            ),
            ApiError::PayloadTooLarge { .. } => (
                Some(self.to_string()),
                vec![FieldError {
                    field: "body".into(),
                    message: self.to_string(),
                    limit: Some(spotplane_core::limits::BODY_BYTES.name.into()),
                }],
            ),
            other => (Some(other.to_string()), Vec::new()),
        };
        let errors_omitted = match self {
            ApiError::Validation(errs) => errs.len().saturating_sub(errors.len()),
            _ => 0,
        };
        let errors: Vec<FieldError> = errors
            .into_iter()
            .map(|e| FieldError {
                field: cut(&e.field, MAX_ERROR_TEXT),
                message: cut(&e.message, MAX_ERROR_TEXT),
                limit: e.limit,
            })
            .collect();
        Problem {
            kind: format!("urn:spotplane:problem:{kind}"),
            title: title.into(),
            status: status.as_u16(),
            detail: detail.map(|d| cut(&d, MAX_DETAIL)),
            field: errors.first().map(|e| e.field.clone()),
            limit: errors.iter().find_map(|e| e.limit.clone()),
            errors,
            errors_omitted,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Internal(e) => tracing::error!(error = ?e, "request failed"),
            ApiError::Unavailable(why) => tracing::warn!(%why, "request refused: not ready"),
            _ => {}
        }
        let problem = self.to_problem();
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut resp = (status, body).into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if matches!(self, ApiError::Unauthenticated) {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"spotplane\""),
            );
        }
        if let ApiError::TooManyRequests { retry_after, .. } = &self {
            // Whole seconds, rounded up: a client waiting that long finds room.
            let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        resp
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(what) => ApiError::NotFound(format!("no {what}")),
            StoreError::Conflict(why) => ApiError::Conflict(why),
            StoreError::Invalid { field, message } => ApiError::field(field, message),
            other => ApiError::Internal(other.into()),
        }
    }
}

impl From<FieldErrors> for ApiError {
    fn from(e: FieldErrors) -> Self {
        ApiError::Validation(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_lists_at_most_twenty_errors_and_counts_the_rest() {
        let mut errs = FieldErrors::new();
        for i in 0..5000 {
            errs.push(format!("env.K{i}{}", "x".repeat(2000)), "y".repeat(5000));
        }
        let problem = ApiError::Validation(errs).to_problem();
        assert_eq!(problem.errors.len(), MAX_PROBLEM_ERRORS);
        assert_eq!(problem.errors_omitted, 5000 - MAX_PROBLEM_ERRORS);
        assert!(
            problem
                .errors
                .iter()
                .all(|e| e.field.chars().count() <= 257)
        );
        assert!(
            problem
                .errors
                .iter()
                .all(|e| e.message.chars().count() <= 257)
        );
        let body = serde_json::to_vec(&problem).expect("json");
        assert!(body.len() < 16 * 1024, "{} bytes", body.len());
        let back: Problem = serde_json::from_slice(&body).expect("parses");
        assert_eq!(back.errors_omitted, 5000 - MAX_PROBLEM_ERRORS);
    }

    #[test]
    fn a_short_problem_is_listed_whole() {
        let mut errs = FieldErrors::new();
        errs.push("name", "must not be empty");
        errs.push("replicas", "must be between 1 and 1024");
        let problem = ApiError::Validation(errs).to_problem();
        assert_eq!(problem.errors.len(), 2);
        assert_eq!(problem.errors_omitted, 0);
        assert_eq!(
            problem.detail.as_deref(),
            Some("name: must not be empty; replicas: must be between 1 and 1024")
        );
        let json = serde_json::to_value(&problem).expect("json");
        assert!(json.get("errors_omitted").is_none());
    }
}
