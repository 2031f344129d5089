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
//! Every node runs an in-process agent (`simagent`) speaking the agent protocol through the
//! store: replicas make progress until their work is done, checkpoint (20 s each, into a local
//! object store folder) when asked or on their cloud's notice, and resume from what they saved.
//! Everything else — starting replicas, periodic checkpoints, hearing notices, requeueing with
//! the resume point, recording lost work, what is bought, where, when it is released, noticing
//! that a node is gone — is the control plane's own loops (recovery, scheduling, capacity).
//!
//! The `cheapest-spot-failover` baseline models SkyPilot's managed jobs, which have no agent on
//! the node and do not pass a termination notice to the job (skypilot-org/skypilot#5041): its
//! agents do not watch for notices and its recovery loop does not read the clouds' event
//! streams, so a preempted job is found when its instance is gone and resumes from its last
//! periodic checkpoint. `--baseline-hears-notices` gives it spotplane's agents instead, which
//! leaves only the buying policies to compare.
//!
//! Cost is every node's price in force times the time it was held (bought to terminated); the
//! on-demand equivalent is the same node-hours at the same capacity's on-demand price. Work
//! kept is what replicas ran minus what was lost; cost per GPU-hour of work kept compares
//! policies that got different amounts done in the same span.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use spotplane_core::job::{CheckpointSpec, JobSpec};
use spotplane_core::shape::GpuShape;
use spotplane_core::{Cloud, JobId, JobState, NodeState};
use spotplane_providers::clock::{Clock as _, ManualClock};
use spotplane_providers::config::ProviderConfig;
use spotplane_providers::registry::{self, BuildContext, Providers};
use spotplane_providers::sim::{SimConfig, SimMarket};

use crate::config::{Config, DatabaseConfig};
use crate::lab::simagent::SimAgents;
use crate::metrics::Metrics;
use crate::planner::PlanPolicy;
use crate::reconcile::capacity::{CapacityLoop, CapacitySettings};
use crate::reconcile::recovery::RecoveryLoop;
use crate::reconcile::scheduling::SchedulerLoop;
use crate::store::{NewJob, NewTeam, Store, SubmitOutcome};

/// One job of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceJob {
    pub arrival_s: f64,
    pub gpus: u32,
    pub work_hours: f64,
}

/// The jobs a replay submits.
#[derive(Debug, Clone, PartialEq)]
pub enum JobStream {
    /// A Gavel trace file.
    File(PathBuf),
    /// The one shipped with the project ([`SHIPPED_JOBS`]).
    Shipped,
}

/// The job stream shipped with the project: the first 400 jobs of Philly cluster 0e4a51 from
/// the Gavel traces (MIT; `data/jobs/philly-gavel/`, with its source and licence), what the
/// demo takes from the full file.
pub const SHIPPED_JOBS: &str =
    include_str!("../../../data/jobs/philly-gavel/0e4a51-first-400.trace");

impl JobStream {
    /// The stream's jobs, sorted by arrival.
    pub fn load(&self, seconds_per_step: f64) -> anyhow::Result<Vec<TraceJob>> {
        match self {
            JobStream::File(p) => load_trace(p, seconds_per_step),
            JobStream::Shipped => parse_trace(
                SHIPPED_JOBS,
                "data/jobs/philly-gavel/0e4a51-first-400.trace",
                seconds_per_step,
            ),
        }
    }

    /// Where the jobs come from, in words.
    pub fn describe(&self) -> String {
        match self {
            JobStream::File(p) => p.display().to_string(),
            JobStream::Shipped => {
                "shipped: Philly cluster 0e4a51, first 400 jobs (Gavel traces, MIT)".to_owned()
            }
        }
    }
}

/// Reads a Gavel trace: tab-separated `job_type, command, num_steps_arg, needs_data_dir,
/// total_steps, arrival_time, scale_factor`. Errors name the file and line.
pub fn load_trace(path: &Path, seconds_per_step: f64) -> anyhow::Result<Vec<TraceJob>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_trace(&text, &path.display().to_string(), seconds_per_step)
}

