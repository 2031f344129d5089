//! What happens after an attempt: a pure function of the attempt's outcome, the delivery's
//! history, the policy, `now` and a jitter draw.
//!
//! A failed attempt is retried after an exponentially growing delay — `retry_base`, twice
//! that, four times, ... at most `retry_max` — jittered by ±20 % so endpoints that failed
//! together are not retried together; a server's `Retry-After` (on 429 and 503) is honoured up
//! to `retry_max`. A delivery whose next attempt would fall more than `retry_for` after its
//! event is given up (`failed`). An endpoint that has failed every attempt for
//! `disable_after` is disabled.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// The retry policy, from `[webhooks]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub base: Duration,
    pub max: Duration,
    pub retry_for: Duration,
    pub disable_after: Duration,
}

/// How an attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The HTTP status, if an answer came.
    pub status: Option<u16>,
    /// What went wrong (`None`: delivered).
    pub error: Option<String>,
    pub latency: Duration,
    /// The server's `Retry-After`, if it sent one.
    pub retry_after: Option<Duration>,
}

impl Outcome {
    pub fn delivered(&self) -> bool {
        self.error.is_none()
    }
}

/// What to record after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Delivered,
    RetryAt(DateTime<Utc>),
    GiveUp,
}

/// The delay before retry number `attempts` (the first retry follows attempt 1).
pub fn delay(policy: &RetryPolicy, attempts: u32, jitter: f64) -> Duration {
    let exp = attempts.saturating_sub(1).min(30);
    let raw = policy
        .base
        .checked_mul(1u32 << exp)
        .unwrap_or(policy.max)
        .min(policy.max);
    // ±20 %: jitter is a draw in [0, 1).
    raw.mul_f64(0.8 + 0.4 * jitter.clamp(0.0, 1.0))
}

/// After attempt number `attempts` of a delivery of an event made at `event_at`.
pub fn next(
    policy: &RetryPolicy,
    outcome: &Outcome,
    attempts: u32,
    event_at: DateTime<Utc>,
    now: DateTime<Utc>,
    jitter: f64,
) -> Next {
    if outcome.delivered() {
        return Next::Delivered;
    }
    let mut wait = delay(policy, attempts, jitter);
    if let Some(ra) = outcome.retry_after {
        wait = wait.max(ra.min(policy.max));
    }
    let at = now + chrono::Duration::from_std(wait).unwrap_or_else(|_| chrono::Duration::hours(1));
    let limit = event_at
        + chrono::Duration::from_std(policy.retry_for)
            .unwrap_or_else(|_| chrono::Duration::days(1));
    if at > limit {
        Next::GiveUp
    } else {
        Next::RetryAt(at)
    }
}

/// Whether an endpoint failing since `failing_since` should now be disabled.
pub fn should_disable(
    policy: &RetryPolicy,
    failing_since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> bool {
    now - failing_since
        >= chrono::Duration::from_std(policy.disable_after)
            .unwrap_or_else(|_| chrono::Duration::days(1))
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            base: Duration::from_secs(5),
            max: Duration::from_secs(3600),
            retry_for: Duration::from_secs(24 * 3600),
            disable_after: Duration::from_secs(24 * 3600),
        }
    }

    fn failed(status: Option<u16>) -> Outcome {
        Outcome {
            status,
            error: Some("boom".into()),
            latency: Duration::ZERO,
            retry_after: None,
        }
    }

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 7, 1, 0, 0, 0)
            .single()
            .expect("t")
    }

    #[test]
    fn delays_double_up_to_the_cap_with_bounded_jitter() {
        let p = policy();
        let mid: Vec<u64> = (1..=12).map(|n| delay(&p, n, 0.5).as_secs()).collect();
        assert_eq!(
            mid,
            [5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, 3600]
        );
        for n in 1..20 {
            let lo = delay(&p, n, 0.0);
            let hi = delay(&p, n, 0.999_999);
            let base = delay(&p, n, 0.5);
            assert!(lo >= base.mul_f64(0.79) && hi <= base.mul_f64(1.21), "{n}");
        }
    }

    #[test]
    fn a_delivery_is_retried_for_a_bounded_period_then_given_up() {
        let p = policy();
        let mut now = t0();
        let mut attempts = 1;
        loop {
            match next(&p, &failed(Some(500)), attempts, t0(), now, 0.5) {
                Next::RetryAt(at) => {
                    assert!(at > now);
                    now = at;
                    attempts += 1;
                }
                Next::GiveUp => break,
                Next::Delivered => panic!("failed attempts are not delivered"),
            }
        }
        assert!(now - t0() <= chrono::Duration::hours(24));
        assert!(
            now - t0() >= chrono::Duration::hours(22),
            "retried most of the day: {now}"
        );
        assert!((20..40).contains(&attempts), "{attempts} attempts");
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap_and_success_is_delivered() {
        let p = policy();
        let mut o = failed(Some(429));
        o.retry_after = Some(Duration::from_secs(600));
        assert_eq!(
            next(&p, &o, 1, t0(), t0(), 0.5),
            Next::RetryAt(t0() + chrono::Duration::seconds(600))
        );
        o.retry_after = Some(Duration::from_secs(99_999));
        assert_eq!(
            next(&p, &o, 1, t0(), t0(), 0.5),
            Next::RetryAt(t0() + chrono::Duration::seconds(3600))
        );
        let ok = Outcome {
            status: Some(204),
            error: None,
            latency: Duration::from_millis(3),
            retry_after: None,
        };
        assert_eq!(next(&p, &ok, 7, t0(), t0(), 0.5), Next::Delivered);
    }

    #[test]
    fn an_endpoint_is_disabled_after_failing_for_the_whole_period() {
        let p = policy();
        assert!(!should_disable(
            &p,
            t0(),
            t0() + chrono::Duration::hours(23)
        ));
        assert!(should_disable(&p, t0(), t0() + chrono::Duration::hours(24)));
    }
}
