//! The embedded scheduler: a pure function from a snapshot to decisions.
//!
//! [`schedule`] takes the cluster as the store last saw it — nodes with their GPUs and MIG
//! layouts, the jobs holding capacity, the queued jobs, the teams — and returns what to do:
//! admissions with exact placements, preemptions, MIG re-layouts, and the demand no node can
//! take. It does no I/O, reads no clock (`now` is an argument) and holds nothing between
//! cycles; a reconciler in the control plane runs it against the store and carries out what
//! it decides.
//!
//! The cycle, in order:
//! 1. Build the working state: every node's capacity, minus what running jobs hold.
//! 2. Account each team's usage per resource flavour and its dominant share.
//! 3. Queue each team's jobs by priority; within a priority, requeued (preempted) jobs first,
//!    then FIFO.
//! 4. Repeatedly take the next job of the team with the smallest weighted dominant share:
//!    - keep to the models the team's quota (plus what it may borrow) still allows;
//!    - place the whole gang or nothing: one node if it fits there, else one zone;
//!    - if it does not fit, preempt lower-priority jobs of the same team, or jobs another
//!      team borrowed from a team now reclaiming its nominal quota, cheapest victims first;
//!    - if still not, re-lay idle MIG GPUs (or turn them back into whole GPUs) to fit;
//!    - otherwise report it as unmet demand for the capacity planner.
//!
//! A request that fails placement is remembered for the rest of the cycle (capacity only
//! shrinks within a cycle), so the next job with the same request fails in O(1): that is what
//! keeps a cycle over 100,000 queued jobs short. Steps 1–2 and step 3 are independent: with a
//! large queue (≥ 4,096 jobs) step 3 runs on a second thread (scoped, joined before step 4),
//! with the same result as in line.

pub mod fairshare;
pub mod frag;
pub mod packing;
pub mod policies;
pub mod snapshot;
pub mod state;

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::rc::Rc;

use rustc_hash::FxHashMap;

use chrono::{DateTime, Utc};
use spotplane_core::mig::MigClass;
use spotplane_core::shape::GpuShape;
use spotplane_core::team::QuotaResource;
use spotplane_core::{Cloud, GpuModel, JobId, Market, MigInstance, MigLayout};

use fairshare::Accounts;
use packing::{Devices, PackNode, PackPod, PackingPolicy, ScoreCtx};
pub use snapshot::*;
use state::{State, Want};

/// Tunables of the scheduler.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Feasible nodes the packing policy scores for one replica (the index supplies them best
    /// fit first; more candidates, better packing, slower cycles).
    pub candidates: usize,
    pub preemption: bool,
    /// Jobs that may search for victims in one cycle (bounds a cycle's work when a large
    /// queue of high-priority jobs meets a full cluster).
    pub max_preemption_attempts: usize,
    /// Victims a gang tries at most, cheapest first.
    pub preemption_candidates: usize,
    /// Nodes a single replica examines for victims at most.
    pub preemption_nodes: usize,
    pub dynamic_mig: bool,
    /// Set by whoever runs the cycle to stop it early (shutdown): the cycle then returns the
    /// decisions made so far, which the caller drops. Read once per job.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            candidates: 8,
            preemption: true,
            max_preemption_attempts: 1000,
            preemption_candidates: 64,
            preemption_nodes: 64,
            dynamic_mig: true,
            stop: None,
        }
    }
}

/// One replica's needs in the terms the state understands.
#[derive(Debug, Clone, Copy)]
struct Need {
    cpu: i64,
    mem: i64,
}

/// A job's placement constraints besides its shape.
struct Filter<'a> {
    clouds: &'a [Cloud],
    regions: &'a [String],
    spot: bool,
    zone: Option<u16>,
    /// The job runs a container image.
    image: bool,
}

impl Filter<'_> {
    fn admits(&self, n: &state::NodeState) -> bool {
        n.schedulable
            && (!self.image || n.runs_images)
            && (self.clouds.is_empty() || self.clouds.contains(&n.cloud))
            && (self.regions.is_empty() || self.regions.iter().any(|r| **r == *n.region))
            && (self.spot || n.market == Market::OnDemand)
            && self.zone.is_none_or(|z| z == n.zone)
    }
}

/// What the index is asked for on `model` for one replica of `shape`.
fn want_on(shape: &GpuShape, model: GpuModel) -> Option<Want> {
    match shape {
        GpuShape::Whole { gpus: 0, .. } => Some(Want::CpuOnly),
        GpuShape::Whole { gpus, .. } => Some(Want::Whole(*gpus)),
        GpuShape::Shared { gpu_milli, .. } if *gpu_milli >= packing::GPU_MILLI => {
            Some(Want::Whole(1))
        }
        GpuShape::Shared { gpu_milli, .. } => Some(Want::Share(*gpu_milli)),
        GpuShape::Mig { profile, .. } => profile.class_on(model).map(Want::Mig),
    }
}

/// The key under which a failed placement is remembered for the rest of the cycle.
/// The key under which a failed attempt is remembered for the rest of the cycle: the job's
/// request class (shape, replicas and constraints) and the models its quota allowed.
type FailKey = (u32, frag::ModelSet);

/// What makes two jobs' requests the same for placement, CPU and memory aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct RequestClass<'a> {
    shape: &'a GpuShape,
    replicas: u32,
    clouds: &'a [Cloud],
    regions: &'a [String],
    spot: bool,
    image: bool,
}

/// A queued job as the cycle's queues hold it.
#[derive(Clone, Copy)]
struct Queued<'a> {
    /// Priority, requeued, id: the queue is sorted on it, worst first.
    key: (i32, bool, Reverse<u128>),
    job: &'a QueuedJob,
    class: u32,
    need: Need,
}

/// Failed attempts of the cycle. Within a cycle capacity only shrinks, so a request that
/// failed with (cpu, mem) fails again with as much or more of both: a failure dominates.
#[derive(Debug)]
struct FailMemo<K> {
    failed: FxHashMap<K, Vec<(i64, i64)>>,
}

impl<K> Default for FailMemo<K> {
    fn default() -> Self {
        FailMemo {
            failed: FxHashMap::default(),
        }
    }
}

impl<K: std::hash::Hash + Eq> FailMemo<K> {
    fn has_failed(&self, key: &K, need: Need) -> bool {
        self.failed
            .get(key)
            .is_some_and(|v| v.iter().any(|&(c, m)| need.cpu >= c && need.mem >= m))
    }

    fn record(&mut self, key: K, need: Need) {
        let v = self.failed.entry(key).or_default();
        v.retain(|&(c, m)| !(c >= need.cpu && m >= need.mem));
        v.push((need.cpu, need.mem));
    }
}

/// A request shape as the packing policy sees it: cpu, GPUs, milli per GPU, allowed models.
type ScoreKey = (i64, u32, u32, frag::ModelSet);

