//! The planner behind the deadline policy (`spotplane bench deadline`, and the capacity
//! planner's [`super::deadline`]): the schedule of least *expected* cost when spot
//! availability is a Markov chain, by backward induction over the rest of the job.
//!
//! The chain's states are runs of available spot and outages (runs of unavailable spot), each
//! by *age class* (youngest first; the policy uses three of each). Each class has its own
//! chance per tick of ending, because both kinds of run on the traces have a falling hazard:
//! spot runs have medians of 20–40 minutes against means of one to four hours (a run that has
//! lasted an hour is far likelier to last another than one that began a minute ago), and
//! outages medians of 20–85 minutes against means of one to ten hours (2–5% of young outages
//! end each minute, 0.1–0.4% of those older than four hours). A planner that only knew the
//! means would leave on-demand for every blip and spend its slack on restarts, and would
//! buy on-demand at the start of every outage as if it were the mean one, or wait through
//! the long ones as if they were about to end. A run leaves its class for the next with
//! probability `1 / ticks` per tick, `ticks` being the class's length; the last class never
//! ages. A run that ends starts the other kind in its first class.
//!
//! It is the optimum of [`super::optimal`] with the future replaced by a model of it, so it
//! weighs what the simple rules cannot: a restart's price and time against how long spot
//! lasts, waiting against paying for on-demand, and slack kept for later against money now.
//! A deadline missed with any positive probability costs [`MISS`], so the plan only takes
//! risks the slack covers.
//!
//! States at a tick, with progress `p`: idle, on a spot instance (restart paid) or on
//! on-demand, each with the state of spot (on spot, only the available ones). A start is one
//! move of `R` ticks, as in [`super::optimal`]; a spot preempted during its restart is
//! counted as idle, in a young outage, at the end of it (earlier in fact: the model is
//! pessimistic there). Leaving an instance for another is "stop, then start".
//!
//! Large problems are planned on a coarser grid: `scale` ticks of time and progress per step,
//! chosen so that one plan visits at most [`MAX_CELLS`] (time, progress) pairs. The plan is
//! advice; the caller keeps the exact safety rules.

use serde::Serialize;

/// Expected cost of a state that may miss the deadline (in micro-USD per hour × ticks, far
/// above any real cost).
const MISS: f64 = 1e18;

/// The most (time, progress) pairs one plan computes before it coarsens its grid.
pub const MAX_CELLS: u64 = 30_000_000;

/// The most age classes a chain may have of each kind of run (available, unavailable).
pub const MAX_CLASSES: usize = 3;
/// Spot states: the classes of available spot, then those of outages.
const STATES: usize = 2 * MAX_CLASSES;
/// Modes: idle and on on-demand in each spot state, on spot in each class of available spot.
const MODES: usize = 2 * STATES + MAX_CLASSES;

/// One age class of a kind of run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Class {
    /// P(a run of this age ends after this tick): spot is lost, or an outage is over.
    pub ends: f64,
    /// Ticks a run stays in this class on average (ignored for the last class).
    pub ticks: f64,
}

/// Per-tick transition probabilities of spot availability.
#[derive(Debug, Clone, PartialEq)]
pub struct Chain {
    /// Age classes of runs of available spot, youngest first: 1 to [`MAX_CLASSES`].
    pub available: Vec<Class>,
    /// Age classes of outages, youngest first: 1 to [`MAX_CLASSES`].
    pub unavailable: Vec<Class>,
}

/// The job as the planner sees it (ticks; prices in micro-USD per hour).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    pub work: u32,
    pub deadline: u32,
    pub restart: u32,
    pub spot_price: f64,
    pub on_demand_price: f64,
}

/// The state of spot at a tick, as the policy sees it: the age class of the current run of
/// available spot or of the current outage (beyond the last class: the last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spot {
    Unavailable(usize),
    Available(usize),
}

/// Where the job is at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    pub running: Option<Kind>,
    pub spot: Spot,
}

/// Decisions per mode: 0 = wait (stop), 1 = spot (keep or start), 2 = on-demand.
const WAIT: u8 = 0;
const SPOT: u8 = 1;
const OD: u8 = 2;

