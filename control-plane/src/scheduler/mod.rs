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
//!
//! The cycle is `cycle.rs` (the working state, the driver and the queues), and each of
//! step 4's ways to run a job has a file adding to the same `impl Cycle`: `placement.rs`,
//! `preemption.rs` and `relayout.rs`.

pub mod fairshare;
pub mod frag;
pub mod packing;
pub mod policies;
pub mod snapshot;
pub mod state;

mod cycle;
mod placement;
mod preemption;
mod relayout;

pub use cycle::{TeamStanding, quota_models_of_queued, schedule, team_standing};
pub use snapshot::*;

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

#[cfg(test)]
mod tests;
