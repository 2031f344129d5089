//! The recovery loop's reads and writes: the snapshot `recovery::plan` decides on, and each of
//! its actions as one transaction (with the job's history and outbox rows where the job moves).

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect, TransactionTrait};
use serde_json::json;
use spotplane_core::agent::{
    CommandKind, GpuInfo, Rendezvous, ReplicaPhase, ReplicaStatus, TerminationNotice,
};
use spotplane_core::job::JobSpec;
use spotplane_core::mig::{MigInstance, MigLayout};
use spotplane_core::rendezvous::{self, AgentAddress, Member, PortRange};
use spotplane_core::{CheckpointId, JobId, JobState, NodeId, NodeState};

use super::agents::{CHECKPOINT_COMPLETE, PHASE_START_FAILED};
use super::entity::{agent_command, allocation, checkpoint, gpu, job, node, node_agent};
use super::jobs::{job_event_in, job_note_in};
use super::{Store, StoreError, from_json, parse_col};
use crate::recovery::{
    AllocView, CheckpointView, Dropped, JobView, NodeView, PendingCommand, PendingKind,
    ReportedReplica, Requeue, ResumePoint, Snapshot,
};

const WATCHED: [JobState; 4] = [
    JobState::Admitted,
    JobState::Starting,
    JobState::Running,
    JobState::Draining,
];

fn phase_of(text: &str) -> Option<ReplicaPhase> {
    match text {
        "starting" => Some(ReplicaPhase::Starting),
        "running" => Some(ReplicaPhase::Running),
        "checkpointing" => Some(ReplicaPhase::Checkpointing),
        "exited" | PHASE_START_FAILED => Some(ReplicaPhase::Exited),
        _ => None,
    }
}

/// What a replica gets as `CUDA_VISIBLE_DEVICES`: GPU indices, or the MIG device's UUID as the
/// agent found it at registration.
fn devices(
    a: &allocation::Model,
    inventory: Option<&Vec<GpuInfo>>,
) -> Result<Vec<String>, StoreError> {
    let gpus: Vec<u32> = from_json("allocations", &a.id, a.gpu_indices.clone())?;
    if let Some(m) = &a.mig {
        let inst: MigInstance = from_json("allocations", &a.id, m.clone())?;
        let gpu = gpus.first().copied().unwrap_or(0);
        let uuid = inventory
            .and_then(|inv| inv.iter().find(|g| g.index == gpu))
            .and_then(|g| g.mig_devices.iter().find(|d| d.start == inst.start))
            .map(|d| d.uuid.clone());
        return Ok(vec![uuid.unwrap_or_else(|| gpu.to_string())]);
    }
    Ok(gpus.iter().map(ToString::to_string).collect())
}

/// Where a job's checkpoints go: its own `checkpoint.uri`, else `<default_root>/jobs/<id>`.
pub(crate) fn checkpoint_prefix(spec: &JobSpec, job_id: JobId, default_root: &str) -> String {
    match &spec.checkpoint {
        Some(c) => c.uri.clone(),
        None => format!("{}/jobs/{job_id}", default_root.trim_end_matches('/')),
    }
}

/// GPU-milli an allocation holds: 1000 per whole GPU, the share, or a MIG slice's compute share.
fn gpu_milli(a: &allocation::Model) -> Result<u32, StoreError> {
    if let Some(m) = &a.mig {
        let inst: MigInstance = from_json("allocations", &a.id, m.clone())?;
        return Ok(u32::from(inst.class.compute_slices()) * 1000 / 7);
    }
    Ok(u32::try_from(a.gpu_milli).unwrap_or(0))
}

