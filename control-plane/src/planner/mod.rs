//! The capacity planner: what to buy and what to give back, from offers and unmet demand.
//!
//! A pure function (STYLE.md §5): [`plan`] takes `now` and a [`PlanInput`] snapshot — offers of
//! every provider, the scheduler's unmet demand, the fleet with its use, observed interruption
//! rates per pool ([`PoolStats`]), offers set aside after failures ([`Unavailable`]) and team
//! budgets — and returns a [`Plan`]: nodes to buy (offer, count, which jobs they are for) and
//! nodes to release. No I/O, no clock, no async; the provisioning reconciler does the rest.
//!
//! # How an offer is chosen
//!
//! Not by price alone, by **expected cost per hour of useful work**. A gang of `n` nodes on a
//! pool whose nodes are interrupted at rate λ per node-hour is interrupted at `n·λ`; each
//! interruption costs the work since the last checkpoint (half the checkpoint interval `c` on
//! average) plus the restart `r` (a new node's boot and the restore), all `n` nodes billed
//! meanwhile. So an hour of progress costs
//!
//! ```text
//! n · price · (1 + n·λ·(c/2 + r))
//! ```
//!
//! which is why a big gang may be cheaper on on-demand than on a cheap spot pool that is often
//! taken, and why a job that never checkpoints is costed with everything it has done as rework.
//! λ is [`PoolStats::rate`]: the pool's observed interruptions per node-hour, with the cloud's
//! published interruption bucket as the prior (a Bayesian mean, so a pool seen for a few hours
//! is not judged by them alone).
//!
//! # Deadlines
//!
//! A job with a deadline and an estimate of its remaining work is kept safe: when its slack —
//! time to the deadline minus the remaining work and one restart — no longer covers one more
//! interruption (the rework `c` and a restart `r`), or when its expected finish on spot would be
//! later than that, only on-demand offers are considered. This is the online rule that the
//! `bench deadline` policies measure against the Can't Be Late traces.
//!
//! # Constraints never broken
//!
//! A buy respects the job's clouds, regions, `spot` flag and `max_hourly_usd` (for the whole
//! gang), the team's hourly budget (its fleet's price per hour) and monthly budget (spent so far
//! plus the fleet for one more hour), and never uses an offer in [`Unavailable`]. Multi-node gangs
//! get nodes of one offer, which is one zone. Capacity already bought and still booting is used
//! before anything new is bought.
//!
//! # Spreading
//!
//! Among offers whose expected cost is within [`PlannerSettings::spread_tolerance`] of the best,
//! the one where the team already has the fewest nodes wins: a team's fleet spread over pools
//! loses less at once when one pool is reclaimed (spot reclaims are correlated within a pool).
//!
//! # Releases
//!
//! A ready node with nothing on it for longer than the idle grace is released, unless unmet
//! demand would fit on it; a node that has not become ready within the boot timeout is released
//! and its offer reported, so the reconciler can set it aside. A node with work that fits on
//! the rest of the fleet is emptied first when that pays ([`consolidate`], its own module).

mod consolidate;
pub mod deadline;
pub mod markov;
mod pool;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use spotplane_core::shape::{GpuShape, ResourceShape};
use spotplane_core::{Cloud, GpuModel, JobId, Market, Micros, NodeId, TeamName};
use spotplane_providers::Offer;

pub use consolidate::{
    Consolidation, ConsolidationInput, ConsolidationSettings, MovableJob, NodeCost, consolidate,
};
pub use pool::{PoolStats, Unavailable, pool_id};

/// How offers are chosen: spotplane's expected-cost rule, or one of the baselines the fleet
/// replay compares it with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PlanPolicy {
    /// Expected cost per hour of progress, deadline safety, spreading (the module doc).
    #[default]
    ExpectedCost,
    /// The cheapest spot offer by price, on-demand only when no spot offer fits; after a loss
    /// the pool is set aside and the next cheapest taken (SkyPilot managed jobs' failover;
    /// the fleet replay also runs it without notice checkpoints, as SkyPilot has none).
    CheapestSpot,
    /// On-demand capacity only.
    OnDemandOnly,
}

