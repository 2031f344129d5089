//! One deadline-bound job that may move between spot pools (zones, regions, clouds): the
//! model of [`super`] with several pools on one clock.
//!
//! What changes from one pool:
//! - Each tick the job runs on the spot of one pool (only while that pool has spot), on
//!   on-demand, or waits. On-demand is always available where the job's checkpoint is (its
//!   *location*); it is never worth starting elsewhere, since it costs the same everywhere.
//! - A start pays the restart R, as before. A spot start in a pool other than the location,
//!   once the job has a checkpoint (progress > 0), also pays M: moving the checkpoint there.
//!   Both are time without progress billed at the started instance's price. The location
//!   becomes the new pool when those R + M ticks are over; a spot lost before then leaves the
//!   checkpoint where it was (the copy is not trusted half-done). Before any progress there is
//!   nothing to move, and the first start anywhere pays R alone.
//! - The job starts located in the first pool.
//!
//! The traces are ticked on one clock: traces of different tick lengths are refused
//! ([`PoolsError::Ticks`]), never resampled.
//!
//! Policies ([`PoolPolicyName`]): on-demand; `uniform-progress` on the first pool;
//! `uniform-progress-rr`, which moves to the next pool on each preemption (the multi-region
//! baseline of the ADRS work); `spotplane` ([`Spotplane`]); and `optimal`
//! ([`solve`]), the omniscient optimum by dynamic programming over (tick, progress, location,
//! idle/spot/on-demand).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::policies::{self, Observer};
use super::{Choice, Kind, ModelError, Params, Policy, SpotPrice, Trace, View, markov, micro};

/// What a policy does during one tick, with several pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolChoice {
    /// No instance (terminating the current one, if any).
    Wait,
    /// Keep, or start, a spot instance in this pool.
    Spot(usize),
    /// Keep, or start, an on-demand instance where the checkpoint is.
    OnDemand,
}

/// One pool of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    /// Availability of ticks `0..deadline`.
    pub available: Vec<bool>,
    /// Spot micro-USD per hour at each tick `0..deadline`.
    pub spot_price: Vec<u64>,
}

/// Why several traces cannot be run together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoolsError {
    #[error(
        "the traces have different tick lengths ({0}); they are not resampled: pick traces \
         recorded at one resolution"
    )]
    Ticks(String),
    #[error("{0} spot prices for {1} traces; give one, or one per trace")]
    Prices(usize, usize),
    #[error("between 1 and {MAX_POOLS} traces, not {0}")]
    Count(usize),
    #[error("migration must be zero or more hours, not {0}")]
    Migrate(f64),
    #[error("pool {pool}: {source}")]
    Model { pool: usize, source: ModelError },
}

/// The most pools one model takes (the optimum's decision byte names the pool in five bits).
pub const MAX_POOLS: usize = 16;

/// The discretised problem with several pools.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolsModel {
    pub gap_seconds: u32,
    pub pools: Vec<Pool>,
    pub work: u32,
    pub deadline: u32,
    pub restart: u32,
    /// Ticks of moving the checkpoint to another pool (rounded up).
    pub migrate: u32,
    pub on_demand_price: u64,
}

