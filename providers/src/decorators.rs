//! Cross-cutting behaviour as decorators around any [`CloudProvider`]: retries with jittered
//! backoff, a rate limit, and metrics. Provider code does none of this itself.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use spotplane_core::Cloud;
use tracing::Instrument;

use crate::{
    CloudProvider, Instance, InterruptionEvent, Offer, PoolRef, PriceChange, ProviderError,
    ProvisionRequest,
};

/// Retries what can succeed later (throttling, transient errors) with exponential backoff and
/// full jitter, honouring a throttled call's `retry_after`. Everything else fails at once.
///
/// Two bounds, whichever comes first: `attempts` calls in all, and `budget` of time from the
/// call's start. A retry whose back-off would end past the budget is not made (and nothing
/// sleeps past it): the caller gets the last error while it can still act on it, e.g. try
/// another offer or terminate before a notice window closes. The budget does not cut an
/// attempt short; each attempt is bounded by its client's own request timeout.
pub struct Retrying<P> {
    inner: P,
    attempts: u32,
    base: Duration,
    max: Duration,
    budget: Duration,
    seed: Mutex<u64>,
}

impl<P> Retrying<P> {
    pub fn new(inner: P, attempts: u32, base: Duration, max: Duration, budget: Duration) -> Self {
        Retrying {
            inner,
            attempts: attempts.max(1),
            base,
            max,
            budget,
            seed: Mutex::new(0x9e37_79b9_7f4a_7c15),
        }
    }

    /// The wait before retry `n` (1-based): a random share of min(max, base × 2^n).
    fn backoff(&self, n: u32, err: &ProviderError) -> Duration {
        let cap = self.base.saturating_mul(1 << n.min(16)).min(self.max);
        let mut s = self.seed.lock().unwrap_or_else(|p| p.into_inner());
        // xorshift: cheap, deterministic, good enough for jitter.
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        let jitter = cap.mul_f64((*s % 10_000) as f64 / 10_000.0);
        match err {
            ProviderError::Throttled { retry_after } => (*retry_after).max(jitter),
            _ => jitter,
        }
    }

    async fn run<T, F, Fut>(&self, mut call: F) -> Result<T, ProviderError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, ProviderError>>,
    {
        let started = tokio::time::Instant::now();
        let mut n = 1;
        loop {
            match call().await {
                Err(e) if e.is_retryable() && n < self.attempts => {
                    let wait = self.backoff(n, &e);
                    if started.elapsed().saturating_add(wait) > self.budget {
                        return Err(e);
                    }
                    tokio::time::sleep(wait).await;
                    n += 1;
                }
                other => return other,
            }
        }
    }
}

#[async_trait]
impl<P: CloudProvider> CloudProvider for Retrying<P> {
    fn cloud(&self) -> Cloud {
        self.inner.cloud()
    }
    async fn list_offers(&self) -> Result<Vec<Offer>, ProviderError> {
        self.run(|| self.inner.list_offers()).await
    }
    async fn provision(&self, req: &ProvisionRequest) -> Result<Instance, ProviderError> {
        // Safe to repeat: provisioning is idempotent by client token.
        self.run(|| self.inner.provision(req)).await
    }
    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        self.run(|| self.inner.terminate(provider_id)).await
    }
    async fn list_instances(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<Instance>, ProviderError> {
        self.run(|| self.inner.list_instances(tags)).await
    }
    async fn drain_interruptions(&self) -> Result<Vec<InterruptionEvent>, ProviderError> {
        self.run(|| self.inner.drain_interruptions()).await
    }
    async fn price_history(
        &self,
        pool: &PoolRef<'_>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Option<Vec<PriceChange>>, ProviderError> {
        self.run(|| self.inner.price_history(pool, from, to)).await
    }
}

/// At most `per_second` calls per second on average, in bursts of up to `burst` (a token
/// bucket on tokio's clock); callers wait for a token rather than fail.
pub struct RateLimited<P> {
    inner: P,
    per_second: f64,
    burst: f64,
    bucket: tokio::sync::Mutex<(f64, tokio::time::Instant)>,
}

