//! A replica's actor: it owns the workload's process, and takes checkpoint and stop requests
//! in order, so two never signal the workload at once. A checkpoint is frozen (the folder
//! taken back from the workload's user), uploaded before its deadline, and handed back.

use std::time::Duration;

use spotplane_core::agent::{CheckpointOutcome, CheckpointReport, ReplicaPhase};
use tokio::sync::{mpsc, oneshot};

use super::{AGENT, CheckpointRequest, Ctx, Event, Key, ReplicaMsg};
use crate::checkpoint::{CheckpointError, CheckpointMeta, CheckpointStore};
use crate::isolation::{self, IsolationError};
use crate::workload::{ExitInfo, Workload, WorkloadError};

pub(super) async fn ask_checkpoint(
    tx: &mpsc::Sender<ReplicaMsg>,
    req: CheckpointRequest,
) -> Option<CheckpointReport> {
    let (reply, rx) = oneshot::channel();
    tx.send(ReplicaMsg::Checkpoint { req, reply }).await.ok()?;
    rx.await.ok()
}

pub(super) async fn ask_stop(tx: &mpsc::Sender<ReplicaMsg>, grace: Duration) -> Option<ExitInfo> {
    let (reply, rx) = oneshot::channel();
    tx.send(ReplicaMsg::Stop { grace, reply }).await.ok()?;
    rx.await.ok()
}

/// Runs a folder's change of owner off the runtime's threads.
async fn blocking_isolation(
    f: impl FnOnce() -> Result<(), IsolationError> + Send + 'static,
) -> Result<(), String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Owns one replica's process.
pub(super) struct Actor {
    pub(super) ctx: Ctx,
    pub(super) key: Key,
    pub(super) attempt: u32,
    pub(super) store: CheckpointStore,
    pub(super) last_durable: Option<CheckpointReport>,
}

impl Actor {
    pub(super) async fn run(mut self, mut w: Workload, mut rx: mpsc::Receiver<ReplicaMsg>) {
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(ReplicaMsg::Checkpoint { req, reply }) => {
                        self.ctx.event(Event::Phase { key: self.key, phase: ReplicaPhase::Checkpointing });
                        let report = self.checkpoint(&mut w, req).await;
                        if let Some(exit) = w.try_exit() {
                            let _ = reply.send(report);
                            self.ctx.event(Event::Exited { key: self.key, exit });
                            return;
                        }
                        self.ctx.event(Event::Phase { key: self.key, phase: ReplicaPhase::Running });
                        let _ = reply.send(report);
                    }
                    Some(ReplicaMsg::Stop { grace, reply }) => {
                        let exit = w.stop(grace).await;
                        self.ctx.event(Event::Exited { key: self.key, exit });
                        let _ = reply.send(exit);
                        return;
                    }
                    None => {
                        w.stop(Duration::from_secs(5)).await;
                        return;
                    }
                },
                exit = w.wait() => {
                    self.ctx.event(Event::Exited { key: self.key, exit });
                    return;
                }
            }
        }
    }

    async fn checkpoint(&mut self, w: &mut Workload, req: CheckpointRequest) -> CheckpointReport {
        let started_at = self.ctx.now();
        if let (Some(after), Some(prev)) = (req.reuse_after, &self.last_durable)
            && prev.finished_at >= after
        {
            return prev.clone();
        }
        let (job_id, replica) = self.key;
        let uri = self.store.manifest_uri(replica, req.checkpoint_id);
        let deadline = req
            .deadline
            .map(|d| self.ctx.instant(d, self.ctx.cfg.deadline_margin));
        let within = deadline.map_or(self.ctx.cfg.checkpoint_timeout, |d| {
            d.saturating_duration_since(tokio::time::Instant::now())
        });
        let outcome = match w.checkpoint(within).await {
            Err(WorkloadError::CheckpointTimeout(_)) if req.deadline.is_some() => Err((
                CheckpointOutcome::MissedDeadline,
                "the workload did not finish its checkpoint before the deadline".to_owned(),
            )),
            Err(e) => Err((CheckpointOutcome::Failed, e.to_string())),
            Ok(()) => {
                let meta = CheckpointMeta {
                    job_id,
                    replica,
                    attempt: self.attempt,
                    checkpoint_id: req.checkpoint_id,
                    created_at: started_at,
                };
                // The folder is the agent's while it is read: the workload can no longer
                // swap a file for a link to something only the agent may read.
                let frozen = match w.run_as() {
                    Some(user) => blocking_isolation({
                        let dir = w.checkpoint_dir().to_owned();
                        move || isolation::take_back(&dir, AGENT, Some(user.uid))
                    })
                    .await
                    .map_err(|e| (CheckpointOutcome::Failed, e)),
                    None => Ok(()),
                };
                let up = match frozen {
                    Ok(()) => match self
                        .store
                        .upload(w.checkpoint_dir(), meta, self.ctx.cfg.upload, deadline)
                        .await
                    {
                        Ok(u) => Ok(u),
                        Err(e @ CheckpointError::Deadline { .. }) => {
                            Err((CheckpointOutcome::MissedDeadline, e.to_string()))
                        }
                        Err(e) => Err((CheckpointOutcome::Failed, e.to_string())),
                    },
                    Err(e) => Err(e),
                };
                if let Some(user) = w.run_as()
                    && let Err(e) = blocking_isolation({
                        let dir = w.checkpoint_dir().to_owned();
                        move || isolation::hand_over(&dir, user)
                    })
                    .await
                {
                    tracing::error!(error = %e, "cannot hand the checkpoint folder back to the workload");
                }
                if let Err(e) = w.release_checkpoint() {
                    tracing::warn!(error = %e, "cannot remove the checkpoint marker");
                }
                up
            }
        };
        let finished_at = self.ctx.now();
        let report = match outcome {
            Ok(u) => {
                tracing::info!(job = %job_id, replica, checkpoint = %req.checkpoint_id, bytes = u.manifest.total_bytes,
                    seconds = u.elapsed.as_secs_f64(), "checkpoint durable");
                CheckpointReport {
                    job_id,
                    replica,
                    attempt: self.attempt,
                    checkpoint_id: req.checkpoint_id,
                    uri: u.manifest_uri,
                    trigger: req.trigger,
                    outcome: CheckpointOutcome::Durable,
                    manifest: Some(u.manifest),
                    message: None,
                    started_at,
                    finished_at,
                }
            }
            Err((outcome, message)) => {
                tracing::error!(job = %job_id, replica, checkpoint = %req.checkpoint_id, ?outcome, %message,
                    "checkpoint not durable; the previous one stays the resume point");
                CheckpointReport {
                    job_id,
                    replica,
                    attempt: self.attempt,
                    checkpoint_id: req.checkpoint_id,
                    uri,
                    trigger: req.trigger,
                    outcome,
                    manifest: None,
                    message: Some(message),
                    started_at,
                    finished_at,
                }
            }
        };
        if report.outcome == CheckpointOutcome::Durable {
            self.last_durable = Some(report.clone());
        }
        report
    }
}
