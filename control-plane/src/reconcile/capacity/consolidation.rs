//! Consolidation, the capacity loop's last step: while no job waits for capacity, a ready node
//! whose work fits on the rest of the fleet, and for which giving it back saves more than
//! moving the work costs, is drained ([`planner::consolidate`]); one whose work needs a
//! cheaper replacement gets the replacement bought first and is drained once it is ready. What
//! the planner needs besides the snapshot is kept here between rounds: since when each node's
//! set of jobs has stayed the same, and each running job's work left.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};
use spotplane_core::{JobId, Micros, NodeId, NodeState};
use spotplane_providers::Offer;

use super::{CapacityLoop, CapacityReport};
use crate::planner::{self, MovableJob, NodeCost};
use crate::store::StoreError;

/// How long a running job's work left, read from its history, is aged with the clock before it
/// is read again.
const REMAINING_REFRESH: Duration = Duration::minutes(30);

/// Job histories consolidation reads in one round at most.
const REMAINING_QUERIES: usize = 256;

impl CapacityLoop {
    /// Since when each node's set of jobs is what it is (Karpenter's `consolidateAfter` clock).
    pub(super) fn track_node_jobs(
        &mut self,
        snap: &crate::scheduler::Snapshot,
        now: DateTime<Utc>,
    ) {
        let mut held: HashMap<NodeId, Vec<JobId>> = HashMap::new();
        for r in &snap.running {
            for p in &r.placements {
                let ids = held.entry(p.node).or_default();
                if !ids.contains(&r.id) {
                    ids.push(r.id);
                }
            }
        }
        for ids in held.values_mut() {
            ids.sort();
        }
        self.node_jobs.retain(|n, _| held.contains_key(n));
        for (node, ids) in held {
            match self.node_jobs.get_mut(&node) {
                Some((known, _)) if *known == ids => {}
                Some(entry) => *entry = (ids, now),
                None => {
                    self.node_jobs.insert(node, (ids, now));
                }
            }
        }
    }

