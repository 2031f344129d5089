//! In-process agents for simulated nodes, for `spotplane demo` and `spotplane replay`.
//!
//! Each one speaks the agent protocol through the store's agent operations — the same ones
//! `/v1/agent/register`, `/heartbeat`, `/checkpoints` call — so the control plane cannot tell
//! it from a real agent. It registers with a bootstrap token once its node is up, reports its
//! replicas every tick, reads the termination notice from its simulated cloud's metadata (as a
//! real agent reads IMDS, `preempted` or Scheduled Events), and carries out commands. Workloads
//! are simulated: a replica makes one hour of progress per hour of run time until its job's
//! `work_hours`; a checkpoint takes `checkpoint_time` and writes the progress (and a manifest)
//! into the local object store folder, from where a resumed replica reads it back. A node the
//! cloud takes goes silent, as a real one would.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use spotplane_core::agent::{
    AppliedMigLayout, CheckpointManifest, CheckpointOutcome, CheckpointReport, CheckpointTrigger,
    Command, CommandKind, CommandResult, ContainerEngineInfo, GpuTelemetry, Heartbeat,
    NoticeAction, NoticeSource, PROTOCOL_VERSION, RegisterRequest, ReplicaPhase, ReplicaStatus,
    TerminationNotice,
};
use spotplane_core::shape::GpuShape;
use spotplane_core::{CheckpointId, Cloud, CommandId, JobId, NodeId, NodeState};
use spotplane_providers::registry::Providers;

use crate::store::{
    AgentCaller, LogRetention, NewLogChunk, Registration, Store, StoreError, new_uuid,
};

/// What the simulated agents saw, for the demo's and the replay's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SimStats {
    /// Seconds from a notice to each replica's checkpoint being durable.
    pub notice_to_durable_s: Vec<f64>,
    /// Replica checkpoints that missed their notice's deadline.
    pub missed: u64,
    /// Notices seen (one per node).
    pub notices: u64,
    /// GPU-seconds replicas ran.
    pub gpu_seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SimState {
    progress_hours: f64,
}

#[derive(Debug)]
struct Replica {
    attempt: u32,
    /// The GPU indices it runs on (a MIG slice's or a share's parent GPU).
    devices: Vec<u32>,
    /// Its MIG profile, for a MIG slice.
    mig: Option<String>,
    /// GPUs it holds: whole GPUs, or the share of one (a MIG slice's compute, a `gpu_milli`).
    gpus: f64,
    phase: ReplicaPhase,
    exit_code: Option<i32>,
    progress_hours: f64,
    work_hours: f64,
    uri: String,
    /// A checkpoint in flight: id, trigger, started, ready at, deadline, command to answer.
    checkpoint: Option<InFlight>,
    /// Stop once the checkpoint in flight is done (a drain).
    stop_after: bool,
    /// Bytes of simulated output written so far (the next line's offset).
    output_at: u64,
    /// Its exit has been written to its output (the last line).
    output_closed: bool,
}

/// Appends a line of a simulated replica's output: what a workload would print, as a real
/// agent ships it (`POST /v1/agent/logs`), so `spotplane job logs` reads the demo's jobs too.
fn say(
    out: &mut Vec<(NodeId, NewLogChunk)>,
    node: NodeId,
    (job, replica): (JobId, u32),
    r: &mut Replica,
    line: String,
) {
    if r.output_closed {
        return;
    }
    let data = format!("[simulated] {line}\n").into_bytes();
    let offset = r.output_at;
    r.output_at += data.len() as u64;
    let eof = r.phase == ReplicaPhase::Exited;
    r.output_closed = eof;
    out.push((
        node,
        NewLogChunk {
            job_id: job,
            replica,
            attempt: r.attempt,
            offset,
            data,
            eof,
        },
    ));
}

/// Writes the exit of every replica of `a` that exited since it was last looked at.
fn say_exits(out: &mut Vec<(NodeId, NewLogChunk)>, node: NodeId, a: &mut Agent) {
    for (key, r) in a.replicas.iter_mut() {
        if r.phase == ReplicaPhase::Exited && !r.output_closed {
            let code = r.exit_code.unwrap_or(-1);
            let line = format!(
                "exited with status {code} after {:.2} of {:.2} hours of work",
                r.progress_hours.min(r.work_hours),
                r.work_hours
            );
            say(out, node, *key, r, line);
        }
    }
}