impl PoolsModel {
    /// Discretises the job on the traces (one spot price for all, or one per trace).
    pub fn new(
        traces: &[(&str, &Trace)],
        p: &Params,
        spot_prices: &[SpotPrice],
        migrate_hours: f64,
    ) -> Result<PoolsModel, PoolsError> {
        if traces.is_empty() || traces.len() > MAX_POOLS {
            return Err(PoolsError::Count(traces.len()));
        }
        let gaps: Vec<u32> = traces.iter().map(|(_, t)| t.gap_seconds).collect();
        if gaps.iter().any(|&g| g != gaps[0]) {
            let list: Vec<String> = traces
                .iter()
                .map(|(name, t)| format!("{name}: {} s", t.gap_seconds))
                .collect();
            return Err(PoolsError::Ticks(list.join(", ")));
        }
        if spot_prices.len() != 1 && spot_prices.len() != traces.len() {
            return Err(PoolsError::Prices(spot_prices.len(), traces.len()));
        }
        if !(migrate_hours.is_finite() && migrate_hours >= 0.0) {
            return Err(PoolsError::Migrate(migrate_hours));
        }
        let mut pools = Vec::with_capacity(traces.len());
        let mut first = None;
        for (i, (_, trace)) in traces.iter().enumerate() {
            let price = spot_prices[i.min(spot_prices.len() - 1)];
            let one = super::Model::new(
                trace,
                &Params {
                    spot_price: price,
                    ..*p
                },
            )
            .map_err(|source| PoolsError::Model { pool: i, source })?;
            pools.push(Pool {
                available: one.available.clone(),
                spot_price: one.spot_price.clone(),
            });
            first.get_or_insert(one);
        }
        let Some(one) = first else {
            return Err(PoolsError::Count(0));
        };
        let migrate = u32::try_from(super::ticks(migrate_hours, one.gap_seconds, true))
            .map_err(|_| PoolsError::Migrate(migrate_hours))?;
        Ok(PoolsModel {
            gap_seconds: one.gap_seconds,
            pools,
            work: one.work,
            deadline: one.deadline,
            restart: one.restart,
            migrate,
            on_demand_price: micro(p.on_demand_price),
        })
    }

    pub fn available_at(&self, pool: usize, t: u32) -> bool {
        self.pools
            .get(pool)
            .and_then(|p| p.available.get(t as usize))
            .copied()
            .unwrap_or(false)
    }

    fn spot_price(&self, pool: usize, t: u32) -> u64 {
        let prices = &self.pools[pool].spot_price;
        prices
            .get(t as usize)
            .or(prices.last())
            .copied()
            .unwrap_or(0)
    }

    pub fn feasible(&self) -> bool {
        u64::from(self.restart) + u64::from(self.work) <= u64::from(self.deadline)
    }

    pub fn hours(&self, n: u64) -> f64 {
        n as f64 * f64::from(self.gap_seconds) / 3600.0
    }

    pub fn usd(&self, cost: u64) -> f64 {
        cost as f64 * f64::from(self.gap_seconds) / 3600.0 / 1e6
    }

    /// Ticks a start in `pool` spends before progress, from `location` with `progress` done.
    pub fn overhead(&self, pool: usize, location: usize, progress: u32) -> u32 {
        if progress > 0 && pool != location {
            self.restart + self.migrate
        } else {
            self.restart
        }
    }
}

/// The instance a job runs on, with several pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum On {
    Spot(usize),
    OnDemand,
}

/// Where the job is between two ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PoolsJob {
    pub progress: u32,
    pub running: Option<On>,
    pub overhead_left: u32,
    /// The pool the checkpoint is in.
    pub location: usize,
}

impl PoolsJob {
    /// Spends one tick on `choice`. Returns the instance billed, whether it was started, and
    /// whether the tick finished a move of the checkpoint.
    fn act(&mut self, m: &PoolsModel, choice: PoolChoice) -> (Option<On>, bool, bool) {
        let on = match choice {
            PoolChoice::Wait => {
                self.running = None;
                self.overhead_left = 0;
                return (None, false, false);
            }
            PoolChoice::Spot(j) => On::Spot(j),
            PoolChoice::OnDemand => On::OnDemand,
        };
        let started = self.running != Some(on);
        if started {
            self.running = Some(on);
            self.overhead_left = match on {
                On::Spot(j) => m.overhead(j, self.location, self.progress),
                On::OnDemand => m.restart,
            };
        }
        let before = self.progress;
        if self.overhead_left > 0 {
            self.overhead_left -= 1;
        } else {
            self.progress += 1;
        }
        // The checkpoint is in the new pool once the start's overhead is over.
        let mut moved = false;
        if let On::Spot(j) = on
            && self.overhead_left == 0
            && j != self.location
        {
            moved = before > 0;
            self.location = j;
        }
        (Some(on), started, moved)
    }
}

