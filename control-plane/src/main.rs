//! The `spotplane` binary: server, migrations, demo, and a client of the API.

use std::io::Read;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use reqwest::Method;
use serde_json::Value;
use sha2::{Digest, Sha256};
use spotplane::cli::{
    BenchCommand, CatalogCommand, Cli, ClientArgs, Command, DeadlineArgs, ExportArgs,
    FinanceBenchArgs, HealthcheckArgs, JobCommand, OffersArgs, PackArgs, SimBenchArgs,
};
use spotplane::client::Client;
use spotplane::clock::SystemClock;
use spotplane::config::{Config, ConfigError};
use spotplane::metrics::Metrics;
use spotplane::offers::{self, OfferFilter};
use spotplane::scheduler::openb;
use spotplane::server::{ServeOptions, Server, shutdown_signal};
use spotplane::store::Store;
use spotplane::{bench, deadline, demo, telemetry};
use spotplane_core::Market;
use spotplane_providers::catalog;
use spotplane_providers::clock::ManualClock;
use spotplane_providers::registry::{self, BuildContext};
use spotplane_providers::sim::replay::{self, ReplaySpec};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli));
    // Dropping the runtime would wait for every blocking task (a scheduling cycle on a large
    // queue, a file upload) however long it takes; `serve` has already drained its requests.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<ConfigError>() {
                Some(ConfigError::Invalid(errs)) => {
                    eprintln!("error: invalid configuration:");
                    for fe in errs.iter() {
                        eprintln!("  {}: {}", fe.field, fe.message);
                    }
                }
                _ => eprintln!("error: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// `spotplane healthcheck`: GET the liveness URL; an error names the URL and what went wrong.
async fn healthcheck(args: &HealthcheckArgs) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .timeout(args.timeout)
        .build()
        .context("cannot build the HTTP client")?;
    let response = http
        .get(&args.url)
        .send()
        .await
        .with_context(|| format!("{} does not answer", args.url))?;
    let status = response.status();
    anyhow::ensure!(status.is_success(), "{} answered {status}", args.url);
    println!("{}: {status}", args.url);
    Ok(())
}

fn bootstrap_token() -> Option<String> {
    std::env::var("SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve => {
            let config = Config::load(cli.config.as_deref())?;
            telemetry::init(&config.log);
            let clock: spotplane::clock::SharedClock = if config.sim.speed > 1.0 {
                tracing::warn!(
                    speed = config.sim.speed,
                    "running on an accelerated clock (sim.speed)"
                );
                Arc::new(spotplane::clock::ScaledClock::new(config.sim.speed))
            } else {
                Arc::new(SystemClock)
            };
            let server = Server::start(
                &config,
                clock,
                ServeOptions {
                    bootstrap_admin_token: bootstrap_token(),
                },
            )
            .await?;
            let cancel = server.cancellation();
            tokio::spawn(async move {
                shutdown_signal().await;
                cancel.cancel();
            });
            server.wait().await
        }
        Command::Migrate => {
            let config = Config::load(cli.config.as_deref())?;
            telemetry::init(&config.log);
            let store = Store::connect(&config.database, Metrics::new()).await?;
            let pending = store.pending_migrations().await?;
            store.migrate().await?;
            if pending.is_empty() {
                println!("the schema is current");
            } else {
                for m in pending {
                    println!("applied {m}");
                }
            }
            Ok(())
        }
        Command::Demo(args) => {
            let config = Config::load(cli.config.as_deref())?;
            let mut log = config.log.clone();
            // A fixed run prints a summary: only warnings on the way, unless asked otherwise.
            if args.hours.is_some() && std::env::var_os("SPOTPLANE_LOG__LEVEL").is_none() {
                log.level = "warn".into();
            }
            telemetry::init(&log);
            demo::run(config, args, bootstrap_token()).await
        }
        Command::Config => {
            let config = Config::load(cli.config.as_deref())?;
            print!("{}", toml_of(&config)?);
            Ok(())
        }
        Command::Job(cmd) => job(cmd).await,
        Command::Bench(BenchCommand::Submit {
            client,
            concurrency,
            duration,
            warmup,
            json,
        }) => {
            let admin = client_of(&client)?;
            let report = bench::submit(&admin, concurrency, warmup, duration).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "{} submissions in {:.1} s with {} in flight: {:.0}/s, p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {} errors",
                    report.submitted,
                    report.seconds,
                    report.concurrency,
                    report.per_second,
                    report.p50_ms,
                    report.p90_ms,
                    report.p99_ms,
                    report.max_ms,
                    report.errors
                );
            }
            Ok(())
        }
        Command::Bench(BenchCommand::Cycle(args)) => {
            let config = Config::load(cli.config.as_deref())?;
            telemetry::init(&config.log);
            let r = bench::cycle(
                &config,
                &args.out,
                args.database.as_deref(),
                args.queued,
                args.cycles,
            )
            .await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "{} queued on {}: first cycle {:.0} ms, then {:.0} ms; capacity round {:.0} ms",
                    r.queued, r.database, r.first_cycle_ms, r.cycle_ms, r.capacity_ms
                );
                for c in r.store_calls.iter().take(12) {
                    println!(
                        "  {:<28} {:>6} calls  {:>9.1} ms each  {:>9.0} ms in all",
                        c.op, c.calls, c.mean_ms, c.total_ms
                    );
                }
            }
            Ok(())
        }
        Command::Bench(BenchCommand::Pack(args)) => bench_pack(&args),
        Command::Bench(BenchCommand::Deadline(args)) => bench_deadline(&args),
        Command::Bench(BenchCommand::Finance(args)) => {
            let config = Config::load(cli.config.as_deref())?;
            bench_finance(&config, &args).await
        }
        Command::Export(args) => export(&args).await,
        Command::Healthcheck(args) => healthcheck(&args).await,
        Command::Bench(BenchCommand::Sim(args)) => {
            let config = Config::load(cli.config.as_deref())?;
            bench_sim(&config, &args).await
        }
        Command::Replay(args) => {
            let config = Config::load(cli.config.as_deref())?;
            replay_cmd(&config, &args).await
        }
        Command::Offers(args) => {
            let config = Config::load(cli.config.as_deref())?;
            offers(&config, &args).await
        }
        Command::Catalog(CatalogCommand::Build { data, out }) => {
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            for (cloud, rows) in catalog::build_from_data(&data)? {
                let path = out.join(catalog::file_name(cloud));
                std::fs::write(&path, catalog::to_csv(&rows))
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("{}: {} rows", path.display(), rows.len());
            }
            Ok(())
        }
    }
}