/// Parses a Gavel trace read from `origin` (named in errors, with the line).
pub fn parse_trace(
    text: &str,
    origin: &str,
    seconds_per_step: f64,
) -> anyhow::Result<Vec<TraceJob>> {
    let mut jobs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let bad = |what: &str| anyhow::anyhow!("{origin}:{}: {what}", i + 1);
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
    /// GPU-hours of nodes held.
    pub gpu_hours: f64,
    /// GPU-hours replicas ran (the work, including what was later lost).
    pub run_gpu_hours: f64,
    /// Lost work as a share of the GPU time replicas ran, in percent.
    pub lost_work_pct: f64,
    /// GPU-hours of work kept: run minus lost.
    pub useful_gpu_hours: f64,
    /// What an hour of work kept cost: total cost over `useful_gpu_hours`.
    pub usd_per_useful_gpu_hour: f64,
    pub mean_queue_delay_s: f64,
    /// Runs ended by a notice or a lost node.
    pub preemptions: u64,
    /// Runs after a preemption.
    pub recoveries: u64,
    /// Nodes whose agent saw a termination notice.
    pub notices: u64,
    /// Notice checkpoints that missed their deadline.
    pub missed_checkpoints: u64,
    /// From a notice to a replica's checkpoint being durable.
    pub notice_to_durable_s: Percentiles,
    /// From a preemption (drain or loss) to the job running again.
    pub notice_to_resumed_s: Percentiles,
    pub nodes_bought: u64,
    /// Of those, on-demand nodes.
    pub on_demand_nodes: u64,
    /// Nodes drained because their work fit on other nodes or on a cheaper one.
    pub consolidations: u64,
    pub wall_seconds: f64,
}

/// How to replay.
#[derive(Debug, Clone)]
pub struct ReplaySpec {
    pub trace: JobStream,
    pub days: f64,
    pub start: DateTime<Utc>,
    pub step: Duration,
    /// The market the simulated clouds replay.
    pub market: SimMarket,
    /// Jobs at most (the busiest Philly clusters submit thousands).
    pub max_jobs: usize,
    /// GPU seconds one trace step takes.
    pub seconds_per_step: f64,
    /// Let spotplane's policy consolidate (drain nodes whose work fits elsewhere or on a
    /// cheaper node); the baselines never do.
    pub consolidation: bool,
    /// Give the `cheapest-spot-failover` baseline spotplane's agents and event streams, which
    /// checkpoint on a notice (SkyPilot has neither): isolates what the buying policy does.
    pub baseline_hears_notices: bool,
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
    arrival: DateTime<Utc>,
    deadline: DateTime<Utc>,
}

/// Replays one policy.
pub async fn replay(spec: &ReplaySpec, policy_name: &str) -> anyhow::Result<ReplayOutcome> {
    let policy = policy_by_name(policy_name)
        .ok_or_else(|| anyhow::anyhow!("unknown policy {policy_name:?}; one of {POLICIES:?}"))?;
    let wall = std::time::Instant::now();
    let scratch = tempfile::tempdir().context("a scratch folder")?;
    let mut world = World::in_folder(spec, policy, scratch.path()).await?;
    while !world.done() {
        world.step().await?;
    }
    world.outcome(policy_name, wall).await
}

/// The simulated world a replay (and `spotplane demo`) runs: the three simulated clouds, the
/// trace's jobs arriving for three teams, in-process agents on every node, and the control
/// plane's recovery, scheduling and capacity loops, all on one manual clock moved a step at a
/// time.
pub struct World {
    pub store: Store,
    pub clock: ManualClock,
    pub providers: Arc<Providers>,
    sched: SchedulerLoop,
    cap: CapacityLoop,
    recovery: RecoveryLoop,
    agents: SimAgents,
    arrivals: Vec<TraceJob>,
    next: usize,
    teams: Vec<(String, String)>,
    /// By id (the order jobs were submitted in), so the outcome reads them in the same order
    /// every run.
    runs: BTreeMap<JobId, Run>,
    objects: PathBuf,
    start: DateTime<Utc>,
    step: Duration,
    end: DateTime<Utc>,
    /// Nodes the capacity loop drained for consolidation.
    consolidations: u64,
    /// Give some one-GPU jobs a MIG slice or a GPU share instead (the demo shows every way to
    /// use a GPU; the replays keep Philly's whole GPUs).
    mixed_shapes: bool,
    /// Where the loops' passes are recorded, as the runner records them in `serve` (the live
    /// demo's `/metrics`).
    metrics: Option<Metrics>,
}

