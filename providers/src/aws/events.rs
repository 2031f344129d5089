//! The interruption queue's messages: EventBridge events routed on (source, detail-type) to
//! interruption events, or ignored with a reason.

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::SPOT_NOTICE;
use crate::{InterruptionEvent, InterruptionKind};

/// What a queue message means.
#[derive(Debug, Clone, PartialEq)]
pub enum Routed {
    Events(Vec<InterruptionEvent>),
    /// A kind we do not act on; the reason is logged.
    Ignored(&'static str),
}

/// A message that is not a well-formed event of a kind we know.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("not an EventBridge event: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{detail_type}: {message}")]
    Detail {
        detail_type: String,
        message: String,
    },
}

#[derive(Deserialize)]
struct Envelope {
    source: String,
    #[serde(rename = "detail-type")]
    detail_type: String,
    time: DateTime<Utc>,
    #[serde(default)]
    detail: serde_json::Value,
}

#[derive(Deserialize)]
struct InstanceDetail {
    #[serde(rename = "instance-id")]
    instance_id: String,
    #[serde(default)]
    state: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HealthDetail {
    #[serde(default)]
    service: String,
    #[serde(default)]
    event_type_category: String,
    #[serde(default)]
    start_time: Option<String>,
    #[serde(default)]
    affected_entities: Vec<HealthEntity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HealthEntity {
    entity_value: String,
}

/// Routes one EventBridge message on (source, detail-type) — REFERENCE.md "AWS interruption
/// events". `now` stamps when we saw it.
pub fn parse_event(body: &str, now: DateTime<Utc>) -> Result<Routed, EventError> {
    let env: Envelope = serde_json::from_str(body)?;
    let detail_err = |e: serde_json::Error| EventError::Detail {
        detail_type: env.detail_type.clone(),
        message: e.to_string(),
    };
    let one = |kind, deadline| -> Result<Routed, EventError> {
        let d: InstanceDetail = serde_json::from_value(env.detail.clone()).map_err(detail_err)?;
        Ok(Routed::Events(vec![InterruptionEvent {
            provider_id: d.instance_id,
            kind,
            deadline,
            observed_at: now,
        }]))
    };
    match (env.source.as_str(), env.detail_type.as_str()) {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning") => {
            // A time at the end of what chrono holds has no deadline two minutes later.
            let deadline =
                env.time
                    .checked_add_signed(SPOT_NOTICE)
                    .ok_or_else(|| EventError::Detail {
                        detail_type: env.detail_type.clone(),
                        message: format!("time {} leaves no room for the notice", env.time),
                    })?;
            one(InterruptionKind::Preemption, Some(deadline))
        }
        ("aws.ec2", "EC2 Instance Rebalance Recommendation") => {
            one(InterruptionKind::Rebalance, None)
        }
        ("aws.ec2", "EC2 Instance State-change Notification") => {
            let d: InstanceDetail =
                serde_json::from_value(env.detail.clone()).map_err(detail_err)?;
            match d.state.as_deref() {
                Some("stopping" | "stopped" | "shutting-down" | "terminated") => {
                    Ok(Routed::Events(vec![InterruptionEvent {
                        provider_id: d.instance_id,
                        kind: InterruptionKind::Stopped,
                        deadline: Some(env.time),
                        observed_at: now,
                    }]))
                }
                Some(_) => Ok(Routed::Ignored("a state change we do not act on")),
                None => Err(EventError::Detail {
                    detail_type: env.detail_type.clone(),
                    message: "no detail.state".into(),
                }),
            }
        }
        ("aws.health", "AWS Health Event") => {
            let d: HealthDetail = serde_json::from_value(env.detail.clone()).map_err(detail_err)?;
            if d.service != "EC2" || d.event_type_category != "scheduledChange" {
                return Ok(Routed::Ignored(
                    "a health event that is not an EC2 scheduled change",
                ));
            }
            let deadline = d.start_time.as_deref().and_then(parse_health_time);
            Ok(Routed::Events(
                d.affected_entities
                    .into_iter()
                    .filter(|e| e.entity_value.starts_with("i-"))
                    .map(|e| InterruptionEvent {
                        provider_id: e.entity_value,
                        kind: InterruptionKind::Maintenance,
                        deadline,
                        observed_at: now,
                    })
                    .collect(),
            ))
        }
        _ => Ok(Routed::Ignored("an event kind we do not know")),
    }
}

/// AWS Health writes times as RFC 2822-like `Wed, 30 Nov 2026 08:00:00 GMT` or RFC 3339.
fn parse_health_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .or_else(|_| DateTime::parse_from_rfc2822(s))
        .ok()
        .map(|t| t.with_timezone(&Utc))
}