/// f64 ordered for the team heap.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Share(f64);
impl Eq for Share {}
impl PartialOrd for Share {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Share {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

struct Cycle<'a> {
    /// Preemption searches made this cycle.
    preemption_work: usize,
    /// Per running job (snapshot index): the work a preemption would lose.
    costs: Vec<u64>,
    snap: &'a Snapshot,
    policy: &'a dyn PackingPolicy,
    cfg: &'a SchedulerConfig,
    state: State,
    accounts: Accounts,
    /// Running jobs by id: their team index and whether they are draining (or chosen as
    /// victims this cycle).
    running: Vec<(usize, bool)>,
    /// Per running job: the GPU model of the node its first replica runs on.
    run_model: Vec<Option<GpuModel>>,
    failed: FailMemo<FailKey>,
    /// Policy scores by (node, request shape), with the node version they were computed at.
    scores: FxHashMap<(u32, ScoreKey), (u32, packing::Choice)>,
    /// Re-layouts that found nothing, and preemptions that found no victims, this cycle.
    failed_relayout: FailMemo<FailKey>,
    failed_preempt: FailMemo<(usize, i32, FailKey)>,
    /// Preemptions to make room within quota that found no victims, per (team, priority, class).
    failed_quota_preempt: FailMemo<(usize, i32, u32)>,
    /// Instances that re-layouts ordered this cycle add beyond what their jobs need: per
    /// (model, class), the node and how many are not yet promised to a waiting job.
    spare_instances: FxHashMap<(GpuModel, MigClass), Vec<(u32, u32)>>,
    /// Per request class: the models its shape may use.
    classes: Vec<Rc<[GpuModel]>>,
    /// Per request class: its first job, whose placement fields every job of it shares.
    class_job: Vec<&'a QueuedJob>,
    /// The running jobs of each team (indexes into the snapshot), cheapest victims first.
    by_team: Vec<Vec<usize>>,
    seq: u64,
    out: Decisions,
}

type VictimOrder = (u64, i32, Reverse<u128>);

/// The order victims are tried in: the least work lost first, then the lowest priority, then
/// the newest job.
fn victim_order(costs: &[u64], running: &[RunningJob], k: usize) -> VictimOrder {
    (
        costs[k],
        running[k].priority,
        Reverse(running[k].id.0.as_u128()),
    )
}

/// Runs one scheduling cycle.
pub fn schedule(
    snap: &Snapshot,
    policy: &dyn PackingPolicy,
    cfg: &SchedulerConfig,
    now: DateTime<Utc>,
) -> Decisions {
    schedule_with(snap, policy, cfg, now, snap.queued.len() >= PARALLEL_QUEUES)
}

/// [`schedule`], building the queues on a second thread or in line.
fn schedule_with(
    snap: &Snapshot,
    policy: &dyn PackingPolicy,
    cfg: &SchedulerConfig,
    now: DateTime<Utc>,
    parallel: bool,
) -> Decisions {
    let mut gpu_capacity: FxHashMap<GpuModel, u64> = FxHashMap::default();
    let mut cpu_capacity = 0;
    for n in &snap.nodes {
        if let Some(m) = n.gpu_model {
            *gpu_capacity.entry(m).or_insert(0) +=
                n.gpus.len() as u64 * u64::from(packing::GPU_MILLI);
        }
        cpu_capacity += n.cpu_milli;
    }
    // 2. Accounts.
    let accounts = Accounts::new(&snap.teams, gpu_capacity, cpu_capacity);
    // 3. (on a second core, while the state is built) Per-team queues, best first.
    let known = accounts.name_index();
    std::thread::scope(|scope| {
        let queues = if parallel {
            QueuesBuild::Running(scope.spawn(|| TeamQueues::build(&snap.queued, &known)))
        } else {
            QueuesBuild::Done(TeamQueues::build(&snap.queued, &known))
        };
        run_cycle(snap, policy, cfg, now, accounts, queues)
    })
}

/// Queued jobs at or above which the queues are built on a second thread.
const PARALLEL_QUEUES: usize = 4096;

enum QueuesBuild<'scope, 'a> {
    Running(std::thread::ScopedJoinHandle<'scope, TeamQueues<'a>>),
    Done(TeamQueues<'a>),
}

/// The queued jobs in per-team queues, sorted worst first, with their request classes
/// interned. Teams are keyed by their index among the snapshot's teams; a team the snapshot
/// does not list gets a key past those, in order of first appearance (`new_teams`).
struct TeamQueues<'a> {
    queues: Vec<Vec<Queued<'a>>>,
    new_teams: Vec<&'a spotplane_core::TeamName>,
    /// Per class, the first job of it.
    class_job: Vec<&'a QueuedJob>,
}

impl<'a> TeamQueues<'a> {
    fn build(queued: &'a [QueuedJob], known: &FxHashMap<spotplane_core::TeamName, usize>) -> Self {
        // Keys past every known index (indexes need not be dense).
        let base = known.values().max().map_or(0, |m| m + 1);
        let mut out = TeamQueues {
            queues: vec![Vec::new(); base],
            new_teams: Vec::new(),
            class_job: Vec::new(),
        };
        let mut new_index: FxHashMap<&'a spotplane_core::TeamName, usize> = FxHashMap::default();
        // Jobs with the same request share a class, interned once, so the cycle's memos are
        // keyed by small integers. Each entry carries its sort key and what a failing attempt
        // reads (queued jobs lie all over memory; the common path never touches the job).
        let mut interned: FxHashMap<RequestClass<'a>, u32> = FxHashMap::default();
        for job in queued {
            let t = match known.get(&job.team) {
                Some(&t) => t,
                None => *new_index.entry(&job.team).or_insert_with(|| {
                    out.new_teams.push(&job.team);
                    out.queues.push(Vec::new());
                    out.queues.len() - 1
                }),
            };
            let rc = RequestClass {
                shape: &job.shape.gpu,
                replicas: job.replicas,
                clouds: &job.clouds,
                regions: &job.regions,
                spot: job.spot,
                image: job.image,
            };
            let next = interned.len() as u32;
            let class = *interned.entry(rc).or_insert_with(|| {
                out.class_job.push(job);
                next
            });
            out.queues[t].push(Queued {
                key: (job.priority, job.requeued, Reverse(job.id.0.as_u128())),
                job,
                class,
                need: Need {
                    cpu: i64::from(job.shape.cpu_milli),
                    mem: job.shape.memory_mib as i64,
                },
            });
        }
        for q in &mut out.queues {
            // Worst first: pop() takes from the back. Ids as integers order as their bytes do.
            q.sort_unstable_by_key(|e| e.key);
        }
        out
    }
}

/// The GPU models, of all there are, that `shape` allows and the team's quota (with what it
/// may borrow) lets a whole gang of `replicas` use now.
fn quota_models<'s>(
    accounts: &'s Accounts,
    team: usize,
    shape: &'s GpuShape,
    replicas: u32,
) -> impl Iterator<Item = GpuModel> + 's {
    GpuModel::ALL.iter().copied().filter(move |&m| {
        shape.allows_model(m)
            && accounts
                .flavour(team, shape, Some(m))
                .is_none_or(|(res, amount)| {
                    accounts.allows(team, res, amount.saturating_mul(u64::from(replicas)))
                })
    })
}