/// Tunables of the planner.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannerSettings {
    pub policy: PlanPolicy,
    /// Restart cost in hours when a job declares none: a new node's boot and the restore.
    pub default_restart_hours: f64,
    /// Checkpoint interval in hours assumed for a job that checkpoints without saying how often.
    pub default_checkpoint_hours: f64,
    /// Rework assumed for a job that never checkpoints: everything since it started, at most this.
    pub no_checkpoint_rework_hours: f64,
    /// Offers within this share of the best expected cost count as equally good (for spreading).
    pub spread_tolerance: f64,
    /// A ready node empty for this long is released.
    pub idle_grace: Duration,
    /// Hours to move a checkpoint between regions when its size is unknown.
    pub default_migrate_hours: f64,
    /// A node not ready after this long is released and its offer reported.
    pub boot_timeout: Duration,
    /// The most nodes the whole fleet may have (booting and ready); `None`: no cap.
    pub max_nodes: Option<u32>,
    /// The most the whole fleet may cost per hour; `None`: no cap.
    pub max_hourly: Option<Micros>,
}

impl Default for PlannerSettings {
    fn default() -> Self {
        PlannerSettings {
            policy: PlanPolicy::ExpectedCost,
            default_restart_hours: 0.1,
            default_checkpoint_hours: 0.5,
            no_checkpoint_rework_hours: 4.0,
            spread_tolerance: 0.05,
            default_migrate_hours: 0.1,
            idle_grace: Duration::minutes(5),
            boot_timeout: Duration::minutes(15),
            max_nodes: None,
            max_hourly: None,
        }
    }
}

/// One job the scheduler could not place for want of capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    pub job: JobId,
    pub team: TeamName,
    pub priority: i32,
    pub replicas: u32,
    pub shape: ResourceShape,
    /// Allowed clouds and regions; any when empty.
    pub clouds: Vec<Cloud>,
    pub regions: Vec<String>,
    /// Whether spot may be used at all.
    pub spot: bool,
    /// Most the whole gang may cost per hour.
    pub max_hourly: Option<Micros>,
    pub deadline: Option<DateTime<Utc>>,
    /// Compute still needed, in hours, when known.
    pub remaining_hours: Option<f64>,
    /// How often it checkpoints, in hours; `None`: it does not.
    pub checkpoint_hours: Option<f64>,
    /// Its restart cost in hours (boot + restore), when known.
    pub restart_hours: Option<f64>,
    /// The region holding its latest checkpoint (where it last ran), once it has one: a start
    /// elsewhere also moves the checkpoint ([`deadline`]).
    pub location: Option<String>,
    /// Hours to move that checkpoint to another region, when known (from its size).
    pub migrate_hours: Option<f64>,
    /// The GPU models its team's quota lets the whole gang use
    /// ([`crate::scheduler::quota_models_of_queued`]); `None`: any model.
    pub models: Option<Vec<GpuModel>>,
}

/// A node of the fleet as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetNode {
    pub id: NodeId,
    /// The offer it was bought from ([`Offer::id`]).
    pub offer_id: String,
    pub cloud: Cloud,
    pub zone: String,
    pub market: Market,
    pub price: Micros,
    /// The team whose demand bought it, if any.
    pub team: Option<TeamName>,
    pub phase: FleetPhase,
    /// Whole GPUs with nothing on them.
    pub free_gpus: u32,
    pub gpu_count: u32,
    /// Since when nothing runs on it (ready nodes).
    pub idle_since: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetPhase {
    /// Bought, not yet reporting: since when.
    Booting {
        since: DateTime<Utc>,
    },
    Ready,
    /// Draining or terminating: its capacity is going away.
    Leaving,
}

