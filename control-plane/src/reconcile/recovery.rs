//! The recovery loop: hears the clouds' event streams, reads a snapshot, runs the pure
//! `recovery::plan` on it, and writes each action as its own transaction. An action that no
//! longer applies (the job was cancelled, a node changed meanwhile) is skipped; the next round
//! sees the new state.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use spotplane_core::agent::CommandKind;
use spotplane_providers::registry::Providers;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::clock::SharedClock;
use crate::reconcile::runner::{ReconcileError, Reconciler, Report};
use crate::recovery::{self, Action, Settings};
use crate::store::{Store, StoreError};

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub notices: usize,
    pub relayouts: usize,
    pub started: usize,
    pub transitions: usize,
    pub checkpoints: usize,
    pub drains: usize,
    pub stops: usize,
    pub requeued: usize,
    /// Replicas of elastic jobs let go while the rest ran on.
    pub replicas_dropped: usize,
    pub failed: usize,
    pub nodes_lost: usize,
    pub stale: usize,
}

impl Report for RecoveryReport {
    fn is_quiet(&self) -> bool {
        *self == RecoveryReport::default()
    }

    fn events(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("cloud_notices", self.notices as u64),
            ("requeued", self.requeued as u64),
            ("replicas_dropped", self.replicas_dropped as u64),
            ("failed", self.failed as u64),
            ("nodes_lost", self.nodes_lost as u64),
        ]
    }
}

pub struct RecoveryLoop {
    store: Store,
    clock: SharedClock,
    providers: Option<Arc<Providers>>,
    settings: Settings,
    /// Checkpoint prefix of jobs that name none (`<object_store.url>/jobs/<id>`).
    default_root: String,
}

#[async_trait]
impl Reconciler for RecoveryLoop {
    fn name(&self) -> &'static str {
        "recovery"
    }

    async fn reconcile(
        &mut self,
        now: DateTime<Utc>,
        _cancel: &CancellationToken,
    ) -> Result<Box<dyn Report>, ReconcileError> {
        Ok(Box::new(self.run_at(now).await?))
    }
}

impl RecoveryLoop {
    pub fn new(
        store: Store,
        clock: SharedClock,
        providers: Option<Arc<Providers>>,
        settings: Settings,
        default_root: String,
    ) -> Self {
        RecoveryLoop {
            store,
            clock,
            providers,
            settings,
            default_root,
        }
    }