impl World {
    /// A world on the embedded default configuration with its store (SQLite) and checkpoints
    /// in `folder`, its clock at the spec's start.
    pub async fn in_folder(
        spec: &ReplaySpec,
        policy: PlanPolicy,
        folder: &Path,
    ) -> anyhow::Result<World> {
        let mut config = Config::embedded_default()?;
        config.database = DatabaseConfig {
            url: format!("sqlite://{}", folder.join("replay.sqlite").display()),
            ..config.database
        };
        let store = Store::connect(&config.database, Metrics::new()).await?;
        store.migrate().await?;
        let clock = ManualClock::new(spec.start);
        World::new(store, clock, &config, spec, policy, &folder.join("objects")).await
    }

    /// Sets up the world on `store` (migrated, empty), with checkpoints under `objects`.
    pub async fn new(
        store: Store,
        clock: ManualClock,
        config: &Config,
        spec: &ReplaySpec,
        policy: PlanPolicy,
        objects: &Path,
    ) -> anyhow::Result<World> {
        let trace = spec.trace.load(spec.seconds_per_step)?;
        let horizon = spec.days * 86_400.0;
        let arrivals: Vec<TraceJob> = trace
            .into_iter()
            .filter(|j| j.arrival_s < horizon)
            .take(spec.max_jobs)
            .collect();
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
                    sim_market: spec.market.clone(),
                    catalog_dir: None,
                    // Recorded where the store's operations are (the live demo's `/metrics`).
                    observer: Some(store.metrics().provider_observer()),
                    sim_state_dir: None,
                },
            )
            .await?,
        );
        let mut teams = Vec::new();
        for t in ["vision", "nlp", "recsys"] {
            let team = match store
                .create_team(
                    NewTeam {
                        name: t.parse()?,
                        weight: 1.0,
                        cohort: None,
                        quotas: Default::default(),
                    },
                    spec.start,
                )
                .await
            {
                Ok(team) => team,
                Err(crate::store::StoreError::Conflict(_)) => store.get_team(t).await?,
                Err(e) => return Err(e.into()),
            };
            teams.push((t.to_owned(), team.id));
        }
        let sched = SchedulerLoop::new(store.clone(), shared.clone(), config.scheduler.clone());
        let mut settings = CapacitySettings {
            cluster: "replay".into(),
            ..config.capacity.settings()
        };
        settings.planner.policy = policy;
        // Repacking is spotplane's; the baselines model SkyPilot's managed jobs (one cluster per
        // job, never repacked) and a plain on-demand fleet.
        settings.consolidation.enabled &= spec.consolidation && policy == PlanPolicy::ExpectedCost;
        let cap = CapacityLoop::new(
            store.clone(),
            Arc::clone(&providers),
            shared.clone(),
            settings,
        );
        std::fs::create_dir_all(objects)
            .with_context(|| format!("creating {}", objects.display()))?;
        let objects = std::fs::canonicalize(objects)?;
        // The SkyPilot baseline has no agent on its nodes and no subscription to the clouds'
        // event streams: a preemption is found when the instance is gone, and the job resumes
        // from its own last periodic checkpoint (skypilot-org/skypilot#5041: notices are not
        // passed to the job).
        let notices = policy != PlanPolicy::CheapestSpot || spec.baseline_hears_notices;
        let root = format!("file://{}", objects.display());
        let mut agents = SimAgents::new(store.clone(), Arc::clone(&providers), &root);
        if !notices {
            agents = agents.without_notices();
        }
        let recovery = RecoveryLoop::new(
            store.clone(),
            shared,
            notices.then(|| Arc::clone(&providers)),
            config.recovery.settings(),
            root,
        );
        Ok(World {
            store,
            clock,
            providers,
            sched,
            cap,
            recovery,
            agents,
            arrivals,
            next: 0,
            teams,
            runs: BTreeMap::new(),
            objects,
            start: spec.start,
            step: spec.step,
            end: spec.start + Duration::seconds(horizon as i64),
            consolidations: 0,
            mixed_shapes: false,
            metrics: None,
        })
    }

    /// One one-GPU job in three asks for a `3g.40gb` MIG slice, one in three for half a GPU.
    pub fn with_mixed_shapes(mut self) -> Self {
        self.mixed_shapes = true;
        self
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Goes on from `t` (a restarted demo): the clock moves there and arrivals before it are
    /// skipped (they were submitted by the earlier run).
    pub fn resume_at(&mut self, t: DateTime<Utc>) {
        if t <= self.clock.now() {
            return;
        }
        self.clock.set(t);
        while self.next < self.arrivals.len()
            && self.start
                + Duration::milliseconds((self.arrivals[self.next].arrival_s * 1000.0) as i64)
                <= t
        {
            self.next += 1;
        }
        self.end = self.end.max(t + Duration::days(7));
    }

    pub fn done(&self) -> bool {
        self.clock.now() >= self.end
    }

    /// One step: arrivals, the agents, a recovery round, a scheduling cycle, a capacity round;
    /// then the clock moves on.
    pub async fn step(&mut self) -> anyhow::Result<()> {
        let now = self.clock.now();
        while self.next < self.arrivals.len()
            && self.start
                + Duration::milliseconds((self.arrivals[self.next].arrival_s * 1000.0) as i64)
                <= now
        {
            self.submit(now).await?;
        }
        self.agents.tick(now, self.step).await?;
        let at = std::time::Instant::now();
        let r = self.recovery.run_once().await?;
        self.record("recovery", r, at);
        let at = std::time::Instant::now();
        let r = self.sched.run_once().await?;
        self.record("scheduling", r, at);
        let at = std::time::Instant::now();
        let c = self.cap.run_once().await?;
        self.consolidations += c.consolidated as u64;
        self.record("capacity", c, at);
        self.clock.advance(self.step);
        Ok(())
    }

    /// Records the world's loops into `metrics`, as `serve`'s runner does; this world leads
    /// the scheduling round.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        metrics.set_leader("scheduling", true);
        self.metrics = Some(metrics);
        self
    }

    fn record(
        &self,
        step: &'static str,
        report: impl crate::reconcile::runner::Report + 'static,
        at: std::time::Instant,
    ) {
        if let Some(m) = &self.metrics {
            m.observe_pass(
                step,
                &crate::reconcile::runner::StepOutcome::Done(Box::new(report)),
                at.elapsed(),
            );
        }
    }

    async fn submit(&mut self, now: DateTime<Utc>) -> anyhow::Result<()> {
        let a = self.arrivals[self.next].clone();
        let (team_name, team_id) = self.teams[self.next % self.teams.len()].clone();
        let shape = if a.gpus <= 8 {
            (1, a.gpus)
        } else {
            (a.gpus.div_ceil(8), 8)
        };
        let gpu_shape = match (self.mixed_shapes, shape, self.next % 3) {
            (true, (1, 1), 1) => GpuShape::Mig {
                profile: "3g.40gb".parse().map_err(|e| anyhow::anyhow!("{e}"))?,
                models: vec![],
            },
            (true, (1, 1), 2) => GpuShape::Shared {
                gpu_milli: 500,
                models: vec![],
            },
            _ => GpuShape::Whole {
                gpus: shape.1,
                models: vec![],
            },
        };
        let mut js = JobSpec::new(
            format!("philly-{}", self.next),
            gpu_shape,
            vec!["train".into()],
        );
        js.replicas = shape.0;
        js.work_hours = Some(a.work_hours.max(1.0 / 60.0));
        let id = JobId(crate::store::new_uuid(now));
        js.checkpoint = Some(CheckpointSpec {
            uri: format!("file://{}/jobs/{id}", self.objects.display()),
            interval_s: 1800,
        });
        let deadline = now + Duration::seconds((a.work_hours * 1.5 * 3600.0 + 7200.0) as i64);
        js.deadline = Some(deadline);
        match self
            .store
            .submit_job(
                NewJob {
                    id,
                    team_id,
                    team: team_name.parse()?,
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
        self.agents.set_work(id, a.work_hours.max(1.0 / 60.0));
        self.runs.insert(
            id,
            Run {
                arrival: now,
                deadline,
            },
        );
        self.next += 1;
        Ok(())
    }

    /// What the world came to so far.
    pub async fn outcome(
        &self,
        policy_name: &str,
        wall: std::time::Instant,
    ) -> anyhow::Result<ReplayOutcome> {
        let store = &self.store;
        let agents = &self.agents;
        let runs = &self.runs;
        let end_now = self.clock.now();
        let nodes = store.list_nodes(&NodeState::ALL).await?;
        let spend = crate::finance::held::held_spend(&nodes, end_now);
        let history = JobHistory::read(store, runs.keys().copied()).await?;
        let misses = runs
            .iter()
            .filter(|(id, r)| {
                history
                    .finished
                    .get(id)
                    .map_or(end_now > r.deadline, |f| *f > r.deadline)
            })
            .count();
        let delays: Vec<f64> = runs
            .iter()
            .filter_map(|(id, r)| {
                history
                    .first_running
                    .get(id)
                    .map(|s| (*s - r.arrival).num_seconds() as f64)
            })
            .collect();
        let run_gpu_hours = agents.stats.gpu_seconds / 3600.0;
        let lost_gpu_hours = history.lost_gpu_seconds as f64 / 3600.0;
        let mut durable = agents.stats.notice_to_durable_s.clone();
        let mut resumed = history.notice_to_resumed_s.clone();
        Ok(ReplayOutcome {
            policy: policy_name.to_owned(),
            total_cost_usd: spend.cost_usd,
            ondemand_equivalent_usd: spend.ondemand_equivalent_usd,
            saving_pct: spend.saving_pct,
            jobs_submitted: runs.len(),
            jobs_finished: history.finished.len(),
            deadline_misses: misses,
            lost_gpu_hours,
            gpu_hours: spend.node_gpu_hours,
            run_gpu_hours,
            lost_work_pct: if run_gpu_hours > 0.0 {
                100.0 * lost_gpu_hours / run_gpu_hours
            } else {
                0.0
            },
            useful_gpu_hours: run_gpu_hours - lost_gpu_hours,
            usd_per_useful_gpu_hour: if run_gpu_hours > lost_gpu_hours {
                spend.cost_usd / (run_gpu_hours - lost_gpu_hours)
            } else {
                0.0
            },
            mean_queue_delay_s: if delays.is_empty() {
                0.0
            } else {
                delays.iter().sum::<f64>() / delays.len() as f64
            },
            preemptions: history.preemptions,
            recoveries: history.recoveries,
            notices: agents.stats.notices,
            missed_checkpoints: agents.stats.missed,
            notice_to_durable_s: Percentiles::of(&mut durable),
            notice_to_resumed_s: Percentiles::of(&mut resumed),
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
            consolidations: self.consolidations,
            wall_seconds: wall.elapsed().as_secs_f64(),
        })
    }
}

/// Median, 99th percentile and count of a sample (seconds).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
}

