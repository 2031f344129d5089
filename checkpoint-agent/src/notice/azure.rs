//! Azure: Scheduled Events of the instance metadata service.
//!
//! `GET metadata/scheduledevents?api-version=2020-07-01` with `Metadata: true` lists pending
//! events; a spot eviction is an event of type `Preempt` naming this VM in `Resources`, with
//! `NotBefore` (RFC 1123, at least 30 s ahead; empty once the event has started). Acknowledging
//! it (`POST` `{"StartRequests": [{"EventId": …}]}`) lets the eviction go ahead early, which the
//! agent does once the checkpoints are durable: the capacity is returned sooner and nothing is
//! lost.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use reqwest::Method;
use serde::Deserialize;
use spotplane_core::agent::{NoticeAction, NoticeSource as Source, TerminationNotice};

use super::{MetaRequest, MetadataHttp, NoticeError, NoticeSource};

pub const EVENTS_PATH: &str = "metadata/scheduledevents?api-version=2020-07-01";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Document {
    #[allow(dead_code)]
    document_incarnation: i64,
    events: Vec<Event>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Event {
    event_id: String,
    event_type: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    event_status: String,
    #[serde(default)]
    not_before: String,
}

pub struct AzureScheduledEvents {
    http: Arc<dyn MetadataHttp>,
    base: String,
    /// This VM's name as Scheduled Events spell it in `Resources`; any VM's event counts
    /// when unknown. Learnt from the instance metadata when not given.
    vm_name: Mutex<Option<String>>,
}

impl AzureScheduledEvents {
    pub fn new(http: Arc<dyn MetadataHttp>, base: &str, vm_name: Option<String>) -> Self {
        AzureScheduledEvents {
            http,
            base: base.to_owned(),
            vm_name: Mutex::new(vm_name),
        }
    }
}

#[async_trait]
impl NoticeSource for AzureScheduledEvents {
    async fn poll(&self, now: DateTime<Utc>) -> Result<Option<TerminationNotice>, NoticeError> {
        let resp = self
            .http
            .send(
                &self.base,
                MetaRequest::get(EVENTS_PATH).header("Metadata", "true"),
            )
            .await?;
        if resp.status != 200 {
            return Err(NoticeError::Status {
                status: resp.status,
                path: EVENTS_PATH.into(),
            });
        }
        let malformed = |reason: String| NoticeError::Malformed {
            path: EVENTS_PATH.into(),
            reason,
        };
        let doc: Document =
            serde_json::from_slice(&resp.body).map_err(|e| malformed(e.to_string()))?;
        let vm = self
            .vm_name
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let ours = doc.events.into_iter().find(|e| {
            e.event_type == "Preempt"
                && vm
                    .as_ref()
                    .is_none_or(|n| e.resources.iter().any(|r| r.eq_ignore_ascii_case(n)))
        });
        let Some(e) = ours else {
            return Ok(None);
        };
        let deadline = if e.not_before.trim().is_empty() {
            // Started: the eviction is under way.
            now
        } else {
            DateTime::parse_from_rfc2822(e.not_before.trim())
                .map_err(|err| malformed(format!("NotBefore {:?}: {err}", e.not_before)))?
                .with_timezone(&Utc)
        };
        tracing::debug!(event = %e.event_id, status = %e.event_status, "azure preempt event");
        Ok(Some(TerminationNotice {
            source: Source::AzureScheduledEvent,
            action: NoticeAction::Preempt,
            deadline: Some(deadline),
            observed_at: now,
            event_id: Some(e.event_id),
        }))
    }

    async fn acknowledge(&self, notice: &TerminationNotice) -> Result<(), NoticeError> {
        let Some(id) = &notice.event_id else {
            return Ok(());
        };
        let body = serde_json::json!({"StartRequests": [{"EventId": id}]}).to_string();
        let resp = self
            .http
            .send(
                &self.base,
                MetaRequest {
                    method: Method::POST,
                    path: EVENTS_PATH.into(),
                    headers: vec![
                        ("Metadata", "true".into()),
                        ("Content-Type", "application/json".into()),
                    ],
                    body: Some(body.into_bytes()),
                },
            )
            .await?;
        if resp.status != 200 {
            return Err(NoticeError::Status {
                status: resp.status,
                path: EVENTS_PATH.into(),
            });
        }
        Ok(())
    }

    async fn instance_id(&self) -> Option<String> {
        let resp = self
            .http
            .send(
                &self.base,
                MetaRequest::get("metadata/instance/compute?api-version=2021-02-01")
                    .header("Metadata", "true"),
            )
            .await
            .ok()?;
        if resp.status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&resp.body).ok()?;
        let name = v["name"].as_str()?.to_owned();
        let mut vm = self.vm_name.lock().unwrap_or_else(|p| p.into_inner());
        if vm.is_none() {
            *vm = Some(name.clone());
        }
        Some(name)
    }

    fn name(&self) -> &'static str {
        "azure-scheduled-events"
    }
}
