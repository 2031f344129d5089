//! GCP: the Compute Engine metadata server.
//!
//! `GET computeMetadata/v1/instance/preempted` with `Metadata-Flavor: Google` answers `TRUE` or
//! `FALSE`. A preempted spot VM gets about 30 seconds (ACPI soft off, then a hard stop), so the
//! deadline is 30 s after the notice was first seen. With [`GcpMetadata::with_wait`], each poll
//! is a held request (`?wait_for_change=true&last_etag=…&timeout_sec=…`) that the server answers
//! as soon as the value changes, so a notice is seen at once rather than at the next poll.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use spotplane_core::agent::{NoticeAction, NoticeSource as Source, TerminationNotice};

use super::{MetaRequest, MetadataHttp, NoticeError, NoticeSource};

pub const PREEMPTED_PATH: &str = "computeMetadata/v1/instance/preempted";
/// How long GCP warns before it stops a preempted VM.
pub const NOTICE_WINDOW_SECS: i64 = 30;

pub struct GcpMetadata {
    http: Arc<dyn MetadataHttp>,
    base: String,
    wait: Option<Duration>,
    last_etag: Mutex<Option<String>>,
}

impl GcpMetadata {
    pub fn new(http: Arc<dyn MetadataHttp>, base: &str) -> Self {
        GcpMetadata {
            http,
            base: base.to_owned(),
            wait: None,
            last_etag: Mutex::new(None),
        }
    }

    /// Hold each poll up to `timeout` waiting for a change (the transport's own timeout must
    /// be longer).
    pub fn with_wait(mut self, timeout: Duration) -> Self {
        self.wait = Some(timeout);
        self
    }
}

#[async_trait]
impl NoticeSource for GcpMetadata {
    async fn poll(&self, now: DateTime<Utc>) -> Result<Option<TerminationNotice>, NoticeError> {
        let path = match (
            self.wait,
            self.last_etag
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        ) {
            (Some(t), Some(etag)) => format!(
                "{PREEMPTED_PATH}?wait_for_change=true&last_etag={etag}&timeout_sec={}",
                t.as_secs().max(1)
            ),
            _ => PREEMPTED_PATH.to_owned(),
        };
        let asked = tokio::time::Instant::now();
        let resp = self
            .http
            .send(
                &self.base,
                MetaRequest::get(path).header("Metadata-Flavor", "Google"),
            )
            .await?;
        // A held request answers when the value changes: that, not the question, is when the
        // notice was seen.
        let now = now
            + chrono::Duration::from_std(asked.elapsed())
                .unwrap_or_else(|_| chrono::Duration::zero());
        if resp.status != 200 {
            return Err(NoticeError::Status {
                status: resp.status,
                path: PREEMPTED_PATH.into(),
            });
        }
        let etag = resp
            .etag
            .clone()
            .filter(|e| !e.is_empty() && e.bytes().all(|b| b.is_ascii_alphanumeric()));
        *self.last_etag.lock().unwrap_or_else(|p| p.into_inner()) = etag;
        match resp.text().trim() {
            "TRUE" => Ok(Some(TerminationNotice {
                source: Source::GcpPreempted,
                action: NoticeAction::Preempt,
                deadline: Some(now + chrono::Duration::seconds(NOTICE_WINDOW_SECS)),
                observed_at: now,
                event_id: None,
            })),
            "FALSE" => Ok(None),
            other => Err(NoticeError::Malformed {
                path: PREEMPTED_PATH.into(),
                reason: format!(
                    "expected TRUE or FALSE, got {:?}",
                    other.chars().take(40).collect::<String>()
                ),
            }),
        }
    }

    async fn instance_id(&self) -> Option<String> {
        let resp = self
            .http
            .send(
                &self.base,
                MetaRequest::get("computeMetadata/v1/instance/name")
                    .header("Metadata-Flavor", "Google"),
            )
            .await
            .ok()?;
        let name = resp.text().trim().to_owned();
        (resp.status == 200 && !name.is_empty()).then_some(name)
    }

    fn name(&self) -> &'static str {
        "gcp-metadata"
    }
}