#[derive(Debug, Clone)]
struct InFlight {
    id: CheckpointId,
    trigger: CheckpointTrigger,
    started: DateTime<Utc>,
    ready_at: DateTime<Utc>,
    deadline: Option<DateTime<Utc>>,
    command: Option<CommandId>,
    progress_hours: f64,
}

#[derive(Debug)]
struct Agent {
    cloud: Cloud,
    instance: String,
    /// The node's GPUs as the store has them (MIG layouts follow re-layouts).
    gpus: Vec<crate::model::Gpu>,
    replicas: BTreeMap<(JobId, u32), Replica>,
    notice: Option<TerminationNotice>,
    results: Vec<CommandResult>,
    seen: HashSet<CommandId>,
}

pub struct SimAgents {
    store: Store,
    providers: Arc<Providers>,
    /// `object_store.url`, which checkpoint reports are checked against.
    object_store: String,
    /// Work each job needs, per replica, in hours.
    work: HashMap<JobId, f64>,
    /// How long a checkpoint takes to become durable.
    pub checkpoint_time: Duration,
    agents: BTreeMap<NodeId, Agent>,
    pub stats: SimStats,
    /// Whether the agents watch their cloud's metadata service for termination notices. Off,
    /// a node's work runs until the cloud takes it, and what it did since its last checkpoint
    /// is lost: how jobs fare without an agent on the node (SkyPilot's managed jobs, which
    /// find a preemption by polling the cluster and resume from the job's own checkpoints).
    hears_notices: bool,
    /// Simulated output not yet stored, by node.
    output: Vec<(NodeId, NewLogChunk)>,
}

fn source(cloud: Cloud) -> NoticeSource {
    match cloud {
        Cloud::Aws => NoticeSource::AwsInstanceAction,
        Cloud::Gcp => NoticeSource::GcpPreempted,
        Cloud::Azure => NoticeSource::AzureScheduledEvent,
    }
}

/// A local path for a `file://` URI; other schemes are not for simulated agents.
fn local(uri: &str) -> Option<PathBuf> {
    uri.strip_prefix("file://").map(PathBuf::from)
}

impl SimAgents {
    pub fn new(store: Store, providers: Arc<Providers>, object_store: &str) -> Self {
        SimAgents {
            store,
            providers,
            object_store: object_store.to_owned(),
            work: HashMap::new(),
            checkpoint_time: Duration::seconds(20),
            agents: BTreeMap::new(),
            stats: SimStats::default(),
            hears_notices: true,
            output: Vec::new(),
        }
    }

    /// Agents that do not watch for termination notices (see [`SimAgents::hears_notices`]).
    pub fn without_notices(mut self) -> Self {
        self.hears_notices = false;
        self
    }

    /// Tells the agents how much work a job's replicas need (what a real workload knows).
    pub fn set_work(&mut self, job: JobId, hours: f64) {
        self.work.insert(job, hours);
    }

