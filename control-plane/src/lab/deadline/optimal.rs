//! The omniscient offline optimum (the paper's Omniscient policy, §5.3) by dynamic programming
//! over the whole trace, exact for the discretised model of [`super`].
//!
//! State at the start of tick `t`: progress `p` (ticks of work done, `p < work`) and what the
//! job is on: idle (no instance), or a running spot or on-demand instance whose restart is
//! already paid. Values are the least cost from there to the end; a finished job costs
//! nothing more, and a state at the deadline with work left is infeasible.
//!
//! The restart overhead is not a state dimension: a start is one move of `restart` ticks,
//! `idle(t, p) → run(t + restart, p)`, billed at the started kind's price. That loses nothing:
//! leaving an instance before its restart is paid, or a spot start that is preempted during
//! its restart, ends idle at the same progress having paid something, which waiting would
//! have reached for free. So a spot start is only offered when spot stays available for the
//! whole restart.
//!
//! ```text
//! idle(t, p)        = min( idle(t+1, p),                                   wait
//!                          Σ spot[t..t+R) + run_spot(t+R, p),              start spot
//!                          R·od            + run_od(t+R, p) )              start on-demand
//! run_spot(t, p)    = idle(t, p)                             if spot is gone at t
//!                   = min( spot[t] + run_spot(t+1, p+1), idle(t, p) )      otherwise
//! run_od(t, p)      = min( od + run_od(t+1, p+1), idle(t, p) )
//! ```
//!
//! (`R = 0` makes a start the same as continuing: `start = spot[t] + run_spot(t+1, p+1)`.)
//! Leaving an instance for another one is "stop, then start", which costs the same.
//!
//! Only the band of reachable, still-feasible progress is computed at each tick:
//! `work − (deadline − t) ≤ p ≤ t − R` (no progress before a first restart is paid). Values
//! live in rolling arrays of `R + 2` ticks (runs) and 2 ticks (idle); what remains of the
//! whole table is one 4-bit decision per state-pair `(t, p)` in the band, enough to replay the
//! optimal plan forwards. Cost and time are `O(deadline × band)`; memory is
//! `(2R + 6) × work × 8` bytes of values plus `cells / 2` bytes of decisions ([`Plan`]).

use super::{Choice, Kind, Model, Policy, View};

const INF: u64 = u64::MAX;

/// Idle decision (bits 0–1).
const WAIT: u8 = 0;
const START_SPOT: u8 = 1;
const START_OD: u8 = 2;
const NONE: u8 = 3;
/// Running spot / on-demand: continue (else stop, then do what idle does).
const KEEP_SPOT: u8 = 4;
const KEEP_OD: u8 = 8;

/// The optimal schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The least cost, in the units of [`super::Outcome::cost`].
    pub cost: u64,
    /// What to do at each tick until the work is done.
    pub choices: Vec<Choice>,
    /// States computed (pairs `(t, p)` in the band) and bytes the tables took.
    pub cells: u64,
    pub bytes: usize,
}

impl Plan {
    /// The plan as a policy, to replay it through [`super::simulate`].
    pub fn policy(&self) -> Scripted<'_> {
        Scripted {
            choices: &self.choices,
        }
    }
}

/// Plays back a fixed list of choices (`Wait` after its end).
#[derive(Debug, Clone)]
pub struct Scripted<'a> {
    pub choices: &'a [Choice],
}

impl Policy for Scripted<'_> {
    fn decide(&mut self, view: &View<'_>) -> Choice {
        self.choices
            .get(view.tick as usize)
            .copied()
            .unwrap_or(Choice::Wait)
    }
}

/// Values of one state kind for a window of ticks, each tick a row of `width` progress values.
struct Rows {
    data: Vec<u64>,
    slots: usize,
    width: usize,
}

/// The progress band of tick `t` (inclusive; empty when `lo > hi`), for `p < work`.
#[derive(Clone, Copy)]
struct Band {
    work: u32,
    deadline: u32,
    restart: u32,
}

impl Band {
    fn lo(&self, t: u32) -> u32 {
        self.work.saturating_sub(self.deadline - t)
    }
    fn hi(&self, t: u32) -> u32 {
        (self.work - 1).min(t.saturating_sub(self.restart))
    }
    fn width(&self, t: u32) -> u64 {
        let (lo, hi) = (self.lo(t), self.hi(t));
        if lo > hi { 0 } else { u64::from(hi - lo) + 1 }
    }
}

impl Rows {
    fn new(slots: usize, width: usize) -> Rows {
        Rows {
            data: vec![INF; slots * width],
            slots,
            width,
        }
    }

    /// The value at `(t, p)`: 0 once the work is done, infeasible outside the band.
    #[inline]
    fn get(&self, band: Band, t: u32, p: u32) -> u64 {
        if p >= band.work {
            0
        } else if t >= band.deadline || p < band.lo(t) || p > band.hi(t) {
            INF
        } else {
            self.data[(t as usize % self.slots) * self.width + p as usize]
        }
    }

    #[inline]
    fn set(&mut self, t: u32, p: u32, v: u64) {
        self.data[(t as usize % self.slots) * self.width + p as usize] = v;
    }
}

