//! Request extractors that answer bad input with a problem naming the field.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use std::str::FromStr;

use axum::http::request::Parts;
use axum::http::{Uri, header};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use url::form_urlencoded;
use utoipa::IntoParams;

use super::AppState;
use super::problem::ApiError;
use crate::model::{DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT, PageRequest, Role};
use crate::store::Principal;

/// A JSON request body, read but not yet parsed: handlers check the caller's role first and
/// then [`JsonBody::parse`] it, so a caller without the role gets 403 whatever it sent (no body,
/// another media type, too large a body). What is wrong with the body is only answered by
/// `parse`.
#[derive(Debug, Clone)]
pub struct JsonBody(Result<Bytes, BodyRefused>);

/// Why a body could not be read, kept until [`JsonBody::parse`].
#[derive(Debug, Clone)]
enum BodyRefused {
    NotJson,
    TooLarge { limit: usize },
    Unreadable(String),
}

impl JsonBody {
    /// Parses the body, naming the first offending field in errors.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        match &self.0 {
            Ok(bytes) => parse_json(bytes),
            Err(BodyRefused::NotJson) => Err(ApiError::UnsupportedMediaType),
            Err(BodyRefused::TooLarge { limit }) => {
                Err(ApiError::PayloadTooLarge { limit: *limit })
            }
            Err(BodyRefused::Unreadable(detail)) => Err(ApiError::BadRequest {
                detail: detail.clone(),
                field: None,
                limit: None,
            }),
        }
    }
}

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|mime| {
                let mime = mime.trim().to_ascii_lowercase();
                mime == "application/json"
                    || (mime.starts_with("application/") && mime.ends_with("+json"))
            })
            .unwrap_or(false);
        if !is_json {
            return Ok(JsonBody(Err(BodyRefused::NotJson)));
        }
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|rej| match rej {
                BytesRejection::FailedToBufferBody(_)
                    if rej.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE =>
                {
                    BodyRefused::TooLarge {
                        limit: state.max_body_bytes(),
                    }
                }
                other => BodyRefused::Unreadable(other.body_text()),
            });
        Ok(JsonBody(bytes))
    }
}

/// Parses a JSON object (every request body of this API is one), turning serde's error into a
/// problem that names the field.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        None => {
            return Err(ApiError::BadRequest {
                detail: "the request body is empty; expected a JSON object".into(),
                field: None,
                limit: None,
            });
        }
        Some(_) => return Err(ApiError::field("body", "expected a JSON object")),
    }
    // Refused before parsing: a deep body costs one pass over its bytes, not a recursion.
    let limit = spotplane_core::limits::JSON_DEPTH;
    let depth = spotplane_core::limits::json_depth(bytes, limit.max);
    if depth > limit.max {
        let mut errs = spotplane_core::FieldErrors::new();
        errs.push_over("body", &limit, "nests arrays and objects too deeply");
        return Err(ApiError::Validation(errs));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        match inner.classify() {
            serde_json::error::Category::Syntax
            | serde_json::error::Category::Eof
            | serde_json::error::Category::Io => ApiError::BadRequest {
                detail: format!("malformed JSON: {inner}"),
                field: None,
                limit: None,
            },
            serde_json::error::Category::Data => {
                let message = strip_position(&inner.to_string());
                let field = field_of(&path, &message);
                ApiError::field(field, message)
            }
        }
    })?;
    // One JSON document and nothing after it (but whitespace): `{...}xyz` is malformed, not
    // a request with a comment.
    de.end().map_err(|e| ApiError::BadRequest {
        detail: format!("malformed JSON: {e} after the object"),
        field: Some("body".into()),
        limit: None,
    })?;
    Ok(value)
}

/// serde_json appends " at line 1 column 42" to data errors; the field path says more.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

