//! `spotplane demo`: the whole system on one machine, from the embedded default.
//!
//! SQLite and a local-folder object store under `--data-dir`, an admin token written next to
//! them (or taken from `SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN`), the API and the live page on
//! `--listen`, and a simulated world on an accelerated clock: the three simulated clouds
//! replaying a market (`sim.market`: the recorded traces of ../shared/data when they are
//! there, the market shipped in the binary otherwise; the demo prints which), nodes with
//! in-process agents (`simagent`), and a stream of Philly jobs for three teams (from the same
//! folder, or the subset shipped in `data/jobs/`), run by the control plane's own recovery, scheduling and capacity loops
//! (`replay::World`). `--hours H` runs a fixed stretch as fast as it can and prints a summary.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use spotplane_providers::clock::ManualClock;
use spotplane_providers::sim::SimMarket;

use crate::config::Config;
use crate::lab::cli::DemoArgs;
use crate::lab::replay::{JobStream, ReplaySpec, World};
use crate::metrics::Metrics;
use crate::planner::PlanPolicy;
use crate::server::{ServeOptions, Server, shutdown_signal};
use crate::store::{Store, generate_secret};

/// The admin token for the demo: the given one, the one kept from an earlier run, or a new one
/// (kept in `<data_dir>/admin-token`, readable by its owner only).
fn admin_token(data_dir: &Path, given: Option<String>) -> anyhow::Result<(String, PathBuf)> {
    let path = data_dir.join("admin-token");
    if let Some(t) = given {
        return Ok((t, path));
    }
    if let Ok(existing) = std::fs::read_to_string(&path) {
        let t = existing.trim().to_owned();
        if !t.is_empty() {
            return Ok((t, path));
        }
    }
    let t = generate_secret();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode_owner_only()
        .open(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(f, "{t}")?;
    Ok((t, path))
}

trait OwnerOnly {
    fn mode_owner_only(&mut self) -> &mut Self;
}

impl OwnerOnly for std::fs::OpenOptions {
    #[cfg(unix)]
    fn mode_owner_only(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
    #[cfg(not(unix))]
    fn mode_owner_only(&mut self) -> &mut Self {
        self
    }
}

pub async fn run(
    mut config: Config,
    args: DemoArgs,
    bootstrap: Option<String>,
) -> anyhow::Result<()> {
    if let Some(hours) = args.hours {
        return run_day(config, args, hours).await;
    }
    anyhow::ensure!(args.speed > 0.0, "--speed must be more than 0");
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&args.data_dir)?;
    config.server.listen = args.listen.clone();
    config.database.url = format!("sqlite://{}", data_dir.join("spotplane.sqlite").display());
    config.database.schema = None;
    config.object_store.url = format!("file://{}", data_dir.join("objects").display());
    std::fs::create_dir_all(data_dir.join("objects"))?;
    if config.secrets.key.is_none() {
        config.secrets.key_file = data_dir.join("secrets.key");
    }
    if let Err(errs) = config.validate().into_result() {
        anyhow::bail!("invalid demo configuration: {errs}");
    }
    let (token, token_path) = admin_token(&data_dir, bootstrap)?;
    // The world runs the loops on its own clock; the server answers on the same clock.
    let spec = world_spec(&config, &args, 7.0)?;
    let clock_file = data_dir.join("demo-clock");
    let resume_at = std::fs::read_to_string(&clock_file)
        .ok()
        .and_then(|t| t.trim().parse::<chrono::DateTime<chrono::Utc>>().ok());
    let clock = ManualClock::new(spec.start);
    let mut serving = config.clone();
    // The world runs recovery, scheduling and capacity itself, on its clock.
    serving.scheduler.enabled = false;
    serving.recovery.enabled = false;
    serving.capacity.enabled = false;
    serving.providers.clear();
    // The world samples the fleet for the charts on its own clock (see `run_world`).
    serving.telemetry.history_interval = std::time::Duration::ZERO;
    let server = Server::start(
        &serving,
        std::sync::Arc::new(clock.clone()),
        ServeOptions {
            bootstrap_admin_token: Some(token.clone()),
        },
    )
    .await?;
    // Listen for Ctrl-C and SIGTERM from now on (setting the world up takes a moment).
    let cancel = server.cancellation();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.cancel();
    });
    let url = server.url();
    println!("spotplane demo is running");
    println!("  live page    {url}/#token={token}");
    println!("  API          {url}   (OpenAPI: {url}/v1/openapi.json)");
    println!("  admin token  {token}");
    println!("               (kept in {})", token_path.display());
    println!(
        "  database     {}",
        data_dir.join("spotplane.sqlite").display()
    );
    println!("  objects      {}", data_dir.join("objects").display());
    println!(
        "  world        three simulated clouds, Philly jobs for three teams, at {}×",
        args.speed
    );
    println!("  market       {}", spec.market.describe());
    println!("  job stream   {}", spec.trace.describe());
    println!();
    println!("  try:  curl -s -H \"Authorization: Bearer {token}\" {url}/v1/teams");
    println!("  stop: Ctrl-C");
    std::io::stdout().flush().ok();
    let mut world = World::new(
        server.state.store().clone(),
        clock.clone(),
        &config,
        &spec,
        PlanPolicy::ExpectedCost,
        &data_dir.join("objects"),
    )
    .await?
    .with_mixed_shapes()
    .with_metrics(server.state.metrics().clone());
    if let Some(t) = resume_at {
        world.resume_at(t);
    }
    tokio::spawn(run_world(
        world,
        server.state.clone(),
        spec.step,
        args.speed,
        clock_file,
        cancel,
    ));
    server.wait().await
}

