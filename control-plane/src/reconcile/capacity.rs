//! The capacity loop: prices in, nodes bought and given back, the store and the clouds kept in
//! step. Each round:
//!
//! 1. **Price poller** — every `price_refresh`, each provider's offers (a provider that fails
//!    keeps its last ones) are recorded in the store.
//! 2. **Planner** — the queued jobs the scheduler could not place for want of capacity, the
//!    fleet and its use go to the pure [`planner::plan`].
//! 3. **Provisioner** — each buy is a node row (`requested`, idempotency token = the node id)
//!    and one `provision` call per node, walking the buy's fallback chain on typed errors:
//!    insufficient capacity sets the offer aside for `capacity_error_ttl` and tries the next;
//!    price-too-low does the same; quota or auth stops buying on that cloud this round;
//!    throttling and transient errors leave the rest for the next round.
//! 4. **Releases** — idle nodes and nodes that never booted are terminated (the latter's offer
//!    set aside for `boot_failure_ttl`).
//! 5. **Consolidation** — when no job waits for capacity, a node whose work fits on the rest of
//!    the fleet, and for which giving it back saves more than moving the work costs, is drained
//!    ([`planner::consolidate`]): its jobs checkpoint and requeue, the scheduler places them
//!    elsewhere, and the node is given back once nothing holds it.
//! 6. **Sync and orphan sweeper** — each provider's instances carrying the cluster tag: a node
//!    whose instance is gone is marked terminated (a spot node gone unasked counts as an
//!    interruption of its pool); an instance no node row knows, older than `orphan_grace`, is
//!    terminated. Simulated nodes have no agent of their own: they count as ready once
//!    running (`ready_on_running`).
//!
//! Pool statistics (node-hours and interruptions per pool) and the set-aside offers live in the
//! loop, between rounds; the planner gets them as plain values.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use spotplane_core::{JobId, Market, NodeId, NodeState};
use spotplane_providers::registry::Providers;
use spotplane_providers::{
    CloudProvider, InstanceState, Offer, ProviderError, ProvisionRequest, tags,
};

use crate::clock::SharedClock;
use crate::planner::{
    self, Budget, ConsolidationSettings, Demand, FleetNode, FleetPhase, MovableJob, NodeCost,
    PlanInput, PlannerSettings, PoolStats, ReleaseReason, Unavailable,
};
use crate::scheduler::snapshot::{Assigned, WaitReason};
use crate::store::{NewGpu, NewNode, wait_text};
use crate::store::{SpecCache, Store, StoreError};

/// Every node state but `terminated`: nodes that hold, or will hold, an instance.
const LIVE: [NodeState; 5] = [
    NodeState::Requested,
    NodeState::Booting,
    NodeState::Ready,
    NodeState::Draining,
    NodeState::Terminating,
];

/// How long a running job's work left, read from its history, is aged with the clock before it
/// is read again (consolidation).
const REMAINING_REFRESH: Duration = Duration::minutes(30);

/// Job histories consolidation reads in one round at most.
const REMAINING_QUERIES: usize = 256;

/// How long a node that just became ready counts as arriving capacity.
const JUST_READY: Duration = Duration::minutes(1);

/// How the capacity loop behaves.
#[derive(Debug, Clone)]
pub struct CapacitySettings {
    /// Tag value every instance of this control plane carries (`spotplane-cluster`).
    pub cluster: String,
    pub price_refresh: Duration,
    /// How long an offer that failed for capacity or price is set aside.
    pub capacity_error_ttl: Duration,
    /// How long the offer of a node that never booted is set aside.
    pub boot_failure_ttl: Duration,
    /// An instance with the cluster tag that no node knows is terminated after this long.
    pub orphan_grace: Duration,
    /// Simulated clouds' nodes run no agent: they count as ready once running.
    pub ready_on_running: bool,
    /// The node boot script (installs and starts the agent) put after the bootstrap token in
    /// the user data of every node bought from a real cloud (docs/deploy.md).
    pub node_boot_script: Option<String>,
    pub planner: PlannerSettings,
    pub consolidation: ConsolidationSettings,
}

impl Default for CapacitySettings {
    fn default() -> Self {
        CapacitySettings {
            cluster: "spotplane".into(),
            price_refresh: Duration::minutes(5),
            capacity_error_ttl: Duration::minutes(3),
            boot_failure_ttl: Duration::minutes(10),
            orphan_grace: Duration::minutes(10),
            ready_on_running: true,
            node_boot_script: None,
            planner: PlannerSettings::default(),
            consolidation: ConsolidationSettings::default(),
        }
    }
}