/// The field an error is about. For a missing field serde reports the enclosing object's path,
/// for an unknown one sometimes too; the field's name is in the message.
fn field_of(path: &str, message: &str) -> String {
    let parent = if path == "." { "" } else { path };
    let named = ["missing field `", "unknown field `"]
        .iter()
        .find_map(|p| message.strip_prefix(p))
        .and_then(|rest| rest.split('`').next());
    match named {
        Some(name) if !parent.ends_with(name) => {
            if parent.is_empty() {
                name.to_owned()
            } else {
                format!("{parent}.{name}")
            }
        }
        _ if parent.is_empty() => "body".to_owned(),
        _ => parent.to_owned(),
    }
}

/// Parses a comma-separated list of values from a query parameter (`state=queued,running`),
/// adding an error under `field` for each value that does not parse.
pub fn comma_list<T: std::str::FromStr<Err = String>>(
    value: Option<&str>,
    field: &str,
    errs: &mut spotplane_core::FieldErrors,
) -> Vec<T> {
    let mut out = Vec::new();
    for s in value
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        match s.parse() {
            Ok(v) => out.push(v),
            Err(m) => errs.push(field, m),
        }
    }
    out
}

/// A query string, with errors as problems.
#[derive(Debug, Clone)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| ApiQuery(q))
            .map_err(query_problem)
    }
}

/// serde_urlencoded (through serde_path_to_error) says "<field>: <what>".
fn query_problem(rej: QueryRejection) -> ApiError {
    let text = rej.body_text();
    let detail = text
        .strip_prefix("Failed to deserialize query string: ")
        .unwrap_or(&text)
        .to_owned();
    let field = match detail.split_once(": ") {
        Some((name, _))
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
        {
            format!("query.{name}")
        }
        _ => "query".to_owned(),
    };
    ApiError::BadRequest {
        detail,
        field: Some(field),
        limit: None,
    }
}

/// The paging parameters every list takes, for the OpenAPI document; [`Listing`] reads them.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// `next_cursor` of the previous page. Anything else is `400` naming `cursor`.
    pub cursor: Option<String>,
    /// Page size, 1 to 500 (default 50). Anything else is `400` naming `limit`.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
}

/// The filters of a list that has none but paging: any other parameter is refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoFilter {}

/// A list request: the endpoint's own filters `F` from the query string, and the page it asks
/// for, whose cursor is a `K` (the sort key of the last item of the page before).
///
/// Every list endpoint takes its paging through this one type, so every list has one rule:
/// `cursor` must parse as a cursor of that list and `limit` must be a whole number from 1 to
/// [`MAX_PAGE_LIMIT`]; anything else, including a parameter given twice, is `400` naming it.
#[derive(Debug, Clone)]
pub struct Listing<F, K> {
    pub filter: F,
    pub page: PageRequest<K>,
}

fn paging_problem(field: &str, detail: String) -> ApiError {
    ApiError::BadRequest {
        detail,
        field: Some(field.to_owned()),
        limit: None,
    }
}

impl<F, K, S> FromRequestParts<S> for Listing<F, K>
where
    F: DeserializeOwned + Send,
    K: FromStr + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        let mut cursor: Option<String> = None;
        let mut limit: Option<String> = None;
        let mut rest = form_urlencoded::Serializer::new(String::new());
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            let slot = match name.as_ref() {
                "cursor" => &mut cursor,
                "limit" => &mut limit,
                _ => {
                    rest.append_pair(&name, &value);
                    continue;
                }
            };
            if slot.replace(value.into_owned()).is_some() {
                return Err(paging_problem(&name, "given more than once".into()));
            }
        }
        let limit = match limit {
            None => DEFAULT_PAGE_LIMIT,
            Some(text) => match text.parse::<u64>() {
                Ok(n) if (1..=MAX_PAGE_LIMIT).contains(&n) => n,
                // A whole number past the bound, however many digits: over the named limit.
                _ if text.bytes().all(|b| b.is_ascii_digit())
                    && text.bytes().any(|b| b != b'0') =>
                {
                    let limit = spotplane_core::limits::PAGE_SIZE;
                    return Err(ApiError::BadRequest {
                        detail: format!(
                            "asks for {text} items: at most {} {} a page (limit {})",
                            limit.max, limit.unit, limit.name
                        ),
                        field: Some("limit".into()),
                        limit: Some(limit.name),
                    });
                }
                _ => {
                    return Err(paging_problem(
                        "limit",
                        format!("must be a whole number from 1 to {MAX_PAGE_LIMIT}"),
                    ));
                }
            },
        };
        let after = match cursor {
            None => None,
            Some(text) => Some(text.parse::<K>().map_err(|_| {
                paging_problem(
                    "cursor",
                    "not a cursor returned by this endpoint; pass a page's next_cursor as is"
                        .into(),
                )
            })?),
        };
        let uri: Uri =
            format!("/?{}", rest.finish())
                .parse()
                .map_err(|_| ApiError::BadRequest {
                    detail: "the query string cannot be read".into(),
                    field: Some("query".into()),
                    limit: None,
                })?;
        let Query(filter) = Query::<F>::try_from_uri(&uri).map_err(query_problem)?;
        Ok(Listing {
            filter,
            page: PageRequest { after, limit },
        })
    }
}