/// What an online policy knows at a tick: the job, and the pools' past and present.
#[derive(Debug, Clone, Copy)]
pub struct PoolsView<'a> {
    pub tick: u32,
    pub model: &'a PoolsModel,
    pub job: PoolsJob,
    /// Whether the spot instance of the last tick was lost at this one.
    pub preempted: bool,
}

impl PoolsView<'_> {
    pub fn pools(&self) -> usize {
        self.model.pools.len()
    }

    /// Spot in `pool` now.
    pub fn available(&self, pool: usize) -> bool {
        self.model.available_at(pool, self.tick)
    }

    pub fn spot_price(&self, pool: usize) -> u64 {
        self.model.spot_price(pool, self.tick)
    }

    pub fn slack(&self) -> i64 {
        i64::from(self.model.deadline)
            - i64::from(self.tick)
            - i64::from(self.model.work - self.job.progress)
    }

    /// The view one pool's policy would have, with `restart` ticks for its starts; the job
    /// on that pool's spot counts as on spot, any other spot as idle.
    fn one_pool(&self, pool: usize, restart: u32) -> View<'_> {
        let m = self.model;
        View {
            tick: self.tick,
            gap_seconds: m.gap_seconds,
            work: m.work,
            deadline: m.deadline,
            restart,
            progress: self.job.progress,
            running: match self.job.running {
                Some(On::Spot(j)) if j == pool => Some(Kind::Spot),
                Some(On::Spot(_)) | None => None,
                Some(On::OnDemand) => Some(Kind::OnDemand),
            },
            overhead_left: self.job.overhead_left,
            history: &m.pools[pool].available[..=self.tick as usize],
            spot_price: self.spot_price(pool),
            on_demand_price: m.on_demand_price,
        }
    }
}

/// An online multi-pool policy.
pub trait PoolPolicy {
    fn decide(&mut self, view: &PoolsView<'_>) -> PoolChoice;
}

/// What happened to the job under one policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolsOutcome {
    pub cost: u64,
    pub finish: u32,
    pub deadline_met: bool,
    pub spot_ticks: u64,
    pub on_demand_ticks: u64,
    pub restarts: u32,
    pub preemptions: u32,
    /// Moves of the checkpoint to another pool that completed.
    pub moves: u32,
}

/// Runs a policy tick by tick until the work is done; from the deadline on, on-demand.
pub fn simulate(m: &PoolsModel, policy: &mut dyn PoolPolicy) -> PoolsOutcome {
    let mut out = PoolsOutcome::default();
    let mut job = PoolsJob::default();
    let mut t = 0u32;
    while job.progress < m.work {
        let preempted = matches!(job.running, Some(On::Spot(j)) if !m.available_at(j, t));
        if preempted {
            job.running = None;
            job.overhead_left = 0;
            out.preemptions += 1;
        }
        let choice = if t >= m.deadline {
            PoolChoice::OnDemand
        } else {
            policy.decide(&PoolsView {
                tick: t,
                model: m,
                job,
                preempted,
            })
        };
        let choice = match choice {
            PoolChoice::Spot(j) if !m.available_at(j, t) => {
                debug_assert!(
                    false,
                    "a policy asked for spot in pool {j} at tick {t} without it"
                );
                PoolChoice::Wait
            }
            c => c,
        };
        let (billed, started, moved) = job.act(m, choice);
        out.restarts += u32::from(started);
        out.moves += u32::from(moved);
        match billed {
            Some(On::Spot(j)) => {
                out.cost += m.spot_price(j, t);
                out.spot_ticks += 1;
            }
            Some(On::OnDemand) => {
                out.cost += m.on_demand_price;
                out.on_demand_ticks += 1;
            }
            None => {}
        }
        t += 1;
    }
    out.finish = t;
    out.deadline_met = t <= m.deadline;
    out
}