/// `spotplane replay`: each policy on the same workload and traces, one after the other.
async fn replay_cmd(config: &Config, args: &spotplane::cli::ReplayArgs) -> anyhow::Result<()> {
    use spotplane::replay::{self, POLICIES, ReplaySpec};
    let policies: Vec<&str> = if args.policy == "all" {
        POLICIES.to_vec()
    } else {
        anyhow::ensure!(
            replay::policy_by_name(&args.policy).is_some(),
            "--policy: {:?} is not one of {POLICIES:?} or all",
            args.policy
        );
        vec![args.policy.as_str()]
    };
    anyhow::ensure!(args.days > 0.0, "--days must be more than 0");
    let spec = ReplaySpec {
        trace: replay::JobStream::File(args.workload.clone()),
        days: args.days,
        start: args.start,
        step: chrono::Duration::from_std(args.step)?,
        market: config.sim.market()?,
        max_jobs: args.max_jobs,
        seconds_per_step: args.seconds_per_step,
        consolidation: !args.no_consolidation,
        baseline_hears_notices: args.baseline_hears_notices,
    };
    anyhow::ensure!(
        args.seconds_per_step > 0.0,
        "--seconds-per-step must be more than 0"
    );
    for p in policies {
        let o = replay::replay(&spec, p).await?;
        if args.json {
            println!("{}", serde_json::to_string(&o)?);
        } else {
            println!(
                "{:<24} cost ${:>10.2}  on-demand equivalent ${:>10.2}  saved {:>5.1}%  ${:.4} per GPU-h kept  jobs {}/{}  deadline misses {}  lost {:.2} GPU-h of {:.1} run ({:.2}%)  queue {:.0} s  preemptions {} (recovered {})  notice->durable p50 {:.0} s p99 {:.0} s  notice->resumed p50 {:.0} s p99 {:.0} s  nodes {} ({} on-demand, {} consolidated)  ({:.1} s)",
                o.policy,
                o.total_cost_usd,
                o.ondemand_equivalent_usd,
                o.saving_pct,
                o.usd_per_useful_gpu_hour,
                o.jobs_finished,
                o.jobs_submitted,
                o.deadline_misses,
                o.lost_gpu_hours,
                o.run_gpu_hours,
                o.lost_work_pct,
                o.mean_queue_delay_s,
                o.preemptions,
                o.recoveries,
                o.notice_to_durable_s.p50,
                o.notice_to_durable_s.p99,
                o.notice_to_resumed_s.p50,
                o.notice_to_resumed_s.p99,
                o.nodes_bought,
                o.on_demand_nodes,
                o.consolidations,
                o.wall_seconds
            );
        }
    }
    Ok(())
}

