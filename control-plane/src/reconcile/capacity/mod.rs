//! The capacity loop, the last step of the scheduling round: prices in, nodes bought and given
//! back, the store and the clouds kept in step. Each round, in this order:
//!
//! 1. **Prices** — every `price_refresh`, each provider's offers are recorded in the store (a
//!    provider that fails keeps its last ones).
//! 2. **Sync** (`sync.rs`) — the store brought in step with each cloud's tagged instances;
//!    orphans swept.
//! 3. **Plan** — the queued jobs whose wait reason is `NoCapacity`, the fleet and its use go to
//!    the pure [`planner::plan`].
//! 4. **Buys** (`provision.rs`) — each buy walked along its fallbacks, reacting to each typed
//!    provider error as [`reaction`] says.
//! 5. **Releases** — idle nodes and nodes that never booted (their offer set aside for
//!    `boot_failure_ttl`).
//! 6. **Consolidation** (`consolidation.rs`) — only while no job waits for capacity.
//! 7. **Exits** — retired nodes and drained ones nothing holds any more are given back.
//!
//! Pool statistics (node-hours and interruptions per pool) and the set-aside offers live in the
//! loop, between rounds; the planner gets them as plain values.

mod consolidation;
mod provision;
mod sync;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use spotplane_core::{JobId, Market, NodeId, NodeState};
use spotplane_providers::registry::Providers;
use spotplane_providers::{CloudProvider, Offer, tags};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
pub use crate::config::CapacitySettings;
use crate::planner::{
    self, Budget, Demand, FleetNode, FleetPhase, PlanInput, PoolStats, ReleaseReason, Unavailable,
};
use crate::reconcile::runner::{ReconcileError, Reconciler, Report};
use crate::scheduler::snapshot::{Assigned, WaitReason};
use crate::store::{SpecCache, Store, StoreError};
pub use provision::{Reaction, node_user_data, reaction};
pub use sync::{SyncAction, SyncRules, diff};

/// The node `n` was bought to replace (its [`tags::REPLACES`] label), if any.
fn replaced_by(n: &crate::model::Node) -> Option<NodeId> {
    n.labels.get(tags::REPLACES).and_then(|id| id.parse().ok())
}

/// Every node state but `terminated`: nodes that hold, or will hold, an instance.
const LIVE: [NodeState; 5] = [
    NodeState::Requested,
    NodeState::Booting,
    NodeState::Ready,
    NodeState::Draining,
    NodeState::Terminating,
];

/// How long a node that just became ready counts as arriving capacity.
const JUST_READY: Duration = Duration::minutes(1);

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CapacityReport {
    pub offers: usize,
    pub demand: usize,
    pub bought: usize,
    /// Provisioning failures by kind.
    pub refused: BTreeMap<&'static str, u64>,
    pub released: usize,
    /// Nodes drained because their work fits on the rest of the fleet.
    pub consolidated: usize,
    pub ready: usize,
    /// Nodes whose instance the cloud took or lost.
    pub vanished: usize,
    /// Instances found for nodes whose buyer stopped before recording them.
    pub adopted: usize,
    pub orphans: usize,
}

impl Report for CapacityReport {
    fn is_quiet(&self) -> bool {
        self.bought
            + self.released
            + self.vanished
            + self.adopted
            + self.orphans
            + self.ready
            + self.consolidated
            == 0
    }

    fn events(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("nodes_bought", self.bought as u64),
            ("nodes_ready", self.ready as u64),
            ("nodes_released", self.released as u64),
            ("nodes_consolidated", self.consolidated as u64),
            ("nodes_vanished", self.vanished as u64),
            ("instances_adopted", self.adopted as u64),
            ("orphans_swept", self.orphans as u64),
            ("buys_refused", self.refused.values().sum()),
        ]
    }
}

#[async_trait]
impl Reconciler for CapacityLoop {
    fn name(&self) -> &'static str {
        "capacity"
    }

    async fn reconcile(
        &mut self,
        now: DateTime<Utc>,
        _cancel: &CancellationToken,
    ) -> Result<Box<dyn Report>, ReconcileError> {
        Ok(Box::new(self.run_at(now).await?))
    }
}