/// A single-pool policy run on one pool, the rest ignored: `uniform-progress` on the first
/// pool.
#[derive(Debug, Default)]
pub struct OnePool<P> {
    pub pool: usize,
    pub policy: P,
}

fn to_pool(choice: Choice, pool: usize) -> PoolChoice {
    match choice {
        Choice::Wait => PoolChoice::Wait,
        Choice::Run(Kind::Spot) => PoolChoice::Spot(pool),
        Choice::Run(Kind::OnDemand) => PoolChoice::OnDemand,
    }
}

impl<P: Policy> PoolPolicy for OnePool<P> {
    fn decide(&mut self, v: &PoolsView<'_>) -> PoolChoice {
        let restart = v.model.overhead(self.pool, v.job.location, v.job.progress);
        to_pool(
            self.policy.decide(&v.one_pool(self.pool, restart)),
            self.pool,
        )
    }
}

/// Uniform Progress that moves to the next pool (round robin) each time its spot is
/// preempted: the multi-region baseline of the ADRS work ("uniform progress with round-robin
/// region switching"). Its rules see only the current pool. Its restart is that pool's
/// overhead (R, or R + M away from the checkpoint), so its Safety Net covers a move and it
/// never misses a feasible deadline.
#[derive(Debug, Default)]
pub struct RoundRobin {
    current: usize,
    policy: policies::UniformProgress,
}

impl PoolPolicy for RoundRobin {
    fn decide(&mut self, v: &PoolsView<'_>) -> PoolChoice {
        if v.preempted {
            self.current = (self.current + 1) % v.pools();
        }
        let restart = v
            .model
            .overhead(self.current, v.job.location, v.job.progress);
        to_pool(
            self.policy.decide(&v.one_pool(self.current, restart)),
            self.current,
        )
    }
}

/// spotplane across pools: one learned chain per pool ([`Observer`]), one plan per pool under
/// its chain (each tenth of the deadline), and a choice between them.
///
/// Each pool's plan is the least expected cost of the job were it to stay in that pool for
/// good (its restarts R, its spot price, its chain). At each decision the policy compares
/// the value of following the plan of the pool where the checkpoint is — keep the instance,
/// wait for that pool's spot, or on-demand — with the value of starting spot now in each other
/// pool that has it (R + M billed at its price, the chance of losing it during the move, then
/// that pool's plan), and takes the least. This is one step of policy improvement (a
/// rollout) over "stay in one pool": it is never worse than staying, in expectation under the
/// model, and it moves exactly when the model says a move pays its restart and migration.
/// [`guard`] then enforces the Safety Net Rule with the move's overhead, so it never misses a
/// feasible deadline whatever the plans say.
#[derive(Debug, Default)]
pub struct Spotplane {
    pools: Vec<Observer>,
    plans: Vec<markov::Plan>,
    replan_at: u32,
}

impl Spotplane {
    fn spot(&self, v: &PoolsView<'_>, pool: usize) -> markov::Spot {
        self.pools[pool].spot(v.available(pool), v.model.gap_seconds)
    }
}

