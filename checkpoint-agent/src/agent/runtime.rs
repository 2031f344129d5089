//! The main loop: a heartbeat every interval, and at once when a task reports something or a
//! termination notice arrives; a notice with a deadline checkpoints every running replica.
//! Completed commands are remembered in the work directory; on the way out every workload is
//! stopped.

use std::collections::HashSet;
use std::time::Duration;

use spotplane_core::CommandId;
use spotplane_core::agent::{
    CheckpointOutcome, CheckpointTrigger, Heartbeat, ReplicaPhase, ReplicaStatus,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::replica::ask_checkpoint;
use super::{
    CheckpointRequest, DONE_FILE, DONE_KEPT, Event, Key, ReplicaMsg, Runtime, write_private,
};
use crate::notice::NoticeView;

impl Runtime {
    pub(super) async fn main_loop(
        &mut self,
        hb_interval: Duration,
        mut notices: watch::Receiver<NoticeView>,
        mut events: mpsc::UnboundedReceiver<Event>,
        cancel: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(hb_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let view = notices.borrow().clone();
                    self.heartbeat(&view).await;
                }
                changed = notices.changed() => {
                    if changed.is_err() {
                        continue;
                    }
                    let view = notices.borrow_and_update().clone();
                    if self.on_notice(&view) {
                        self.heartbeat(&view).await;
                        tick.reset();
                    }
                }
                Some(e) = events.recv() => {
                    if self.on_event(e) {
                        let view = notices.borrow().clone();
                        self.heartbeat(&view).await;
                        tick.reset();
                    }
                }
                () = cancel.cancelled() => break,
            }
        }
        self.shutdown().await;
    }

    /// Stops every workload (they would die with the agent anyway; this way they get SIGTERM).
    async fn shutdown(&mut self) {
        let mut waits = Vec::new();
        for r in self.replicas.values() {
            let (reply, rx) = oneshot::channel();
            if r.tx
                .send(ReplicaMsg::Stop {
                    grace: Duration::from_secs(5),
                    reply,
                })
                .await
                .is_ok()
            {
                waits.push(rx);
            }
        }
        for w in waits {
            let _ = w.await;
        }
    }

    /// Handles an event; returns whether a heartbeat should go now.
    fn on_event(&mut self, e: Event) -> bool {
        match e {
            Event::Result(r) => {
                self.done.push_back(r.command_id);
                while self.done.len() > DONE_KEPT {
                    self.done.pop_front();
                }
                if let Ok(b) = serde_json::to_vec(&self.done)
                    && let Err(e) = write_private(&self.ctx.cfg.work_dir.join(DONE_FILE), &b)
                {
                    tracing::warn!(error = %e, "cannot remember completed commands");
                }
                self.results.push(r);
                true
            }
            Event::Started { key, replica } => {
                self.replicas.insert(key, replica);
                true
            }
            Event::Phase { key, phase } => {
                if let Some(r) = self.replicas.get_mut(&key)
                    && r.phase != ReplicaPhase::Exited
                {
                    r.phase = phase;
                }
                false
            }
            Event::Exited { key, exit } => {
                if let Some(r) = self.replicas.get_mut(&key) {
                    tracing::info!(job = %key.0, replica = key.1, %exit, "replica exited");
                    r.phase = ReplicaPhase::Exited;
                    r.exit_code = Some(exit.code);
                }
                true
            }
            Event::HeartbeatNow => true,
        }
    }

    /// A notice with a deadline starts the checkpoints of every running replica, once.
    /// Returns whether the control plane should hear of it now.
    fn on_notice(&mut self, view: &NoticeView) -> bool {
        let Some(n) = &view.notice else {
            return self.handled_notice.take().is_some();
        };
        let same = self.handled_notice.as_ref().is_some_and(|h| {
            h.source == n.source && h.action == n.action && h.event_id == n.event_id
        });
        if same {
            return false;
        }
        self.handled_notice = Some(n.clone());
        let Some(deadline) = n.drain_deadline() else {
            return true;
        };
        self.notice_at = Some(self.ctx.now());
        let running: Vec<(Key, mpsc::Sender<ReplicaMsg>)> = self
            .replicas
            .iter()
            .filter(|(_, r)| r.phase != ReplicaPhase::Exited)
            .map(|(k, r)| (*k, r.tx.clone()))
            .collect();
        tracing::warn!(replicas = running.len(), %deadline, "termination notice: checkpointing every replica");
        let ctx = self.ctx.clone();
        let notices = self.notices.clone();
        let notice = n.clone();
        tokio::spawn(async move {
            let jobs = running.into_iter().map(|(key, tx)| {
                let ctx = ctx.clone();
                async move {
                    let req = CheckpointRequest {
                        checkpoint_id: ctx.new_checkpoint_id(),
                        trigger: CheckpointTrigger::Notice,
                        deadline: Some(deadline),
                        reuse_after: None,
                    };
                    let report = ask_checkpoint(&tx, req).await;
                    match report {
                        Some(r) => {
                            ctx.report(&r).await;
                            r.outcome == CheckpointOutcome::Durable
                        }
                        None => {
                            tracing::warn!(job = %key.0, replica = key.1, "replica went before its checkpoint");
                            false
                        }
                    }
                }
            });
            let durable = futures::future::join_all(jobs).await;
            if durable.iter().all(|d| *d)
                && let Err(e) = notices.acknowledge(&notice).await
            {
                tracing::warn!(error = %e, "could not acknowledge the notice");
            }
            ctx.event(Event::HeartbeatNow);
        });
        true
    }

    async fn heartbeat(&mut self, view: &NoticeView) {
        let replicas: Vec<ReplicaStatus> = self
            .replicas
            .iter()
            .map(|((job_id, replica), r)| ReplicaStatus {
                job_id: *job_id,
                replica: *replica,
                attempt: r.attempt,
                phase: r.phase,
                exit_code: r.exit_code,
            })
            .collect();
        let hb = Heartbeat {
            node_id: self.ctx.node_id,
            sent_at: self.ctx.now(),
            gpus: self.telemetry.sample(),
            replicas,
            notice: view.notice.clone(),
            results: self.results.clone(),
        };
        match self.ctx.cp.heartbeat(&hb).await {
            Ok(resp) => {
                if let Some(since) = self.failing_since.take() {
                    tracing::info!(%since, "control plane reachable again");
                }
                let sent: HashSet<CommandId> = hb.results.iter().map(|r| r.command_id).collect();
                self.results.retain(|r| !sent.contains(&r.command_id));
                self.replicas.retain(|_, r| {
                    if r.phase == ReplicaPhase::Exited {
                        r.exit_reported += 1;
                    }
                    r.exit_reported < 3
                });
                for c in resp.commands {
                    self.dispatch(c);
                }
            }
            Err(e) => {
                if self.failing_since.is_none() {
                    tracing::warn!(error = %e, "heartbeat failed; will keep trying");
                    self.failing_since = Some(self.ctx.now());
                }
            }
        }
    }
}