pub struct CapacityLoop {
    store: Store,
    providers: Arc<Providers>,
    clock: SharedClock,
    settings: CapacitySettings,
    cache: SpecCache,
    offers: BTreeMap<usize, Vec<Offer>>,
    polled_at: Option<DateTime<Utc>>,
    pools: PoolStats,
    unavailable: Unavailable,
    idle_since: HashMap<NodeId, DateTime<Utc>>,
    /// Per node, the jobs on it and since when they have been the same (for consolidation).
    node_jobs: HashMap<NodeId, (Vec<JobId>, DateTime<Utc>)>,
    /// Per running job with `work_hours`: when its work left was read, and how much it was.
    remaining: HashMap<JobId, (DateTime<Utc>, f64)>,
    /// Spot nodes whose notice has been counted against their pool.
    noticed: std::collections::HashSet<NodeId>,
    /// Nodes whose instance's launch (`false`) or launch and end (`true`) the store has from
    /// the cloud already, so that the sync writes each once.
    cloud_timed: HashMap<NodeId, bool>,
    last_round: Option<DateTime<Utc>>,
    /// Gangs whose nodes could not all be bought: not bought for again until then (and how
    /// many times in a row it failed).
    gang_backoff: HashMap<JobId, (DateTime<Utc>, u32)>,
}

impl CapacityLoop {
    pub fn new(
        store: Store,
        providers: Arc<Providers>,
        clock: SharedClock,
        settings: CapacitySettings,
    ) -> Self {
        CapacityLoop {
            store,
            providers,
            clock,
            settings,
            cache: SpecCache::default(),
            offers: BTreeMap::new(),
            polled_at: None,
            pools: PoolStats::default(),
            unavailable: Unavailable::default(),
            idle_since: HashMap::new(),
            node_jobs: HashMap::new(),
            remaining: HashMap::new(),
            noticed: std::collections::HashSet::new(),
            cloud_timed: HashMap::new(),
            last_round: None,
            gang_backoff: HashMap::new(),
        }
    }

    /// Every team's monthly budget with what it has spent this month, for the planner.
    async fn budgets(
        &self,
        now: DateTime<Utc>,
    ) -> Result<BTreeMap<spotplane_core::TeamName, Budget>, StoreError> {
        let budgets = self.store.team_budgets().await?;
        if budgets.is_empty() {
            return Ok(BTreeMap::new());
        }
        let spent = self
            .store
            .team_spend_since(crate::finance::month_start(now))
            .await?;
        Ok(budgets
            .into_iter()
            .map(|b| {
                let budget = Budget {
                    hourly: None,
                    monthly: Some(b.monthly),
                    month_to_date: spent.get(&b.team_id).copied().unwrap_or_default(),
                };
                (b.team, budget)
            })
            .collect())
    }

    /// The pools' observed statistics.
    pub fn pools(&self) -> &PoolStats {
        &self.pools
    }

    fn provider_for(&self, offer: &Offer) -> Option<(usize, &Arc<dyn CloudProvider>)> {
        self.providers
            .all
            .iter()
            .enumerate()
            .find(|(_, p)| p.cloud() == offer.cloud)
    }

    /// One round at the clock's time.
    pub async fn run_once(&mut self) -> Result<CapacityReport, ReconcileError> {
        let now = self.clock.now();
        Ok(self.run_at(now).await?)
    }