/// `spotplane bench sim`: the configured simulated clouds on a manual clock.
async fn bench_sim(config: &Config, args: &SimBenchArgs) -> anyhow::Result<()> {
    let clock = ManualClock::new(args.start);
    let sims: Vec<_> = config
        .providers
        .iter()
        .filter(|p| p.kind() == "sim")
        .cloned()
        .collect();
    anyhow::ensure!(!sims.is_empty(), "no simulated clouds are configured");
    let providers = registry::build(
        &sims,
        &BuildContext {
            clock: Arc::new(clock.clone()),
            sim_market: config.sim.market()?,
            catalog_dir: config.catalog.dir.clone(),
            observer: None,
        },
    )
    .await?;
    let chrono_of =
        |d: std::time::Duration| chrono::Duration::from_std(d).context("a duration out of range");
    let spec = ReplaySpec {
        start: args.start,
        span: chrono_of(args.span)?,
        step: chrono_of(args.step)?,
        price_refresh: chrono_of(args.price_refresh)?,
        fleet: args.fleet,
        spread: args.spread,
    };
    anyhow::ensure!(
        spec.step > chrono::Duration::zero(),
        "--step must be positive"
    );
    let report = replay::replay(&providers.sims, &clock, &spec).await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let list = |m: Vec<(String, u64)>| {
            if m.is_empty() {
                "none".to_owned()
            } else {
                m.iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        println!(
            "replayed {:.0} h of traces in {} steps on {} simulated clouds: {:.3} s wall",
            report.simulated_hours,
            report.steps,
            providers.sims.len(),
            report.wall_seconds
        );
        println!(
            "fleet of {} spot nodes: {} bought, {} notices; AWS event stream: {}; refused: {}",
            args.fleet,
            report.provisioned,
            report.notices,
            list(report.stream_events.clone().into_iter().collect()),
            list(
                report
                    .refused
                    .iter()
                    .map(|(k, n)| ((*k).to_owned(), *n))
                    .collect()
            ),
        );
        println!(
            "{:.0} node-hours: spot {} vs on-demand {} ({:.0}% saved); short of the fleet in {} steps; {} offer polls ({} spot offers)",
            report.node_hours,
            report.spot_cost,
            report.on_demand_cost,
            100.0 * (1.0 - report.spot_cost.0 as f64 / report.on_demand_cost.0.max(1) as f64),
            report.short_steps,
            report.offer_polls,
            report.offers_last_poll,
        );
    }
    Ok(())
}

/// `spotplane export`: the ledger as CSV or FOCUS, from a running server.
async fn export(args: &ExportArgs) -> anyhow::Result<()> {
    let c = client_of(&args.client)?;
    let mut query = vec![format!("format={}", args.format)];
    let stamp = |t: &chrono::DateTime<chrono::Utc>| {
        t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
            .replace('+', "%2B")
    };
    if let Some(f) = &args.from {
        query.push(format!("from={}", stamp(f)));
    }
    if let Some(t) = &args.to {
        query.push(format!("to={}", stamp(t)));
    }
    let text = c
        .get_text(&format!("/v1/finance/export.csv?{}", query.join("&")))
        .await?;
    match &args.out {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// `spotplane bench finance`: a replayed week in a fresh SQLite ledger, checked and written out.
async fn bench_finance(config: &Config, args: &FinanceBenchArgs) -> anyhow::Result<()> {
    use spotplane::finance::week::{WeekSpec, run_week};
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let db = args.out.join("week.sqlite");
    for suffix in ["", "-wal", "-shm"] {
        let p = std::path::PathBuf::from(format!("{}{suffix}", db.display()));
        if p.exists() {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    let mut database = config.database.clone();
    database.url = format!("sqlite://{}", db.display());
    database.schema = None;
    let store = Store::connect(&database, Metrics::new()).await?;
    store.migrate().await?;
    let clock = ManualClock::new(args.start);
    let sims: Vec<_> = config
        .providers
        .iter()
        .filter(|p| p.kind() == "sim")
        .cloned()
        .collect();
    anyhow::ensure!(!sims.is_empty(), "no simulated clouds are configured");
    let providers = registry::build(
        &sims,
        &BuildContext {
            clock: Arc::new(clock.clone()),
            sim_market: config.sim.market()?,
            catalog_dir: config.catalog.dir.clone(),
            observer: None,
        },
    )
    .await?;
    let spec = WeekSpec {
        start: args.start,
        span: chrono::Duration::from_std(args.span).context("--span out of range")?,
        max_nodes: args.max_nodes,
        jobs_per_hour: args.jobs_per_hour,
        seed: args.seed,
    };
    let r = run_week(&store, &providers, &clock, &spec, Some(&args.out)).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "replayed {:.0} h on {} simulated clouds in {:.1} s: {} nodes ({} spot, {} taken by the cloud), {} jobs ({} done), {} runs checkpointed and {} lost",
            r.simulated_hours,
            providers.sims.len(),
            r.wall_seconds,
            r.nodes,
            r.spot_nodes,
            r.preempted_nodes,
            r.jobs,
            r.jobs_succeeded,
            r.checkpointed_runs,
            r.lost_runs
        );
        println!(
            "ledger {} = clouds' bills {}; on demand {} (bills {}); saving {}; idle {}; lost work {}",
            r.ledger_total,
            r.cloud_bills_total,
            r.ledger_on_demand,
            r.cloud_bills_on_demand,
            r.saving,
            r.idle,
            r.lost_work
        );
        let teams: Vec<String> = r.by_team.iter().map(|(t, c)| format!("{t} {c}")).collect();
        println!(
            "teams: {}; teams + idle = {}; FOCUS ListCost - EffectiveCost = {} over {} rows",
            teams.join(", "),
            r.by_team.values().copied().sum::<spotplane_core::Micros>() + r.idle,
            r.focus_saving,
            r.focus_rows
        );
        println!(
            "{} ({} ledger lines; files in {})",
            if r.balanced {
                "balanced"
            } else {
                "NOT BALANCED"
            },
            r.ledger_lines,
            args.out.display()
        );
    }
    anyhow::ensure!(
        r.balanced,
        "the ledger does not balance against the clouds' bills"
    );
    Ok(())
}

/// `spotplane offers`: asks the configured providers directly; no server needed.
async fn offers(config: &Config, args: &OffersArgs) -> anyhow::Result<()> {
    let filter = OfferFilter {
        gpu: args.gpu.as_deref().map(str::parse).transpose()?,
        market: match args.market.as_deref() {
            Some("spot") => Some(Market::Spot),
            Some("on-demand") => Some(Market::OnDemand),
            _ => None,
        },
        min_gpus: args.min_gpus,
        per_gpu: args.per_gpu,
    };
    let providers = registry::build(
        &config.providers,
        &BuildContext {
            clock: Arc::new(SystemClock),
            sim_market: config.sim.market()?,
            catalog_dir: config.catalog.dir.clone(),
            observer: None,
        },
    )
    .await?;
    let gathered = offers::gather(&providers).await;
    for (cloud, err) in &gathered.failures {
        eprintln!("warning: {cloud}: {err}");
    }
    let mut ranked = offers::select(gathered.offers, &filter);
    let total = ranked.len();
    if args.limit > 0 {
        ranked.truncate(args.limit);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&ranked)?);
    } else {
        print!("{}", offers::table(&ranked));
        if total > ranked.len() {
            eprintln!("({} of {total} offers; --limit 0 shows all)", ranked.len());
        }
    }
    if total == 0 && !gathered.failures.is_empty() {
        anyhow::bail!("no provider answered");
    }
    Ok(())
}

/// `spotplane bench pack`: runs synchronously (pure computation) and streams results.
fn bench_pack(args: &PackArgs) -> anyhow::Result<()> {
    let spec = openb::load(
        &args.nodes,
        &args.pods,
        &args.policy,
        &args.seed.0,
        args.inflate,
    )?;
    let mut results = Vec::new();
    openb::run(&spec, |e| {
        if args.json {
            match serde_json::to_string(&e) {
                Ok(line) => println!("{line}"),
                Err(err) => eprintln!("error: {err}"),
            }
        } else {
            print!("{}", openb::format_experiment(&e));
        }
        results.push(e);
    })?;
    if !args.json && results.len() > 1 {
        print!(
            "\nGPU allocation ratio (%) at 130% arrived\n{}",
            openb::format_summary(&results)
        );
    }
    Ok(())
}

/// One line of `spotplane bench deadline --json`: the policy's report, then the inputs.
#[derive(serde::Serialize)]
struct DeadlineLine<'a> {
    #[serde(flatten)]
    report: &'a deadline::Report,
    trace: String,
    work_hours: f64,
    deadline_hours: f64,
    restart_hours: f64,
    spot_price: Value,
    ondemand_price: f64,
    elapsed_ms: f64,
}

