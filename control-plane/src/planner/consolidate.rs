//! Consolidation: which underused nodes to empty, because the work on them fits on the rest of
//! the fleet and giving the node back saves more than moving the work costs.
//!
//! Pure like the rest of the planner: [`consolidate`] takes `now`, the scheduler's snapshot of
//! the fleet (nodes and the jobs holding capacity), what the capacity loop knows of each running
//! job beyond that ([`MovableJob`]) and each node's price and how long its set of jobs has been
//! unchanged ([`NodeCost`]); it returns the nodes to drain ([`Consolidation`]). The reconciler
//! drains them the way a notice would — each job checkpoints and goes back to the queue ahead of
//! its priority peers, the scheduler places it on the capacity the simulation found, and the
//! emptied node is given back as soon as nothing holds it.
//!
//! # How a node is chosen
//!
//! Like Karpenter's single-node consolidation, by **simulating the scheduler**, not by a rule of
//! thumb on utilisation: the node is taken out, its jobs are queued, and the scheduler itself
//! (best-fit packing, no preemption, no MIG re-layout) places them on what the rest of the fleet
//! has free on the nodes whose own work lasts at least as long as the work moved (an empty node
//! is the idle release's, and work put on a node about to empty would keep that node instead of
//! this one; a job that does not say how long it runs counts as running forever). Only when
//! every one of them is admitted — with its real geometry: whole GPUs, MIG
//! instances on their start slots, GPU shares, CPU and memory, its clouds, regions and spot
//! flag, its team's quota — is the node a candidate. Candidates are tried emptiest first (least
//! GPU in use, then the dearest), each on the fleet as the earlier ones in the same round left
//! it; a node that receives work in a round is not emptied in the same round.
//!
//! A node qualifies only when:
//! - its set of jobs has not changed for [`ConsolidationSettings::after`] (work that just
//!   arrived or left is not moved again at once: Karpenter's `consolidateAfter`);
//! - every job on it lies wholly on it (a multi-node gang would restart whole), is not already
//!   draining, checkpoints (moving a job that does not would lose its work), and, with a
//!   deadline, has slack for two more restarts;
//! - moving pays: releasing the node saves its price for the horizon — the shorter of
//!   [`ConsolidationSettings::horizon_hours`] and the longest remaining work of its jobs, when
//!   every one says — and that must be at least [`ConsolidationSettings::min_saving_ratio`]
//!   times the cost of moving: each job's restart, at its share of the node's price. A node
//!   whose jobs all end within `after` is left to empty itself (the idle release takes it).
//!
//! # Replacing a node with a cheaper one
//!
//! When the work fits nowhere else — a one-GPU job left alone on an eight-GPU node after the
//! gang it shared it with finished — the node may still be worth replacing (Karpenter's
//! replace consolidation): the offers the caller passes (available ones) are tried cheapest
//! first, each as one hypothetical node of its own on which the scheduler must place every job
//! of the node. The first that takes them all, whose expected hourly cost (a spot pool's price
//! with its observed interruptions, as the planner counts it) is below the node's price by
//! enough to pay for the restarts within the horizon, is the replacement. As Karpenter does, the
//! reconciler buys it first and drains the node only once the replacement is ready and still
//! empty; the drained jobs then land on it. A replacement that cannot be had (a spot crunch
//! the offers do not show yet) costs one refused call and the node keeps its work, rather
//! than a restart and a second node bought at the old price.
//!
//! The reconciler runs it only when no job waits for capacity (free capacity then has no better
//! use than taking the work of an emptier node), and drains at most
//! [`ConsolidationSettings::max_nodes`] nodes per round (a disruption budget).

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Duration, Utc};
use spotplane_core::{Cloud, JobId, Micros, NodeId};

use spotplane_core::Market;
use spotplane_providers::Offer;

use crate::planner::{PoolStats, expected_hourly};
use crate::scheduler::policies::BestFit;
use crate::scheduler::{
    GpuSnap, NodeSnap, QueuedJob, SchedulerConfig, Snapshot, packing, schedule,
};

