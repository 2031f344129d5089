//! The scheduling loop: read a snapshot from the store, run the pure scheduler on it, write
//! its decisions back, one transaction each.
//!
//! A decision that no longer applies when it is written (the job was cancelled meanwhile) is
//! skipped; the next cycle sees the new state. Nothing is kept between cycles but the parsed
//! job specs, which never change, and the workload's typical shapes (what the `fgd` and
//! `spotplane` packing policies measure fragmentation against), recomputed from the running
//! and queued jobs every [`TYPICAL_REFRESH`]: a distribution that moves slowly, as FGD takes it
//! from the trace once.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::SchedulerSettings;
use crate::reconcile::capacity::CapacityLoop;
use crate::reconcile::recovery::RecoveryLoop;
use crate::scheduler::frag::TypicalPods;
use crate::scheduler::policies::{self, typical_from_shapes};
use crate::scheduler::{SchedulerConfig, schedule};
use crate::store::{SpecCache, Store, StoreError};

/// How long the typical shapes of the workload are kept before they are recomputed.
pub const TYPICAL_REFRESH: chrono::Duration = chrono::Duration::seconds(60);

/// What one cycle did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CycleReport {
    pub queued: usize,
    pub running: usize,
    pub admitted: usize,
    pub preempted: usize,
    pub relayouts: usize,
    pub waiting: usize,
    /// Decisions dropped because the job or node changed since the snapshot.
    pub stale: usize,
}

pub struct SchedulerLoop {
    store: Store,
    clock: SharedClock,
    settings: SchedulerSettings,
    cache: SpecCache,
    /// The capacity loop, run by the same leader after a scheduling cycle, at its own pace.
    capacity: Option<(CapacityLoop, Duration, Option<tokio::time::Instant>)>,
    /// The recovery loop, run by the same leader before each scheduling cycle.
    recovery: Option<RecoveryLoop>,
    /// The workload's typical shapes and when they were computed.
    typical: Option<(chrono::DateTime<chrono::Utc>, Arc<TypicalPods>)>,
}

impl SchedulerLoop {
    pub fn new(store: Store, clock: SharedClock, settings: SchedulerSettings) -> Self {
        SchedulerLoop {
            store,
            clock,
            settings,
            cache: SpecCache::default(),
            capacity: None,
            recovery: None,
            typical: None,
        }
    }

    /// Also runs `recovery` before every scheduling cycle.
    pub fn with_recovery(mut self, recovery: RecoveryLoop) -> Self {
        self.recovery = Some(recovery);
        self
    }

    /// Also runs `capacity` every `interval`, after the scheduling cycle that falls due.
    pub fn with_capacity(mut self, capacity: CapacityLoop, interval: Duration) -> Self {
        self.capacity = Some((capacity, interval, None));
        self
    }

    /// One cycle.
    pub async fn run_once(&mut self) -> Result<CycleReport, StoreError> {
        self.run_until(&CancellationToken::new()).await
    }

