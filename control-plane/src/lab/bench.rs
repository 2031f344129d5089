//! `spotplane bench submit`: a closed-loop load generator for job submission.
//!
//! `concurrency` workers each submit a job, wait for the answer, and submit the next, over
//! keep-alive connections, for a warm-up and then a measured period. Every submission carries
//! an Idempotency-Key (so the server does its full submit path) and is a realistic job spec.
//! Throughput is completed submissions per second of the measured period; latencies are per
//! request, client-side, so they include HTTP and loopback.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use reqwest::Method;
use serde::Serialize;
use serde_json::{Value, json};

use crate::client::Client;

#[derive(Debug, Clone, Serialize)]
pub struct SubmitReport {
    pub concurrency: usize,
    pub seconds: f64,
    pub submitted: u64,
    pub errors: u64,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

fn job_body(worker: usize, n: u64) -> Value {
    json!({
        "name": format!("bench-{worker}-{n}"),
        "priority": "fine-tune",
        "replicas": 2,
        "shape": {"mig": "3g.40gb"},
        "cpu_milli": 8000,
        "memory_mib": 32768,
        "command": ["python", "train.py", "--epochs", "3"],
        "env": {"WANDB_PROJECT": "bench"},
        "checkpoint": {"uri": "s3://bench-bucket/ckpt", "interval_s": 600},
        "max_hourly_usd": 12.5,
        "clouds": ["aws", "gcp"],
        "labels": {"bench": "submit"}
    })
}

/// Creates a team and a team token with the admin client, then measures.
pub async fn submit(
    admin: &Client,
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<SubmitReport> {
    let suffix: u32 = rand::random();
    let team = format!("bench-{suffix:08x}");
    admin
        .post("/v1/teams", &json!({"name": team}))
        .await
        .context("creating the bench team (is the token an admin token?)")?;
    let created = admin
        .post(
            &format!("/v1/teams/{team}/tokens"),
            &json!({"name": "bench"}),
        )
        .await?;
    let token = created["token"]
        .as_str()
        .context("token missing in response")?
        .to_owned();
    let client = admin.with_token(token);

    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..concurrency {
        let client = client.clone();
        let measuring = measuring.clone();
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 14);
            let mut errors = 0u64;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let key = format!("bench-{w}-{n}-{suffix}");
                let body = job_body(w, n);
                let started = Instant::now();
                let r = client
                    .call::<Value>(
                        Method::POST,
                        "/v1/jobs",
                        Some(&body),
                        &[("idempotency-key", key.as_str())],
                    )
                    .await;
                let took = started.elapsed();
                if measuring.load(Ordering::Relaxed) {
                    match r {
                        Ok(_) => lat.push(took.as_micros() as u64),
                        Err(_) => errors += 1,
                    }
                }
            }
            (lat, errors)
        }));
    }
    tokio::time::sleep(warmup).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    measuring.store(false, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut errors = 0;
    for w in workers {
        let (lat, e) = w.await?;
        all.extend(lat);
        errors += e;
    }
    all.sort_unstable();
    Ok(SubmitReport {
        concurrency,
        seconds,
        submitted: all.len() as u64,
        errors,
        per_second: all.len() as f64 / seconds,
        p50_ms: percentile(&all, 50.0),
        p90_ms: percentile(&all, 90.0),
        p99_ms: percentile(&all, 99.0),
        max_ms: all.last().map_or(0.0, |m| *m as f64 / 1000.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}

/// What `spotplane bench cycle` measured: the leader's round on a store with a large queue,
/// stage by stage, each the median of the cycles run.
#[derive(Debug, Clone, Serialize)]
pub struct CycleReport {
    pub database: String,
    pub queued: usize,
    pub cycles: usize,
    /// The first scheduling cycle (it writes every job's wait reason).
    pub first_cycle_ms: f64,
    /// Later scheduling cycles, median.
    pub cycle_ms: f64,
    /// Later capacity rounds on the simulated clouds, median.
    pub capacity_ms: f64,
    /// Per store call during the cycles and rounds, most time first.
    pub store_calls: Vec<StoreCalls>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StoreCalls {
    pub op: String,
    pub calls: u64,
    pub mean_ms: f64,
    pub total_ms: f64,
}

/// The store calls' counts and time from the metrics' exposition.
fn store_calls(metrics: &crate::metrics::Metrics) -> Vec<StoreCalls> {
    let text = metrics.render();
    let mut by_op: std::collections::BTreeMap<String, (u64, f64)> = Default::default();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("spotplane_store_operation_seconds_") else {
            continue;
        };
        let (kind, rest) = rest.split_once('{').unwrap_or(("", ""));
        let Some(op) = rest
            .split_once("op=\"")
            .and_then(|(_, r)| r.split_once('"'))
            .map(|(op, _)| op.to_owned())
        else {
            continue;
        };
        let value: f64 = rest
            .rsplit_once(' ')
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0.0);
        let e = by_op.entry(op).or_default();
        match kind {
            "count" => e.0 += value as u64,
            "sum" => e.1 += value * 1000.0,
            _ => {}
        }
    }
    let mut out: Vec<StoreCalls> = by_op
        .into_iter()
        .map(|(op, (calls, total_ms))| StoreCalls {
            op,
            calls,
            mean_ms: if calls == 0 {
                0.0
            } else {
                total_ms / calls as f64
            },
            total_ms,
        })
        .collect();
    out.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
    out
}

/// Fills a scratch store (SQLite in `dir`, or `database` when given) with `queued` jobs like
/// `bench submit`'s, then runs `cycles` scheduling cycles and capacity rounds on the simulated
/// clouds of `config`, timing each store call and the rounds.
pub async fn cycle(
    config: &crate::config::Config,
    dir: &std::path::Path,
    database: Option<&str>,
    queued: usize,
    cycles: usize,
) -> anyhow::Result<CycleReport> {
    use spotplane_core::job::{CheckpointSpec, JobSpec};
    use spotplane_core::shape::GpuShape;
    use spotplane_core::{Cloud, JobId, Micros};

    use crate::metrics::Metrics;
    use crate::reconcile::capacity::CapacityLoop;
    use crate::reconcile::scheduling::SchedulerLoop;
    use crate::store::{NewJob, NewTeam, Store};

    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut db = config.database.clone();
    match database {
        Some(url) => db.url = url.to_owned(),
        None => {
            let file = dir.join("bench-cycle.sqlite");
            for suffix in ["", "-wal", "-shm"] {
                let p = std::path::PathBuf::from(format!("{}{suffix}", file.display()));
                if p.exists() {
                    std::fs::remove_file(&p)
                        .with_context(|| format!("removing {}", p.display()))?;
                }
            }
            db.url = format!("sqlite://{}", file.display());
            db.schema = None;
        }
    }
    let fill = Metrics::new();
    let store = Store::connect(&db, fill).await?;
    store.migrate().await?;
    let clock: crate::clock::SharedClock = Arc::new(spotplane_providers::clock::SystemClock);
    let now = clock.now();
    let team = store
        .create_team(
            NewTeam {
                name: format!("bench-{}", uuid::Uuid::now_v7().simple()).parse()?,
                weight: 1.0,
                cohort: None,
                quotas: Default::default(),
            },
            now,
        )
        .await?;
    let shape = GpuShape::Mig {
        profile: "3g.40gb".parse()?,
        models: vec![],
    };
    let started = Instant::now();
    for n in 0..queued {
        let mut spec = JobSpec::new(
            format!("bench-{n}"),
            shape.clone(),
            vec!["python".into(), "train.py".into()],
        );
        spec.replicas = 2;
        spec.clouds = vec![Cloud::Aws, Cloud::Gcp];
        spec.max_hourly_usd = Some(Micros::parse_usd("12.5")?);
        spec.checkpoint = Some(CheckpointSpec {
            uri: "s3://bench-bucket/ckpt".into(),
            interval_s: 600,
        });
        store
            .submit_job(
                NewJob {
                    id: JobId(uuid::Uuid::now_v7()),
                    team_id: team.id.clone(),
                    team: team.name.clone(),
                    spec,
                    idempotency: None,
                },
                clock.now(),
            )
            .await?;
    }
    tracing::info!(queued, took = ?started.elapsed(), "queue filled");
    // A store of its own for the measured part, so its metrics count only the cycles.
    let metrics = Metrics::new();
    drop(store);
    let store = Store::connect(&db, metrics.clone()).await?;

    let providers = Arc::new(
        spotplane_providers::registry::build(
            &config.providers,
            &spotplane_providers::registry::BuildContext {
                clock: clock.clone(),
                sim_market: config.sim.market()?,
                catalog_dir: config.catalog.dir.clone(),
                observer: None,
                sim_state_dir: None,
            },
        )
        .await
        .context("setting up the simulated clouds")?,
    );
    let mut sched = SchedulerLoop::new(store.clone(), clock.clone(), config.scheduler.clone());
    let mut settings = config.capacity.settings();
    settings.cluster = "bench-cycle".into();
    let mut cap = CapacityLoop::new(store.clone(), providers, clock.clone(), settings);
    let mut first = 0.0;
    let (mut sched_ms, mut cap_ms) = (Vec::new(), Vec::new());
    for i in 0..cycles.max(1) {
        let t = Instant::now();
        sched.run_once().await?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if i == 0 {
            first = ms;
        } else {
            sched_ms.push(ms);
        }
        let t = Instant::now();
        cap.run_once().await?;
        cap_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    Ok(CycleReport {
        database: if db.url.starts_with("sqlite:") {
            "sqlite".into()
        } else {
            "postgres".into()
        },
        queued,
        cycles: cycles.max(1),
        first_cycle_ms: first,
        cycle_ms: median(&mut sched_ms),
        capacity_ms: median(&mut cap_ms),
        store_calls: store_calls(&metrics),
    })
}
