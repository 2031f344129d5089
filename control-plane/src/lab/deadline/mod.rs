//! One deadline-bound job on one spot pool, in the model of "Can't Be Late: Optimizing Spot
//! Instance Savings under Deadlines" (Wu et al., NSDI '24, §3.1), replayed on that paper's
//! traces (`shared/data/spot/cant-be-late`).
//!
//! The model, in ticks of the trace (`gap_seconds` G each):
//! - The job needs `work` ticks of compute and must have them by the end of tick
//!   `deadline - 1` (the deadline is counted from tick 0, where the run starts).
//! - At each tick it runs on spot (only while the trace says spot is available), on on-demand
//!   (always available), or waits, which is free.
//! - Progress is kept across preemptions (the job checkpoints on the notice). Every start on a
//!   new instance — the first, after a preemption, or a switch between spot and on-demand —
//!   first spends `restart` ticks without progress, billed at the price of the instance being
//!   started (the paper's changeover delay d). Stopping is free; a finished job stops at once.
//! - A spot instance running at tick t is preempted at tick t+1 when the trace says spot is
//!   not available at t+1; the policy sees that at t+1, before it decides.
//! - Every tick an instance is alive is billed in full: spot at the spot price of that tick
//!   (fixed or from the trace's `prices`), on-demand at its price.
//!
//! Rounding into ticks is conservative: work and restart are rounded up to whole ticks, the
//! deadline down. Costs are whole numbers of micro-USD per hour × ticks (prices rounded to
//! the micro-dollar per hour), so every policy and the optimum are compared exactly.
//!
//! A trace shorter than the deadline is refused ([`ModelError::TraceTooShort`]) rather than
//! padded: padding with "not available" would silently price a gap in the data as an outage.
//! A policy still short of its work at the deadline has missed it; the simulator then finishes
//! the job on on-demand so that cost and finish time are still reported.
//!
//! Policies ([`policies`]) are online: they see the availability of the ticks so far and now,
//! never the future; `spotplane`'s plans come from [`markov`]. [`optimal`] is the omniscient
//! offline optimum by dynamic programming.
//! Nothing here does I/O or reads a clock except [`trace::load`], which reads the file.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

pub mod optimal;
pub mod policies;
pub mod pools;
pub mod trace;

#[cfg(test)]
mod limits;
#[cfg(test)]
mod tests;

pub use crate::planner::markov::{self, Choice, Kind};
pub use trace::TraceError;

/// A parsed trace: availability per tick (`true` = spot available).
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub gap_seconds: u32,
    pub available: Vec<bool>,
    /// Spot USD per hour at each tick, where the file has them.
    pub spot_prices: Option<Vec<f64>>,
}

impl Trace {
    pub fn hours(&self) -> f64 {
        self.available.len() as f64 * f64::from(self.gap_seconds) / 3600.0
    }
}

/// The spot price of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SpotPrice {
    /// USD per hour, constant.
    Fixed(f64),
    /// The trace's own `prices`, tick by tick.
    Trace,
}

impl FromStr for SpotPrice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "trace" {
            return Ok(SpotPrice::Trace);
        }
        s.parse::<f64>()
            .map(SpotPrice::Fixed)
            .map_err(|e| format!("{s:?}: expected USD per hour or \"trace\" ({e})"))
    }
}

/// The job and the prices, in the units a person gives them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub work_hours: f64,
    pub deadline_hours: f64,
    pub restart_hours: f64,
    pub spot_price: SpotPrice,
    /// USD per hour.
    pub on_demand_price: f64,
}

/// Why a trace and parameters cannot be run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    #[error("{}", .0.join("; "))]
    Invalid(Vec<String>),
    #[error(
        "the trace has {trace_ticks} ticks ({trace_hours:.2} h) but the deadline needs \
         {deadline_ticks} ({deadline_hours} h); use a shorter deadline"
    )]
    TraceTooShort {
        trace_ticks: usize,
        trace_hours: f64,
        deadline_ticks: u32,
        deadline_hours: f64,
    },
}