/// A node's user data: a first part that writes its bootstrap token to
/// `/etc/spotplane/bootstrap-token` (root only), then the boot script (without its `#!` line),
/// which installs and starts the agent. Without a boot script the node's image is expected to
/// start the agent once the token file is there.
pub fn node_user_data(token: &str, boot_script: Option<&str>) -> String {
    let mut out = String::from(
        "#!/bin/sh\n# spotplane: this node's bootstrap token (this node only, used once)\n\
         umask 077\nmkdir -p /etc/spotplane\n",
    );
    // The token is `spb_<hex>_<base64url>`: nothing the shell would interpret in single quotes.
    out.push_str(&format!(
        "printf '%s\\n' '{}' > /etc/spotplane/bootstrap-token\n",
        token.replace('\'', "")
    ));
    if let Some(script) = boot_script {
        let body = match script.strip_prefix("#!") {
            Some(rest) => rest.split_once('\n').map_or("", |(_, b)| b),
            None => script,
        };
        out.push_str(body);
    }
    out
}

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
    pub orphans: usize,
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
    last_round: Option<DateTime<Utc>>,
    /// Gangs whose nodes could not all be bought: not bought for again until then (and how
    /// many times in a row it failed).
    gang_backoff: HashMap<JobId, (DateTime<Utc>, u32)>,
}