impl Store {
    /// Everything the recovery core looks at, now.
    pub async fn recovery_snapshot(&self, retry_limit: u32) -> Result<Snapshot, StoreError> {
        self.measured("recovery_snapshot", || async {
            let jobs = job::Entity::find()
                .filter(job::Column::State.is_in(WATCHED.map(|s| s.to_string())))
                .all(&self.read)
                .await?;
            let ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
            let mut allocs: HashMap<String, Vec<allocation::Model>> = HashMap::new();
            let mut durable: HashMap<String, Vec<checkpoint::Model>> = HashMap::new();
            for chunk in ids.chunks(500) {
                for a in allocation::Entity::find()
                    .filter(allocation::Column::JobId.is_in(chunk.to_vec()))
                    .filter(allocation::Column::ReleasedAt.is_null())
                    .all(&self.read)
                    .await?
                {
                    allocs.entry(a.job_id.clone()).or_default().push(a);
                }
                for c in checkpoint::Entity::find()
                    .filter(checkpoint::Column::JobId.is_in(chunk.to_vec()))
                    .filter(checkpoint::Column::State.eq(CHECKPOINT_COMPLETE))
                    .all(&self.read)
                    .await?
                {
                    durable.entry(c.job_id.clone()).or_default().push(c);
                }
            }
            // The nodes: every live one, and any the allocations point at. By id, so what is
            // read from them (the replicas their agents report, and so the stops planned for
            // them) comes in the same order every run.
            let mut node_rows: BTreeMap<String, node::Model> = node::Entity::find()
                .filter(
                    node::Column::State.is_in(
                        [
                            NodeState::Requested,
                            NodeState::Booting,
                            NodeState::Ready,
                            NodeState::Draining,
                            NodeState::Terminating,
                        ]
                        .map(|s| s.to_string()),
                    ),
                )
                .all(&self.read)
                .await?
                .into_iter()
                .map(|n| (n.id.clone(), n))
                .collect();
            let referenced: Vec<String> = allocs
                .values()
                .flatten()
                .map(|a| a.node_id.clone())
                .filter(|n| !node_rows.contains_key(n))
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            for chunk in referenced.chunks(500) {
                for n in node::Entity::find()
                    .filter(node::Column::Id.is_in(chunk.to_vec()))
                    .all(&self.read)
                    .await?
                {
                    node_rows.insert(n.id.clone(), n);
                }
            }
            let node_ids: Vec<String> = node_rows.keys().cloned().collect();
            let mut agents: HashMap<String, node_agent::Model> = HashMap::new();
            for chunk in node_ids.chunks(500) {
                for a in node_agent::Entity::find()
                    .filter(node_agent::Column::NodeId.is_in(chunk.to_vec()))
                    .all(&self.read)
                    .await?
                {
                    agents.insert(a.node_id.clone(), a);
                }
            }

            let mut snap = Snapshot::default();
            let mut inventories: HashMap<String, Vec<GpuInfo>> = HashMap::new();
            for (id, n) in &node_rows {
                let state: NodeState = parse_col("nodes", id, &n.state)?;
                let agent = agents.get(id);
                let notice: Option<TerminationNotice> = match agent.and_then(|a| a.notice.clone()) {
                    // A malformed stored notice is as good as none: logged, not fatal.
                    Some(v) => serde_json::from_value(v)
                        .map_err(|e| {
                            tracing::warn!(node = %id, error = %e, "stored notice unreadable");
                        })
                        .ok(),
                    None => None,
                };
                if let Some(a) = agent {
                    if let Ok(inv) = serde_json::from_value::<Vec<GpuInfo>>(a.inventory.clone()) {
                        inventories.insert(id.clone(), inv);
                    }
                    let replicas: Vec<ReplicaStatus> =
                        from_json("node_agents", id, a.replicas.clone())?;
                    let node_id: NodeId = parse_col("nodes", id, id)?;
                    for r in replicas {
                        snap.reported.push(ReportedReplica {
                            node: node_id,
                            job: r.job_id,
                            replica: r.replica,
                            attempt: r.attempt,
                            phase: r.phase,
                        });
                    }
                }
                snap.nodes.push(NodeView {
                    id: parse_col("nodes", id, id)?,
                    state,
                    notice_deadline: n.notice_deadline,
                    notice_seen_at: notice
                        .as_ref()
                        .filter(|n| n.drain_deadline().is_some())
                        .map(|n| n.observed_at),
                    agent_saw_notice: notice.is_some_and(|n| n.drain_deadline().is_some()),
                    agent_last_seen: agent
                        .and_then(|a| a.last_heartbeat_at.or(Some(a.registered_at))),
                    // A node's row changes with its state (heartbeats touch other columns).
                    draining_since: (state == NodeState::Draining).then_some(n.updated_at),
                });
            }
            for chunk in node_ids.chunks(500) {
                for c in agent_command::Entity::find()
                    .filter(agent_command::Column::NodeId.is_in(chunk.to_vec()))
                    .filter(agent_command::Column::CompletedAt.is_null())
                    .all(&self.read)
                    .await?
                {
                    let kind: CommandKind = from_json("agent_commands", &c.id, c.body)?;
                    snap.pending.push(PendingCommand {
                        node: parse_col("agent_commands", &c.id, &c.node_id)?,
                        kind: match kind {
                            CommandKind::Checkpoint {
                                job_id, replica, ..
                            } => PendingKind::Checkpoint {
                                job: job_id,
                                replica,
                            },
                            CommandKind::Stop {
                                job_id,
                                replica,
                                attempt,
                                ..
                            } => PendingKind::Stop {
                                job: job_id,
                                replica,
                                attempt,
                            },
                            CommandKind::Drain { .. } => PendingKind::Drain,
                            _ => PendingKind::Other,
                        },
                    });
                }
            }
            for j in jobs {
                let spec: JobSpec = from_json("jobs", &j.id, j.spec.clone())?;
                let mut views = Vec::new();
                for a in allocs.remove(&j.id).unwrap_or_default() {
                    views.push(AllocView {
                        replica: u32::try_from(a.replica).unwrap_or(0),
                        attempt: u32::try_from(a.attempt).unwrap_or(0),
                        node: parse_col("allocations", &a.id, &a.node_id)?,
                        gpu_milli: gpu_milli(&a)?,
                        devices: devices(&a, inventories.get(&a.node_id))?,
                        started_at: a.started_at,
                        phase: a.phase.as_deref().and_then(phase_of),
                        exit_code: match a.phase.as_deref() {
                            Some(PHASE_START_FAILED) => None,
                            _ => a.exit_code,
                        },
                        start_error: match a.phase.as_deref() {
                            Some(PHASE_START_FAILED) => a.start_error.clone(),
                            _ => None,
                        },
                    });
                }
                views.sort_by_key(|a| a.replica);
                let mut points = Vec::new();
                for c in durable.remove(&j.id).unwrap_or_default() {
                    let Some(at) = c.completed_at else { continue };
                    points.push(CheckpointView {
                        replica: u32::try_from(c.replica).unwrap_or(0),
                        attempt: u32::try_from(c.attempt).unwrap_or(0),
                        started_at: c.created_at,
                        point: ResumePoint {
                            checkpoint_id: parse_col::<CheckpointId>("checkpoints", &c.id, &c.id)?,
                            uri: c.uri,
                            completed_at: at,
                        },
                    });
                }
                snap.jobs.push(JobView {
                    id: parse_col("jobs", &j.id, &j.id)?,
                    state: parse_col("jobs", &j.id, &j.state)?,
                    attempt: u32::try_from(j.attempt).unwrap_or(0),
                    replicas: spec.replicas,
                    elastic: spec.elastic,
                    retry_limit: spec.max_retries.unwrap_or(retry_limit),
                    failures: u32::try_from(j.failures).unwrap_or(0),
                    checkpoint_interval: spec
                        .checkpoint
                        .as_ref()
                        .map(|c| chrono::Duration::seconds(i64::from(c.interval_s))),
                    running_since: j.running_since,
                    drain_started_at: j.drain_started_at,
                    checkpoint_requested_at: j.checkpoint_requested_at,
                    resume_from: match j.resume_from {
                        Some(v) => from_json("jobs", &j.id, v)?,
                        None => BTreeMap::new(),
                    },
                    allocs: views,
                    durable: points,
                });
            }
            snap.jobs.sort_by_key(|j| j.id);
            snap.nodes.sort_by_key(|n| n.id);
            Ok(snap)
        })
        .await
    }

