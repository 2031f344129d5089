//! Where a job with a deadline and an estimate of its work runs next: stay, move, or go
//! on-demand. The model `spotplane bench deadline` measures with several traces (docs/benchmarks.md,
//! "Deadlines across pools"), applied to the offers of one planning round.
//!
//! Each candidate spot pool (an offer) becomes a Markov chain of spot availability whose runs
//! last `1 / λ` hours, λ being the pool's interruption rate for the whole gang
//! ([`super::PoolStats::rate`] × nodes), with the bench policy's prior for outages. The job,
//! from now, needs its remaining work by its deadline; a start costs the restart R, and a start
//! in a region other than the one holding its checkpoint also costs M, moving it there. For
//! each pool, the planner of the bench policy ([`markov::plan_with_values`]) gives the
//! expected cost of starting spot there now and staying in that pool (taking on-demand there
//! when the plan says so); on-demand is R (and M, away from the checkpoint) plus the work at
//! its price. The least expected cost wins — the same rollout the `spotplane` policy of the
//! bench takes at each decision — within the Safety Net Rule: spot only with slack ≥ R + the
//! start's overhead, so that losing it still leaves time for on-demand.
//!
//! After a preemption the job is demand again, its checkpoint in the region it ran in: the
//! same choice is then stay (a pool of that region), move (another region) or on-demand.
//!
//! Pure: the caller gives `now`-relative hours; nothing here reads a clock.

use super::markov::{self, PRIOR_RUN_HOURS};

/// The most ticks a deadline is cut into; the tick grows with the time left.
const MAX_TICKS: f64 = 120.0;
/// The most spot pools one choice weighs (the caller's best by expected cost per hour): one
/// plan each, every planning round.
pub const MAX_POOLS: usize = 6;
/// The shortest tick, in seconds.
const MIN_TICK_SECONDS: f64 = 60.0;

/// Cross-region copy rate assumed for a checkpoint, GiB per hour (about 0.25 GiB/s, what one
/// stream between regions of one cloud sustains; object stores' replication is slower).
pub const MOVE_GIB_PER_HOUR: f64 = 900.0;

/// Hours to move a checkpoint of `bytes` to another region: `base_hours` (listing, the new
/// node's first read) plus the copy.
pub fn migrate_hours(bytes: u64, base_hours: f64) -> f64 {
    base_hours + bytes as f64 / (1u64 << 30) as f64 / MOVE_GIB_PER_HOUR
}

/// The job, in hours from now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeadlineJob {
    /// Compute still needed.
    pub work_hours: f64,
    /// Until the deadline.
    pub left_hours: f64,
    /// A start's boot and restore.
    pub restart_hours: f64,
    /// Moving the checkpoint to another region.
    pub migrate_hours: f64,
    /// Work a loss may undo at worst (the checkpoint interval; all of it without checkpoints):
    /// the Safety Net keeps this much more slack before it allows spot.
    pub rework_hours: f64,
}

/// A spot pool the job may start in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpotOption {
    /// The gang's spot price, USD (or any unit, the same as on-demand's) per hour.
    pub hourly: f64,
    /// Interruptions per hour of the gang (per node-hour × nodes).
    pub rate: f64,
    /// Whether a start there moves the checkpoint (another region, after progress).
    pub moves: bool,
}

/// What the model chooses.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The expected cost of each spot option, in the caller's order; `None` where the Safety
    /// Net Rule forbids it (too little slack to lose it and still finish on on-demand).
    pub spot: Vec<Option<f64>>,
    /// The cost of on-demand from now to the end.
    pub on_demand: f64,
}

impl Choice {
    /// Whether on-demand is the choice: cheaper in expectation than every allowed spot pool,
    /// or the only safe one.
    pub fn on_demand(&self) -> bool {
        self.spot
            .iter()
            .flatten()
            .all(|&q| q.total_cmp(&self.on_demand).is_ge())
    }
}

