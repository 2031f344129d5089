//! How often a team may ping its endpoints: a token bucket per team.
//!
//! A ping is sent while the caller waits, so without a limit any team could keep the server
//! sending (and waiting on) requests as fast as it can ask. Each team's bucket holds
//! `webhooks.pings_per_minute` pings and refills at that rate; a ping finding it empty is
//! refused with the time until the next token. Buckets live in memory: a restart refills
//! them, and each replica limits on its own. The time is passed in, so the arithmetic is
//! tested without waiting.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// With this many buckets, the full ones (the same as none) are dropped.
const PRUNE_AT: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Per-team token buckets.
#[derive(Debug)]
pub struct PingLimiter {
    /// Tokens a bucket holds, and regains a minute.
    capacity: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl PingLimiter {
    /// `per_minute` pings a minute, all of them at once if saved up (at least one).
    pub fn new(per_minute: u32) -> Self {
        let capacity = f64::from(per_minute.max(1));
        PingLimiter {
            capacity,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a token from `team`'s bucket at `now`; `Err(wait)` when it is empty, `wait`
    /// being how long until it holds one again.
    pub fn take(&self, team: &str, now: Instant) -> Result<(), Duration> {
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() >= PRUNE_AT {
            buckets.retain(|_, b| self.level(b, now) < self.capacity);
        }
        let b = buckets.entry(team.to_owned()).or_insert(Bucket {
            tokens: self.capacity,
            at: now,
        });
        let tokens = self.level(b, now);
        if tokens >= 1.0 {
            *b = Bucket {
                tokens: tokens - 1.0,
                at: now,
            };
            Ok(())
        } else {
            *b = Bucket { tokens, at: now };
            Err(Duration::from_secs_f64(
                (1.0 - tokens) * 60.0 / self.capacity,
            ))
        }
    }

    /// What a bucket holds at `now` (an earlier `now` than its own counts as no time).
    fn level(&self, b: &Bucket, now: Instant) -> f64 {
        let gained = now.saturating_duration_since(b.at).as_secs_f64() * self.capacity / 60.0;
        (b.tokens + gained).min(self.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_team_gets_its_burst_then_one_ping_per_interval_and_other_teams_are_untouched() {
        let limiter = PingLimiter::new(5);
        let t0 = Instant::now();
        for i in 0..5 {
            assert_eq!(limiter.take("ml", t0), Ok(()), "ping {i} of the burst");
        }
        // Empty: the next token is 12 s away (5 a minute).
        let wait = limiter.take("ml", t0).expect_err("over the limit");
        assert_eq!(wait, Duration::from_secs(12));
        // Another team has its own bucket.
        assert_eq!(limiter.take("vision", t0), Ok(()));
        // Part of the way, the wait shrinks; refused pings take nothing.
        let wait = limiter
            .take("ml", t0 + Duration::from_secs(9))
            .expect_err("still empty");
        assert_eq!(wait, Duration::from_secs(3));
        assert_eq!(limiter.take("ml", t0 + Duration::from_secs(12)), Ok(()));
        assert!(limiter.take("ml", t0 + Duration::from_secs(12)).is_err());
        // A long pause refills the bucket to its capacity, no further.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..5 {
            assert_eq!(limiter.take("ml", later), Ok(()));
        }
        assert!(limiter.take("ml", later).is_err());
    }

    #[test]
    fn full_buckets_are_pruned_when_there_are_many() {
        let limiter = PingLimiter::new(1);
        let t0 = Instant::now();
        for i in 0..PRUNE_AT {
            assert_eq!(limiter.take(&format!("team-{i}"), t0), Ok(()));
        }
        // A minute on, every bucket is full again; the next take prunes them all.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(limiter.take("another", later), Ok(()));
        let buckets = limiter.buckets.lock().expect("lock");
        assert_eq!(buckets.len(), 1);
        // Still limited after pruning.
        drop(buckets);
        assert!(limiter.take("another", later).is_err());
    }
}
