//! Prometheus metrics, served at `/metrics`.
//!
//! One registry per process, passed to whoever records (the store, the HTTP layer); nothing
//! global, so tests can run several servers in one process. The fleet, queue and money gauges
//! are read from the store at each scrape ([`fleet`]).

pub mod dcgm;
pub mod fleet;
pub mod history;
pub mod outbox;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreOpLabels {
    pub op: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderCallLabels {
    pub cloud: &'static str,
    pub op: &'static str,
    /// `ok`, or the error's kind (`insufficient_capacity`, `throttled`, ...).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LockLabels {
    pub lock: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassLabels {
    pub step: &'static str,
    /// `done` or `failed`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    pub step: &'static str,
    pub event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NoticeLabels {
    pub cloud: String,
    /// Where the notice came from: `aws-instance-action`, `aws-rebalance`, `gcp-preempted`,
    /// `azure-scheduled-event`, `simulated`, or `event-stream` (the cloud's own stream).
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobEventLabels {
    pub event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckpointLabels {
    pub trigger: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabels {
    pub trigger: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderErrorLabels {
    pub cloud: &'static str,
    pub op: &'static str,
    /// The error's kind: `insufficient_capacity`, `throttled`, `quota`, `auth`, ...
    pub kind: &'static str,
}

/// Seconds from a notice: 1 s to ~68 min.
fn recovery_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 13))
}

/// Checkpoint sizes: 1 MiB to 16 TiB.
fn bytes_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1_048_576.0, 4.0, 13))
}

fn latency_histogram() -> Histogram {
    // 100 µs to ~13 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

/// The process's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    pub store_ops: Family<StoreOpLabels, Histogram, fn() -> Histogram>,
    pub http_requests: Family<HttpLabels, Histogram, fn() -> Histogram>,
    pub provider_calls: Family<ProviderCallLabels, Histogram, fn() -> Histogram>,
    pub leader: Family<LockLabels, Gauge>,
    pub passes: Family<PassLabels, Histogram, fn() -> Histogram>,
    pub events: Family<EventLabels, Counter>,
    pub notices: Family<NoticeLabels, Counter>,
    pub job_events: Family<JobEventLabels, Counter>,
    pub checkpoint_seconds: Family<CheckpointLabels, Histogram, fn() -> Histogram>,
    pub checkpoint_bytes: Family<TriggerLabels, Histogram, fn() -> Histogram>,
    pub notice_to_durable: Histogram,
    pub notice_to_running: Histogram,
    pub provider_errors: Family<ProviderErrorLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("spotplane");
        let store_ops = Family::<StoreOpLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "store_operation_seconds",
            "Latency of each named store operation, including retries",
            store_ops.clone(),
        );
        let http_requests =
            Family::<HttpLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            );
        registry.register(
            "http_request_seconds",
            "Latency of API requests by route and status",
            http_requests.clone(),
        );
        let provider_calls =
            Family::<ProviderCallLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            );
        registry.register(
            "provider_call_seconds",
            "Latency of cloud provider calls by cloud, operation and outcome (after retries)",
            provider_calls.clone(),
        );
        let leader = Family::<LockLabels, Gauge>::default();
        registry.register(
            "leader",
            "1 while this replica leads the loops under the lock, 0 otherwise",
            leader.clone(),
        );
        let passes = Family::<PassLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "reconcile_pass_seconds",
            "How long each loop's pass took (the scheduling cycle is step=\"scheduling\")",
            passes.clone(),
        );
        let events = Family::<EventLabels, Counter>::default();
        registry.register(
            "reconcile_events",
            "What the loops did: admissions, preemptions, notices, requeues, nodes bought, ...",
            events.clone(),
        );
        let notices = Family::<NoticeLabels, Counter>::default();
        registry.register(
            "notices",
            "Termination notices and warnings for nodes, by cloud and where they came from",
            notices.clone(),
        );
        let job_events = Family::<JobEventLabels, Counter>::default();
        registry.register(
            "job_events",
            "Job events by kind, as webhooks name them (queued, running, resumed, preempted, checkpointed, start_failed, succeeded, failed, cancelled)",
            job_events.clone(),
        );
        let checkpoint_seconds =
            Family::<CheckpointLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                recovery_histogram as fn() -> Histogram,
            );
        registry.register(
            "checkpoint_seconds",
            "How long checkpoints took, by trigger (notice, command, drain) and outcome (durable, missed_deadline, failed)",
            checkpoint_seconds.clone(),
        );
        let checkpoint_bytes =
            Family::<TriggerLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                bytes_histogram as fn() -> Histogram,
            );
        registry.register(
            "checkpoint_bytes",
            "Size of durable checkpoints, by trigger",
            checkpoint_bytes.clone(),
        );
        let notice_to_durable = recovery_histogram();
        registry.register(
            "notice_to_checkpoint_durable_seconds",
            "From a cloud's termination notice to each replica's checkpoint being durable",
            notice_to_durable.clone(),
        );
        let notice_to_running = recovery_histogram();
        registry.register(
            "notice_to_running_seconds",
            "From a cloud taking a job's node (its notice, or the loss of a node that gave none) to the job running again",
            notice_to_running.clone(),
        );
        let provider_errors = Family::<ProviderErrorLabels, Counter>::default();
        registry.register(
            "provider_errors",
            "Failed cloud provider calls (after retries) by cloud, operation and error kind",
            provider_errors.clone(),
        );
        Metrics {
            registry: Arc::new(Mutex::new(registry)),
            notices,
            job_events,
            checkpoint_seconds,
            checkpoint_bytes,
            notice_to_durable,
            notice_to_running,
            provider_errors,
            store_ops,
            http_requests,
            provider_calls,
            leader,
            passes,
            events,
        }
    }

    /// An observer for the providers' metering decorator.
    pub fn provider_observer(&self) -> spotplane_providers::decorators::Observer {
        let calls = self.provider_calls.clone();
        let errors = self.provider_errors.clone();
        Arc::new(move |cloud, op, error, took| {
            if let Some(kind) = error {
                errors
                    .get_or_create(&ProviderErrorLabels {
                        cloud: cloud.as_str(),
                        op,
                        kind,
                    })
                    .inc();
            }
            calls
                .get_or_create(&ProviderCallLabels {
                    cloud: cloud.as_str(),
                    op,
                    outcome: error.unwrap_or("ok"),
                })
                .observe(took.as_secs_f64());
        })
    }

    /// Records whether this replica leads the loops under `lock`.
    pub fn set_leader(&self, lock: &'static str, leading: bool) {
        self.leader
            .get_or_create(&LockLabels { lock })
            .set(i64::from(leading));
    }

    /// Records one pass of a loop's step: how long it took and what it did.
    pub fn observe_pass(
        &self,
        step: &'static str,
        outcome: &crate::reconcile::runner::StepOutcome,
        took: Duration,
    ) {
        use crate::reconcile::runner::StepOutcome;
        let label = match outcome {
            StepOutcome::Done(report) => {
                self.record_signals(report.signals());
                for (event, n) in report.events() {
                    if n > 0 {
                        self.events
                            .get_or_create(&EventLabels { step, event })
                            .inc_by(n);
                    }
                }
                "done"
            }
            StepOutcome::Failed(_) => "failed",
            StepOutcome::Skipped => return,
        };
        self.passes
            .get_or_create(&PassLabels {
                step,
                outcome: label,
            })
            .observe(took.as_secs_f64());
    }

    /// Records what outbox events told (see [`outbox`]).
    pub fn record_signals(&self, signals: &[outbox::Signal]) {
        use outbox::Signal;
        for s in signals {
            match s {
                Signal::Notice { cloud, source } => {
                    self.notices
                        .get_or_create(&NoticeLabels {
                            cloud: cloud.clone(),
                            kind: source.clone(),
                        })
                        .inc();
                }
                Signal::Job(event) => {
                    self.job_events
                        .get_or_create(&JobEventLabels { event })
                        .inc();
                }
                Signal::Checkpoint {
                    trigger,
                    outcome,
                    seconds,
                    bytes,
                    since_notice,
                } => {
                    if let Some(s) = seconds {
                        self.checkpoint_seconds
                            .get_or_create(&CheckpointLabels {
                                trigger: trigger.clone(),
                                outcome,
                            })
                            .observe(*s);
                    }
                    if let (Some(b), "durable") = (bytes, *outcome) {
                        self.checkpoint_bytes
                            .get_or_create(&TriggerLabels {
                                trigger: trigger.clone(),
                            })
                            .observe(*b);
                    }
                    if let Some(s) = since_notice {
                        self.notice_to_durable.observe(*s);
                    }
                }
                Signal::Resumed { interrupted_for } => {
                    self.notice_to_running.observe(*interrupted_for);
                }
            }
        }
    }

    pub fn observe_store(&self, op: &'static str, ok: bool, took: Duration) {
        let outcome = if ok { "ok" } else { "error" };
        self.store_ops
            .get_or_create(&StoreOpLabels { op, outcome })
            .observe(took.as_secs_f64());
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.render_with(None)
    }

    /// The exposition of the process's metrics followed by `more` (the scrape's fleet gauges).
    pub fn render_with(&self, more: Option<&Registry>) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        let registry = match self.registry.lock() {
            Ok(r) => r,
            Err(poisoned) => poisoned.into_inner(),
        };
        let encoded = encode_registry(&mut out, &registry)
            .and_then(|()| more.map_or(Ok(()), |m| encode_registry(&mut out, m)))
            .and_then(|()| encode_eof(&mut out));
        if encoded.is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::runner::StepOutcome;
    use crate::reconcile::scheduling::CycleReport;

    #[test]
    fn a_pass_records_its_time_and_its_events_and_a_skipped_one_nothing() {
        let m = Metrics::new();
        let report = CycleReport {
            admitted: 2,
            preempted: 1,
            ..CycleReport::default()
        };
        for _ in 0..2 {
            m.observe_pass(
                "scheduling",
                &StepOutcome::Done(Box::new(report.clone())),
                Duration::from_millis(3),
            );
        }
        m.observe_pass("recovery", &StepOutcome::Skipped, Duration::ZERO);
        let text = m.render();
        for want in [
            r#"spotplane_reconcile_events_total{step="scheduling",event="admitted"} 4"#,
            r#"spotplane_reconcile_events_total{step="scheduling",event="preempted_for_priority"} 2"#,
            r#"spotplane_reconcile_pass_seconds_count{step="scheduling",outcome="done"} 2"#,
        ] {
            assert!(text.lines().any(|l| l == want), "{want} in\n{text}");
        }
        assert!(!text.contains("mig_relayouts"), "no zero events: {text}");
        assert!(!text.contains("step=\"recovery\""), "{text}");
    }
}