/// `spotplane bench deadline`: loads the trace, runs each policy on it (pure computation),
/// and times each run here, around the core.
fn bench_deadline(args: &DeadlineArgs) -> anyhow::Result<()> {
    let names = deadline::PolicyName::parse_list(&args.policy).map_err(anyhow::Error::msg)?;
    let trace = deadline::trace::load(&args.trace)?;
    let params = deadline::Params {
        work_hours: args.work_hours,
        deadline_hours: args.deadline_hours,
        restart_hours: args.restart_hours,
        spot_price: args.spot_price,
        on_demand_price: args.ondemand_price,
    };
    let model = deadline::Model::new(&trace, &params)
        .with_context(|| format!("{}", args.trace.display()))?;
    let spot_price = match args.spot_price {
        deadline::SpotPrice::Fixed(s) => serde_json::json!(s),
        deadline::SpotPrice::Trace => serde_json::json!("trace"),
    };
    if !args.json {
        println!(
            "{}: {} ticks of {} s ({:.1} h); in ticks: work {}, deadline {}, restart {} \
             (work and restart rounded up, deadline down){}",
            args.trace.display(),
            trace.available.len(),
            trace.gap_seconds,
            trace.hours(),
            model.work,
            model.deadline,
            model.restart,
            if model.feasible() {
                ""
            } else {
                "; infeasible: on-demand from the start misses the deadline"
            }
        );
    }
    let mut reports = Vec::new();
    let mut times = Vec::new();
    for name in names {
        let started = std::time::Instant::now();
        let outcome = deadline::run(&model, name);
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        let report = deadline::Report::new(&model, name, &outcome);
        if args.json {
            let line = DeadlineLine {
                report: &report,
                trace: args.trace.display().to_string(),
                work_hours: args.work_hours,
                deadline_hours: args.deadline_hours,
                restart_hours: args.restart_hours,
                spot_price: spot_price.clone(),
                ondemand_price: args.ondemand_price,
                elapsed_ms,
            };
            println!("{}", serde_json::to_string(&line)?);
        }
        reports.push(report);
        times.push(elapsed_ms);
    }
    if !args.json {
        print!("{}", deadline::format_table(&reports));
        let times: Vec<String> = reports
            .iter()
            .zip(&times)
            .map(|(r, ms)| format!("{} {ms:.1} ms", r.policy))
            .collect();
        println!("time: {}", times.join(", "));
    }
    Ok(())
}