    /// One tick: `dt` of simulated time has passed since the last.
    pub async fn tick(&mut self, now: DateTime<Utc>, dt: Duration) -> Result<(), StoreError> {
        let live = self
            .store
            .list_nodes(&[NodeState::Booting, NodeState::Ready, NodeState::Draining])
            .await?;
        let mut present = HashSet::new();
        let mut last_words = Vec::new();
        for n in &live {
            let (Some(pid), Some(sim)) = (&n.provider_instance_id, self.providers.sim(n.cloud))
            else {
                continue;
            };
            let Some(inst) = sim.instance_by_name(pid) else {
                continue;
            };
            if inst.terminated_at.is_some_and(|t| t <= now) {
                // Taken since the last tick. A real agent polls every few seconds: if the cloud
                // gave notice, it saw it and used the window; play that out, then go silent.
                if inst.notice.is_some() && self.hears_notices && self.agents.contains_key(&n.id) {
                    last_words.push(n.id);
                }
                continue;
            }
            if inst.ready_at > now {
                continue;
            }
            present.insert(n.id);
            if !self.agents.contains_key(&n.id) {
                self.register(n.id, n.cloud, pid.clone(), now).await?;
            }
            if let Some(a) = self.agents.get_mut(&n.id) {
                a.gpus.clone_from(&n.gpus);
            }
        }
        for id in last_words {
            self.advance(id, now, dt).await?;
            self.heartbeat(id, now).await?;
        }
        // A node the cloud took is silent from now on.
        self.agents.retain(|id, _| present.contains(id));

        let ids: Vec<NodeId> = self.agents.keys().copied().collect();
        for id in ids {
            self.advance(id, now, dt).await?;
            let cmds = self.heartbeat(id, now).await?;
            for c in cmds {
                self.carry_out(id, c, now).await;
            }
        }
        self.flush_output(now).await
    }

