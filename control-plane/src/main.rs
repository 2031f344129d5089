//! The `spotplane` binary, the composition root: it parses the command line — the production
//! commands' arguments from `spotplane::cli`, the lab's (`demo`, `replay`, `bench`) from
//! `spotplane::lab::cli` — and dispatches, the lab's commands to `spotplane::lab::commands`.
//! It is the one place outside `lab/` that may name the lab.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use reqwest::Method;
use serde_json::Value;
use sha2::{Digest, Sha256};
use spotplane::cli::{
    CatalogCommand, ClientArgs, ExportArgs, HealthcheckArgs, JobCommand, OffersArgs, SecretsCommand,
};
use spotplane::client::Client;
use spotplane::clock::SystemClock;
use spotplane::config::{Config, ConfigError};
use spotplane::lab::cli::{BenchCommand, DemoArgs, ReplayArgs};
use spotplane::lab::{commands, demo};
use spotplane::metrics::Metrics;
use spotplane::offers::{self, OfferFilter};
use spotplane::server::{ServeOptions, Server, shutdown_signal};
use spotplane::store::Store;
use spotplane::telemetry;
use spotplane_core::Market;
use spotplane_providers::catalog;
use spotplane_providers::registry::{self, BuildContext};

/// spotplane: GPU work on the cheapest capacity across AWS, GCP and Azure, without losing work
/// when a cloud takes a node back.
#[derive(Debug, Parser)]
#[command(name = "spotplane", version, about, long_about = None)]
struct Cli {
    /// Configuration file layered over the embedded default (config/spotplane.toml).
    #[arg(long, short = 'c', global = true, env = "SPOTPLANE_CONFIG")]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the control plane: API, and the reconcilers once they are configured.
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Maintain the secrets stored sealed (team secrets, webhook signing secrets).
    #[command(subcommand)]
    Secrets(SecretsCommand),
    /// Run everything on this machine: SQLite, a local-folder object store, simulated clouds.
    Demo(DemoArgs),
    /// Check the configuration and print it with every override applied.
    Config,
    /// Submit and follow jobs (a client of a running server).
    #[command(subcommand)]
    Job(JobCommand),
    /// Load generators whose figures go into docs/benchmarks.md.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Print what the configured providers offer now, cheapest first.
    Offers(OffersArgs),
    /// Replay a Philly/Gavel workload on the simulated clouds in virtual time, per buying policy.
    Replay(ReplayArgs),
    /// Maintain the price catalogs in config/catalog/.
    #[command(subcommand)]
    Catalog(CatalogCommand),
    /// Export the cost ledger for a time range: CSV lines, or FinOps FOCUS (a client of a
    /// running server; finance and admin tokens export everything, team tokens their own).
    Export(ExportArgs),
    /// Exit 0 when the server's /healthz answers 200 (the container image's HEALTHCHECK: the
    /// image needs no curl).
    Healthcheck(HealthcheckArgs),
}

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
            // Held until serve returns: dropping it flushes the spans not yet exported.
            let _spans = telemetry::init_with(&config.log, &config.telemetry)?;
            spotplane::failpoints::arm_from_env()?;
            let clock: spotplane::clock::SharedClock = if config.sim.speed > 1.0 {
                tracing::warn!(
                    speed = config.sim.speed,
                    "running on an accelerated clock (sim.speed)"
                );
                match &config.sim.state_dir {
                    // Restarts and replicas sharing the simulated clouds share their time line.
                    Some(dir) => {
                        std::fs::create_dir_all(dir)
                            .with_context(|| format!("creating sim.state_dir {}", dir.display()))?;
                        Arc::new(
                            spotplane::clock::ScaledClock::anchored(
                                config.sim.speed,
                                &dir.join("clock.json"),
                            )
                            .map_err(anyhow::Error::msg)?,
                        )
                    }
                    None => Arc::new(spotplane::clock::ScaledClock::new(config.sim.speed)),
                }
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
        Command::Secrets(SecretsCommand::Reseal) => {
            let config = Config::load(cli.config.as_deref())?;
            telemetry::init(&config.log);
            let key = spotplane::secrets::SecretsKey::load(&config.secrets)
                .context("loading the secrets key (secrets.key_file / secrets.key)")?;
            let store = Store::connect(&config.database, Metrics::new()).await?;
            store
                .migrate()
                .await
                .context("applying database migrations")?;
            store.seal_clear_webhook_secrets(&key).await?;
            let r = store.reseal_secrets(&key).await?;
            println!(
                "resealed {} team secrets and the signing secrets of {} webhook subscriptions under the current key; {} rows already were",
                r.team_secrets, r.webhook_subscriptions, r.already_current
            );
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
            commands::bench_submit(&admin, concurrency, warmup, duration, json).await
        }
        Command::Bench(BenchCommand::Cycle(args)) => {
            let config = Config::load(cli.config.as_deref())?;
            telemetry::init(&config.log);
            commands::bench_cycle(&config, &args).await
        }
        Command::Bench(BenchCommand::Pack(args)) => commands::bench_pack(&args),
        Command::Bench(BenchCommand::Deadline(args)) => commands::bench_deadline(&args),
        Command::Bench(BenchCommand::Finance(args)) => {
            let config = Config::load(cli.config.as_deref())?;
            commands::bench_finance(&config, &args).await
        }
        Command::Export(args) => export(&args).await,
        Command::Healthcheck(args) => healthcheck(&args).await,
        Command::Bench(BenchCommand::Sim(args)) => {
            let config = Config::load(cli.config.as_deref())?;
            commands::bench_sim(&config, &args).await
        }
        Command::Replay(args) => {
            let config = Config::load(cli.config.as_deref())?;
            commands::replay(&config, &args).await
        }
        Command::Offers(args) => {
            let config = Config::load(cli.config.as_deref())?;
            offers(&config, &args).await
        }
        Command::Catalog(CatalogCommand::Build {
            data,
            skypilot,
            out,
        }) => {
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            for (cloud, rows) in catalog::build_from_data(&data, &skypilot)? {
                let path = out.join(catalog::file_name(cloud));
                std::fs::write(&path, catalog::to_csv(&rows))
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("{}: {} rows", path.display(), rows.len());
            }
            Ok(())
        }
    }
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
            sim_state_dir: None,
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

fn toml_of(config: &Config) -> anyhow::Result<String> {
    // figment reads TOML; for printing, JSON-as-TOML is not worth a dependency: print JSON.
    // Never a password or token: `Config::redacted` takes them out.
    Ok(serde_json::to_string_pretty(&config.redacted()?)? + "\n")
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
