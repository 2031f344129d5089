//! The agent's main loop.
//!
//! 1. Register: with the node credential kept in the work directory if there is one (a
//!    restart), else with the bootstrap token, which is exchanged once for the credential.
//! 2. Watch the cloud's metadata service for a termination notice (its own task).
//! 3. Every heartbeat interval — and at once when something happened — send telemetry, the
//!    replicas' states, the notice and the results of finished commands; carry out the
//!    commands the answer brings, each in its own task, ignoring ids already seen.
//! 4. On a notice with a deadline: checkpoint every running replica at once, upload before
//!    the deadline (less a margin to report), report each checkpoint, and on Azure let the
//!    eviction start once all are durable.
//!
//! Each replica is an actor owning its process: checkpoint and stop requests queue up in
//! order, so a notice and a drain arriving together never signal a workload twice at once.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use spotplane_core::agent::{
    AgentSecrets, AppliedMigLayout, CheckpointManifest, CheckpointOutcome, CheckpointReport,
    CheckpointTrigger, Command, CommandKind, CommandResult, Heartbeat, PROTOCOL_VERSION,
    RegisterRequest, RegistryCredential, Rendezvous, ReplicaLimits, ReplicaPhase, ReplicaStatus,
    TerminationNotice, bootstrap_token_node,
};
use spotplane_core::{CheckpointId, CommandId, JobId, MigLayout, NodeId};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::checkpoint::{CheckpointError, CheckpointMeta, CheckpointStore, UploadConfig};
use crate::client::{ClientError, ControlPlane, fetch_secrets};
use crate::container::{self, ContainerLaunch, Engine, EngineSettings};
use crate::isolation::{self, Isolation, IsolationError, RunAs, UidPool};
use crate::logs::{LogSettings, LogSink, Shipper};
use crate::mig::{self, MigControl};
use crate::notice::{self, NoticeSource, NoticeView};
use crate::telemetry::TelemetrySource;
use crate::workload::{ExitInfo, Launch, Workload, WorkloadError, parse_signal};

/// Everything the agent is told on its command line.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub control_plane: String,
    pub bootstrap_token_file: PathBuf,
    pub work_dir: PathBuf,
    /// object_store options for every checkpoint URI (endpoints of emulators, …).
    pub store_options: Vec<(String, String)>,
    pub upload: UploadConfig,
    /// The upload must be over this long before a notice's deadline, to report it.
    pub deadline_margin: Duration,
    /// How long a checkpoint without deadline (a command) may take.
    pub checkpoint_timeout: Duration,
    /// Grace period of the workloads stopped by a drain.
    pub drain_grace: Duration,
    /// Who replicas run as (a user of their own per job by default).
    pub isolation: Isolation,
    /// The range the jobs' users are taken from (with [`Isolation::User`]).
    pub workload_uid_base: u32,
    pub workload_uid_count: u32,
    /// The container engine that runs the replicas of jobs with an image.
    pub containers: EngineSettings,
    /// How replicas' output is kept and shipped.
    pub logs: LogSettings,
    /// The address gang peers reach this node at (`--advertise-address`); by default the
    /// one it reaches the control plane from.
    pub advertise_address: Option<std::net::IpAddr>,
    /// Overrides of what the control plane says (tests).
    pub heartbeat_interval: Option<Duration>,
    pub notice_poll_interval: Option<Duration>,
}

impl AgentConfig {
    pub fn new(control_plane: &str, bootstrap_token_file: &Path, work_dir: &Path) -> Self {
        AgentConfig {
            control_plane: control_plane.to_owned(),
            bootstrap_token_file: bootstrap_token_file.to_owned(),
            work_dir: work_dir.to_owned(),
            store_options: Vec::new(),
            upload: UploadConfig::default(),
            deadline_margin: Duration::from_secs(3),
            checkpoint_timeout: Duration::from_secs(600),
            drain_grace: Duration::from_secs(30),
            isolation: Isolation::User,
            workload_uid_base: isolation::DEFAULT_UID_BASE,
            workload_uid_count: isolation::DEFAULT_UID_COUNT,
            containers: EngineSettings::default(),
            logs: LogSettings::default(),
            advertise_address: None,
            heartbeat_interval: None,
            notice_poll_interval: None,
        }
    }
}

/// What the agent talks to besides the control plane.
pub struct Deps {
    pub notices: Arc<dyn NoticeSource>,
    pub telemetry: Box<dyn TelemetrySource>,
    pub mig: Arc<dyn MigControl>,
    pub clock: Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the bootstrap token file {0} holds no spotplane bootstrap token (spb_<node>_<secret>)"
    )]
    BadToken(PathBuf),
    #[error("registration refused: {0}")]
    Refused(ClientError),
    #[error(transparent)]
    Isolation(#[from] IsolationError),
}

/// The node credential as kept in the work directory (mode 0600).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedCredential {
    node_id: NodeId,
    credential: String,
}

const CREDENTIAL_FILE: &str = "credential.json";
const DONE_FILE: &str = "done-commands.json";
/// Completed command ids remembered across restarts.
const DONE_KEPT: usize = 2048;

type Key = (JobId, u32);

/// A replica as the main loop tracks it.
struct Replica {
    attempt: u32,
    tx: mpsc::Sender<ReplicaMsg>,
    phase: ReplicaPhase,
    exit_code: Option<i32>,
    /// Successful heartbeats that reported its exit; dropped after a few.
    exit_reported: u32,
}

enum ReplicaMsg {
    Checkpoint {
        req: CheckpointRequest,
        reply: oneshot::Sender<CheckpointReport>,
    },
    Stop {
        grace: Duration,
        reply: oneshot::Sender<ExitInfo>,
    },
}

