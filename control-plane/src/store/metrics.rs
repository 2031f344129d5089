//! What `/metrics` reads from the store at each scrape, beyond the scheduler's snapshot: when
//! each queued job entered the queue, work lost per team, the webhook and ledger backlogs, and
//! each node's last GPU telemetry with the jobs holding its devices.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};
use spotplane_core::agent::{GpuInfo, GpuTelemetry};
use spotplane_core::{GpuModel, JobId, JobState, NodeState};

use super::entity::{allocation, gpu, job, ledger_progress, node, node_agent, webhook_delivery};
use super::{Store, StoreError, from_json, parse_col};
use crate::metrics::dcgm::Held;

/// A job holding a device of a node.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    pub job_id: String,
    pub job_name: String,
    pub team: String,
    pub held: Held,
}

/// A live node's last GPU telemetry and who holds its devices.
#[derive(Debug, Clone)]
pub struct NodeTelemetry {
    pub node_id: String,
    /// The agent's hostname (dcgm-exporter's `Hostname`).
    pub hostname: String,
    pub model: Option<GpuModel>,
    pub inventory: Vec<GpuInfo>,
    pub rows: Vec<GpuTelemetry>,
    pub holders: Vec<Holder>,
}

/// The scrape's store figures besides the snapshot.
#[derive(Debug, Clone, Default)]
pub struct MetricsView {
    /// When each queued job last entered the queue (its last change: submission or requeue).
    pub queued_since: HashMap<JobId, DateTime<Utc>>,
    /// GPU-seconds of work lost over the jobs' lives, by team name.
    pub lost_gpu_seconds: HashMap<String, i64>,
    /// Webhook deliveries waiting to go out, and when the oldest was made.
    pub webhooks_pending: u64,
    pub oldest_pending_delivery: Option<DateTime<Utc>>,
    /// The earliest time the ledger has billed an open node up to.
    pub ledger_until: Option<DateTime<Utc>>,
    pub telemetry: Vec<NodeTelemetry>,
}

/// The devices an allocation holds.
pub(crate) fn held_of(a: &allocation::Model) -> Result<Held, StoreError> {
    Ok(Held {
        gpus: from_json("allocations", &a.id, a.gpu_indices.clone())?,
        mig: a
            .mig
            .clone()
            .map(|m| from_json("allocations", &a.id, m))
            .transpose()?,
    })
}

impl Store {
    pub async fn metrics_view(&self) -> Result<MetricsView, StoreError> {
        self.measured("metrics_view", || async {
            let teams = super::teams::team_names(&self.read).await?;
            let mut view = MetricsView::default();
            let queued: Vec<(String, DateTime<Utc>)> = job::Entity::find()
                .select_only()
                .columns([job::Column::Id, job::Column::UpdatedAt])
                .filter(job::Column::State.eq(JobState::Queued.to_string()))
                .into_tuple()
                .all(&self.read)
                .await?;
            for (id, at) in queued {
                view.queued_since.insert(parse_col("jobs", &id, &id)?, at);
            }
            let lost: Vec<(String, i64)> = job::Entity::find()
                .select_only()
                .columns([job::Column::TeamId, job::Column::LostGpuSeconds])
                .filter(job::Column::LostGpuSeconds.gt(0))
                .into_tuple()
                .all(&self.read)
                .await?;
            for name in teams.values() {
                view.lost_gpu_seconds.insert(name.clone(), 0);
            }
            for (team_id, s) in lost {
                if let Some(name) = teams.get(&team_id) {
                    *view.lost_gpu_seconds.entry(name.clone()).or_default() += s;
                }
            }
            let pending: Vec<DateTime<Utc>> = webhook_delivery::Entity::find()
                .select_only()
                .column(webhook_delivery::Column::CreatedAt)
                .filter(webhook_delivery::Column::State.eq("pending"))
                .into_tuple()
                .all(&self.read)
                .await?;
            view.webhooks_pending = pending.len() as u64;
            view.oldest_pending_delivery = pending.into_iter().min();
            view.ledger_until = ledger_progress::Entity::find()
                .select_only()
                .column(ledger_progress::Column::Until)
                .filter(ledger_progress::Column::Closed.eq(false))
                .into_tuple::<DateTime<Utc>>()
                .all(&self.read)
                .await?
                .into_iter()
                .min();
            view.telemetry = self.node_telemetry(&teams).await?;
            Ok(view)
        })
        .await
    }

    async fn node_telemetry(
        &self,
        teams: &HashMap<String, String>,
    ) -> Result<Vec<NodeTelemetry>, StoreError> {
        let live: Vec<String> = node::Entity::find()
            .select_only()
            .column(node::Column::Id)
            .filter(
                node::Column::State
                    .is_in([NodeState::Ready, NodeState::Draining].map(|s| s.as_str().to_owned())),
            )
            .into_tuple()
            .all(&self.read)
            .await?;
        if live.is_empty() {
            return Ok(Vec::new());
        }
        let mut models: HashMap<String, GpuModel> = HashMap::new();
        for (node_id, model) in gpu::Entity::find()
            .select_only()
            .columns([gpu::Column::NodeId, gpu::Column::Model])
            .filter(gpu::Column::NodeId.is_in(live.clone()))
            .into_tuple::<(String, String)>()
            .all(&self.read)
            .await?
        {
            if let Ok(m) = model.parse() {
                models.insert(node_id, m);
            }
        }
        let allocations = allocation::Entity::find()
            .filter(allocation::Column::NodeId.is_in(live.clone()))
            .filter(allocation::Column::ReleasedAt.is_null())
            .all(&self.read)
            .await?;
        let job_ids: Vec<String> = allocations.iter().map(|a| a.job_id.clone()).collect();
        let mut jobs: HashMap<String, (String, String)> = HashMap::new();
        for chunk in job_ids.chunks(500) {
            for (id, name, team_id) in job::Entity::find()
                .select_only()
                .columns([job::Column::Id, job::Column::Name, job::Column::TeamId])
                .filter(job::Column::Id.is_in(chunk.to_vec()))
                .into_tuple::<(String, String, String)>()
                .all(&self.read)
                .await?
            {
                let team = teams.get(&team_id).cloned().unwrap_or(team_id);
                jobs.insert(id, (name, team));
            }
        }
        let mut holders: HashMap<String, Vec<Holder>> = HashMap::new();
        for a in allocations {
            let held = held_of(&a)?;
            if held.gpus.is_empty() {
                continue;
            }
            let (job_name, team) = jobs.get(&a.job_id).cloned().unwrap_or_default();
            holders.entry(a.node_id.clone()).or_default().push(Holder {
                job_id: a.job_id,
                job_name,
                team,
                held,
            });
        }
        let agents = node_agent::Entity::find()
            .filter(node_agent::Column::NodeId.is_in(live))
            .all(&self.read)
            .await?;
        let mut out = Vec::with_capacity(agents.len());
        for a in agents {
            // One agent's unreadable report costs its own series, not the scrape.
            let rows: Vec<GpuTelemetry> = match serde_json::from_value(a.telemetry) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(node = %a.node_id, error = %e, "node_agents.telemetry does not parse; its GPU series are left out");
                    continue;
                }
            };
            if rows.is_empty() {
                continue;
            }
            let inventory = serde_json::from_value(a.inventory).unwrap_or_default();
            out.push(NodeTelemetry {
                model: models.get(&a.node_id).copied(),
                holders: holders.remove(&a.node_id).unwrap_or_default(),
                node_id: a.node_id,
                hostname: a.hostname,
                inventory,
                rows,
            });
        }
        Ok(out)
    }
}