/// A team's spending limits.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Budget {
    pub hourly: Option<Micros>,
    pub monthly: Option<Micros>,
    /// Spent so far this month.
    pub month_to_date: Micros,
}

/// Everything one planning round looks at.
#[derive(Debug, Clone, Default)]
pub struct PlanInput {
    pub offers: Vec<Offer>,
    pub demand: Vec<Demand>,
    pub fleet: Vec<FleetNode>,
    pub pools: PoolStats,
    pub unavailable: Unavailable,
    pub budgets: BTreeMap<TeamName, Budget>,
}

/// What to do.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub buys: Vec<Buy>,
    pub releases: Vec<Release>,
    /// Demand left unserved, and why.
    pub unserved: Vec<(JobId, Unserved)>,
}

/// Nodes to buy from one offer for one job.
#[derive(Debug, Clone, PartialEq)]
pub struct Buy {
    pub job: JobId,
    pub team: TeamName,
    pub offer: Offer,
    pub count: u32,
    /// The offer's expected cost per hour of progress for this job (see the module doc).
    pub expected_hourly: Micros,
    /// The deadline forced on-demand capacity.
    pub deadline_forced: bool,
    /// Other offers the reconciler may try, best first, when this one fails for capacity.
    pub fallbacks: Vec<Offer>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    pub node: NodeId,
    pub reason: ReleaseReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReason {
    /// Empty longer than the idle grace.
    Idle,
    /// Never became ready: the reconciler sets its offer aside.
    BootTimeout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unserved {
    /// No offer can run the shape within the job's constraints.
    NoOffer,
    /// Offers exist, but all are above the job's maximum price.
    OverMaxPrice,
    /// The team's hourly or monthly budget is spent.
    OverBudget,
    /// The whole gang would take the fleet past its node or hourly cap.
    OverFleetCap,
    /// Capacity already bought and booting will take it.
    Booting,
}

/// How many replicas of `shape` fit on one node of `offer`; 0 when none does.
pub fn replicas_per_node(shape: &ResourceShape, offer: &Offer) -> u32 {
    // Zero asks nothing of that resource: no limit.
    let by_cpu = offer
        .vcpus
        .saturating_mul(1000)
        .checked_div(shape.cpu_milli)
        .unwrap_or(u32::MAX);
    let by_memory = offer
        .memory_mib
        .checked_div(shape.memory_mib)
        .map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX));
    let by_gpu = match (&shape.gpu, offer.gpu_model) {
        (GpuShape::Whole { gpus: 0, .. }, _) => u32::MAX,
        (_, None) => 0,
        (g, Some(model)) if !g.allows_model(model) => 0,
        (GpuShape::Whole { gpus, .. }, Some(_)) => offer.gpu_count / gpus,
        (GpuShape::Mig { profile, .. }, Some(model)) => profile
            .class_on(model)
            .map_or(0, |c| offer.gpu_count * u32::from(c.max_per_gpu())),
        (GpuShape::Shared { gpu_milli, .. }, Some(_)) => {
            offer.gpu_count * (spotplane_core::shape::GPU_MILLI / (*gpu_milli).max(1))
        }
    };
    by_cpu.min(by_memory).min(by_gpu)
}

/// Whole GPUs `replicas` replicas of `shape` take on one node (MIG and shared replicas are
/// packed onto as few GPUs as the geometry allows).
fn gpus_taken(shape: &GpuShape, replicas: u32, model: Option<spotplane_core::GpuModel>) -> u32 {
    match (shape, model) {
        (GpuShape::Whole { gpus, .. }, _) => gpus * replicas,
        (GpuShape::Mig { profile, .. }, Some(m)) => profile
            .class_on(m)
            .map_or(replicas, |c| replicas.div_ceil(u32::from(c.max_per_gpu()))),
        (GpuShape::Shared { gpu_milli, .. }, Some(_)) => {
            let per_gpu = (spotplane_core::shape::GPU_MILLI / (*gpu_milli).max(1)).max(1);
            replicas.div_ceil(per_gpu)
        }
        (_, None) => 0,
    }
}