    /// Work left of a running job with `work_hours`, from its history; remembered and aged
    /// with the clock for [`REMAINING_REFRESH`], and at most [`REMAINING_QUERIES`] histories
    /// read per round (a job not read yet counts as of unknown length), so a large fleet does
    /// not read every job's history every round.
    async fn remaining_hours(
        &mut self,
        snap: &crate::scheduler::Snapshot,
        now: DateTime<Utc>,
    ) -> Result<HashMap<JobId, f64>, StoreError> {
        let running: std::collections::HashSet<JobId> = snap.running.iter().map(|r| r.id).collect();
        self.remaining.retain(|id, _| running.contains(id));
        let mut out = HashMap::new();
        let mut queries = 0;
        for r in &snap.running {
            let Some(spec) = self.cache.get(r.id) else {
                continue;
            };
            let Some(work) = spec.work_hours else {
                continue;
            };
            let hours = |d: Duration| d.num_milliseconds().max(0) as f64 / 3_600_000.0;
            match self.remaining.get(&r.id) {
                Some((at, left)) if now - *at < REMAINING_REFRESH && now >= *at => {
                    out.insert(r.id, (left - hours(now - *at)).max(0.0));
                }
                _ if queries < REMAINING_QUERIES => {
                    queries += 1;
                    let checkpoint_hours = spec
                        .checkpoint
                        .as_ref()
                        .map(|c| f64::from(c.interval_s) / 3600.0);
                    let left =
                        (work - self.progress_hours(r.id, checkpoint_hours, now).await?).max(0.0);
                    self.remaining.insert(r.id, (now, left));
                    out.insert(r.id, left);
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Replacements bought by earlier rounds ([`spotplane_providers::tags::REPLACES`]): once
    /// one is ready, and still empty, the node it replaces is drained, and its work lands
    /// there. Returns the nodes consolidation leaves alone this round: those whose replacement
    /// is on its way or has just been drained for. Runs every round, so a move started is
    /// finished whatever waits.
    pub(super) async fn finish_replacements(
        &mut self,
        nodes: &[crate::model::Node],
        now: DateTime<Utc>,
        report: &mut CapacityReport,
    ) -> Result<HashSet<NodeId>, StoreError> {
        let mut leave_alone = HashSet::new();
        for r in nodes {
            let Some(old) = super::replaced_by(r).and_then(|id| nodes.iter().find(|n| n.id == id))
            else {
                continue;
            };
            let empty = !self.node_jobs.contains_key(&r.id);
            match r.state {
                NodeState::Requested | NodeState::Booting => {
                    leave_alone.insert(old.id);
                }
                NodeState::Ready if empty => {
                    leave_alone.insert(old.id);
                    if old.state == NodeState::Ready && self.node_jobs.contains_key(&old.id) {
                        let reason = format!(
                            "consolidation: its work moves to {} ({} {}), bought to replace it",
                            r.name, r.instance_type, r.market
                        );
                        self.drain_for_consolidation(old.id, reason, now, report)
                            .await?;
                    }
                }
                // Taken by other work, or leaving: this move is over.
                _ => {}
            }
        }
        Ok(leave_alone)
    }

    /// Drains `node` for consolidation, with `reason` in its state.
    async fn drain_for_consolidation(
        &mut self,
        node: NodeId,
        reason: String,
        now: DateTime<Utc>,
        report: &mut CapacityReport,
    ) -> Result<(), StoreError> {
        match self
            .store
            .transition_node(node, NodeState::Draining, Some(reason.clone()), now)
            .await
        {
            Ok(()) => {
                crate::crash_point!("consolidation");
                tracing::info!(%node, %reason, "consolidating: draining the node");
                self.node_jobs.remove(&node);
                report.consolidated += 1;
            }
            Err(StoreError::Conflict(why) | StoreError::NotFound(why)) => {
                tracing::debug!(%node, %why, "consolidation dropped");
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Whether the fleet's bounds (`capacity.max_nodes`, `capacity.max_hourly_usd`) leave room
    /// for one more node at `offer`'s price while the node it replaces still runs.
    fn room_for(&self, offer: &Offer, nodes: &[crate::model::Node]) -> bool {
        let p = &self.settings.planner;
        let count_ok = p
            .max_nodes
            .is_none_or(|max| (nodes.len() as u64) < u64::from(max));
        let hourly: i64 = nodes.iter().map(|n| n.hourly_price.0).sum();
        let price_ok = p
            .max_hourly
            .is_none_or(|max| hourly.saturating_add(offer.price.0) <= max.0);
        count_ok && price_ok
    }

    /// Consolidation: acts on what [`planner::consolidate`] picks. A node whose work fits on
    /// the rest of the fleet is drained now; one whose work needs a cheaper replacement gets
    /// the replacement bought first, and is drained by [`Self::finish_replacements`] once it is
    /// ready (Karpenter's order: a replacement that cannot be had costs one refused call, not
    /// a restart of the work and a second node at the old price). Runs only while no job waits
    /// for capacity; `leave_alone` are nodes whose move is under way.
    pub(super) async fn consolidate(
        &mut self,
        snap: &crate::scheduler::Snapshot,
        nodes: &[crate::model::Node],
        leave_alone: &HashSet<NodeId>,
        now: DateTime<Utc>,
        report: &mut CapacityReport,
    ) -> Result<(), StoreError> {
        let s = self.settings.consolidation.clone();
        if !s.enabled {
            return Ok(());
        }
        let mut costs: HashMap<NodeId, NodeCost> = HashMap::new();
        for n in nodes {
            if n.state != NodeState::Ready || leave_alone.contains(&n.id) {
                continue;
            }
            if let Some((_, since)) = self.node_jobs.get(&n.id) {
                costs.insert(
                    n.id,
                    NodeCost {
                        price: n.hourly_price,
                        stable_since: *since,
                    },
                );
            }
        }
        // No node steady long enough: nothing to look at.
        if !costs.values().any(|c| now - c.stable_since >= s.after) {
            return Ok(());
        }
        // What the planner knows of each running job (how long the work on a target lasts
        // matters as much as the work moved).
        let remaining = self.remaining_hours(snap, now).await?;
        let mut jobs: HashMap<JobId, MovableJob> = HashMap::new();
        for r in &snap.running {
            let Some(spec) = self.cache.get(r.id) else {
                continue;
            };
            let remaining_hours = remaining.get(&r.id).copied();
            jobs.insert(
                r.id,
                MovableJob {
                    clouds: spec.clouds.clone(),
                    regions: spec.regions.clone(),
                    spot: spec.spot,
                    image: spec.image.is_some(),
                    checkpoints: spec.checkpoint.is_some(),
                    remaining_hours,
                    restart_hours: self.settings.planner.default_restart_hours,
                    deadline: spec.deadline,
                },
            );
        }
        let offers: Vec<Offer> = self
            .offers
            .values()
            .flatten()
            .filter(|o| !self.unavailable.contains(&o.id(), now))
            .cloned()
            .collect();
        let input = planner::ConsolidationInput {
            snapshot: snap,
            jobs: &jobs,
            nodes: &costs,
            offers: &offers,
            pools: &self.pools,
        };
        let chosen = planner::consolidate(now, input, &s);
        for c in chosen {
            let Some(offer) = &c.replacement else {
                let reason = format!(
                    "consolidation: its {} job(s) fit on other nodes; giving it back saves ${:.2}/h",
                    c.jobs.len(),
                    c.saving_hourly.0 as f64 / 1e6
                );
                tracing::info!(node = %c.node, targets = ?c.targets, move_cost = %c.move_cost,
                    "consolidating: the node's work fits elsewhere");
                self.drain_for_consolidation(c.node, reason, now, report)
                    .await?;
                continue;
            };
            let Some(first) = c
                .jobs
                .first()
                .and_then(|j| snap.running.iter().find(|r| r.id == *j))
            else {
                continue;
            };
            if !self.room_for(offer, nodes) {
                tracing::debug!(node = %c.node, offer = %offer.id(),
                    "consolidation: no room in the fleet's bounds for a replacement now");
                continue;
            }
            let buy = planner::Buy {
                job: first.id,
                team: first.team.clone(),
                offer: offer.clone(),
                count: 1,
                expected_hourly: Micros(
                    nodes
                        .iter()
                        .find(|n| n.id == c.node)
                        .map_or(0, |n| n.hourly_price.0)
                        .saturating_sub(c.saving_hourly.0),
                ),
                deadline_forced: false,
                fallbacks: Vec::new(),
            };
            match self.buy_one(&buy, Some(c.node), now).await? {
                Ok((replacement, ..)) => {
                    report.bought += 1;
                    tracing::info!(node = %c.node, %replacement, offer = %offer.id(),
                        jobs = c.jobs.len(), saving_hourly = %c.saving_hourly,
                        move_cost = %c.move_cost,
                        "consolidating: bought a cheaper replacement; the node drains once it is ready");
                }
                Err(e) => {
                    *report.refused.entry(e.kind()).or_default() += 1;
                    tracing::info!(node = %c.node, offer = %offer.id(), error = %e,
                        "consolidation: the replacement could not be bought; the node stays");
                }
            }
        }
        Ok(())
    }

    /// Hours a job has run, from its history: every stretch in `running`, less, for a stretch
    /// that ended `lost`, the work since its last periodic checkpoint (at most one interval).
    pub(super) async fn progress_hours(
        &self,
        job: spotplane_core::JobId,
        checkpoint_hours: Option<f64>,
        now: DateTime<Utc>,
    ) -> Result<f64, StoreError> {
        let events = self.store.job_events(job, None, None, 10_000).await?;
        let mut ran = 0.0;
        let mut since: Option<DateTime<Utc>> = None;
        for e in &events.items {
            match (since, e.to_state) {
                (None, Some(spotplane_core::JobState::Running)) => since = Some(e.at),
                (Some(start), Some(to)) if to != spotplane_core::JobState::Running => {
                    let h = (e.at - start).num_seconds().max(0) as f64 / 3600.0;
                    ran += if to == spotplane_core::JobState::Lost {
                        (h - checkpoint_hours.unwrap_or(h)).max(0.0)
                    } else {
                        h
                    };
                    since = None;
                }
                _ => {}
            }
        }
        if let Some(start) = since {
            ran += (now - start).num_seconds().max(0) as f64 / 3600.0;
        }
        Ok(ran)
    }
}
