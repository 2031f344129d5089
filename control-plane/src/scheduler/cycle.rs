//! One scheduling cycle: its working state and the driver.
//!
//! [`schedule`] builds the cycle's working state (`Cycle`): the capacity left on every node
//! (the state's index), each team's usage and dominant share, the running jobs as candidate
//! victims, and memos of what already failed. Then it takes one queued job at a time, from the
//! team with the smallest weighted dominant share, and decides it (`Cycle::try_job`):
//!
//! a. keep to the models the shape and the team's quota allow (over quota, only preempting
//!    the team's own lower-priority work can help);
//! b. place the gang (`placement.rs`);
//! c. else preempt (`preemption.rs`);
//! d. else re-lay MIG GPUs (`relayout.rs`);
//! e. else report the job as unmet demand.
//!
//! Those files add to the same `impl Cycle`: each step reads and changes this one working
//! state and appends its decisions to `Cycle::out`. The fields the other steps share are
//! `pub(super)`; the failure memos and the per-class tables are this file's alone. Each memo
//! is keyed by request class and dominates on (cpu, mem), since capacity only shrinks within
//! a cycle.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::rc::Rc;

use chrono::{DateTime, Utc};
use rustc_hash::FxHashMap;
use spotplane_core::mig::MigClass;
use spotplane_core::shape::GpuShape;
use spotplane_core::{Cloud, GpuModel, JobId, TeamName};

use super::fairshare::Accounts;
use super::packing::{self, PackingPolicy};
use super::placement::{ScoreKey, want_on};
use super::preemption::{VictimOrder, victim_order};
use super::relayout::Relayout;
use super::state::State;
use super::{
    Admission, Decisions, Placement, QueuedJob, RunningJob, SchedulerConfig, Snapshot, Unmet,
    WaitReason, frag,
};

/// One replica's needs in the terms the state understands.
#[derive(Debug, Clone, Copy)]
pub(super) struct Need {
    pub(super) cpu: i64,
    pub(super) mem: i64,
}

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

/// The working state of one cycle, which its steps (in this file, `placement.rs`,
/// `preemption.rs` and `relayout.rs`) share.
pub(super) struct Cycle<'a> {
    /// Preemption searches made this cycle.
    pub(super) preemption_work: usize,
    /// Per running job (snapshot index): the work a preemption would lose.
    pub(super) costs: Vec<u64>,
    pub(super) snap: &'a Snapshot,
    pub(super) policy: &'a dyn PackingPolicy,
    pub(super) cfg: &'a SchedulerConfig,
    pub(super) state: State,
    pub(super) accounts: Accounts,
    /// Running jobs by id: their team index and whether they are draining (or chosen as
    /// victims this cycle).
    pub(super) running: Vec<(usize, bool)>,
    /// Per running job: the GPU model of the node its first replica runs on.
    pub(super) run_model: Vec<Option<GpuModel>>,
    failed: FailMemo<FailKey>,
    /// Policy scores by (node, request shape), with the node version they were computed at.
    pub(super) scores: FxHashMap<(u32, ScoreKey), (u32, packing::Choice)>,
    /// Re-layouts that found nothing, and preemptions that found no victims, this cycle.
    failed_relayout: FailMemo<FailKey>,
    failed_preempt: FailMemo<(usize, i32, FailKey)>,
    /// Preemptions to make room within quota that found no victims, per (team, priority, class).
    failed_quota_preempt: FailMemo<(usize, i32, u32)>,
    /// Instances that re-layouts ordered this cycle add beyond what their jobs need: per
    /// (model, class), the node and how many are not yet promised to a waiting job.
    pub(super) spare_instances: FxHashMap<(GpuModel, MigClass), Vec<(u32, u32)>>,
    /// Per request class: the models its shape may use.
    classes: Vec<Rc<[GpuModel]>>,
    /// Per request class: its first job, whose placement fields every job of it shares.
    class_job: Vec<&'a QueuedJob>,
    /// The running jobs of each team (indexes into the snapshot), cheapest victims first.
    pub(super) by_team: Vec<Vec<usize>>,
    pub(super) seq: u64,
    pub(super) out: Decisions,
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

/// Each team's standing now, as the next cycle would account it: its weighted dominant share
/// and, per flavour it has a quota on, nominal quota, usage and borrowed amount (see
/// [`Accounts::quota_standing`]). Pure, like [`schedule`]; for the metrics.
pub fn team_standing(snap: &Snapshot) -> Vec<TeamStanding> {
    let (gpu_capacity, cpu_capacity) = capacity_of(snap);
    let mut accounts = Accounts::new(&snap.teams, gpu_capacity, cpu_capacity);
    charge_running(&mut accounts, snap);
    (0..accounts.teams.len())
        .map(|i| TeamStanding {
            team: accounts.teams[i].name.clone(),
            dominant_share: accounts.dominant_share(i),
            quotas: accounts.quota_standing(i),
        })
        .collect()
}

/// Schedulable capacity: milli-GPUs per model, and CPU.
fn capacity_of(snap: &Snapshot) -> (FxHashMap<GpuModel, u64>, u64) {
    let mut gpu_capacity: FxHashMap<GpuModel, u64> = FxHashMap::default();
    let mut cpu_capacity = 0;
    for n in &snap.nodes {
        if let Some(m) = n.gpu_model {
            *gpu_capacity.entry(m).or_insert(0) +=
                n.gpus.len() as u64 * u64::from(packing::GPU_MILLI);
        }
        cpu_capacity += n.cpu_milli;
    }
    (gpu_capacity, cpu_capacity)
}

/// Charges each team with what its running jobs hold.
fn charge_running(accounts: &mut Accounts, snap: &Snapshot) {
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
}

/// One team's standing (see [`team_standing`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TeamStanding {
    pub team: TeamName,
    pub dominant_share: f64,
    /// Per flavour with a quota: name, nominal, used, borrowed.
    pub quotas: Vec<(String, f64, f64, f64)>,
}

/// [`schedule`], building the queues on a second thread or in line.
pub(super) fn schedule_with(
    snap: &Snapshot,
    policy: &dyn PackingPolicy,
    cfg: &SchedulerConfig,
    now: DateTime<Utc>,
    parallel: bool,
) -> Decisions {
    let (gpu_capacity, cpu_capacity) = capacity_of(snap);
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
pub(super) const PARALLEL_QUEUES: usize = 4096;

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
    charge_running(&mut accounts, snap);
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
    pub(super) fn run_index(&self, r: &RunningJob) -> Option<usize> {
        let base = self.snap.running.as_ptr() as usize;
        let addr = r as *const RunningJob as usize;
        let k = addr.checked_sub(base)? / std::mem::size_of::<RunningJob>().max(1);
        (k < self.snap.running.len()).then_some(k)
    }

    /// (team, draining) of a running job.
    pub(super) fn run_entry(&self, r: &RunningJob) -> Option<&(usize, bool)> {
        self.run_index(r).and_then(|k| self.running.get(k))
    }

    pub(super) fn run_entry_mut(&mut self, r: &RunningJob) -> Option<&mut (usize, bool)> {
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

    pub(super) fn unmet(&mut self, job: JobId, reason: WaitReason) {
        self.out.unmet.push(Unmet { job, reason });
    }
}