impl Percentiles {
    pub fn of(v: &mut [f64]) -> Percentiles {
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
        Percentiles {
            count: v.len(),
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

/// What the jobs' histories say: when each first ran and finished, preemptions (a run ended by
/// a notice or a lost node), recoveries (a later run after one), the time from a preemption to
/// the job running again, and the work lost.
#[derive(Debug, Default)]
pub struct JobHistory {
    pub first_running: HashMap<JobId, DateTime<Utc>>,
    pub finished: HashMap<JobId, DateTime<Utc>>,
    pub preemptions: u64,
    pub recoveries: u64,
    pub notice_to_resumed_s: Vec<f64>,
    pub lost_gpu_seconds: i64,
}

impl JobHistory {
    pub async fn read(
        store: &Store,
        jobs: impl IntoIterator<Item = JobId>,
    ) -> anyhow::Result<JobHistory> {
        let mut h = JobHistory::default();
        for id in jobs {
            let job = store.get_job(id, None).await?;
            h.lost_gpu_seconds += job.lost_gpu_seconds;
            if job.state == JobState::Succeeded
                && let Some(f) = job.finished_at
            {
                h.finished.insert(id, f);
            }
            let mut after = None;
            let mut preempted_at: Option<DateTime<Utc>> = None;
            loop {
                let page = store.job_events(id, None, after, 500).await?;
                if page.items.is_empty() {
                    break;
                }
                for e in &page.items {
                    after = Some(e.seq);
                    match e.to_state {
                        Some(JobState::Running) => {
                            h.first_running.entry(id).or_insert(e.at);
                            if let Some(p) = preempted_at.take() {
                                h.recoveries += 1;
                                h.notice_to_resumed_s
                                    .push((e.at - p).num_milliseconds() as f64 / 1000.0);
                            }
                        }
                        Some(JobState::Draining | JobState::Lost) if preempted_at.is_none() => {
                            h.preemptions += 1;
                            preempted_at = Some(e.at);
                        }
                        _ => {}
                    }
                }
                if page.next_cursor.is_none() {
                    break;
                }
            }
        }
        Ok(h)
    }
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

    /// A replay of `trace` from 2026-07-01 over the shared traces.
    fn spec_of(trace: PathBuf, days: f64, step_s: i64) -> ReplaySpec {
        ReplaySpec {
            trace: JobStream::File(trace),
            days,
            start: "2026-07-01T00:00:00Z".parse().expect("time"),
            step: Duration::seconds(step_s),
            market: SimMarket::Recorded(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"),
            ),
            max_jobs: 10,
            seconds_per_step: 0.1,
            consolidation: true,
            baseline_hears_notices: false,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_policy_finishes_short_jobs_and_spot_costs_less() {
        let dir = tempfile::tempdir().expect("dir");
        let spec = spec_of(trace(dir.path()), 0.125, 120);
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

    /// A replay of `spec` under spotplane's policy on a calm market: the simulated clouds take
    /// nothing back, so what the test sees is the consolidation, not where the traces happen to
    /// preempt the pools the catalog's prices lead to.
    async fn calm_replay(spec: &ReplaySpec) -> ReplayOutcome {
        let scratch = tempfile::tempdir().expect("scratch");
        let policy = policy_by_name("spotplane").expect("policy");
        let mut world = World::in_folder(spec, policy, scratch.path())
            .await
            .expect("world");
        for cloud in Cloud::ALL {
            world
                .providers
                .sim(cloud)
                .expect("a simulated cloud")
                .set_calm(true);
        }
        while !world.done() {
            world.step().await.expect("step");
        }
        world
            .outcome("spotplane", std::time::Instant::now())
            .await
            .expect("outcome")
    }

    /// A seven-GPU job and a one-GPU job share an eight-GPU node; once the big one is done the
    /// small one is alone on it for hours. Consolidation moves it (checkpoint, requeue, resume)
    /// to a one-GPU node and gives the big one back; without it the big node is kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn consolidation_moves_a_lone_job_off_a_big_node_and_saves_money() {
        let dir = tempfile::tempdir().expect("dir");
        let p = dir.path().join("t.trace");
        let line = |steps: u32, at: u32, gpus: u32| {
            format!(
                "ResNet-18 (batch size 64)\tcd x && python3 main.py\t--num_steps\t1\t{steps}\t{at}.000000\t{gpus}\n"
            )
        };
        // 20 minutes on seven GPUs; ten minutes later, when the node bought for them runs,
        // three hours on one (placed on the eighth GPU there).
        std::fs::write(&p, [line(12_000, 0, 7), line(108_000, 600, 1)].concat()).expect("trace");
        let spec = |consolidation| ReplaySpec {
            consolidation,
            ..spec_of(p.clone(), 0.25, 60)
        };
        let with = calm_replay(&spec(true)).await;
        let without = calm_replay(&spec(false)).await;
        for o in [&with, &without] {
            assert_eq!((o.jobs_submitted, o.jobs_finished), (2, 2), "{o:?}");
            assert_eq!(o.deadline_misses, 0, "{o:?}");
            // A calm market: no cloud took a node back (a consolidation's drain counts among
            // `preemptions`, a notice does not).
            assert_eq!(o.notices, 0, "{o:?}");
        }
        assert_eq!(without.consolidations, 0, "{without:?}");
        assert!(with.consolidations >= 1, "{with:?}");
        // Moving lost no work: the job checkpointed on the drain and resumed from it.
        assert!(with.lost_gpu_hours < 1e-9, "{with:?}");
        assert!(
            with.total_cost_usd < without.total_cost_usd,
            "with {with:?}\nwithout {without:?}"
        );
    }

    /// A trace of one job of two hours on one GPU, arriving at once.
    fn two_hour_job(dir: &Path) -> PathBuf {
        let p = dir.join("t.trace");
        std::fs::write(
            &p,
            "ResNet-18 (batch size 64)\tcd x && python3 main.py\t--num_steps\t1\t72000\t0.000000\t1\n",
        )
        .expect("trace");
        p
    }

    /// The cloud takes the node of a two-hour job about 45 minutes in (it checkpoints every
    /// 30). spotplane's agent hears the notice and checkpoints within it: nothing is lost. The
    /// SkyPilot-style baseline has no agent hearing notices: the job resumes from its
    /// 30-minute checkpoint and the quarter hour since is lost (and more if the traces take
    /// its replacement too), which also costs more per hour of work kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_preemption_costs_the_baseline_the_work_since_its_checkpoint_and_spotplane_none() {
        let dir = tempfile::tempdir().expect("dir");
        let p = two_hour_job(dir.path());
        let spec = spec_of(p, 0.25, 60);
        let mut out = Vec::new();
        for name in ["cheapest-spot-failover", "spotplane"] {
            let scratch = tempfile::tempdir().expect("scratch");
            let policy = policy_by_name(name).expect("policy");
            let mut world = World::in_folder(&spec, policy, scratch.path())
                .await
                .expect("world");
            let mut running_for = 0;
            let mut taken = false;
            while !world.done() {
                world.step().await.expect("step");
                if taken {
                    continue;
                }
                let ready = world
                    .store
                    .list_nodes(&[NodeState::Ready])
                    .await
                    .expect("nodes");
                if ready.is_empty() {
                    continue;
                }
                running_for += 1;
                if running_for == 45 {
                    let n = &ready[0];
                    let sim = world.providers.sim(n.cloud).expect("a simulated cloud");
                    let pid = n.provider_instance_id.as_deref().expect("an instance");
                    assert!(sim.preempt_now(pid), "{name}: the node was running");
                    taken = true;
                }
            }
            assert!(taken, "{name}: the job never ran");
            let o = world
                .outcome(name, std::time::Instant::now())
                .await
                .expect("outcome");
            // The node taken, and any the traces take from the replacement.
            assert!(o.jobs_finished == 1 && o.preemptions >= 1, "{o:?}");
            out.push(o);
        }
        let (baseline, spotplane) = (&out[0], &out[1]);
        assert!(spotplane.lost_gpu_hours < 1e-9, "{spotplane:?}");
        assert!(
            baseline.lost_gpu_hours >= 0.1,
            "at least the ~15 minutes since the last checkpoint: {baseline:?}"
        );
        assert!(
            baseline.run_gpu_hours > spotplane.run_gpu_hours + 0.1,
            "the lost work was done again: {baseline:?}\n{spotplane:?}"
        );
        assert!(
            spotplane.usd_per_useful_gpu_hour < baseline.usd_per_useful_gpu_hour,
            "{baseline:?}\n{spotplane:?}"
        );
    }

    /// A deadline job (two hours of work, a deadline 5 hours out, checkpoints every 30
    /// minutes) loses its node about 45 minutes in. Requeued, it is demand again with its
    /// checkpoint in the region of the node taken, and the planner's multi-pool deadline model
    /// chooses where it resumes — stay, move or on-demand — from the offers and pools it sees.
    /// Whatever it chose, the job resumes from the notice checkpoint, loses nothing, and meets
    /// its deadline.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_preempted_deadline_job_resumes_where_the_pools_model_says_and_meets_its_deadline() {
        let dir = tempfile::tempdir().expect("dir");
        let p = two_hour_job(dir.path());
        let spec = spec_of(p, 0.3, 60);
        let scratch = tempfile::tempdir().expect("scratch");
        let policy = policy_by_name("spotplane").expect("policy");
        let mut world = World::in_folder(&spec, policy, scratch.path())
            .await
            .expect("world");
        let (mut running_for, mut taken) = (0, None);
        while !world.done() {
            world.step().await.expect("step");
            if taken.is_some() {
                continue;
            }
            let ready = world
                .store
                .list_nodes(&[NodeState::Ready])
                .await
                .expect("nodes");
            let Some(n) = ready.first() else { continue };
            running_for += 1;
            if running_for == 45 {
                let sim = world.providers.sim(n.cloud).expect("a simulated cloud");
                let pid = n.provider_instance_id.as_deref().expect("an instance");
                assert!(sim.preempt_now(pid), "the node was running");
                taken = Some(n.region.clone());
            }
        }
        let region = taken.expect("the job ran");
        let job = *world.runs.keys().next().expect("a job");
        // The planner saw the checkpoint where the job last ran, and its size.
        let (at, bytes) = world
            .store
            .checkpoint_location(job)
            .await
            .expect("store")
            .expect("a durable checkpoint");
        assert!(bytes.is_some_and(|b| b > 0), "{bytes:?}");
        let nodes = world
            .store
            .list_nodes(&NodeState::ALL)
            .await
            .expect("nodes");
        assert!(nodes.len() >= 2, "a node after the one taken: {nodes:?}");
        // The checkpoint now is where the job last ran: the region of the taken node if it
        // stayed, another if it moved.
        let last = nodes.iter().max_by_key(|n| n.created_at).expect("nodes");
        assert!(
            at == last.region || at == region,
            "{at} vs {} / {region}",
            last.region
        );
        let o = world
            .outcome("spotplane", std::time::Instant::now())
            .await
            .expect("outcome");
        assert_eq!((o.jobs_finished, o.deadline_misses), (1, 0), "{o:?}");
        assert!(o.lost_gpu_hours < 1e-9, "{o:?}");
    }

    /// What one run of a world came to: its outcome (less the wall time), every node bought in
    /// the order it was bought, and every job's history in the order the jobs arrived; none of
    /// it names an id, whose random bits differ from run to run.
    async fn run_record(spec: &ReplaySpec) -> (ReplayOutcome, Vec<String>, Vec<Vec<String>>) {
        let scratch = tempfile::tempdir().expect("scratch");
        let mut world = World::in_folder(spec, PlanPolicy::ExpectedCost, scratch.path())
            .await
            .expect("world")
            .with_mixed_shapes();
        while !world.done() {
            world.step().await.expect("step");
        }
        let outcome = ReplayOutcome {
            wall_seconds: 0.0,
            ..world
                .outcome("spotplane", std::time::Instant::now())
                .await
                .expect("outcome")
        };
        let mut nodes = world
            .store
            .list_nodes(&NodeState::ALL)
            .await
            .expect("nodes");
        nodes.reverse();
        let nodes = nodes
            .iter()
            .map(|n| {
                format!(
                    "{} {} {} {} {} {:?} {:?}",
                    n.cloud,
                    n.zone,
                    n.instance_type,
                    n.market,
                    n.state,
                    n.ready_at,
                    n.terminated_at
                )
            })
            .collect();
        let mut jobs = Vec::new();
        for id in world.runs.keys() {
            let events = world
                .store
                .job_events(*id, None, None, 10_000)
                .await
                .expect("events");
            jobs.push(
                events
                    .items
                    .iter()
                    .map(|e| format!("{} {}", e.at.to_rfc3339(), e.kind))
                    .collect(),
            );
        }
        (outcome, nodes, jobs)
    }

    /// The demo's world (MIG slices and GPU shares besides whole GPUs, on the market shipped in
    /// the binary, where equally good nodes are common) comes out the same every time it runs:
    /// nothing in it depends on the wall clock, a hash seed or the random bits of an id.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mixed_shape_world_on_the_shipped_market_comes_out_the_same_every_run() {
        let spec = ReplaySpec {
            trace: JobStream::Shipped,
            days: 1.0 / 24.0,
            start: "2026-07-01T00:00:00Z".parse().expect("time"),
            step: Duration::seconds(30),
            market: SimMarket::Shipped,
            max_jobs: 400,
            seconds_per_step: 0.1,
            consolidation: true,
            baseline_hears_notices: false,
        };
        let first = run_record(&spec).await;
        let second = run_record(&spec).await;
        assert!(
            first.0.jobs_submitted >= 8 && first.0.preemptions >= 1,
            "the hour has work and preemptions to differ in: {:?}",
            first.0
        );
        assert_eq!(first.1, second.1, "the nodes bought differ");
        assert_eq!(first.2, second.2, "the jobs' histories differ");
        assert_eq!(first.0, second.0, "the outcomes differ");
    }
}