/// Micro-USD per hour.
fn micro(usd_per_hour: f64) -> u64 {
    (usd_per_hour * 1e6).round() as u64
}

/// Hours as whole ticks, through whole milliseconds so that `48 h / 32 s` is exactly 5400.
fn ticks(hours: f64, gap_seconds: u32, round_up: bool) -> u64 {
    let ms = (hours * 3_600_000.0).round() as u64;
    let gap_ms = u64::from(gap_seconds) * 1000;
    if round_up {
        ms.div_ceil(gap_ms)
    } else {
        ms / gap_ms
    }
}

/// The discretised problem every policy is run on.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub gap_seconds: u32,
    /// Availability of ticks `0..deadline` (the rest of the trace is never used).
    pub available: Vec<bool>,
    /// Ticks of compute the job needs (rounded up).
    pub work: u32,
    /// Ticks until the deadline (rounded down).
    pub deadline: u32,
    /// Ticks without progress after each start (rounded up).
    pub restart: u32,
    /// Spot micro-USD per hour at each tick `0..deadline`.
    pub spot_price: Vec<u64>,
    /// On-demand micro-USD per hour.
    pub on_demand_price: u64,
}

impl Model {
    /// Checks the parameters (all problems at once) and discretises them on the trace.
    pub fn new(trace: &Trace, p: &Params) -> Result<Model, ModelError> {
        let mut problems = Vec::new();
        let g = trace.gap_seconds;
        for (name, v) in [
            ("work", p.work_hours),
            ("deadline", p.deadline_hours),
            ("on-demand price", p.on_demand_price),
        ] {
            if !(v.is_finite() && v > 0.0) {
                problems.push(format!("{name} must be positive, not {v}"));
            }
        }
        if !(p.restart_hours.is_finite() && p.restart_hours >= 0.0) {
            problems.push(format!(
                "restart overhead must be zero or more, not {}",
                p.restart_hours
            ));
        }
        match p.spot_price {
            SpotPrice::Fixed(s) if !(s.is_finite() && s >= 0.0) => {
                problems.push(format!("spot price must be zero or more, not {s}"));
            }
            SpotPrice::Trace if trace.spot_prices.is_none() => {
                problems.push("the trace has no \"prices\"; give a spot price".into());
            }
            _ => {}
        }
        if g == 0 {
            problems.push("the trace's gap_seconds is 0".into());
        }
        if !problems.is_empty() {
            return Err(ModelError::Invalid(problems));
        }
        let as_ticks = |hours: f64, up: bool, name: &str, problems: &mut Vec<String>| {
            u32::try_from(ticks(hours, g, up)).unwrap_or_else(|_| {
                problems.push(format!("{name} of {hours} h is too long"));
                0
            })
        };
        let work = as_ticks(p.work_hours, true, "work", &mut problems);
        let deadline = as_ticks(p.deadline_hours, false, "deadline", &mut problems);
        let restart = as_ticks(p.restart_hours, true, "restart overhead", &mut problems);
        if deadline == 0 {
            problems.push(format!(
                "a deadline of {} h is shorter than one tick ({g} s)",
                p.deadline_hours
            ));
        }
        if !problems.is_empty() {
            return Err(ModelError::Invalid(problems));
        }
        let d = deadline as usize;
        if trace.available.len() < d {
            return Err(ModelError::TraceTooShort {
                trace_ticks: trace.available.len(),
                trace_hours: trace.hours(),
                deadline_ticks: deadline,
                deadline_hours: p.deadline_hours,
            });
        }
        let spot_price = match (p.spot_price, &trace.spot_prices) {
            (SpotPrice::Trace, Some(prices)) => prices[..d].iter().map(|&x| micro(x)).collect(),
            (SpotPrice::Fixed(s), _) => vec![micro(s); d],
            // Refused above.
            (SpotPrice::Trace, None) => vec![0; d],
        };
        Ok(Model {
            gap_seconds: g,
            available: trace.available[..d].to_vec(),
            work,
            deadline,
            restart,
            spot_price,
            on_demand_price: micro(p.on_demand_price),
        })
    }

