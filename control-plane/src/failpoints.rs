//! Crash points: the process aborts at a named step that writes state, so that tests can show
//! a restart on the same database loses nothing (docs/reliability.md, "A crash at every step").
//!
//! Built only with the `failpoints` feature (the test script's builds turn it on; production
//! builds leave it off and [`crash_point!`](crate::crash_point) compiles to nothing). Armed by
//! the `FAILPOINTS` environment variable in the `fail` crate's syntax, `name=action;…`: any
//! action that evaluates (`return`, `1*return`, `50%return`) aborts the process there, after
//! one line on stderr naming the point. `print`, `sleep(ms)`, `off` act as the crate says.
//!
//! An abort, not an error or a panic: nothing unwinds, no destructor or `finally`-style cleanup
//! runs, open transactions are cut and the database connections drop, as when the machine or
//! the OOM killer takes the process.

/// Every crash point, in the order a job's life reaches them. A test arms each in turn.
pub const POINTS: &[&str] = &[
    "provision-after-node-row",
    "provision-after-cloud-call",
    "provision-before-booting",
    "admission",
    "checkpoint-report",
    "drain",
    "requeue",
    "ledger-write",
    "webhook-delivery",
    "consolidation",
    "release",
];

/// Arms the points named in `FAILPOINTS` (none when it is unset or empty).
#[cfg(feature = "failpoints")]
pub fn arm_from_env() -> anyhow::Result<()> {
    let Ok(spec) = std::env::var("FAILPOINTS") else {
        return Ok(());
    };
    for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, action) = part
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("FAILPOINTS: {part:?} is not name=action"))?;
        anyhow::ensure!(
            POINTS.contains(&name),
            "FAILPOINTS: no crash point {name:?}; the points are {}",
            POINTS.join(", ")
        );
        fail::cfg(name, action).map_err(|e| anyhow::anyhow!("FAILPOINTS: {name}: {e}"))?;
        tracing::warn!(point = name, action, "crash point armed");
    }
    Ok(())
}

/// Without the feature there is nothing to arm; a set `FAILPOINTS` is an error, so a test
/// run against a build without crash points cannot pass by never crashing.
#[cfg(not(feature = "failpoints"))]
pub fn arm_from_env() -> anyhow::Result<()> {
    match std::env::var("FAILPOINTS") {
        Ok(s) if !s.trim().is_empty() => anyhow::bail!(
            "FAILPOINTS is set, but this spotplane was built without the `failpoints` feature"
        ),
        _ => Ok(()),
    }
}

/// Aborts the process if the point `name` is armed.
#[cfg(feature = "failpoints")]
pub fn eval(name: &'static str) {
    debug_assert!(POINTS.contains(&name), "unlisted crash point {name}");
    fail::eval(name, |_| {
        eprintln!("crash point {name}: aborting the process");
        std::process::abort()
    });
}

/// A crash point: aborts the process here when the `failpoints` feature is built in and the
/// point is armed; nothing otherwise.
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        $crate::failpoints::eval($name);
    };
}
