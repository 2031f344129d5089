//! Time, injected.
//!
//! Everything in the control plane that needs the time asks a [`Clock`]. Production uses the
//! system clock; the simulator and tests use a [`ManualClock`] they move themselves, so a month
//! of spot prices replays in seconds and timing tests never sleep.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, SubsecRound, Utc};

pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> DateTime<Utc>;
}

/// The system's wall clock, to the microsecond: the precision PostgreSQL stores, so a value
/// read back equals the value written.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now().trunc_subsecs(6)
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            now: Arc::new(Mutex::new(start)),
        }
    }

    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        *now += by;
    }

    pub fn set(&self, to: DateTime<Utc>) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        *now = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The system clock sped up: from the moment it is made, `speed` simulated seconds pass per
/// real second (for running the simulated clouds faster than life).
#[derive(Debug, Clone)]
pub struct ScaledClock {
    origin: DateTime<Utc>,
    started: std::time::Instant,
    speed: f64,
}

impl ScaledClock {
    pub fn new(speed: f64) -> Self {
        ScaledClock {
            origin: SystemClock.now(),
            started: std::time::Instant::now(),
            speed,
        }
    }
}

impl Clock for ScaledClock {
    fn now(&self) -> DateTime<Utc> {
        let real = self.started.elapsed().as_secs_f64();
        let sim = Duration::microseconds((real * self.speed * 1e6) as i64);
        (self.origin + sim).trunc_subsecs(6)
    }
}

pub type SharedClock = Arc<dyn Clock>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let start = DateTime::<Utc>::UNIX_EPOCH;
        let c = ManualClock::new(start);
        assert_eq!(c.now(), start);
        c.advance(Duration::seconds(90));
        assert_eq!(c.now(), start + Duration::seconds(90));
    }
}
