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