    /// Spot availability at tick `t`; none after the deadline.
    pub fn available_at(&self, t: u32) -> bool {
        self.available.get(t as usize).copied().unwrap_or(false)
    }

    /// Whether on-demand from tick 0 meets the deadline; if it does not, nothing does.
    pub fn feasible(&self) -> bool {
        u64::from(self.restart) + u64::from(self.work) <= u64::from(self.deadline)
    }

    /// Hours of `n` ticks.
    pub fn hours(&self, n: u64) -> f64 {
        n as f64 * f64::from(self.gap_seconds) / 3600.0
    }

    /// USD of a cost in micro-USD per hour × ticks.
    pub fn usd(&self, cost: u64) -> f64 {
        cost as f64 * f64::from(self.gap_seconds) / 3600.0 / 1e6
    }

    fn price(&self, kind: Kind, t: u32) -> u64 {
        match kind {
            Kind::OnDemand => self.on_demand_price,
            // After the deadline spot is never available; the last price is a placeholder.
            Kind::Spot => self
                .spot_price
                .get(t as usize)
                .or(self.spot_price.last())
                .copied()
                .unwrap_or(0),
        }
    }
}

/// What an online policy knows when it decides for tick `tick`.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    pub tick: u32,
    /// Seconds per tick (the trace's resolution, not its content).
    pub gap_seconds: u32,
    pub work: u32,
    pub deadline: u32,
    pub restart: u32,
    /// Ticks of work done.
    pub progress: u32,
    /// The instance alive at the start of this tick (a preempted spot is already gone).
    pub running: Option<Kind>,
    /// Restart ticks the running instance still has to spend before it makes progress.
    pub overhead_left: u32,
    /// Availability of ticks `0..=tick`: the past and now, nothing later.
    pub history: &'a [bool],
    /// Spot and on-demand micro-USD per hour now.
    pub spot_price: u64,
    pub on_demand_price: u64,
}

impl View<'_> {
    pub fn spot_available(&self) -> bool {
        self.history.last().copied().unwrap_or(false)
    }

    pub fn remaining_work(&self) -> u32 {
        self.work - self.progress
    }

    /// Ticks left before the deadline beyond the remaining work: the time that can still be
    /// spent waiting or on restarts. Negative once the deadline cannot be met.
    pub fn slack(&self) -> i64 {
        i64::from(self.deadline) - i64::from(self.tick) - i64::from(self.remaining_work())
    }

    /// The paper's `cp(t) < ep(t + shift)`: progress below the uniform line
    /// `work · (tick + shift) / deadline`, compared exactly.
    pub fn behind(&self, shift: u32) -> bool {
        u64::from(self.progress) * u64::from(self.deadline)
            < u64::from(self.work) * (u64::from(self.tick) + u64::from(shift))
    }
}

/// An online policy: one decision per tick, from what has been seen so far.
pub trait Policy {
    fn decide(&mut self, view: &View<'_>) -> Choice;
}

/// What happened to the job under one policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Micro-USD per hour × ticks (see [`Model::usd`]).
    pub cost: u64,
    /// The job's work was complete at the end of tick `finish - 1`.
    pub finish: u32,
    pub deadline_met: bool,
    /// Billed ticks on each kind, restarts included.
    pub spot_ticks: u64,
    pub on_demand_ticks: u64,
    /// Instance starts (each paid a restart), the first one included.
    pub restarts: u32,
    pub preemptions: u32,
}