impl Demand {
    fn allows(&self, offer: &Offer) -> bool {
        (self.clouds.is_empty() || self.clouds.contains(&offer.cloud))
            && (self.regions.is_empty() || self.regions.iter().any(|r| *r == *offer.region))
            && (self.spot || offer.market == Market::OnDemand)
            && self
                .models
                .as_ref()
                .is_none_or(|ms| offer.gpu_model.is_some_and(|m| ms.contains(&m)))
    }

    fn rework_hours(&self, s: &PlannerSettings) -> f64 {
        match self.checkpoint_hours {
            Some(c) => c / 2.0,
            None => self
                .remaining_hours
                .map_or(s.no_checkpoint_rework_hours, |w| {
                    (w / 2.0).min(s.no_checkpoint_rework_hours)
                }),
        }
    }

    fn restart(&self, s: &PlannerSettings) -> f64 {
        self.restart_hours.unwrap_or(s.default_restart_hours)
    }

    /// Whether the deadline leaves no room for spot: see the module doc.
    fn deadline_forces_on_demand(
        &self,
        now: DateTime<Utc>,
        worst_rate: f64,
        nodes: u32,
        s: &PlannerSettings,
    ) -> bool {
        let (Some(deadline), Some(work)) = (self.deadline, self.remaining_hours) else {
            return false;
        };
        let left = (deadline - now).num_seconds() as f64 / 3600.0;
        let r = self.restart(s);
        let c = self
            .checkpoint_hours
            .unwrap_or(work.min(s.no_checkpoint_rework_hours));
        let slack = left - work - r;
        if slack < c + r {
            return true;
        }
        // Expected finish on spot, with the interruptions the pool is known for.
        let expected = work * (1.0 + f64::from(nodes) * worst_rate * (self.rework_hours(s) + r));
        expected + r > left - (c + r)
    }
}

/// Expected cost per hour of progress of `nodes` nodes at `price` interrupted at `rate`.
pub(crate) fn expected_hourly(
    price: Micros,
    nodes: u32,
    rate: f64,
    rework: f64,
    restart: f64,
) -> f64 {
    let n = f64::from(nodes);
    n * price.0 as f64 * (1.0 + n * rate * (rework + restart))
}

/// What a round reads of each offer again and again, worked out once: its id (a formatted
/// string), whether it is set aside, its pool's interruption rate, and the offer of an id.
/// Without it, a queue of 11,000 jobs formatted every offer's id for every job and every
/// booting node (issue 29 no. 3; docs/benchmarks.md, "A leader round on a large queue").
struct OfferIndex<'a> {
    ids: &'a [String],
    set_aside: Vec<bool>,
    rates: Vec<f64>,
    by_id: std::collections::HashMap<&'a str, usize>,
}

impl<'a> OfferIndex<'a> {
    fn new(input: &PlanInput, ids: &'a [String], now: DateTime<Utc>) -> Self {
        OfferIndex {
            ids,
            set_aside: ids
                .iter()
                .map(|id| input.unavailable.contains(id, now))
                .collect(),
            rates: input.offers.iter().map(|o| input.pools.rate(o)).collect(),
            by_id: ids
                .iter()
                .enumerate()
                .map(|(i, id)| (id.as_str(), i))
                .collect(),
        }
    }

    fn offer<'o>(&self, input: &'o PlanInput, id: &str) -> Option<&'o Offer> {
        self.by_id.get(id).map(|&i| &input.offers[i])
    }
}