/// Tunables of consolidation.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsolidationSettings {
    pub enabled: bool,
    /// A node's set of jobs must have stayed the same this long before they are moved.
    pub after: Duration,
    /// How far ahead the saving of a released node is counted, in hours.
    pub horizon_hours: f64,
    /// The saving must be at least this many times the cost of moving the work.
    pub min_saving_ratio: f64,
    /// Nodes drained in one round at most.
    pub max_nodes: usize,
    /// Candidate nodes simulated in one round at most (each is one scheduling run).
    pub max_candidates: usize,
    /// Cheaper offers tried as a replacement per node at most.
    pub max_replacements: usize,
    /// Rework assumed per interruption of a replacement on spot, in hours.
    pub rework_hours: f64,
}

impl Default for ConsolidationSettings {
    fn default() -> Self {
        ConsolidationSettings {
            enabled: true,
            after: Duration::minutes(10),
            horizon_hours: 1.0,
            min_saving_ratio: 2.0,
            max_nodes: 1,
            max_candidates: 8,
            max_replacements: 4,
            rework_hours: 0.25,
        }
    }
}

/// What the capacity loop knows of a running job beyond the scheduler's view.
#[derive(Debug, Clone, PartialEq)]
pub struct MovableJob {
    /// Allowed clouds and regions; any when empty.
    pub clouds: Vec<Cloud>,
    pub regions: Vec<String>,
    pub spot: bool,
    /// It names a container image (see `QueuedJob::image`).
    pub image: bool,
    /// Whether it checkpoints; a job that does not is never moved.
    pub checkpoints: bool,
    /// Compute it still needs, in hours, when known.
    pub remaining_hours: Option<f64>,
    /// What a restart costs it, in hours (the drain's checkpoint, a start and the restore).
    pub restart_hours: f64,
    pub deadline: Option<DateTime<Utc>>,
}

/// A node's price and since when its set of jobs has been what it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeCost {
    pub price: Micros,
    pub stable_since: DateTime<Utc>,
}

/// A node to empty.
#[derive(Debug, Clone, PartialEq)]
pub struct Consolidation {
    pub node: NodeId,
    /// The jobs that move.
    pub jobs: Vec<JobId>,
    /// Where the simulation placed them (none when they go to a replacement).
    pub targets: Vec<NodeId>,
    /// The cheaper offer that takes all of them, when no node of the fleet can.
    pub replacement: Option<Offer>,
    /// What giving the node back saves per hour: its price, less the replacement's expected
    /// cost.
    pub saving_hourly: Micros,
    /// The cost of moving: each job's restart at its share of the node's price.
    pub move_cost: Micros,
}

/// Everything one consolidation round looks at besides the settings.
#[derive(Debug, Clone, Copy)]
pub struct ConsolidationInput<'a> {
    /// Nodes and the jobs holding capacity (queued jobs are not looked at).
    pub snapshot: &'a Snapshot,
    pub jobs: &'a HashMap<JobId, MovableJob>,
    pub nodes: &'a HashMap<NodeId, NodeCost>,
    /// Offers a replacement may come from (those set aside already left out).
    pub offers: &'a [Offer],
    pub pools: &'a PoolStats,
}