/// The summary `spotplane demo --hours` prints.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DaySummary {
    pub hours: f64,
    /// The market the simulated clouds replayed (`recorded: ...` or `shipped: ...`).
    pub market: String,
    /// Where the jobs came from.
    pub job_stream: String,
    pub jobs_submitted: usize,
    pub jobs_finished: usize,
    pub preemptions: u64,
    pub recoveries: u64,
    pub lost_gpu_hours: f64,
    /// GPU-hours replicas ran.
    pub gpu_hours: f64,
    /// GPU-hours of the nodes held (what was paid for).
    pub node_gpu_hours: f64,
    pub cost_usd: f64,
    pub ondemand_equivalent_usd: f64,
    pub saving_pct: f64,
    pub lost_work_pct: f64,
    pub notice_to_durable_s: crate::lab::replay::Percentiles,
    pub notice_to_resumed_s: crate::lab::replay::Percentiles,
    pub wall_seconds: f64,
}

fn world_spec(config: &Config, args: &DemoArgs, days: f64) -> anyhow::Result<ReplaySpec> {
    let market = config.sim.market()?;
    let trace = match (&args.workload, &market) {
        (Some(p), _) => JobStream::File(p.clone()),
        (None, SimMarket::Recorded(dir)) => {
            JobStream::File(dir.join("gpu-trace/philly-gavel/0e4a51.trace"))
        }
        (None, SimMarket::Shipped) => JobStream::Shipped,
    };
    if let JobStream::File(p) = &trace {
        anyhow::ensure!(
            p.exists(),
            "the job stream {} is missing (pass --workload, or point sim.data_dir at the shared \
             data, or set sim.market = \"shipped\" to use the job stream shipped with spotplane)",
            p.display()
        );
    }
    Ok(ReplaySpec {
        trace,
        days,
        start: "2026-07-01T00:00:00Z".parse()?,
        step: chrono::Duration::from_std(args.step)?,
        market,
        max_jobs: 400,
        seconds_per_step: 0.1,
        consolidation: true,
        baseline_hears_notices: false,
    })
}