/// One planning round. Deterministic: the same input gives the same plan.
pub fn plan(now: DateTime<Utc>, input: &PlanInput, settings: &PlannerSettings) -> Plan {
    let mut out = Plan::default();
    let ids: Vec<String> = input.offers.iter().map(Offer::id).collect();
    let index = OfferIndex::new(input, &ids, now);
    // Booting capacity not yet spoken for, per node: whole GPUs free.
    let mut booting: Vec<(usize, u32)> = input
        .fleet
        .iter()
        .enumerate()
        .filter(|(_, n)| matches!(n.phase, FleetPhase::Booting { .. }))
        .map(|(i, n)| (i, n.free_gpus))
        .collect();
    // Per team: price per hour of its fleet (bought in this round included) and nodes per pool.
    let mut team_hourly: BTreeMap<TeamName, i64> = BTreeMap::new();
    // (team, offer index): the team's nodes bought from that offer.
    let mut team_pools: BTreeMap<(&TeamName, usize), u32> = BTreeMap::new();
    // The whole fleet, for its caps: nodes and price per hour (bought in this round included).
    let staying = input
        .fleet
        .iter()
        .filter(|n| n.phase != FleetPhase::Leaving);
    let mut fleet_nodes: u64 = staying.clone().count() as u64;
    let mut fleet_hourly: i64 = staying.map(|n| n.price.0).sum();
    for n in &input.fleet {
        if let (Some(t), false) = (&n.team, n.phase == FleetPhase::Leaving) {
            *team_hourly.entry(t.clone()).or_default() += n.price.0;
            if let Some(&i) = index.by_id.get(n.offer_id.as_str()) {
                *team_pools.entry((t, i)).or_default() += 1;
            }
        }
    }

    // Deadlines first (the nearest first), then priority, then job id (submission order).
    let mut demand: Vec<&Demand> = input.demand.iter().collect();
    demand.sort_by(|a, b| {
        let da = a.deadline.unwrap_or(DateTime::<Utc>::MAX_UTC);
        let db = b.deadline.unwrap_or(DateTime::<Utc>::MAX_UTC);
        da.cmp(&db)
            .then(b.priority.cmp(&a.priority))
            .then(a.job.cmp(&b.job))
    });

    for d in demand {
        if take_booting(d, input, &index, &mut booting) {
            out.unserved.push((d.job, Unserved::Booting));
            continue;
        }
        // A full fleet takes nothing more: no need to look for an offer.
        if settings
            .max_nodes
            .is_some_and(|m| fleet_nodes >= u64::from(m))
        {
            out.unserved.push((d.job, Unserved::OverFleetCap));
            continue;
        }
        match choose(now, d, input, &index, settings, &team_pools) {
            Err(why) => out.unserved.push((d.job, why)),
            Ok((best, fallbacks, expected, forced)) => {
                let per_node = replicas_per_node(&d.shape, &best);
                let count = d.replicas.div_ceil(per_node.max(1));
                let add = best.price.0.saturating_mul(i64::from(count));
                let budget = input.budgets.get(&d.team).copied().unwrap_or_default();
                let hourly_now = team_hourly.get(&d.team).copied().unwrap_or(0);
                let over_hourly = budget
                    .hourly
                    .is_some_and(|b| hourly_now.saturating_add(add) > b.0);
                let over_monthly = budget.monthly.is_some_and(|b| {
                    budget
                        .month_to_date
                        .0
                        .saturating_add(hourly_now)
                        .saturating_add(add)
                        > b.0
                });
                if over_hourly || over_monthly {
                    out.unserved.push((d.job, Unserved::OverBudget));
                    continue;
                }
                let over_nodes = settings
                    .max_nodes
                    .is_some_and(|m| fleet_nodes + u64::from(count) > u64::from(m));
                let over_fleet_hourly = settings
                    .max_hourly
                    .is_some_and(|m| fleet_hourly.saturating_add(add) > m.0);
                if over_nodes || over_fleet_hourly {
                    out.unserved.push((d.job, Unserved::OverFleetCap));
                    continue;
                }
                fleet_nodes += u64::from(count);
                fleet_hourly = fleet_hourly.saturating_add(add);
                *team_hourly.entry(d.team.clone()).or_default() += add;
                if let Some(&i) = index.by_id.get(best.id().as_str()) {
                    *team_pools.entry((&d.team, i)).or_default() += count;
                }
                out.buys.push(Buy {
                    job: d.job,
                    team: d.team.clone(),
                    offer: best,
                    count,
                    expected_hourly: Micros(expected.round() as i64),
                    deadline_forced: forced,
                    fallbacks,
                });
            }
        }
    }

    out.releases = releases(now, input, &index, settings);
    out
}