/// For each queued GPU job of a team with quotas, the GPU models its quota lets the whole gang
/// use now, after what the running jobs hold: the only models the capacity planner may buy
/// for it. A job not in the map is not limited by quota (its team has none, or it needs no
/// GPU). Pure, like [`schedule`].
pub fn quota_models_of_queued(snap: &Snapshot) -> FxHashMap<JobId, Vec<GpuModel>> {
    let mut accounts = Accounts::new(&snap.teams, FxHashMap::default(), 0);
    let model_of: FxHashMap<spotplane_core::NodeId, Option<GpuModel>> =
        snap.nodes.iter().map(|n| (n.id, n.gpu_model)).collect();
    for job in &snap.running {
        let team = accounts.team(&job.team);
        for p in &job.placements {
            let model = model_of.get(&p.node).copied().flatten();
            accounts.charge(
                team,
                &job.shape.gpu,
                model,
                u64::from(job.shape.cpu_milli),
                1,
            );
        }
    }
    let mut out = FxHashMap::default();
    for job in &snap.queued {
        let shape = &job.shape.gpu;
        if matches!(shape, GpuShape::Whole { gpus: 0, .. }) {
            continue;
        }
        let team = accounts.team(&job.team);
        if !accounts.is_limited(team) {
            continue;
        }
        out.insert(
            job.id,
            quota_models(&accounts, team, shape, job.replicas).collect(),
        );
    }
    out
}

/// The cycle proper: the working state (capacity minus what running jobs hold) while the queues
/// are built, then one job at a time.
fn run_cycle<'scope, 'a>(
    snap: &'a Snapshot,
    policy: &'a dyn PackingPolicy,
    cfg: &'a SchedulerConfig,
    now: DateTime<Utc>,
    mut accounts: Accounts,
    queues: QueuesBuild<'scope, 'a>,
) -> Decisions {
    // 1. The working state.
    let mut state = State::new(&snap.nodes);
    let mut running = Vec::with_capacity(snap.running.len());
    let mut run_model = Vec::with_capacity(snap.running.len());
    for job in &snap.running {
        let team = accounts.team(&job.team);
        running.push((team, job.draining));
        // The model of the first placement's node (None when that node is unknown).
        let mut first_model = None;
        for (r, p) in job.placements.iter().enumerate() {
            let Some(&i) = state.by_id.get(&p.node) else {
                continue;
            };
            let model = state.nodes[i as usize].model;
            if r == 0 {
                first_model = model;
            }
            state.take(
                i,
                i64::from(job.shape.cpu_milli),
                job.shape.memory_mib as i64,
                &p.assigned,
            );
            accounts.charge(
                team,
                &job.shape.gpu,
                model,
                u64::from(job.shape.cpu_milli),
                1,
            );
        }
        run_model.push(first_model);
    }
    state.index();
    let models = state.models();
    let mut by_team: Vec<Vec<usize>> = vec![Vec::new(); accounts.teams.len()];
    for k in 0..snap.running.len() {
        if let Some(&(t, _)) = running.get(k) {
            if by_team.len() <= t {
                by_team.resize_with(t + 1, Vec::new);
            }
            by_team[t].push(k);
        }
    }

    // What preempting each running job would lose: GPU-milli × replicas × seconds since its
    // last checkpoint. Each team's jobs cheapest first, once per cycle.
    let costs: Vec<u64> = snap
        .running
        .iter()
        .map(|r| {
            let secs = (now - r.progress_since).num_seconds().max(0) as u64;
            u64::from(r.shape.gpu.gpu_milli().max(1)) * r.placements.len() as u64 * secs
        })
        .collect();
    for jobs in &mut by_team {
        let mut keyed: Vec<(VictimOrder, usize)> = jobs
            .iter()
            .map(|&k| (victim_order(&costs, &snap.running, k), k))
            .collect();
        keyed.sort_unstable_by_key(|(key, _)| *key);
        *jobs = keyed.into_iter().map(|(_, k)| k).collect();
    }

    let mut cycle = Cycle {
        preemption_work: 0,
        costs,
        snap,
        policy,
        cfg,
        state,
        accounts,
        running,
        run_model,
        failed: FailMemo::default(),
        scores: FxHashMap::default(),
        failed_relayout: FailMemo::default(),
        failed_preempt: FailMemo::default(),
        failed_quota_preempt: FailMemo::default(),
        spare_instances: FxHashMap::default(),
        classes: Vec::new(),
        class_job: Vec::new(),
        by_team,
        seq: 0,
        out: Decisions::default(),
    };

    // 3. The queues built meanwhile: priority, requeued, then FIFO (ids are time-ordered).
    // A team the snapshot does not list gets its index now, in order of first appearance.
    let built = match queues {
        QueuesBuild::Done(q) => q,
        QueuesBuild::Running(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
    };
    let TeamQueues {
        queues: built_queues,
        new_teams,
        class_job,
    } = built;
    let known = built_queues.len().saturating_sub(new_teams.len());
    let mut queues: Vec<Vec<Queued<'_>>> = Vec::new();
    for (k, q) in built_queues.into_iter().enumerate() {
        let t = match k.checked_sub(known) {
            None => k,
            Some(n) => cycle.accounts.team(new_teams[n]),
        };
        if queues.len() <= t {
            queues.resize_with(t + 1, Vec::new);
        }
        queues[t] = q;
    }
    if queues.len() < cycle.accounts.teams.len() {
        queues.resize_with(cycle.accounts.teams.len(), Vec::new);
    }
    for job in class_job {
        let shape = &job.shape.gpu;
        cycle.class_job.push(job);
        cycle.classes.push(
            models
                .iter()
                .copied()
                .filter(|m| shape.allows_model(*m) && want_on(shape, *m).is_some())
                .collect(),
        );
    }

    // 4. Teams by weighted dominant share, smallest first; one job at a time.
    let mut heap: BinaryHeap<Reverse<(Share, usize)>> = BinaryHeap::new();
    for (t, q) in queues.iter().enumerate() {
        if !q.is_empty() {
            heap.push(Reverse((Share(cycle.accounts.dominant_share(t)), t)));
        }
    }
    while let Some(Reverse((_, t))) = heap.pop() {
        if cfg
            .stop
            .as_ref()
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed))
        {
            break;
        }
        let Some(entry) = queues[t].pop() else {
            continue;
        };
        cycle.try_job(t, &entry);
        if !queues[t].is_empty() {
            heap.push(Reverse((Share(cycle.accounts.dominant_share(t)), t)));
        }
    }
    cycle.out
}

impl<'a> Cycle<'a> {
    /// Position of a running job in the snapshot (it is always an element of
    /// `snap.running`): plain address arithmetic, so no lookup is needed.
    fn run_index(&self, r: &RunningJob) -> Option<usize> {
        let base = self.snap.running.as_ptr() as usize;
        let addr = r as *const RunningJob as usize;
        let k = addr.checked_sub(base)? / std::mem::size_of::<RunningJob>().max(1);
        (k < self.snap.running.len()).then_some(k)
    }

    /// (team, draining) of a running job.
    fn run_entry(&self, r: &RunningJob) -> Option<&(usize, bool)> {
        self.run_index(r).and_then(|k| self.running.get(k))
    }

    fn run_entry_mut(&mut self, r: &RunningJob) -> Option<&mut (usize, bool)> {
        self.run_index(r).and_then(|k| self.running.get_mut(k))
    }

