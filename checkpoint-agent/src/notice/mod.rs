//! Termination notices from the cloud's instance metadata service.
//!
//! Each cloud is a [`NoticeSource`]: one question to the metadata service ("is the node being
//! taken?"), answered with a [`TerminationNotice`], nothing, or an error. The shapes are the
//! clouds' own (REFERENCE.md "Termination notices"):
//!
//! - AWS ([`aws::AwsImds`]): IMDSv2 session token, then `spot/instance-action` and
//!   `events/recommendations/rebalance`, 404 while nothing is pending;
//! - GCP ([`gcp::GcpMetadata`]): `instance/preempted`, `TRUE` or `FALSE`;
//! - Azure ([`azure::AzureScheduledEvents`]): Scheduled Events, `Preempt` events for this VM,
//!   acknowledged with `StartRequests` once the checkpoint is durable.
//!
//! The sources speak HTTP through [`MetadataHttp`], so tests can answer in-process on tokio's
//! paused clock and the simulator can serve the same paths under another base URL.
//! [`watch`] polls a source and publishes what it sees on a `watch` channel: a notice stays
//! until the service says it is withdrawn (an unreachable or garbled service withdraws
//! nothing: a VM being taken often loses its metadata service first).

pub mod aws;
pub mod azure;
pub mod gcp;
pub mod http;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use spotplane_core::agent::TerminationNotice;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use http::{MetaRequest, MetaResponse, MetadataHttp, ReqwestMetadata, TransportError};

/// Why a metadata question got no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoticeError {
    /// The service could not be reached (connection refused, timeout).
    #[error("metadata service unreachable: {0}")]
    Unreachable(String),
    /// It answered with a status that means neither "notice" nor "nothing".
    #[error("metadata service answered {status} for {path}")]
    Status { status: u16, path: String },
    /// It answered, but not in the cloud's documented shape.
    #[error("malformed metadata answer for {path}: {reason}")]
    Malformed { path: String, reason: String },
}

impl From<TransportError> for NoticeError {
    fn from(e: TransportError) -> Self {
        NoticeError::Unreachable(e.0)
    }
}

/// One cloud's way of saying the node is being taken.
#[async_trait]
pub trait NoticeSource: Send + Sync {
    /// Asks once. `Ok(None)`: nothing pending now (including a notice that was withdrawn).
    /// `now` stamps `observed_at` and computes deadlines the cloud gives as a duration.
    async fn poll(&self, now: DateTime<Utc>) -> Result<Option<TerminationNotice>, NoticeError>;

    /// Tells the cloud the node is ready to be taken (Azure `StartRequests`), once its
    /// checkpoints are durable. Clouds without such a call do nothing.
    async fn acknowledge(&self, _notice: &TerminationNotice) -> Result<(), NoticeError> {
        Ok(())
    }

    /// The cloud's id for this instance (AWS instance id, GCE instance name, Azure VM name),
    /// when the metadata service says.
    async fn instance_id(&self) -> Option<String> {
        None
    }

    /// A short name for logs.
    fn name(&self) -> &'static str;
}

/// A node with no cloud (`--cloud none`): never a notice.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoNotices;

#[async_trait]
impl NoticeSource for NoNotices {
    async fn poll(&self, _now: DateTime<Utc>) -> Result<Option<TerminationNotice>, NoticeError> {
        Ok(None)
    }

    fn name(&self) -> &'static str {
        "none"
    }
}

/// What the watcher last learned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NoticeView {
    /// The notice in force, if any.
    pub notice: Option<TerminationNotice>,
    /// Consecutive failed polls (0 after a good answer).
    pub failures: u32,
    /// The last failure, while failures > 0.
    pub last_error: Option<NoticeError>,
}

/// Keeps the first sighting of a notice: a cloud that says "still preempted" every poll must
/// not push the deadline (computed from when it was first seen) later each time.
fn merge(previous: Option<&TerminationNotice>, seen: TerminationNotice) -> TerminationNotice {
    match previous {
        Some(p)
            if p.source == seen.source
                && p.action == seen.action
                && p.event_id == seen.event_id =>
        {
            let mut keep = p.clone();
            // A cloud may move the deadline earlier (Azure re-issues NotBefore); never later
            // than first said unless the cloud itself said so explicitly.
            if seen.deadline.is_some()
                && seen.source != spotplane_core::agent::NoticeSource::GcpPreempted
            {
                keep.deadline = seen.deadline;
            }
            keep
        }
        _ => seen,
    }
}

/// Polls `source` every `interval` until `cancel`, publishing changes on `tx`.
///
/// Failures are logged once when they start and once when they end (not every poll), and
/// leave the notice in force as it was. `clock` gives the wall time stamped on notices.
pub async fn watch<C>(
    source: Arc<dyn NoticeSource>,
    interval: Duration,
    clock: C,
    tx: watch::Sender<NoticeView>,
    cancel: CancellationToken,
) where
    C: Fn() -> DateTime<Utc> + Send,
{
    loop {
        let result = tokio::select! {
            r = source.poll(clock()) => r,
            () = cancel.cancelled() => return,
        };
        tx.send_if_modified(|view| apply(view, source.name(), result));
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = cancel.cancelled() => return,
        }
    }
}

/// Folds one poll result into the view; returns whether anything changed.
fn apply(
    view: &mut NoticeView,
    source: &str,
    result: Result<Option<TerminationNotice>, NoticeError>,
) -> bool {
    match result {
        Ok(seen) => {
            if view.failures > 0 {
                tracing::info!(
                    source,
                    after = view.failures,
                    "metadata service answers again"
                );
            }
            let next = seen.map(|n| merge(view.notice.as_ref(), n));
            match (&view.notice, &next) {
                (None, Some(n)) => {
                    tracing::warn!(source, action = %n.action, deadline = ?n.deadline, "termination notice")
                }
                (Some(_), None) => tracing::info!(source, "termination notice withdrawn"),
                _ => {}
            }
            let changed = view.notice != next || view.failures > 0;
            view.notice = next;
            view.failures = 0;
            view.last_error = None;
            changed
        }
        Err(e) => {
            if view.failures == 0 {
                tracing::warn!(source, error = %e, "metadata service failing; keeping the last answer");
            }
            view.failures = view.failures.saturating_add(1);
            view.last_error = Some(e);
            true
        }
    }
}

/// Which cloud's metadata service to watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CloudKind {
    Aws,
    Gcp,
    Azure,
    None,
}

impl CloudKind {
    /// The metadata service's address on a real VM.
    pub fn default_metadata_url(self) -> &'static str {
        match self {
            CloudKind::Aws | CloudKind::Azure => "http://169.254.169.254",
            CloudKind::Gcp => "http://metadata.google.internal",
            CloudKind::None => "",
        }
    }
}

/// The notice source for a cloud, talking to `base` (see [`CloudKind::default_metadata_url`]).
pub fn source_for(
    cloud: CloudKind,
    http: Arc<dyn MetadataHttp>,
    base: &str,
    vm_name: Option<String>,
) -> Arc<dyn NoticeSource> {
    match cloud {
        CloudKind::Aws => Arc::new(aws::AwsImds::new(http, base)),
        CloudKind::Gcp => Arc::new(gcp::GcpMetadata::new(http, base)),
        CloudKind::Azure => Arc::new(azure::AzureScheduledEvents::new(http, base, vm_name)),
        CloudKind::None => Arc::new(NoNotices),
    }
}

#[cfg(test)]
mod tests;