/// `spotplane demo --hours H`: a fixed simulated stretch on a fresh database, then a summary.
async fn run_day(config: Config, args: DemoArgs, hours: f64) -> anyhow::Result<()> {
    anyhow::ensure!(
        hours > 0.0 && hours <= 24.0 * 30.0,
        "--hours must be more than 0 and at most 720"
    );
    let wall = std::time::Instant::now();
    let dir = args.data_dir.join("day");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = std::fs::canonicalize(&dir)?;
    let mut config = config;
    config.database.url = format!("sqlite://{}", dir.join("spotplane.sqlite").display());
    config.database.schema = None;
    let spec = world_spec(&config, &args, hours / 24.0)?;
    tracing::info!(market = %spec.market.describe(), jobs = %spec.trace.describe(), "demo world");
    let store = Store::connect(&config.database, Metrics::new()).await?;
    store.migrate().await?;
    let clock = ManualClock::new(spec.start);
    let mut world = World::new(
        store,
        clock,
        &config,
        &spec,
        PlanPolicy::ExpectedCost,
        &dir.join("objects"),
    )
    .await?
    .with_mixed_shapes();
    while !world.done() {
        world.step().await?;
    }
    let o = world.outcome("spotplane", wall).await?;
    let s = DaySummary {
        hours,
        market: spec.market.describe(),
        job_stream: spec.trace.describe(),
        jobs_submitted: o.jobs_submitted,
        jobs_finished: o.jobs_finished,
        preemptions: o.preemptions,
        recoveries: o.recoveries,
        lost_gpu_hours: o.lost_gpu_hours,
        gpu_hours: o.run_gpu_hours,
        node_gpu_hours: o.gpu_hours,
        cost_usd: o.total_cost_usd,
        ondemand_equivalent_usd: o.ondemand_equivalent_usd,
        saving_pct: o.saving_pct,
        lost_work_pct: o.lost_work_pct,
        notice_to_durable_s: o.notice_to_durable_s,
        notice_to_resumed_s: o.notice_to_resumed_s,
        wall_seconds: wall.elapsed().as_secs_f64(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!(
            "spotplane demo: {hours} simulated hours on three simulated clouds ({:.0} s)",
            s.wall_seconds
        );
        println!("  market        {}", s.market);
        println!("  job stream    {}", s.job_stream);
        println!(
            "  jobs          {} submitted, {} finished",
            s.jobs_submitted, s.jobs_finished
        );
        println!(
            "  preemptions   {} ({} recovered)",
            s.preemptions, s.recoveries
        );
        println!(
            "  notice        durable after {:.0} s (median; p99 {:.0} s), running again after {:.0} s (median; p99 {:.0} s)",
            s.notice_to_durable_s.p50,
            s.notice_to_durable_s.p99,
            s.notice_to_resumed_s.p50,
            s.notice_to_resumed_s.p99
        );
        println!(
            "  work          {:.1} GPU-hours run, {:.2} lost ({:.2}%)",
            s.gpu_hours, s.lost_gpu_hours, s.lost_work_pct
        );
        println!(
            "  cost          ${:.2} vs ${:.2} on-demand: {:.1}% saved",
            s.cost_usd, s.ondemand_equivalent_usd, s.saving_pct
        );
        println!("  database      {}", dir.join("spotplane.sqlite").display());
    }
    Ok(())
}

/// How often the live demo samples the fleet for the page's charts, in simulated time.
const SAMPLE_EVERY: chrono::Duration = chrono::Duration::minutes(5);

/// The live demo's world: stepped at `speed` simulated seconds per real second (or as fast as
/// the machine allows), its simulated time kept in `<data_dir>/demo-clock` so a restart goes on
/// from there.
async fn run_world(
    mut world: World,
    state: crate::api::AppState,
    step: chrono::Duration,
    speed: f64,
    clock_file: PathBuf,
    cancel: tokio_util::sync::CancellationToken,
) {
    let started = tokio::time::Instant::now();
    let mut steps: u64 = 0;
    let mut sampled: Option<chrono::DateTime<chrono::Utc>> = None;
    let per_step = std::time::Duration::from_secs_f64(
        (step.num_milliseconds() as f64 / 1000.0 / speed.max(1e-3)).max(0.0),
    );
    while !world.done() && !cancel.is_cancelled() {
        if let Err(e) = world.step().await {
            tracing::warn!(error = %e, "demo step failed; going on");
        }
        steps += 1;
        // The live page's charts: a sample every 5 simulated minutes.
        if sampled.is_none_or(|t| world.now() - t >= SAMPLE_EVERY) {
            sampled = Some(world.now());
            if let Err(e) = state.sample_history().await {
                tracing::warn!(error = %e, "the demo's sample of the fleet failed; going on");
            }
        }
        if steps.is_multiple_of(20) {
            let _ = std::fs::write(&clock_file, world.now().to_rfc3339());
        }
        let due = started + per_step * u32::try_from(steps).unwrap_or(u32::MAX);
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep_until(due) => {}
        }
    }
    let _ = std::fs::write(&clock_file, world.now().to_rfc3339());
    if world.done() {
        tracing::info!("the demo's simulated week is over; the API stays up");
    }
}
