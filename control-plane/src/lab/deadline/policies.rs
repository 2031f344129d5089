//! Online policies: each decides tick by tick from the past and present of the trace.
//!
//! All of them obey the paper's safety reasoning in ticks (§3.3). Let `slack = deadline −
//! tick − remaining work`. Starting on-demand at a tick finishes in time iff `slack ≥ R`
//! (the restart). A spot start is safe iff `slack ≥ 2R`: its restart spends R of the slack,
//! and a preemption any time later still leaves R for an on-demand start (while a spot makes
//! progress the slack does not move). Hence the Safety Net Rule: when idle with
//! `slack < 2R`, go on-demand and stay there until the end. In whole ticks one more case
//! needs it: at `slack = 2R` with spot unavailable, waiting a tick gains nothing (the next
//! tick is past the line) and, with `R = 0`, would miss the deadline ([`safety_net`]).

use super::{Choice, Kind, Policy, View, markov};
pub use crate::planner::markov::{
    AGE_CLASS_HOURS, MEMORY_HALF_LIFE_HOURS, OUTAGE_CLASS_HOURS, Observer, PRIOR_RUN_HOURS,
    PRIOR_WEIGHT_HOURS, Prior,
};

const SPOT: Choice = Choice::Run(Kind::Spot);
const OD: Choice = Choice::Run(Kind::OnDemand);

/// The Safety Net Rule in ticks: whether an idle job (or one on on-demand) must stay on
/// on-demand until the end.
pub fn safety_net(v: &View<'_>) -> bool {
    let (slack, two_r) = (v.slack(), 2 * i64::from(v.restart));
    slack < two_r || (slack == two_r && !v.spot_available())
}

/// On-demand from tick 0 to the end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct OnDemand;

impl Policy for OnDemand {
    fn decide(&mut self, _: &View<'_>) -> Choice {
        OD
    }
}

/// The paper's greedy policy (§3.4): spot whenever available, wait otherwise, until the
/// Safety Net Rule moves the job to on-demand for good.
#[derive(Debug, Clone, Copy, Default)]
pub struct Greedy {
    committed: bool,
}

impl Policy for Greedy {
    fn decide(&mut self, v: &View<'_>) -> Choice {
        if self.committed {
            return OD;
        }
        if v.running == Some(Kind::Spot) {
            return SPOT; // Exploitation Rule: stay until preempted.
        }
        if safety_net(v) {
            self.committed = true;
            return OD;
        }
        if v.spot_available() {
            SPOT
        } else {
            Choice::Wait
        }
    }
}

/// Uniform Progress, the policy of Wu et al., "Can't Be Late" (NSDI '24), §5.2.2, with
/// `cp(t)` the progress and `ep(t) = work · t / deadline` the uniform line:
///
/// 1. Uniform Progress: when the job is idle and `cp(t) < ep(t)`, switch to on-demand and
///    stay on it to catch up.
/// 2. Taking Risks: switch to spot whenever it is available (even when behind), and stay on
///    it until preempted (Exploitation Rule, §3.3).
/// 3. Hysteresis: when on on-demand, stay on it until `cp(t) ≥ ep(t + 2d)`; only then may a
///    spot that is available take over.
/// 4. Safety Net (§3.3): when idle (or on on-demand) and `R(t) < C(t) + 2d`, i.e. here
///    `slack < 2R` ([`safety_net`]), go to on-demand and stay there until the end.
///
/// Sources: the paper (<https://www.usenix.org/conference/nsdi24/presentation/wu-zhanghao>,
/// §3.3 for the Exploitation and Safety Net rules, §5.2.2 for the policy) and the authors'
/// simulator `sky_spot` (strategy `RCCRThresholdStrategy`, "Our policy: Uniform Progress"),
/// whose rules are restated in the Uniform Progress seed of lynnliu030/ADRS,
/// `openevolve/examples/ADRS/cant-be-late/initial_up.py`. The paper leaves open what the job
/// does on on-demand while spot is unavailable and it is ahead of the line; like the authors'
/// simulator, it keeps the on-demand instance (leaving would pay another restart to return).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct UniformProgress {
    committed: bool,
}

impl Policy for UniformProgress {
    fn decide(&mut self, v: &View<'_>) -> Choice {
        let safety = safety_net(v);
        if self.committed {
            return OD;
        }
        match v.running {
            Some(Kind::Spot) => SPOT,
            Some(Kind::OnDemand) => {
                if safety {
                    self.committed = true;
                    OD
                } else if v.spot_available() && !v.behind(2 * v.restart) {
                    SPOT
                } else {
                    OD
                }
            }
            None => {
                if safety {
                    self.committed = true;
                    OD
                } else if v.spot_available() {
                    SPOT
                } else if v.behind(0) {
                    OD
                } else {
                    Choice::Wait
                }
            }
        }
    }
}