/// Where the job is between two ticks: what [`simulate`] advances, one tick at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct JobState {
    /// Ticks of work done.
    pub progress: u32,
    /// The instance alive, if any.
    pub running: Option<Kind>,
    /// Restart ticks the running instance still has to spend before it makes progress.
    pub overhead_left: u32,
}

impl JobState {
    /// Applies the trace at the start of a tick: a spot instance is lost where spot is not
    /// available. Returns whether it was.
    pub fn preempt(&mut self, available: bool) -> bool {
        let lost = self.running == Some(Kind::Spot) && !available;
        if lost {
            self.running = None;
            self.overhead_left = 0;
        }
        lost
    }

    /// Spends one tick on `choice` (`Run(Spot)` only where spot is available). Returns the
    /// kind billed for the tick, if any, and whether the tick started an instance.
    pub fn act(&mut self, choice: Choice, restart: u32) -> (Option<Kind>, bool) {
        match choice {
            Choice::Wait => {
                self.running = None;
                self.overhead_left = 0;
                (None, false)
            }
            Choice::Run(kind) => {
                let started = self.running != Some(kind);
                if started {
                    self.running = Some(kind);
                    self.overhead_left = restart;
                }
                if self.overhead_left > 0 {
                    self.overhead_left -= 1;
                } else {
                    self.progress += 1;
                }
                (Some(kind), started)
            }
        }
    }
}

impl Model {
    /// Spends tick `t` on `choice` for `job` (after [`JobState::preempt`]). A `Run(Spot)`
    /// while spot is unavailable is taken as `Wait` (debug builds assert it never happens).
    /// Returns the kind billed, if any, and whether the tick started an instance.
    pub fn spend(&self, t: u32, job: &mut JobState, choice: Choice) -> (Option<Kind>, bool) {
        let choice = match choice {
            Choice::Run(Kind::Spot) if !self.available_at(t) => {
                debug_assert!(false, "a policy asked for spot at tick {t} without spot");
                Choice::Wait
            }
            c => c,
        };
        job.act(choice, self.restart)
    }

    /// What a policy is shown at tick `t` (before the deadline) with the job at `job`.
    pub fn view(&self, t: u32, job: &JobState) -> View<'_> {
        View {
            tick: t,
            gap_seconds: self.gap_seconds,
            work: self.work,
            deadline: self.deadline,
            restart: self.restart,
            progress: job.progress,
            running: job.running,
            overhead_left: job.overhead_left,
            history: &self.available[..=t as usize],
            spot_price: self.price(Kind::Spot, t),
            on_demand_price: self.on_demand_price,
        }
    }
}

/// Runs one policy on the model, tick by tick, from tick 0 until the work is done.
///
/// A `Run(Spot)` while spot is unavailable is treated as `Wait` (debug builds assert it
/// never happens). From the deadline on, the job is finished on on-demand whatever the
/// policy says: the deadline is already missed and the run must end.
pub fn simulate(model: &Model, policy: &mut dyn Policy) -> Outcome {
    let mut out = Outcome::default();
    let mut job = JobState::default();
    let mut t = 0u32;
    while job.progress < model.work {
        let available = model.available_at(t);
        out.preemptions += u32::from(job.preempt(available));
        let choice = if t >= model.deadline {
            Choice::Run(Kind::OnDemand)
        } else {
            policy.decide(&model.view(t, &job))
        };
        let (billed, started) = model.spend(t, &mut job, choice);
        out.restarts += u32::from(started);
        if let Some(kind) = billed {
            out.cost += model.price(kind, t);
            match kind {
                Kind::Spot => out.spot_ticks += 1,
                Kind::OnDemand => out.on_demand_ticks += 1,
            }
        }
        t += 1;
    }
    out.finish = t;
    out.deadline_met = t <= model.deadline;
    out
}

/// The policies `spotplane bench deadline` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyName {
    OnDemand,
    Greedy,
    UniformProgress,
    Spotplane,
    Optimal,
}

