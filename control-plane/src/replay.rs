//! `spotplane replay`: a fleet replay in virtual time with the control plane's own parts — the
//! store (SQLite in a scratch folder), the scheduling loop, the capacity loop with its planner,
//! and the three simulated clouds replaying ../shared/data — under one buying policy at a time.
//!
//! Jobs arrive from a Philly/Gavel trace (`gpu-trace/philly-gavel/*.trace`: arrival time and
//! gang size in GPUs; Gavel's traces give work in steps, and Gavel's per-model throughput table
//! is not part of the data, so a step takes `--seconds-per-step`, 0.1 s by default: about the
//! ten steps a second Gavel's models make on a V100). A job of `g` GPUs is
//! one replica of `g` whole GPUs up to 8, else `g/8` replicas of 8; it checkpoints every 30
//! minutes and has a deadline of 1.5× its work plus 2 hours after it arrives. Three teams take
//! the jobs in turn.
//!
//! The harness plays the node agents: an admitted job starts, makes progress while every node it
//! holds is up, checkpoints on schedule, and finishes when its work is done. When a node gets a
//! notice, the jobs on it checkpoint inside the window (the window of every simulated cloud is
//! long enough for these jobs' checkpoints) and are requeued; work since that checkpoint is kept,
//! so lost work is what ran on nodes lost *without* a usable notice. Everything else — what is
//! bought, where, when it is released, noticing that a node is gone — is the control plane's.
//!
//! Cost is every node's price in force times the time it was held (bought to terminated); the
//! on-demand equivalent is the same node-hours at the same capacity's on-demand price.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use spotplane_core::job::{CheckpointSpec, JobSpec};
use spotplane_core::shape::GpuShape;
use spotplane_core::{Cloud, JobId, JobState, Micros, NodeState};
use spotplane_providers::clock::{Clock as _, ManualClock};
use spotplane_providers::config::ProviderConfig;
use spotplane_providers::registry::{self, BuildContext};
use spotplane_providers::sim::SimConfig;

use crate::config::{Config, DatabaseConfig};
use crate::metrics::Metrics;
use crate::planner::PlanPolicy;
use crate::reconcile::capacity::{CapacityLoop, CapacitySettings};
use crate::reconcile::scheduling::SchedulerLoop;
use crate::store::{NewJob, NewTeam, Store, SubmitOutcome};

/// One job of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceJob {
    pub arrival_s: f64,
    pub gpus: u32,
    pub work_hours: f64,
}

/// Reads a Gavel trace: tab-separated `job_type, command, num_steps_arg, needs_data_dir,
/// total_steps, arrival_time, scale_factor`. Errors name the file and line.
pub fn load_trace(path: &Path, seconds_per_step: f64) -> anyhow::Result<Vec<TraceJob>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut jobs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let bad = |what: &str| anyhow::anyhow!("{}:{}: {what}", path.display(), i + 1);
        if f.len() != 7 {
            return Err(bad(&format!(
                "expected 7 tab-separated fields, found {}",
                f.len()
            )));
        }
        let steps: f64 = f[4]
            .trim()
            .parse()
            .map_err(|_| bad("total_steps is not a number"))?;
        let arrival: f64 = f[5]
            .trim()
            .parse()
            .map_err(|_| bad("arrival_time is not a number"))?;
        let gpus: u32 = f[6]
            .trim()
            .parse()
            .map_err(|_| bad("scale_factor is not a count"))?;
        if !(steps > 0.0 && arrival >= 0.0 && gpus > 0) {
            return Err(bad("steps, arrival and scale must be positive"));
        }
        jobs.push(TraceJob {
            arrival_s: arrival,
            gpus,
            work_hours: steps * seconds_per_step / 3600.0,
        });
    }
    jobs.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    Ok(jobs)
}

/// What a policy's replay came to.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReplayOutcome {
    pub policy: String,
    pub total_cost_usd: f64,
    pub ondemand_equivalent_usd: f64,
    pub saving_pct: f64,
    pub jobs_submitted: usize,
    pub jobs_finished: usize,
    pub deadline_misses: usize,
    pub lost_gpu_hours: f64,
    pub gpu_hours: f64,
    pub mean_queue_delay_s: f64,
    pub preemptions: u64,
    pub nodes_bought: u64,
    /// Of those, on-demand nodes.
    pub on_demand_nodes: u64,
    pub wall_seconds: f64,
}

/// How to replay.
#[derive(Debug, Clone)]
pub struct ReplaySpec {
    pub trace: PathBuf,
    pub days: f64,
    pub start: DateTime<Utc>,
    pub step: Duration,
    pub data_dir: PathBuf,
    /// Jobs at most (the busiest Philly clusters submit thousands).
    pub max_jobs: usize,
    /// GPU seconds one trace step takes.
    pub seconds_per_step: f64,
}