/// spotplane's policy: plan with a model of spot learned from the trace so far, act within
/// the safety rules.
///
/// 1. Observe: count, for runs of available spot and for outages, each in its age classes
///    ([`AGE_CLASS_HOURS`], [`OUTAGE_CLASS_HOURS`]), the ticks seen and how many ended the
///    run, the older the less ([`MEMORY_HALF_LIFE_HOURS`]), on top of a [`Prior`] (by
///    default runs of [`PRIOR_RUN_HOURS`] in every class); the estimate is [`markov::Chain`].
/// 2. Plan: every tenth of the deadline, [`markov::plan`] computes the schedule of least
///    expected cost under that chain from where the job is — the restart-aware answer to
///    "spot now or not", "on-demand now or wait", "leave on-demand for this spot or not".
/// 3. Act: follow the plan (keeping an instance through its restart, as the plan counts a
///    start as one move) through [`guard`], which enforces the Safety Net Rule exactly and
///    makes missing a feasible deadline impossible whatever the plan says.
///
/// The plan, not a fixed line, decides when to use on-demand. The only constants are the
/// prior, the age classes, the memory's half-life and the re-planning period, the same for
/// every trace. Where it wins and loses against Uniform Progress: docs/benchmarks.md.
#[derive(Debug, Clone, Default)]
pub struct Spotplane {
    pool: Observer,
    plan: Option<markov::Plan>,
    replan_at: u32,
}

impl Spotplane {
    /// The policy with its own belief about pools it has not seen.
    pub fn with_prior(prior: Prior) -> Self {
        Spotplane {
            pool: Observer::with_prior(prior),
            ..Spotplane::default()
        }
    }

    pub(super) fn chain(&self, gap_seconds: u32) -> markov::Chain {
        self.pool.chain(gap_seconds)
    }
}

/// The planner's view of a job at `v.tick`, with spot at `spot_price`.
pub(super) fn planned_job(v: &View<'_>, restart: u32, spot_price: u64) -> markov::Job {
    markov::Job {
        work: v.work,
        deadline: v.deadline,
        restart,
        spot_price: spot_price as f64,
        on_demand_price: v.on_demand_price as f64,
    }
}

impl Policy for Spotplane {
    fn decide(&mut self, v: &View<'_>) -> Choice {
        // 1. Observe the change from the last tick to this one.
        let now = v.spot_available();
        self.pool.observe(now, v.gap_seconds);
        // 2. Plan, for the next tenth of the deadline.
        if self.plan.is_none() || v.tick >= self.replan_at {
            let every = (v.deadline / 10).max(1);
            self.replan_at = v.tick + every;
            self.plan = Some(markov::plan(
                &planned_job(v, v.restart, v.spot_price),
                &self.chain(v.gap_seconds),
                v.tick,
                self.replan_at,
            ));
        }
        // 3. Act.
        let wanted = match (v.running, v.overhead_left) {
            (Some(kind), left) if left > 0 => Choice::Run(kind),
            _ => {
                let mode = markov::Mode {
                    running: v.running,
                    spot: self.pool.spot(now, v.gap_seconds),
                };
                self.plan
                    .as_ref()
                    .and_then(|p| p.decide(v.tick, v.progress, mode))
                    .unwrap_or(OD)
            }
        };
        guard(v, wanted)
    }
}

/// The Safety Net Rule as a filter on any wanted choice, in whole ticks (`s` = slack):
/// - keep a running spot: it was started with `s ≥ 2R`, so a preemption still leaves R;
/// - start spot only when available and `s ≥ 2R`;
/// - wait only when `s > 2R` (one tick later `s ≥ 2R` still allows anything);
/// - otherwise on-demand, which finishes in time from any state the rules above allow.
///
/// Hence a policy behind this guard never misses a deadline that on-demand from tick 0 meets.
pub fn guard(v: &View<'_>, wanted: Choice) -> Choice {
    let (slack, two_r) = (v.slack(), 2 * i64::from(v.restart));
    let available = v.spot_available();
    match wanted {
        Choice::Run(Kind::Spot) if v.running == Some(Kind::Spot) => SPOT,
        Choice::Run(Kind::Spot) if available && slack >= two_r => SPOT,
        Choice::Run(Kind::Spot) | Choice::Wait if slack > two_r => Choice::Wait,
        _ => OD,
    }
}