#[derive(Debug, Clone)]
struct CheckpointRequest {
    checkpoint_id: CheckpointId,
    trigger: CheckpointTrigger,
    deadline: Option<DateTime<Utc>>,
    /// A durable checkpoint made at or after this time answers the request (a drain right
    /// after a notice does not checkpoint twice).
    reuse_after: Option<DateTime<Utc>>,
}

enum Event {
    Result(CommandResult),
    Started { key: Key, replica: Replica },
    Phase { key: Key, phase: ReplicaPhase },
    Exited { key: Key, exit: ExitInfo },
    HeartbeatNow,
}

/// Shared by the tasks the main loop spawns.
#[derive(Clone)]
struct Ctx {
    cfg: Arc<AgentConfig>,
    cp: Arc<ControlPlane>,
    node_id: NodeId,
    signal: Signal,
    clock: Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>,
    events: mpsc::UnboundedSender<Event>,
    /// The jobs' users; `None` under [`Isolation::None`].
    users: Option<Arc<std::sync::Mutex<UidPool>>>,
    /// The container engine, or why the node has none.
    engine: Result<Arc<Engine>, Arc<str>>,
    /// The replicas' output on its way to the control plane.
    logs: Shipper,
}

/// The agent as the owner of what it takes back from workloads (it is root when it isolates).
const AGENT: RunAs = RunAs { uid: 0, gid: 0 };

impl Ctx {
    fn job_dir(&self, job: JobId) -> PathBuf {
        self.cfg.work_dir.join("jobs").join(job.to_string())
    }

    /// The user a new replica of `job` runs as.
    fn acquire_user(&self, job: JobId) -> Result<Option<RunAs>, IsolationError> {
        let Some(users) = &self.users else {
            return Ok(None);
        };
        let mut pool = users.lock().unwrap_or_else(|p| p.into_inner());
        pool.acquire(job).map(Some)
    }

    /// A replica of `job` has ended; after its last one, its user is cleared away.
    async fn release_user(&self, job: JobId) {
        let Some(users) = &self.users else {
            return;
        };
        let freed = users.lock().unwrap_or_else(|p| p.into_inner()).release(job);
        if let Some(uid) = freed {
            let dir = self.job_dir(job);
            let _ = tokio::task::spawn_blocking(move || isolation::reclaim(uid, &dir, AGENT)).await;
        }
    }

    fn now(&self) -> DateTime<Utc> {
        (self.clock)()
    }

    fn new_checkpoint_id(&self) -> CheckpointId {
        let ms = u64::try_from(self.now().timestamp_millis()).unwrap_or(0);
        CheckpointId::new_at(ms, rand::random())
    }

    /// A wall-clock deadline as a tokio instant, `margin` earlier.
    fn instant(&self, deadline: DateTime<Utc>, margin: Duration) -> tokio::time::Instant {
        let left = (deadline - self.now()).to_std().unwrap_or(Duration::ZERO);
        tokio::time::Instant::now() + left.saturating_sub(margin)
    }

    fn event(&self, e: Event) {
        // The main loop outlives every task; a send fails only while shutting down.
        let _ = self.events.send(e);
    }

    /// Sends a checkpoint report, retrying while the control plane is unreachable.
    async fn report(&self, r: &CheckpointReport) {
        for attempt in 0..6u32 {
            match self.cp.checkpoint(r).await {
                Ok(()) => return,
                Err(e) if e.is_transient() => {
                    tracing::warn!(error = %e, attempt, checkpoint = %r.checkpoint_id, "checkpoint report not delivered; retrying");
                    tokio::time::sleep(Duration::from_millis(500 << attempt.min(4))).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, checkpoint = %r.checkpoint_id, "checkpoint report refused");
                    return;
                }
            }
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AgentError {
    let what = what.into();
    move |source| AgentError::Io { what, source }
}

/// What this node has, for registration.
fn register_request(
    node_id: NodeId,
    instance_id: Option<String>,
    engine: Option<&Engine>,
    address: Option<std::net::IpAddr>,
) -> RegisterRequest {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let memory_mib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024);
    RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        node_id,
        agent_version: env!("CARGO_PKG_VERSION").into(),
        hostname,
        instance_id,
        cpu_milli: u32::try_from(cpus * 1000).unwrap_or(u32::MAX),
        memory_mib,
        gpus: crate::inventory::gpus(),
        container_engine: engine.map(Engine::info),
        address: address.map(|a| a.to_string()),
    }
}

/// The address to register: `--advertise-address`, else the one this node reaches the control
/// plane from; `None` (the control plane then gives peers the hostname) if neither is known.
async fn advertised_address(cfg: &AgentConfig) -> Option<std::net::IpAddr> {
    if let Some(a) = cfg.advertise_address {
        return Some(a);
    }
    match crate::gang::local_address_towards(&cfg.control_plane).await {
        Ok(a) => {
            tracing::info!(address = %a, "gang peers reach this node at the address it reaches the control plane from");
            Some(a)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell this node's address; gang peers get its hostname (set --advertise-address)");
            None
        }
    }
}

fn write_private(path: &Path, data: &[u8]) -> Result<(), AgentError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(format!("writing {}", tmp.display())))?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .map_err(io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(io(format!("writing {}", path.display())))
}

