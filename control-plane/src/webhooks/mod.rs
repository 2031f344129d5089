//! Webhooks: teams subscribe HTTP endpoints to events; spotplane delivers them from the outbox,
//! at least once, in order per job, signed per Standard Webhooks, with retries.
//!
//! - [`EventType`]: the vocabulary subscribers choose from, and how outbox rows map onto it.
//! - [`signing`]: `whsec_` secrets and the `webhook-signature` header.
//! - [`target`]: which URLs may be called (no credentials; no private, loopback or link-local
//!   addresses unless the admin allows them), enforced again at connection time.
//! - [`retry`]: when to try again, when to give up, when to disable an endpoint (pure).
//! - [`sender`]: one HTTP attempt, with timeouts, reading at most a few KiB of the answer.
//! - [`limit`]: how often a team may ping its endpoints.
//!
//! The delivery loop is `reconcile::webhooks`; its state is all in the store
//! (`webhook_deliveries`), so a restart loses nothing.

pub mod limit;
pub mod retry;
pub mod sender;
pub mod signing;
pub mod target;

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

/// What a subscription can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventType {
    JobQueued,
    JobAdmitted,
    JobRunning,
    /// A replica could not start (its image would not pull, its node has no engine); the
    /// agent's reason is in `reason`. The run counts as a failure and is retried.
    JobStartFailed,
    JobPreempted,
    JobCheckpointed,
    JobResumed,
    JobSucceeded,
    JobFailed,
    JobCancelled,
    NodeNotice,
    BudgetAlert,
    /// One of the team's endpoints was disabled after failing too long.
    WebhookDisabled,
    /// A test message (`POST /v1/webhooks/{id}/ping`); sent to that endpoint only.
    Ping,
}

impl EventType {
    pub const ALL: [EventType; 14] = [
        EventType::JobQueued,
        EventType::JobAdmitted,
        EventType::JobRunning,
        EventType::JobStartFailed,
        EventType::JobPreempted,
        EventType::JobCheckpointed,
        EventType::JobResumed,
        EventType::JobSucceeded,
        EventType::JobFailed,
        EventType::JobCancelled,
        EventType::NodeNotice,
        EventType::BudgetAlert,
        EventType::WebhookDisabled,
        EventType::Ping,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            EventType::JobQueued => "job.queued",
            EventType::JobAdmitted => "job.admitted",
            EventType::JobRunning => "job.running",
            EventType::JobStartFailed => "job.start_failed",
            EventType::JobPreempted => "job.preempted",
            EventType::JobCheckpointed => "job.checkpointed",
            EventType::JobResumed => "job.resumed",
            EventType::JobSucceeded => "job.succeeded",
            EventType::JobFailed => "job.failed",
            EventType::JobCancelled => "job.cancelled",
            EventType::NodeNotice => "node.notice",
            EventType::BudgetAlert => "budget.alert",
            EventType::WebhookDisabled => "webhook.disabled",
            EventType::Ping => "webhook.ping",
        }
    }

    /// The webhook an outbox event makes, if any. Job events map by the state reached: a run
    /// that starts again after a preemption (`attempt` above 1) is `job.resumed`; `draining`
    /// (asked to checkpoint and leave), `lost` and an elastic gang's `replicas_lost` are all
    /// `job.preempted`. A node's notice is
    /// its move to `draining` (or an explicit `node.notice`).
    pub fn of_outbox(kind: &str, payload: &Value) -> Option<EventType> {
        Some(match kind {
            "job.queued" => EventType::JobQueued,
            "job.admitted" => EventType::JobAdmitted,
            "job.running" => {
                let attempt = payload["job"]["attempt"].as_u64().unwrap_or(0);
                if attempt > 1 {
                    EventType::JobResumed
                } else {
                    EventType::JobRunning
                }
            }
            // (`job.replicas_lost`: an elastic gang lost some replicas and runs on.)
            "job.draining" | "job.lost" | "job.replicas_lost" => EventType::JobPreempted,
            "job.start_failed" => EventType::JobStartFailed,
            "job.checkpointed" => EventType::JobCheckpointed,
            "job.succeeded" => EventType::JobSucceeded,
            "job.failed" => EventType::JobFailed,
            "job.cancelled" => EventType::JobCancelled,
            "node.draining" | "node.notice" => EventType::NodeNotice,
            "budget.alert" => EventType::BudgetAlert,
            "webhook.disabled" => EventType::WebhookDisabled,
            "webhook.ping" => EventType::Ping,
            _ => return None,
        })
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown event type {s:?}; one of {}",
                    EventType::ALL.map(EventType::as_str).join(", ")
                )
            })
    }
}

/// The body of a webhook, as Standard Webhooks recommends: the type, when it happened, and
/// the event's data. Built from the outbox row, so every retry sends the same bytes.
pub fn body(event_type: EventType, at: DateTime<Utc>, outbox_id: i64, payload: &Value) -> Vec<u8> {
    let v = json!({
        "type": event_type.as_str(),
        "timestamp": at.to_rfc3339_opts(SecondsFormat::Micros, true),
        "event_id": outbox_id,
        "data": payload,
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbox_events_map_onto_the_webhook_vocabulary() {
        let job = |attempt: u64| json!({"job": {"attempt": attempt}});
        let cases = [
            ("job.queued", job(0), Some(EventType::JobQueued)),
            ("job.running", job(1), Some(EventType::JobRunning)),
            ("job.running", job(2), Some(EventType::JobResumed)),
            ("job.draining", job(1), Some(EventType::JobPreempted)),
            ("job.lost", job(1), Some(EventType::JobPreempted)),
            ("job.starting", job(1), None),
            ("node.draining", json!({}), Some(EventType::NodeNotice)),
            ("node.ready", json!({}), None),
            ("budget.alert", json!({}), Some(EventType::BudgetAlert)),
        ];
        for (kind, payload, want) in cases {
            assert_eq!(EventType::of_outbox(kind, &payload), want, "{kind}");
        }
        for t in EventType::ALL {
            assert_eq!(t.as_str().parse::<EventType>(), Ok(t));
        }
        assert!("job.exploded".parse::<EventType>().is_err());
    }
}