/// The nodes to empty this round, in the order they were chosen. Deterministic.
pub fn consolidate(
    now: DateTime<Utc>,
    input: ConsolidationInput<'_>,
    s: &ConsolidationSettings,
) -> Vec<Consolidation> {
    let ConsolidationInput {
        snapshot: snap,
        jobs,
        nodes,
        offers,
        pools,
    } = input;
    let mut out = Vec::new();
    if !s.enabled || s.max_nodes == 0 {
        return out;
    }
    // Jobs per node, and the nodes each job touches.
    let mut on_node: HashMap<NodeId, Vec<usize>> = HashMap::new();
    for (i, r) in snap.running.iter().enumerate() {
        let mut seen = BTreeSet::new();
        for p in &r.placements {
            if seen.insert(p.node) {
                on_node.entry(p.node).or_default().push(i);
            }
        }
    }
    let after_hours = s.after.num_seconds() as f64 / 3600.0;
    let mut candidates: Vec<(u64, i64, NodeId)> = Vec::new();
    for n in &snap.nodes {
        let (Some(cost), Some(held)) = (nodes.get(&n.id), on_node.get(&n.id)) else {
            continue;
        };
        if !n.schedulable || now - cost.stable_since < s.after {
            continue;
        }
        let movable = held.iter().all(|&i| {
            let r = &snap.running[i];
            let Some(m) = jobs.get(&r.id) else {
                return false;
            };
            let slack_ok = match (m.deadline, m.remaining_hours) {
                (Some(d), Some(w)) => {
                    (d - now).num_seconds() as f64 / 3600.0 - w >= 2.0 * m.restart_hours
                }
                (Some(d), None) => d > now,
                (None, _) => true,
            };
            !r.draining && m.checkpoints && slack_ok && r.placements.iter().all(|p| p.node == n.id)
        });
        // Work that ends soon frees the node by itself.
        let ends_soon = held.iter().all(|&i| {
            jobs.get(&snap.running[i].id)
                .and_then(|m| m.remaining_hours)
                .is_some_and(|w| w < after_hours)
        });
        if movable && !ends_soon {
            let used: u64 = held.iter().map(|&i| milli_on(&snap.running[i], n.id)).sum();
            candidates.push((used, -cost.price.0, n.id));
        }
    }
    candidates.sort();

    let cfg = simulation_config();
    // The fleet as the drains chosen so far leave it.
    let mut world = Snapshot {
        nodes: snap.nodes.clone(),
        running: snap.running.clone(),
        queued: Vec::new(),
        teams: snap.teams.clone(),
    };
    let mut receiving: BTreeSet<NodeId> = BTreeSet::new();
    for (_, _, node) in candidates.into_iter().take(s.max_candidates) {
        if out.len() >= s.max_nodes {
            break;
        }
        if receiving.contains(&node) {
            continue;
        }
        let Some(cost) = nodes.get(&node) else {
            continue;
        };
        let mut trial = world.clone();
        let Some(at) = trial.nodes.iter().position(|n| n.id == node) else {
            continue;
        };
        trial.nodes[at].schedulable = false;
        let node_milli = node_milli(&trial.nodes[at]);
        let (moving, staying): (Vec<_>, Vec<_>) = std::mem::take(&mut trial.running)
            .into_iter()
            .partition(|r| r.placements.iter().any(|p| p.node == node));
        trial.running = staying;
        let mut move_cost = 0.0;
        let mut longest: Option<f64> = Some(0.0);
        for r in &moving {
            let Some(m) = jobs.get(&r.id) else {
                continue;
            };
            let share = (milli_on(r, node) as f64 / node_milli).min(1.0);
            move_cost += m.restart_hours * share * cost.price.0 as f64;
            longest = match (longest, m.remaining_hours) {
                (Some(l), Some(w)) => Some(l.max(w)),
                _ => None,
            };
            trial.queued.push(QueuedJob {
                id: r.id,
                team: r.team.clone(),
                priority: r.priority,
                requeued: true,
                nominated: false,
                replicas: r.placements.len() as u32,
                shape: r.shape.clone(),
                clouds: m.clouds.clone(),
                regions: m.regions.clone(),
                spot: m.spot,
                image: m.image,
            });
        }
        // Work goes onto nodes whose own work lasts at least as long as the work moved (an
        // unknown length counts as forever): an empty node is given back by the idle release,
        // and work put on a node about to empty would keep that node instead of this one.
        let lasts = lasting(&trial, jobs);
        for n in &mut trial.nodes {
            n.schedulable &= match (lasts.get(&n.id), longest) {
                (None, _) => false,
                (Some(None), _) => true,
                (Some(Some(_)), None) => false,
                (Some(Some(t)), Some(l)) => *t >= l,
            };
        }
        let horizon = longest.map_or(s.horizon_hours, |l| l.min(s.horizon_hours));
        let pays = |saving_hourly: f64| {
            let saving = saving_hourly * horizon;
            saving > 0.0 && saving >= s.min_saving_ratio * move_cost
        };
        if !pays(cost.price.0 as f64) {
            continue;
        }
        let decisions = schedule(&trial, &BestFit, &cfg, now);
        if decisions.admissions.len() != moving.len() {
            let restart = moving
                .iter()
                .filter_map(|r| jobs.get(&r.id))
                .map(|m| m.restart_hours)
                .fold(0.0, f64::max);
            if let Some((offer, expected)) = replacement(
                now, &trial, &moving, jobs, offers, pools, restart, cost.price, s,
            ) && pays(cost.price.0 as f64 - expected)
            {
                out.push(Consolidation {
                    node,
                    jobs: moving.iter().map(|r| r.id).collect(),
                    targets: Vec::new(),
                    replacement: Some(offer),
                    saving_hourly: Micros((cost.price.0 as f64 - expected).round() as i64),
                    move_cost: Micros(move_cost.round() as i64),
                });
                // The work leaves the fleet until the replacement is bought.
                world.nodes.retain(|n| n.id != node);
                world
                    .running
                    .retain(|r| !r.placements.iter().any(|p| p.node == node));
            }
            continue;
        }
        let mut targets = BTreeSet::new();
        let mut moved = moving;
        for r in &mut moved {
            let Some(a) = decisions.admissions.iter().find(|a| a.job == r.id) else {
                continue;
            };
            r.placements = a.placements.clone();
            targets.extend(a.placements.iter().map(|p| p.node));
        }
        trial.running.extend(moved.iter().cloned());
        trial.queued.clear();
        receiving.extend(targets.iter().copied());
        out.push(Consolidation {
            node,
            jobs: moved.iter().map(|r| r.id).collect(),
            targets: targets.into_iter().collect(),
            replacement: None,
            saving_hourly: cost.price,
            move_cost: Micros(move_cost.round() as i64),
        });
        world = trial;
    }
    out
}