impl<P> RateLimited<P> {
    pub fn new(inner: P, per_second: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        RateLimited {
            inner,
            per_second: per_second.max(0.001),
            burst,
            bucket: tokio::sync::Mutex::new((burst, tokio::time::Instant::now())),
        }
    }

    async fn acquire(&self) {
        let mut b = self.bucket.lock().await;
        loop {
            let now = tokio::time::Instant::now();
            let refill = now.duration_since(b.1).as_secs_f64() * self.per_second;
            b.0 = (b.0 + refill).min(self.burst);
            b.1 = now;
            if b.0 >= 1.0 {
                b.0 -= 1.0;
                return;
            }
            let wait = Duration::from_secs_f64((1.0 - b.0) / self.per_second);
            tokio::time::sleep(wait).await;
        }
    }
}

#[async_trait]
impl<P: CloudProvider> CloudProvider for RateLimited<P> {
    fn cloud(&self) -> Cloud {
        self.inner.cloud()
    }
    async fn list_offers(&self) -> Result<Vec<Offer>, ProviderError> {
        self.acquire().await;
        self.inner.list_offers().await
    }
    async fn provision(&self, req: &ProvisionRequest) -> Result<Instance, ProviderError> {
        self.acquire().await;
        self.inner.provision(req).await
    }
    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        self.acquire().await;
        self.inner.terminate(provider_id).await
    }
    async fn list_instances(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<Instance>, ProviderError> {
        self.acquire().await;
        self.inner.list_instances(tags).await
    }
    async fn drain_interruptions(&self) -> Result<Vec<InterruptionEvent>, ProviderError> {
        self.acquire().await;
        self.inner.drain_interruptions().await
    }
    async fn price_history(
        &self,
        pool: &PoolRef<'_>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Option<Vec<PriceChange>>, ProviderError> {
        self.acquire().await;
        self.inner.price_history(pool, from, to).await
    }
}

/// What a metered call reports: the cloud, the operation, the error kind (`None` when it
/// succeeded) and how long it took.
pub type Observer = Arc<dyn Fn(Cloud, &'static str, Option<&'static str>, Duration) + Send + Sync>;

/// Reports every call to an observer (the control plane feeds its Prometheus registry), each
/// in a `provider_call` span (cloud, op; the node for a provision).
pub struct Metered<P> {
    inner: P,
    observe: Observer,
}

impl<P> Metered<P> {
    pub fn new(inner: P, observe: Observer) -> Self {
        Metered { inner, observe }
    }

    fn report<T>(
        &self,
        cloud: Cloud,
        op: &'static str,
        started: Instant,
        r: &Result<T, ProviderError>,
    ) {
        (self.observe)(
            cloud,
            op,
            r.as_ref().err().map(ProviderError::kind),
            started.elapsed(),
        );
    }
}

