//! GCE's errors as [`ProviderError`]s: from a failed operation's codes or an SDK error's
//! HTTP status and reasons, all through one `classify`.

use std::time::Duration;

use google_cloud_compute_v1::model::Operation;
use google_cloud_gax::error::rpc::StatusDetails;

use super::DEFAULT_RETRY_AFTER;
use crate::{Offer, ProviderError};

/// A failed GCE operation, as the caller should take it.
pub(super) enum OpOutcome {
    /// The instance exists: an earlier attempt created it.
    AlreadyExists,
    Failed(ProviderError),
}

/// The failure a finished operation reports, if any.
pub(super) fn op_error(op: &Operation, offer: Option<&Offer>) -> Option<OpOutcome> {
    let err = op.error.as_ref().filter(|e| !e.errors.is_empty())?;
    let codes: Vec<String> = err.errors.iter().filter_map(|e| e.code.clone()).collect();
    let message = err
        .errors
        .iter()
        .filter_map(|e| e.message.as_deref())
        .collect::<Vec<_>>()
        .join("; ");
    let status = op
        .http_error_status_code
        .and_then(|c| u16::try_from(c).ok());
    if codes.iter().any(|c| norm(c).ends_with("alreadyexists")) {
        return Some(OpOutcome::AlreadyExists);
    }
    Some(OpOutcome::Failed(classify(
        status, &codes, &message, None, offer,
    )))
}

pub(super) fn is_already_exists(e: &google_cloud_compute_v1::Error) -> bool {
    e.http_status_code() == Some(409)
        || reasons(e)
            .iter()
            .any(|r| norm(r).ends_with("alreadyexists"))
}

fn reasons(e: &google_cloud_compute_v1::Error) -> Vec<String> {
    e.status()
        .map(|s| {
            s.details
                .iter()
                .filter_map(|d| match d {
                    StatusDetails::ErrorInfo(info) => Some(info.reason.clone()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// An SDK error as a provider error. `offer` is the offer being bought, for capacity errors.
pub(super) fn sdk_error(
    e: &google_cloud_compute_v1::Error,
    offer: Option<&Offer>,
) -> ProviderError {
    if e.is_authentication() {
        return ProviderError::Auth(e.to_string());
    }
    if e.is_binding() || e.is_serialization() {
        return ProviderError::InvalidRequest(e.to_string());
    }
    let status = e.http_status_code();
    let codes = reasons(e);
    if status.is_none() && codes.is_empty() {
        // Timeouts, refused connections, unreadable answers.
        return ProviderError::Transient(e.to_string());
    }
    let message = e
        .status()
        .map(|s| s.message.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| e.to_string());
    let retry_after = e
        .http_headers()
        .and_then(|h| h.get("retry-after"))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    classify(status, &codes, &message, retry_after, offer)
}

/// GCE's error codes come as `QUOTA_EXCEEDED` (operations) and `quotaExceeded` (HTTP errors):
/// compared without case and underscores.
fn norm(code: &str) -> String {
    code.chars()
        .filter(|c| *c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The one place GCE failures become [`ProviderError`]s: error codes first (a quota error is a
/// 403 that is not about credentials), then the HTTP status.
fn classify(
    status: Option<u16>,
    codes: &[String],
    message: &str,
    retry_after: Option<Duration>,
    offer: Option<&Offer>,
) -> ProviderError {
    let detail = if codes.is_empty() {
        message.to_owned()
    } else {
        format!("{message} ({})", codes.join(", "))
    };
    let codes: Vec<String> = codes.iter().map(|c| norm(c)).collect();
    let has = |pred: &dyn Fn(&str) -> bool| codes.iter().any(|c| pred(c));
    // A stockout is named by its code; the message is read too because GCE has reported
    // stockouts under other codes with this text, and treating one as a bad request would stop
    // the planner from trying the next offer.
    let stockout = has(&|c| c.starts_with("zoneresourcepoolexhausted") || c == "stockout")
        || message.contains("does not have enough resources");
    if stockout {
        return match offer {
            Some(o) => ProviderError::InsufficientCapacity {
                offer_id: o.id(),
                message: detail,
            },
            None => ProviderError::Transient(detail),
        };
    }
    if has(&|c| c.contains("quotaexceeded")) {
        return ProviderError::Quota(detail);
    }
    if status == Some(429)
        || has(&|c| c.contains("ratelimitexceeded") || c.ends_with("rateexceeded"))
    {
        return ProviderError::Throttled {
            retry_after: retry_after.unwrap_or(DEFAULT_RETRY_AFTER),
        };
    }
    if has(&|c| c.ends_with("notready")) {
        return ProviderError::Transient(detail);
    }
    match status {
        Some(401 | 403) => ProviderError::Auth(detail),
        Some(404) => ProviderError::NotFound(detail),
        Some(408) => ProviderError::Transient(detail),
        Some(s) if (400..500).contains(&s) => ProviderError::InvalidRequest(detail),
        Some(_) => ProviderError::Transient(detail),
        None if has(&|c| c.ends_with("notfound")) => ProviderError::NotFound(detail),
        None => ProviderError::Transient(detail),
    }
}