/// The mode indices of a chain with `n` classes of available spot and `states` spot states in
/// all (available `0..n`, outages `n..states`).
#[derive(Debug, Clone, Copy)]
struct Layout {
    n: usize,
    states: usize,
}

impl Layout {
    fn idle(self, s: usize) -> usize {
        s
    }
    /// On spot in state `s`; in an outage the instance is gone: idle.
    fn spot(self, s: usize) -> usize {
        if s >= self.n { s } else { self.states + s }
    }
    fn on_demand(self, s: usize) -> usize {
        self.states + self.n + s
    }
    fn state(self, spot: Spot) -> usize {
        match spot {
            Spot::Available(class) => class.min(self.n - 1),
            Spot::Unavailable(class) => self.n + class.min(self.states - self.n - 1),
        }
    }
}

/// The planned decisions for ticks `from..until`.
#[derive(Debug, Clone)]
pub struct Plan {
    scale: u32,
    /// In steps of `scale` ticks.
    from: u32,
    until: u32,
    work: u32,
    deadline: u32,
    restart: u32,
    layout: Layout,
    offsets: Vec<usize>,
    decisions: Vec<[u8; MODES]>,
    /// Expected costs per mode, beside `decisions` ([`plan_with_values`] only).
    values: Vec<[f64; MODES]>,
    /// One step of spot's state with outages absorbing (a spot instance once lost stays
    /// lost), to price a start.
    held: Matrix,
    /// Spot micro-USD per hour.
    spot_price: f64,
}

impl Plan {
    /// The band of progress (steps) still able to finish at step `t`: `lo..=hi`.
    fn lo(&self, t: u32) -> u32 {
        self.work.saturating_sub(self.deadline - t)
    }
    fn hi(&self, t: u32) -> u32 {
        (self.work - 1).min(t.saturating_sub(self.restart))
    }

    /// The planned decision at `tick` with `progress` done, or `None` outside the plan.
    pub fn decide(&self, tick: u32, progress: u32, mode: Mode) -> Option<Choice> {
        let i = self.cell(tick / self.scale, progress / self.scale)?;
        Some(match self.decisions.get(i)?[self.mode_index(mode)] {
            WAIT => Choice::Wait,
            SPOT => Choice::Run(Kind::Spot),
            _ => Choice::Run(Kind::OnDemand),
        })
    }

    /// Bytes of the decision table (and of the values, where kept).
    pub fn bytes(&self) -> usize {
        self.decisions.len() * MODES + self.offsets.len() * 8 + self.values.len() * MODES * 8
    }

    /// The index of `(t, p)` (in steps) in the tables, or `None` outside them.
    fn cell(&self, t: u32, p: u32) -> Option<usize> {
        if t < self.from || t >= self.until || t >= self.deadline || p >= self.work {
            return None;
        }
        if p < self.lo(t) || p > self.hi(t) {
            return None;
        }
        Some(self.offsets[(t - self.from) as usize] + (p - self.lo(t)) as usize)
    }

    /// The expected value (steps) at `(t, p)` in mode `m`: 0 once the work is done, a miss
    /// outside the band, `None` outside the kept window.
    fn value_at(&self, t: u32, p: u32, m: usize) -> Option<f64> {
        if p >= self.work {
            return Some(0.0);
        }
        if t >= self.deadline || p < self.lo(t) || p > self.hi(t) {
            return Some(MISS);
        }
        self.values.get(self.cell(t, p)?).map(|v| v[m])
    }

    /// The expected cost of following this plan from `tick` with `progress` done, in micro-USD
    /// per hour × ticks (a possible miss costs far more than any schedule); `None` outside
    /// the plan or in a plan made without values.
    pub fn value(&self, tick: u32, progress: u32, mode: Mode) -> Option<f64> {
        self.value_at(
            tick / self.scale,
            progress / self.scale,
            self.mode_index(mode),
        )
    }

    /// The index of a mode in the tables' rows.
    fn mode_index(&self, mode: Mode) -> usize {
        let l = self.layout;
        let s = l.state(mode.spot);
        match mode.running {
            None => l.idle(s),
            Some(Kind::Spot) => l.spot(s),
            Some(Kind::OnDemand) => l.on_demand(s),
        }
    }