    fn try_job(&mut self, team: usize, entry: &Queued<'a>) {
        let (class, need, priority) = (entry.class, entry.need, entry.key.0);
        let id = JobId(uuid::Uuid::from_u128(entry.key.2.0));
        // The class's first job stands for it: placement looks only at what the class fixes.
        let like: &'a QueuedJob = self.class_job[class as usize];
        let shape = &like.shape.gpu;
        // a. Models the shape allows, then those the quota allows for the whole gang.
        let class_models = &self.classes[class as usize];
        let cpu_only = matches!(shape, GpuShape::Whole { gpus: 0, .. });
        // On the stack: this runs for every queued job.
        let mut allowed = [GpuModel::A100_40GB; GpuModel::ALL.len()];
        let mut n_allowed = 0;
        for &m in class_models.iter() {
            let ok = match self.accounts.flavour(team, shape, Some(m)) {
                Some((res, amount)) => {
                    self.accounts
                        .allows(team, res, amount * u64::from(like.replicas))
                }
                None => true,
            };
            if ok && n_allowed < allowed.len() {
                allowed[n_allowed] = m;
                n_allowed += 1;
            }
        }
        let models = &allowed[..n_allowed];
        // No node of a model the shape allows is in the fleet: the job waits for capacity
        // only if its quota would let it use some model a cloud could sell; otherwise no
        // purchase can help, and it waits for quota.
        if !cpu_only
            && class_models.is_empty()
            && quota_models(&self.accounts, team, shape, like.replicas)
                .next()
                .is_none()
        {
            self.unmet(id, WaitReason::Quota);
            return;
        }
        if !cpu_only && models.is_empty() && !class_models.is_empty() {
            // Over quota: only the team's own lower-priority work can make room.
            // Within a cycle candidate victims only go (to draining) and usage only grows, so a
            // quota preemption that found nothing finds nothing for as much or more.
            let quota_key = (team, priority, class);
            if self.cfg.preemption && !self.failed_quota_preempt.has_failed(&quota_key, need) {
                let all = Rc::clone(&self.classes[class as usize]);
                if self.preempt(team, entry.job, need, &all, true) {
                    return;
                }
                self.failed_quota_preempt.record(quota_key, need);
            }
            self.unmet(id, WaitReason::Quota);
            return;
        }
        // b. Place the gang.
        let key: FailKey = (class, frag::ModelSet::of(models));
        // A constant-time bound first: if the GPUs of every allowed model together cannot
        // take the gang, no scan is needed, and no CPU or memory figure changes that.
        let slots: u64 = models
            .iter()
            .filter_map(|m| want_on(shape, *m).map(|w| self.state.slots(*m, w)))
            .fold(0u64, u64::saturating_add);
        let gpu_possible = cpu_only || slots >= u64::from(like.replicas);
        if !gpu_possible {
            self.failed.record(key, Need { cpu: 0, mem: 0 });
        }
        if gpu_possible && !self.failed.has_failed(&key, need) {
            if let Some(placed) = self.place_gang(like, need, models) {
                let mut placements = Vec::with_capacity(placed.len());
                for (r, (i, assigned)) in placed.into_iter().enumerate() {
                    let node = &self.state.nodes[i as usize];
                    self.accounts
                        .charge(team, shape, node.model, need.cpu as u64, 1);
                    placements.push(Placement {
                        replica: r as u32,
                        node: node.id,
                        assigned,
                    });
                }
                self.out.admissions.push(Admission {
                    job: id,
                    placements,
                });
                return;
            }
            self.failed.record(key, need);
        }
        // c. Preemption.
        let preempt_key = (team, priority, key);
        if self.cfg.preemption && !self.failed_preempt.has_failed(&preempt_key, need) {
            if self.preempt(team, entry.job, need, models, false) {
                return;
            }
            self.failed_preempt.record(preempt_key, need);
        }
        // d. MIG re-layout.
        if self.cfg.dynamic_mig && !self.failed_relayout.has_failed(&key, need) {
            match self.repartition(like, need, models) {
                Relayout::Ordered => {
                    self.unmet(id, WaitReason::WaitingForRepartition);
                    return;
                }
                Relayout::NoRoom => self.failed_relayout.record(key, need),
                Relayout::NoGpu => self.failed_relayout.record(key, Need { cpu: 0, mem: 0 }),
            }
        }
        // e. Unmet.
        self.unmet(id, WaitReason::NoCapacity);
    }

    fn unmet(&mut self, job: JobId, reason: WaitReason) {
        self.out.unmet.push(Unmet { job, reason });
    }