/// Puts a demand on booting nodes when one node (or, for a gang, nodes of one zone) can take
/// it; returns whether it did.
fn take_booting(
    d: &Demand,
    input: &PlanInput,
    index: &OfferIndex<'_>,
    booting: &mut [(usize, u32)],
) -> bool {
    if booting.is_empty() {
        return false;
    }
    let gpu_model_fits = |n: &FleetNode| -> Option<u32> {
        let offer = index.offer(input, &n.offer_id)?;
        let per_node = replicas_per_node(&d.shape, offer);
        (per_node > 0 && d.allows(offer)).then_some(per_node)
    };
    // Group the candidate nodes by zone; a gang takes nodes of one zone only.
    let mut by_zone: BTreeMap<&str, Vec<(usize, u32)>> = BTreeMap::new();
    for (slot, (i, free)) in booting.iter().enumerate() {
        let n = &input.fleet[*i];
        if let Some(per_node) = gpu_model_fits(n) {
            let model = index.offer(input, &n.offer_id).and_then(|o| o.gpu_model);
            // Replicas this node can still take, given its free GPUs.
            let mut k = per_node;
            while k > 0 && gpus_taken(&d.shape.gpu, k, model) > *free {
                k -= 1;
            }
            if k > 0 {
                by_zone.entry(n.zone.as_str()).or_default().push((slot, k));
            }
        }
    }
    for nodes in by_zone.values() {
        let room: u32 = nodes.iter().map(|(_, k)| k).sum();
        if room < d.replicas {
            continue;
        }
        let mut left = d.replicas;
        for (slot, k) in nodes {
            if left == 0 {
                break;
            }
            let take = left.min(*k);
            let (i, free) = &mut booting[*slot];
            let model = index
                .offer(input, &input.fleet[*i].offer_id)
                .and_then(|o| o.gpu_model);
            *free = free.saturating_sub(gpus_taken(&d.shape.gpu, take, model));
            left -= take;
        }
        return true;
    }
    false
}

type Choice = (Offer, Vec<Offer>, f64, bool);

