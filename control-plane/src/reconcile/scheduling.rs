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

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::clock::SharedClock;
use crate::config::SchedulerSettings;
use crate::reconcile::runner::{ReconcileError, Reconciler, Report};
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
    /// Jobs preempted, in all; of them, for a team reclaiming its nominal quota (the rest
    /// for a higher-priority job of the same team).
    pub preempted: usize,
    pub preempted_for_reclaim: usize,
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
    /// The workload's typical shapes and when they were computed.
    typical: Option<(chrono::DateTime<chrono::Utc>, Arc<TypicalPods>)>,
}

impl Report for CycleReport {
    fn is_quiet(&self) -> bool {
        self.admitted + self.preempted + self.relayouts == 0
    }

    fn events(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("admitted", self.admitted as u64),
            (
                "preempted_for_priority",
                self.preempted.saturating_sub(self.preempted_for_reclaim) as u64,
            ),
            ("preempted_for_reclaim", self.preempted_for_reclaim as u64),
            ("mig_relayouts", self.relayouts as u64),
        ]
    }
}

#[async_trait]
impl Reconciler for SchedulerLoop {
    fn name(&self) -> &'static str {
        "scheduling"
    }

    async fn reconcile(
        &mut self,
        now: DateTime<Utc>,
        cancel: &CancellationToken,
    ) -> Result<Box<dyn Report>, ReconcileError> {
        Ok(Box::new(self.run_until(now, cancel).await?))
    }
}

impl SchedulerLoop {
    pub fn new(store: Store, clock: SharedClock, settings: SchedulerSettings) -> Self {
        SchedulerLoop {
            store,
            clock,
            settings,
            cache: SpecCache::default(),
            typical: None,
        }
    }

    /// One cycle at the clock's time.
    pub async fn run_once(&mut self) -> Result<CycleReport, ReconcileError> {
        let now = self.clock.now();
        self.run_until(now, &CancellationToken::new()).await
    }

    /// One cycle, given up (nothing written, an empty report) if `cancel` is cancelled before
    /// its decisions are made; the pure scheduler, on its blocking thread, is told to stop too.
    pub async fn run_until(
        &mut self,
        now: DateTime<Utc>,
        cancel: &CancellationToken,
    ) -> Result<CycleReport, ReconcileError> {
        let mut snap = self.store.scheduler_snapshot(&mut self.cache).await?;
        let reasons = self.store.queued_reasons().await?;
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
            r = cycle => r.map_err(|e| ReconcileError::task("scheduler", e))?,
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
            let nodes: Vec<String> = a.placements.iter().map(|p| p.node.to_string()).collect();
            let span = tracing::info_span!(
                "admit",
                job_id = %a.job,
                node_id = %nodes.first().map_or("", String::as_str),
                nodes = nodes.len(),
            );
            match self
                .store
                .admit_job(a.job, &a.placements, now)
                .instrument(span)
                .await
            {
                Ok(()) => {
                    crate::crash_point!("admission");
                    report.admitted += 1;
                }
                Err(StoreError::Conflict(why) | StoreError::NotFound(why)) => {
                    tracing::debug!(job = %a.job, %why, "admission dropped");
                    report.stale += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
        for p in &decisions.preemptions {
            match self
                .store
                .preempt_job(p.victim, p.for_job, p.reason, now)
                .await
            {
                Ok(()) => {
                    report.preempted += 1;
                    if p.reason == crate::scheduler::PreemptionReason::Reclaim {
                        report.preempted_for_reclaim += 1;
                    }
                }
                Err(StoreError::Conflict(why) | StoreError::NotFound(why)) => {
                    tracing::debug!(job = %p.victim, %why, "preemption dropped");
                    report.stale += 1;
                }
                Err(e) => return Err(e.into()),
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
                Err(e) => return Err(e.into()),
            }
        }
        let waits: Vec<_> = decisions.unmet.iter().map(|u| (u.job, u.reason)).collect();
        self.store.set_wait_reasons(&waits, &reasons).await?;
        Ok(report)
    }
}