impl PoolPolicy for Spotplane {
    fn decide(&mut self, v: &PoolsView<'_>) -> PoolChoice {
        let m = v.model;
        let gap = m.gap_seconds;
        if self.pools.len() != v.pools() {
            self.pools = vec![Observer::default(); v.pools()];
        }
        for (j, pool) in self.pools.iter_mut().enumerate() {
            pool.observe(m.available_at(j, v.tick), gap);
        }
        // Plan each pool for the next tenth of the deadline, with values far enough ahead to
        // price a move started at its end.
        if self.plans.is_empty() || v.tick >= self.replan_at {
            let every = (m.deadline / 10).max(1);
            self.replan_at = v.tick + every;
            let view = v.one_pool(0, m.restart);
            self.plans = (0..v.pools())
                .map(|j| {
                    markov::plan_with_values(
                        &policies::planned_job(&view, m.restart, v.spot_price(j)),
                        &self.pools[j].chain(gap),
                        v.tick,
                        self.replan_at + m.restart + m.migrate + 1,
                    )
                })
                .collect();
        }
        let job = v.job;
        let here = job.location;
        let wanted = match job.running {
            Some(on) if job.overhead_left > 0 => match on {
                On::Spot(j) => PoolChoice::Spot(j),
                On::OnDemand => PoolChoice::OnDemand,
            },
            _ => {
                let mode = markov::Mode {
                    running: v.one_pool(here, m.restart).running,
                    spot: self.spot(v, here),
                };
                let plan = &self.plans[here];
                let stay = plan
                    .decide(v.tick, job.progress, mode)
                    .map(|c| to_pool(c, here));
                let stay_value = plan.value(v.tick, job.progress, mode);
                // A move is weighed only away from a spot instance the plan keeps.
                let keeps_spot =
                    job.running == Some(On::Spot(here)) && stay == Some(PoolChoice::Spot(here));
                let mut best = (stay_value.unwrap_or(f64::INFINITY), stay);
                if !keeps_spot {
                    for j in (0..v.pools()).filter(|&j| j != here && v.available(j)) {
                        let markov::Spot::Available(class) = self.spot(v, j) else {
                            continue;
                        };
                        let overhead = m.overhead(j, here, job.progress);
                        if let Some(q) =
                            self.plans[j].start_spot_value(v.tick, job.progress, class, overhead)
                            && q < best.0
                        {
                            best = (q, Some(PoolChoice::Spot(j)));
                        }
                    }
                }
                best.1.unwrap_or(PoolChoice::OnDemand)
            }
        };
        guard(v, wanted)
    }
}

/// The Safety Net Rule with several pools, in whole ticks (`s` = slack, `o` = a spot start's
/// overhead in its pool: R, or R + M away from the checkpoint):
/// - keep a running spot: it was started with `s ≥ R + o`, so losing it, even mid-move,
///   still leaves R for on-demand where the checkpoint is;
/// - start spot only where it is available and `s ≥ R + o`;
/// - wait only when `s > 2R`;
/// - otherwise on-demand.
pub fn guard(v: &PoolsView<'_>, wanted: PoolChoice) -> PoolChoice {
    let m = v.model;
    let (slack, r) = (v.slack(), i64::from(m.restart));
    match wanted {
        PoolChoice::Spot(j) if v.job.running == Some(On::Spot(j)) => wanted,
        PoolChoice::Spot(j)
            if v.available(j)
                && slack >= r + i64::from(m.overhead(j, v.job.location, v.job.progress)) =>
        {
            wanted
        }
        PoolChoice::Spot(_) | PoolChoice::Wait if slack > 2 * r => PoolChoice::Wait,
        _ => PoolChoice::OnDemand,
    }
}

/// On-demand from tick 0.
#[derive(Debug, Default)]
pub struct OnDemand;

impl PoolPolicy for OnDemand {
    fn decide(&mut self, _: &PoolsView<'_>) -> PoolChoice {
        PoolChoice::OnDemand
    }
}

/// Plays back a fixed list of choices (`Wait` after its end).
#[derive(Debug, Clone)]
pub struct Scripted<'a> {
    pub choices: &'a [PoolChoice],
}

impl PoolPolicy for Scripted<'_> {
    fn decide(&mut self, v: &PoolsView<'_>) -> PoolChoice {
        self.choices
            .get(v.tick as usize)
            .copied()
            .unwrap_or(PoolChoice::Wait)
    }
}

/// The optimal schedule across pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolsPlan {
    pub cost: u64,
    pub choices: Vec<PoolChoice>,
    /// States computed (triples `(t, p, location)` in the band).
    pub cells: u64,
}

const INF: u64 = u64::MAX;
/// Idle decision (bits 0–4): wait, on-demand, or spot in pool `d - SPOT0`; none feasible.
const WAIT: u8 = 0;
const START_OD: u8 = 1;
const SPOT0: u8 = 2;
const NONE: u8 = 31;
const IDLE_BITS: u8 = 31;
const KEEP_SPOT: u8 = 32;
const KEEP_OD: u8 = 64;

