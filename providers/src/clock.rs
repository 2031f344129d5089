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

/// Where an accelerated clock shared by several processes stands: at wall time `wall` it read
/// `sim`, and it runs `speed` times faster than the wall clock.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
struct Anchor {
    wall: DateTime<Utc>,
    sim: DateTime<Utc>,
    speed: f64,
}

impl ScaledClock {
    /// An accelerated clock anchored in the file at `path`: the first process to start writes
    /// the anchor (now, on both clocks); every later one, and every restart, reads it, so all
    /// of them tell the same simulated time, as the processes sharing one set of simulated
    /// clouds must. An anchor of another speed is refused.
    pub fn anchored(speed: f64, path: &std::path::Path) -> Result<Self, String> {
        let now = SystemClock.now();
        let mine = Anchor {
            wall: now,
            sim: now,
            speed,
        };
        let text = serde_json::to_string(&mine).map_err(|e| e.to_string())?;
        let anchor = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(mut f) => {
                use std::io::Write;
                f.write_all(text.as_bytes())
                    .and_then(|()| f.sync_all())
                    .map_err(|e| format!("clock anchor {}: {e}", path.display()))?;
                mine
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // Another process may be writing it this very moment.
                let mut tries = 0;
                loop {
                    let read = std::fs::read_to_string(path)
                        .map_err(|e| format!("clock anchor {}: {e}", path.display()))?;
                    match serde_json::from_str::<Anchor>(&read) {
                        Ok(a) => break a,
                        // Cut short: the writer is still at it.
                        Err(e) if e.is_eof() && tries < 50 => {
                            tries += 1;
                            std::thread::sleep(std::time::Duration::from_millis(20));
                        }
                        Err(e) => {
                            return Err(format!(
                                "clock anchor {} is not an anchor ({e}); move it away to start a new simulated time line",
                                path.display()
                            ));
                        }
                    }
                }
            }
            Err(e) => return Err(format!("clock anchor {}: {e}", path.display())),
        };
        if anchor.speed != speed {
            return Err(format!(
                "clock anchor {} runs at speed {}, not sim.speed = {speed}; every process sharing it must run at one speed",
                path.display(),
                anchor.speed
            ));
        }
        let since = (now - anchor.wall).num_microseconds().unwrap_or(0) as f64;
        Ok(ScaledClock {
            origin: anchor.sim + Duration::microseconds((since * speed) as i64),
            started: std::time::Instant::now(),
            speed,
        })
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
    fn processes_anchored_in_one_file_tell_one_time() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("clock.json");
        let first = ScaledClock::anchored(60.0, &path).expect("first");
        // A second process (or a restart): the same time line, not a new one from its start.
        let second = ScaledClock::anchored(60.0, &path).expect("second");
        let apart = (first.now() - second.now()).num_milliseconds().abs();
        assert!(apart < 1_000, "{apart} ms apart");
        // An anchor set 10 wall seconds ago: 600 simulated seconds on since.
        let sim = DateTime::<Utc>::UNIX_EPOCH;
        let anchor = Anchor {
            wall: SystemClock.now() - Duration::seconds(10),
            sim,
            speed: 60.0,
        };
        std::fs::write(&path, serde_json::to_string(&anchor).expect("json")).expect("write");
        let later = ScaledClock::anchored(60.0, &path).expect("later").now();
        let on = (later - sim).num_seconds();
        assert!((600..610).contains(&on), "{on} s after the anchor");
        let err = ScaledClock::anchored(5.0, &path).expect_err("another speed");
        assert!(err.contains("speed 60"), "{err}");
        std::fs::write(&path, "not json").expect("write");
        let err = ScaledClock::anchored(60.0, &path).expect_err("corrupt");
        assert!(
            err.contains("clock.json") && err.contains("not an anchor"),
            "{err}"
        );
    }

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let start = DateTime::<Utc>::UNIX_EPOCH;
        let c = ManualClock::new(start);
        assert_eq!(c.now(), start);
        c.advance(Duration::seconds(90));
        assert_eq!(c.now(), start + Duration::seconds(90));
    }
}