    /// The expected cost of starting a spot instance at `tick` (spot available, of age class
    /// `class`) with `overhead` ticks before it makes progress, and then following this plan:
    /// the overhead billed at spot's price, then the plan's value on spot, or idle where the
    /// instance was lost during the overhead. `None` outside the kept window.
    pub fn start_spot_value(
        &self,
        tick: u32,
        progress: u32,
        class: usize,
        overhead: u32,
    ) -> Option<f64> {
        let (t, p) = (tick / self.scale, progress / self.scale);
        let steps = overhead.div_ceil(self.scale);
        let l = self.layout;
        let s = l.state(Spot::Available(class));
        let after = power(&self.held, l.states, steps);
        let mut value = self.spot_price * f64::from(overhead);
        for (j, &prob) in after[s].iter().enumerate().take(l.states) {
            if prob != 0.0 {
                value += prob * self.value_at(t + steps, p, l.spot(j))?;
            }
        }
        Some(value.min(MISS))
    }
}

type Matrix = [[f64; STATES]; STATES];

/// `m` (of `n` states) applied `times` times to each row: the n-step transition probabilities.
fn power(m: &Matrix, n: usize, times: u32) -> Matrix {
    let mut out = [[0.0; STATES]; STATES];
    for (i, row) in out.iter_mut().enumerate().take(n) {
        row[i] = 1.0;
    }
    for _ in 0..times {
        let mut next = [[0.0; STATES]; STATES];
        for (i, row) in out.iter().enumerate().take(n) {
            for (k, &x) in row.iter().enumerate().take(n) {
                if x != 0.0 {
                    for j in 0..n {
                        next[i][j] += x * m[k][j];
                    }
                }
            }
        }
        out = next;
    }
    out
}

/// The non-zero entries of each row of a transition matrix, each with the index of the mode
/// it leads to: an expectation then reads only the values it needs.
#[derive(Debug, Clone, Copy)]
struct Moves {
    len: [usize; STATES],
    to: [[(usize, f64); STATES]; STATES],
}

impl Moves {
    /// The moves of `m` (of `states` states) into the modes `mode` gives each state.
    fn of(m: &Matrix, l: Layout, mode: fn(Layout, usize) -> usize) -> Moves {
        let mut out = Moves {
            len: [0; STATES],
            to: [[(0, 0.0); STATES]; STATES],
        };
        for (i, row) in m.iter().enumerate().take(l.states) {
            for (j, &p) in row.iter().enumerate().take(l.states) {
                if p != 0.0 {
                    out.to[i][out.len[i]] = (mode(l, j), p);
                    out.len[i] += 1;
                }
            }
        }
        out
    }

    /// The expected value of `v` after one move from state `s`.
    fn expect(&self, s: usize, v: &[f64; MODES]) -> f64 {
        self.to[s][..self.len[s]]
            .iter()
            .map(|&(m, p)| p * v[m])
            .sum()
    }
}

/// Fills the rows of one kind of run (`classes`, from state `first`) of a step matrix of
/// `k` ticks; a run that ends goes to state `other`, the first class of the other kind.
fn fill(step: &mut Matrix, classes: &[Class], first: usize, other: usize, k: f64) {
    let per_step = |p: f64| (1.0 - (1.0 - p).powf(k)).clamp(1e-9, 1.0);
    for (c, class) in classes.iter().enumerate() {
        let i = first + c;
        let ends = per_step(class.ends);
        let last = c + 1 == classes.len();
        let grow = if last {
            0.0
        } else {
            (k / class.ticks.max(1.0)).min(1.0)
        };
        step[i][i] = (1.0 - ends) * (1.0 - grow);
        if !last {
            step[i][i + 1] = (1.0 - ends) * grow;
        }
        step[i][other] += ends;
    }
}

/// Plans the job from tick `from`, keeping decisions for ticks before `until`.
///
/// # Panics
/// If the chain has no class of a kind of run or more than [`MAX_CLASSES`].
pub fn plan(job: &Job, chain: &Chain, from: u32, until: u32) -> Plan {
    plan_inner(job, chain, from, until, false)
}

/// [`plan`], keeping the expected cost of every state beside its decision, for
/// [`Plan::value`] and [`Plan::start_spot_value`].
///
/// # Panics
/// As [`plan`].
pub fn plan_with_values(job: &Job, chain: &Chain, from: u32, until: u32) -> Plan {
    plan_inner(job, chain, from, until, true)
}