    /// Notices from the clouds' own event streams (EventBridge/SQS and the like): a preemption
    /// with a deadline drains its node. Unknown instances are logged and dropped.
    async fn hear_providers(
        &self,
        now: DateTime<Utc>,
        report: &mut RecoveryReport,
    ) -> Result<(), StoreError> {
        let Some(providers) = &self.providers else {
            return Ok(());
        };
        for p in &providers.all {
            let events = match p.drain_interruptions().await {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(cloud = %p.cloud(), error = %e, "reading interruption events failed");
                    continue;
                }
            };
            for e in events {
                let Some(deadline) = e.deadline.filter(|_| e.kind.drains()) else {
                    tracing::debug!(cloud = %p.cloud(), instance = %e.provider_id, kind = ?e.kind, "interruption event without a deadline; noted only");
                    continue;
                };
                let what = format!("{:?}", e.kind).to_lowercase();
                match self
                    .store
                    .provider_notice(p.cloud(), &e.provider_id, deadline, &what, now)
                    .await?
                {
                    Some(node) => {
                        tracing::info!(%node, instance = %e.provider_id, %deadline, "termination notice from the cloud");
                        report.notices += 1;
                    }
                    None => {
                        tracing::debug!(instance = %e.provider_id, "notice for an instance no node has; dropped")
                    }
                }
            }
        }
        Ok(())
    }

    /// One round at the clock's time.
    pub async fn run_once(&mut self) -> Result<RecoveryReport, ReconcileError> {
        let now = self.clock.now();
        Ok(self.run_at(now).await?)
    }

    /// One round at `now`.
    pub async fn run_at(&mut self, now: DateTime<Utc>) -> Result<RecoveryReport, StoreError> {
        let mut report = RecoveryReport::default();
        self.hear_providers(now, &mut report).await?;
        report.relayouts = self.store.send_relayouts(now).await?;
        let snap = self
            .store
            .recovery_snapshot(self.settings.default_retry_limit)
            .await?;
        let actions = recovery::plan(now, &snap, &self.settings);
        for a in actions {
            let res = self
                .apply(&a, now, &mut report)
                .instrument(action_span(&a))
                .await;
            match res {
                Ok(()) => {}
                Err(StoreError::Conflict(why) | StoreError::NotFound(why)) => {
                    tracing::debug!(?a, %why, "recovery action dropped");
                    report.stale += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(report)
    }

    async fn apply(
        &self,
        a: &Action,
        now: chrono::DateTime<chrono::Utc>,
        report: &mut RecoveryReport,
    ) -> Result<(), StoreError> {
        match a {
            Action::Start {
                job,
                node,
                replica,
                attempt,
                devices,
                resume_from,
            } => {
                self.store
                    .start_replica(
                        *job,
                        *node,
                        *replica,
                        *attempt,
                        devices.clone(),
                        resume_from.as_ref().map(|p| p.uri.clone()),
                        &self.default_root,
                        self.settings.rendezvous_ports,
                        now,
                    )
                    .await?;
                report.started += 1;
            }
            Action::Transition {
                job,
                from,
                to,
                reason,
            } => {
                self.store
                    .transition_job(*job, None, Some(*from), *to, reason.clone(), now)
                    .await?;
                report.transitions += 1;
            }
            Action::Checkpoint {
                job,
                node,
                replica,
                deadline,
            } => {
                self.store
                    .request_checkpoint(*job, *node, *replica, *deadline, &self.default_root, now)
                    .await?;
                report.checkpoints += 1;
            }
            Action::Drain { node, deadline } => {
                self.store
                    .enqueue_agent_command(
                        *node,
                        CommandKind::Drain {
                            deadline: *deadline,
                            reason: Some("the cloud is taking the node".into()),
                        },
                        now,
                    )
                    .await?;
                crate::crash_point!("drain");
                report.drains += 1;
            }
            Action::Stop {
                job,
                node,
                replica,
                attempt,
            } => {
                self.store
                    .enqueue_agent_command(
                        *node,
                        CommandKind::Stop {
                            job_id: *job,
                            replica: *replica,
                            attempt: Some(*attempt),
                            grace_ms: u64::try_from(self.settings.stop_grace.num_milliseconds())
                                .unwrap_or(0),
                        },
                        now,
                    )
                    .await?;
                report.stops += 1;
            }
            Action::Requeue {
                job,
                from,
                how,
                resume_from,
                lost_gpu_seconds,
                not_before,
                reason,
            } => {
                self.store
                    .requeue_job(
                        *job,
                        *from,
                        *how,
                        resume_from,
                        *lost_gpu_seconds,
                        *not_before,
                        reason,
                        now,
                    )
                    .await?;
                crate::crash_point!("requeue");
                report.requeued += 1;
            }
            Action::DropReplicas {
                job,
                replicas,
                lost_gpu_seconds,
                reason,
            } => {
                self.store
                    .drop_replicas(*job, replicas, *lost_gpu_seconds, reason, now)
                    .await?;
                tracing::info!(%job, replicas = replicas.len(), lost_gpu_seconds, "elastic job runs on without the replicas whose nodes went");
                report.replicas_dropped += replicas.len();
            }
            Action::Fail { job, from, reason } => {
                self.store
                    .transition_job(
                        *job,
                        None,
                        Some(*from),
                        spotplane_core::JobState::Failed,
                        Some(reason.clone()),
                        now,
                    )
                    .await?;
                report.failed += 1;
            }
            Action::NodeLost { node, reason } => {
                tracing::warn!(%node, %reason, "node lost");
                self.store.node_lost(*node, reason, now).await?;
                report.nodes_lost += 1;
            }
        }
        Ok(())
    }
}

/// A span for one recovery action: `agent_command` for what becomes a command to a node's
/// agent (start, checkpoint, drain, stop), `recovery` for the rest; each with the job, node,
/// replica and attempt it concerns.
fn action_span(a: &Action) -> tracing::Span {
    use tracing::info_span;
    match a {
        Action::Start {
            job,
            node,
            replica,
            attempt,
            ..
        } => {
            info_span!("agent_command", command = "start", job_id = %job, node_id = %node, replica, attempt)
        }
        Action::Checkpoint {
            job, node, replica, ..
        } => {
            info_span!("agent_command", command = "checkpoint", job_id = %job, node_id = %node, replica)
        }
        Action::Drain { node, .. } => {
            info_span!("agent_command", command = "drain", node_id = %node)
        }
        Action::Stop {
            job,
            node,
            replica,
            attempt,
        } => {
            info_span!("agent_command", command = "stop", job_id = %job, node_id = %node, replica, attempt)
        }
        Action::Transition { job, to, .. } => {
            info_span!("recovery", action = "transition", job_id = %job, to = %to)
        }
        Action::Requeue { job, .. } => info_span!("recovery", action = "requeue", job_id = %job),
        Action::DropReplicas { job, .. } => {
            info_span!("recovery", action = "drop_replicas", job_id = %job)
        }
        Action::Fail { job, .. } => info_span!("recovery", action = "fail", job_id = %job),
        Action::NodeLost { node, .. } => {
            info_span!("recovery", action = "node_lost", node_id = %node)
        }
    }
}