impl PolicyName {
    pub const ALL: [PolicyName; 5] = [
        PolicyName::OnDemand,
        PolicyName::Greedy,
        PolicyName::UniformProgress,
        PolicyName::Spotplane,
        PolicyName::Optimal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::OnDemand => "on-demand",
            PolicyName::Greedy => "greedy",
            PolicyName::UniformProgress => "uniform-progress",
            PolicyName::Spotplane => "spotplane",
            PolicyName::Optimal => "optimal",
        }
    }

    /// Parses a list such as `greedy,optimal` or `all` (every policy, in [`Self::ALL`] order).
    pub fn parse_list<S: AsRef<str>>(names: &[S]) -> Result<Vec<PolicyName>, String> {
        parse_names(names, &Self::ALL)
    }
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown policy {s:?}; expected one of on-demand, greedy, uniform-progress, \
                     spotplane, optimal, all"
                )
            })
    }
}

/// Parses a list of policy names such as `greedy,optimal`, `all` standing for every one of
/// `all` (in its order).
pub(crate) fn parse_names<T, S>(names: &[S], all: &[T]) -> Result<Vec<T>, String>
where
    T: Copy + PartialEq + FromStr<Err = String>,
    S: AsRef<str>,
{
    let mut out = Vec::new();
    for n in names {
        let n = n.as_ref().trim();
        if n == "all" {
            out.extend_from_slice(all);
        } else {
            out.push(n.parse()?);
        }
    }
    out.dedup();
    Ok(out)
}

/// Runs a policy by name. The optimum is the DP's plan replayed through [`simulate`]; when
/// the deadline is infeasible (on-demand from tick 0 misses it), the optimum is reported as
/// on-demand from tick 0, the earliest finish there is.
pub fn run(model: &Model, name: PolicyName) -> Outcome {
    match name {
        PolicyName::OnDemand => simulate(model, &mut policies::OnDemand),
        PolicyName::Greedy => simulate(model, &mut policies::Greedy::default()),
        PolicyName::UniformProgress => simulate(model, &mut policies::UniformProgress::default()),
        PolicyName::Spotplane => simulate(model, &mut policies::Spotplane::default()),
        PolicyName::Optimal => match optimal::solve(model) {
            Some(plan) => simulate(model, &mut plan.policy()),
            None => simulate(model, &mut policies::OnDemand),
        },
    }
}

/// One policy's result in hours and dollars: a line of `spotplane bench deadline --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub policy: &'static str,
    pub cost_usd: f64,
    pub finish_hours: f64,
    pub deadline_met: bool,
    pub spot_hours: f64,
    pub on_demand_hours: f64,
    pub restarts: u32,
    pub preemptions: u32,
}

impl Report {
    pub fn new(model: &Model, name: PolicyName, o: &Outcome) -> Report {
        Report {
            policy: name.as_str(),
            cost_usd: model.usd(o.cost),
            finish_hours: model.hours(u64::from(o.finish)),
            deadline_met: o.deadline_met,
            spot_hours: model.hours(o.spot_ticks),
            on_demand_hours: model.hours(o.on_demand_ticks),
            restarts: o.restarts,
            preemptions: o.preemptions,
        }
    }
}

/// The human-readable table of several reports.
pub fn format_table(reports: &[Report]) -> String {
    use std::fmt::Write as _;
    let mut s = format!(
        "{:<18} {:>10} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
        "POLICY", "COST_USD", "FINISH_H", "DEADLINE", "SPOT_H", "OD_H", "RESTARTS", "PREEMPT"
    );
    for r in reports {
        let _ = writeln!(
            s,
            "{:<18} {:>10.2} {:>9.2} {:>8} {:>8.2} {:>8.2} {:>8} {:>8}",
            r.policy,
            r.cost_usd,
            r.finish_hours,
            if r.deadline_met { "met" } else { "MISSED" },
            r.spot_hours,
            r.on_demand_hours,
            r.restarts,
            r.preemptions
        );
    }
    s
}