    /// Stores the simulated output of this tick, as agents ship theirs.
    async fn flush_output(&mut self, now: DateTime<Utc>) -> Result<(), StoreError> {
        let mut by_node: BTreeMap<NodeId, Vec<NewLogChunk>> = BTreeMap::new();
        for (node, chunk) in self.output.drain(..) {
            by_node.entry(node).or_default().push(chunk);
        }
        for (node, chunks) in by_node {
            match self
                .store
                .record_logs(node, &chunks, LogRetention::default(), now)
                .await
            {
                // A replica the control plane has let go of already: nothing to keep.
                Ok(_) | Err(StoreError::NotFound(_) | StoreError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn register(
        &mut self,
        node: NodeId,
        cloud: Cloud,
        instance: String,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let secret = self
            .store
            .issue_agent_bootstrap(node, now + Duration::hours(1), now)
            .await?;
        let req = RegisterRequest {
            protocol_version: PROTOCOL_VERSION,
            node_id: node,
            agent_version: concat!("sim-", env!("CARGO_PKG_VERSION")).into(),
            // A host name, as a real node's would be: the instance's last path segment.
            hostname: instance.rsplit('/').next().unwrap_or(&instance).to_owned(),
            instance_id: Some(instance.clone()),
            cpu_milli: 0,
            memory_mib: 0,
            gpus: vec![],
            // A simulated node runs a simulated job's image as it runs its command: not at all.
            container_engine: Some(ContainerEngineInfo {
                kind: "simulated".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                cdi: true,
            }),
            address: None,
        };
        match self
            .store
            .register_agent(AgentCaller::Bootstrap(secret), &req, now)
            .await?
        {
            Registration::Registered { .. } => {}
            other => {
                tracing::warn!(%node, ?other, "simulated agent could not register");
                return Ok(());
            }
        }
        self.agents.insert(
            node,
            Agent {
                cloud,
                instance,
                gpus: Vec::new(),
                replicas: BTreeMap::new(),
                notice: None,
                results: Vec::new(),
                seen: HashSet::new(),
            },
        );
        Ok(())
    }

    /// Progress, the notice from the metadata service, checkpoints that finish.
    async fn advance(
        &mut self,
        node: NodeId,
        now: DateTime<Utc>,
        dt: Duration,
    ) -> Result<(), StoreError> {
        let Some(a) = self.agents.get_mut(&node) else {
            return Ok(());
        };
        let hours = dt.num_milliseconds() as f64 / 3_600_000.0;
        for r in a.replicas.values_mut() {
            if matches!(r.phase, ReplicaPhase::Running | ReplicaPhase::Checkpointing) {
                r.progress_hours += hours;
                self.stats.gpu_seconds += hours * 3600.0 * r.gpus;
                if r.progress_hours >= r.work_hours && r.checkpoint.is_none() {
                    r.phase = ReplicaPhase::Exited;
                    r.exit_code = Some(0);
                }
            }
        }
        // The metadata service: a notice once the cloud posts it; every replica checkpoints.
        let sim_notice = self
            .providers
            .sim(a.cloud)
            .filter(|_| self.hears_notices)
            .and_then(|s| s.notice(&a.instance));
        if let (Some(n), None) = (&sim_notice, &a.notice) {
            self.stats.notices += 1;
            // A real agent polls every few seconds: it sees the notice a second after it is
            // posted, which may be earlier than this tick.
            let seen = (n.posted_at + Duration::seconds(1)).min(now);
            let behind = (now - seen).num_milliseconds() as f64 / 3_600_000.0;
            a.notice = Some(TerminationNotice {
                source: source(a.cloud),
                action: match a.cloud {
                    Cloud::Aws => NoticeAction::Terminate,
                    Cloud::Gcp | Cloud::Azure => NoticeAction::Preempt,
                },
                deadline: Some(n.deadline),
                observed_at: seen,
                event_id: Some(n.event_id.clone()),
            });
            for r in a.replicas.values_mut() {
                if r.phase != ReplicaPhase::Exited && r.checkpoint.is_none() {
                    r.checkpoint = Some(InFlight {
                        id: CheckpointId::from_uuid(new_uuid(seen)),
                        trigger: CheckpointTrigger::Notice,
                        started: seen,
                        ready_at: seen + self.checkpoint_time,
                        deadline: Some(n.deadline),
                        command: None,
                        progress_hours: (r.progress_hours - behind).max(0.0),
                    });
                    r.phase = ReplicaPhase::Checkpointing;
                }
            }
            let deadline = n.deadline.to_rfc3339();
            for (key, r) in a.replicas.iter_mut() {
                if r.phase == ReplicaPhase::Checkpointing {
                    let line = format!(
                        "termination notice from the cloud: checkpointing before {deadline}"
                    );
                    say(&mut self.output, node, *key, r, line);
                }
            }
        }
        // Checkpoints that are done now.
        let notice_at = a.notice.as_ref().map(|n| n.observed_at);
        let mut reports = Vec::new();
        for ((job, replica), r) in a.replicas.iter_mut() {
            let Some(f) = r.checkpoint.clone().filter(|f| f.ready_at <= now) else {
                continue;
            };
            r.checkpoint = None;
            if r.phase == ReplicaPhase::Checkpointing {
                r.phase = ReplicaPhase::Running;
            }
            let in_time = f.deadline.is_none_or(|d| f.ready_at <= d);
            let report = write_checkpoint(*job, *replica, r.attempt, &r.uri, &f, in_time);
            let line = match report.outcome {
                CheckpointOutcome::Durable => format!(
                    "checkpoint {} durable at {:.2} of {:.2} hours of work",
                    f.id, f.progress_hours, r.work_hours
                ),
                _ => format!(
                    "checkpoint {} not durable: {}",
                    f.id,
                    report.message.as_deref().unwrap_or("failed")
                ),
            };
            say(&mut self.output, node, (*job, *replica), r, line);
            if r.stop_after {
                r.phase = ReplicaPhase::Exited;
                r.exit_code = Some(143);
            }
            if f.trigger == CheckpointTrigger::Notice {
                match (in_time, notice_at) {
                    (true, Some(at)) => self
                        .stats
                        .notice_to_durable_s
                        .push((f.ready_at - at).num_milliseconds() as f64 / 1000.0),
                    _ => self.stats.missed += 1,
                }
            }
            if let Some(cid) = f.command {
                a.results.push(CommandResult {
                    command_id: cid,
                    ok: report.outcome == CheckpointOutcome::Durable,
                    message: report.message.clone(),
                    manifest: report.manifest.clone(),
                    mig_layout: None,
                });
            }
            reports.push(report);
        }
        say_exits(&mut self.output, node, a);
        for report in reports {
            match self
                .store
                .record_checkpoint(node, &report, &self.object_store, now)
                .await
            {
                Ok(_) | Err(StoreError::NotFound(_) | StoreError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn heartbeat(
        &mut self,
        node: NodeId,
        now: DateTime<Utc>,
    ) -> Result<Vec<Command>, StoreError> {
        let Some(a) = self.agents.get_mut(&node) else {
            return Ok(Vec::new());
        };
        let hb = Heartbeat {
            node_id: node,
            sent_at: now,
            gpus: sim_telemetry(node, a, now),
            replicas: a
                .replicas
                .iter()
                .map(|((job, replica), r)| ReplicaStatus {
                    job_id: *job,
                    replica: *replica,
                    attempt: r.attempt,
                    phase: r.phase,
                    exit_code: r.exit_code,
                })
                .collect(),
            notice: a.notice.clone(),
            results: std::mem::take(&mut a.results),
        };
        match self.store.agent_heartbeat(node, &hb, now).await {
            Ok(cmds) => {
                // Exited replicas are reported until the control plane no longer wants them.
                Ok(cmds.into_iter().filter(|c| a.seen.insert(c.id)).collect())
            }
            Err(StoreError::Conflict(_) | StoreError::NotFound(_)) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    async fn carry_out(&mut self, node: NodeId, c: Command, now: DateTime<Utc>) {
        // What a started replica's workload is: the job's work, and how much GPU it holds.
        let (work, weight, mig) = match &c.kind {
            CommandKind::Start {
                job_id, devices, ..
            } => {
                let spec = self.store.get_job(*job_id, None).await.ok().map(|j| j.spec);
                let work = self
                    .work
                    .get(job_id)
                    .copied()
                    .or_else(|| spec.as_ref().and_then(|s| s.work_hours));
                let weight = match spec.as_ref().map(|s| &s.shape) {
                    Some(GpuShape::Whole { gpus, .. }) => f64::from(*gpus),
                    Some(GpuShape::Shared { gpu_milli, .. }) => f64::from(*gpu_milli) / 1000.0,
                    // The compute share of the slice: 7 compute slices make a GPU.
                    Some(GpuShape::Mig { profile, .. }) => {
                        let slices = profile
                            .models()
                            .first()
                            .and_then(|m| profile.class_on(*m))
                            .map_or(7, |c| c.compute_slices());
                        f64::from(slices) / 7.0
                    }
                    None => devices.len() as f64,
                };
                let mig = match spec.as_ref().map(|s| &s.shape) {
                    Some(GpuShape::Mig { profile, .. }) => Some(profile.to_string()),
                    _ => None,
                };
                (work, weight, mig)
            }
            _ => (None, 0.0, None),
        };
        let checkpoint_time = self.checkpoint_time;
        let Some(a) = self.agents.get_mut(&node) else {
            return;
        };
        let mut result = CommandResult {
            command_id: c.id,
            ok: true,
            message: None,
            manifest: None,
            mig_layout: None,
        };
        match c.kind {
            CommandKind::Start {
                job_id,
                replica,
                attempt,
                checkpoint_uri,
                resume_from,
                command,
                image,
                devices,
                ..
            } => {
                let restored = resume_from.as_deref().and_then(read_progress);
                if resume_from.is_some() && restored.is_none() {
                    result.ok = false;
                    result.message = Some("the checkpoint to resume from cannot be read".into());
                } else {
                    let mut r = Replica {
                        attempt,
                        // A MIG slice's device is its UUID once the agent's inventory names
                        // it; the simulated inventory does not, so it is the GPU's index.
                        devices: devices.iter().filter_map(|d| d.parse().ok()).collect(),
                        mig: mig.clone(),
                        gpus: weight,
                        phase: ReplicaPhase::Running,
                        exit_code: None,
                        progress_hours: restored.unwrap_or(0.0),
                        work_hours: work.unwrap_or(1.0),
                        uri: checkpoint_uri,
                        checkpoint: None,
                        stop_after: false,
                        output_at: 0,
                        output_closed: false,
                    };
                    let what = match &image {
                        Some(image) => format!("{image} {}", command.join(" ")),
                        None => command.join(" "),
                    };
                    let host = a.instance.rsplit('/').next().unwrap_or(&a.instance);
                    let line = match restored {
                        Some(p) => format!(
                            "{host}: {what}: attempt {attempt} resumed at {p:.2} of {:.2} hours of work",
                            r.work_hours
                        ),
                        None => format!(
                            "{host}: {what}: attempt {attempt} started, {:.2} hours of work",
                            r.work_hours
                        ),
                    };
                    say(&mut self.output, node, (job_id, replica), &mut r, line);
                    a.replicas.insert((job_id, replica), r);
                }
            }
            CommandKind::Checkpoint {
                job_id,
                replica,
                checkpoint_id,
                deadline,
                ..
            } => match a.replicas.get_mut(&(job_id, replica)) {
                Some(r) if r.phase != ReplicaPhase::Exited && r.checkpoint.is_none() => {
                    r.checkpoint = Some(InFlight {
                        id: checkpoint_id,
                        trigger: CheckpointTrigger::Command,
                        started: now,
                        ready_at: now + checkpoint_time,
                        deadline,
                        command: Some(c.id),
                        progress_hours: r.progress_hours,
                    });
                    r.phase = ReplicaPhase::Checkpointing;
                    return; // answered when it is durable
                }
                _ => {
                    result.ok = false;
                    result.message = Some("no such replica running here".into());
                }
            },
            CommandKind::Stop {
                job_id,
                replica,
                attempt,
                ..
            } => {
                if let Some(r) = a
                    .replicas
                    .get_mut(&(job_id, replica))
                    .filter(|r| attempt.is_none_or(|x| x == r.attempt))
                    && r.phase != ReplicaPhase::Exited
                {
                    r.phase = ReplicaPhase::Exited;
                    r.exit_code = Some(143);
                    r.checkpoint = None;
                }
            }
            CommandKind::Drain { deadline, .. } => {
                for r in a.replicas.values_mut() {
                    if r.phase == ReplicaPhase::Exited {
                        continue;
                    }
                    r.stop_after = true;
                    if r.checkpoint.is_none() {
                        r.checkpoint = Some(InFlight {
                            id: CheckpointId::from_uuid(new_uuid(now)),
                            trigger: CheckpointTrigger::Drain,
                            started: now,
                            ready_at: now + checkpoint_time,
                            deadline,
                            command: None,
                            progress_hours: r.progress_hours,
                        });
                        r.phase = ReplicaPhase::Checkpointing;
                    }
                }
            }
            CommandKind::ApplyMigLayout { gpu_index, layout } => {
                result.mig_layout = Some(AppliedMigLayout { gpu_index, layout });
            }
        }
        a.results.push(result);
        say_exits(&mut self.output, node, a);
        // Replicas the control plane stopped wanting are forgotten once reported exited.
        a.replicas.retain(|_, r| {
            r.phase != ReplicaPhase::Exited || r.exit_code != Some(143) || r.checkpoint.is_some()
        });
    }
}

/// Writes a simulated checkpoint — the state file, then the manifest last — under the job's
/// prefix in the local object store, and the report the agent sends.
fn write_checkpoint(
    job: JobId,
    replica: u32,
    attempt: u32,
    uri: &str,
    f: &InFlight,
    in_time: bool,
) -> CheckpointReport {
    let manifest_uri = format!(
        "{}/replica-{replica}/{}/manifest.json",
        uri.trim_end_matches('/'),
        f.id
    );
    let mut report = CheckpointReport {
        job_id: job,
        replica,
        attempt,
        checkpoint_id: f.id,
        uri: manifest_uri.clone(),
        trigger: f.trigger,
        outcome: CheckpointOutcome::MissedDeadline,
        manifest: None,
        message: Some("the upload could not finish before the deadline".into()),
        started_at: f.started,
        finished_at: f.ready_at,
    };
    if !in_time {
        return report;
    }
    let state = serde_json::to_vec(&SimState {
        progress_hours: f.progress_hours,
    })
    .unwrap_or_default();
    let manifest = CheckpointManifest {
        job_id: job,
        replica,
        checkpoint_id: f.id,
        attempt,
        created_at: f.started,
        files: vec![spotplane_core::agent::ManifestFile {
            path: "state.json".into(),
            size: state.len() as u64,
            sha256: sha256_hex(&state),
        }],
        total_bytes: state.len() as u64,
    };
    let written = local(&manifest_uri).is_some_and(|m| {
        let dir = m.parent().map(Path::to_path_buf).unwrap_or_default();
        std::fs::create_dir_all(&dir).is_ok()
            && std::fs::write(dir.join("state.json"), &state).is_ok()
            && serde_json::to_vec(&manifest)
                .ok()
                .is_some_and(|b| std::fs::write(&m, b).is_ok())
    });
    if written {
        report.outcome = CheckpointOutcome::Durable;
        report.manifest = Some(manifest);
        report.message = None;
    } else {
        report.outcome = CheckpointOutcome::Failed;
        report.message = Some(format!("cannot write {manifest_uri}"));
    }
    report
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// The progress a checkpoint saved, read back through its manifest (checksum verified).
fn read_progress(manifest_uri: &str) -> Option<f64> {
    let m = local(manifest_uri)?;
    let manifest: CheckpointManifest = serde_json::from_slice(&std::fs::read(&m).ok()?).ok()?;
    let file = manifest.files.iter().find(|f| f.path == "state.json")?;
    let data = std::fs::read(m.parent()?.join("state.json")).ok()?;
    if sha256_hex(&data) != file.sha256 {
        tracing::warn!(manifest = %manifest_uri, "checksum mismatch; not resuming from it");
        return None;
    }
    let s: SimState = serde_json::from_slice(&data).ok()?;
    Some(s.progress_hours)
}

/// A stable number in [0, 1) from a job id and a salt: how hard a simulated workload drives
/// its GPUs, the same for the whole run.
fn unit(job: JobId, salt: u64) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    job.hash(&mut h);
    salt.hash(&mut h);
    (h.finish() % 10_000) as f64 / 10_000.0
}

/// What NVML (and DCGM, for the profiling field) would read on a simulated node: each GPU's
/// utilisation is the share of it running replicas hold, times how hard each job drives it
/// (a job's own figure, 35 % to 95 %, with a few points of jitter over time), so a team's
/// under-used jobs show as such. Memory, temperature and power follow. A MIG instance gets a
/// row of its own with its profile and GPU-instance id and no `DCGM_FI_DEV_GPU_UTIL` (NVML
/// does not give it for MIG devices), as on real hardware.
fn sim_telemetry(node: NodeId, a: &Agent, now: DateTime<Utc>) -> Vec<GpuTelemetry> {
    let minute = u64::try_from(now.timestamp() / 60).unwrap_or(0);
    // Per GPU index: (share held, share-weighted drive, memory fraction); per MIG replica.
    let mut load: BTreeMap<u32, (f64, f64, f64)> = BTreeMap::new();
    let mut mig_busy: BTreeMap<(u32, String), Vec<(f64, f64)>> = BTreeMap::new();
    for ((job, _), r) in &a.replicas {
        if !matches!(r.phase, ReplicaPhase::Running | ReplicaPhase::Checkpointing) {
            continue;
        }
        let jitter = (unit(*job, minute) - 0.5) * 0.08;
        let drive = (0.35 + 0.6 * unit(*job, 0) + jitter).clamp(0.0, 1.0);
        let memory = 0.3 + 0.6 * unit(*job, 1);
        if let Some(profile) = &r.mig {
            for d in &r.devices {
                mig_busy
                    .entry((*d, profile.clone()))
                    .or_default()
                    .push((drive, memory));
            }
            continue;
        }
        let per = if r.devices.is_empty() {
            0.0
        } else {
            (r.gpus / r.devices.len() as f64).min(1.0)
        };
        for d in &r.devices {
            let e = load.entry(*d).or_default();
            e.0 += per;
            e.1 += per * drive;
            e.2 += per * memory;
        }
    }
    let mut out = Vec::new();
    for g in &a.gpus {
        let uuid = format!("GPU-{}", new_uuid_from(node, g.index));
        let (held, driven, mem) = load.get(&g.index).copied().unwrap_or_default();
        // Each MIG instance: its profile, how hard its replica drives it, its memory size and
        // how much of it is used.
        let instances: Vec<(&spotplane_core::MigInstance, &str, f64, u64, u64)> = g
            .mig_layout
            .instances()
            .iter()
            .map(|inst| {
                let name = spotplane_core::mig::profile_name(g.model, inst.class).unwrap_or("");
                let (drive, mem) = mig_busy
                    .get(&(g.index, name.to_owned()))
                    .and_then(|v| v.get(mig_rank(g, inst)).copied())
                    .unwrap_or_default();
                let size = spotplane_core::mig::usable_memory_mib(g.model, inst.class)
                    .map_or(0, u64::from);
                (
                    inst,
                    name,
                    drive,
                    size,
                    (size as f64 * mem.min(0.95)) as u64,
                )
            })
            .collect();
        let (util, used) = if g.mig_enabled {
            // The parent of MIG devices: its instances' compute share and memory.
            (
                instances
                    .iter()
                    .map(|(inst, _, drive, _, _)| {
                        drive * f64::from(inst.class.compute_slices()) / 7.0
                    })
                    .sum(),
                instances.iter().map(|i| i.4).sum(),
            )
        } else if held > 0.0 {
            (
                driven.min(1.0),
                (g.memory_mib as f64 * mem.min(0.95)) as u64,
            )
        } else {
            (driven.min(1.0), 0)
        };
        let total = g.memory_mib;
        let limit = f64::from(g.model.power_limit_w());
        out.push(GpuTelemetry {
            index: g.index,
            uuid: Some(uuid.clone()),
            utilization_pct: (!g.mig_enabled).then(|| (util * 100.0).round() as u8),
            memory_utilization_pct: (!g.mig_enabled).then(|| (util * 60.0).round() as u8),
            memory_used_mib: Some(used),
            memory_total_mib: Some(total),
            temperature_c: Some((31.0 + 45.0 * util).round() as i16),
            power_w: Some(((0.12 + 0.83 * util) * limit * 10.0).round() / 10.0),
            sm_clock_mhz: Some(if util > 0.0 { boost_mhz(g.model) } else { 345 }),
            gr_engine_active: Some((util * 0.92 * 1000.0).round() / 1000.0),
            tensor_active: Some((util * 0.55 * 1000.0).round() / 1000.0),
            ..GpuTelemetry::default()
        });
        for &(inst, name, drive, total, used) in &instances {
            out.push(GpuTelemetry {
                index: g.index,
                uuid: Some(uuid.clone()),
                mig_uuid: Some(format!(
                    "MIG-{}",
                    new_uuid_from(node, g.index * 100 + u32::from(inst.start) + 1)
                )),
                mig_profile: Some(name.to_owned()),
                // The driver numbers GPU instances; the simulation numbers them by placement.
                gpu_instance_id: Some(u32::from(inst.start) + 1),
                memory_used_mib: Some(used),
                memory_total_mib: Some(total),
                gr_engine_active: Some((drive * 0.92 * 1000.0).round() / 1000.0),
                tensor_active: Some((drive * 0.55 * 1000.0).round() / 1000.0),
                ..GpuTelemetry::default()
            });
        }
    }
    out
}

/// A busy GPU's SM clock, MHz (the board's boost clock).
fn boost_mhz(model: spotplane_core::GpuModel) -> u32 {
    use spotplane_core::GpuModel as M;
    match model {
        M::H100_80GB | M::H200_141GB | M::B200_180GB => 1980,
        M::A100_40GB | M::A100_80GB => 1410,
        M::L40S => 2520,
        M::L4 => 2040,
        M::A10G | M::A10 => 1695,
        M::T4 => 1590,
        M::V100_16GB | M::V100_32GB => 1530,
        _ => 1500,
    }
}

/// Which of a GPU's instances of `inst`'s profile it is, in placement order (the simulated
/// agent hands its MIG replicas the instances of their profile in that order).
fn mig_rank(g: &crate::model::Gpu, inst: &spotplane_core::MigInstance) -> usize {
    g.mig_layout
        .instances()
        .iter()
        .filter(|i| i.class == inst.class && i.start < inst.start)
        .count()
}

/// A stable UUID for a simulated device of `node`.
fn new_uuid_from(node: NodeId, n: u32) -> uuid::Uuid {
    let base = node.as_uuid().as_u128();
    uuid::Uuid::from_u128(base ^ (u128::from(n) << 64) ^ u128::from(n))
}