/// The deadline model's costs for a demand with a deadline and an estimate of its work, over
/// the spot offers it may use (their indices beside), or `None` without a deadline, an
/// estimate or an on-demand offer to fall back on.
fn deadline_choice(
    now: DateTime<Utc>,
    d: &Demand,
    candidates: &[(usize, u32)],
    input: &PlanInput,
    index: &OfferIndex<'_>,
    s: &PlannerSettings,
) -> Option<(deadline::Choice, Vec<usize>)> {
    let (deadline_at, work) = (d.deadline?, d.remaining_hours?);
    let away = |o: &Offer| d.location.as_deref().is_some_and(|l| l != &*o.region);
    let hourly = |i: usize, n: u32| input.offers[i].price.0 as f64 * f64::from(n);
    // On-demand where the checkpoint is when there is one, else the cheapest.
    let (od_hourly, od_moves) = candidates
        .iter()
        .filter(|(i, _)| input.offers[*i].market == Market::OnDemand)
        .map(|&(i, n)| (hourly(i, n), away(&input.offers[i])))
        .min_by(|a, b| a.1.cmp(&b.1).then(a.0.total_cmp(&b.0)))?;
    // The spot offers best by expected cost per hour of progress, at most
    // [`deadline::MAX_POOLS`] of them: each is a plan to solve, and a market has hundreds.
    let mut ranked: Vec<(f64, usize, u32)> = candidates
        .iter()
        .filter(|(i, _)| input.offers[*i].market == Market::Spot)
        .map(|&(i, n)| {
            let o = &input.offers[i];
            let e = expected_hourly(o.price, n, index.rates[i], d.rework_hours(s), d.restart(s));
            (e, i, n)
        })
        .collect();
    ranked.sort_by(|a, b| {
        a.0.total_cmp(&b.0)
            .then_with(|| index.ids[a.1].cmp(&index.ids[b.1]))
    });
    ranked.truncate(deadline::MAX_POOLS);
    let spots: Vec<usize> = ranked.iter().map(|&(_, i, _)| i).collect();
    let options: Vec<deadline::SpotOption> = ranked
        .iter()
        .map(|&(_, i, n)| deadline::SpotOption {
            hourly: hourly(i, n),
            rate: index.rates[i] * f64::from(n),
            moves: away(&input.offers[i]),
        })
        .collect();
    let job = deadline::DeadlineJob {
        work_hours: work,
        left_hours: (deadline_at - now).num_seconds() as f64 / 3600.0,
        restart_hours: d.restart(s),
        migrate_hours: d.migrate_hours.unwrap_or(s.default_migrate_hours),
        rework_hours: d
            .checkpoint_hours
            .unwrap_or(work.min(s.no_checkpoint_rework_hours)),
    };
    Some((deadline::choose(&job, &options, od_hourly, od_moves), spots))
}