    /// One cycle, given up (nothing written, an empty report) if `cancel` is cancelled before
    /// its decisions are made; the pure scheduler, on its blocking thread, is told to stop too.
    pub async fn run_until(
        &mut self,
        cancel: &CancellationToken,
    ) -> Result<CycleReport, StoreError> {
        let mut snap = self.store.scheduler_snapshot(&mut self.cache).await?;
        let reasons = self.store.queued_reasons().await?;
        let now = self.clock.now();
        // A job backing off after a failure waits its turn out.
        let backing_off = self.store.jobs_backing_off(now).await?;
        if !backing_off.is_empty() {
            snap.queued.retain(|q| !backing_off.contains(&q.id));
        }
        let cfg = SchedulerConfig {
            candidates: self.settings.candidates,
            preemption: self.settings.preemption,
            dynamic_mig: self.settings.dynamic_mig,
            stop: Some(Arc::new(std::sync::atomic::AtomicBool::new(false))),
            ..SchedulerConfig::default()
        };
        let stop = cfg.stop.clone();
        let policy_name = self.settings.policy.clone();
        let cached = self
            .typical
            .as_ref()
            .filter(|(at, _)| now - *at < TYPICAL_REFRESH && now >= *at)
            .map(|(_, t)| Arc::clone(t));
        // The cycle is CPU work (up to a few hundred ms on a large cluster): off the runtime.
        let cycle = tokio::task::spawn_blocking(move || {
            let typical = cached.unwrap_or_else(|| {
                Arc::new(typical_from_shapes(
                    snap.queued.iter().map(|q| (&q.shape, q.replicas)).chain(
                        snap.running
                            .iter()
                            .map(|r| (&r.shape, r.placements.len() as u32)),
                    ),
                ))
            });
            let policy = policies::by_name(&policy_name, Arc::clone(&typical))
                .unwrap_or_else(|| Box::new(policies::BestFit));
            let d = schedule(&snap, policy.as_ref(), &cfg, now);
            (snap, d, typical)
        });
        let (snap, decisions, typical) = tokio::select! {
            r = cycle => r.map_err(|e| StoreError::Connect(format!("scheduler task failed: {e}")))?,
            () = cancel.cancelled() => {
                if let Some(s) = &stop {
                    s.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                return Ok(CycleReport::default());
            }
        };
        if self
            .typical
            .as_ref()
            .is_none_or(|(_, t)| !Arc::ptr_eq(t, &typical))
        {
            self.typical = Some((now, typical));
        }

        let mut report = CycleReport {
            queued: snap.queued.len(),
            running: snap.running.len(),
            waiting: decisions.unmet.len(),
            ..CycleReport::default()
        };
        for a in &decisions.admissions {
            match self.store.admit_job(a.job, &a.placements, now).await {
                Ok(()) => report.admitted += 1,
                Err(StoreError::Conflict(why) | StoreError::NotFound(why)) => {
                    tracing::debug!(job = %a.job, %why, "admission dropped");
                    report.stale += 1;
                }
                Err(e) => return Err(e),
            }
        }
        for p in &decisions.preemptions {
            match self
                .store
                .preempt_job(p.victim, p.for_job, p.reason, now)
                .await
            {
                Ok(()) => report.preempted += 1,
                Err(StoreError::Conflict(why) | StoreError::NotFound(why)) => {
                    tracing::debug!(job = %p.victim, %why, "preemption dropped");
                    report.stale += 1;
                }
                Err(e) => return Err(e),
            }
        }
        for r in &decisions.repartitions {
            match self
                .store
                .request_relayout(r.node, r.gpu, r.layout.as_ref(), now)
                .await
            {
                Ok(()) => report.relayouts += 1,
                Err(StoreError::NotFound(why)) => {
                    tracing::debug!(%why, "re-layout dropped");
                    report.stale += 1;
                }
                Err(e) => return Err(e),
            }
        }
        let waits: Vec<_> = decisions.unmet.iter().map(|u| (u.job, u.reason)).collect();
        self.store.set_wait_reasons(&waits, &reasons).await?;
        Ok(report)
    }

    /// Runs cycles every `settings.interval` until cancelled, while this replica leads.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut leader = None;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            if leader.is_none() {
                match self.store.try_lead("scheduling").await {
                    Ok(Some(l)) => {
                        tracing::info!("leading: running the scheduling loop");
                        leader = Some(l);
                    }
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot take leadership");
                        continue;
                    }
                }
            }
            if let Some(l) = &mut leader
                && !l.still_held().await
            {
                tracing::warn!("lost leadership");
                leader = None;
                continue;
            }
            // A round is given up at shutdown: each decision is its own transaction, so one
            // cut short leaves the store consistent, and the next leader goes on from there.
            if let Some(recovery) = &mut self.recovery {
                let round = tokio::select! {
                    r = recovery.run_once() => r,
                    () = cancel.cancelled() => return,
                };
                match round {
                    Ok(r) if !r.is_quiet() => tracing::info!(?r, "recovery round"),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "recovery round failed; retrying next tick")
                    }
                }
            }
            let cycle = tokio::select! {
                r = self.run_until(&cancel) => r,
                () = cancel.cancelled() => return,
            };
            if cancel.is_cancelled() {
                return;
            }
            match cycle {
                Ok(r) if r.admitted + r.preempted + r.relayouts > 0 => {
                    tracing::info!(?r, "scheduling cycle")
                }
                Ok(r) => tracing::debug!(?r, "scheduling cycle"),
                Err(e) => {
                    tracing::warn!(error = %e, "scheduling cycle failed; retrying next tick");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            if let Some((capacity, interval, last)) = &mut self.capacity
                && last.is_none_or(|t| t.elapsed() >= *interval)
            {
                *last = Some(tokio::time::Instant::now());
                let round = tokio::select! {
                    r = capacity.run_once() => r,
                    () = cancel.cancelled() => return,
                };
                match round {
                    Ok(r) if r.bought + r.released + r.vanished + r.orphans + r.ready > 0 => {
                        tracing::info!(?r, "capacity round")
                    }
                    Ok(r) => tracing::debug!(?r, "capacity round"),
                    Err(e) => {
                        tracing::warn!(error = %e, "capacity round failed; retrying next time")
                    }
                }
            }
        }
    }
}