/// How long a gang that could not be bought whole waits before it is tried again, doubled
/// after each failure up to [`GANG_BACKOFF_MAX`].
const GANG_BACKOFF: Duration = Duration::minutes(10);
const GANG_BACKOFF_MAX: Duration = Duration::hours(6);

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

    /// One round.
    pub async fn run_once(&mut self) -> Result<CapacityReport, StoreError> {
        let now = self.clock.now();
        let mut report = CapacityReport::default();
        self.unavailable.expire(now);
        self.poll(now).await?;
        let offers: Vec<Offer> = self.offers.values().flatten().cloned().collect();
        report.offers = offers.len();

        self.sync(now, &mut report).await?;

        let snap = self.store.scheduler_snapshot(&mut self.cache).await?;
        let reasons = self.store.queued_reasons().await?;
        let no_capacity = wait_text(WaitReason::NoCapacity);
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
                        .is_some_and(|r| r.as_deref() == Some(no_capacity))
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
            let idle = phase == FleetPhase::Ready && in_use == 0 && !used.contains_key(&n.id);
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
                price: spotplane_core::Micros::from_usd_f64(n.hourly_price_usd).unwrap_or_default(),
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

        let mut stopped_clouds = Vec::new();
        for buy in &plan.buys {
            // A gang runs on all its nodes or not at all: nodes of a gang that cannot be
            // bought whole are given back at once rather than paid for while it waits.
            let mut bought = Vec::new();
            for _ in 0..buy.count {
                if stopped_clouds.contains(&buy.offer.cloud) {
                    break;
                }
                match self.buy_one(buy, now).await? {
                    Ok(node) => {
                        report.bought += 1;
                        bought.push(node);
                    }
                    Err(e) => {
                        *report.refused.entry(e.kind()).or_default() += 1;
                        if matches!(
                            e,
                            ProviderError::Quota(_)
                                | ProviderError::Auth(_)
                                | ProviderError::Throttled { .. }
                                | ProviderError::Transient(_)
                        ) {
                            stopped_clouds.push(buy.offer.cloud);
                        }
                        break;
                    }
                }
            }
            if buy.count > 1 && bought.len() < buy.count as usize {
                self.give_back_partial_gang(buy, &bought, now, &mut report)
                    .await?;
            }
        }

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
        if !demand_waits {
            self.consolidate(&snap, &nodes, now, &mut report).await?;
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

    /// Since when each node's set of jobs is what it is (Karpenter's `consolidateAfter` clock).
    fn track_node_jobs(&mut self, snap: &crate::scheduler::Snapshot, now: DateTime<Utc>) {
        let mut held: HashMap<NodeId, Vec<JobId>> = HashMap::new();
        for r in &snap.running {
            for p in &r.placements {
                let ids = held.entry(p.node).or_default();
                if !ids.contains(&r.id) {
                    ids.push(r.id);
                }
            }
        }
        for ids in held.values_mut() {
            ids.sort();
        }
        self.node_jobs.retain(|n, _| held.contains_key(n));
        for (node, ids) in held {
            match self.node_jobs.get_mut(&node) {
                Some((known, _)) if *known == ids => {}
                Some(entry) => *entry = (ids, now),
                None => {
                    self.node_jobs.insert(node, (ids, now));
                }
            }
        }
    }

    /// Work left of a running job with `work_hours`, from its history; remembered and aged
    /// with the clock for [`REMAINING_REFRESH`], and at most [`REMAINING_QUERIES`] histories
    /// read per round (a job not read yet counts as of unknown length), so a large fleet does
    /// not read every job's history every round.
    async fn remaining_hours(
        &mut self,
        snap: &crate::scheduler::Snapshot,
        now: DateTime<Utc>,
    ) -> Result<HashMap<JobId, f64>, StoreError> {
        let running: std::collections::HashSet<JobId> = snap.running.iter().map(|r| r.id).collect();
        self.remaining.retain(|id, _| running.contains(id));
        let mut out = HashMap::new();
        let mut queries = 0;
        for r in &snap.running {
            let Some(spec) = self.cache.get(r.id) else {
                continue;
            };
            let Some(work) = spec.work_hours else {
                continue;
            };
            let hours = |d: Duration| d.num_milliseconds().max(0) as f64 / 3_600_000.0;
            match self.remaining.get(&r.id) {
                Some((at, left)) if now - *at < REMAINING_REFRESH && now >= *at => {
                    out.insert(r.id, (left - hours(now - *at)).max(0.0));
                }
                _ if queries < REMAINING_QUERIES => {
                    queries += 1;
                    let checkpoint_hours = spec
                        .checkpoint
                        .as_ref()
                        .map(|c| f64::from(c.interval_s) / 3600.0);
                    let left =
                        (work - self.progress_hours(r.id, checkpoint_hours, now).await?).max(0.0);
                    self.remaining.insert(r.id, (now, left));
                    out.insert(r.id, left);
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Consolidation: drains the nodes [`planner::consolidate`] picks. Runs only while no job
    /// waits for capacity.
    async fn consolidate(
        &mut self,
        snap: &crate::scheduler::Snapshot,
        nodes: &[crate::model::Node],
        now: DateTime<Utc>,
        report: &mut CapacityReport,
    ) -> Result<(), StoreError> {
        let s = self.settings.consolidation.clone();
        if !s.enabled {
            return Ok(());
        }
        let mut costs: HashMap<NodeId, NodeCost> = HashMap::new();
        for n in nodes {
            if n.state != NodeState::Ready {
                continue;
            }
            if let (Some((_, since)), Some(price)) = (
                self.node_jobs.get(&n.id),
                spotplane_core::Micros::from_usd_f64(n.hourly_price_usd).ok(),
            ) {
                costs.insert(
                    n.id,
                    NodeCost {
                        price,
                        stable_since: *since,
                    },
                );
            }
        }
        // No node steady long enough: nothing to look at.
        if !costs.values().any(|c| now - c.stable_since >= s.after) {
            return Ok(());
        }
        // What the planner knows of each running job (how long the work on a target lasts
        // matters as much as the work moved).
        let remaining = self.remaining_hours(snap, now).await?;
        let mut jobs: HashMap<JobId, MovableJob> = HashMap::new();
        for r in &snap.running {
            let Some(spec) = self.cache.get(r.id) else {
                continue;
            };
            let remaining_hours = remaining.get(&r.id).copied();
            jobs.insert(
                r.id,
                MovableJob {
                    clouds: spec.clouds.clone(),
                    regions: spec.regions.clone(),
                    spot: spec.spot,
                    image: spec.image.is_some(),
                    checkpoints: spec.checkpoint.is_some(),
                    remaining_hours,
                    restart_hours: self.settings.planner.default_restart_hours,
                    deadline: spec.deadline,
                },
            );
        }
        let offers: Vec<Offer> = self
            .offers
            .values()
            .flatten()
            .filter(|o| !self.unavailable.contains(&o.id(), now))
            .cloned()
            .collect();
        let input = planner::ConsolidationInput {
            snapshot: snap,
            jobs: &jobs,
            nodes: &costs,
            offers: &offers,
            pools: &self.pools,
        };
        let chosen = planner::consolidate(now, input, &s);
        for c in chosen {
            let reason = match &c.replacement {
                None => format!(
                    "consolidation: its {} job(s) fit on other nodes; giving it back saves ${:.2}/h",
                    c.jobs.len(),
                    c.saving_hourly.0 as f64 / 1e6
                ),
                Some(o) => format!(
                    "consolidation: its {} job(s) fit on a cheaper {} ({}); replacing it saves ${:.2}/h",
                    c.jobs.len(),
                    o.instance_type,
                    o.market,
                    c.saving_hourly.0 as f64 / 1e6
                ),
            };
            match self
                .store
                .transition_node(c.node, NodeState::Draining, Some(reason), now)
                .await
            {
                Ok(()) => {
                    tracing::info!(node = %c.node, jobs = c.jobs.len(), targets = ?c.targets,
                        replacement = c.replacement.as_ref().map(|o| o.id()),
                        saving_hourly = %c.saving_hourly, move_cost = %c.move_cost,
                        "consolidating: draining a node whose work fits elsewhere");
                    self.node_jobs.remove(&c.node);
                    report.consolidated += 1;
                }
                Err(StoreError::Conflict(why) | StoreError::NotFound(why)) => {
                    tracing::debug!(node = %c.node, %why, "consolidation dropped");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Hours a job has run, from its history: every stretch in `running`, less, for a stretch
    /// that ended `lost`, the work since its last periodic checkpoint (at most one interval).
    async fn progress_hours(
        &self,
        job: spotplane_core::JobId,
        checkpoint_hours: Option<f64>,
        now: DateTime<Utc>,
    ) -> Result<f64, StoreError> {
        let events = self.store.job_events(job, None, None, 10_000).await?;
        let mut ran = 0.0;
        let mut since: Option<DateTime<Utc>> = None;
        for e in &events.items {
            match (since, e.to_state) {
                (None, Some(spotplane_core::JobState::Running)) => since = Some(e.at),
                (Some(start), Some(to)) if to != spotplane_core::JobState::Running => {
                    let h = (e.at - start).num_seconds().max(0) as f64 / 3600.0;
                    ran += if to == spotplane_core::JobState::Lost {
                        (h - checkpoint_hours.unwrap_or(h)).max(0.0)
                    } else {
                        h
                    };
                    since = None;
                }
                _ => {}
            }
        }
        if let Some(start) = since {
            ran += (now - start).num_seconds().max(0) as f64 / 3600.0;
        }
        Ok(ran)
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

    /// Gives back the nodes bought for a gang that could not be bought whole, and sets the gang
    /// aside for a while (longer after each failure in a row).
    async fn give_back_partial_gang(
        &mut self,
        buy: &planner::Buy,
        bought: &[(NodeId, String, spotplane_core::Cloud)],
        now: DateTime<Utc>,
        report: &mut CapacityReport,
    ) -> Result<(), StoreError> {
        let failures = self.gang_backoff.get(&buy.job).map_or(0, |(_, n)| *n) + 1;
        let wait = GANG_BACKOFF
            .checked_mul(1 << failures.saturating_sub(1).min(10))
            .unwrap_or(GANG_BACKOFF_MAX)
            .min(GANG_BACKOFF_MAX);
        self.gang_backoff.insert(buy.job, (now + wait, failures));
        tracing::warn!(
            job = %buy.job,
            wanted = buy.count,
            got = bought.len(),
            retry_in = %wait,
            "the gang's nodes could not all be bought; giving back those that were"
        );
        let reason = format!(
            "gang of {} nodes could not be bought whole ({} were)",
            buy.count,
            bought.len()
        );
        for (node, instance, cloud) in bought {
            if self
                .release_instance(*node, *cloud, Some(instance), &reason, now)
                .await?
            {
                report.released += 1;
            }
        }
        Ok(())
    }

    /// Buys one node for `buy`, walking its fallbacks on capacity and price errors: the node,
    /// its instance and its cloud. The outer error is the store's; the inner one the last
    /// provider error.
    async fn buy_one(
        &mut self,
        buy: &planner::Buy,
        now: DateTime<Utc>,
    ) -> Result<Result<(NodeId, String, spotplane_core::Cloud), ProviderError>, StoreError> {
        let mut last = ProviderError::InsufficientCapacity {
            offer_id: buy.offer.id(),
            message: "no offer left".into(),
        };
        for offer in std::iter::once(&buy.offer).chain(buy.fallbacks.iter()) {
            if self.unavailable.contains(&offer.id(), now) {
                continue;
            }
            let Some((_, provider)) = self.provider_for(offer) else {
                continue;
            };
            let provider = Arc::clone(provider);
            let node_id = NodeId::from_uuid(uuid::Uuid::now_v7());
            let mut labels = BTreeMap::from([
                (tags::CLUSTER.to_owned(), self.settings.cluster.clone()),
                (tags::NODE_ID.to_owned(), node_id.to_string()),
                (tags::TEAM.to_owned(), buy.team.to_string()),
            ]);
            let node = NewNode {
                id: node_id,
                name: format!("spotplane-{}", node_id.as_uuid().simple()),
                cloud: offer.cloud,
                region: offer.region.to_string(),
                zone: offer.zone.to_string(),
                instance_type: offer.instance_type.to_string(),
                market: offer.market,
                offer_id: Some(offer.id()),
                client_token: format!("spotplane-{node_id}"),
                hourly_price: offer.price,
                on_demand_price: offer.on_demand_price,
                cpu_milli: u64::from(offer.vcpus) * 1000,
                memory_mib: offer.memory_mib,
                gpus: (0..offer.gpu_count)
                    .filter_map(|_| {
                        offer.gpu_model.map(|m| NewGpu {
                            model: m,
                            memory_mib: u64::from(m.memory_mib().unwrap_or(0)),
                            mig_enabled: false,
                            mig_layout: Default::default(),
                        })
                    })
                    .collect(),
                labels: labels.clone(),
            };
            let client_token = node.client_token.clone();
            // A real cloud's node gets its one-node bootstrap token in its user data; the
            // simulated clouds' nodes are given agents by whoever runs them.
            let user_data = if self.providers.sim(offer.cloud).is_some() {
                self.store.create_node(node, now).await?;
                None
            } else {
                let expires = now + self.settings.planner.boot_timeout + Duration::minutes(10);
                let (_, token) = self
                    .store
                    .create_node_with_bootstrap(node, expires, now)
                    .await?;
                Some(node_user_data(
                    &token,
                    self.settings.node_boot_script.as_deref(),
                ))
            };
            labels.insert("spotplane-job".into(), buy.job.to_string());
            let req = ProvisionRequest {
                node_id,
                offer: offer.clone(),
                client_token,
                tags: labels,
                user_data,
            };
            match provider.provision(&req).await {
                Ok(inst) => {
                    self.store
                        .set_node_instance(node_id, &inst.provider_id, now)
                        .await?;
                    self.store
                        .transition_node(node_id, NodeState::Booting, None, now)
                        .await?;
                    return Ok(Ok((node_id, inst.provider_id, offer.cloud)));
                }
                Err(e) => {
                    self.store
                        .transition_node(
                            node_id,
                            NodeState::Terminated,
                            Some(format!("not bought: {e}")),
                            now,
                        )
                        .await?;
                    match &e {
                        ProviderError::InsufficientCapacity { .. }
                        | ProviderError::PriceTooLow(_) => {
                            tracing::info!(offer = %offer.id(), error = %e, "offer set aside; trying the next");
                            self.unavailable.mark(
                                &offer.id(),
                                now,
                                self.settings.capacity_error_ttl,
                            );
                            last = e;
                        }
                        _ => return Ok(Err(e)),
                    }
                }
            }
        }
        Ok(Err(last))
    }

    /// Terminates a node's instance and records it; whether it was given back.
    async fn release(
        &self,
        node: &crate::model::Node,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.release_instance(
            node.id,
            node.cloud,
            node.provider_instance_id.as_deref(),
            reason,
            now,
        )
        .await
    }

    async fn release_instance(
        &self,
        node: NodeId,
        cloud: spotplane_core::Cloud,
        instance: Option<&str>,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let provider = self.providers.all.iter().find(|p| p.cloud() == cloud);
        if let (Some(p), Some(id)) = (provider, instance)
            && let Err(e) = p.terminate(id).await
        {
            tracing::warn!(node = %node, error = %e, "terminate failed; trying again next round");
            return Ok(false);
        }
        self.store
            .transition_node(node, NodeState::Terminated, Some(reason.to_owned()), now)
            .await?;
        Ok(true)
    }

    /// Brings the store in step with what the clouds say, and sweeps orphans.
    async fn sync(
        &mut self,
        now: DateTime<Utc>,
        report: &mut CapacityReport,
    ) -> Result<(), StoreError> {
        let nodes = self.store.list_nodes(&LIVE).await?;
        let by_cluster =
            BTreeMap::from([(tags::CLUSTER.to_owned(), self.settings.cluster.clone())]);
        let providers: Vec<Arc<dyn CloudProvider>> = self.providers.all.clone();
        for p in providers {
            let cloud = p.cloud();
            let instances = match p.list_instances(&by_cluster).await {
                Ok(i) => i,
                Err(e) => {
                    tracing::warn!(%cloud, error = %e, "listing instances failed; no sync this round");
                    continue;
                }
            };
            let by_id: HashMap<&str, &spotplane_providers::Instance> = instances
                .iter()
                .map(|i| (i.provider_id.as_str(), i))
                .collect();
            for n in nodes.iter().filter(|n| n.cloud == cloud) {
                let Some(pid) = &n.provider_instance_id else {
                    continue;
                };
                let state = by_id.get(pid.as_str()).map(|i| i.state);
                match state {
                    Some(InstanceState::Running)
                        if self.settings.ready_on_running
                            && matches!(n.state, NodeState::Booting | NodeState::Requested)
                            && self.providers.sim(cloud).is_some() =>
                    {
                        self.store
                            .transition_node(n.id, NodeState::Ready, None, now)
                            .await?;
                        report.ready += 1;
                    }
                    // (A new instance may not be listed yet: clouds are eventually consistent.)
                    None if now - n.created_at < Duration::minutes(2) => {}
                    None
                    | Some(
                        InstanceState::Terminated
                        | InstanceState::Terminating
                        | InstanceState::Stopped,
                    ) => {
                        // Gone without being asked: the cloud took it (counted once: a node
                        // with a notice was counted then).
                        if n.market == Market::Spot
                            && !self.noticed.contains(&n.id)
                            && let Some(o) = &n.offer_id
                        {
                            self.pools.interrupted(o);
                            self.unavailable
                                .mark(o, now, self.settings.capacity_error_ttl);
                        }
                        self.store
                            .transition_node(
                                n.id,
                                NodeState::Terminated,
                                Some("the cloud took the instance".into()),
                                now,
                            )
                            .await?;
                        report.vanished += 1;
                    }
                    _ => {}
                }
            }
            // Orphans: tagged instances no live node row knows.
            for i in &instances {
                let known = nodes
                    .iter()
                    .any(|n| n.provider_instance_id.as_deref() == Some(i.provider_id.as_str()));
                let gone = matches!(
                    i.state,
                    InstanceState::Terminated | InstanceState::Terminating
                );
                let old = i
                    .launched_at
                    .is_some_and(|t| now - t > self.settings.orphan_grace);
                if !known && !gone && old {
                    match p.terminate(&i.provider_id).await {
                        Ok(()) => {
                            tracing::info!(%cloud, instance = %i.provider_id, "orphan terminated");
                            report.orphans += 1;
                        }
                        Err(e) => {
                            tracing::warn!(%cloud, instance = %i.provider_id, error = %e, "orphan not terminated")
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::node_user_data;

    #[test]
    fn user_data_writes_the_token_then_runs_the_boot_script() {
        let token = "spb_0123456789abcdef0123456789abcdef_AbC-dE_f";
        let ud = node_user_data(
            token,
            Some("#!/bin/bash\nset -eu\nsystemctl start spotplane-agent\n"),
        );
        assert!(ud.starts_with("#!/bin/sh\n"), "{ud}");
        assert!(
            ud.contains(&format!(
                "printf '%s\\n' '{token}' > /etc/spotplane/bootstrap-token\n"
            )),
            "{ud}"
        );
        assert!(ud.contains("umask 077"), "root-only token file: {ud}");
        assert!(
            ud.ends_with("set -eu\nsystemctl start spotplane-agent\n"),
            "{ud}"
        );
        assert_eq!(ud.matches("#!").count(), 1, "one interpreter line: {ud}");
        // Without a boot script, only the token part: the image starts the agent.
        assert!(!node_user_data(token, None).contains("systemctl"));
    }
}
