//! The runner: one place for what every loop of the control plane needs besides its own work —
//! leadership, ticking, cancellation and back-off after a failure.
//!
//! A loop is a [`Reconciler`]: one pass at `now` (read a snapshot, call a pure core, write its
//! decisions back), and an error policy that says how long to wait before the next try, as in
//! kube-rs's `Controller`. A [`Round`] is the reconcilers that run one after another under one
//! leader lock, each at its own pace; [`run`] runs a round on every tick while this replica
//! leads. server.rs declares the rounds:
//!
//! - `scheduling`: recovery → scheduling → capacity. One lock, because each step works on what
//!   the one before it wrote (a requeued job is placed in the same tick; a job the scheduler
//!   could not place is bought for right after).
//! - `ledger` and `webhooks`, each under its own lock.
//!
//! A failed pass of one step does not stop the others: the step is set aside for its error
//! policy's delay (doubling while it keeps failing), and the rest of the round goes on. At
//! shutdown the pass in flight is given up: each write of a pass is its own transaction, so a
//! pass cut short leaves the store consistent, and the next leader goes on from there.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::store::{Leadership, Store, StoreError};

/// Why a pass failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The blocking task that ran a pure core panicked or was cancelled.
    #[error("the {what} task failed: {reason}")]
    Task { what: &'static str, reason: String },
}

impl ReconcileError {
    /// The error of a pure core's blocking task.
    pub fn task(what: &'static str, e: tokio::task::JoinError) -> Self {
        ReconcileError::Task {
            what,
            reason: e.to_string(),
        }
    }
}

/// What a pass did, for the log.
pub trait Report: Debug + Send {
    /// Nothing changed: logged at debug level only.
    fn is_quiet(&self) -> bool;

    /// What the pass did, by event name, for `spotplane_reconcile_events_total`: things that
    /// happened once (an admission, a requeue), never states that last over passes.
    fn events(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// What the pass read from the outbox for the recovery and job metrics.
    fn signals(&self) -> &[crate::metrics::outbox::Signal] {
        &[]
    }
}

/// One loop of the control plane.
#[async_trait]
pub trait Reconciler: Send {
    /// Its name in the log.
    fn name(&self) -> &'static str;

    /// One pass at `now`. A pass may give up early when `cancel` fires; what it wrote stays.
    async fn reconcile(
        &mut self,
        now: DateTime<Utc>,
        cancel: &CancellationToken,
    ) -> Result<Box<dyn Report>, ReconcileError>;