/// The omniscient optimum across pools by dynamic programming, exact for the ticked model;
/// `None` when on-demand from tick 0 misses the deadline.
///
/// State at the start of tick `t`: progress `p < work`, location `l`, and idle, on spot in
/// `l` (its overhead paid) or on on-demand (at `l`, its restart paid). As in
/// [`super::optimal`], a start is one move of its overhead `o` (R, or R + M to another pool
/// once `p > 0`), offered for spot only when the pool has spot for all `o` ticks:
///
/// ```text
/// idle(t, p, l)     = min( idle(t+1, p, l),
///                          R·od + od(t+R, p, l),
///                          min over pools j: Σ spot_j[t..t+o) + spot(t+o, p, j) )
/// spot(t, p, l)     = idle(t, p, l)                              if l has no spot at t
///                   = min( spot_l[t] + spot(t+1, p+1, l), idle(t, p, l) )
/// od(t, p, l)       = min( od + od(t+1, p+1, l), idle(t, p, l) )
/// ```
///
/// Cost and time are `O(deadline × band × pools²)`; values live in rolling arrays of
/// `R + M + 2` ticks, decisions take a byte per `(t, p, l)`.
pub fn solve(m: &PoolsModel) -> Option<PoolsPlan> {
    if !m.feasible() {
        return None;
    }
    let (w, d, r) = (m.work, m.deadline, m.restart);
    let k = m.pools.len();
    let du = d as usize;
    let lo = |t: u32| w.saturating_sub(d - t);
    let hi = |t: u32| (w - 1).min(t.saturating_sub(r));
    let run_len: Vec<Vec<u32>> = m
        .pools
        .iter()
        .map(|pool| {
            let mut run = vec![0u32; du + 1];
            for t in (0..du).rev() {
                run[t] = if pool.available[t] { run[t + 1] + 1 } else { 0 };
            }
            run
        })
        .collect();
    let prefix: Vec<Vec<u64>> = m
        .pools
        .iter()
        .map(|pool| {
            let mut sum = vec![0u64; du + 1];
            for t in 0..du {
                sum[t + 1] = sum[t] + pool.spot_price[t];
            }
            sum
        })
        .collect();
    let od = m.on_demand_price;
    let slots = (r + m.migrate) as usize + 2;
    let width = w as usize;
    let index = |t: u32, p: u32, l: usize| ((t as usize % slots) * k + l) * width + p as usize;
    let (mut idle, mut spot, mut on_od) = (
        vec![INF; slots * k * width],
        vec![INF; slots * k * width],
        vec![INF; slots * k * width],
    );
    let get = |table: &[u64], t: u32, p: u32, l: usize| -> u64 {
        if p >= w {
            0
        } else if t >= d || p < lo(t) || p > hi(t) {
            INF
        } else {
            table[index(t, p, l)]
        }
    };
    let mut offset = vec![0u64; du + 1];
    for t in 0..d {
        let width = if lo(t) > hi(t) {
            0
        } else {
            u64::from(hi(t) - lo(t)) + 1
        };
        offset[t as usize + 1] = offset[t as usize] + width * k as u64;
    }
    let cells = offset[du];
    let mut decisions = vec![NONE; cells as usize];
    let cell = |t: u32, p: u32, l: usize| {
        (offset[t as usize] + (u64::from(p - lo(t))) * k as u64 + l as u64) as usize
    };
    for t in (0..d).rev() {
        let (lo_t, hi_t) = (lo(t), hi(t));
        if lo_t > hi_t {
            continue;
        }
        let tu = t as usize;
        for p in lo_t..=hi_t {
            for l in 0..k {
                let wait = get(&idle, t + 1, p, l);
                let start_od = if r == 0 {
                    od.saturating_add(get(&on_od, t + 1, p + 1, l))
                } else if t + r <= d {
                    (od * u64::from(r)).saturating_add(get(&on_od, t + r, p, l))
                } else {
                    INF
                };
                // Ties go to spot (the lowest pool), then on-demand, then waiting.
                let (mut best, mut dec) = (INF, NONE);
                for j in 0..k {
                    let o = m.overhead(j, l, p);
                    let v = if o == 0 {
                        if m.pools[j].available[tu] {
                            m.pools[j].spot_price[tu].saturating_add(get(&spot, t + 1, p + 1, j))
                        } else {
                            INF
                        }
                    } else if t + o <= d && run_len[j][tu] >= o {
                        (prefix[j][tu + o as usize] - prefix[j][tu]).saturating_add(get(
                            &spot,
                            t + o,
                            p,
                            j,
                        ))
                    } else {
                        INF
                    };
                    if v < best {
                        (best, dec) = (v, SPOT0 + j as u8);
                    }
                }
                if start_od < best {
                    (best, dec) = (start_od, START_OD);
                }
                if wait < best {
                    (best, dec) = (wait, WAIT);
                }
                let v_idle = best;
                let cont_s = if m.pools[l].available[tu] {
                    m.pools[l].spot_price[tu].saturating_add(get(&spot, t + 1, p + 1, l))
                } else {
                    INF
                };
                let cont_o = od.saturating_add(get(&on_od, t + 1, p + 1, l));
                let v_spot = if cont_s != INF && cont_s <= v_idle {
                    dec |= KEEP_SPOT;
                    cont_s
                } else {
                    v_idle
                };
                let v_od = if cont_o != INF && cont_o <= v_idle {
                    dec |= KEEP_OD;
                    cont_o
                } else {
                    v_idle
                };
                let i = index(t, p, l);
                idle[i] = v_idle;
                spot[i] = v_spot;
                on_od[i] = v_od;
                decisions[cell(t, p, l)] = dec;
            }
        }
    }
    let cost = get(&idle, 0, 0, 0);
    if cost == INF {
        debug_assert!(false, "a feasible model has an infeasible optimum");
        return None;
    }
    // Replay forwards from (0, 0, pool 0, idle).
    let mut choices = Vec::with_capacity(du);
    let (mut t, mut p, mut l) = (0u32, 0u32, 0usize);
    let mut on: Option<On> = None;
    while p < w {
        if t >= d || p < lo(t) || p > hi(t) {
            debug_assert!(false, "the optimal plan left the band at t={t}, p={p}");
            return None;
        }
        let dec = decisions[cell(t, p, l)];
        match on {
            Some(On::Spot(j)) if m.available_at(j, t) && dec & KEEP_SPOT != 0 => {
                choices.push(PoolChoice::Spot(j));
                (t, p) = (t + 1, p + 1);
            }
            Some(On::OnDemand) if dec & KEEP_OD != 0 => {
                choices.push(PoolChoice::OnDemand);
                (t, p) = (t + 1, p + 1);
            }
            Some(_) => on = None,
            None => match dec & IDLE_BITS {
                WAIT => {
                    choices.push(PoolChoice::Wait);
                    t += 1;
                }
                START_OD => {
                    let o = r.max(1);
                    choices.extend(std::iter::repeat_n(PoolChoice::OnDemand, o as usize));
                    (t, p) = (t + o, p + u32::from(r == 0));
                    on = Some(On::OnDemand);
                }
                NONE => {
                    debug_assert!(false, "the optimal plan reached a dead end at t={t}");
                    return None;
                }
                s => {
                    let j = usize::from(s - SPOT0);
                    let o = m.overhead(j, l, p);
                    let ticks = o.max(1);
                    choices.extend(std::iter::repeat_n(PoolChoice::Spot(j), ticks as usize));
                    (t, p, l) = (t + ticks, p + u32::from(o == 0), j);
                    on = Some(On::Spot(j));
                }
            },
        }
    }
    Some(PoolsPlan {
        cost,
        choices,
        cells,
    })
}

