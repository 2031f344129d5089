//! What the scheduler reads and writes: its snapshot, and its decisions as transactions.
//!
//! A snapshot is built from four reads (nodes with GPUs, live allocations, jobs that hold or
//! want capacity, teams). Job specs never change after submission, so the caller keeps the
//! parsed specs in a [`SpecCache`] and only new jobs' JSON is read and parsed each cycle.
//! Each decision is then one transaction: an admission writes the allocations and moves the
//! job to `admitted`; a preemption moves the victim to `draining`; both write their history
//! and outbox rows in the same transaction.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QuerySelect, Set, TransactionTrait,
};
use serde_json::json;
use spotplane_core::job::JobSpec;
use spotplane_core::{Cloud, JobId, JobState, MigLayout, NodeId, NodeState};

use super::entity::{allocation, api_token, checkpoint, gpu, job, node, node_agent, outbox, team};
use super::jobs::{job_event_in, job_note_in};
use super::{Store, StoreError, from_json, new_uuid, parse_col};
use crate::model::Role;
use crate::scheduler::{
    Assigned, GpuSnap, NodeSnap, Placement, PreemptionReason, QueuedJob, RunningJob, Snapshot,
    TeamSnap, WaitReason,
};

/// Parsed specs of jobs seen before, by id.
#[derive(Debug, Default)]
pub struct SpecCache {
    specs: HashMap<String, (JobId, JobSpec)>,
}

impl SpecCache {
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// The spec of a job the last snapshot saw.
    pub fn get(&self, id: JobId) -> Option<&JobSpec> {
        self.specs.get(&id.to_string()).map(|(_, s)| s)
    }
}

/// (id, state, priority, updated_at, wait_reason, requeued) of a job the scheduler looks at.
type JobRow = (String, String, i32, DateTime<Utc>, Option<String>, bool);

/// Job states that hold capacity.
const HOLDING: [JobState; 4] = [
    JobState::Admitted,
    JobState::Starting,
    JobState::Running,
    JobState::Draining,
];

fn assigned_to_json(a: &Assigned) -> (serde_json::Value, Option<serde_json::Value>, i32) {
    match a {
        Assigned::CpuOnly => (json!([]), None, 0),
        Assigned::Whole(g) => (json!(g), None, 1000 * g.len() as i32),
        Assigned::Share { gpu, milli } => (json!([gpu]), None, *milli as i32),
        Assigned::Mig { gpu, instance } => (json!([gpu]), Some(json!(instance)), 0),
    }
}

fn assigned_from_row(row: &allocation::Model) -> Result<Assigned, StoreError> {
    let gpus: Vec<u32> = from_json("allocations", &row.id, row.gpu_indices.clone())?;
    if let Some(m) = &row.mig {
        let instance = from_json("allocations", &row.id, m.clone())?;
        let gpu = *gpus.first().ok_or_else(|| {
            StoreError::corrupt("allocations", &row.id, "MIG allocation without a GPU")
        })?;
        return Ok(Assigned::Mig { gpu, instance });
    }
    Ok(match (gpus.len(), row.gpu_milli) {
        (0, _) => Assigned::CpuOnly,
        (1, m) if m < 1000 => Assigned::Share {
            gpu: gpus[0],
            milli: m as u32,
        },
        _ => Assigned::Whole(gpus),
    })
}

impl Store {
    /// Everything the scheduler looks at, now.
    pub async fn scheduler_snapshot(&self, cache: &mut SpecCache) -> Result<Snapshot, StoreError> {
        // Not retried: a failed read is simply taken again next cycle.
        let started = std::time::Instant::now();
        let result = self.snapshot_once(cache).await;
        self.metrics
            .observe_store("scheduler_snapshot", result.is_ok(), started.elapsed());
        result
    }

