//! The control plane's records, as the store returns them and the API shows them.
//!
//! These are read models: built from rows by the store, serialized by the API. Requests that
//! change them are in [`crate::api`]; the vocabulary they are made of is in `spotplane-core`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use spotplane_core::Micros;
use spotplane_core::job::JobSpec;
use spotplane_core::team::{Quota, QuotaResource};
use spotplane_core::{
    Cloud, GpuModel, JobId, JobState, Market, MigLayout, NodeId, NodeState, TeamName, TokenId,
};
use utoipa::ToSchema;

/// A team sharing the cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Team {
    /// Internal id; the API addresses teams by name.
    #[serde(skip)]
    pub id: String,
    pub name: TeamName,
    /// Fair-share weight (default 1).
    pub weight: f64,
    /// The cohort whose members lend each other idle quota.
    pub cohort: Option<String>,
    /// Quotas per GPU model (`H100-80GB`) or MIG profile (`mig-3g.40gb`).
    #[schema(value_type = BTreeMap<String, Quota>)]
    pub quotas: BTreeMap<QuotaResource, Quota>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Who a token speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything.
    Admin,
    /// One team's jobs.
    Team,
    /// Read-only: teams, nodes, offers and cost exports.
    Finance,
    /// One node's agent.
    Agent,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Admin, Role::Team, Role::Finance, Role::Agent];

    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Team => "team",
            Role::Finance => "finance",
            Role::Agent => "agent",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// An API token as listed: never the secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Token {
    pub id: TokenId,
    pub name: String,
    pub role: Role,
    /// The team of a `team` token.
    pub team: Option<TeamName>,
    /// The node of an `agent` token.
    pub node_id: Option<NodeId>,
    /// The first characters of the secret, to tell tokens apart.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A job, as submitted plus what has happened to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Job {
    pub id: JobId,
    pub team: TeamName,
    pub state: JobState,
    /// Why the job is in its state, when there is something to say.
    pub state_reason: Option<String>,
    /// How many times the job has been placed (0 until it first is); a run that resumes after
    /// a preemption is a new attempt.
    pub attempt: u32,
    /// Per replica, the durable checkpoint the next attempt restores (set when it is requeued).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub resume_from: std::collections::BTreeMap<u32, crate::recovery::ResumePoint>,
    /// GPU-seconds of work lost over the job's life: runs that ended without a durable
    /// checkpoint, counted from their resume point.
    #[serde(default)]
    pub lost_gpu_seconds: i64,
    /// Failures other than preemptions so far.
    #[serde(default)]
    pub failures: u32,
    /// A requeued job waits for its back-off until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    /// What its GPUs did over the run so far, from its nodes' telemetry; absent before the
    /// first reading (and for a job without GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<JobUtilization>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The submitted specification (its `team` is the job's team).
    #[serde(flatten)]
    pub spec: JobSpec,
}

/// A job's GPU utilisation over its run, every attempt and replica together: the means of
/// its nodes' heartbeat readings of the devices it held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobUtilization {
    /// Mean SM utilisation, percent (`DCGM_FI_DEV_GPU_UTIL`, or for a MIG slice
    /// `DCGM_FI_PROF_GR_ENGINE_ACTIVE` as a percentage), per replica reading.
    pub sm_pct_mean: f64,
    /// Mean GPU memory used by a replica, MiB (a shared GPU's whole figure).
    pub memory_used_mib_mean: f64,
    /// The most GPU memory a replica used, MiB.
    pub memory_used_mib_max: u64,
    /// How many replica readings the means are over.
    pub samples: u64,
}

/// One entry of a job's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobEvent {
    /// Position in the history; later events have larger numbers.
    pub seq: i64,
    pub at: DateTime<Utc>,
    /// `job.<state>` for a state change, e.g. `job.queued`.
    #[serde(rename = "type")]
    pub kind: String,
    pub from_state: Option<JobState>,
    pub to_state: Option<JobState>,
    pub reason: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub data: Option<serde_json::Value>,
}

/// One GPU of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Gpu {
    pub index: u32,
    pub model: GpuModel,
    pub memory_mib: u64,
    pub mig_enabled: bool,
    /// MIG instances, by class and start slice; empty when MIG is off.
    #[schema(value_type = Vec<spotplane_core::MigInstance>)]
    pub mig_layout: MigLayout,
}