fn plan_inner(job: &Job, chain: &Chain, from: u32, until: u32, keep_values: bool) -> Plan {
    let (n, m) = (chain.available.len(), chain.unavailable.len());
    for (kind, len) in [("available spot", n), ("outages", m)] {
        assert!(
            (1..=MAX_CLASSES).contains(&len),
            "a chain has 1 to {MAX_CLASSES} age classes of {kind}, not {len}"
        );
    }
    let states = n + m;
    let l = Layout { n, states };
    // 1. The grid: `scale` ticks per step, work and restart rounded up, the deadline down.
    let band = u64::from(job.deadline.saturating_sub(job.work)).min(u64::from(job.work)) + 1;
    let cells = u64::from(job.deadline.saturating_sub(from)) * band;
    let scale = if cells <= MAX_CELLS {
        1
    } else {
        (cells as f64 / MAX_CELLS as f64).sqrt().ceil() as u32
    };
    let (w, d, r) = (
        job.work.div_ceil(scale),
        job.deadline / scale,
        job.restart.div_ceil(scale),
    );
    let (from, until) = (from / scale, until.div_ceil(scale).min(d));
    let k = f64::from(scale);
    let (spot, od) = (job.spot_price * k, job.on_demand_price * k);
    // One step of spot's state, and the same with outages absorbing (a spot instance once
    // lost stays lost: the job is idle in a young outage).
    let mut step: Matrix = [[0.0; STATES]; STATES];
    fill(&mut step, &chain.available, 0, n, k);
    fill(&mut step, &chain.unavailable, n, 0, k);
    let mut held = step;
    for (s, row) in held.iter_mut().enumerate().take(states).skip(n) {
        *row = [0.0; STATES];
        row[s] = 1.0;
    }
    let (after_restart, kept_through_restart) = (power(&step, states, r), power(&held, states, r));
    let (wait_moves, od_moves, spot_moves) = (
        Moves::of(&step, l, Layout::idle),
        Moves::of(&step, l, Layout::on_demand),
        Moves::of(&step, l, Layout::spot),
    );
    let start_od_moves = Moves::of(&after_restart, l, Layout::on_demand);
    let start_spot_moves = Moves::of(&kept_through_restart, l, Layout::spot);
    let (spot_restart, od_restart) = (spot * f64::from(r), od * f64::from(r));

    let mut out = Plan {
        scale,
        from,
        until: until.max(from),
        work: w,
        deadline: d,
        restart: r,
        layout: l,
        offsets: Vec::new(),
        decisions: Vec::new(),
        values: Vec::new(),
        held,
        spot_price: job.spot_price,
    };
    if w == 0 || from >= d {
        return out;
    }
    let width = |t: u32| {
        let (lo, hi) = (out.lo(t), out.hi(t));
        if lo > hi { 0 } else { (hi - lo + 1) as usize }
    };
    let mut offsets = vec![0usize; (out.until - from) as usize + 1];
    for t in from..out.until {
        let i = (t - from) as usize;
        offsets[i + 1] = offsets[i] + width(t);
    }
    let mut decisions = vec![[WAIT; MODES]; offsets[offsets.len() - 1]];
    let mut kept = if keep_values {
        vec![[MISS; MODES]; offsets[offsets.len() - 1]]
    } else {
        Vec::new()
    };

    // 2. Backward induction; values in rolling rows of R + 2 steps.
    let slots = r as usize + 2;
    let row = w as usize;
    let mut values = vec![[MISS; MODES]; slots * row];
    let get = |values: &[[f64; MODES]], t: u32, p: u32| -> [f64; MODES] {
        if p >= w {
            [0.0; MODES]
        } else if t >= d || p < out.lo(t) || p > out.hi(t) {
            [MISS; MODES]
        } else {
            values[(t as usize % slots) * row + p as usize]
        }
    };
    let best = |options: &[(f64, u8)]| {
        options
            .iter()
            .copied()
            .fold((f64::INFINITY, WAIT), |b, o| if o.0 < b.0 { o } else { b })
    };
    for t in (from..d).rev() {
        let (lo, hi) = (out.lo(t), out.hi(t));
        if lo > hi {
            continue;
        }
        let fits = t + r <= d;
        for p in lo..=hi {
            let stay = get(&values, t + 1, p);
            let gain = get(&values, t + 1, p + 1);
            let later = if fits {
                get(&values, t + r, p)
            } else {
                [MISS; MODES]
            };
            let mut modes = [(MISS, WAIT); MODES];
            for s in 0..states {
                let up = s < n;
                let wait = wait_moves.expect(s, &stay);
                let cont_od = od + od_moves.expect(s, &gain);
                let cont_spot = if up {
                    spot + spot_moves.expect(s, &gain)
                } else {
                    MISS
                };
                let (start_spot, start_od) = if r == 0 {
                    (cont_spot, cont_od)
                } else if fits {
                    (
                        if up {
                            spot_restart + start_spot_moves.expect(s, &later)
                        } else {
                            MISS
                        },
                        od_restart + start_od_moves.expect(s, &later),
                    )
                } else {
                    (MISS, MISS)
                };
                // Between waiting and on-demand at equal expected cost, waiting: it keeps
                // the option of spot that comes back sooner than the model expects.
                let idle = best(&[(start_spot, SPOT), (wait, WAIT), (start_od, OD)]);
                modes[l.idle(s)] = idle;
                // Keeping a running instance wins ties.
                modes[l.on_demand(s)] = best(&[(cont_od, OD), idle]);
                if up {
                    modes[l.spot(s)] = best(&[(cont_spot, SPOT), idle]);
                }
            }
            values[(t as usize % slots) * row + p as usize] = modes.map(|m| m.0);
            if t < out.until {
                let i = offsets[(t - from) as usize] + (p - lo) as usize;
                decisions[i] = modes.map(|m| m.1);
                if keep_values {
                    kept[i] = modes.map(|m| m.0);
                }
            }
        }
    }
    out.offsets = offsets;
    out.decisions = decisions;
    out.values = kept;
    out
}