/// The policies of `spotplane bench deadline` with several traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolPolicyName {
    OnDemand,
    UniformProgress,
    UniformProgressRr,
    Spotplane,
    Optimal,
}

impl PoolPolicyName {
    pub const ALL: [PoolPolicyName; 5] = [
        PoolPolicyName::OnDemand,
        PoolPolicyName::UniformProgress,
        PoolPolicyName::UniformProgressRr,
        PoolPolicyName::Spotplane,
        PoolPolicyName::Optimal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PoolPolicyName::OnDemand => "on-demand",
            PoolPolicyName::UniformProgress => "uniform-progress",
            PoolPolicyName::UniformProgressRr => "uniform-progress-rr",
            PoolPolicyName::Spotplane => "spotplane",
            PoolPolicyName::Optimal => "optimal",
        }
    }

    /// Parses a list such as `spotplane,optimal` or `all`.
    pub fn parse_list<S: AsRef<str>>(names: &[S]) -> Result<Vec<PoolPolicyName>, String> {
        super::parse_names(names, &Self::ALL)
    }
}

impl fmt::Display for PoolPolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PoolPolicyName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown policy {s:?} with several traces; expected one of on-demand, \
                     uniform-progress, uniform-progress-rr, spotplane, optimal, all"
                )
            })
    }
}