/// The caller, authenticated by its bearer token.
#[derive(Debug, Clone)]
pub struct Auth(pub Principal);

impl Auth {
    /// Passes when the caller has one of `roles`.
    pub fn require(&self, roles: &[Role]) -> Result<&Principal, ApiError> {
        if roles.contains(&self.0.role) {
            Ok(&self.0)
        } else {
            Err(ApiError::forbidden())
        }
    }

    pub fn is_admin(&self) -> bool {
        self.0.role == Role::Admin
    }
}

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or(ApiError::Unauthenticated)?;
        let (scheme, secret) = header.split_once(' ').ok_or(ApiError::Unauthenticated)?;
        if !scheme.eq_ignore_ascii_case("bearer") || secret.trim().is_empty() || secret.len() > 512
        {
            return Err(ApiError::Unauthenticated);
        }
        let principal = state
            .authenticate(secret.trim())
            .await?
            .ok_or(ApiError::Unauthenticated)?;
        Ok(Auth(principal))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spotplane_core::JobSpec;

    fn field_and_status(body: &str) -> (Option<String>, u16) {
        match parse_json::<JobSpec>(body.as_bytes()) {
            Ok(_) => (None, 200),
            Err(e) => {
                let p = e.to_problem();
                (p.field, p.status)
            }
        }
    }

    #[test]
    fn errors_name_the_offending_field() {
        let cases = [
            (
                r#"{"name": "a", "shape": {"gpus": 1}, "command": ["x"]}"#,
                None,
                200,
            ),
            (
                r#"{"shape": {"gpus": 1}, "command": ["x"]}"#,
                Some("name"),
                422,
            ),
            (
                r#"{"name": 5, "shape": {"gpus": 1}, "command": ["x"]}"#,
                Some("name"),
                422,
            ),
            (
                r#"{"name": "a", "shape": {"gpus": "two"}, "command": ["x"]}"#,
                Some("shape.gpus"),
                422,
            ),
            (
                r#"{"name": "a", "shape": {"gpus": 1, "mig": "1g.10gb"}, "command": ["x"]}"#,
                Some("shape"),
                422,
            ),
            (
                r#"{"name": "a", "shape": {"mig": "9g.1gb"}, "command": ["x"]}"#,
                Some("shape.mig"),
                422,
            ),
            (
                r#"{"name": "a", "shape": {"gpus": 1}, "command": ["x"], "gpu": 1}"#,
                Some("gpu"),
                422,
            ),
            (
                r#"{"name": "a", "shape": {"gpus": 1}, "command": [1]}"#,
                Some("command[0]"),
                422,
            ),
            (
                r#"{"name": "a", "shape": {"gpus": 1}, "command": ["x"], "checkpoint": {}}"#,
                Some("checkpoint.uri"),
                422,
            ),
            (
                r#"{"name": "a", "shape": {"gpus": 1}, "command": ["x"], "replicas": -1}"#,
                Some("replicas"),
                422,
            ),
            (r#"{"name": "a""#, None, 400),
            ("[1, 2]", Some("body"), 422),
        ];
        for (body, field, status) in cases {
            let (f, s) = field_and_status(body);
            assert_eq!((f.as_deref(), s), (field, status), "{body}");
        }
    }
}
