//! The planner behind the `spotplane` policy: the schedule of least *expected* cost when spot
//! availability is a Markov chain, by backward induction over the rest of the job.
//!
//! The chain has three states: spot unavailable, available and *young* (the run began less
//! than `young_ticks` ago), available and *old*. Each has its own chance per tick of ending:
//! a young run that ends is a blip, and the traces have many (median runs of 20–40 minutes
//! against means of one to four hours), so a planner that only knew the mean would leave
//! on-demand for every blip and spend its slack on restarts. Unavailable spot comes back
//! young.
//!
//! It is the optimum of [`super::optimal`] with the future replaced by a model of it, so it
//! weighs what the simple rules cannot: a restart's price and time against how long spot
//! lasts, waiting against paying for on-demand, and slack kept for later against money now.
//! A deadline missed with any positive probability costs [`MISS`], so the plan only takes
//! risks the slack covers.
//!
//! States at a tick, with progress `p`: idle, on a spot instance (restart paid) or on
//! on-demand, each with the state of spot (young, old or unavailable; on spot, only the
//! first two). A start is one move of `R` ticks, as in [`super::optimal`]; a spot preempted
//! during its restart is counted as idle, spot unavailable, at the end of it (earlier in
//! fact: the model is pessimistic there). Leaving an instance for another is "stop, then
//! start". A young run ages into an old one with probability `1 / young_ticks` per tick.
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

/// Per-tick transition probabilities of spot availability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chain {
    /// P(a young run of available spot ends after this tick).
    pub lose_young: f64,
    /// P(an old run ends after this tick).
    pub lose_old: f64,
    /// Ticks a run stays young.
    pub young_ticks: f64,
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

/// Where the job is at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    IdleYoung = 0,
    IdleOld = 1,
    IdleUnavailable = 2,
    SpotYoung = 3,
    SpotOld = 4,
    OnDemandYoung = 5,
    OnDemandOld = 6,
    OnDemandUnavailable = 7,
}

/// Spot's state: young, old, unavailable.
const Y: usize = 0;
const O: usize = 1;
const U: usize = 2;

/// Decisions per mode: 0 = wait (stop), 1 = spot (keep or start), 2 = on-demand.
const WAIT: u8 = 0;
const SPOT: u8 = 1;
const OD: u8 = 2;

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
    offsets: Vec<usize>,
    decisions: Vec<[u8; 8]>,
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
        let i = self.offsets[(t - self.from) as usize] + (p - lo) as usize;
        Some(match self.decisions.get(i)?[mode as usize] {
            WAIT => Choice::Wait,
            SPOT => Choice::Run(Kind::Spot),
            _ => Choice::Run(Kind::OnDemand),
        })
    }

    /// Bytes of the decision table.
    pub fn bytes(&self) -> usize {
        self.decisions.len() * 8 + self.offsets.len() * 8
    }
}

/// `m` applied `n` times to each row: the n-step transition probabilities.
fn power(m: [[f64; 3]; 3], n: u32) -> [[f64; 3]; 3] {
    let mut out = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
    for _ in 0..n {
        let mut next = [[0.0; 3]; 3];
        for (i, row) in out.iter().enumerate() {
            for (k, &x) in row.iter().enumerate() {
                for j in 0..3 {
                    next[i][j] += x * m[k][j];
                }
            }
        }
        out = next;
    }
    out
}

/// Plans the job from tick `from`, keeping decisions for ticks before `until`.
pub fn plan(job: &Job, chain: Chain, from: u32, until: u32) -> Plan {
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
    let (ly, lold, back) = (
        per_step(chain.lose_young),
        per_step(chain.lose_old),
        per_step(chain.regain),
    );
    let grow = (k / chain.young_ticks.max(1.0)).min(1.0);
    // One step of spot's state, and the same with "unavailable" absorbing (a spot instance
    // once lost stays lost).
    let step = [
        [(1.0 - ly) * (1.0 - grow), (1.0 - ly) * grow, ly],
        [0.0, 1.0 - lold, lold],
        [back, 0.0, 1.0 - back],
    ];
    let mut held = step;
    held[U] = [0.0, 0.0, 1.0];
    let (after_restart, kept_through_restart) = (power(step, r), power(held, r));
    let (spot_restart, od_restart) = (spot * f64::from(r), od * f64::from(r));

    let mut out = Plan {
        scale,
        from,
        until: until.max(from),
        work: w,
        deadline: d,
        restart: r,
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
    let mut decisions = vec![[WAIT; 8]; offsets[offsets.len() - 1]];

    // 2. Backward induction; values in rolling rows of R + 2 steps.
    let slots = r as usize + 2;
    let row = w as usize;
    let mut values = vec![[MISS; 8]; slots * row];
    let get = |values: &[[f64; 8]], t: u32, p: u32| -> [f64; 8] {
        if p >= w {
            [0.0; 8]
        } else if t >= d || p < out.lo(t) || p > out.hi(t) {
            [MISS; 8]
        } else {
            values[(t as usize % slots) * row + p as usize]
        }
    };
    // Modes by spot's state: idle, on spot (unavailable: idle), on on-demand.
    const IDLE: [usize; 3] = [0, 1, 2];
    const ON_SPOT: [usize; 3] = [3, 4, 2];
    const ON_OD: [usize; 3] = [5, 6, 7];
    let expect = |probs: &[f64; 3], v: &[f64; 8], modes: [usize; 3]| -> f64 {
        probs[Y] * v[modes[Y]] + probs[O] * v[modes[O]] + probs[U] * v[modes[U]]
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
                [MISS; 8]
            };
            let mut idle = [(0.0, WAIT); 3];
            let mut cont_spot = [MISS; 3];
            let mut cont_od = [0.0; 3];
            for s in [Y, O, U] {
                let wait = expect(&step[s], &stay, IDLE);
                cont_od[s] = od + expect(&step[s], &gain, ON_OD);
                if s != U {
                    cont_spot[s] = spot + expect(&step[s], &gain, ON_SPOT);
                }
                let (start_spot, start_od) = if r == 0 {
                    (cont_spot[s], cont_od[s])
                } else if fits {
                    (
                        if s == U {
                            MISS
                        } else {
                            spot_restart + expect(&kept_through_restart[s], &later, ON_SPOT)
                        },
                        od_restart + expect(&after_restart[s], &later, ON_OD),
                    )
                } else {
                    (MISS, MISS)
                };
                idle[s] = best(&[(start_spot, SPOT), (start_od, OD), (wait, WAIT)]);
            }
            // Keeping a running instance wins ties.
            let keep = |cont: f64, kind: u8, s: usize| best(&[(cont, kind), idle[s]]);
            let modes = [
                idle[Y],
                idle[O],
                idle[U],
                keep(cont_spot[Y], SPOT, Y),
                keep(cont_spot[O], SPOT, O),
                keep(cont_od[Y], OD, Y),
                keep(cont_od[O], OD, O),
                keep(cont_od[U], OD, U),
            ];
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
