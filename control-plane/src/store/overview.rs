//! What the live page shows: every live allocation with its job, the newest jobs and events,
//! and job counts by state.

use std::collections::BTreeMap;

use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::Serialize;
use spotplane_core::mig::MigInstance;

use super::entity::{allocation, job, outbox};
use super::outbox::OutboxEvent;
use super::{Store, StoreError, from_json};

/// One replica's place on a node.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PlacedReplica {
    pub job_id: String,
    pub job_name: String,
    pub replica: u32,
    pub node_id: String,
    /// GPU indices: the whole GPUs, or the one GPU of a share or MIG slice.
    pub gpus: Vec<u32>,
    /// Thousandths of the GPU, for a share.
    pub gpu_milli: Option<u32>,
    #[schema(value_type = Option<Object>)]
    pub mig: Option<MigInstance>,
    /// As the agent last reported it.
    pub phase: Option<String>,
}

/// A job as the page lists it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct JobLine {
    pub id: String,
    pub name: String,
    pub team_id: String,
    pub state: String,
    pub state_reason: Option<String>,
    pub attempt: u32,
    pub lost_gpu_seconds: i64,
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// Its GPUs' utilisation over the run so far, once there are readings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<crate::model::JobUtilization>,
}

impl Store {
    /// Every live allocation, with its job's name.
    pub async fn placed_replicas(&self) -> Result<Vec<PlacedReplica>, StoreError> {
        self.measured("placed_replicas", || async {
            let allocs = allocation::Entity::find()
                .filter(allocation::Column::ReleasedAt.is_null())
                .all(&self.read)
                .await?;
            let ids: Vec<String> = allocs.iter().map(|a| a.job_id.clone()).collect();
            let mut names: BTreeMap<String, String> = BTreeMap::new();
            for chunk in ids.chunks(500) {
                let rows: Vec<(String, String)> = job::Entity::find()
                    .select_only()
                    .columns([job::Column::Id, job::Column::Name])
                    .filter(job::Column::Id.is_in(chunk.to_vec()))
                    .into_tuple()
                    .all(&self.read)
                    .await?;
                names.extend(rows);
            }
            let mut out = Vec::with_capacity(allocs.len());
            for a in allocs {
                let gpus: Vec<u32> = from_json("allocations", &a.id, a.gpu_indices.clone())?;
                let mig: Option<MigInstance> = match &a.mig {
                    Some(v) => Some(from_json("allocations", &a.id, v.clone())?),
                    None => None,
                };
                let share = (mig.is_none() && gpus.len() == 1 && a.gpu_milli < 1000)
                    .then(|| u32::try_from(a.gpu_milli).unwrap_or(0));
                out.push(PlacedReplica {
                    job_name: names.get(&a.job_id).cloned().unwrap_or_default(),
                    job_id: a.job_id,
                    replica: u32::try_from(a.replica).unwrap_or(0),
                    node_id: a.node_id,
                    gpus,
                    gpu_milli: share,
                    mig,
                    phase: a.phase,
                });
            }
            Ok(out)
        })
        .await
    }

    /// The `limit` most recently changed jobs, and how many jobs are in each state.
    pub async fn job_overview(
        &self,
        limit: u64,
    ) -> Result<(Vec<JobLine>, BTreeMap<String, u64>), StoreError> {
        self.measured("job_overview", || async {
            let rows = job::Entity::find()
                .order_by_desc(job::Column::UpdatedAt)
                .limit(limit)
                .all(&self.read)
                .await?;
            let ids: Vec<spotplane_core::JobId> =
                rows.iter().filter_map(|r| r.id.parse().ok()).collect();
            let mut util = self.job_utilisation(&ids).await?;
            let lines = rows
                .into_iter()
                .map(|r| JobLine {
                    utilization: r.id.parse().ok().and_then(|id| util.remove(&id)),
                    id: r.id,
                    name: r.name,
                    team_id: r.team_id,
                    state: r.state,
                    state_reason: r.state_reason,
                    attempt: u32::try_from(r.attempt).unwrap_or(0),
                    lost_gpu_seconds: r.lost_gpu_seconds,
                    updated_at: r.updated_at,
                })
                .collect();
            let counts: Vec<(String, i64)> = job::Entity::find()
                .select_only()
                .column(job::Column::State)
                .column_as(job::Column::Id.count(), "n")
                .group_by(job::Column::State)
                .into_tuple()
                .all(&self.read)
                .await?;
            Ok((
                lines,
                counts
                    .into_iter()
                    .map(|(s, n)| (s, u64::try_from(n).unwrap_or(0)))
                    .collect(),
            ))
        })
        .await
    }

    /// The newest `limit` outbox events, newest first.
    pub async fn recent_events(&self, limit: u64) -> Result<Vec<OutboxEvent>, StoreError> {
        self.measured("recent_events", || async {
            let rows = outbox::Entity::find()
                .order_by_desc(outbox::Column::Id)
                .limit(limit)
                .all(&self.read)
                .await?;
            Ok(rows.into_iter().map(OutboxEvent::from).collect())
        })
        .await
    }
}