/// The expected cost of each option for the job. `on_demand_hourly` is the gang's on-demand
/// price, `on_demand_moves` whether the on-demand capacity is away from the checkpoint.
pub fn choose(
    job: &DeadlineJob,
    spot: &[SpotOption],
    on_demand_hourly: f64,
    on_demand_moves: bool,
) -> Choice {
    let gap = (job.left_hours.max(0.0) * 3600.0 / MAX_TICKS).max(MIN_TICK_SECONDS);
    let ticks_up = |h: f64| (h.max(0.0) * 3600.0 / gap).ceil() as u32;
    let (work, restart, migrate) = (
        ticks_up(job.work_hours).max(1),
        ticks_up(job.restart_hours),
        ticks_up(job.migrate_hours),
    );
    let deadline = (job.left_hours.max(0.0) * 3600.0 / gap).floor() as u32;
    let per_tick = |hourly: f64| hourly * gap / 3600.0;
    let od_overhead = restart + if on_demand_moves { migrate } else { 0 };
    let on_demand = per_tick(on_demand_hourly) * f64::from(od_overhead + work);
    // The slack, less the work a loss may undo, in hours (the ticks are coarse).
    let slack = job.left_hours - job.work_hours - job.rework_hours.max(0.0);
    let spot = spot
        .iter()
        .map(|o| {
            let overhead = restart + if o.moves { migrate } else { 0 };
            let overhead_hours = job.restart_hours + if o.moves { job.migrate_hours } else { 0.0 };
            if slack < job.restart_hours + overhead_hours {
                return None;
            }
            // Runs of spot last 1/λ hours, outages the bench's prior; one age class each
            // (a pool known by one rate has no ages to tell apart), which keeps each plan to
            // two states of spot.
            let gap_hours = gap / 3600.0;
            let chain = markov::Chain {
                available: vec![markov::Class {
                    ends: (o.rate.max(1e-6) * gap_hours).min(1.0),
                    ticks: f64::INFINITY,
                }],
                unavailable: vec![markov::Class {
                    ends: (gap_hours / PRIOR_RUN_HOURS).min(1.0),
                    ticks: f64::INFINITY,
                }],
            };
            let plan = markov::plan_with_values(
                &markov::Job {
                    work,
                    deadline,
                    restart,
                    spot_price: o.hourly,
                    on_demand_price: on_demand_hourly,
                },
                &chain,
                0,
                overhead + 2,
            );
            // An offer is there now: spot is available, in its longest-lived class (a pool's
            // runs here have one length).
            // (The plan's costs are price per hour × ticks.)
            plan.start_spot_value(0, 0, markov::MAX_CLASSES - 1, overhead)
                .filter(|q| *q < 1e17)
                .map(per_tick)
        })
        .collect();
    Choice { spot, on_demand }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(work: f64, left: f64) -> DeadlineJob {
        DeadlineJob {
            work_hours: work,
            left_hours: left,
            restart_hours: 0.1,
            migrate_hours: 0.5,
            rework_hours: 0.0,
        }
    }

    const CALM: SpotOption = SpotOption {
        hourly: 1.0,
        rate: 0.02,
        moves: false,
    };

    #[test]
    fn a_calm_cheap_pool_beats_on_demand_with_slack() {
        let c = choose(&job(10.0, 20.0), &[CALM], 3.0, false);
        let q = c.spot[0].expect("allowed");
        assert!(q < c.on_demand, "{q} vs {}", c.on_demand);
        assert!(!c.on_demand());
        // About the work at the spot price, and never less.
        assert!((10.0..14.0).contains(&q), "{q}");
    }

    #[test]
    fn without_slack_for_a_loss_only_on_demand_is_safe() {
        let c = choose(&job(10.0, 10.15), &[CALM], 3.0, false);
        assert_eq!(c.spot, vec![None]);
        assert!(c.on_demand());
        // Nor with slack for a restart but not for the work since the last checkpoint.
        let careful = DeadlineJob {
            rework_hours: 0.5,
            ..job(10.0, 10.5)
        };
        assert!(choose(&job(10.0, 10.5), &[CALM], 3.0, false).spot[0].is_some());
        assert_eq!(choose(&careful, &[CALM], 3.0, false).spot, vec![None]);
    }

    #[test]
    fn a_pool_taken_every_few_minutes_loses_to_on_demand() {
        let stormy = SpotOption {
            hourly: 2.5,
            rate: 6.0,
            moves: false,
        };
        let c = choose(&job(10.0, 12.0), &[stormy], 3.0, false);
        assert!(c.on_demand(), "{c:?}");
    }

    #[test]
    fn after_a_preemption_it_stays_moves_or_goes_on_demand_by_expected_cost() {
        // The job's region is cheap but stormy; another region is calm; a move costs 30 min.
        let here = SpotOption {
            hourly: 0.9,
            rate: 3.0,
            moves: false,
        };
        let there = SpotOption {
            hourly: 1.0,
            rate: 0.02,
            moves: true,
        };
        let c = choose(&job(10.0, 20.0), &[here, there], 3.0, false);
        let (q_here, q_there) = (c.spot[0].expect("safe"), c.spot[1].expect("safe"));
        assert!(q_there < q_here, "moves: {q_there} < {q_here}");
        // Where the job's region is only a little stormy, a two-hour move does not pay.
        let breezy = SpotOption { rate: 0.3, ..here };
        let far = DeadlineJob {
            migrate_hours: 2.0,
            ..job(10.0, 20.0)
        };
        let c = choose(&far, &[breezy, there], 3.0, false);
        let (q_here, q_there) = (c.spot[0].expect("safe"), c.spot[1].expect("safe"));
        assert!(q_here < q_there && q_here < c.on_demand, "stays: {c:?}");
        // With little slack left, a move is no longer safe while staying still is.
        let c = choose(&job(10.0, 10.5), &[here, there], 3.0, false);
        assert!(c.spot[0].is_some() && c.spot[1].is_none(), "{c:?}");
    }
}