/// The kind of instance the job runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Kind {
    Spot,
    OnDemand,
}

/// What a policy does during one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Choice {
    /// No instance (terminating the current one, if any).
    Wait,
    /// Keep the current instance of this kind, or start one (paying the restart).
    Run(Kind),
}

/// What has been learned of one spot pool from its availability so far: the ticks seen in each
/// age class of runs of available spot and of outages, and how many of them ended the run,
/// the older the less. The `spotplane` policies of `bench deadline` keep one per pool; the
/// capacity planner builds one from a pool's interruption rate ([`super::deadline`]).
#[derive(Debug, Clone, Default)]
pub struct Observer {
    /// Per age class of runs of available spot, youngest first.
    available: [Seen; MAX_CLASSES],
    /// Per age class of outages, youngest first.
    unavailable: [Seen; MAX_CLASSES],
    last: Option<bool>,
    /// Ticks the current run of available spot, or the current outage, has lasted.
    age: u32,
    prior: Prior,
}

/// Ticks observed in one state of spot, and how many of them were its last.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    ticks: f64,
    ended: f64,
}

impl Seen {
    /// The chance per tick that the state ends, with `weight_hours` of observation of runs
    /// `run_hours` long mixed in.
    fn rate(&self, per_hour: f64, weight_hours: f64, run_hours: f64) -> f64 {
        let weight = weight_hours * per_hour;
        (self.ended + weight / (run_hours * per_hour)) / (self.ticks + weight)
    }
}

/// What the policy believes of a pool before it has seen it: in each age class, the mean
/// length of a run (were the class's chance of ending to hold for the whole run).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prior {
    /// Runs of available spot, per class of [`AGE_CLASS_HOURS`].
    pub available_hours: [f64; MAX_CLASSES],
    /// Outages, per class of [`OUTAGE_CLASS_HOURS`].
    pub unavailable_hours: [f64; MAX_CLASSES],
    /// The weight of the belief, in hours of observation of a last class; a shorter class,
    /// where each run spends only its length, weighs its share of a [`PRIOR_RUN_HOURS`] run.
    pub weight_hours: f64,
}

impl Default for Prior {
    fn default() -> Self {
        Prior {
            available_hours: [PRIOR_RUN_HOURS; MAX_CLASSES],
            unavailable_hours: [PRIOR_RUN_HOURS; MAX_CLASSES],
            weight_hours: PRIOR_WEIGHT_HOURS,
        }
    }
}