    /// One round at `now`.
    pub async fn run_at(&mut self, now: DateTime<Utc>) -> Result<CapacityReport, StoreError> {
        let mut report = CapacityReport::default();
        self.unavailable.expire(now);
        self.poll(now).await?;
        let offers: Vec<Offer> = self.offers.values().flatten().cloned().collect();
        report.offers = offers.len();

        self.sync(now, &mut report).await?;

        let snap = self.store.scheduler_snapshot(&mut self.cache).await?;
        let reasons = self.store.queued_reasons().await?;
        // An elastic gang's missing replicas (its job is running, so it has no wait reason)
        // are demand too: the scheduler places them on free capacity before any bought arrives.
        let refills: std::collections::HashSet<JobId> = snap.running.iter().map(|r| r.id).collect();
        // Only models the team's quota lets it use are bought for (a T4 is no use to a team
        // whose quota is H100s).
        let mut quota_models = crate::scheduler::quota_models_of_queued(&snap);
        if !self.gang_backoff.is_empty() {
            let queued: std::collections::HashSet<JobId> =
                snap.queued.iter().map(|q| q.id).collect();
            self.gang_backoff.retain(|job, _| queued.contains(job));
        }
        let demand: Vec<Demand> = snap
            .queued
            .iter()
            .filter(|q| {
                refills.contains(&q.id)
                    || reasons
                        .get(&q.id)
                        .is_some_and(|r| *r == Some(WaitReason::NoCapacity))
            })
            .filter(|q| {
                self.gang_backoff
                    .get(&q.id)
                    .is_none_or(|(until, _)| now >= *until)
            })
            .map(|q| {
                let spec = self.cache.get(q.id);
                Demand {
                    job: q.id,
                    team: q.team.clone(),
                    priority: q.priority,
                    replicas: q.replicas,
                    shape: q.shape.clone(),
                    clouds: q.clouds.clone(),
                    regions: q.regions.clone(),
                    spot: q.spot,
                    max_hourly: spec.and_then(|s| s.max_hourly_usd),
                    deadline: spec.and_then(|s| s.deadline),
                    remaining_hours: spec.and_then(|s| s.work_hours),
                    checkpoint_hours: spec
                        .and_then(|s| s.checkpoint.as_ref())
                        .map(|c| f64::from(c.interval_s) / 3600.0),
                    restart_hours: None,
                    location: None,
                    migrate_hours: None,
                    models: quota_models.remove(&q.id),
                }
            })
            .collect();
        let mut demand = demand;
        // Work left, for the deadline rule: what the job has run so far comes off its estimate.
        for d in &mut demand {
            if let (Some(work), Some(_)) = (d.remaining_hours, d.deadline) {
                let ran = self.progress_hours(d.job, d.checkpoint_hours, now).await?;
                d.remaining_hours = Some((work - ran).max(0.0));
                // Where its checkpoint is, and how long moving it takes: stay, move or
                // on-demand is the planner's deadline model's choice. A job that has not run
                // has none.
                if ran <= 0.0 {
                    continue;
                }
                if let Some((region, bytes)) = self.store.checkpoint_location(d.job).await? {
                    d.location = Some(region);
                    d.migrate_hours = bytes.map(|b| {
                        crate::planner::deadline::migrate_hours(
                            b,
                            self.settings.planner.default_migrate_hours,
                        )
                    });
                }
            }
        }
        report.demand = demand.len();

        // GPUs in use per node, from the placements of the jobs holding capacity.
        let mut used: HashMap<NodeId, std::collections::HashSet<u32>> = HashMap::new();
        for r in &snap.running {
            for p in &r.placements {
                let gpus = used.entry(p.node).or_default();
                match &p.assigned {
                    Assigned::CpuOnly => {}
                    Assigned::Whole(g) => gpus.extend(g.iter().copied()),
                    Assigned::Share { gpu, .. } | Assigned::Mig { gpu, .. } => {
                        gpus.insert(*gpu);
                    }
                }
            }
        }
        let hours = self.last_round.map_or(0.0, |t| {
            (now - t).num_milliseconds().max(0) as f64 / 3_600_000.0
        });
        self.last_round = Some(now);
        let nodes = self.store.list_nodes(&LIVE).await?;
        let mut fleet = Vec::with_capacity(nodes.len());
        for n in &nodes {
            let gpu_count = u32::try_from(n.gpus.len()).unwrap_or(u32::MAX);
            let in_use = used.get(&n.id).map_or(0, |g| g.len());
            let free = gpu_count.saturating_sub(u32::try_from(in_use).unwrap_or(u32::MAX));
            let phase = match n.state {
                NodeState::Requested | NodeState::Booting => FleetPhase::Booting {
                    since: n.created_at,
                },
                // Ready so recently that the scheduler has not placed anything on it yet: still
                // arriving capacity, so the demand it came for is not bought twice.
                NodeState::Ready
                    if n.ready_at.is_some_and(|t| now - t < JUST_READY) && in_use == 0 =>
                {
                    FleetPhase::Booting {
                        since: n.ready_at.unwrap_or(now),
                    }
                }
                NodeState::Ready => FleetPhase::Ready,
                _ => FleetPhase::Leaving,
            };
            // A replacement waits, empty, for the node it replaces to drain: not idle while
            // that node lives.
            let awaited = replaced_by(n).is_some_and(|old| nodes.iter().any(|m| m.id == old));
            let idle =
                phase == FleetPhase::Ready && in_use == 0 && !used.contains_key(&n.id) && !awaited;
            let idle_since = if idle {
                Some(*self.idle_since.entry(n.id).or_insert(now))
            } else {
                self.idle_since.remove(&n.id);
                None
            };
            if phase == FleetPhase::Ready
                && n.market == Market::Spot
                && let Some(o) = &n.offer_id
            {
                self.pools.exposed(o, hours);
            }
            fleet.push(FleetNode {
                id: n.id,
                offer_id: n.offer_id.clone().unwrap_or_default(),
                cloud: n.cloud,
                zone: n.zone.clone(),
                market: n.market,
                price: n.hourly_price,
                team: n.labels.get(tags::TEAM).and_then(|t| t.parse().ok()),
                phase,
                free_gpus: free,
                gpu_count,
                idle_since,
            });
        }

        let demand_waits = !demand.is_empty();
        let input = PlanInput {
            offers,
            demand,
            fleet,
            pools: self.pools.clone(),
            unavailable: self.unavailable.clone(),
            budgets: self.budgets(now).await?,
        };
        let plan = planner::plan(now, &input, &self.settings.planner);

        self.provision(&plan.buys, now, &mut report).await?;

        for r in &plan.releases {
            let Some(node) = nodes.iter().find(|n| n.id == r.node) else {
                continue;
            };
            if r.reason == ReleaseReason::BootTimeout
                && let Some(o) = &node.offer_id
            {
                self.unavailable
                    .mark(o, now, self.settings.boot_failure_ttl);
            }
            let reason = match r.reason {
                ReleaseReason::Idle => "idle",
                ReleaseReason::BootTimeout => "never became ready",
            };
            if self.release(node, reason, now).await? {
                self.idle_since.remove(&node.id);
                report.released += 1;
            }
        }
        self.track_node_jobs(&snap, now);
        let leave_alone = self.finish_replacements(&nodes, now, &mut report).await?;
        if !demand_waits {
            self.consolidate(&snap, &nodes, &leave_alone, now, &mut report)
                .await?;
        }
        // A spot node with a notice: its pool is interrupting now; set it aside for a while
        // (SkyPilot's EAGER_NEXT_REGION, Karpenter's unavailable offerings) so the work it
        // held is placed elsewhere. (A node drained for consolidation has no notice.)
        for node in &nodes {
            if node.state == NodeState::Draining
                && node.notice_deadline.is_some()
                && node.market == Market::Spot
                && self.noticed.insert(node.id)
                && let Some(o) = &node.offer_id
            {
                self.pools.interrupted(o);
                self.unavailable
                    .mark(o, now, self.settings.capacity_error_ttl);
            }
        }
        // Nodes on their way out: retired ones (their agent went silent) are given back now;
        // draining ones as soon as no job holds them (no need to pay until the cloud takes them).
        for node in &nodes {
            let reason = match node.state {
                NodeState::Terminating => "retired",
                NodeState::Draining if !used.contains_key(&node.id) => "drained",
                _ => continue,
            };
            if self.release(node, reason, now).await? {
                self.idle_since.remove(&node.id);
                report.released += 1;
            }
        }
        Ok(report)
    }

    async fn poll(&mut self, now: DateTime<Utc>) -> Result<(), StoreError> {
        if self
            .polled_at
            .is_some_and(|t| now - t < self.settings.price_refresh)
        {
            return Ok(());
        }
        self.polled_at = Some(now);
        for (i, p) in self.providers.all.iter().enumerate() {
            match p.list_offers().await {
                Ok(offers) => {
                    self.store.upsert_offers(&offers, now).await?;
                    self.offers.insert(i, offers);
                }
                Err(e) => {
                    tracing::warn!(cloud = %p.cloud(), error = %e, "offers unavailable; keeping the last ones");
                }
            }
        }
        Ok(())
    }
}