pub fn policy_by_name(name: &str) -> Option<PlanPolicy> {
    match name {
        "spotplane" => Some(PlanPolicy::ExpectedCost),
        "cheapest-spot-failover" => Some(PlanPolicy::CheapestSpot),
        "on-demand-only" => Some(PlanPolicy::OnDemandOnly),
        _ => None,
    }
}

pub const POLICIES: [&str; 3] = ["on-demand-only", "cheapest-spot-failover", "spotplane"];

struct Run {
    work: f64,
    gpus: u32,
    arrival: DateTime<Utc>,
    deadline: DateTime<Utc>,
    done: f64,
    checkpointed: f64,
    started: Option<DateTime<Utc>>,
    finished: Option<DateTime<Utc>>,
}

/// Replays one policy.
pub async fn replay(spec: &ReplaySpec, policy_name: &str) -> anyhow::Result<ReplayOutcome> {
    let policy = policy_by_name(policy_name)
        .ok_or_else(|| anyhow::anyhow!("unknown policy {policy_name:?}; one of {POLICIES:?}"))?;
    let wall = std::time::Instant::now();
    let trace = load_trace(&spec.trace, spec.seconds_per_step)?;
    let horizon = spec.days * 86_400.0;
    let arrivals: Vec<TraceJob> = trace
        .into_iter()
        .filter(|j| j.arrival_s < horizon)
        .take(spec.max_jobs)
        .collect();

    let scratch = tempfile::tempdir().context("a scratch folder")?;
    let mut config = Config::embedded_default()?;
    config.database = DatabaseConfig {
        url: format!(
            "sqlite://{}",
            scratch.path().join("replay.sqlite").display()
        ),
        ..config.database
    };
    let store = Store::connect(&config.database, Metrics::new()).await?;
    store.migrate().await?;
    let clock = ManualClock::new(spec.start);
    let shared: crate::clock::SharedClock = Arc::new(clock.clone());
    let sims: Vec<ProviderConfig> = Cloud::ALL
        .iter()
        .enumerate()
        .map(|(i, c)| ProviderConfig::Sim(SimConfig::new(*c, i as u64 + 1)))
        .collect();
    let providers = Arc::new(
        registry::build(
            &sims,
            &BuildContext {
                clock: shared.clone(),
                sim_data_dir: spec.data_dir.clone(),
                catalog_dir: None,
                observer: None,
            },
        )
        .await?,
    );
    let teams = ["vision", "nlp", "recsys"];
    let mut team_ids = Vec::new();
    for t in teams {
        let team = store
            .create_team(
                NewTeam {
                    name: t.parse()?,
                    weight: 1.0,
                    cohort: None,
                    quotas: Default::default(),
                },
                spec.start,
            )
            .await?;
        team_ids.push(team.id);
    }
    let mut sched = SchedulerLoop::new(store.clone(), shared.clone(), config.scheduler.clone());
    let mut settings = CapacitySettings {
        cluster: "replay".into(),
        ..CapacitySettings::default()
    };
    settings.planner.policy = policy;
    let mut cap = CapacityLoop::new(
        store.clone(),
        Arc::clone(&providers),
        shared.clone(),
        settings,
    );

    let mut runs: HashMap<JobId, Run> = HashMap::new();
    let mut next = 0usize;
    let mut preemptions = 0u64;
    let mut lost_gpu_hours = 0.0;
    let step_h = spec.step.num_seconds() as f64 / 3600.0;
    let end = spec.start + Duration::seconds(horizon as i64);
    let checkpoint_every = 0.5;
    while clock.now() < end {
        let now = clock.now();
        // Arrivals.
        while next < arrivals.len()
            && spec.start + Duration::milliseconds((arrivals[next].arrival_s * 1000.0) as i64)
                <= now
        {
            let a = &arrivals[next];
            let team = next % teams.len();
            let shape = if a.gpus <= 8 {
                (1, a.gpus)
            } else {
                (a.gpus.div_ceil(8), 8)
            };
            let mut js = JobSpec::new(
                format!("philly-{next}"),
                GpuShape::Whole {
                    gpus: shape.1,
                    models: vec![],
                },
                vec!["train".into()],
            );
            js.replicas = shape.0;
            js.work_hours = Some(a.work_hours.max(1.0 / 60.0));
            js.checkpoint = Some(CheckpointSpec {
                uri: "file:///replay".into(),
                interval_s: 1800,
            });
            let deadline = now + Duration::seconds((a.work_hours * 1.5 * 3600.0 + 7200.0) as i64);
            js.deadline = Some(deadline);
            let id = JobId(uuid::Uuid::now_v7());
            match store
                .submit_job(
                    NewJob {
                        id,
                        team_id: team_ids[team].clone(),
                        team: teams[team].parse()?,
                        spec: js,
                        idempotency: None,
                    },
                    now,
                )
                .await?
            {
                SubmitOutcome::Created(_) => {}
                other => anyhow::bail!("submission refused: {other:?}"),
            }
            runs.insert(
                id,
                Run {
                    work: a.work_hours,
                    gpus: a.gpus,
                    arrival: now,
                    deadline,
                    done: 0.0,
                    checkpointed: 0.0,
                    started: None,
                    finished: None,
                },
            );
            next += 1;
        }

        sched.run_once().await?;
        cap.run_once().await?;

        // The agents: start what was admitted, advance what runs, react to notices.
        let live: HashMap<String, (Cloud, String)> = store
            .list_nodes(&[NodeState::Booting, NodeState::Ready, NodeState::Draining])
            .await?
            .into_iter()
            .filter_map(|n| Some((n.id.to_string(), (n.cloud, n.provider_instance_id?))))
            .collect();
        let mut noticed_nodes: HashMap<String, bool> = HashMap::new();
        for (node, (cloud, pid)) in &live {
            if let Some(sim) = providers.sim(*cloud) {
                let notice = sim.instance_by_name(pid).is_some_and(|i| {
                    i.notice.is_some() || i.terminated_at.is_some_and(|t| t <= now)
                });
                noticed_nodes.insert(node.clone(), notice);
            }
        }
        let holding = store.jobs_with_nodes().await?;
        for (job, (state, nodes)) in holding {
            let Some(run) = runs.get_mut(&job) else {
                continue;
            };
            let all_up = nodes
                .iter()
                .all(|n| noticed_nodes.get(&n.to_string()) == Some(&false));
            match state {
                JobState::Admitted => {
                    store
                        .transition_job(
                            job,
                            None,
                            Some(JobState::Admitted),
                            JobState::Starting,
                            None,
                            now,
                        )
                        .await?;
                    store
                        .transition_job(
                            job,
                            None,
                            Some(JobState::Starting),
                            JobState::Running,
                            None,
                            now,
                        )
                        .await?;
                    run.started.get_or_insert(now);
                }
                JobState::Running if all_up => {
                    run.done += step_h;
                    if run.done - run.checkpointed >= checkpoint_every {
                        run.checkpointed = run.done;
                    }
                    if run.done >= run.work {
                        store
                            .transition_job(
                                job,
                                None,
                                Some(JobState::Running),
                                JobState::Succeeded,
                                None,
                                now,
                            )
                            .await?;
                        run.finished = Some(now);
                    }
                }
                JobState::Running => {
                    // A node of the gang has its notice: checkpoint inside the window, requeue.
                    preemptions += 1;
                    run.checkpointed = run.done;
                    store
                        .transition_job(
                            job,
                            None,
                            Some(JobState::Running),
                            JobState::Draining,
                            Some("node notice".into()),
                            now,
                        )
                        .await?;
                    store
                        .transition_job(
                            job,
                            None,
                            Some(JobState::Draining),
                            JobState::Checkpointed,
                            None,
                            now,
                        )
                        .await?;
                    store
                        .transition_job(
                            job,
                            None,
                            Some(JobState::Checkpointed),
                            JobState::Queued,
                            Some("resume from checkpoint".into()),
                            now,
                        )
                        .await?;
                }
                _ => {}
            }
        }
        // Jobs whose node vanished without the harness seeing a notice: back to the last checkpoint.
        for (job, state) in store.jobs_on_dead_nodes().await? {
            let Some(run) = runs.get_mut(&job) else {
                continue;
            };
            match state {
                JobState::Running | JobState::Starting | JobState::Draining => {
                    lost_gpu_hours += (run.done - run.checkpointed) * f64::from(run.gpus);
                    run.done = run.checkpointed;
                    store
                        .transition_job(
                            job,
                            None,
                            Some(state),
                            JobState::Lost,
                            Some("node lost".into()),
                            now,
                        )
                        .await?;
                    store
                        .transition_job(
                            job,
                            None,
                            Some(JobState::Lost),
                            JobState::Queued,
                            Some("resume from the last checkpoint".into()),
                            now,
                        )
                        .await?;
                }
                JobState::Admitted | JobState::Checkpointed => {
                    store
                        .transition_job(
                            job,
                            None,
                            Some(state),
                            JobState::Queued,
                            Some("node lost before start".into()),
                            now,
                        )
                        .await?;
                }
                _ => {}
            }
        }
        clock.advance(spec.step);
    }

    // Bills.
    let end_now = clock.now();
    let (mut cost, mut od) = (0i128, 0i128);
    let mut gpu_hours = 0.0;
    let nodes = store.list_nodes(&NodeState::ALL).await?;
    for n in &nodes {
        if n.provider_instance_id.is_none() {
            continue;
        }
        let until = n.terminated_at.unwrap_or(end_now);
        let ms = i128::from((until - n.created_at).num_milliseconds().max(0));
        cost += i128::from(
            Micros::from_usd_f64(n.hourly_price_usd)
                .unwrap_or_default()
                .0,
        ) * ms;
        od += i128::from(
            Micros::from_usd_f64(n.on_demand_price_usd)
                .unwrap_or_default()
                .0,
        ) * ms;
        gpu_hours += n.gpus.len() as f64 * ms as f64 / 3_600_000.0;
    }
    let usd = |v: i128| v as f64 / 3_600_000.0 / 1e6;
    let finished: Vec<&Run> = runs.values().filter(|r| r.finished.is_some()).collect();
    let misses = runs
        .values()
        .filter(|r| r.finished.map_or(end_now > r.deadline, |f| f > r.deadline))
        .count();
    let delays: Vec<f64> = runs
        .values()
        .filter_map(|r| r.started.map(|s| (s - r.arrival).num_seconds() as f64))
        .collect();
    Ok(ReplayOutcome {
        policy: policy_name.to_owned(),
        total_cost_usd: usd(cost),
        ondemand_equivalent_usd: usd(od),
        saving_pct: if od > 0 {
            100.0 * (1.0 - cost as f64 / od as f64)
        } else {
            0.0
        },
        jobs_submitted: runs.len(),
        jobs_finished: finished.len(),
        deadline_misses: misses,
        lost_gpu_hours,
        gpu_hours,
        mean_queue_delay_s: if delays.is_empty() {
            0.0
        } else {
            delays.iter().sum::<f64>() / delays.len() as f64
        },
        preemptions,
        nodes_bought: nodes
            .iter()
            .filter(|n| n.provider_instance_id.is_some())
            .count() as u64,
        on_demand_nodes: nodes
            .iter()
            .filter(|n| {
                n.provider_instance_id.is_some() && n.market == spotplane_core::Market::OnDemand
            })
            .count() as u64,
        wall_seconds: wall.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(dir: &Path) -> PathBuf {
        let p = dir.join("t.trace");
        // Three one-GPU jobs of 20, 30 and 40 minutes (at 0.1 s a step), one 16-GPU gang.
        let line = |steps: u32, at: u32, gpus: u32| {
            format!(
                "ResNet-18 (batch size 64)\tcd x && python3 main.py\t--num_steps\t1\t{steps}\t{at}.000000\t{gpus}\n"
            )
        };
        let text = [
            line(12_000, 0, 1),
            line(18_000, 60, 1),
            line(24_000, 120, 1),
            line(6_000, 300, 16),
        ]
        .concat();
        std::fs::write(&p, text).expect("trace");
        p
    }

    #[test]
    fn traces_are_read_and_bad_lines_named() {
        let dir = tempfile::tempdir().expect("dir");
        let jobs = load_trace(&trace(dir.path()), 0.1).expect("reads");
        assert_eq!(jobs.len(), 4);
        assert!((jobs[0].work_hours - 12_000.0 * 0.1 / 3600.0).abs() < 1e-9);
        assert_eq!(jobs[3].gpus, 16);
        let bad = dir.path().join("bad.trace");
        std::fs::write(&bad, "a\tb\tc\n").expect("write");
        let err = load_trace(&bad, 0.1).expect_err("three fields");
        assert!(err.to_string().contains("bad.trace:1"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_policy_finishes_short_jobs_and_spot_costs_less() {
        let dir = tempfile::tempdir().expect("dir");
        let spec = ReplaySpec {
            trace: trace(dir.path()),
            days: 0.125,
            start: "2026-07-01T00:00:00Z".parse().expect("time"),
            step: Duration::seconds(120),
            data_dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"),
            max_jobs: 10,
            seconds_per_step: 0.1,
        };
        let mut out = Vec::new();
        for p in POLICIES {
            out.push(replay(&spec, p).await.expect("replays"));
        }
        for o in &out {
            assert_eq!(o.jobs_submitted, 4, "{o:?}");
            assert!(o.jobs_finished >= 3, "{o:?}");
            assert!(
                o.total_cost_usd > 0.0 && o.total_cost_usd <= o.ondemand_equivalent_usd + 1e-9,
                "{o:?}"
            );
        }
        assert!(
            out[0].saving_pct.abs() < 1e-9,
            "on-demand only saves nothing: {:?}",
            out[0]
        );
        assert!(out[2].total_cost_usd < out[0].total_cost_usd, "{out:?}");
    }
}