fn toml_of(config: &Config) -> anyhow::Result<String> {
    // figment reads TOML; for printing, JSON-as-TOML is not worth a dependency: print JSON.
    Ok(serde_json::to_string_pretty(config)? + "\n")
}

fn client_of(args: &ClientArgs) -> anyhow::Result<Client> {
    let token = args
        .token
        .clone()
        .context("no token: set SPOTPLANE_TOKEN or pass --token")?;
    Ok(Client::new(&args.url, Some(token))?)
}

/// Reads a job file: JSON or YAML, by extension, else JSON first and YAML second.
fn read_job_file(path: &std::path::Path) -> anyhow::Result<(Value, Vec<u8>)> {
    let mut raw = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut raw)?;
    } else {
        raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    }
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let value: Value = match ext.as_str() {
        "json" => serde_json::from_slice(&raw)
            .with_context(|| format!("{} is not valid JSON", path.display()))?,
        "yaml" | "yml" => serde_yaml_ng::from_slice(&raw)
            .with_context(|| format!("{} is not valid YAML", path.display()))?,
        _ => match serde_json::from_slice(&raw) {
            Ok(v) => v,
            Err(_) => serde_yaml_ng::from_slice(&raw)
                .with_context(|| format!("{} is neither JSON nor YAML", path.display()))?,
        },
    };
    Ok((value, raw))
}

