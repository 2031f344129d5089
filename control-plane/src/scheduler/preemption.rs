//! Preemption: which running jobs to stop so that a job that does not fit can run.
//!
//! A job may preempt lower-priority jobs of its own team (`Priority`), or jobs of a team in
//! its cohort that borrows a flavour the job's team is owed within its nominal quota
//! (`Reclaim`). Victims are whole jobs, never one already draining, tried cheapest first
//! (`victim_order`): the least work lost (GPU-milli × replicas × seconds since the last
//! checkpoint), then the lowest priority, then the newest job. A single replica looks node by
//! node (at most `preemption_nodes`) for the cheapest set of victims on one node that lets it
//! fit there; a gang, or a job over its quota, releases candidates greedily (at most
//! `preemption_candidates`) until it fits, then puts back each victim it does not need. The
//! search releases and restores victims' capacity and usage in the cycle's state and leaves it
//! as it found it: victims keep their capacity this cycle (they checkpoint first) and the
//! preemptor waits for them (`WaitingForPreemption`); once nominated, it waits rather than
//! preempt more while the jobs already draining would make room. At most
//! `max_preemption_attempts` searches run in a cycle.

use std::cmp::Reverse;

use rustc_hash::FxHashMap;
use spotplane_core::GpuModel;
use spotplane_core::shape::GpuShape;
use spotplane_core::team::QuotaResource;

use super::cycle::{Cycle, Need};
use super::placement::Filter;
use super::{Preemption, PreemptionReason, QueuedJob, RunningJob, Snapshot, WaitReason};

pub(super) type VictimOrder = (u64, i32, Reverse<u128>);

/// The order victims are tried in: the least work lost first, then the lowest priority, then
/// the newest job.
pub(super) fn victim_order(costs: &[u64], running: &[RunningJob], k: usize) -> VictimOrder {
    (
        costs[k],
        running[k].priority,
        Reverse(running[k].id.0.as_u128()),
    )
}

impl<'a> Cycle<'a> {
    /// Victim selection. Returns true when the job now waits for preemption (new victims were
    /// chosen, or victims already draining for it will make room).
    ///
    /// A job may preempt lower-priority jobs of its own team, or (reclaim) jobs of its cohort
    /// whose team borrows the flavour it needs while its own team is under nominal. Victims
    /// are whole jobs (a gang goes as one), cheapest first: the fewest GPU-seconds since their
    /// last checkpoint. A single-replica job looks node by node for the cheapest set of victims
    /// on one node; a gang releases victims greedily until it fits, then keeps only those
    /// needed. Victims keep their capacity this cycle: they checkpoint first.
    pub(super) fn preempt(
        &mut self,
        team: usize,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
        quota_only: bool,
    ) -> bool {
        if self.preemption_work >= self.cfg.max_preemption_attempts {
            return false;
        }
        self.preemption_work += 1;
        let snap = self.snap;
        // A job that preempted earlier waits for its victims to drain rather than preempt more.
        if job.nominated && !quota_only {
            let draining: Vec<&RunningJob> = snap
                .running
                .iter()
                .filter(|r| self.run_entry(r).is_some_and(|(_, d)| *d))
                .collect();
            if !draining.is_empty() && self.fits_after_releasing(job, need, models, &draining) {
                self.unmet(job.id, WaitReason::WaitingForPreemption);
                return true;
            }
        }
        let chosen = if job.replicas == 1 && !quota_only {
            let candidates =
                self.victim_candidates(team, job, models, quota_only, usize::MAX, |_| true);
            if candidates.is_empty() {
                return false;
            }
            self.victims_on_one_node(team, job, need, models, &candidates)
        } else {
            self.victims_greedy(team, job, need, models, quota_only)
        };
        let Some(victims) = chosen else { return false };
        for (v, reason) in &victims {
            if let Some(entry) = self.run_entry_mut(v) {
                entry.1 = true;
            }
            self.out.preemptions.push(Preemption {
                victim: v.id,
                for_job: job.id,
                reason: *reason,
            });
        }
        self.unmet(job.id, WaitReason::WaitingForPreemption);
        true
    }