/// Registers, exchanging the bootstrap token when there is no usable credential. Retries
/// while the control plane is unreachable; gives up on a refusal.
async fn register(
    cfg: &AgentConfig,
    notices: &dyn NoticeSource,
    engine: Option<&Engine>,
    cancel: &CancellationToken,
) -> Result<(Arc<ControlPlane>, NodeId, Duration, Duration, Signal), AgentError> {
    let bootstrap = std::fs::read_to_string(&cfg.bootstrap_token_file)
        .ok()
        .map(|t| t.trim().to_owned());
    let boot_node = bootstrap.as_deref().and_then(bootstrap_token_node);
    // A credential of another node than the bootstrap token's (a work directory reused on a
    // new node) is not ours any more.
    let saved: Option<SavedCredential> = std::fs::read(cfg.work_dir.join(CREDENTIAL_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice::<SavedCredential>(&b).ok())
        .filter(|s| boot_node.is_none_or(|n| n == s.node_id));
    let node_id = match (&saved, boot_node) {
        (Some(s), _) => s.node_id,
        (None, Some(n)) => n,
        (None, None) => return Err(AgentError::BadToken(cfg.bootstrap_token_file.clone())),
    };
    let instance_id = notices.instance_id().await;
    let req = register_request(node_id, instance_id, engine, advertised_address(cfg).await);
    let mut candidates: VecDeque<(String, bool)> = VecDeque::new();
    if let Some(s) = &saved {
        candidates.push_back((s.credential.clone(), false));
    }
    if let (Some(b), Some(n)) = (bootstrap, boot_node)
        && n == node_id
    {
        candidates.push_back((b, true));
    }
    let mut backoff = Duration::from_millis(500);
    while let Some((token, is_bootstrap)) = candidates.front().cloned() {
        let cp = Arc::new(
            ControlPlane::new(&cfg.control_plane, token, Duration::from_secs(15))
                .map_err(AgentError::Refused)?,
        );
        match cp.register(&req).await {
            Ok(resp) => {
                if let Some(cred) = resp.credential {
                    let saved = SavedCredential {
                        node_id,
                        credential: cred.clone(),
                    };
                    let body = serde_json::to_vec(&saved).unwrap_or_default();
                    write_private(&cfg.work_dir.join(CREDENTIAL_FILE), &body)?;
                    cp.set_token(cred);
                } else if is_bootstrap {
                    tracing::warn!("the bootstrap exchange returned no credential");
                }
                let signal = parse_signal(&resp.checkpoint_signal).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "unknown checkpoint signal; using SIGUSR1");
                    Signal::SIGUSR1
                });
                tracing::info!(node = %node_id, exchanged = is_bootstrap, "registered");
                return Ok((
                    cp,
                    node_id,
                    cfg.heartbeat_interval
                        .unwrap_or(Duration::from_millis(resp.heartbeat_interval_ms.max(100))),
                    cfg.notice_poll_interval
                        .unwrap_or(Duration::from_millis(resp.notice_poll_interval_ms.max(100))),
                    signal,
                ));
            }
            Err(ClientError::Unauthorized(why)) => {
                tracing::warn!(bootstrap = is_bootstrap, %why, "token refused");
                candidates.pop_front();
                if candidates.is_empty() {
                    return Err(AgentError::Refused(ClientError::Unauthorized(why)));
                }
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, retry_in = ?backoff, "registration failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = cancel.cancelled() => return Err(AgentError::Refused(e)),
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
            Err(e) => return Err(AgentError::Refused(e)),
        }
    }
    Err(AgentError::BadToken(cfg.bootstrap_token_file.clone()))
}

/// Runs the agent until `cancel`: registers, then heartbeats, watches for notices and carries
/// out commands. Workloads are stopped on the way out.
pub async fn run(
    cfg: AgentConfig,
    deps: Deps,
    cancel: CancellationToken,
) -> Result<(), AgentError> {
    // Workloads may pass through the work directory to their own folders, but list nothing
    // and read none of the agent's files.
    isolation::create_dirs(&cfg.work_dir.join("jobs"), 0o711)?;
    isolation::set_mode(&cfg.work_dir, 0o711)?;
    isolation::set_mode(&cfg.work_dir.join("jobs"), 0o711)?;
    for f in [CREDENTIAL_FILE, DONE_FILE] {
        let p = cfg.work_dir.join(f);
        if p.exists() {
            isolation::set_mode(&p, 0o600)?;
        }
    }
    let users = match cfg.isolation {
        Isolation::User => {
            isolation::check_can_isolate(&cfg.work_dir)?;
            let pool = UidPool::new(cfg.workload_uid_base, cfg.workload_uid_count)?;
            Some(Arc::new(std::sync::Mutex::new(pool)))
        }
        Isolation::None => {
            tracing::warn!(
                "--workload-isolation none: replicas run as the agent's own user and can read its credential; only for a node given to one team"
            );
            None
        }
    };
    let engine = match container::detect(&cfg.containers).await {
        Ok(e) => {
            tracing::info!(engine = e.kind.as_str(), version = %e.version, cdi = e.cdi, "container engine found");
            Ok(Arc::new(e))
        }
        Err(why) => {
            tracing::warn!(%why, "no container engine: jobs with an image cannot run on this node");
            Err(Arc::<str>::from(why))
        }
    };
    let (cp, node_id, hb_interval, poll_interval, signal) =
        register(&cfg, deps.notices.as_ref(), engine.as_deref().ok(), &cancel).await?;
    if let Ok(e) = &engine {
        container::remove_leftovers(e, node_id).await;
    }

    let (notice_tx, notice_rx) = watch::channel(NoticeView::default());
    let watcher_cancel = cancel.child_token();
    let clock = deps.clock.clone();
    tokio::spawn(notice::watch(
        deps.notices.clone(),
        poll_interval,
        move || clock(),
        notice_tx,
        watcher_cancel.clone(),
    ));

    let logs = Shipper::new(cfg.logs.pending_max);
    let logs_cancel = CancellationToken::new();
    let shipping = tokio::spawn(logs.clone().run(
        cp.clone(),
        cfg.logs.ship_interval,
        Duration::from_secs(3),
        logs_cancel.clone(),
    ));
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let ctx = Ctx {
        cfg: Arc::new(cfg),
        cp,
        node_id,
        signal,
        clock: deps.clock.clone(),
        events: events_tx,
        users,
        engine,
        logs,
    };
    let done = load_done(&ctx.cfg.work_dir);
    let mut rt = Runtime {
        ctx,
        notices: deps.notices,
        telemetry: deps.telemetry,
        mig: deps.mig,
        replicas: HashMap::new(),
        seen: done.iter().copied().collect(),
        done,
        results: Vec::new(),
        handled_notice: None,
        notice_at: None,
        failing_since: None,
    };
    rt.main_loop(hb_interval, notice_rx, events_rx, cancel)
        .await;
    watcher_cancel.cancel();
    // The workloads are stopped: what they wrote last goes out before the agent does.
    logs_cancel.cancel();
    let _ = shipping.await;
    Ok(())
}