/// Per node holding work, how long its work lasts in hours: the longest remaining work of its
/// jobs, `None` when some job does not say.
fn lasting(snap: &Snapshot, jobs: &HashMap<JobId, MovableJob>) -> HashMap<NodeId, Option<f64>> {
    let mut out: HashMap<NodeId, Option<f64>> = HashMap::new();
    for r in &snap.running {
        let left = jobs.get(&r.id).and_then(|m| m.remaining_hours);
        for p in &r.placements {
            let e = out.entry(p.node).or_insert(Some(0.0));
            *e = match (*e, left) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
    }
    out
}

/// The cheapest offer, cheaper than `price` in expected cost, on one node of which the scheduler
/// places every job of `moving`; with its expected hourly cost.
#[allow(clippy::too_many_arguments)]
fn replacement(
    now: DateTime<Utc>,
    trial: &Snapshot,
    moving: &[crate::scheduler::RunningJob],
    jobs: &HashMap<JobId, MovableJob>,
    offers: &[Offer],
    pools: &PoolStats,
    restart_hours: f64,
    price: Micros,
    s: &ConsolidationSettings,
) -> Option<(Offer, f64)> {
    let allowed = |o: &Offer| {
        moving.iter().all(|r| {
            jobs.get(&r.id).is_some_and(|m| {
                (m.clouds.is_empty() || m.clouds.contains(&o.cloud))
                    && (m.regions.is_empty() || m.regions.iter().any(|g| **g == *o.region))
                    && (m.spot || o.market == Market::OnDemand)
            })
        })
    };
    let mut cheaper: Vec<(f64, &Offer)> = offers
        .iter()
        .filter(|o| allowed(o))
        .map(|o| {
            let rate = pools.rate(o);
            (
                expected_hourly(o.price, 1, rate, s.rework_hours, restart_hours),
                o,
            )
        })
        .filter(|(e, _)| *e < price.0 as f64)
        .collect();
    cheaper.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.id().cmp(&b.1.id())));
    let cfg = simulation_config();
    for (expected, offer) in cheaper.into_iter().take(s.max_replacements) {
        let Some(model) = offer.gpu_model else {
            continue;
        };
        let one = Snapshot {
            nodes: vec![NodeSnap {
                id: NodeId(uuid::Uuid::nil()),
                cloud: offer.cloud,
                region: offer.region.to_string(),
                zone: offer.zone.to_string(),
                market: offer.market,
                schedulable: true,
                runs_images: true,
                cpu_milli: u64::from(offer.vcpus) * 1000,
                memory_mib: offer.memory_mib,
                gpu_model: Some(model),
                gpus: vec![GpuSnap::Plain; offer.gpu_count as usize],
            }],
            running: Vec::new(),
            queued: trial.queued.clone(),
            teams: trial.teams.clone(),
        };
        if schedule(&one, &BestFit, &cfg, now).admissions.len() == moving.len() {
            return Some((offer.clone(), expected));
        }
    }
    None
}