async fn job(cmd: JobCommand) -> anyhow::Result<()> {
    match cmd {
        JobCommand::Submit {
            file,
            idempotency_key,
            client,
        } => {
            let c = client_of(&client)?;
            let (body, raw) = read_job_file(&file)?;
            let key = idempotency_key
                .unwrap_or_else(|| format!("cli-{}", hex::encode(&Sha256::digest(&raw)[..16])));
            let (status, job) = c
                .call::<Value>(
                    Method::POST,
                    "/v1/jobs",
                    Some(&body),
                    &[("idempotency-key", key.as_str())],
                )
                .await?;
            if status == reqwest::StatusCode::OK {
                eprintln!("(already submitted with this content; showing the existing job)");
            }
            println!("{}", serde_json::to_string_pretty(&job)?);
        }
        JobCommand::List {
            state,
            team,
            limit,
            json,
            client,
        } => {
            let c = client_of(&client)?;
            let mut query = vec![format!("limit={limit}")];
            if let Some(s) = state {
                query.push(format!("state={s}"));
            }
            if let Some(t) = team {
                query.push(format!("team={t}"));
            }
            let page = c.get(&format!("/v1/jobs?{}", query.join("&"))).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&page)?);
            } else {
                print_jobs(&page);
            }
        }
        JobCommand::Show { id, client } => {
            let c = client_of(&client)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&c.get(&format!("/v1/jobs/{id}")).await?)?
            );
        }
        JobCommand::Cancel { id, reason, client } => {
            let c = client_of(&client)?;
            let body = serde_json::json!({ "reason": reason });
            let job = c.post(&format!("/v1/jobs/{id}/cancel"), &body).await?;
            println!(
                "{} {}",
                job["id"].as_str().unwrap_or(&id),
                job["state"].as_str().unwrap_or("?")
            );
        }
        JobCommand::Events { id, client } => {
            let c = client_of(&client)?;
            // The whole history, page after page (oldest first).
            let mut path = format!("/v1/jobs/{id}/events?limit=500");
            loop {
                let page = c.get(&path).await?;
                for e in page["items"].as_array().into_iter().flatten() {
                    println!(
                        "{}  {:<18} {}",
                        e["at"].as_str().unwrap_or(""),
                        e["type"].as_str().unwrap_or(""),
                        e["reason"].as_str().unwrap_or("")
                    );
                }
                match page["next_cursor"].as_str() {
                    Some(cursor) => {
                        path = format!("/v1/jobs/{id}/events?limit=500&cursor={cursor}")
                    }
                    None => break,
                }
            }
        }
        JobCommand::Logs {
            id,
            follow,
            replica,
            attempt,
            tail,
            client,
        } => {
            let c = client_of(&client)?;
            let mut query = vec![format!("replica={replica}"), format!("follow={follow}")];
            if let Some(a) = attempt {
                query.push(format!("attempt={a}"));
            }
            if let Some(t) = tail {
                query.push(format!("tail={t}"));
            }
            let path = format!("/v1/jobs/{id}/logs?{}", query.join("&"));
            let mut out = std::io::stdout().lock();
            c.stream(&path, &mut out).await?;
        }
    }
    Ok(())
}

fn shape_text(shape: &Value) -> String {
    if let Some(g) = shape.get("gpus") {
        format!("{g}x gpu")
    } else if let Some(m) = shape.get("mig").and_then(Value::as_str) {
        format!("mig {m}")
    } else if let Some(m) = shape.get("gpu_milli") {
        format!("{m}m gpu")
    } else {
        "?".into()
    }
}

fn print_jobs(page: &Value) {
    println!(
        "{:<36}  {:<14} {:<20} {:<12} {:<10} {:>8}  SHAPE",
        "ID", "TEAM", "NAME", "STATE", "PRIORITY", "REPLICAS"
    );
    for j in page["items"].as_array().into_iter().flatten() {
        println!(
            "{:<36}  {:<14} {:<20} {:<12} {:<10} {:>8}  {}",
            j["id"].as_str().unwrap_or(""),
            j["team"].as_str().unwrap_or(""),
            j["name"].as_str().unwrap_or(""),
            j["state"].as_str().unwrap_or(""),
            match &j["priority"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
            j["replicas"].as_u64().unwrap_or(1),
            shape_text(&j["shape"]),
        );
    }
    if let Some(c) = page["next_cursor"].as_str() {
        println!("(more: --cursor is {c})");
    }
}