    /// Queues a replica's `start` and marks its allocation started, in one transaction. The
    /// command carries the job's command line, image, environment and checkpoint prefix (its own
    /// `checkpoint.uri`, else `<default_root>/jobs/<id>`), and the gang's rendezvous worked out
    /// from the job's current allocations and their nodes' agents (`rendezvous::gang`, with
    /// the master port from `ports`). A gang that cannot form yet (a peer's node without a
    /// registered agent, a replica not placed) is a conflict, nothing written: the recovery
    /// loop tries again next round.
    #[allow(clippy::too_many_arguments)]
    pub async fn start_replica(
        &self,
        job_id: JobId,
        node_id: NodeId,
        replica: u32,
        attempt: u32,
        devices: Vec<String>,
        resume_from: Option<String>,
        default_root: &str,
        ports: PortRange,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.measured("start_replica", || async {
            let txn = self.write.begin().await?;
            let row = job::Entity::find_by_id(job_id.to_string())
                .one(&txn)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("job {job_id}")))?;
            let spec: JobSpec = from_json("jobs", &row.id, row.spec.clone())?;
            let marked = allocation::Entity::update_many()
                .col_expr(allocation::Column::StartedAt, Expr::value(Some(now)))
                .filter(allocation::Column::JobId.eq(job_id.to_string()))
                .filter(allocation::Column::Replica.eq(i32::try_from(replica).unwrap_or(i32::MAX)))
                .filter(allocation::Column::Attempt.eq(i32::try_from(attempt).unwrap_or(i32::MAX)))
                .filter(allocation::Column::NodeId.eq(node_id.to_string()))
                .filter(allocation::Column::ReleasedAt.is_null())
                .filter(allocation::Column::StartedAt.is_null())
                .exec(&txn)
                .await?;
            if marked.rows_affected != 1 {
                return Err(StoreError::Conflict(format!(
                    "replica {replica} of job {job_id} (attempt {attempt}) is not waiting to start on node {node_id}"
                )));
            }
            let rendezvous = gang_rendezvous(&txn, job_id, &spec, replica, ports).await?;
            let checkpoint_uri = checkpoint_prefix(&spec, job_id, default_root);
            let kind = CommandKind::Start {
                job_id,
                replica,
                attempt,
                command: spec.command.clone(),
                image: spec.image.clone(),
                working_dir: spec.working_dir.clone(),
                env: spec.env.clone(),
                devices: devices.clone(),
                checkpoint_uri,
                resume_from: resume_from.clone(),
                secrets: !spec.secrets.is_empty() || spec.image_pull_secret.is_some(),
                rendezvous: Some(rendezvous),
                limits: Some(spotplane_core::agent::ReplicaLimits {
                    cpu_milli: spec.cpu_milli,
                    memory_mib: spec.memory_mib,
                }),
            };
            super::agents::enqueue_command_in(&txn, node_id, kind, now).await?;
            txn.commit().await?;
            Ok(())
        })
        .await
    }

    /// Queues a checkpoint of one replica and notes when it was asked for.
    pub async fn request_checkpoint(
        &self,
        job_id: JobId,
        node_id: NodeId,
        replica: u32,
        deadline: Option<DateTime<Utc>>,
        default_root: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.measured("request_checkpoint", || async {
            let txn = self.write.begin().await?;
            let row = job::Entity::find_by_id(job_id.to_string())
                .one(&txn)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("job {job_id}")))?;
            let spec: JobSpec = from_json("jobs", &row.id, row.spec.clone())?;
            let uri = checkpoint_prefix(&spec, job_id, default_root);
            job::Entity::update_many()
                .col_expr(job::Column::CheckpointRequestedAt, Expr::value(Some(now)))
                .filter(job::Column::Id.eq(job_id.to_string()))
                .exec(&txn)
                .await?;
            let kind = CommandKind::Checkpoint {
                job_id,
                replica,
                checkpoint_id: CheckpointId::from_uuid(super::new_uuid(now)),
                uri,
                deadline,
            };
            super::agents::enqueue_command_in(&txn, node_id, kind, now).await?;
            txn.commit().await?;
            Ok(())
        })
        .await
    }

    /// Puts a run that did not finish back in the queue, in one transaction: through
    /// `checkpointed` or `lost` as `how` says, with its resume point, the work lost added to
    /// the job, a failure counted and its back-off set. `from` guards against a concurrent change.
    #[allow(clippy::too_many_arguments)]
    pub async fn requeue_job(
        &self,
        job_id: JobId,
        from: JobState,
        how: Requeue,
        resume_from: &BTreeMap<u32, ResumePoint>,
        lost_gpu_seconds: i64,
        not_before: Option<DateTime<Utc>>,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.measured("requeue_job", || async {
            let txn = self.write.begin().await?;
            let row = job::Entity::find_by_id(job_id.to_string())
                .one(&txn)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("job {job_id}")))?;
            let state: JobState = parse_col("jobs", &row.id, &row.state)?;
            if state != from {
                return Err(StoreError::Conflict(format!(
                    "job {job_id} is {state}, not {from}"
                )));
            }
            let resume = serde_json::to_value(resume_from)
                .map_err(|e| StoreError::Conflict(e.to_string()))?;
            let failures = row.failures + i32::from(how == Requeue::Failure);
            job::Entity::update_many()
                .col_expr(job::Column::ResumeFrom, Expr::value(Some(resume.clone())))
                .col_expr(
                    job::Column::LostGpuSeconds,
                    Expr::value(row.lost_gpu_seconds + lost_gpu_seconds),
                )
                .col_expr(job::Column::Failures, Expr::value(failures))
                .col_expr(job::Column::NotBefore, Expr::value(not_before))
                .col_expr(
                    job::Column::RunningSince,
                    Expr::value(Option::<DateTime<Utc>>::None),
                )
                .col_expr(
                    job::Column::DrainStartedAt,
                    Expr::value(Option::<DateTime<Utc>>::None),
                )
                .filter(job::Column::Id.eq(job_id.to_string()))
                .exec(&txn)
                .await?;
            let row = job::Entity::find_by_id(job_id.to_string())
                .one(&txn)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("job {job_id}")))?;
            let data = json!({"resume_from": resume, "lost_gpu_seconds": lost_gpu_seconds,
                "attempt": row.attempt, "failures": failures, "not_before": not_before});
            let row = match how {
                Requeue::Checkpointed => {
                    let j = job_event_in(
                        &txn,
                        row,
                        JobState::Checkpointed,
                        Some("every replica checkpointed".into()),
                        Some(data.clone()),
                        now,
                    )
                    .await?;
                    reload(&txn, j.id).await?
                }
                Requeue::Lost => {
                    let j = job_event_in(
                        &txn,
                        row,
                        JobState::Lost,
                        Some(reason.to_owned()),
                        Some(data.clone()),
                        now,
                    )
                    .await?;
                    reload(&txn, j.id).await?
                }
                Requeue::NotStarted | Requeue::Failure => row,
            };
            job_event_in(
                &txn,
                row,
                JobState::Queued,
                Some(reason.to_owned()),
                Some(data),
                now,
            )
            .await?;
            txn.commit().await?;
            Ok(())
        })
        .await
    }

    /// Lets some replicas of a running elastic job go, in one transaction: their allocations
    /// released (the scheduler places them again), their resume points set, the work lost
    /// added to the job, and a `job.replicas_lost` history entry and outbox event. A job no
    /// longer running is a conflict, nothing written.
    pub async fn drop_replicas(
        &self,
        job_id: JobId,
        replicas: &[Dropped],
        lost_gpu_seconds: i64,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.measured("drop_replicas", || async {
            let txn = self.write.begin().await?;
            let row = reload(&txn, job_id).await?;
            let state: JobState = parse_col("jobs", &row.id, &row.state)?;
            if state != JobState::Running {
                return Err(StoreError::Conflict(format!(
                    "job {job_id} is {state}, not running"
                )));
            }
            let mut resume: BTreeMap<u32, ResumePoint> = match row.resume_from.clone() {
                Some(v) => from_json("jobs", &row.id, v)?,
                None => BTreeMap::new(),
            };
            for d in replicas {
                let released = allocation::Entity::update_many()
                    .col_expr(allocation::Column::ReleasedAt, Expr::value(Some(now)))
                    .filter(allocation::Column::JobId.eq(row.id.clone()))
                    .filter(
                        allocation::Column::Replica
                            .eq(i32::try_from(d.replica).unwrap_or(i32::MAX)),
                    )
                    .filter(
                        allocation::Column::Attempt
                            .eq(i32::try_from(d.attempt).unwrap_or(i32::MAX)),
                    )
                    .filter(allocation::Column::ReleasedAt.is_null())
                    .exec(&txn)
                    .await?;
                if released.rows_affected != 1 {
                    return Err(StoreError::Conflict(format!(
                        "replica {} of job {job_id} (attempt {}) holds no allocation",
                        d.replica, d.attempt
                    )));
                }
                match &d.resume_from {
                    Some(p) => resume.insert(d.replica, p.clone()),
                    None => resume.remove(&d.replica),
                };
            }
            let resume_json =
                serde_json::to_value(&resume).map_err(|e| StoreError::Conflict(e.to_string()))?;
            job::Entity::update_many()
                .col_expr(job::Column::ResumeFrom, Expr::value(Some(resume_json)))
                .col_expr(
                    job::Column::LostGpuSeconds,
                    Expr::value(row.lost_gpu_seconds + lost_gpu_seconds),
                )
                .filter(job::Column::Id.eq(row.id.clone()))
                .exec(&txn)
                .await?;
            let row = reload(&txn, job_id).await?;
            let data = json!({
                "replicas": replicas.iter().map(|d| json!({
                    "replica": d.replica, "attempt": d.attempt, "resume_from": d.resume_from,
                })).collect::<Vec<_>>(),
                "lost_gpu_seconds": lost_gpu_seconds,
            });
            job_note_in(&txn, row, "replicas_lost", reason, data, now).await?;
            txn.commit().await?;
            Ok(())
        })
        .await
    }

    /// Retires a node whose agent went silent: `terminating` (the capacity loop gives the
    /// instance back), with its outbox event.
    pub async fn node_lost(
        &self,
        node_id: NodeId,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.transition_node(
            node_id,
            NodeState::Terminating,
            Some(reason.to_owned()),
            now,
        )
        .await
    }

    /// Orders the agents the MIG re-layouts the scheduler asked for: every GPU of a live node
    /// with a desired layout and no `apply_mig_layout` command for it still unanswered gets one
    /// (an empty layout turns MIG off). Returns how many were sent.
    pub async fn send_relayouts(&self, now: DateTime<Utc>) -> Result<usize, StoreError> {
        self.measured("send_relayouts", || async {
            let wanted = gpu::Entity::find()
                .filter(gpu::Column::DesiredMigLayout.is_not_null())
                .all(&self.read)
                .await?;
            if wanted.is_empty() {
                return Ok(0);
            }
            let txn = self.write.begin().await?;
            let mut sent = 0;
            for g in wanted {
                let Some(desired) = g.desired_mig_layout.clone() else {
                    continue;
                };
                let layout: Option<MigLayout> = from_json("gpus", &g.id, desired)?;
                let gpu_index = u32::try_from(g.idx).unwrap_or(0);
                let pending = agent_command::Entity::find()
                    .filter(agent_command::Column::NodeId.eq(g.node_id.clone()))
                    .filter(agent_command::Column::Kind.eq("apply_mig_layout"))
                    .filter(agent_command::Column::CompletedAt.is_null())
                    .all(&txn)
                    .await?
                    .into_iter()
                    .any(|c| {
                        serde_json::from_value::<CommandKind>(c.body).is_ok_and(|k| {
                            matches!(k, CommandKind::ApplyMigLayout { gpu_index: i, .. } if i == gpu_index)
                        })
                    });
                if pending {
                    continue;
                }
                let node_id: NodeId = parse_col("gpus", &g.id, &g.node_id)?;
                let kind = CommandKind::ApplyMigLayout {
                    gpu_index,
                    layout: layout.unwrap_or_default(),
                };
                match super::agents::enqueue_command_in(&txn, node_id, kind, now).await {
                    Ok(_) => sent += 1,
                    // A node gone meanwhile: its GPUs no longer matter.
                    Err(StoreError::Conflict(_) | StoreError::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            txn.commit().await?;
            Ok(sent)
        })
        .await
    }

    /// Jobs waiting out a back-off at `now`.
    pub async fn jobs_backing_off(&self, now: DateTime<Utc>) -> Result<HashSet<JobId>, StoreError> {
        self.measured("jobs_backing_off", || async {
            let rows: Vec<String> = job::Entity::find()
                .select_only()
                .column(job::Column::Id)
                .filter(job::Column::State.eq(JobState::Queued.to_string()))
                .filter(job::Column::NotBefore.gt(now))
                .into_tuple()
                .all(&self.read)
                .await?;
            rows.iter().map(|id| parse_col("jobs", id, id)).collect()
        })
        .await
    }
}

/// The rendezvous of one replica of a job, from the job's current allocations and how their
/// nodes' agents registered, as the transaction sees them.
async fn gang_rendezvous<C: sea_orm::ConnectionTrait>(
    txn: &C,
    job_id: JobId,
    spec: &JobSpec,
    replica: u32,
    ports: PortRange,
) -> Result<Rendezvous, StoreError> {
    let allocs = allocation::Entity::find()
        .filter(allocation::Column::JobId.eq(job_id.to_string()))
        .filter(allocation::Column::ReleasedAt.is_null())
        .all(txn)
        .await?;
    let node_ids: Vec<String> = allocs
        .iter()
        .map(|a| a.node_id.clone())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let agents: HashMap<String, AgentAddress> = node_agent::Entity::find()
        .filter(node_agent::Column::NodeId.is_in(node_ids))
        .all(txn)
        .await?
        .into_iter()
        .map(|a| {
            (
                a.node_id,
                AgentAddress {
                    address: a.address,
                    hostname: a.hostname,
                },
            )
        })
        .collect();
    let mut members = Vec::with_capacity(allocs.len());
    for a in &allocs {
        members.push(Member {
            replica: u32::try_from(a.replica)
                .map_err(|e| StoreError::corrupt("allocations", &a.id, e))?,
            attempt: u32::try_from(a.attempt)
                .map_err(|e| StoreError::corrupt("allocations", &a.id, e))?,
            node: parse_col("allocations", &a.id, &a.node_id)?,
            agent: agents.get(&a.node_id).cloned(),
        });
    }
    let waits = |why: String| {
        StoreError::Conflict(format!(
            "replica {replica} of job {job_id} waits to start: {why}"
        ))
    };
    rendezvous::gang(job_id, spec.replicas, &members, ports)
        .map_err(|e| waits(e.to_string()))?
        .rendezvous(replica)
        .ok_or_else(|| waits(format!("replica {replica} is not in its gang")))
}

async fn reload<C: sea_orm::ConnectionTrait>(txn: &C, id: JobId) -> Result<job::Model, StoreError> {
    job::Entity::find_by_id(id.to_string())
        .one(txn)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("job {id}")))
}