/// The default prior's mean run in every class, and the run by which a short class's share
/// of a prior's weight is measured.
pub const PRIOR_RUN_HOURS: f64 = 2.0;
/// The default prior's weight in hours of observation.
pub const PRIOR_WEIGHT_HOURS: f64 = 10.0;
/// Where the age classes of runs of available spot end, in hours; the last class has no end.
pub const AGE_CLASS_HOURS: &[f64] = &[0.25, 1.0];
/// Where the age classes of outages end, in hours; the last class has no end.
pub const OUTAGE_CLASS_HOURS: &[f64] = &[0.5, 2.0];
const _: () = assert!(AGE_CLASS_HOURS.len() < MAX_CLASSES);
const _: () = assert!(OUTAGE_CLASS_HOURS.len() < MAX_CLASSES);
/// An observation this old weighs half as much as one made now.
pub const MEMORY_HALF_LIFE_HOURS: f64 = 24.0;

/// The classes of one kind of run as the planner takes them, from what has been seen.
fn classes(
    seen: &[Seen],
    ends: &[f64],
    prior_hours: &[f64],
    weight_hours: f64,
    per_hour: f64,
) -> Vec<Class> {
    (0..=ends.len())
        .map(|c| {
            let start = if c == 0 { 0.0 } else { ends[c - 1] };
            let hours = ends.get(c).map_or(f64::INFINITY, |end| end - start);
            let weight = weight_hours * (hours / PRIOR_RUN_HOURS).min(1.0);
            Class {
                ends: seen[c].rate(per_hour, weight, prior_hours[c]),
                ticks: hours * per_hour,
            }
        })
        .collect()
}

/// The age class of a run `age` ticks old, for classes ending at `ends` hours.
fn class_of(age: u32, gap_seconds: u32, ends: &[f64]) -> usize {
    let hours = f64::from(age) * f64::from(gap_seconds) / 3600.0;
    ends.iter().take_while(|&&end| hours >= end).count()
}

impl Observer {
    /// An observer with its own belief about a pool it has not seen.
    pub fn with_prior(prior: Prior) -> Self {
        Observer {
            prior,
            ..Observer::default()
        }
    }

    /// Takes in the pool's availability at the next tick.
    pub fn observe(&mut self, now: bool, gap_seconds: u32) {
        if let Some(before) = self.last {
            let seen = match self.spot(before, gap_seconds) {
                Spot::Available(c) => &mut self.available[c],
                Spot::Unavailable(c) => &mut self.unavailable[c],
            };
            seen.ticks += 1.0;
            seen.ended += f64::from(u8::from(before != now));
        }
        self.age = if self.last == Some(now) {
            self.age + 1
        } else {
            1
        };
        self.last = Some(now);
        // Older observations weigh less: pools change their behaviour within days.
        let decay = 0.5f64.powf(f64::from(gap_seconds) / (MEMORY_HALF_LIFE_HOURS * 3600.0));
        for seen in self.available.iter_mut().chain(&mut self.unavailable) {
            seen.ticks *= decay;
            seen.ended *= decay;
        }
    }

    /// The chain the planner takes for this pool.
    pub fn chain(&self, gap_seconds: u32) -> Chain {
        let per_hour = 3600.0 / f64::from(gap_seconds.max(1));
        let p = &self.prior;
        Chain {
            available: classes(
                &self.available,
                AGE_CLASS_HOURS,
                &p.available_hours,
                p.weight_hours,
                per_hour,
            ),
            unavailable: classes(
                &self.unavailable,
                OUTAGE_CLASS_HOURS,
                &p.unavailable_hours,
                p.weight_hours,
                per_hour,
            ),
        }
    }

    /// The state of spot now (`available` at the last observed tick): the current run's
    /// kind and age class.
    pub fn spot(&self, available: bool, gap_seconds: u32) -> Spot {
        if available {
            Spot::Available(class_of(self.age, gap_seconds, AGE_CLASS_HOURS))
        } else {
            Spot::Unavailable(class_of(self.age, gap_seconds, OUTAGE_CLASS_HOURS))
        }
    }
}