fn load_done(dir: &Path) -> VecDeque<CommandId> {
    std::fs::read(dir.join(DONE_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

struct Runtime {
    ctx: Ctx,
    notices: Arc<dyn NoticeSource>,
    telemetry: Box<dyn TelemetrySource>,
    mig: Arc<dyn MigControl>,
    replicas: HashMap<Key, Replica>,
    /// Commands done or in flight: a repeated command is ignored.
    seen: HashSet<CommandId>,
    /// Completed, oldest first, kept on disk.
    done: VecDeque<CommandId>,
    /// Results not yet acknowledged by a heartbeat answer.
    results: Vec<CommandResult>,
    /// The notice the checkpoints were made for.
    handled_notice: Option<TerminationNotice>,
    notice_at: Option<DateTime<Utc>>,
    failing_since: Option<DateTime<Utc>>,
}

impl Runtime {
    async fn main_loop(
        &mut self,
        hb_interval: Duration,
        mut notices: watch::Receiver<NoticeView>,
        mut events: mpsc::UnboundedReceiver<Event>,
        cancel: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(hb_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let view = notices.borrow().clone();
                    self.heartbeat(&view).await;
                }
                changed = notices.changed() => {
                    if changed.is_err() {
                        continue;
                    }
                    let view = notices.borrow_and_update().clone();
                    if self.on_notice(&view) {
                        self.heartbeat(&view).await;
                        tick.reset();
                    }
                }
                Some(e) = events.recv() => {
                    if self.on_event(e) {
                        let view = notices.borrow().clone();
                        self.heartbeat(&view).await;
                        tick.reset();
                    }
                }
                () = cancel.cancelled() => break,
            }
        }
        self.shutdown().await;
    }

    /// Stops every workload (they would die with the agent anyway; this way they get SIGTERM).
    async fn shutdown(&mut self) {
        let mut waits = Vec::new();
        for r in self.replicas.values() {
            let (reply, rx) = oneshot::channel();
            if r.tx
                .send(ReplicaMsg::Stop {
                    grace: Duration::from_secs(5),
                    reply,
                })
                .await
                .is_ok()
            {
                waits.push(rx);
            }
        }
        for w in waits {
            let _ = w.await;
        }
    }

    /// Handles an event; returns whether a heartbeat should go now.
    fn on_event(&mut self, e: Event) -> bool {
        match e {
            Event::Result(r) => {
                self.done.push_back(r.command_id);
                while self.done.len() > DONE_KEPT {
                    self.done.pop_front();
                }
                if let Ok(b) = serde_json::to_vec(&self.done)
                    && let Err(e) = write_private(&self.ctx.cfg.work_dir.join(DONE_FILE), &b)
                {
                    tracing::warn!(error = %e, "cannot remember completed commands");
                }
                self.results.push(r);
                true
            }
            Event::Started { key, replica } => {
                self.replicas.insert(key, replica);
                true
            }
            Event::Phase { key, phase } => {
                if let Some(r) = self.replicas.get_mut(&key)
                    && r.phase != ReplicaPhase::Exited
                {
                    r.phase = phase;
                }
                false
            }
            Event::Exited { key, exit } => {
                if let Some(r) = self.replicas.get_mut(&key) {
                    tracing::info!(job = %key.0, replica = key.1, %exit, "replica exited");
                    r.phase = ReplicaPhase::Exited;
                    r.exit_code = Some(exit.code);
                }
                true
            }
            Event::HeartbeatNow => true,
        }
    }

    /// A notice with a deadline starts the checkpoints of every running replica, once.
    /// Returns whether the control plane should hear of it now.
    fn on_notice(&mut self, view: &NoticeView) -> bool {
        let Some(n) = &view.notice else {
            return self.handled_notice.take().is_some();
        };
        let same = self.handled_notice.as_ref().is_some_and(|h| {
            h.source == n.source && h.action == n.action && h.event_id == n.event_id
        });
        if same {
            return false;
        }
        self.handled_notice = Some(n.clone());
        let Some(deadline) = n.drain_deadline() else {
            return true;
        };
        self.notice_at = Some(self.ctx.now());
        let running: Vec<(Key, mpsc::Sender<ReplicaMsg>)> = self
            .replicas
            .iter()
            .filter(|(_, r)| r.phase != ReplicaPhase::Exited)
            .map(|(k, r)| (*k, r.tx.clone()))
            .collect();
        tracing::warn!(replicas = running.len(), %deadline, "termination notice: checkpointing every replica");
        let ctx = self.ctx.clone();
        let notices = self.notices.clone();
        let notice = n.clone();
        tokio::spawn(async move {
            let jobs = running.into_iter().map(|(key, tx)| {
                let ctx = ctx.clone();
                async move {
                    let req = CheckpointRequest {
                        checkpoint_id: ctx.new_checkpoint_id(),
                        trigger: CheckpointTrigger::Notice,
                        deadline: Some(deadline),
                        reuse_after: None,
                    };
                    let report = ask_checkpoint(&tx, req).await;
                    match report {
                        Some(r) => {
                            ctx.report(&r).await;
                            r.outcome == CheckpointOutcome::Durable
                        }
                        None => {
                            tracing::warn!(job = %key.0, replica = key.1, "replica went before its checkpoint");
                            false
                        }
                    }
                }
            });
            let durable = futures::future::join_all(jobs).await;
            if durable.iter().all(|d| *d)
                && let Err(e) = notices.acknowledge(&notice).await
            {
                tracing::warn!(error = %e, "could not acknowledge the notice");
            }
            ctx.event(Event::HeartbeatNow);
        });
        true
    }

    async fn heartbeat(&mut self, view: &NoticeView) {
        let replicas: Vec<ReplicaStatus> = self
            .replicas
            .iter()
            .map(|((job_id, replica), r)| ReplicaStatus {
                job_id: *job_id,
                replica: *replica,
                attempt: r.attempt,
                phase: r.phase,
                exit_code: r.exit_code,
            })
            .collect();
        let hb = Heartbeat {
            node_id: self.ctx.node_id,
            sent_at: self.ctx.now(),
            gpus: self.telemetry.sample(),
            replicas,
            notice: view.notice.clone(),
            results: self.results.clone(),
        };
        match self.ctx.cp.heartbeat(&hb).await {
            Ok(resp) => {
                if let Some(since) = self.failing_since.take() {
                    tracing::info!(%since, "control plane reachable again");
                }
                let sent: HashSet<CommandId> = hb.results.iter().map(|r| r.command_id).collect();
                self.results.retain(|r| !sent.contains(&r.command_id));
                self.replicas.retain(|_, r| {
                    if r.phase == ReplicaPhase::Exited {
                        r.exit_reported += 1;
                    }
                    r.exit_reported < 3
                });
                for c in resp.commands {
                    self.dispatch(c);
                }
            }
            Err(e) => {
                if self.failing_since.is_none() {
                    tracing::warn!(error = %e, "heartbeat failed; will keep trying");
                    self.failing_since = Some(self.ctx.now());
                }
            }
        }
    }

    fn dispatch(&mut self, c: Command) {
        if !self.seen.insert(c.id) {
            return;
        }
        let id = c.id;
        let ctx = self.ctx.clone();
        let result = move |ok: bool, message: String| CommandResult {
            command_id: id,
            ok,
            message: Some(message),
            manifest: None,
            mig_layout: None,
        };
        match c.kind {
            CommandKind::Start {
                job_id,
                replica,
                attempt,
                command,
                image,
                working_dir,
                env,
                devices,
                checkpoint_uri,
                resume_from,
                limits,
                rendezvous,
                secrets,
            } => {
                if let Some(r) = self.replicas.get(&(job_id, replica))
                    && r.attempt == attempt
                    && r.phase != ReplicaPhase::Exited
                {
                    ctx.event(Event::Result(result(true, "already running".into())));
                    return;
                }
                // An older attempt of the same replica still running here is stopped first, so
                // two never write the same checkpoint directory.
                let older = self
                    .replicas
                    .get(&(job_id, replica))
                    .filter(|r| r.attempt != attempt && r.phase != ReplicaPhase::Exited)
                    .map(|r| r.tx.clone());
                let spec = StartSpec {
                    job_id,
                    replica,
                    attempt,
                    command,
                    env,
                    devices,
                    checkpoint_uri,
                    resume_from,
                    image,
                    working_dir,
                    limits,
                    gang: rendezvous.as_ref().is_some_and(|r| r.world_size > 1),
                    rendezvous,
                    secrets,
                };
                tokio::spawn(async move {
                    if let Some(tx) = older {
                        ask_stop(&tx, ctx.cfg.drain_grace).await;
                    }
                    let r = match start_replica(&ctx, spec).await {
                        Ok(msg) => result(true, msg),
                        Err(msg) => {
                            tracing::error!(job = %job_id, replica, error = %msg, "start failed");
                            result(false, msg)
                        }
                    };
                    ctx.event(Event::Result(r));
                });
            }
            CommandKind::Checkpoint {
                job_id,
                replica,
                checkpoint_id,
                uri: _,
                deadline,
            } => {
                let Some(tx) = self.replicas.get(&(job_id, replica)).map(|r| r.tx.clone()) else {
                    ctx.event(Event::Result(result(
                        false,
                        "no such replica on this node".into(),
                    )));
                    return;
                };
                tokio::spawn(async move {
                    let req = CheckpointRequest {
                        checkpoint_id,
                        trigger: CheckpointTrigger::Command,
                        deadline,
                        reuse_after: None,
                    };
                    let r = match ask_checkpoint(&tx, req).await {
                        Some(report) => {
                            ctx.report(&report).await;
                            CommandResult {
                                command_id: id,
                                ok: report.outcome == CheckpointOutcome::Durable,
                                message: report.message.clone(),
                                manifest: report.manifest.clone(),
                                mig_layout: None,
                            }
                        }
                        None => result(false, "the replica exited".into()),
                    };
                    ctx.event(Event::Result(r));
                });
            }
            CommandKind::Stop {
                job_id,
                replica,
                attempt,
                grace_ms,
            } => {
                let Some(tx) = self
                    .replicas
                    .get(&(job_id, replica))
                    .filter(|r| attempt.is_none_or(|a| a == r.attempt))
                    .map(|r| r.tx.clone())
                else {
                    ctx.event(Event::Result(result(true, "not running".into())));
                    return;
                };
                tokio::spawn(async move {
                    let msg = match ask_stop(&tx, Duration::from_millis(grace_ms)).await {
                        Some(exit) => format!("stopped: {exit}"),
                        None => "already exited".into(),
                    };
                    ctx.event(Event::Result(result(true, msg)));
                });
            }
            CommandKind::ApplyMigLayout { gpu_index, layout } => {
                let mig = self.mig.clone();
                tokio::spawn(async move {
                    let applied = tokio::task::spawn_blocking(move || {
                        mig::apply(mig.as_ref(), gpu_index, &layout, &[])
                    })
                    .await;
                    let r = match applied {
                        Ok(a) => CommandResult {
                            command_id: id,
                            ok: a.error.is_none(),
                            message: a.error.as_ref().map(ToString::to_string),
                            manifest: None,
                            mig_layout: a
                                .layout
                                .map(|layout: MigLayout| AppliedMigLayout { gpu_index, layout }),
                        },
                        Err(e) => result(false, format!("MIG re-layout task failed: {e}")),
                    };
                    ctx.event(Event::Result(r));
                });
            }
            CommandKind::Drain { deadline, reason } => {
                tracing::warn!(
                    ?deadline,
                    ?reason,
                    "drain: checkpointing and stopping every replica"
                );
                let targets: Vec<(Key, mpsc::Sender<ReplicaMsg>)> = self
                    .replicas
                    .iter()
                    .filter(|(_, r)| r.phase != ReplicaPhase::Exited)
                    .map(|(k, r)| (*k, r.tx.clone()))
                    .collect();
                let reuse_after = self.notice_at;
                tokio::spawn(async move {
                    let jobs = targets.into_iter().map(|(key, tx)| {
                        let ctx = ctx.clone();
                        async move {
                            let req = CheckpointRequest {
                                checkpoint_id: ctx.new_checkpoint_id(),
                                trigger: CheckpointTrigger::Drain,
                                deadline,
                                reuse_after,
                            };
                            let durable = match ask_checkpoint(&tx, req).await {
                                Some(r) => {
                                    ctx.report(&r).await;
                                    r.outcome == CheckpointOutcome::Durable
                                }
                                None => false,
                            };
                            ask_stop(&tx, ctx.cfg.drain_grace).await;
                            (key, durable)
                        }
                    });
                    let outcomes = futures::future::join_all(jobs).await;
                    let missed: Vec<String> = outcomes
                        .iter()
                        .filter(|(_, d)| !d)
                        .map(|((j, r), _)| format!("{j}/{r}"))
                        .collect();
                    let r = if missed.is_empty() {
                        result(
                            true,
                            format!("{} replicas checkpointed and stopped", outcomes.len()),
                        )
                    } else {
                        result(
                            false,
                            format!("no durable checkpoint for {}", missed.join(", ")),
                        )
                    };
                    ctx.event(Event::Result(r));
                });
            }
        }
    }
}

async fn ask_checkpoint(
    tx: &mpsc::Sender<ReplicaMsg>,
    req: CheckpointRequest,
) -> Option<CheckpointReport> {
    let (reply, rx) = oneshot::channel();
    tx.send(ReplicaMsg::Checkpoint { req, reply }).await.ok()?;
    rx.await.ok()
}

async fn ask_stop(tx: &mpsc::Sender<ReplicaMsg>, grace: Duration) -> Option<ExitInfo> {
    let (reply, rx) = oneshot::channel();
    tx.send(ReplicaMsg::Stop { grace, reply }).await.ok()?;
    rx.await.ok()
}

struct StartSpec {
    job_id: JobId,
    replica: u32,
    attempt: u32,
    command: Vec<String>,
    env: BTreeMap<String, String>,
    devices: Vec<String>,
    checkpoint_uri: String,
    resume_from: Option<String>,
    /// The job's image: the replica runs in a container of it.
    image: Option<String>,
    /// Where the command starts (inside the image for a container).
    working_dir: Option<String>,
    limits: Option<ReplicaLimits>,
    /// A replica of a gang of more than one (host networking in a container).
    gang: bool,
    /// The job refers to team secrets: fetch them before anything else.
    secrets: bool,
    /// Its place in its gang, which its environment carries.
    rendezvous: Option<Rendezvous>,
}

/// The replica's environment from the job's `env` and its secrets' values. Validation at
/// submit keeps the two apart and secrets off spotplane's own names; a command that breaks
/// either is refused here, naming the variable (never a value). spotplane's own variables are
/// set over these by the workload ([`Workload::start`]).
fn replica_env(
    mut env: BTreeMap<String, String>,
    secrets: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    for (name, value) in secrets {
        if name.starts_with("SPOTPLANE_") {
            return Err(format!(
                "secrets.{name}: names starting with SPOTPLANE_ are set by spotplane"
            ));
        }
        if env.contains_key(&name) {
            return Err(format!(
                "secrets.{name}: also set in the job's env; set it in one place"
            ));
        }
        env.insert(name, value);
    }
    Ok(env)
}

/// Restores the replica's checkpoint (the one named, else the latest durable one), starts
/// the workload and its actor. Returns a message for the command's result.
async fn start_replica(ctx: &Ctx, s: StartSpec) -> Result<String, String> {
    let run_as = ctx.acquire_user(s.job_id).map_err(|e| e.to_string())?;
    let job_id = s.job_id;
    let started = start_as(ctx, s, run_as).await;
    if started.is_err() {
        ctx.release_user(job_id).await;
    }
    started
}

async fn start_as(ctx: &Ctx, s: StartSpec, run_as: Option<RunAs>) -> Result<String, String> {
    // (1) The team secrets the job refers to, through the node's own channel: their values go
    // into the replica's environment and the pull, and nowhere else (no log, no file, no
    // message).
    let AgentSecrets {
        env: secret_env,
        registry,
    } = if s.secrets {
        fetch_secrets(&ctx.cp, s.job_id).await?
    } else {
        AgentSecrets {
            env: BTreeMap::new(),
            registry: None,
        }
    };
    let env = replica_env(s.env, secret_env)?;
    // (2) The image, pulled with the `image_pull_secret` login (below), before the restore.
    let pull_login: Option<RegistryCredential> = registry;
    let base = ctx
        .job_dir(s.job_id)
        .join(format!("replica-{}", s.replica))
        .join(format!("attempt-{}", s.attempt));
    // The agent's folders down to the attempt: searchable, never writable by the workload.
    isolation::create_dirs(&base, 0o711).map_err(|e| e.to_string())?;
    // An image runs in a container or not at all: never on the host instead.
    let engine = match (&s.image, &ctx.engine) {
        (None, _) => None,
        (Some(image), Err(why)) => {
            return Err(format!(
                "the job's image {image} cannot run: this node has no container engine ({why})"
            ));
        }
        (Some(image), Ok(engine)) => {
            container::ensure_image(engine, image, pull_login.as_ref(), &ctx.cfg.work_dir).await?;
            Some(engine.clone())
        }
    };
    let store = CheckpointStore::open(&s.checkpoint_uri, &ctx.cfg.store_options)
        .map_err(|e| e.to_string())?;
    let resume = base.join("resume");
    let concurrency = ctx.cfg.upload.file_concurrency;
    let restored: Option<CheckpointManifest> = match &s.resume_from {
        Some(uri) => Some(
            store
                .restore_uri(uri, &resume, concurrency)
                .await
                .map_err(|e| format!("restoring {uri}: {e}"))?,
        ),
        None => store
            .restore_latest(s.replica, &resume, concurrency)
            .await
            .map_err(|e| format!("restoring the latest checkpoint: {e}"))?,
    };
    if restored.is_some() {
        let r = resume.clone();
        tokio::task::spawn_blocking(move || match run_as {
            Some(user) => isolation::hand_over(&r, user),
            None => isolation::set_mode(&r, 0o700),
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    }
    let log = LogSink {
        path: base.join("output.log"),
        max_file_bytes: ctx.cfg.logs.max_file_bytes,
        keep: ctx.cfg.logs.keep,
        ship: Some((ctx.logs.clone(), (s.job_id, s.replica, s.attempt))),
        archive: Some(store.clone()),
    };
    // spotplane's own rendezvous names over the job's env and secrets (validation keeps the job
    // from setting them).
    let mut env = env;
    if let Some(r) = &s.rendezvous {
        env.extend(
            crate::gang::env(r)
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v)),
        );
    }
    let mut launch = Launch {
        job_id: s.job_id,
        replica: s.replica,
        attempt: s.attempt,
        node_id: Some(ctx.node_id),
        command: s.command,
        env,
        devices: s.devices,
        checkpoint_dir: base.join("checkpoint"),
        resume_dir: restored.as_ref().map(|_| resume.clone()),
        home_dir: Some(base.join("home")),
        tmp_dir: Some(base.join("tmp")),
        signal: ctx.signal,
        log: Some(log),
        run_as,
        working_dir: s.working_dir.map(PathBuf::from),
        container: None,
    };
    if let (Some(engine), Some(image)) = (engine, &s.image) {
        let devices = container::devices_for(&engine, &launch.devices).await?;
        let c = ContainerLaunch {
            engine,
            image: container::normalize_image(image),
            name: container::container_name(s.job_id, s.replica, s.attempt),
            node_id: ctx.node_id,
            devices,
            limits: s.limits,
            host_network: s.gang,
            env_file: base.join("container.env"),
        };
        container::create(&launch, &c).await?;
        launch.container = Some(c);
    }
    let workload = Workload::start(&launch).map_err(|e| e.to_string())?;
    let pid = workload.pid();
    let what = match workload.container() {
        Some(name) => format!("container {name}"),
        None => format!("pid {pid}"),
    };
    let key = (s.job_id, s.replica);
    let (tx, rx) = mpsc::channel(16);
    let actor = Actor {
        ctx: ctx.clone(),
        key,
        attempt: s.attempt,
        store,
        last_durable: None,
    };
    let owner = ctx.clone();
    tokio::spawn(async move {
        actor.run(workload, rx).await;
        owner.release_user(key.0).await;
    });
    ctx.event(Event::Started {
        key,
        replica: Replica {
            attempt: s.attempt,
            tx,
            phase: ReplicaPhase::Running,
            exit_code: None,
            exit_reported: 0,
        },
    });
    tracing::info!(job = %s.job_id, replica = s.replica, attempt = s.attempt, pid, container = launch.container.as_ref().map(|c| c.name.as_str()), resumed = restored.is_some(), "replica started");
    Ok(match restored {
        Some(m) => format!(
            "started {what}, resumed from checkpoint {}",
            m.checkpoint_id
        ),
        None => format!("started {what}"),
    })
}

/// Runs a folder's change of owner off the runtime's threads.
async fn blocking_isolation(
    f: impl FnOnce() -> Result<(), IsolationError> + Send + 'static,
) -> Result<(), String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Owns one replica's process.
struct Actor {
    ctx: Ctx,
    key: Key,
    attempt: u32,
    store: CheckpointStore,
    last_durable: Option<CheckpointReport>,
}

impl Actor {
    async fn run(mut self, mut w: Workload, mut rx: mpsc::Receiver<ReplicaMsg>) {
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(ReplicaMsg::Checkpoint { req, reply }) => {
                        self.ctx.event(Event::Phase { key: self.key, phase: ReplicaPhase::Checkpointing });
                        let report = self.checkpoint(&mut w, req).await;
                        if let Some(exit) = w.try_exit() {
                            let _ = reply.send(report);
                            self.ctx.event(Event::Exited { key: self.key, exit });
                            return;
                        }
                        self.ctx.event(Event::Phase { key: self.key, phase: ReplicaPhase::Running });
                        let _ = reply.send(report);
                    }
                    Some(ReplicaMsg::Stop { grace, reply }) => {
                        let exit = w.stop(grace).await;
                        self.ctx.event(Event::Exited { key: self.key, exit });
                        let _ = reply.send(exit);
                        return;
                    }
                    None => {
                        w.stop(Duration::from_secs(5)).await;
                        return;
                    }
                },
                exit = w.wait() => {
                    self.ctx.event(Event::Exited { key: self.key, exit });
                    return;
                }
            }
        }
    }

    async fn checkpoint(&mut self, w: &mut Workload, req: CheckpointRequest) -> CheckpointReport {
        let started_at = self.ctx.now();
        if let (Some(after), Some(prev)) = (req.reuse_after, &self.last_durable)
            && prev.finished_at >= after
        {
            return prev.clone();
        }
        let (job_id, replica) = self.key;
        let uri = self.store.manifest_uri(replica, req.checkpoint_id);
        let deadline = req
            .deadline
            .map(|d| self.ctx.instant(d, self.ctx.cfg.deadline_margin));
        let within = deadline.map_or(self.ctx.cfg.checkpoint_timeout, |d| {
            d.saturating_duration_since(tokio::time::Instant::now())
        });
        let outcome = match w.checkpoint(within).await {
            Err(WorkloadError::CheckpointTimeout(_)) if req.deadline.is_some() => Err((
                CheckpointOutcome::MissedDeadline,
                "the workload did not finish its checkpoint before the deadline".to_owned(),
            )),
            Err(e) => Err((CheckpointOutcome::Failed, e.to_string())),
            Ok(()) => {
                let meta = CheckpointMeta {
                    job_id,
                    replica,
                    attempt: self.attempt,
                    checkpoint_id: req.checkpoint_id,
                    created_at: started_at,
                };
                // The folder is the agent's while it is read: the workload can no longer
                // swap a file for a link to something only the agent may read.
                let frozen = match w.run_as() {
                    Some(user) => blocking_isolation({
                        let dir = w.checkpoint_dir().to_owned();
                        move || isolation::take_back(&dir, AGENT, Some(user.uid))
                    })
                    .await
                    .map_err(|e| (CheckpointOutcome::Failed, e)),
                    None => Ok(()),
                };
                let up = match frozen {
                    Ok(()) => match self
                        .store
                        .upload(w.checkpoint_dir(), meta, self.ctx.cfg.upload, deadline)
                        .await
                    {
                        Ok(u) => Ok(u),
                        Err(e @ CheckpointError::Deadline { .. }) => {
                            Err((CheckpointOutcome::MissedDeadline, e.to_string()))
                        }
                        Err(e) => Err((CheckpointOutcome::Failed, e.to_string())),
                    },
                    Err(e) => Err(e),
                };
                if let Some(user) = w.run_as()
                    && let Err(e) = blocking_isolation({
                        let dir = w.checkpoint_dir().to_owned();
                        move || isolation::hand_over(&dir, user)
                    })
                    .await
                {
                    tracing::error!(error = %e, "cannot hand the checkpoint folder back to the workload");
                }
                if let Err(e) = w.release_checkpoint() {
                    tracing::warn!(error = %e, "cannot remove the checkpoint marker");
                }
                up
            }
        };
        let finished_at = self.ctx.now();
        let report = match outcome {
            Ok(u) => {
                tracing::info!(job = %job_id, replica, checkpoint = %req.checkpoint_id, bytes = u.manifest.total_bytes,
                    seconds = u.elapsed.as_secs_f64(), "checkpoint durable");
                CheckpointReport {
                    job_id,
                    replica,
                    attempt: self.attempt,
                    checkpoint_id: req.checkpoint_id,
                    uri: u.manifest_uri,
                    trigger: req.trigger,
                    outcome: CheckpointOutcome::Durable,
                    manifest: Some(u.manifest),
                    message: None,
                    started_at,
                    finished_at,
                }
            }
            Err((outcome, message)) => {
                tracing::error!(job = %job_id, replica, checkpoint = %req.checkpoint_id, ?outcome, %message,
                    "checkpoint not durable; the previous one stays the resume point");
                CheckpointReport {
                    job_id,
                    replica,
                    attempt: self.attempt,
                    checkpoint_id: req.checkpoint_id,
                    uri,
                    trigger: req.trigger,
                    outcome,
                    manifest: None,
                    message: Some(message),
                    started_at,
                    finished_at,
                }
            }
        };
        if report.outcome == CheckpointOutcome::Durable {
            self.last_durable = Some(report.clone());
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn secrets_join_the_jobs_env_and_may_not_shadow_it_or_spotplanes_own() {
        let env = map(&[("TRAIN_STEPS", "10")]);
        type Vars<'a> = &'a [(&'a str, &'a str)];
        let cases: [(Vars, Result<Vars, &str>); 4] = [
            (&[], Ok(&[("TRAIN_STEPS", "10")])),
            (
                &[("HF_TOKEN", "v1")],
                Ok(&[("HF_TOKEN", "v1"), ("TRAIN_STEPS", "10")]),
            ),
            (&[("TRAIN_STEPS", "v2")], Err("secrets.TRAIN_STEPS")),
            (
                &[("SPOTPLANE_JOB_ID", "v3")],
                Err("secrets.SPOTPLANE_JOB_ID"),
            ),
        ];
        for (secrets, want) in cases {
            let got = replica_env(env.clone(), map(secrets));
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, map(want)),
                (Err(got), Err(field)) => {
                    assert!(got.starts_with(field), "{got}");
                    assert!(!got.contains("v2") && !got.contains("v3"), "{got}");
                }
                (got, want) => panic!("{secrets:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