#[async_trait]
impl<P: CloudProvider> CloudProvider for Metered<P> {
    fn cloud(&self) -> Cloud {
        self.inner.cloud()
    }
    async fn list_offers(&self) -> Result<Vec<Offer>, ProviderError> {
        let t = Instant::now();
        let r = self
            .inner
            .list_offers()
            .instrument(
                tracing::info_span!("provider_call", cloud = %self.cloud(), op = "list_offers"),
            )
            .await;
        self.report(self.cloud(), "list_offers", t, &r);
        r
    }
    async fn provision(&self, req: &ProvisionRequest) -> Result<Instance, ProviderError> {
        let t = Instant::now();
        let r = self.inner.provision(req)
            .instrument(tracing::info_span!("provider_call", cloud = %self.cloud(), op = "provision", node_id = %req.node_id))
            .await;
        self.report(self.cloud(), "provision", t, &r);
        r
    }
    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        let t = Instant::now();
        let r = self.inner.terminate(provider_id)
            .instrument(tracing::info_span!("provider_call", cloud = %self.cloud(), op = "terminate", instance = %provider_id))
            .await;
        self.report(self.cloud(), "terminate", t, &r);
        r
    }
    async fn list_instances(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<Instance>, ProviderError> {
        let t = Instant::now();
        let r = self
            .inner
            .list_instances(tags)
            .instrument(
                tracing::info_span!("provider_call", cloud = %self.cloud(), op = "list_instances"),
            )
            .await;
        self.report(self.cloud(), "list_instances", t, &r);
        r
    }
    async fn drain_interruptions(&self) -> Result<Vec<InterruptionEvent>, ProviderError> {
        let t = Instant::now();
        let r = self.inner.drain_interruptions()
            .instrument(tracing::info_span!("provider_call", cloud = %self.cloud(), op = "drain_interruptions"))
            .await;
        self.report(self.cloud(), "drain_interruptions", t, &r);
        r
    }
    async fn price_history(
        &self,
        pool: &PoolRef<'_>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Option<Vec<PriceChange>>, ProviderError> {
        let t = Instant::now();
        let r = self
            .inner
            .price_history(pool, from, to)
            .instrument(
                tracing::info_span!("provider_call", cloud = %self.cloud(), op = "price_history"),
            )
            .await;
        self.report(self.cloud(), "price_history", t, &r);
        r
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A recording fake: fails the first `failures` calls with `error`, then succeeds. Each
    /// `list_offers` takes `took` and records when it started.
    struct Flaky {
        calls: AtomicU32,
        failures: u32,
        error: ProviderError,
        took: Duration,
        starts: Mutex<Vec<tokio::time::Instant>>,
    }

    #[async_trait]
    impl CloudProvider for Flaky {
        fn cloud(&self) -> Cloud {
            Cloud::Aws
        }
        async fn list_offers(&self) -> Result<Vec<Offer>, ProviderError> {
            self.starts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(tokio::time::Instant::now());
            tokio::time::sleep(self.took).await;
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            if n < self.failures {
                Err(self.error.clone())
            } else {
                Ok(Vec::new())
            }
        }
        async fn provision(&self, _: &ProvisionRequest) -> Result<Instance, ProviderError> {
            Err(ProviderError::InvalidRequest("unused".into()))
        }
        async fn terminate(&self, _: &str) -> Result<(), ProviderError> {
            Ok(())
        }
        async fn list_instances(
            &self,
            _: &BTreeMap<String, String>,
        ) -> Result<Vec<Instance>, ProviderError> {
            Ok(Vec::new())
        }
        async fn drain_interruptions(&self) -> Result<Vec<InterruptionEvent>, ProviderError> {
            Ok(Vec::new())
        }
    }

    /// A budget the tests that count attempts never reach.
    const NO_BUDGET: Duration = Duration::from_secs(3600);

    fn flaky(failures: u32, error: ProviderError) -> Flaky {
        Flaky {
            calls: AtomicU32::new(0),
            failures,
            error,
            took: Duration::ZERO,
            starts: Mutex::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_keeps_failing_gives_up_within_its_budget() {
        let budget = Duration::from_secs(20);
        let p = Retrying::new(
            Flaky {
                took: Duration::from_secs(1),
                ..flaky(u32::MAX, ProviderError::Transient("down".into()))
            },
            1_000,
            Duration::from_millis(200),
            Duration::from_secs(10),
            budget,
        );
        let started = tokio::time::Instant::now();
        assert!(matches!(
            p.list_offers().await,
            Err(ProviderError::Transient(_))
        ));
        let starts = p.inner.starts.lock().unwrap_or_else(|e| e.into_inner());
        assert!(starts.len() > 2, "it retried: {} attempts", starts.len());
        // No attempt starts past the budget (no back-off sleeps past it), and the last one
        // ends within one attempt's time of it.
        let last = starts.last().copied().unwrap_or(started);
        assert!(last - started <= budget, "{:?}", last - started);
        assert!(
            started.elapsed() <= budget + p.inner.took,
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttle_longer_than_the_budget_fails_at_once_with_the_throttle() {
        let p = Retrying::new(
            flaky(
                1,
                ProviderError::Throttled {
                    retry_after: Duration::from_secs(30),
                },
            ),
            4,
            Duration::from_millis(200),
            Duration::from_secs(10),
            Duration::from_secs(20),
        );
        let started = tokio::time::Instant::now();
        assert!(matches!(
            p.list_offers().await,
            Err(ProviderError::Throttled { .. })
        ));
        assert_eq!(p.inner.calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "no sleep it could not use"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_succeeds_on_its_second_attempt_succeeds_within_the_budget() {
        let p = Retrying::new(
            flaky(1, ProviderError::Transient("reset".into())),
            4,
            Duration::from_millis(200),
            Duration::from_secs(10),
            Duration::from_secs(20),
        );
        let started = tokio::time::Instant::now();
        assert!(p.list_offers().await.is_ok());
        assert_eq!(p.inner.calls.load(Ordering::SeqCst), 2);
        assert!(started.elapsed() <= Duration::from_millis(400));
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_with_backoff() {
        let p = Retrying::new(
            flaky(2, ProviderError::Transient("reset".into())),
            4,
            Duration::from_millis(100),
            Duration::from_secs(5),
            NO_BUDGET,
        );
        let started = tokio::time::Instant::now();
        assert!(p.list_offers().await.is_ok());
        assert_eq!(p.inner.calls.load(Ordering::SeqCst), 3);
        assert!(
            started.elapsed() <= Duration::from_millis(200 + 400),
            "backoff is bounded: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_waits_at_least_the_retry_after() {
        let p = Retrying::new(
            flaky(
                1,
                ProviderError::Throttled {
                    retry_after: Duration::from_secs(3),
                },
            ),
            3,
            Duration::from_millis(10),
            Duration::from_secs(1),
            NO_BUDGET,
        );
        let started = tokio::time::Instant::now();
        assert!(p.list_offers().await.is_ok());
        assert!(started.elapsed() >= Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn errors_that_cannot_succeed_later_are_not_retried_and_attempts_are_bounded() {
        let p = Retrying::new(
            flaky(5, ProviderError::Quota("vCPU".into())),
            4,
            Duration::from_millis(10),
            Duration::from_secs(1),
            NO_BUDGET,
        );
        assert!(matches!(
            p.list_offers().await,
            Err(ProviderError::Quota(_))
        ));
        assert_eq!(p.inner.calls.load(Ordering::SeqCst), 1);
        let p = Retrying::new(
            flaky(10, ProviderError::Transient("down".into())),
            3,
            Duration::from_millis(10),
            Duration::from_secs(1),
            NO_BUDGET,
        );
        assert!(p.list_offers().await.is_err());
        assert_eq!(p.inner.calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_limit_spaces_calls_after_the_burst() {
        let p = RateLimited::new(flaky(0, ProviderError::Transient(String::new())), 2.0, 2);
        let started = tokio::time::Instant::now();
        for _ in 0..6 {
            p.list_offers().await.expect("ok");
        }
        // 2 at once, then 4 more at 2 per second.
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(1_900) && took <= Duration::from_millis(2_100),
            "{took:?}"
        );
    }

    #[tokio::test]
    async fn metering_reports_each_call_with_its_outcome() {
        type Calls = Vec<(&'static str, Option<&'static str>)>;
        let seen: Arc<Mutex<Calls>> = Arc::default();
        let sink = seen.clone();
        let p = Metered::new(
            flaky(
                1,
                ProviderError::Throttled {
                    retry_after: Duration::ZERO,
                },
            ),
            Arc::new(move |_, op, err, _| {
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((op, err))
            }),
        );
        let _ = p.list_offers().await;
        let _ = p.list_offers().await;
        assert_eq!(
            *seen.lock().unwrap_or_else(|p| p.into_inner()),
            [("list_offers", Some("throttled")), ("list_offers", None)]
        );
    }
}
