//! The lab's commands as the binary runs them: each takes its parsed arguments
//! ([`super::cli`]), runs its driver and prints the result, a table or JSON. `main.rs` only
//! parses, loads the configuration, starts logging where a command logs, and dispatches here.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use spotplane_providers::clock::ManualClock;
use spotplane_providers::registry::{self, BuildContext};
use spotplane_providers::sim::replay::{self as sim_replay, ReplaySpec as SimReplaySpec};

use super::cli::{
    CycleBenchArgs, DeadlineArgs, FinanceBenchArgs, PackArgs, ReplayArgs, SimBenchArgs,
};
use super::finance_week::{WeekSpec, run_week};
use super::{bench, deadline, openb};
use crate::client::Client;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::Store;

/// `spotplane bench submit`: [`bench::submit`] against a running server, as a line or JSON.
pub async fn bench_submit(
    admin: &Client,
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
    json: bool,
) -> anyhow::Result<()> {
    let report = bench::submit(admin, concurrency, warmup, duration).await?;
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

/// `spotplane bench cycle`: [`bench::cycle`] on a scratch store, with the store's calls by
/// name.
pub async fn bench_cycle(config: &Config, args: &CycleBenchArgs) -> anyhow::Result<()> {
    let r = bench::cycle(
        config,
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

/// `spotplane replay`: each policy on the same workload and traces, one after the other.
pub async fn replay(config: &Config, args: &ReplayArgs) -> anyhow::Result<()> {
    use super::replay::{self, POLICIES, ReplaySpec};
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
pub async fn bench_sim(config: &Config, args: &SimBenchArgs) -> anyhow::Result<()> {
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
            sim_state_dir: None,
        },
    )
    .await?;
    let chrono_of =
        |d: std::time::Duration| chrono::Duration::from_std(d).context("a duration out of range");
    let spec = SimReplaySpec {
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
    let report = sim_replay::replay(&providers.sims, &clock, &spec).await;
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

/// `spotplane bench finance`: a replayed week in a fresh SQLite ledger, checked and written out.
pub async fn bench_finance(config: &Config, args: &FinanceBenchArgs) -> anyhow::Result<()> {
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
            sim_state_dir: None,
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

/// `spotplane bench pack`: runs synchronously (pure computation) and streams results.
pub fn bench_pack(args: &PackArgs) -> anyhow::Result<()> {
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
pub fn bench_deadline(args: &DeadlineArgs) -> anyhow::Result<()> {
    let prices = match (&args.spot_price, &args.spot_price_per_trace) {
        (Some(p), None) => vec![*p],
        (None, Some(list)) => list.clone(),
        _ => anyhow::bail!("give --spot-price, or --spot-price-per-trace with several traces"),
    };
    let [path] = args.trace.as_slice() else {
        return bench_deadline_pools(args, &prices);
    };
    if args.migrate_hours.is_some() || args.spot_price_per_trace.is_some() {
        anyhow::bail!("--migrate-hours and --spot-price-per-trace need more than one --trace");
    }
    let names = deadline::PolicyName::parse_list(&args.policy).map_err(anyhow::Error::msg)?;
    let trace = deadline::trace::load(path)?;
    let params = deadline::Params {
        work_hours: args.work_hours,
        deadline_hours: args.deadline_hours,
        restart_hours: args.restart_hours,
        spot_price: prices[0],
        on_demand_price: args.ondemand_price,
    };
    let model =
        deadline::Model::new(&trace, &params).with_context(|| format!("{}", path.display()))?;
    let spot_price = price_json(prices[0]);
    if !args.json {
        println!(
            "{}: {} ticks of {} s ({:.1} h); in ticks: work {}, deadline {}, restart {} \
             (work and restart rounded up, deadline down){}",
            path.display(),
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
                trace: path.display().to_string(),
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
        print_times(reports.iter().map(|r| r.policy), &times);
    }
    Ok(())
}

/// The line of `bench deadline` that says how long each policy took.
fn print_times<'a>(policies: impl Iterator<Item = &'a str>, times_ms: &[f64]) {
    let times: Vec<String> = policies
        .zip(times_ms)
        .map(|(p, ms)| format!("{p} {ms:.1} ms"))
        .collect();
    println!("time: {}", times.join(", "));
}

fn price_json(p: deadline::SpotPrice) -> Value {
    match p {
        deadline::SpotPrice::Fixed(s) => serde_json::json!(s),
        deadline::SpotPrice::Trace => serde_json::json!("trace"),
    }
}

/// One line of `spotplane bench deadline --json` with several traces.
#[derive(serde::Serialize)]
struct PoolsLine<'a> {
    #[serde(flatten)]
    report: &'a deadline::pools::PoolsReport,
    traces: Vec<String>,
    work_hours: f64,
    deadline_hours: f64,
    restart_hours: f64,
    migrate_hours: f64,
    spot_prices: Vec<Value>,
    ondemand_price: f64,
    elapsed_ms: f64,
}

/// `spotplane bench deadline` with several traces: one job that may move between the pools.
fn bench_deadline_pools(args: &DeadlineArgs, prices: &[deadline::SpotPrice]) -> anyhow::Result<()> {
    use deadline::pools;
    let Some(migrate_hours) = args.migrate_hours else {
        anyhow::bail!("--migrate-hours is needed with more than one --trace (0 for free moves)");
    };
    let names = pools::PoolPolicyName::parse_list(&args.policy).map_err(anyhow::Error::msg)?;
    let traces = args
        .trace
        .iter()
        .map(|p| Ok((p.display().to_string(), deadline::trace::load(p)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let named: Vec<(&str, &deadline::Trace)> =
        traces.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let params = deadline::Params {
        work_hours: args.work_hours,
        deadline_hours: args.deadline_hours,
        restart_hours: args.restart_hours,
        spot_price: prices[0],
        on_demand_price: args.ondemand_price,
    };
    let model =
        pools::PoolsModel::new(&named, &params, prices, migrate_hours).map_err(|e| match &e {
            pools::PoolsError::Model { pool, .. } => {
                anyhow::anyhow!("{}: {e}", traces[*pool].0)
            }
            _ => anyhow::Error::new(e),
        })?;
    if !args.json {
        println!(
            "{} pools, ticks of {} s; in ticks: work {}, deadline {}, restart {}, migrate {} \
             (work, restart and migrate rounded up, deadline down){}",
            model.pools.len(),
            model.gap_seconds,
            model.work,
            model.deadline,
            model.restart,
            model.migrate,
            if model.feasible() {
                ""
            } else {
                "; infeasible: on-demand from the start misses the deadline"
            }
        );
        for (i, (name, _)) in traces.iter().enumerate() {
            println!("  pool {i}: {name}");
        }
    }
    let mut reports = Vec::new();
    let mut times = Vec::new();
    for name in names {
        let started = std::time::Instant::now();
        let outcome = pools::run(&model, name);
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        let report = pools::PoolsReport::new(&model, name, &outcome);
        if args.json {
            let line = PoolsLine {
                report: &report,
                traces: traces.iter().map(|(n, _)| n.clone()).collect(),
                work_hours: args.work_hours,
                deadline_hours: args.deadline_hours,
                restart_hours: args.restart_hours,
                migrate_hours,
                spot_prices: prices.iter().map(|&p| price_json(p)).collect(),
                ondemand_price: args.ondemand_price,
                elapsed_ms,
            };
            println!("{}", serde_json::to_string(&line)?);
        }
        reports.push(report);
        times.push(elapsed_ms);
    }
    if !args.json {
        print!("{}", pools::format_table(&reports));
        print_times(reports.iter().map(|r| r.policy), &times);
    }
    Ok(())
}