/// A cloud instance spotplane bought.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Node {
    pub id: NodeId,
    pub name: String,
    pub cloud: Cloud,
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub market: Market,
    pub state: NodeState,
    pub state_reason: Option<String>,
    pub provider_instance_id: Option<String>,
    /// The offer it was bought from (`cloud/region/zone/type/market`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offer_id: Option<String>,
    /// The price in force per hour (`hourly_price_usd` in the API: US dollars per hour).
    #[serde(rename = "hourly_price_usd", with = "spotplane_core::money::usd")]
    #[schema(value_type = f64)]
    pub hourly_price: Micros,
    /// The on-demand price of the same capacity per hour (`on_demand_price_usd`).
    #[serde(rename = "on_demand_price_usd", with = "spotplane_core::money::usd")]
    #[schema(value_type = f64)]
    pub on_demand_price: Micros,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: Vec<Gpu>,
    pub labels: BTreeMap<String, String>,
    /// When the cloud will take the node, once it has said so.
    pub notice_deadline: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub ready_at: Option<DateTime<Utc>>,
    pub terminated_at: Option<DateTime<Utc>>,
}

/// Capacity a cloud offers, with its price and risk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Offer {
    pub id: String,
    pub cloud: Cloud,
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub market: Market,
    pub gpu_model: Option<GpuModel>,
    pub gpu_count: u32,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// Current price, US dollars per hour.
    pub price_usd: f64,
    pub on_demand_price_usd: f64,
    /// AWS spot placement score (1–3, higher is likelier to be fulfilled), where known.
    pub placement_score: Option<f64>,
    /// Interruption-frequency bucket, e.g. `<5%`, where known.
    pub interruption_bucket: Option<String>,
    pub observed_at: DateTime<Utc>,
    /// Set after a capacity error: the offer is skipped until then.
    pub unavailable_until: Option<DateTime<Utc>>,
}

/// One page of a list, in the list's order (newest first unless its endpoint says otherwise).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Page sizes of every list.
pub const DEFAULT_PAGE_LIMIT: u64 = 50;
pub const MAX_PAGE_LIMIT: u64 = spotplane_core::limits::PAGE_SIZE.max;

/// The page a list request asks for: the items after `after` (the key of the last item of the
/// page before, which is what `next_cursor` holds), at most `limit` of them.
#[derive(Debug, Clone, PartialEq)]
pub struct PageRequest<K> {
    pub after: Option<K>,
    /// 1 to [`MAX_PAGE_LIMIT`].
    pub limit: u64,
}

impl<K> PageRequest<K> {
    /// The first page.
    pub fn first(limit: u64) -> Self {
        PageRequest { after: None, limit }
    }

    /// Rows to read: one more than the page holds, to learn whether another page follows.
    pub fn rows_to_read(&self) -> u64 {
        self.limit.saturating_add(1)
    }

    /// Cuts `rows` (read with [`PageRequest::rows_to_read`], in the list's order) to the page,
    /// and gives the cursor of the next page, `key` of the page's last row, when rows are left.
    pub fn cut<R>(&self, mut rows: Vec<R>, key: impl Fn(&R) -> String) -> (Vec<R>, Option<String>) {
        let limit = usize::try_from(self.limit).unwrap_or(usize::MAX);
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next = if more { rows.last().map(key) } else { None };
        (rows, next)
    }
}

/// A webhook subscription, as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Subscription {
    pub id: String,
    pub team: TeamName,
    pub url: String,
    /// The event types delivered (`job.succeeded`, `node.notice`, `budget.alert`, ...).
    pub event_types: Vec<String>,
    pub description: Option<String>,
    /// Disabled ones receive nothing until enabled again; their pending deliveries wait.
    pub enabled: bool,
    /// Why it was disabled, when spotplane disabled it.
    pub disabled_reason: Option<String>,
    /// Since when every attempt has failed, while it does.
    pub failing_since: Option<DateTime<Utc>>,
    /// Until when the secret replaced by the last rotation still signs (both are sent).
    pub previous_secret_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One event's delivery to one subscription: the delivery log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Delivery {
    /// Also the `webhook-id` header: the same on every attempt.
    pub id: String,
    /// The outbox event delivered.
    pub event_id: i64,
    pub event_type: Option<String>,
    /// `pending` (due at `next_attempt_at`), `delivered`, or `failed` (given up).
    pub state: String,
    pub attempts: u32,
    /// The HTTP status of the last attempt, if an answer came.
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    /// How long the last attempt took.
    pub latency_ms: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub delivered_at: Option<DateTime<Utc>>,
}

/// A team secret as the API shows it: its name and when it was set, never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Secret {
    /// How jobs refer to it (`"secrets": {"HF_TOKEN": "<name>"}`, `image_pull_secret`).
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// When its value was last set.
    pub updated_at: DateTime<Utc>,
}