/// Runs a policy by name; the optimum is the DP's plan replayed through [`simulate`].
pub fn run(m: &PoolsModel, name: PoolPolicyName) -> PoolsOutcome {
    match name {
        PoolPolicyName::OnDemand => simulate(m, &mut OnDemand),
        PoolPolicyName::UniformProgress => {
            simulate(m, &mut OnePool::<policies::UniformProgress>::default())
        }
        PoolPolicyName::UniformProgressRr => simulate(m, &mut RoundRobin::default()),
        PoolPolicyName::Spotplane => simulate(m, &mut Spotplane::default()),
        PoolPolicyName::Optimal => match solve(m) {
            Some(plan) => simulate(
                m,
                &mut Scripted {
                    choices: &plan.choices,
                },
            ),
            None => simulate(m, &mut OnDemand),
        },
    }
}

/// One policy's result: a line of `spotplane bench deadline --json` with several traces.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolsReport {
    pub policy: &'static str,
    pub cost_usd: f64,
    pub finish_hours: f64,
    pub deadline_met: bool,
    pub spot_hours: f64,
    pub on_demand_hours: f64,
    pub restarts: u32,
    pub preemptions: u32,
    pub moves: u32,
}

impl PoolsReport {
    pub fn new(m: &PoolsModel, name: PoolPolicyName, o: &PoolsOutcome) -> PoolsReport {
        PoolsReport {
            policy: name.as_str(),
            cost_usd: m.usd(o.cost),
            finish_hours: m.hours(u64::from(o.finish)),
            deadline_met: o.deadline_met,
            spot_hours: m.hours(o.spot_ticks),
            on_demand_hours: m.hours(o.on_demand_ticks),
            restarts: o.restarts,
            preemptions: o.preemptions,
            moves: o.moves,
        }
    }
}

/// The human-readable table of several reports.
pub fn format_table(reports: &[PoolsReport]) -> String {
    use std::fmt::Write as _;
    let mut s = format!(
        "{:<20} {:>10} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6}\n",
        "POLICY",
        "COST_USD",
        "FINISH_H",
        "DEADLINE",
        "SPOT_H",
        "OD_H",
        "RESTARTS",
        "PREEMPT",
        "MOVES"
    );
    for r in reports {
        let _ = writeln!(
            s,
            "{:<20} {:>10.2} {:>9.2} {:>8} {:>8.2} {:>8.2} {:>8} {:>8} {:>6}",
            r.policy,
            r.cost_usd,
            r.finish_hours,
            if r.deadline_met { "met" } else { "MISSED" },
            r.spot_hours,
            r.on_demand_hours,
            r.restarts,
            r.preemptions,
            r.moves
        );
    }
    s
}

#[cfg(test)]
#[path = "pools_tests.rs"]
mod tests;