    /// Places every replica or none; returns the node index and assignment per replica,
    /// already taken in the state.
    fn place_gang(
        &mut self,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
    ) -> Option<Vec<(u32, Assigned)>> {
        let mut filter = Filter {
            clouds: &job.clouds,
            regions: &job.regions,
            spot: job.spot,
            zone: None,
            image: job.image,
        };
        if job.replicas == 1 {
            let one = self.place_one(&job.shape.gpu, need, models, &filter, None)?;
            return Some(vec![one]);
        }
        // One node for the whole gang, when one has room.
        if let Some(placed) = self.place_on_one_node(job, need, models, &filter) {
            return Some(placed);
        }
        // Otherwise one zone, replicas kept together where they fit.
        for zone in 0..self.state.zones.len() as u16 {
            filter.zone = Some(zone);
            let mut placed: Vec<(u32, Assigned)> = Vec::with_capacity(job.replicas as usize);
            let mut ok = true;
            for _ in 0..job.replicas {
                let sticky = placed.last().map(|(i, _)| *i);
                match self.place_one(&job.shape.gpu, need, models, &filter, sticky) {
                    Some(p) => placed.push(p),
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                return Some(placed);
            }
            self.rollback(&placed, need);
        }
        None
    }

    fn rollback(&mut self, placed: &[(u32, Assigned)], need: Need) {
        for (i, a) in placed.iter().rev() {
            self.state.give(*i, need.cpu, need.mem, a);
        }
    }

    /// Tries the best few nodes that might hold every replica at once.
    fn place_on_one_node(
        &mut self,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
        filter: &Filter<'_>,
    ) -> Option<Vec<(u32, Assigned)>> {
        let r = job.replicas;
        let mut tried = 0;
        for &model in models {
            let Some(want) = want_on(&job.shape.gpu, model) else {
                continue;
            };
            let scaled = match want {
                Want::CpuOnly => Want::CpuOnly,
                Want::Whole(k) => Want::Whole(k * r),
                Want::Share(m) => Want::Share(m),
                Want::Mig(c) => Want::Mig(c),
            };
            let nodes: Vec<u32> = if scaled == Want::CpuOnly {
                self.state.cpu_candidates().collect()
            } else {
                self.state.candidates(model, scaled).collect()
            };
            for i in nodes {
                let n = &self.state.nodes[i as usize];
                if !filter.admits(n)
                    || n.cpu_free < need.cpu * i64::from(r)
                    || n.mem_free < need.mem * i64::from(r)
                {
                    continue;
                }
                tried += 1;
                let mut placed = Vec::with_capacity(r as usize);
                for _ in 0..r {
                    match self.assign_on(i, &job.shape.gpu, model, need) {
                        Some(a) => {
                            self.state.take(i, need.cpu, need.mem, &a);
                            placed.push((i, a));
                        }
                        None => break,
                    }
                }
                if placed.len() == r as usize {
                    return Some(placed);
                }
                self.rollback(&placed, need);
                if tried >= self.cfg.candidates {
                    return None;
                }
            }
        }
        None
    }

    /// Places one replica on the best candidate node (trying `sticky` first) and takes it.
    fn place_one(
        &mut self,
        shape: &GpuShape,
        need: Need,
        models: &[GpuModel],
        filter: &Filter<'_>,
        sticky: Option<u32>,
    ) -> Option<(u32, Assigned)> {
        if let Some(i) = sticky {
            let model = self.state.nodes[i as usize].model;
            if let Some(m) = model.filter(|m| models.contains(m)) {
                if let Some(a) = self.assign_on(i, shape, m, need) {
                    self.state.take(i, need.cpu, need.mem, &a);
                    return Some((i, a));
                }
            } else if matches!(shape, GpuShape::Whole { gpus: 0, .. })
                && self.state.fits(i, need.cpu, need.mem, &Assigned::CpuOnly)
            {
                self.state.take(i, need.cpu, need.mem, &Assigned::CpuOnly);
                return Some((i, Assigned::CpuOnly));
            }
        }
        if matches!(shape, GpuShape::Whole { gpus: 0, .. }) {
            let i = self.state.cpu_candidates().find(|&i| {
                let n = &self.state.nodes[i as usize];
                filter.admits(n) && n.cpu_free >= need.cpu && n.mem_free >= need.mem
            })?;
            self.state.take(i, need.cpu, need.mem, &Assigned::CpuOnly);
            return Some((i, Assigned::CpuOnly));
        }
        // Gather up to `candidates` feasible nodes over the allowed models, best fit first.
        let mut cands: Vec<(u32, GpuModel)> = Vec::new();
        for &model in models {
            let Some(want) = want_on(shape, model) else {
                continue;
            };
            let mut taken = 0;
            for i in self.state.candidates(model, want) {
                let n = &self.state.nodes[i as usize];
                if !filter.admits(n) || n.cpu_free < need.cpu || n.mem_free < need.mem {
                    continue;
                }
                let ok = match want {
                    Want::Whole(k) => {
                        n.plain.iter().filter(|&&l| l == packing::GPU_MILLI).count() >= k as usize
                    }
                    Want::Share(m) => n.plain.iter().any(|&l| l >= m),
                    Want::Mig(c) => n
                        .mig
                        .iter()
                        .flatten()
                        .any(|g| !g.pending && g.idle_of(c).next().is_some()),
                    Want::CpuOnly => true,
                };
                if ok {
                    cands.push((i, model));
                    taken += 1;
                    if taken >= self.cfg.candidates {
                        break;
                    }
                }
            }
        }
        if cands.is_empty() {
            return None;
        }
        let (i, assigned) = if let GpuShape::Mig { .. } = shape {
            // MIG: the index already lists nodes with the fewest idle instances first.
            let (i, m) = cands[0];
            (i, self.assign_on(i, shape, m, need)?)
        } else {
            self.seq += 1;
            let ctx = ScoreCtx {
                seed: 0,
                seq: self.seq,
            };
            let (gpus, milli) = match shape {
                GpuShape::Whole { gpus, .. } => (*gpus, packing::GPU_MILLI),
                GpuShape::Shared { gpu_milli, .. } => (1, (*gpu_milli).min(packing::GPU_MILLI)),
                GpuShape::Mig { .. } => (0, 0),
            };
            let pod = PackPod {
                cpu: need.cpu,
                mem: need.mem,
                num_gpu: gpus,
                gpu_milli: milli,
                models,
            };
            // Score each candidate; a deterministic policy's answer is cached per (node,
            // node version, request shape), so only nodes that changed are scored again.
            let cacheable = !self.policy.uses_ctx();
            let shape_key = (
                pod.cpu,
                pod.num_gpu,
                pod.gpu_milli,
                frag::ModelSet::of(models),
            );
            let mut best: Option<(usize, packing::Choice, u32)> = None;
            for (k, &(i, m)) in cands.iter().enumerate() {
                let n = &self.state.nodes[i as usize];
                let node = PackNode {
                    cpu_left: n.cpu_free,
                    cpu_cap: n.cpu_cap,
                    mem_left: n.mem_free,
                    model: Some(m),
                    gpus: &n.plain,
                    tiebreak: n.tiebreak,
                };
                if !packing::feasible(&node, &pod) {
                    continue;
                }
                let choice = match self.scores.get(&(i, shape_key)) {
                    Some((v, c)) if cacheable && *v == n.version => c.clone(),
                    _ => {
                        let c = self.policy.score(&node, &pod, &ctx);
                        if cacheable {
                            self.scores.insert((i, shape_key), (n.version, c.clone()));
                        }
                        c
                    }
                };
                let better = best
                    .as_ref()
                    .is_none_or(|(_, b, t)| (choice.score, n.tiebreak) < (b.score, *t));
                if better {
                    best = Some((k, choice, n.tiebreak));
                }
            }
            let (k, choice, _) = best?;
            let i = cands[k].0;
            let assigned = match choice.devices {
                Devices::Whole(d) => Assigned::Whole(d.into_iter().map(u32::from).collect()),
                Devices::Share(d) => Assigned::Share {
                    gpu: u32::from(d),
                    milli,
                },
                Devices::None => Assigned::CpuOnly,
            };
            (i, assigned)
        };
        if !self.state.fits(i, need.cpu, need.mem, &assigned) {
            return None;
        }
        self.state.take(i, need.cpu, need.mem, &assigned);
        Some((i, assigned))
    }

    /// Which part of node `i` one replica would get (not taken yet): best fit on that node.
    fn assign_on(&self, i: u32, shape: &GpuShape, model: GpuModel, need: Need) -> Option<Assigned> {
        let n = &self.state.nodes[i as usize];
        if n.cpu_free < need.cpu || n.mem_free < need.mem {
            return None;
        }
        match want_on(shape, model)? {
            Want::CpuOnly => Some(Assigned::CpuOnly),
            Want::Whole(k) => packing::lowest_idle(&n.plain, k)
                .map(|d| Assigned::Whole(d.into_iter().map(u32::from).collect())),
            Want::Share(m) => packing::best_share(&n.plain, m).map(|g| Assigned::Share {
                gpu: u32::from(g),
                milli: m,
            }),
            Want::Mig(class) => {
                // The GPU with the most instances in use (pack), then the lowest index.
                let (gpu, inst) = n
                    .mig
                    .iter()
                    .enumerate()
                    .filter_map(|(g, m)| m.as_ref().filter(|m| !m.pending).map(|m| (g, m)))
                    .filter_map(|(g, m)| {
                        m.idle_of(class)
                            .next()
                            .map(|inst| (g, inst, m.busy.count_ones()))
                    })
                    .max_by_key(|(g, _, busy)| (*busy, Reverse(*g)))
                    .map(|(g, inst, _)| (g, inst))?;
                Some(Assigned::Mig {
                    gpu: gpu as u32,
                    instance: inst,
                })
            }
        }
    }

    /// Victim selection. Returns true when the job now waits for preemption (new victims were
    /// chosen, or victims already draining for it will make room).
    ///
    /// A job may preempt lower-priority jobs of its own team, or (reclaim) jobs of its cohort
    /// whose team borrows the flavour it needs while its own team is under nominal. Victims
    /// are whole jobs (a gang goes as one), cheapest first: the fewest GPU-seconds since their
    /// last checkpoint. A single-replica job looks node by node for the cheapest set of victims
    /// on one node; a gang releases victims greedily until it fits, then keeps only those
    /// needed. Victims keep their capacity this cycle: they checkpoint first.
    fn preempt(
        &mut self,
        team: usize,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
        quota_only: bool,
    ) -> bool {
        if self.preemption_work >= self.cfg.max_preemption_attempts {
            return false;
        }
        self.preemption_work += 1;
        let snap = self.snap;
        // A job that preempted earlier waits for its victims to drain rather than preempt more.
        if job.nominated && !quota_only {
            let draining: Vec<&RunningJob> = snap
                .running
                .iter()
                .filter(|r| self.run_entry(r).is_some_and(|(_, d)| *d))
                .collect();
            if !draining.is_empty() && self.fits_after_releasing(job, need, models, &draining) {
                self.unmet(job.id, WaitReason::WaitingForPreemption);
                return true;
            }
        }
        let chosen = if job.replicas == 1 && !quota_only {
            let candidates =
                self.victim_candidates(team, job, models, quota_only, usize::MAX, |_| true);
            if candidates.is_empty() {
                return false;
            }
            self.victims_on_one_node(team, job, need, models, &candidates)
        } else {
            self.victims_greedy(team, job, need, models, quota_only)
        };
        let Some(victims) = chosen else { return false };
        for (v, reason) in &victims {
            if let Some(entry) = self.run_entry_mut(v) {
                entry.1 = true;
            }
            self.out.preemptions.push(Preemption {
                victim: v.id,
                for_job: job.id,
                reason: *reason,
            });
        }
        self.unmet(job.id, WaitReason::WaitingForPreemption);
        true
    }

    /// Running jobs this job may preempt, cheapest first.
    fn victim_candidates(
        &self,
        team: usize,
        job: &QueuedJob,
        models: &[GpuModel],
        quota_only: bool,
        limit: usize,
        keep: impl Fn(usize) -> bool,
    ) -> Vec<(&'a RunningJob, PreemptionReason)> {
        let snap: &'a Snapshot = self.snap;
        let shape = &job.shape.gpu;
        let mut candidates: Vec<(usize, &'a RunningJob, PreemptionReason)> = Vec::new();
        for (owner, jobs) in self.by_team.iter().enumerate() {
            let same_team = owner == team;
            let same_cohort = !quota_only && self.accounts.same_cohort(team, owner);
            if !same_team && !same_cohort {
                continue;
            }
            // Reclaim needs the job to fit within its own team's nominal quota, and the other
            // team to borrow that flavour.
            let reclaim_flavours: Vec<_> = if same_team {
                Vec::new()
            } else {
                models
                    .iter()
                    .filter_map(|m| self.accounts.flavour(team, shape, Some(*m)))
                    .filter(|(res, amount)| {
                        self.accounts.is_borrowing(owner, *res)
                            && self.accounts.within_nominal(
                                team,
                                *res,
                                amount * u64::from(job.replicas),
                            )
                    })
                    .map(|(res, _)| res)
                    .collect()
            };
            if !same_team && reclaim_flavours.is_empty() {
                continue;
            }
            // The list is in victim order, so the first `limit` kept of it are all the merge
            // below can use.
            let mut taken = 0;
            for &k in jobs {
                if taken >= limit {
                    break;
                }
                let r = &snap.running[k];
                if self.running.get(k).is_none_or(|(_, draining)| *draining) {
                    continue;
                }
                let reason = if same_team {
                    if r.priority >= job.priority {
                        continue;
                    }
                    PreemptionReason::Priority
                } else {
                    let theirs = self
                        .accounts
                        .flavour(owner, &r.shape.gpu, self.run_model[k])
                        .map(|(res, _)| res);
                    if !theirs.is_some_and(|f| reclaim_flavours.contains(&f)) {
                        continue;
                    }
                    PreemptionReason::Reclaim
                };
                if keep(k) {
                    candidates.push((k, r, reason));
                    taken += 1;
                }
            }
        }
        // Each team's list is already cheapest first: the stable sort merges the sorted runs.
        candidates.sort_by_key(|(k, _, _)| victim_order(&self.costs, &snap.running, *k));
        candidates.truncate(limit);
        candidates
            .into_iter()
            .map(|(_, r, reason)| (r, reason))
            .collect()
    }

    /// For a single replica: per node, the cheapest victims whose release lets the replica fit
    /// there; the node whose set costs least wins. Looks at a bounded number of nodes.
    fn victims_on_one_node(
        &mut self,
        team: usize,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
        candidates: &[(&'a RunningJob, PreemptionReason)],
    ) -> Option<Vec<(&'a RunningJob, PreemptionReason)>> {
        let filter = Filter {
            clouds: &job.clouds,
            regions: &job.regions,
            spot: job.spot,
            zone: None,
            image: job.image,
        };
        // The first nodes the job may use, in the order of their cheapest candidate, at most
        // `preemption_nodes` of them; then each one's candidates, in cost order.
        let mut order: Vec<u32> = Vec::new();
        let mut slot: FxHashMap<u32, usize> = FxHashMap::default();
        'nodes: for (r, _) in candidates {
            for p in &r.placements {
                if order.len() >= self.cfg.preemption_nodes {
                    break 'nodes;
                }
                let Some(&i) = self.state.by_id.get(&p.node) else {
                    continue;
                };
                let n = &self.state.nodes[i as usize];
                if slot.contains_key(&i)
                    || !filter.admits(n)
                    || !n.model.is_some_and(|m| models.contains(&m))
                {
                    continue;
                }
                slot.insert(i, order.len());
                order.push(i);
            }
        }
        let mut by_node: Vec<Vec<usize>> = vec![Vec::new(); order.len()];
        for (c, (r, _)) in candidates.iter().enumerate() {
            for p in &r.placements {
                let Some(&s) = self.state.by_id.get(&p.node).and_then(|i| slot.get(i)) else {
                    continue;
                };
                if by_node[s].last() != Some(&c) {
                    by_node[s].push(c);
                }
            }
        }
        let mut best: Option<(u64, Vec<usize>)> = None;
        for (&i, list) in order.iter().zip(by_node) {
            let model = self.state.nodes[i as usize].model?;
            let mut released: Vec<usize> = Vec::new();
            let mut found = false;
            for c in list {
                let (victim, reason) = candidates[c];
                if reason == PreemptionReason::Reclaim && !self.still_borrowing(victim) {
                    continue;
                }
                self.release(victim);
                released.push(c);
                let quota_ok = self
                    .accounts
                    .flavour(team, &job.shape.gpu, Some(model))
                    .is_none_or(|(res, amount)| self.accounts.allows(team, res, amount));
                if quota_ok && self.assign_on(i, &job.shape.gpu, model, need).is_some() {
                    found = true;
                    break;
                }
            }
            for &c in released.iter().rev() {
                self.restore(candidates[c].0);
            }
            if found {
                let total: u64 = released
                    .iter()
                    .filter_map(|&c| self.run_index(candidates[c].0))
                    .map(|k| self.costs[k])
                    .sum();
                if best
                    .as_ref()
                    .is_none_or(|(b, v)| (total, released.len()) < (*b, v.len()))
                {
                    best = Some((total, released));
                }
            }
        }
        best.map(|(_, v)| v.into_iter().map(|c| candidates[c]).collect())
    }

    /// For gangs: release the cheapest victims until the gang fits, then keep only the needed.
    fn victims_greedy(
        &mut self,
        team: usize,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
        quota_only: bool,
    ) -> Option<Vec<(&'a RunningJob, PreemptionReason)>> {
        // Only victims that free what the job lacks: GPUs of a model it may use (and, for a
        // GPU job, not CPU-only work), or the quota flavour it needs.
        let gpu_job = !matches!(job.shape.gpu, GpuShape::Whole { gpus: 0, .. });
        let needed_flavours: Vec<QuotaResource> = models
            .iter()
            .filter_map(|m| {
                self.accounts
                    .flavour(team, &job.shape.gpu, Some(*m))
                    .map(|(res, _)| res)
            })
            .collect();
        let helps = |k: usize| -> bool {
            let Some(&(owner, _)) = self.running.get(k) else {
                return false;
            };
            let r = &self.snap.running[k];
            let model = self.run_model[k];
            if gpu_job
                && (matches!(r.shape.gpu, GpuShape::Whole { gpus: 0, .. })
                    || !model.is_some_and(|m| models.contains(&m)))
            {
                return false;
            }
            needed_flavours.is_empty()
                || self
                    .accounts
                    .flavour(owner, &r.shape.gpu, model)
                    .is_some_and(|(res, _)| needed_flavours.contains(&res))
        };
        let candidates = self.victim_candidates(
            team,
            job,
            models,
            quota_only,
            self.cfg.preemption_candidates,
            helps,
        );
        if candidates.is_empty() {
            return None;
        }
        // Quota is necessary: if even all of these victims would not free enough of it, stop
        // before any placement attempt.
        for (v, _) in &candidates {
            self.charge_job(v, -1);
        }
        let quota_possible = models.iter().any(|m| {
            self.accounts
                .flavour(team, &job.shape.gpu, Some(*m))
                .is_none_or(|(res, amount)| {
                    self.accounts
                        .allows(team, res, amount * u64::from(job.replicas))
                })
        });
        for (v, _) in &candidates {
            self.charge_job(v, 1);
        }
        if !quota_possible {
            return None;
        }
        let mut released: Vec<(&'a RunningJob, PreemptionReason)> = Vec::new();
        let mut fits = false;
        let mut tried = 0;
        for (victim, reason) in candidates {
            if tried >= self.cfg.preemption_candidates {
                break;
            }
            if reason == PreemptionReason::Reclaim && !self.still_borrowing(victim) {
                continue;
            }
            tried += 1;
            self.release(victim);
            released.push((victim, reason));
            if self.fits_now(job, need, team, models) {
                fits = true;
                break;
            }
        }
        if !fits {
            for (v, _) in released.iter().rev() {
                self.restore(v);
            }
            return None;
        }
        // Keep only the victims that are needed: put each back (latest-but-one first) and see
        // whether the gang still fits without preempting it.
        let mut needed = Vec::new();
        let last = released.pop();
        for (v, reason) in released.into_iter().rev() {
            self.restore(v);
            if self.fits_now(job, need, team, models) {
                continue;
            }
            self.release(v);
            needed.push((v, reason));
        }
        needed.extend(last);
        for (v, _) in &needed {
            self.restore(v);
        }
        Some(needed)
    }

    /// Whether a reclaim victim's team still borrows what the victim uses.
    fn still_borrowing(&self, victim: &RunningJob) -> bool {
        let Some(k) = self.run_index(victim) else {
            return false;
        };
        let Some(&(owner, _)) = self.running.get(k) else {
            return false;
        };
        self.accounts
            .flavour(owner, &victim.shape.gpu, self.run_model[k])
            .is_some_and(|(res, _)| self.accounts.is_borrowing(owner, res))
    }

    /// Whether the job would fit (quota and capacity) right now, without taking anything.
    fn fits_now(&mut self, job: &QueuedJob, need: Need, team: usize, models: &[GpuModel]) -> bool {
        let allowed: Vec<GpuModel> = models
            .iter()
            .copied()
            .filter(
                |m| match self.accounts.flavour(team, &job.shape.gpu, Some(*m)) {
                    Some((res, amount)) => {
                        self.accounts
                            .allows(team, res, amount * u64::from(job.replicas))
                    }
                    None => true,
                },
            )
            .collect();
        if allowed.is_empty() {
            return false;
        }
        match self.place_gang(job, need, &allowed) {
            Some(placed) => {
                self.rollback(&placed, need);
                true
            }
            None => false,
        }
    }

    fn fits_after_releasing(
        &mut self,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
        jobs: &[&RunningJob],
    ) -> bool {
        for r in jobs {
            self.release(r);
        }
        let fits = match self.place_gang(job, need, models) {
            Some(placed) => {
                self.rollback(&placed, need);
                true
            }
            None => false,
        };
        for r in jobs.iter().rev() {
            self.restore(r);
        }
        fits
    }

    fn release(&mut self, r: &RunningJob) {
        let team = self.run_entry(r).map_or(0, |t| t.0);
        for p in &r.placements {
            let Some(&i) = self.state.by_id.get(&p.node) else {
                continue;
            };
            self.state.give(
                i,
                i64::from(r.shape.cpu_milli),
                r.shape.memory_mib as i64,
                &p.assigned,
            );
            let model = self.state.nodes[i as usize].model;
            self.accounts
                .charge(team, &r.shape.gpu, model, u64::from(r.shape.cpu_milli), -1);
        }
    }

    /// Charges (or with -1, refunds) a running job's usage in the accounts only.
    fn charge_job(&mut self, r: &RunningJob, sign: i8) {
        let team = self.run_entry(r).map_or(0, |t| t.0);
        for p in &r.placements {
            let Some(&i) = self.state.by_id.get(&p.node) else {
                continue;
            };
            let model = self.state.nodes[i as usize].model;
            self.accounts.charge(
                team,
                &r.shape.gpu,
                model,
                u64::from(r.shape.cpu_milli),
                sign,
            );
        }
    }

    fn restore(&mut self, r: &RunningJob) {
        let team = self.run_entry(r).map_or(0, |t| t.0);
        for p in &r.placements {
            let Some(&i) = self.state.by_id.get(&p.node) else {
                continue;
            };
            self.state.take(
                i,
                i64::from(r.shape.cpu_milli),
                r.shape.memory_mib as i64,
                &p.assigned,
            );
            let model = self.state.nodes[i as usize].model;
            self.accounts
                .charge(team, &r.shape.gpu, model, u64::from(r.shape.cpu_milli), 1);
        }
    }

    /// Re-lays idle GPUs so the job can fit next cycle: MIG instances for MIG jobs (keeping
    /// every instance in use), whole GPUs back from idle MIG GPUs for other jobs.
    fn repartition(&mut self, job: &QueuedJob, need: Need, models: &[GpuModel]) -> Relayout {
        match &job.shape.gpu {
            GpuShape::Mig { profile, .. } => {
                let mut outcome = Relayout::NoGpu;
                for &model in models {
                    let Some(class) = profile.class_on(model) else {
                        continue;
                    };
                    match self.relayout_for_mig(job, need, model, class) {
                        Relayout::Ordered => return Relayout::Ordered,
                        Relayout::NoRoom => outcome = Relayout::NoRoom,
                        Relayout::NoGpu => {}
                    }
                }
                outcome
            }
            GpuShape::Whole { gpus, .. } if *gpus > 0 => {
                self.mig_off_for_whole(job, need, models, *gpus * job.replicas)
            }
            GpuShape::Shared { .. } => self.mig_off_for_whole(job, need, models, 1),
            _ => Relayout::NoGpu,
        }
    }

    /// The GPUs of `node` that could take a new `class` instance: idle plain GPUs of a MIG
    /// model (MIG turned on), or MIG GPUs, keeping the instances in use. Each with the layout
    /// to start from. A MIG GPU's room is checked before its layout is built (most GPUs a
    /// failing search visits have none).
    fn relayout_bases(&self, i: u32, model: GpuModel, class: MigClass) -> Vec<(usize, MigLayout)> {
        let n = &self.state.nodes[i as usize];
        let mut out = Vec::new();
        for g in 0..n.plain.len() {
            let base = match n.mig.get(g).and_then(Option::as_ref) {
                None if model.mig_capable()
                    && n.plain[g] == packing::GPU_MILLI
                    && !n.plain_pending[g] =>
                {
                    Some(Vec::new())
                }
                Some(m) if !m.pending && m.could_add(class) => Some(m.busy_instances().collect()),
                _ => None,
            };
            if let Some(Ok(layout)) = base.map(MigLayout::new) {
                out.push((g, layout));
            }
        }
        out
    }

    fn relayout_for_mig(
        &mut self,
        job: &QueuedJob,
        need: Need,
        model: GpuModel,
        class: MigClass,
    ) -> Relayout {
        let filter = Filter {
            clouds: &job.clouds,
            regions: &job.regions,
            spot: job.spot,
            zone: None,
            image: job.image,
        };
        // A re-layout ordered earlier this cycle may already have made a spare instance of
        // this class: a single replica waits for that one rather than re-lay another GPU.
        if job.replicas == 1
            && let Some(spares) = self.spare_instances.get_mut(&(model, class))
        {
            let nodes = &self.state.nodes;
            let claimed = spares.iter().position(|&(i, _)| {
                let n = &nodes[i as usize];
                filter.admits(n) && n.cpu_free >= need.cpu && n.mem_free >= need.mem
            });
            if let Some(k) = claimed {
                spares[k].1 -= 1;
                if spares[k].1 == 0 {
                    spares.swap_remove(k);
                }
                return Relayout::Ordered;
            }
        }
        // Nodes with an idle plain GPU (MIG can be turned on) or with MIG GPUs.
        // Nodes with MIG room first; then nodes with an idle plain GPU not already listed.
        let mut nodes: Vec<u32> = self.state.mig_room_nodes(model).collect();
        if model.mig_capable() {
            let state = &self.state;
            nodes.extend(
                state
                    .candidates(model, Want::Whole(1))
                    .filter(|&i| !state.has_mig_room(i)),
            );
        }
        let mut any_gpu = false;
        // Per zone, so a gang lands in one zone.
        for zone in 0..self.state.zones.len() as u16 {
            let mut plan: Vec<(u32, u32, MigLayout, u32)> = Vec::new();
            let mut covered = 0usize;
            for &i in &nodes {
                if covered >= job.replicas as usize {
                    break;
                }
                let n = &self.state.nodes[i as usize];
                if n.zone != zone || !filter.admits(n) {
                    continue;
                }
                // Without CPU and memory for one replica nothing is added here; such a node
                // only tells "no GPU at all" from "no room now", which one GPU settled.
                if any_gpu && (n.cpu_free < need.cpu || n.mem_free < need.mem) {
                    continue;
                }
                let (mut cpu, mut mem) = (n.cpu_free, n.mem_free);
                for (g, mut layout) in self.relayout_bases(i, model, class) {
                    if layout.free_starts(class).is_empty() {
                        continue;
                    }
                    any_gpu = true;
                    let mut added = 0;
                    while covered + added < job.replicas as usize
                        && cpu >= need.cpu
                        && mem >= need.mem
                    {
                        let Some(&start) = layout.free_starts(class).first() else {
                            break;
                        };
                        if layout.add(MigInstance::new(class, start)).is_err() {
                            break;
                        }
                        added += 1;
                        cpu -= need.cpu;
                        mem -= need.mem;
                    }
                    if added == 0 {
                        continue;
                    }
                    // Keep the idle instances that still fit, so nothing is destroyed needlessly.
                    if let Some(prev) = n.mig.get(g).and_then(Option::as_ref) {
                        for inst in prev.layout.instances() {
                            if prev.busy & (1 << inst.start) == 0
                                && !layout.instances().contains(inst)
                            {
                                let _ = layout.add(*inst);
                            }
                        }
                    }
                    // Fill what is left with the same class: the next jobs asking for it this
                    // cycle wait for these instead of each re-laying a GPU of its own.
                    let mut spare = 0;
                    while let Some(&start) = layout.free_starts(class).first() {
                        if layout.add(MigInstance::new(class, start)).is_err() {
                            break;
                        }
                        spare += 1;
                    }
                    covered += added;
                    plan.push((i, g as u32, layout, spare));
                    if covered >= job.replicas as usize {
                        break;
                    }
                }
            }
            if covered >= job.replicas as usize && !plan.is_empty() {
                for (i, g, layout, spare) in plan {
                    let node = self.state.nodes[i as usize].id;
                    let unchanged = self.state.nodes[i as usize]
                        .mig
                        .get(g as usize)
                        .and_then(Option::as_ref)
                        .is_some_and(|m| m.layout == layout);
                    if unchanged {
                        continue;
                    }
                    if spare > 0 {
                        self.spare_instances
                            .entry((model, class))
                            .or_default()
                            .push((i, spare));
                    }
                    self.state.set_pending(i, g);
                    self.out.repartitions.push(Repartition {
                        node,
                        gpu: g,
                        layout: Some(layout),
                    });
                }
                return Relayout::Ordered;
            }
        }
        if any_gpu {
            Relayout::NoRoom
        } else {
            Relayout::NoGpu
        }
    }

    /// Turns idle MIG GPUs of one node back into plain GPUs so `gpus` whole GPUs fit there.
    fn mig_off_for_whole(
        &mut self,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
        gpus: u32,
    ) -> Relayout {
        let filter = Filter {
            clouds: &job.clouds,
            regions: &job.regions,
            spot: job.spot,
            zone: None,
            image: job.image,
        };
        let mut any_gpu = false;
        let convertible =
            |m: &Option<state::MigGpu>| m.as_ref().is_some_and(|m| m.busy == 0 && !m.pending);
        let mut chosen = None;
        'models: for &model in models {
            for i in self.state.mig_idle_nodes(model) {
                let n = &self.state.nodes[i as usize];
                if !filter.admits(n) {
                    continue;
                }
                let idle_plain =
                    n.plain.iter().filter(|&&l| l == packing::GPU_MILLI).count() as u32;
                let idle_mig = n.mig.iter().filter(|m| convertible(m)).count() as u32;
                if idle_plain >= gpus || idle_plain + idle_mig < gpus {
                    continue;
                }
                any_gpu = true;
                if n.cpu_free < need.cpu * i64::from(job.replicas)
                    || n.mem_free < need.mem * i64::from(job.replicas)
                {
                    continue;
                }
                chosen = Some((i, gpus - idle_plain));
                break 'models;
            }
        }
        let Some((i, turn)) = chosen else {
            return if any_gpu {
                Relayout::NoRoom
            } else {
                Relayout::NoGpu
            };
        };
        let n = &self.state.nodes[i as usize];
        let id = n.id;
        let gpus: Vec<u32> = (0..n.mig.len() as u32)
            .filter(|&g| convertible(&n.mig[g as usize]))
            .take(turn as usize)
            .collect();
        for g in gpus {
            self.state.set_pending(i, g);
            self.out.repartitions.push(Repartition {
                node: id,
                gpu: g,
                layout: None,
            });
        }
        Relayout::Ordered
    }
}

/// What a re-layout attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relayout {
    Ordered,
    /// GPUs could be re-laid but CPU or memory is short.
    NoRoom,
    /// No GPU could be re-laid for this request, whatever its CPU and memory.
    NoGpu,
}

#[cfg(test)]
mod tests;