/// How the scheduler is run to see where work would go: no preemption (moving work must not
/// push other work out) and no MIG re-layout (a re-layout is not a place to run yet).
fn simulation_config() -> SchedulerConfig {
    SchedulerConfig {
        preemption: false,
        dynamic_mig: false,
        ..SchedulerConfig::default()
    }
}

/// GPU-milli job `r` holds on `node`: its shape's share per replica (as quotas count it)
/// times its replicas there; CPU-only work holds none.
fn milli_on(r: &crate::scheduler::RunningJob, node: NodeId) -> u64 {
    let replicas = r.placements.iter().filter(|p| p.node == node).count() as u64;
    u64::from(r.shape.gpu.gpu_milli()) * replicas
}

fn node_milli(n: &crate::scheduler::NodeSnap) -> f64 {
    (n.gpus.len().max(1) as u64 * u64::from(packing::GPU_MILLI)) as f64
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::TimeZone;
    use proptest::prelude::*;
    use spotplane_core::shape::{GpuShape, ResourceShape};
    use spotplane_core::{GpuModel, Market};

    use super::*;
    use crate::scheduler::{Assigned, GpuSnap, NodeSnap, Placement, RunningJob, TeamSnap};

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0)
            .single()
            .expect("time")
    }

    fn nid(n: u128) -> NodeId {
        NodeId(uuid::Uuid::from_u128(n))
    }

    fn jid(n: u128) -> JobId {
        JobId(uuid::Uuid::from_u128(n))
    }

    fn node(n: u128) -> NodeSnap {
        NodeSnap {
            id: nid(n),
            cloud: Cloud::Aws,
            region: "us-east-1".into(),
            zone: "us-east-1a".into(),
            market: Market::Spot,
            schedulable: true,
            runs_images: true,
            cpu_milli: 96_000,
            memory_mib: 1024 * 1024,
            gpu_model: Some(GpuModel::A100_80GB),
            gpus: vec![GpuSnap::Plain; 8],
        }
    }

    /// A job of `gpus` whole GPUs per replica, replica `r` on `nodes[r]` from GPU `first[r]`.
    fn job(id: u128, gpus: u32, at: &[(u128, u32)]) -> RunningJob {
        RunningJob {
            id: jid(id),
            team: "research".parse().expect("team"),
            priority: 0,
            shape: ResourceShape {
                gpu: GpuShape::Whole {
                    gpus,
                    models: vec![],
                },
                cpu_milli: 1000,
                memory_mib: 1024,
            },
            placements: at
                .iter()
                .enumerate()
                .map(|(r, (n, first))| Placement {
                    replica: r as u32,
                    node: nid(*n),
                    assigned: Assigned::Whole((*first..*first + gpus).collect()),
                })
                .collect(),
            draining: false,
            progress_since: now(),
        }
    }

    fn movable() -> MovableJob {
        MovableJob {
            clouds: vec![],
            regions: vec![],
            spot: true,
            image: false,
            checkpoints: true,
            remaining_hours: None,
            restart_hours: 0.1,
            deadline: None,
        }
    }

    struct Case {
        nodes: Vec<NodeSnap>,
        running: Vec<RunningJob>,
        jobs: HashMap<JobId, MovableJob>,
        costs: HashMap<NodeId, NodeCost>,
        offers: Vec<Offer>,
        settings: ConsolidationSettings,
    }

    impl Case {
        /// Nodes `1..=n`, each $10/h, steady for an hour; every job movable.
        fn new(n: u128, running: Vec<RunningJob>) -> Case {
            Case {
                nodes: (1..=n).map(node).collect(),
                jobs: running.iter().map(|r| (r.id, movable())).collect(),
                running,
                costs: (1..=n)
                    .map(|i| {
                        (
                            nid(i),
                            NodeCost {
                                price: Micros::from_dollars(10),
                                stable_since: now() - Duration::hours(1),
                            },
                        )
                    })
                    .collect(),
                offers: Vec::new(),
                settings: ConsolidationSettings {
                    max_nodes: 8,
                    ..ConsolidationSettings::default()
                },
            }
        }

        fn run(&self) -> Vec<Consolidation> {
            let snap = Snapshot {
                nodes: self.nodes.clone(),
                running: self.running.clone(),
                queued: vec![],
                teams: vec![TeamSnap {
                    name: "research".parse().expect("team"),
                    weight: 1.0,
                    cohort: None,
                    quotas: BTreeMap::new(),
                }],
            };
            let input = ConsolidationInput {
                snapshot: &snap,
                jobs: &self.jobs,
                nodes: &self.costs,
                offers: &self.offers,
                pools: &PoolStats::default(),
            };
            consolidate(now(), input, &self.settings)
        }

        fn drained(&self) -> Vec<NodeId> {
            self.run().into_iter().map(|c| c.node).collect()
        }
    }

    /// Job 1 (one GPU) on node 1, job 2 (four GPUs, pinned: it does not checkpoint) on node 2.
    fn pair() -> Case {
        let mut c = Case::new(2, vec![job(1, 1, &[(1, 0)]), job(2, 4, &[(2, 0)])]);
        c.jobs.get_mut(&jid(2)).expect("job").checkpoints = false;
        c
    }

    #[test]
    fn a_node_whose_work_fits_on_another_is_drained_and_the_work_goes_there() {
        let c = pair();
        let out = c.run();
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].node, nid(1));
        assert_eq!(out[0].jobs, vec![jid(1)]);
        assert_eq!(out[0].targets, vec![nid(2)]);
        assert_eq!(out[0].saving_hourly, Micros::from_dollars(10));
        // One restart of 0.1 h at one eighth of $10/h.
        assert_eq!(out[0].move_cost, Micros(125_000));
    }

    #[test]
    fn a_node_whose_work_fits_nowhere_else_is_kept() {
        let c = Case::new(2, vec![job(1, 5, &[(1, 0)]), job(2, 4, &[(2, 0)])]);
        assert_eq!(c.drained(), vec![]);
    }

    #[test]
    fn an_empty_node_is_left_to_the_idle_release() {
        let c = Case::new(2, vec![job(2, 4, &[(2, 0)])]);
        assert_eq!(c.drained(), vec![]);
    }

    #[test]
    fn work_that_just_changed_is_not_moved_again() {
        let mut c = pair();
        for cost in c.costs.values_mut() {
            cost.stable_since = now() - Duration::minutes(3);
        }
        assert_eq!(c.drained(), vec![]);
    }

    #[test]
    fn a_job_that_does_not_checkpoint_keeps_its_node() {
        let mut c = pair();
        c.jobs.get_mut(&jid(1)).expect("job").checkpoints = false;
        assert_eq!(c.drained(), vec![]);
    }

    #[test]
    fn a_gang_across_nodes_is_not_moved() {
        // Job 1 holds one GPU on each of nodes 1 and 2: neither node is drained for it, while
        // node 3's job moves onto one of them.
        let c = Case::new(3, vec![job(1, 1, &[(1, 0), (2, 0)]), job(2, 2, &[(3, 0)])]);
        assert_eq!(c.drained(), vec![nid(3)]);
    }

    #[test]
    fn a_draining_job_is_not_moved() {
        let mut c = pair();
        c.running[0].draining = true;
        assert_eq!(c.drained(), vec![]);
    }

    #[test]
    fn a_job_near_its_deadline_is_not_moved() {
        let mut c = pair();
        let m = c.jobs.get_mut(&jid(1)).expect("job");
        m.remaining_hours = Some(2.0);
        m.deadline = Some(now() + Duration::minutes(130));
        assert_eq!(c.drained(), vec![]);
        c.jobs.get_mut(&jid(1)).expect("job").deadline = Some(now() + Duration::hours(3));
        assert_eq!(c.drained(), vec![nid(1)]);
    }

    #[test]
    fn work_that_ends_soon_frees_its_node_by_itself() {
        let mut c = pair();
        c.jobs.get_mut(&jid(1)).expect("job").remaining_hours = Some(0.1);
        assert_eq!(c.drained(), vec![]);
    }

    #[test]
    fn the_saving_must_outweigh_the_restarts() {
        // Four GPUs of eight move: half the node's price for each restart hour. 0.25 h left
        // saves 0.25 h of the node; restarts of 0.3 h cost 2 × 0.15 h of it: not worth it.
        let mut c = Case::new(2, vec![job(1, 4, &[(1, 0)]), job(2, 2, &[(2, 0)])]);
        c.jobs.get_mut(&jid(2)).expect("job").checkpoints = false;
        let m = c.jobs.get_mut(&jid(1)).expect("job");
        m.remaining_hours = Some(0.25);
        m.restart_hours = 0.3;
        assert_eq!(c.drained(), vec![]);
        c.jobs.get_mut(&jid(1)).expect("job").restart_hours = 0.1;
        assert_eq!(c.drained(), vec![nid(1)]);
    }

    #[test]
    fn the_job_constraints_hold_in_the_simulation() {
        // Job 1 may run on on-demand capacity only; node 2 is spot.
        let mut c = pair();
        c.nodes[0].market = Market::OnDemand;
        c.jobs.get_mut(&jid(1)).expect("job").spot = false;
        assert_eq!(c.drained(), vec![]);
    }

    #[test]
    fn emptiest_first_and_a_node_that_receives_work_is_not_emptied_in_the_same_round() {
        let c = Case::new(
            3,
            vec![
                job(1, 1, &[(1, 0)]),
                job(2, 2, &[(2, 0)]),
                job(3, 3, &[(3, 0)]),
            ],
        );
        let out = c.run();
        assert_eq!(out.first().map(|c| c.node), Some(nid(1)));
        for a in &out {
            for b in &out {
                assert!(!b.targets.contains(&a.node), "{out:?}");
            }
        }
        // Everything ends on one node: two drained.
        assert_eq!(out.len(), 2, "{out:?}");
    }

    #[test]
    fn the_disruption_budget_caps_a_round() {
        let mut c = Case::new(
            4,
            vec![
                job(1, 1, &[(1, 0)]),
                job(2, 1, &[(2, 0)]),
                job(3, 1, &[(3, 0)]),
                job(4, 4, &[(4, 0)]),
            ],
        );
        c.settings.max_nodes = 1;
        assert_eq!(c.drained().len(), 1);
        c.settings.enabled = false;
        assert_eq!(c.drained(), vec![]);
    }

    fn offer(gpus: u32, usd: i64, market: Market) -> Offer {
        Offer {
            cloud: Cloud::Aws,
            region: "us-east-1".into(),
            zone: "us-east-1a".into(),
            instance_type: format!("a100x{gpus}").into(),
            market,
            gpu_model: Some(GpuModel::A100_80GB),
            gpu_count: gpus,
            vcpus: 12 * gpus,
            memory_mib: 96 * 1024 * u64::from(gpus),
            price: Micros::from_dollars(usd),
            on_demand_price: Micros::from_dollars(usd),
            placement_score: None,
            interruption_bucket: None,
            price_source: spotplane_providers::PriceSource::Catalog,
            on_demand_source: spotplane_providers::PriceSource::Catalog,
        }
    }

    /// Job 1 (`gpus` GPUs) alone on node 1; node 2 full with a pinned job.
    fn alone(gpus: u32) -> Case {
        let mut c = Case::new(2, vec![job(1, gpus, &[(1, 0)]), job(2, 8, &[(2, 0)])]);
        c.jobs.get_mut(&jid(2)).expect("job").checkpoints = false;
        c
    }

    #[test]
    fn a_node_whose_work_fits_nowhere_else_is_replaced_by_the_cheapest_offer_that_takes_it() {
        let mut c = alone(1);
        c.offers = vec![
            offer(8, 9, Market::OnDemand),
            offer(1, 3, Market::OnDemand),
            offer(1, 2, Market::OnDemand),
        ];
        let out = c.run();
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].node, nid(1));
        assert!(out[0].targets.is_empty());
        let r = out[0].replacement.as_ref().expect("a replacement");
        assert_eq!((r.gpu_count, r.price), (1, Micros::from_dollars(2)));
        assert_eq!(out[0].saving_hourly, Micros::from_dollars(8));
    }

    #[test]
    fn no_replacement_that_is_too_small_or_not_cheaper() {
        // Two GPUs of work: a one-GPU offer cannot take it; an eight-GPU one costs more.
        let mut c = alone(2);
        c.offers = vec![
            offer(1, 2, Market::OnDemand),
            offer(8, 11, Market::OnDemand),
        ];
        assert_eq!(c.drained(), vec![]);
        // A job that may not use spot is not replaced on spot.
        let mut c = alone(1);
        c.jobs.get_mut(&jid(1)).expect("job").spot = false;
        c.offers = vec![offer(1, 2, Market::Spot)];
        assert_eq!(c.drained(), vec![]);
        // A saving of $0.10/h for one hour does not pay for restarts worth 2 × $0.125.
        let mut c = alone(1);
        c.offers = vec![offer(1, 10, Market::OnDemand)];
        c.offers[0].price = Micros(9_900_000);
        assert_eq!(c.drained(), vec![]);
    }

    proptest! {
        #[test]
        fn drains_only_movable_work_and_never_overfill_the_rest(
            used in proptest::collection::vec(0u32..=8, 1..8),
            steady in proptest::collection::vec(any::<bool>(), 8),
        ) {
            // Node i+1 holds one job of used[i] GPUs (none when 0).
            let running: Vec<RunningJob> = used
                .iter()
                .enumerate()
                .filter(|(_, g)| **g > 0)
                .map(|(i, g)| job(i as u128 + 1, *g, &[(i as u128 + 1, 0)]))
                .collect();
            let mut c = Case::new(used.len() as u128, running);
            for (i, cost) in c.costs.iter_mut() {
                let k = (i.0.as_u128() - 1) as usize;
                if !steady[k] {
                    cost.stable_since = now();
                }
            }
            let out = c.run();
            let drained: BTreeSet<NodeId> = out.iter().map(|c| c.node).collect();
            let mut load: HashMap<NodeId, u32> = HashMap::new();
            for (i, g) in used.iter().enumerate() {
                *load.entry(nid(i as u128 + 1)).or_default() += g;
            }
            for d in &out {
                let k = (d.node.0.as_u128() - 1) as usize;
                prop_assert!(steady[k] && used[k] > 0);
                prop_assert!(d.targets.iter().all(|t| !drained.contains(t)));
                prop_assert_eq!(d.targets.len(), 1);
                let moved = load.remove(&d.node).unwrap_or(0);
                *load.entry(d.targets[0]).or_default() += moved;
            }
            prop_assert!(load.values().all(|g| *g <= 8), "{load:?}");
            let total: u32 = used.iter().sum();
            let kept = used.len() - drained.len();
            prop_assert!(total <= 8 * kept as u32);
        }
    }
}