/// The optimal plan, or `None` when no schedule meets the deadline (exactly when on-demand
/// from tick 0 does not: [`Model::feasible`]).
pub fn solve(model: &Model) -> Option<Plan> {
    if !model.feasible() {
        return None;
    }
    let (w, d, r) = (model.work, model.deadline, model.restart);
    let band = Band {
        work: w,
        deadline: d,
        restart: r,
    };
    let du = d as usize;
    // Consecutive available ticks from t, and spot price prefix sums.
    let mut run_len = vec![0u32; du + 1];
    for t in (0..du).rev() {
        run_len[t] = if model.available[t] {
            run_len[t + 1] + 1
        } else {
            0
        };
    }
    let mut prefix = vec![0u64; du + 1];
    for t in 0..du {
        prefix[t + 1] = prefix[t] + model.spot_price[t];
    }
    let od = model.on_demand_price;
    let od_restart = od * u64::from(r);

    let width = w as usize;
    let mut run_spot = Rows::new(r as usize + 2, width);
    let mut run_od = Rows::new(r as usize + 2, width);
    let mut idle = Rows::new(2, width);
    let mut offset = vec![0u64; du + 1];
    for t in 0..d {
        offset[t as usize + 1] = offset[t as usize] + band.width(t);
    }
    let cells = offset[du];
    let mut decisions = vec![0u8; cells.div_ceil(2) as usize];
    let bytes = (run_spot.data.len() + run_od.data.len() + idle.data.len()) * 8
        + decisions.len()
        + (run_len.len() * 4)
        + (prefix.len() + offset.len()) * 8;

    for t in (0..d).rev() {
        let (lo, hi) = (band.lo(t), band.hi(t));
        if lo > hi {
            continue;
        }
        let tu = t as usize;
        let avail = model.available[tu];
        let spot = model.spot_price[tu];
        let fits = u64::from(t) + u64::from(r) <= u64::from(d);
        let spot_can_start = fits && run_len[tu] >= r;
        let spot_restart = if spot_can_start {
            prefix[tu + r as usize] - prefix[tu]
        } else {
            INF
        };
        for p in lo..=hi {
            let cont_s = if avail {
                spot.saturating_add(run_spot.get(band, t + 1, p + 1))
            } else {
                INF
            };
            let cont_o = od.saturating_add(run_od.get(band, t + 1, p + 1));
            let wait = idle.get(band, t + 1, p);
            let (start_s, start_o) = if r == 0 {
                (cont_s, cont_o)
            } else {
                (
                    if spot_can_start {
                        spot_restart.saturating_add(run_spot.get(band, t + r, p))
                    } else {
                        INF
                    },
                    if fits {
                        od_restart.saturating_add(run_od.get(band, t + r, p))
                    } else {
                        INF
                    },
                )
            };
            // Ties go to spot, then on-demand, then waiting: of plans of equal cost, the one
            // that makes progress first.
            let (mut v_idle, mut dec) = (start_s, START_SPOT);
            if start_o < v_idle {
                (v_idle, dec) = (start_o, START_OD);
            }
            if wait < v_idle {
                (v_idle, dec) = (wait, WAIT);
            }
            if v_idle == INF {
                dec = NONE;
            }
            // Ties go to keeping the instance (so a plan never restarts what it runs).
            let v_spot = if avail && cont_s <= v_idle {
                dec |= KEEP_SPOT;
                cont_s
            } else {
                v_idle
            };
            let v_od = if cont_o <= v_idle {
                dec |= KEEP_OD;
                cont_o
            } else {
                v_idle
            };
            idle.set(t, p, v_idle);
            run_spot.set(t, p, v_spot);
            run_od.set(t, p, v_od);
            let cell = offset[tu] + u64::from(p - lo);
            decisions[(cell / 2) as usize] |= dec << (4 * (cell % 2));
        }
    }
    let cost = idle.get(band, 0, 0);
    if cost == INF {
        debug_assert!(false, "a feasible model has an infeasible optimum");
        return None;
    }

    // Replay the decisions forwards from (0, 0, idle).
    let decision = |t: u32, p: u32| -> u8 {
        let cell = offset[t as usize] + u64::from(p - band.lo(t));
        (decisions[(cell / 2) as usize] >> (4 * (cell % 2))) & 0xf
    };
    let mut choices = Vec::with_capacity(du);
    let (mut t, mut p) = (0u32, 0u32);
    let mut on: Option<Kind> = None;
    while p < w {
        if t >= d || p < band.lo(t) || p > band.hi(t) {
            debug_assert!(false, "the optimal plan left the band at t={t}, p={p}");
            return None;
        }
        let dec = decision(t, p);
        match on {
            Some(Kind::Spot) if model.available[t as usize] && dec & KEEP_SPOT != 0 => {
                choices.push(Choice::Run(Kind::Spot));
                (t, p) = (t + 1, p + 1);
            }
            Some(Kind::OnDemand) if dec & KEEP_OD != 0 => {
                choices.push(Choice::Run(Kind::OnDemand));
                (t, p) = (t + 1, p + 1);
            }
            Some(_) => on = None,
            None => {
                let kind = match dec & 3 {
                    WAIT => {
                        choices.push(Choice::Wait);
                        t += 1;
                        continue;
                    }
                    START_SPOT => Kind::Spot,
                    START_OD => Kind::OnDemand,
                    _ => {
                        debug_assert!(false, "the optimal plan reached a dead end at t={t}");
                        return None;
                    }
                };
                choices.extend(std::iter::repeat_n(Choice::Run(kind), r as usize));
                t += r;
                on = Some(kind);
            }
        }
    }
    Some(Plan {
        cost,
        choices,
        cells,
        bytes,
    })
}