    /// How long to wait after the `failures`-th failed pass in a row before trying again.
    fn error_policy(&self, _error: &ReconcileError, failures: u32) -> Duration {
        Backoff::DEFAULT.after(failures)
    }
}

/// Exponential back-off: `base` after the first failure, doubled after each next one, at most
/// `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    pub const DEFAULT: Backoff = Backoff {
        base: Duration::from_millis(100),
        max: Duration::from_secs(30),
    };

    pub fn after(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(20);
        self.base
            .checked_mul(1 << doublings)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// Who leads a round. The store's advisory locks in production ([`Store::try_lead`]); tests
/// give their own.
#[async_trait]
pub trait Elector: Send + Sync {
    async fn try_lead(&self, lock: &str) -> Result<Option<Box<dyn Lease>>, StoreError>;
}

/// Leadership held.
#[async_trait]
pub trait Lease: Send {
    /// Whether it is still held (a broken connection loses it).
    async fn still_held(&mut self) -> bool;
}

#[async_trait]
impl Elector for Store {
    async fn try_lead(&self, lock: &str) -> Result<Option<Box<dyn Lease>>, StoreError> {
        Ok(Store::try_lead(self, lock)
            .await?
            .map(|l| Box::new(l) as Box<dyn Lease>))
    }
}

#[async_trait]
impl Lease for Leadership {
    async fn still_held(&mut self) -> bool {
        Leadership::still_held(self).await
    }
}

/// One reconciler of a round, and when it runs.
struct Step {
    reconciler: Box<dyn Reconciler>,
    /// Runs at most this often (`None`: every tick).
    every: Option<Duration>,
    last_run: Option<Instant>,
    failures: u32,
    retry_at: Option<Instant>,
}

/// Reconcilers run in order under one leader lock.
pub struct Round {
    lock: &'static str,
    interval: Duration,
    steps: Vec<Step>,
}

/// How one step of a round went.
#[derive(Debug)]
pub enum StepOutcome {
    Done(Box<dyn Report>),
    Failed(ReconcileError),
    /// Not due yet (its own pace, or backing off after a failure).
    Skipped,
}

impl Round {
    /// A round under `lock`, ticking every `interval`.
    pub fn new(lock: &'static str, interval: Duration) -> Self {
        Round {
            lock,
            interval,
            steps: Vec::new(),
        }
    }

    /// Adds a step run on every tick.
    pub fn step(mut self, reconciler: impl Reconciler + 'static) -> Self {
        self.push(Box::new(reconciler), None);
        self
    }

    /// Adds a step run at most every `every` (on the first tick that falls due).
    pub fn step_every(mut self, reconciler: impl Reconciler + 'static, every: Duration) -> Self {
        self.push(Box::new(reconciler), Some(every));
        self
    }

    fn push(&mut self, reconciler: Box<dyn Reconciler>, every: Option<Duration>) {
        self.steps.push(Step {
            reconciler,
            every,
            last_run: None,
            failures: 0,
            retry_at: None,
        });
    }

    pub fn lock(&self) -> &'static str {
        self.lock
    }

    /// The steps' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.steps.iter().map(|s| s.reconciler.name()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// One round: each step that is due, in order, at the clock's time as it starts. Returns
    /// `None` when `cancel` fired (the step in flight given up, the rest not started).
    pub async fn run_once(
        &mut self,
        clock: &SharedClock,
        cancel: &CancellationToken,
    ) -> Option<Vec<(&'static str, StepOutcome, Duration)>> {
        let mut out = Vec::with_capacity(self.steps.len());
        for step in &mut self.steps {
            let name = step.reconciler.name();
            let at = Instant::now();
            let due = step.retry_at.is_none_or(|t| at >= t)
                && step
                    .every
                    .is_none_or(|every| step.last_run.is_none_or(|t| at - t >= every));
            if !due {
                out.push((name, StepOutcome::Skipped, Duration::ZERO));
                continue;
            }
            step.last_run = Some(at);
            let now = clock.now();
            let pass = tokio::select! {
                r = step.reconciler.reconcile(now, cancel) => r,
                () = cancel.cancelled() => return None,
            };
            if cancel.is_cancelled() {
                return None;
            }
            match pass {
                Ok(report) => {
                    step.failures = 0;
                    step.retry_at = None;
                    out.push((name, StepOutcome::Done(report), at.elapsed()));
                }
                Err(e) => {
                    step.failures = step.failures.saturating_add(1);
                    let wait = step.reconciler.error_policy(&e, step.failures);
                    step.retry_at = Some(Instant::now() + wait);
                    tracing::warn!(step = name, error = %e, failures = step.failures, retry_in = ?wait,
                        "pass failed; the rest of the round goes on");
                    out.push((name, StepOutcome::Failed(e), at.elapsed()));
                }
            }
        }
        Some(out)
    }
}