    /// Running jobs this job may preempt, cheapest first.
    fn victim_candidates(
        &self,
        team: usize,
        job: &QueuedJob,
        models: &[GpuModel],
        quota_only: bool,
        limit: usize,
        keep: impl Fn(usize) -> bool,
    ) -> Vec<(&'a RunningJob, PreemptionReason)> {
        let snap: &'a Snapshot = self.snap;
        let shape = &job.shape.gpu;
        let mut candidates: Vec<(usize, &'a RunningJob, PreemptionReason)> = Vec::new();
        for (owner, jobs) in self.by_team.iter().enumerate() {
            let same_team = owner == team;
            let same_cohort = !quota_only && self.accounts.same_cohort(team, owner);
            if !same_team && !same_cohort {
                continue;
            }
            // Reclaim needs the job to fit within its own team's nominal quota, and the other
            // team to borrow that flavour.
            let reclaim_flavours: Vec<_> = if same_team {
                Vec::new()
            } else {
                models
                    .iter()
                    .filter_map(|m| self.accounts.flavour(team, shape, Some(*m)))
                    .filter(|(res, amount)| {
                        self.accounts.is_borrowing(owner, *res)
                            && self.accounts.within_nominal(
                                team,
                                *res,
                                amount * u64::from(job.replicas),
                            )
                    })
                    .map(|(res, _)| res)
                    .collect()
            };
            if !same_team && reclaim_flavours.is_empty() {
                continue;
            }
            // The list is in victim order, so the first `limit` kept of it are all the merge
            // below can use.
            let mut taken = 0;
            for &k in jobs {
                if taken >= limit {
                    break;
                }
                let r = &snap.running[k];
                if self.running.get(k).is_none_or(|(_, draining)| *draining) {
                    continue;
                }
                let reason = if same_team {
                    if r.priority >= job.priority {
                        continue;
                    }
                    PreemptionReason::Priority
                } else {
                    let theirs = self
                        .accounts
                        .flavour(owner, &r.shape.gpu, self.run_model[k])
                        .map(|(res, _)| res);
                    if !theirs.is_some_and(|f| reclaim_flavours.contains(&f)) {
                        continue;
                    }
                    PreemptionReason::Reclaim
                };
                if keep(k) {
                    candidates.push((k, r, reason));
                    taken += 1;
                }
            }
        }
        // Each team's list is already cheapest first: the stable sort merges the sorted runs.
        candidates.sort_by_key(|(k, _, _)| victim_order(&self.costs, &snap.running, *k));
        candidates.truncate(limit);
        candidates
            .into_iter()
            .map(|(_, r, reason)| (r, reason))
            .collect()
    }

    /// For a single replica: per node, the cheapest victims whose release lets the replica fit
    /// there; the node whose set costs least wins. Looks at a bounded number of nodes.
    fn victims_on_one_node(
        &mut self,
        team: usize,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
        candidates: &[(&'a RunningJob, PreemptionReason)],
    ) -> Option<Vec<(&'a RunningJob, PreemptionReason)>> {
        let filter = Filter {
            clouds: &job.clouds,
            regions: &job.regions,
            spot: job.spot,
            zone: None,
            image: job.image,
        };
        // The first nodes the job may use, in the order of their cheapest candidate, at most
        // `preemption_nodes` of them; then each one's candidates, in cost order.
        let mut order: Vec<u32> = Vec::new();
        let mut slot: FxHashMap<u32, usize> = FxHashMap::default();
        'nodes: for (r, _) in candidates {
            for p in &r.placements {
                if order.len() >= self.cfg.preemption_nodes {
                    break 'nodes;
                }
                let Some(&i) = self.state.by_id.get(&p.node) else {
                    continue;
                };
                let n = &self.state.nodes[i as usize];
                if slot.contains_key(&i)
                    || !filter.admits(n)
                    || !n.model.is_some_and(|m| models.contains(&m))
                {
                    continue;
                }
                slot.insert(i, order.len());
                order.push(i);
            }
        }
        let mut by_node: Vec<Vec<usize>> = vec![Vec::new(); order.len()];
        for (c, (r, _)) in candidates.iter().enumerate() {
            for p in &r.placements {
                let Some(&s) = self.state.by_id.get(&p.node).and_then(|i| slot.get(i)) else {
                    continue;
                };
                if by_node[s].last() != Some(&c) {
                    by_node[s].push(c);
                }
            }
        }
        let mut best: Option<(u64, Vec<usize>)> = None;
        for (&i, list) in order.iter().zip(by_node) {
            let model = self.state.nodes[i as usize].model?;
            let mut released: Vec<usize> = Vec::new();
            let mut found = false;
            for c in list {
                let (victim, reason) = candidates[c];
                if reason == PreemptionReason::Reclaim && !self.still_borrowing(victim) {
                    continue;
                }
                self.release(victim);
                released.push(c);
                let quota_ok = self
                    .accounts
                    .flavour(team, &job.shape.gpu, Some(model))
                    .is_none_or(|(res, amount)| self.accounts.allows(team, res, amount));
                if quota_ok && self.assign_on(i, &job.shape.gpu, model, need).is_some() {
                    found = true;
                    break;
                }
            }
            for &c in released.iter().rev() {
                self.restore(candidates[c].0);
            }
            if found {
                let total: u64 = released
                    .iter()
                    .filter_map(|&c| self.run_index(candidates[c].0))
                    .map(|k| self.costs[k])
                    .sum();
                if best
                    .as_ref()
                    .is_none_or(|(b, v)| (total, released.len()) < (*b, v.len()))
                {
                    best = Some((total, released));
                }
            }
        }
        best.map(|(_, v)| v.into_iter().map(|c| candidates[c]).collect())
    }

    /// For gangs: release the cheapest victims until the gang fits, then keep only the needed.
    fn victims_greedy(
        &mut self,
        team: usize,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
        quota_only: bool,
    ) -> Option<Vec<(&'a RunningJob, PreemptionReason)>> {
        // Only victims that free what the job lacks: GPUs of a model it may use (and, for a
        // GPU job, not CPU-only work), or the quota flavour it needs.
        let gpu_job = !matches!(job.shape.gpu, GpuShape::Whole { gpus: 0, .. });
        let needed_flavours: Vec<QuotaResource> = models
            .iter()
            .filter_map(|m| {
                self.accounts
                    .flavour(team, &job.shape.gpu, Some(*m))
                    .map(|(res, _)| res)
            })
            .collect();
        let helps = |k: usize| -> bool {
            let Some(&(owner, _)) = self.running.get(k) else {
                return false;
            };
            let r = &self.snap.running[k];
            let model = self.run_model[k];
            if gpu_job
                && (matches!(r.shape.gpu, GpuShape::Whole { gpus: 0, .. })
                    || !model.is_some_and(|m| models.contains(&m)))
            {
                return false;
            }
            needed_flavours.is_empty()
                || self
                    .accounts
                    .flavour(owner, &r.shape.gpu, model)
                    .is_some_and(|(res, _)| needed_flavours.contains(&res))
        };
        let candidates = self.victim_candidates(
            team,
            job,
            models,
            quota_only,
            self.cfg.preemption_candidates,
            helps,
        );
        if candidates.is_empty() {
            return None;
        }
        // Quota is necessary: if even all of these victims would not free enough of it, stop
        // before any placement attempt.
        for (v, _) in &candidates {
            self.charge_job(v, -1);
        }
        let quota_possible = models.iter().any(|m| {
            self.accounts
                .flavour(team, &job.shape.gpu, Some(*m))
                .is_none_or(|(res, amount)| {
                    self.accounts
                        .allows(team, res, amount * u64::from(job.replicas))
                })
        });
        for (v, _) in &candidates {
            self.charge_job(v, 1);
        }
        if !quota_possible {
            return None;
        }
        let mut released: Vec<(&'a RunningJob, PreemptionReason)> = Vec::new();
        let mut fits = false;
        let mut tried = 0;
        for (victim, reason) in candidates {
            if tried >= self.cfg.preemption_candidates {
                break;
            }
            if reason == PreemptionReason::Reclaim && !self.still_borrowing(victim) {
                continue;
            }
            tried += 1;
            self.release(victim);
            released.push((victim, reason));
            if self.fits_now(job, need, team, models) {
                fits = true;
                break;
            }
        }
        if !fits {
            for (v, _) in released.iter().rev() {
                self.restore(v);
            }
            return None;
        }
        // Keep only the victims that are needed: put each back (latest-but-one first) and see
        // whether the gang still fits without preempting it.
        let mut needed = Vec::new();
        let last = released.pop();
        for (v, reason) in released.into_iter().rev() {
            self.restore(v);
            if self.fits_now(job, need, team, models) {
                continue;
            }
            self.release(v);
            needed.push((v, reason));
        }
        needed.extend(last);
        for (v, _) in &needed {
            self.restore(v);
        }
        Some(needed)
    }

    /// Whether a reclaim victim's team still borrows what the victim uses.
    fn still_borrowing(&self, victim: &RunningJob) -> bool {
        let Some(k) = self.run_index(victim) else {
            return false;
        };
        let Some(&(owner, _)) = self.running.get(k) else {
            return false;
        };
        self.accounts
            .flavour(owner, &victim.shape.gpu, self.run_model[k])
            .is_some_and(|(res, _)| self.accounts.is_borrowing(owner, res))
    }

    /// Whether the job would fit (quota and capacity) right now, without taking anything.
    fn fits_now(&mut self, job: &QueuedJob, need: Need, team: usize, models: &[GpuModel]) -> bool {
        let allowed: Vec<GpuModel> = models
            .iter()
            .copied()
            .filter(
                |m| match self.accounts.flavour(team, &job.shape.gpu, Some(*m)) {
                    Some((res, amount)) => {
                        self.accounts
                            .allows(team, res, amount * u64::from(job.replicas))
                    }
                    None => true,
                },
            )
            .collect();
        if allowed.is_empty() {
            return false;
        }
        match self.place_gang(job, need, &allowed) {
            Some(placed) => {
                self.rollback(&placed, need);
                true
            }
            None => false,
        }
    }

    fn fits_after_releasing(
        &mut self,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
        jobs: &[&RunningJob],
    ) -> bool {
        for r in jobs {
            self.release(r);
        }
        let fits = match self.place_gang(job, need, models) {
            Some(placed) => {
                self.rollback(&placed, need);
                true
            }
            None => false,
        };
        for r in jobs.iter().rev() {
            self.restore(r);
        }
        fits
    }

    fn release(&mut self, r: &RunningJob) {
        let team = self.run_entry(r).map_or(0, |t| t.0);
        for p in &r.placements {
            let Some(&i) = self.state.by_id.get(&p.node) else {
                continue;
            };
            self.state.give(
                i,
                i64::from(r.shape.cpu_milli),
                r.shape.memory_mib as i64,
                &p.assigned,
            );
            let model = self.state.nodes[i as usize].model;
            self.accounts
                .charge(team, &r.shape.gpu, model, u64::from(r.shape.cpu_milli), -1);
        }
    }

    /// Charges (or with -1, refunds) a running job's usage in the accounts only.
    fn charge_job(&mut self, r: &RunningJob, sign: i8) {
        let team = self.run_entry(r).map_or(0, |t| t.0);
        for p in &r.placements {
            let Some(&i) = self.state.by_id.get(&p.node) else {
                continue;
            };
            let model = self.state.nodes[i as usize].model;
            self.accounts.charge(
                team,
                &r.shape.gpu,
                model,
                u64::from(r.shape.cpu_milli),
                sign,
            );
        }
    }

    fn restore(&mut self, r: &RunningJob) {
        let team = self.run_entry(r).map_or(0, |t| t.0);
        for p in &r.placements {
            let Some(&i) = self.state.by_id.get(&p.node) else {
                continue;
            };
            self.state.take(
                i,
                i64::from(r.shape.cpu_milli),
                r.shape.memory_mib as i64,
                &p.assigned,
            );
            let model = self.state.nodes[i as usize].model;
            self.accounts
                .charge(team, &r.shape.gpu, model, u64::from(r.shape.cpu_milli), 1);
        }
    }
}