/// The best offer for a demand, the fallbacks after it, its expected hourly cost, and whether
/// the deadline forced on-demand.
fn choose(
    now: DateTime<Utc>,
    d: &Demand,
    input: &PlanInput,
    index: &OfferIndex<'_>,
    s: &PlannerSettings,
    team_pools: &BTreeMap<(&TeamName, usize), u32>,
) -> Result<Choice, Unserved> {
    // (offer index, nodes the gang needs there)
    let fits: Vec<(usize, u32)> = input
        .offers
        .iter()
        .enumerate()
        .filter(|(i, o)| !index.set_aside[*i] && d.allows(o))
        .filter_map(|(i, o)| {
            let per = replicas_per_node(&d.shape, o);
            (per > 0).then(|| (i, d.replicas.div_ceil(per)))
        })
        .collect();
    let offer = |i: usize| &input.offers[i];
    if fits.is_empty() {
        return Err(Unserved::NoOffer);
    }
    let within_price: Vec<(usize, u32)> = fits
        .into_iter()
        .filter(|(i, n)| {
            d.max_hourly
                .is_none_or(|m| offer(*i).price.0.saturating_mul(i64::from(*n)) <= m.0)
        })
        .collect();
    if within_price.is_empty() {
        return Err(Unserved::OverMaxPrice);
    }
    // The deadline test uses the worst spot pool among the candidates, so it does not depend
    // on which pool happens to be picked.
    let worst_rate = within_price
        .iter()
        .filter(|(i, _)| offer(*i).market == Market::Spot)
        .map(|(i, _)| index.rates[*i])
        .fold(0.0_f64, f64::max);
    let max_nodes = within_price.iter().map(|(_, n)| *n).max().unwrap_or(1);
    // A deadline with an estimate of the work: the multi-pool model decides stay, move or
    // on-demand ([`deadline`]); without an estimate, the slack rule alone.
    let model = (s.policy == PlanPolicy::ExpectedCost && d.spot)
        .then(|| deadline_choice(now, d, &within_price, input, index, s))
        .flatten();
    let forced = match &model {
        Some((choice, _)) => choice.on_demand(),
        None => {
            s.policy == PlanPolicy::ExpectedCost
                && d.spot
                && d.deadline_forces_on_demand(now, worst_rate, max_nodes, s)
        }
    };
    let od_at_location = d.location.as_deref().is_some_and(|l| {
        within_price
            .iter()
            .any(|(i, _)| offer(*i).market == Market::OnDemand && &*offer(*i).region == l)
    });
    let model_cost = |i: usize| -> Option<f64> {
        let (choice, spots) = model.as_ref()?;
        let k = spots.iter().position(|&j| j == i)?;
        choice.spot[k]
    };
    let any_spot = within_price
        .iter()
        .any(|(i, _)| offer(*i).market == Market::Spot);
    let mut scored: Vec<(f64, u32, usize)> = within_price
        .into_iter()
        .filter(|(i, _)| match s.policy {
            // With the deadline model: the spot pools it allows, or on-demand when it chose it.
            PlanPolicy::ExpectedCost if model.is_some() => {
                if forced {
                    // Where the checkpoint is, when on-demand is offered there.
                    offer(*i).market == Market::OnDemand
                        && (!od_at_location || d.location.as_deref() == Some(&*offer(*i).region))
                } else {
                    model_cost(*i).is_some()
                }
            }
            PlanPolicy::ExpectedCost => !forced || offer(*i).market == Market::OnDemand,
            PlanPolicy::CheapestSpot => !any_spot || offer(*i).market == Market::Spot,
            PlanPolicy::OnDemandOnly => offer(*i).market == Market::OnDemand,
        })
        .map(|(i, n)| {
            let o = offer(i);
            let rate = if o.market == Market::Spot && s.policy == PlanPolicy::ExpectedCost {
                index.rates[i]
            } else {
                0.0
            };
            let e = model_cost(i).unwrap_or_else(|| {
                expected_hourly(o.price, n, rate, d.rework_hours(s), d.restart(s))
            });
            let held = team_pools.get(&(&d.team, i)).copied().unwrap_or(0);
            (e, held, i)
        })
        .collect();
    if scored.is_empty() {
        // Forced to on-demand and none is allowed within the price.
        return Err(Unserved::OverMaxPrice);
    }
    scored.sort_by(|a, b| {
        a.0.total_cmp(&b.0)
            .then_with(|| index.ids[a.2].cmp(&index.ids[b.2]))
    });
    let best = scored[0].0;
    // Spreading: among the near-best, the pool where the team holds the fewest nodes.
    let tolerance = if s.policy == PlanPolicy::ExpectedCost {
        s.spread_tolerance
    } else {
        0.0
    };
    let limit = best * (1.0 + tolerance);
    let pick = scored
        .iter()
        .enumerate()
        .take_while(|(_, (e, _, _))| *e <= limit)
        .min_by_key(|(i, (_, held, _))| (*held, *i))
        .map_or(0, |(i, _)| i);
    let chosen = scored.remove(pick);
    let fallbacks: Vec<Offer> = scored
        .iter()
        .take(8)
        .map(|(_, _, i)| offer(*i).clone())
        .collect();
    Ok((offer(chosen.2).clone(), fallbacks, chosen.0, forced))
}

fn releases(
    now: DateTime<Utc>,
    input: &PlanInput,
    index: &OfferIndex<'_>,
    s: &PlannerSettings,
) -> Vec<Release> {
    let mut out = Vec::new();
    for n in &input.fleet {
        match n.phase {
            FleetPhase::Booting { since } if now - since > s.boot_timeout => out.push(Release {
                node: n.id,
                reason: ReleaseReason::BootTimeout,
            }),
            FleetPhase::Ready
                if n.free_gpus == n.gpu_count
                    && n.idle_since.is_some_and(|t| now - t >= s.idle_grace) =>
            {
                // Kept when waiting demand could use it (the scheduler places it next cycle).
                let offer = index.offer(input, &n.offer_id);
                let wanted = offer.is_some_and(|o| {
                    input
                        .demand
                        .iter()
                        .any(|d| d.allows(o) && replicas_per_node(&d.shape, o) > 0)
                });
                if !wanted {
                    out.push(Release {
                        node: n.id,
                        reason: ReleaseReason::Idle,
                    });
                }
            }
            _ => {}
        }
    }
    out
}
