//! Carrying out the commands a heartbeat answer brings, each in a task of its own; a command
//! id already seen is ignored.

use std::time::Duration;

use spotplane_core::MigLayout;
use spotplane_core::agent::{
    AppliedMigLayout, CheckpointOutcome, CheckpointTrigger, Command, CommandKind, CommandResult,
    ReplicaPhase,
};
use tokio::sync::mpsc;

use super::replica::{ask_checkpoint, ask_stop};
use super::start::start_replica;
use super::{CheckpointRequest, Event, Key, ReplicaMsg, Runtime, StartSpec};
use crate::mig;

impl Runtime {
    pub(super) fn dispatch(&mut self, c: Command) {
        if !self.seen.insert(c.id) {
            return;
        }
        let id = c.id;
        let ctx = self.ctx.clone();
        let result = move |ok: bool, message: String| CommandResult {
            command_id: id,
            ok,
            message: Some(message),
            manifest: None,
            mig_layout: None,
        };
        match c.kind {
            CommandKind::Start {
                job_id,
                replica,
                attempt,
                command,
                image,
                working_dir,
                env,
                devices,
                checkpoint_uri,
                resume_from,
                limits,
                rendezvous,
                secrets,
            } => {
                if let Some(r) = self.replicas.get(&(job_id, replica))
                    && r.attempt == attempt
                    && r.phase != ReplicaPhase::Exited
                {
                    ctx.event(Event::Result(result(true, "already running".into())));
                    return;
                }
                // An older attempt of the same replica still running here is stopped first, so
                // two never write the same checkpoint directory.
                let older = self
                    .replicas
                    .get(&(job_id, replica))
                    .filter(|r| r.attempt != attempt && r.phase != ReplicaPhase::Exited)
                    .map(|r| r.tx.clone());
                let spec = StartSpec {
                    job_id,
                    replica,
                    attempt,
                    command,
                    env,
                    devices,
                    checkpoint_uri,
                    resume_from,
                    image,
                    working_dir,
                    limits,
                    gang: rendezvous.as_ref().is_some_and(|r| r.world_size > 1),
                    rendezvous,
                    secrets,
                };
                tokio::spawn(async move {
                    if let Some(tx) = older {
                        ask_stop(&tx, ctx.cfg.drain_grace).await;
                    }
                    let r = match start_replica(&ctx, spec).await {
                        Ok(msg) => result(true, msg),
                        Err(msg) => {
                            tracing::error!(job = %job_id, replica, error = %msg, "start failed");
                            result(false, msg)
                        }
                    };
                    ctx.event(Event::Result(r));
                });
            }
            CommandKind::Checkpoint {
                job_id,
                replica,
                checkpoint_id,
                uri: _,
                deadline,
            } => {
                let Some(tx) = self.replicas.get(&(job_id, replica)).map(|r| r.tx.clone()) else {
                    ctx.event(Event::Result(result(
                        false,
                        "no such replica on this node".into(),
                    )));
                    return;
                };
                tokio::spawn(async move {
                    let req = CheckpointRequest {
                        checkpoint_id,
                        trigger: CheckpointTrigger::Command,
                        deadline,
                        reuse_after: None,
                    };
                    let r = match ask_checkpoint(&tx, req).await {
                        Some(report) => {
                            ctx.report(&report).await;
                            CommandResult {
                                command_id: id,
                                ok: report.outcome == CheckpointOutcome::Durable,
                                message: report.message.clone(),
                                manifest: report.manifest.clone(),
                                mig_layout: None,
                            }
                        }
                        None => result(false, "the replica exited".into()),
                    };
                    ctx.event(Event::Result(r));
                });
            }
            CommandKind::Stop {
                job_id,
                replica,
                attempt,
                grace_ms,
            } => {
                let Some(tx) = self
                    .replicas
                    .get(&(job_id, replica))
                    .filter(|r| attempt.is_none_or(|a| a == r.attempt))
                    .map(|r| r.tx.clone())
                else {
                    ctx.event(Event::Result(result(true, "not running".into())));
                    return;
                };
                tokio::spawn(async move {
                    let msg = match ask_stop(&tx, Duration::from_millis(grace_ms)).await {
                        Some(exit) => format!("stopped: {exit}"),
                        None => "already exited".into(),
                    };
                    ctx.event(Event::Result(result(true, msg)));
                });
            }
            CommandKind::ApplyMigLayout { gpu_index, layout } => {
                let mig = self.mig.clone();
                tokio::spawn(async move {
                    let applied = tokio::task::spawn_blocking(move || {
                        mig::apply(mig.as_ref(), gpu_index, &layout, &[])
                    })
                    .await;
                    let r = match applied {
                        Ok(a) => CommandResult {
                            command_id: id,
                            ok: a.error.is_none(),
                            message: a.error.as_ref().map(ToString::to_string),
                            manifest: None,
                            mig_layout: a
                                .layout
                                .map(|layout: MigLayout| AppliedMigLayout { gpu_index, layout }),
                        },
                        Err(e) => result(false, format!("MIG re-layout task failed: {e}")),
                    };
                    ctx.event(Event::Result(r));
                });
            }
            CommandKind::Drain { deadline, reason } => {
                tracing::warn!(
                    ?deadline,
                    ?reason,
                    "drain: checkpointing and stopping every replica"
                );
                let targets: Vec<(Key, mpsc::Sender<ReplicaMsg>)> = self
                    .replicas
                    .iter()
                    .filter(|(_, r)| r.phase != ReplicaPhase::Exited)
                    .map(|(k, r)| (*k, r.tx.clone()))
                    .collect();
                let reuse_after = self.notice_at;
                tokio::spawn(async move {
                    let jobs = targets.into_iter().map(|(key, tx)| {
                        let ctx = ctx.clone();
                        async move {
                            let req = CheckpointRequest {
                                checkpoint_id: ctx.new_checkpoint_id(),
                                trigger: CheckpointTrigger::Drain,
                                deadline,
                                reuse_after,
                            };
                            let durable = match ask_checkpoint(&tx, req).await {
                                Some(r) => {
                                    ctx.report(&r).await;
                                    r.outcome == CheckpointOutcome::Durable
                                }
                                None => false,
                            };
                            ask_stop(&tx, ctx.cfg.drain_grace).await;
                            (key, durable)
                        }
                    });
                    let outcomes = futures::future::join_all(jobs).await;
                    let missed: Vec<String> = outcomes
                        .iter()
                        .filter(|(_, d)| !d)
                        .map(|((j, r), _)| format!("{j}/{r}"))
                        .collect();
                    let r = if missed.is_empty() {
                        result(
                            true,
                            format!("{} replicas checkpointed and stopped", outcomes.len()),
                        )
                    } else {
                        result(
                            false,
                            format!("no durable checkpoint for {}", missed.join(", ")),
                        )
                    };
                    ctx.event(Event::Result(r));
                });
            }
        }
    }
}
