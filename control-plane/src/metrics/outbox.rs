//! Recovery and job metrics from the outbox.
//!
//! Every change the control plane makes to a job or node writes an outbox event in the same
//! transaction. The webhooks loop reads each event once, fleet-wide (its cursor is in the
//! store, and one replica leads it), so that is where notices, checkpoints and resumes are
//! counted: on whichever replica leads, once each, whether the change was made by the API, an
//! agent's heartbeat or a loop on another replica. [`signals`] is pure: an event's kind and
//! payload in, what to record out.

use serde_json::Value;
use spotplane_core::notice::NoticeSource;

use crate::webhooks::EventType;

/// What one outbox event tells the metrics.
#[derive(Debug, Clone, PartialEq)]
pub enum Signal {
    /// A termination notice (or warning) for a node, by cloud and by where it came from
    /// (`aws-instance-action`, `gcp-preempted`, ..., `event-stream` for a cloud's own stream).
    Notice { cloud: String, source: String },
    /// A job event webhooks know (`queued`, `running`, `resumed`, `preempted`, ...).
    Job(&'static str),
    /// A checkpoint ended: its trigger (`notice`, `command`, `drain`), outcome (`durable`,
    /// `missed_deadline`, `failed`), how long it took, its size, and for a durable one taken
    /// for a cloud's notice, the time from the notice.
    Checkpoint {
        trigger: String,
        outcome: &'static str,
        seconds: Option<f64>,
        bytes: Option<f64>,
        since_notice: Option<f64>,
    },
    /// A run started again after its cloud took the last one: how long it was out.
    Resumed { interrupted_for: f64 },
}

/// A notice source as a bounded label: the known sources' names, else `other`.
fn source_label(v: &Value) -> String {
    serde_json::from_value::<NoticeSource>(v.clone())
        .ok()
        .and_then(|s| serde_json::to_value(s).ok())
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "other".into())
}

/// A cloud as a bounded label.
fn cloud_label(v: &Value) -> String {
    v.as_str()
        .and_then(|c| c.parse::<spotplane_core::Cloud>().ok())
        .map_or_else(|| "unknown".into(), |c| c.as_str().to_owned())
}

/// What the outbox event of `kind` with `payload` tells the metrics.
pub fn signals(kind: &str, payload: &Value) -> Vec<Signal> {
    let mut out = Vec::new();
    match kind {
        // A node moved to draining by a notice: the agent's (`agent.notice`) or the cloud's
        // event stream (`agent.source` = provider). spotplane's own drains carry neither.
        "node.draining" => {
            let cloud = cloud_label(&payload["node"]["cloud"]);
            let extra = &payload["agent"];
            if extra["notice"].is_object() {
                out.push(Signal::Notice {
                    cloud,
                    source: source_label(&extra["notice"]["source"]),
                });
            } else if extra["source"] == "provider" {
                out.push(Signal::Notice {
                    cloud,
                    source: "event-stream".into(),
                });
            }
        }
        // A notice that did not move the node (a rebalance warning, or one for a node
        // already draining).
        "node.notice" => out.push(Signal::Notice {
            cloud: cloud_label(&payload["node"]["cloud"]),
            source: source_label(&payload["notice"]["source"]),
        }),
        "job.checkpointed" | "job.checkpoint_missed_deadline" | "job.checkpoint_failed" => {
            let c = &payload["checkpoint"];
            let trigger = match c["trigger"].as_str() {
                Some(t @ ("notice" | "command" | "drain")) => t.to_owned(),
                _ => "other".into(),
            };
            out.push(Signal::Checkpoint {
                trigger,
                outcome: match kind {
                    "job.checkpointed" => "durable",
                    "job.checkpoint_missed_deadline" => "missed_deadline",
                    _ => "failed",
                },
                seconds: c["seconds"].as_f64(),
                bytes: c["total_bytes"].as_f64(),
                since_notice: c["since_notice_seconds"].as_f64(),
            });
        }
        _ => {}
    }
    if let Some(t) = EventType::of_outbox(kind, payload)
        && let Some(name) = t.as_str().strip_prefix("job.")
    {
        out.push(Signal::Job(name));
        if t == EventType::JobResumed
            && let Some(s) = payload["interrupted_for_seconds"].as_f64()
        {
            out.push(Signal::Resumed { interrupted_for: s });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn events_become_signals() {
        let cases: Vec<(&str, Value, Vec<Signal>)> = vec![
            (
                "node.draining",
                json!({"node": {"cloud": "aws"}, "agent": {"notice": {"source": "aws-instance-action"}}}),
                vec![Signal::Notice {
                    cloud: "aws".into(),
                    source: "aws-instance-action".into(),
                }],
            ),
            (
                "node.draining",
                json!({"node": {"cloud": "gcp"}, "agent": {"source": "provider"}}),
                vec![Signal::Notice {
                    cloud: "gcp".into(),
                    source: "event-stream".into(),
                }],
            ),
            // spotplane's own drain (consolidation) is not a notice.
            (
                "node.draining",
                json!({"node": {"cloud": "gcp"}, "agent": {}}),
                vec![],
            ),
            (
                "node.notice",
                json!({"node": {"cloud": "aws"}, "notice": {"source": "aws-rebalance"}}),
                vec![Signal::Notice {
                    cloud: "aws".into(),
                    source: "aws-rebalance".into(),
                }],
            ),
            // Labels stay bounded whatever a payload says.
            (
                "node.notice",
                json!({"node": {"cloud": "mars"}, "notice": {"source": "x"}}),
                vec![Signal::Notice {
                    cloud: "unknown".into(),
                    source: "other".into(),
                }],
            ),
            (
                "job.checkpointed",
                json!({"job": {"attempt": 1}, "checkpoint": {"trigger": "notice", "seconds": 20.0,
                    "total_bytes": 1024, "since_notice_seconds": 21.5}}),
                vec![
                    Signal::Checkpoint {
                        trigger: "notice".into(),
                        outcome: "durable",
                        seconds: Some(20.0),
                        bytes: Some(1024.0),
                        since_notice: Some(21.5),
                    },
                    Signal::Job("checkpointed"),
                ],
            ),
            (
                "job.checkpoint_missed_deadline",
                json!({"checkpoint": {"trigger": "drain", "seconds": 120.0}}),
                vec![Signal::Checkpoint {
                    trigger: "drain".into(),
                    outcome: "missed_deadline",
                    seconds: Some(120.0),
                    bytes: None,
                    since_notice: None,
                }],
            ),
            (
                "job.running",
                json!({"job": {"attempt": 2}, "interrupted_for_seconds": 300.0}),
                vec![
                    Signal::Job("resumed"),
                    Signal::Resumed {
                        interrupted_for: 300.0,
                    },
                ],
            ),
            (
                "job.running",
                json!({"job": {"attempt": 1}}),
                vec![Signal::Job("running")],
            ),
            ("job.lost", json!({}), vec![Signal::Job("preempted")]),
            ("budget.alert", json!({}), vec![]),
        ];
        for (kind, payload, want) in cases {
            assert_eq!(signals(kind, &payload), want, "{kind} {payload}");
        }
    }
}