    async fn snapshot_once(&self, cache: &mut SpecCache) -> Result<Snapshot, StoreError> {
        let live = [
            NodeState::Requested,
            NodeState::Booting,
            NodeState::Ready,
            NodeState::Draining,
        ];
        let nodes = node::Entity::find()
            .filter(node::Column::State.is_in(live.iter().map(|s| s.to_string())))
            .all(&self.read)
            .await?;
        let node_ids: Vec<String> = nodes.iter().map(|n| n.id.clone()).collect();
        let mut gpus_by_node: HashMap<String, Vec<gpu::Model>> = HashMap::new();
        if !node_ids.is_empty() {
            for g in gpu::Entity::find()
                .filter(gpu::Column::NodeId.is_in(node_ids.clone()))
                .all(&self.read)
                .await?
            {
                gpus_by_node.entry(g.node_id.clone()).or_default().push(g);
            }
        }
        // Nodes whose agent registered with a container engine.
        let mut with_engine: std::collections::HashSet<String> = std::collections::HashSet::new();
        if !node_ids.is_empty() {
            let ids: Vec<String> = node_agent::Entity::find()
                .select_only()
                .column(node_agent::Column::NodeId)
                .filter(node_agent::Column::NodeId.is_in(node_ids.clone()))
                .filter(node_agent::Column::ContainerEngine.is_not_null())
                .into_tuple()
                .all(&self.read)
                .await?;
            with_engine.extend(ids);
        }
        let mut snap_nodes = Vec::with_capacity(nodes.len());
        for n in nodes {
            let mut gpus = gpus_by_node.remove(&n.id).unwrap_or_default();
            gpus.sort_by_key(|g| g.idx);
            let model = match gpus.first() {
                Some(g) => Some(parse_col("gpus", &g.id, &g.model)?),
                None => None,
            };
            let mut gs = Vec::with_capacity(gpus.len());
            for g in gpus {
                let layout: MigLayout = from_json("gpus", &g.id, g.mig_layout.clone())?;
                let desired: Option<Option<MigLayout>> = match &g.desired_mig_layout {
                    None => None,
                    Some(v) => Some(from_json("gpus", &g.id, v.clone())?),
                };
                let actual = if g.mig_enabled { Some(layout) } else { None };
                gs.push(match (desired, actual) {
                    (Some(d), a) if d != a => GpuSnap::Relayout,
                    (_, Some(l)) => GpuSnap::Mig(l),
                    (_, None) => GpuSnap::Plain,
                });
            }
            let state: NodeState = parse_col("nodes", &n.id, &n.state)?;
            snap_nodes.push(NodeSnap {
                id: parse_col("nodes", &n.id, &n.id)?,
                cloud: parse_col("nodes", &n.id, &n.cloud)?,
                market: parse_col("nodes", &n.id, &n.market)?,
                schedulable: state == NodeState::Ready,
                cpu_milli: u64::try_from(n.cpu_milli).unwrap_or(0),
                memory_mib: u64::try_from(n.memory_mib).unwrap_or(0),
                gpu_model: model,
                gpus: gs,
                runs_images: with_engine.contains(&n.id),
                region: n.region,
                zone: n.zone,
            });
        }

        // Jobs: the columns the scheduler needs; specs from the cache, parsed once.
        let mut wanted: Vec<String> = HOLDING.iter().map(|s| s.to_string()).collect();
        wanted.push(JobState::Queued.to_string());
        let rows: Vec<JobRow> = job::Entity::find()
            .select_only()
            .columns([job::Column::Id, job::Column::State, job::Column::Priority])
            .column(job::Column::UpdatedAt)
            .columns([job::Column::WaitReason, job::Column::Requeued])
            .filter(job::Column::State.is_in(wanted))
            .into_tuple::<JobRow>()
            .all(&self.read)
            .await?;
        let missing: Vec<String> = rows
            .iter()
            .filter(|r| !cache.specs.contains_key(&r.0))
            .map(|r| r.0.clone())
            .collect();
        for chunk in missing.chunks(500) {
            let specs: Vec<(String, serde_json::Value)> = job::Entity::find()
                .select_only()
                .columns([job::Column::Id, job::Column::Spec])
                .filter(job::Column::Id.is_in(chunk.to_vec()))
                .into_tuple()
                .all(&self.read)
                .await?;
            for (id, spec) in specs {
                let parsed: JobSpec = from_json("jobs", &id, spec)?;
                let jid: JobId = parse_col("jobs", &id, &id)?;
                cache.specs.insert(id, (jid, parsed));
            }
        }
        let present: std::collections::HashSet<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        cache.specs.retain(|id, _| present.contains(id.as_str()));

        // Live allocations, by job.
        let mut allocs: HashMap<String, Vec<allocation::Model>> = HashMap::new();
        for a in allocation::Entity::find()
            .filter(allocation::Column::ReleasedAt.is_null())
            .all(&self.read)
            .await?
        {
            allocs.entry(a.job_id.clone()).or_default().push(a);
        }
        // The last completed checkpoint per job, for the cost of preempting it.
        let mut last_ckpt: HashMap<String, DateTime<Utc>> = HashMap::new();
        let ckpts: Vec<(String, Option<DateTime<Utc>>)> = checkpoint::Entity::find()
            .select_only()
            .columns([checkpoint::Column::JobId, checkpoint::Column::CompletedAt])
            .filter(checkpoint::Column::State.eq("complete"))
            .into_tuple()
            .all(&self.read)
            .await?;
        for (job_id, at) in ckpts {
            if let Some(at) = at {
                let e = last_ckpt.entry(job_id).or_insert(at);
                if at > *e {
                    *e = at;
                }
            }
        }

        let where_is: HashMap<NodeId, (Cloud, &str)> = snap_nodes
            .iter()
            .map(|n| (n.id, (n.cloud, n.region.as_str())))
            .collect();
        let mut running = Vec::new();
        let mut queued = Vec::new();
        for (id, state, priority, updated_at, wait, requeued) in rows {
            let Some((jid, spec)) = cache.specs.get(&id) else {
                continue;
            };
            let Some(team) = spec.team.clone() else {
                return Err(StoreError::corrupt("jobs", &id, "spec has no team"));
            };
            let state: JobState = parse_col("jobs", &id, &state)?;
            if state == JobState::Queued {
                let wait: Option<WaitReason> =
                    wait.map(|w| parse_col("jobs", &id, &w)).transpose()?;
                queued.push(QueuedJob {
                    id: *jid,
                    team,
                    priority,
                    requeued,
                    nominated: wait == Some(WaitReason::WaitingForPreemption),
                    replicas: spec.replicas,
                    shape: spec.replica_shape(),
                    clouds: spec.clouds.clone(),
                    regions: spec.regions.clone(),
                    spot: spec.spot,
                    image: spec.image.is_some(),
                });
            } else {
                let mut placements = Vec::new();
                for a in allocs.remove(&id).unwrap_or_default() {
                    placements.push(Placement {
                        replica: u32::try_from(a.replica).unwrap_or(0),
                        node: parse_col("allocations", &a.id, &a.node_id)?,
                        assigned: assigned_from_row(&a)?,
                    });
                }
                // An elastic gang running short of replicas (some left with their nodes) asks
                // for the missing ones, ahead of its priority peers and near its survivors.
                let holding = u32::try_from(placements.len()).unwrap_or(u32::MAX);
                if spec.elastic && state == JobState::Running && holding < spec.replicas {
                    let places: std::collections::BTreeSet<(Cloud, &str)> = placements
                        .iter()
                        .filter_map(|p| where_is.get(&p.node).copied())
                        .collect();
                    let (clouds, regions) = match places.first() {
                        Some((c, r)) if places.len() == 1 => (vec![*c], vec![(*r).to_owned()]),
                        _ => (spec.clouds.clone(), spec.regions.clone()),
                    };
                    queued.push(QueuedJob {
                        id: *jid,
                        team: team.clone(),
                        priority,
                        requeued: true,
                        nominated: false,
                        replicas: spec.replicas - holding,
                        shape: spec.replica_shape(),
                        clouds,
                        regions,
                        spot: spec.spot,
                        image: spec.image.is_some(),
                    });
                }
                running.push(RunningJob {
                    id: *jid,
                    team,
                    priority,
                    shape: spec.replica_shape(),
                    placements,
                    draining: state == JobState::Draining,
                    // Work at risk runs from the later of the last checkpoint and this run's start.
                    progress_since: last_ckpt
                        .get(&id)
                        .map_or(updated_at, |c| (*c).max(updated_at)),
                });
            }
        }

        let teams = team::Entity::find()
            .all(&self.read)
            .await?
            .into_iter()
            .map(|t| {
                Ok(TeamSnap {
                    name: parse_col("teams", &t.id, &t.name)?,
                    weight: t.weight,
                    cohort: t.cohort.clone(),
                    quotas: from_json::<BTreeMap<_, _>>("teams", &t.id, t.quotas)?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(Snapshot {
            nodes: snap_nodes,
            running,
            queued,
            teams,
        })
    }

    /// Admits a job: its allocations and `queued -> admitted`, with history and outbox, in one
    /// transaction. A job no longer queued (cancelled meanwhile) is a conflict, nothing written.
    pub async fn admit_job(
        &self,
        id: JobId,
        placements: &[Placement],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.measured("admit_job", || async {
            let txn = self.write.begin().await?;
            let row = job::Entity::find_by_id(id.to_string())
                .one(&txn)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("job {id}")))?;
            let from: JobState = parse_col("jobs", &row.id, &row.state)?;
            let spec: JobSpec = from_json("jobs", &row.id, row.spec.clone())?;
            // A running elastic gang short of replicas gets the missing ones, in replica order;
            // anything else must be queued.
            let refill = from == JobState::Running && spec.elastic;
            if from != JobState::Queued && !refill {
                return Err(StoreError::Conflict(format!(
                    "job {id} is {from}, not queued"
                )));
            }
            let mut replicas: Vec<u32> = placements.iter().map(|p| p.replica).collect();
            if refill {
                let held: std::collections::HashSet<i32> = allocation::Entity::find()
                    .filter(allocation::Column::JobId.eq(row.id.clone()))
                    .filter(allocation::Column::ReleasedAt.is_null())
                    .all(&txn)
                    .await?
                    .into_iter()
                    .map(|a| a.replica)
                    .collect();
                let missing: Vec<u32> = (0..spec.replicas)
                    .filter(|r| !held.contains(&i32::try_from(*r).unwrap_or(i32::MAX)))
                    .collect();
                if missing.len() != placements.len() {
                    return Err(StoreError::Conflict(format!(
                        "job {id} misses {} replicas, not {}",
                        missing.len(),
                        placements.len()
                    )));
                }
                let mut order: Vec<usize> = (0..placements.len()).collect();
                order.sort_by_key(|&i| placements[i].replica);
                for (k, i) in order.into_iter().enumerate() {
                    replicas[i] = missing[k];
                }
            }
            // Each admission is a new attempt: its replicas, commands and checkpoints carry it.
            let attempt = row.attempt + 1;
            job::Entity::update_many()
                .col_expr(job::Column::Attempt, Expr::value(attempt))
                .filter(job::Column::Id.eq(row.id.clone()))
                .exec(&txn)
                .await?;
            for (p, &replica) in placements.iter().zip(&replicas) {
                let (gpu_indices, mig, gpu_milli) = assigned_to_json(&p.assigned);
                allocation::ActiveModel {
                    id: Set(new_uuid(now).to_string()),
                    job_id: Set(row.id.clone()),
                    replica: Set(i32::try_from(replica).unwrap_or(i32::MAX)),
                    attempt: Set(attempt),
                    node_id: Set(p.node.to_string()),
                    gpu_indices: Set(gpu_indices),
                    mig: Set(mig),
                    gpu_milli: Set(gpu_milli),
                    cpu_milli: Set(i64::from(spec.cpu_milli)),
                    memory_mib: Set(spec.memory_mib as i64),
                    created_at: Set(now),
                    released_at: Set(None),
                    phase: Set(None),
                    exit_code: Set(None),
                    phase_at: Set(None),
                    started_at: Set(None),
                    start_error: Set(None),
                    util_samples: Set(0),
                    sm_util_sum: Set(0),
                    mem_used_mib_sum: Set(0),
                    mem_used_mib_max: Set(0),
                }
                .insert(&txn)
                .await?;
            }
            let nodes: Vec<String> = placements.iter().map(|p| p.node.to_string()).collect();
            let reason = format!("placed on {}", dedup(nodes).join(", "));
            if refill {
                let row = job::Entity::find_by_id(id.to_string())
                    .one(&txn)
                    .await?
                    .ok_or_else(|| StoreError::NotFound(format!("job {id}")))?;
                let text = format!(
                    "replica{} {} {reason}",
                    if replicas.len() == 1 { "" } else { "s" },
                    replicas
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                let data = json!({"replicas": replicas, "attempt": attempt});
                job_note_in(&txn, row, "replicas_placed", &text, data, now).await?;
            } else {
                job_event_in(&txn, row, JobState::Admitted, Some(reason), None, now).await?;
            }
            txn.commit().await?;
            Ok(())
        })
        .await
    }

    /// Preempts a job: a job already running checkpoints first (`-> draining`, then the
    /// recovery path requeues it); one admitted but not started goes straight back to the
    /// queue, ahead of its priority peers, its allocations released.
    pub async fn preempt_job(
        &self,
        victim: JobId,
        for_job: JobId,
        reason: PreemptionReason,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let why = match reason {
            PreemptionReason::Priority => format!("preempted for higher-priority job {for_job}"),
            PreemptionReason::Reclaim => {
                format!("preempted: its team's borrowed quota is reclaimed for job {for_job}")
            }
        };
        let current = self.get_job(victim, None).await?;
        let (to, text) = match current.state {
            JobState::Admitted => (JobState::Queued, format!("requeued: {why}")),
            _ => (JobState::Draining, why),
        };
        self.transition_job(victim, None, Some(current.state), to, Some(text), now)
            .await
            .map(|_| ())
    }

    /// Records why queued jobs wait (the code for the capacity loop, the sentence for people),
    /// writing only the jobs whose reason changed. A requeued job's mark ends here.
    pub async fn set_wait_reasons(
        &self,
        reasons: &[(JobId, WaitReason)],
        previous: &HashMap<JobId, Option<WaitReason>>,
    ) -> Result<usize, StoreError> {
        let mut by_reason: BTreeMap<&'static str, (WaitReason, Vec<String>)> = BTreeMap::new();
        for (id, r) in reasons {
            if previous.get(id).is_some_and(|p| *p == Some(*r)) {
                continue;
            }
            by_reason
                .entry(r.code())
                .or_insert_with(|| (*r, Vec::new()))
                .1
                .push(id.to_string());
        }
        let mut changed = 0;
        for (reason, ids) in by_reason.into_values() {
            for chunk in ids.chunks(500) {
                let res = self
                    .measured("set_wait_reasons", || async {
                        Ok(job::Entity::update_many()
                            .col_expr(job::Column::StateReason, Expr::value(reason.text()))
                            .col_expr(job::Column::WaitReason, Expr::value(reason.code()))
                            .col_expr(job::Column::Requeued, Expr::value(false))
                            .filter(job::Column::Id.is_in(chunk.to_vec()))
                            .filter(job::Column::State.eq(JobState::Queued.to_string()))
                            .exec(&self.write)
                            .await?)
                    })
                    .await?;
                changed += res.rows_affected as usize;
            }
        }
        Ok(changed)
    }

    /// Orders a MIG re-layout of one GPU (`None`: MIG off), for the node's agent to apply.
    pub async fn request_relayout(
        &self,
        node_id: NodeId,
        gpu_index: u32,
        layout: Option<&MigLayout>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.measured("request_relayout", || async {
            let txn = self.write.begin().await?;
            let desired =
                serde_json::to_value(layout).map_err(|e| StoreError::Conflict(e.to_string()))?;
            let res = gpu::Entity::update_many()
                .col_expr(gpu::Column::DesiredMigLayout, Expr::value(desired.clone()))
                .filter(gpu::Column::NodeId.eq(node_id.to_string()))
                .filter(gpu::Column::Idx.eq(gpu_index as i32))
                .exec(&txn)
                .await?;
            if res.rows_affected != 1 {
                return Err(StoreError::NotFound(format!(
                    "GPU {gpu_index} of node {node_id}"
                )));
            }
            outbox::ActiveModel {
                kind: Set("node.mig_relayout_requested".into()),
                subject_kind: Set("node".into()),
                subject_id: Set(node_id.to_string()),
                team_id: Set(None),
                payload: Set(json!({"node": {"id": node_id}, "gpu": gpu_index, "layout": desired})),
                created_at: Set(now),
                ..Default::default()
            }
            .insert(&txn)
            .await?;
            txn.commit().await?;
            Ok(())
        })
        .await
    }

    /// Records a GPU's MIG layout as applied (reported by the node), ending a re-layout.
    pub async fn record_mig_layout(
        &self,
        node_id: NodeId,
        gpu_index: u32,
        layout: Option<&MigLayout>,
    ) -> Result<(), StoreError> {
        self.measured("record_mig_layout", || async {
            let actual = serde_json::to_value(layout.cloned().unwrap_or_default())
                .map_err(|e| StoreError::Conflict(e.to_string()))?;
            gpu::Entity::update_many()
                .col_expr(gpu::Column::MigLayout, Expr::value(actual))
                .col_expr(gpu::Column::MigEnabled, Expr::value(layout.is_some()))
                .col_expr(
                    gpu::Column::DesiredMigLayout,
                    Expr::value(Option::<serde_json::Value>::None),
                )
                .filter(gpu::Column::NodeId.eq(node_id.to_string()))
                .filter(gpu::Column::Idx.eq(gpu_index as i32))
                .exec(&self.write)
                .await?;
            Ok(())
        })
        .await
    }

    /// Moves a node along its lifecycle, with a `node.<state>` outbox event, in one transaction.
    /// Terminating a node revokes its agent credentials in the same transaction.
    pub async fn transition_node(
        &self,
        id: NodeId,
        to: NodeState,
        reason: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.measured("transition_node", || async {
            let txn = self.write.begin().await?;
            let row = node::Entity::find_by_id(id.to_string())
                .one(&txn)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("node {id}")))?;
            let from: NodeState = parse_col("nodes", &row.id, &row.state)?;
            if !from.can_transition_to(to) {
                return Err(StoreError::Conflict(format!("node {id} is {from} and cannot become {to}")));
            }
            let mut upd = node::Entity::update_many()
                .col_expr(node::Column::State, Expr::value(to.to_string()))
                .col_expr(node::Column::StateReason, Expr::value(reason.clone()))
                .col_expr(node::Column::UpdatedAt, Expr::value(now))
                .col_expr(node::Column::Version, Expr::value(row.version + 1))
                .filter(node::Column::Id.eq(row.id.clone()))
                .filter(node::Column::Version.eq(row.version));
            if to == NodeState::Ready {
                upd = upd.col_expr(node::Column::ReadyAt, Expr::value(Some(now)));
            }
            if to == NodeState::Terminated {
                upd = upd.col_expr(node::Column::TerminatedAt, Expr::value(Some(now)));
            }
            if upd.exec(&txn).await?.rows_affected != 1 {
                return Err(StoreError::Conflict(format!("node {id} changed concurrently; retry")));
            }
            if to == NodeState::Terminated {
                // The agent on a terminated node is no one: its credential goes with the node.
                api_token::Entity::update_many()
                    .col_expr(api_token::Column::RevokedAt, Expr::value(Some(now)))
                    .filter(api_token::Column::Role.eq(Role::Agent.as_str()))
                    .filter(api_token::Column::NodeId.eq(row.id.clone()))
                    .filter(api_token::Column::RevokedAt.is_null())
                    .exec(&txn)
                    .await?;
            }
            outbox::ActiveModel {
                kind: Set(format!("node.{to}")),
                subject_kind: Set("node".into()),
                subject_id: Set(id.to_string()),
                team_id: Set(None),
                payload: Set(json!({"node": {"id": id, "state": to, "cloud": row.cloud, "zone": row.zone,
                    "instance_type": row.instance_type, "market": row.market}, "from_state": from, "reason": reason})),
                created_at: Set(now),
                ..Default::default()
            }
            .insert(&txn)
            .await?;
            txn.commit().await?;
            Ok(())
        })
        .await?;
        if to == NodeState::Terminated {
            // Its credential stops working on this replica at once (others: within the TTL).
            self.tokens.clear();
        }
        Ok(())
    }

    /// Jobs holding capacity (admitted, starting, running, draining), with their state and the
    /// nodes of their live allocations.
    pub async fn jobs_with_nodes(
        &self,
    ) -> Result<Vec<(JobId, (JobState, Vec<NodeId>))>, StoreError> {
        self.measured("jobs_with_nodes", || async {
            let holding = [
                JobState::Admitted,
                JobState::Starting,
                JobState::Running,
                JobState::Draining,
            ]
            .map(|s| s.to_string());
            let jobs: Vec<(String, String)> = job::Entity::find()
                .select_only()
                .columns([job::Column::Id, job::Column::State])
                .filter(job::Column::State.is_in(holding))
                .into_tuple()
                .all(&self.read)
                .await?;
            let allocs: Vec<(String, String)> = allocation::Entity::find()
                .select_only()
                .columns([allocation::Column::JobId, allocation::Column::NodeId])
                .filter(allocation::Column::ReleasedAt.is_null())
                .into_tuple()
                .all(&self.read)
                .await?;
            let mut nodes: HashMap<String, Vec<NodeId>> = HashMap::new();
            for (j, n) in allocs {
                let id = parse_col("allocations", &j, &n)?;
                let v = nodes.entry(j).or_default();
                if !v.contains(&id) {
                    v.push(id);
                }
            }
            let mut out = Vec::with_capacity(jobs.len());
            for (id, state) in jobs {
                let st: JobState = parse_col("jobs", &id, &state)?;
                let ns = nodes.remove(&id).unwrap_or_default();
                out.push((parse_col("jobs", &id, &id)?, (st, ns)));
            }
            out.sort_by_key(|(id, _)| *id);
            Ok(out)
        })
        .await
    }

    /// Jobs still holding capacity on a node that is terminated: lost with it.
    pub async fn jobs_on_dead_nodes(&self) -> Result<Vec<(JobId, JobState)>, StoreError> {
        self.measured("jobs_on_dead_nodes", || async {
            let dead: Vec<String> = node::Entity::find()
                .select_only()
                .column(node::Column::Id)
                .filter(node::Column::State.eq(NodeState::Terminated.to_string()))
                .into_tuple()
                .all(&self.read)
                .await?;
            if dead.is_empty() {
                return Ok(Vec::new());
            }
            let mut jobs: Vec<String> = Vec::new();
            for chunk in dead.chunks(500) {
                let rows: Vec<String> = allocation::Entity::find()
                    .select_only()
                    .column(allocation::Column::JobId)
                    .filter(allocation::Column::ReleasedAt.is_null())
                    .filter(allocation::Column::NodeId.is_in(chunk.to_vec()))
                    .into_tuple()
                    .all(&self.read)
                    .await?;
                jobs.extend(rows);
            }
            jobs.sort();
            jobs.dedup();
            let mut out = Vec::new();
            for chunk in jobs.chunks(500) {
                let rows: Vec<(String, String)> = job::Entity::find()
                    .select_only()
                    .columns([job::Column::Id, job::Column::State])
                    .filter(job::Column::Id.is_in(chunk.to_vec()))
                    .into_tuple()
                    .all(&self.read)
                    .await?;
                for (id, st) in rows {
                    out.push((parse_col("jobs", &id, &id)?, parse_col("jobs", &id, &st)?));
                }
            }
            Ok(out)
        })
        .await
    }

    /// Current state reasons of queued jobs, to write only changes.
    pub async fn queued_reasons(&self) -> Result<HashMap<JobId, Option<WaitReason>>, StoreError> {
        self.measured("queued_reasons", || async {
            let rows: Vec<(String, Option<String>)> = job::Entity::find()
                .select_only()
                .columns([job::Column::Id, job::Column::WaitReason])
                .filter(job::Column::State.eq(JobState::Queued.to_string()))
                .into_tuple()
                .all(&self.read)
                .await?;
            rows.into_iter()
                .map(|(id, r)| {
                    let reason = r.map(|r| parse_col("jobs", &id, &r)).transpose()?;
                    Ok((parse_col("jobs", &id, &id)?, reason))
                })
                .collect()
        })
        .await
    }
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}