/// Runs `round` on every tick until `cancel` fires, while this replica holds its lock,
/// recording into `metrics` whether it leads, how long each pass took and what it did.
pub async fn run(
    mut round: Round,
    elector: Arc<dyn Elector>,
    clock: SharedClock,
    cancel: CancellationToken,
    metrics: Option<crate::metrics::Metrics>,
) {
    let lock = round.lock;
    let leading = |on: bool| {
        if let Some(m) = &metrics {
            m.set_leader(lock, on);
        }
    };
    leading(false);
    let mut tick = tokio::time::interval(round.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lease: Option<Box<dyn Lease>> = None;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if lease.is_none() {
            match elector.try_lead(round.lock).await {
                Ok(Some(l)) => {
                    tracing::info!(lock = round.lock, steps = ?round.names(), "leading");
                    lease = Some(l);
                    leading(true);
                }
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(lock = round.lock, error = %e, "cannot take leadership");
                    continue;
                }
            }
        }
        if let Some(l) = &mut lease
            && !l.still_held().await
        {
            tracing::warn!(lock = round.lock, "lost leadership");
            lease = None;
            leading(false);
            continue;
        }
        let Some(outcomes) = round.run_once(&clock, &cancel).await else {
            return;
        };
        for (name, outcome, took) in outcomes {
            if let Some(m) = &metrics {
                m.observe_pass(name, &outcome, took);
            }
            if let StepOutcome::Done(report) = outcome {
                if report.is_quiet() {
                    tracing::debug!(step = name, ?report, "pass");
                } else {
                    tracing::info!(step = name, ?report, "pass");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::*;
    use crate::clock::SystemClock;

    #[derive(Debug)]
    struct Quiet;
    impl Report for Quiet {
        fn is_quiet(&self) -> bool {
            true
        }
    }

    /// Records its passes in `log`; fails while `failing` says so.
    struct Probe {
        name: &'static str,
        log: Arc<Mutex<Vec<&'static str>>>,
        failing: Arc<AtomicBool>,
        hang: bool,
    }

    #[async_trait]
    impl Reconciler for Probe {
        fn name(&self) -> &'static str {
            self.name
        }
        async fn reconcile(
            &mut self,
            _now: DateTime<Utc>,
            _cancel: &CancellationToken,
        ) -> Result<Box<dyn Report>, ReconcileError> {
            self.log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.name);
            if self.hang {
                std::future::pending::<()>().await;
            }
            if self.failing.load(Ordering::SeqCst) {
                return Err(StoreError::Conflict("failing on purpose".into()).into());
            }
            Ok(Box::new(Quiet))
        }
    }

    fn probe(name: &'static str, log: &Arc<Mutex<Vec<&'static str>>>) -> (Probe, Arc<AtomicBool>) {
        let failing = Arc::new(AtomicBool::new(false));
        (
            Probe {
                name,
                log: Arc::clone(log),
                failing: Arc::clone(&failing),
                hang: false,
            },
            failing,
        )
    }

    fn clock() -> SharedClock {
        Arc::new(SystemClock)
    }

    fn taken(log: &Arc<Mutex<Vec<&'static str>>>) -> Vec<&'static str> {
        std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner()))
    }

    #[test]
    fn back_off_doubles_from_its_base_up_to_its_most() {
        let b = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let table = [
            (0, 100),
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (60, 1000),
        ];
        for (failures, ms) in table {
            assert_eq!(b.after(failures), Duration::from_millis(ms), "{failures}");
        }
        assert_eq!(Backoff::DEFAULT.after(u32::MAX), Backoff::DEFAULT.max);
    }

    #[tokio::test(start_paused = true)]
    async fn steps_run_in_order_each_at_its_own_pace() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let (recovery, _) = probe("recovery", &log);
        let (scheduling, _) = probe("scheduling", &log);
        let (capacity, _) = probe("capacity", &log);
        let mut round = Round::new("scheduling", Duration::from_secs(1))
            .step(recovery)
            .step(scheduling)
            .step_every(capacity, Duration::from_secs(3));
        assert_eq!(round.names(), ["recovery", "scheduling", "capacity"]);
        let cancel = CancellationToken::new();
        let mut seen = Vec::new();
        for _ in 0..4 {
            round.run_once(&clock(), &cancel).await;
            seen.push(taken(&log));
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let all = vec!["recovery", "scheduling", "capacity"];
        let two = vec!["recovery", "scheduling"];
        assert_eq!(seen, [all.clone(), two.clone(), two, all]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_step_backs_off_and_the_rest_of_the_round_goes_on() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let (recovery, failing) = probe("recovery", &log);
        let (scheduling, _) = probe("scheduling", &log);
        failing.store(true, Ordering::SeqCst);
        let mut round = Round::new("scheduling", Duration::from_millis(50))
            .step(recovery)
            .step(scheduling);
        let cancel = CancellationToken::new();
        // Failures at 0 ms, then (100 ms back-off) 100 ms, then (200 ms) 300 ms.
        let mut runs = Vec::new();
        for tick in 0..8 {
            let out = round.run_once(&clock(), &cancel).await.unwrap_or_default();
            let failed = out
                .iter()
                .any(|(n, o, _)| *n == "recovery" && matches!(o, StepOutcome::Failed(_)));
            if taken(&log).contains(&"recovery") {
                runs.push((tick * 50, failed));
            }
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        assert_eq!(runs, [(0, true), (100, true), (300, true)]);
        // Healed: the next due pass succeeds and the back-off starts over.
        failing.store(false, Ordering::SeqCst);
        tokio::time::advance(Duration::from_millis(400)).await;
        let out = round.run_once(&clock(), &cancel).await.unwrap_or_default();
        assert!(matches!(out[0].1, StepOutcome::Done(_)), "{out:?}");
        assert!(matches!(out[1].1, StepOutcome::Done(_)), "{out:?}");
        assert_eq!(round.steps[0].failures, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_gives_up_the_pass_in_flight_and_starts_no_other() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let (mut stuck, _) = probe("recovery", &log);
        stuck.hang = true;
        let (scheduling, _) = probe("scheduling", &log);
        let mut round = Round::new("scheduling", Duration::from_secs(1))
            .step(stuck)
            .step(scheduling);
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            stop.cancel();
        });
        assert!(round.run_once(&clock(), &cancel).await.is_none());
        assert_eq!(taken(&log), ["recovery"]);
    }

    /// Leads while `leading` says so; counts the leases it gave.
    struct Switch {
        leading: Arc<AtomicBool>,
        granted: AtomicU32,
    }
    struct SwitchLease(Arc<AtomicBool>);

    #[async_trait]
    impl Elector for Switch {
        async fn try_lead(&self, _lock: &str) -> Result<Option<Box<dyn Lease>>, StoreError> {
            if !self.leading.load(Ordering::SeqCst) {
                return Ok(None);
            }
            self.granted.fetch_add(1, Ordering::SeqCst);
            Ok(Some(Box::new(SwitchLease(Arc::clone(&self.leading)))))
        }
    }
    #[async_trait]
    impl Lease for SwitchLease {
        async fn still_held(&mut self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_leader_runs_the_round_and_a_lost_lease_is_taken_again() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let (scheduling, _) = probe("scheduling", &log);
        let leading = Arc::new(AtomicBool::new(false));
        let elector = Arc::new(Switch {
            leading: Arc::clone(&leading),
            granted: AtomicU32::new(0),
        });
        let round = Round::new("scheduling", Duration::from_secs(1)).step(scheduling);
        let cancel = CancellationToken::new();
        let metrics = crate::metrics::Metrics::new();
        let task = tokio::spawn(run(
            round,
            Arc::clone(&elector) as Arc<dyn Elector>,
            clock(),
            cancel.clone(),
            Some(metrics.clone()),
        ));
        let sample = |name: &str| {
            metrics
                .render()
                .lines()
                .find(|l| l.starts_with(name))
                .map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned())
        };
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert!(taken(&log).is_empty(), "a follower runs nothing");
        assert_eq!(
            sample("spotplane_leader{lock=\"scheduling\"}").as_deref(),
            Some("0")
        );
        leading.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(taken(&log).len(), 3, "one pass a tick while leading");
        assert_eq!(
            sample("spotplane_leader{lock=\"scheduling\"}").as_deref(),
            Some("1")
        );
        assert_eq!(
            sample("spotplane_reconcile_pass_seconds_count{step=\"scheduling\",outcome=\"done\"}")
                .as_deref(),
            Some("3")
        );
        leading.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(taken(&log).is_empty(), "the lease lost: nothing runs");
        assert_eq!(
            sample("spotplane_leader{lock=\"scheduling\"}").as_deref(),
            Some("0")
        );
        leading.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!taken(&log).is_empty());
        assert_eq!(
            elector.granted.load(Ordering::SeqCst),
            2,
            "taken again after the loss"
        );
        cancel.cancel();
        task.await.expect("the runner stops when cancelled");
    }
}
