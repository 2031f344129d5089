//! The planner behind the `spotplane` policy: the schedule of least *expected* cost when spot
//! availability is a Markov chain, by backward induction over the rest of the job.
//!
//! The chain's states are spot unavailable and available runs by *age class* (youngest
//! first; the policy uses runs younger than 15 minutes, than an hour, and older). Each class
//! has its own chance per tick of ending: spot runs on the traces have a falling hazard
//! (median runs of 20–40 minutes against means of one to four hours; a run that has lasted
//! an hour is far likelier to last another than one that began a minute ago), so a planner
//! that only knew the mean would leave on-demand for every blip and spend its slack on
//! restarts. A run leaves its class for the next with probability `1 / ticks` per tick,
//! `ticks` being the class's length; the last class never ages. Unavailable spot comes back
//! in the first class.
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
//! counted as idle, spot unavailable, at the end of it (earlier in fact: the model is
//! pessimistic there). Leaving an instance for another is "stop, then start".
//!
//! Large problems are planned on a coarser grid: `scale` ticks of time and progress per step,
//! chosen so that one plan visits at most [`MAX_CELLS`] (time, progress) pairs. The plan is
//! advice; the caller keeps the exact safety rules.

use super::{Choice, Kind};

/// Expected cost of a state that may miss the deadline (in micro-USD per hour × ticks, far
/// above any real cost).
const MISS: f64 = 1e18;

/// The most (time, progress) pairs one plan computes before it coarsens its grid.
pub const MAX_CELLS: u64 = 30_000_000;

/// The most age classes of available spot a chain may have.
pub const MAX_CLASSES: usize = 3;
/// Spot states: the classes, then unavailable.
const STATES: usize = MAX_CLASSES + 1;
/// Modes: idle and on on-demand in each spot state, on spot in each class.
const MODES: usize = 3 * MAX_CLASSES + 2;

/// One age class of available spot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Class {
    /// P(a run of this age ends after this tick).
    pub lose: f64,
    /// Ticks a run stays in this class on average (ignored for the last class).
    pub ticks: f64,
}

/// Per-tick transition probabilities of spot availability.
#[derive(Debug, Clone, PartialEq)]
pub struct Chain {
    /// Age classes of available spot, youngest first: 1 to [`MAX_CLASSES`].
    pub classes: Vec<Class>,
    /// P(spot unavailable now is back at the next tick).
    pub regain: f64,
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

/// The state of spot at a tick, as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spot {
    Unavailable,
    /// Available, in this age class (beyond the last: the last).
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

/// The mode indices of a chain with `n` classes (spot states `0..n`, unavailable `n`).
#[derive(Debug, Clone, Copy)]
struct Layout {
    n: usize,
}

impl Layout {
    fn idle(self, s: usize) -> usize {
        s
    }
    /// On spot in state `s`; unavailable means the instance is gone: idle.
    fn spot(self, s: usize) -> usize {
        if s == self.n { s } else { self.n + 1 + s }
    }
    fn on_demand(self, s: usize) -> usize {
        2 * self.n + 1 + s
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
        let (t, p) = (tick / self.scale, progress / self.scale);
        if t < self.from || t >= self.until || t >= self.deadline || p >= self.work {
            return None;
        }
        let (lo, hi) = (self.lo(t), self.hi(t));
        if p < lo || p > hi {
            return None;
        }
        let l = self.layout;
        let s = match mode.spot {
            Spot::Unavailable => l.n,
            Spot::Available(class) => class.min(l.n - 1),
        };
        let m = match mode.running {
            None => l.idle(s),
            Some(Kind::Spot) => l.spot(s),
            Some(Kind::OnDemand) => l.on_demand(s),
        };
        let i = self.offsets[(t - self.from) as usize] + (p - lo) as usize;
        Some(match self.decisions.get(i)?[m] {
            WAIT => Choice::Wait,
            SPOT => Choice::Run(Kind::Spot),
            _ => Choice::Run(Kind::OnDemand),
        })
    }

    /// Bytes of the decision table.
    pub fn bytes(&self) -> usize {
        self.decisions.len() * MODES + self.offsets.len() * 8
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

/// Plans the job from tick `from`, keeping decisions for ticks before `until`.
///
/// # Panics
/// If the chain has no class or more than [`MAX_CLASSES`].
pub fn plan(job: &Job, chain: &Chain, from: u32, until: u32) -> Plan {
    let n = chain.classes.len();
    assert!(
        (1..=MAX_CLASSES).contains(&n),
        "a chain has 1 to {MAX_CLASSES} age classes, not {n}"
    );
    let l = Layout { n };
    let (states, unavailable) = (n + 1, n);
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
    let per_step = |p: f64| (1.0 - (1.0 - p).powf(k)).clamp(1e-9, 1.0);
    // One step of spot's state, and the same with "unavailable" absorbing (a spot instance
    // once lost stays lost).
    let mut step: Matrix = [[0.0; STATES]; STATES];
    for (c, class) in chain.classes.iter().enumerate() {
        let lose = per_step(class.lose);
        let grow = if c + 1 == n {
            0.0
        } else {
            (k / class.ticks.max(1.0)).min(1.0)
        };
        step[c][c] = (1.0 - lose) * (1.0 - grow);
        if c + 1 < n {
            step[c][c + 1] = (1.0 - lose) * grow;
        }
        step[c][unavailable] = lose;
    }
    let back = per_step(chain.regain);
    step[unavailable][0] = back;
    step[unavailable][unavailable] = 1.0 - back;
    let mut held = step;
    held[unavailable] = [0.0; STATES];
    held[unavailable][unavailable] = 1.0;
    let (after_restart, kept_through_restart) = (power(&step, states, r), power(&held, states, r));
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
    let expect = |probs: &[f64; STATES], v: &[f64; MODES], mode: fn(Layout, usize) -> usize| {
        (0..states).map(|j| probs[j] * v[mode(l, j)]).sum::<f64>()
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
                let wait = expect(&step[s], &stay, Layout::idle);
                let cont_od = od + expect(&step[s], &gain, Layout::on_demand);
                let cont_spot = if s == unavailable {
                    MISS
                } else {
                    spot + expect(&step[s], &gain, Layout::spot)
                };
                let (start_spot, start_od) = if r == 0 {
                    (cont_spot, cont_od)
                } else if fits {
                    (
                        if s == unavailable {
                            MISS
                        } else {
                            spot_restart + expect(&kept_through_restart[s], &later, Layout::spot)
                        },
                        od_restart + expect(&after_restart[s], &later, Layout::on_demand),
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
                if s != unavailable {
                    modes[l.spot(s)] = best(&[(cont_spot, SPOT), idle]);
                }
            }
            values[(t as usize % slots) * row + p as usize] = modes.map(|m| m.0);
            if t < out.until {
                decisions[offsets[(t - from) as usize] + (p - lo) as usize] = modes.map(|m| m.1);
            }
        }
    }
    out.offsets = offsets;
    out.decisions = decisions;
    out
}
