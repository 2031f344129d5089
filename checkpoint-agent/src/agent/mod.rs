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
//!
//! # Where it is
//!
//! - `registration.rs`: registration, with the saved credential or the bootstrap token;
//! - `runtime.rs`: the main loop: heartbeats, events from the tasks, notices;
//! - `commands.rs`: carrying out the commands a heartbeat answer brings;
//! - `start.rs`: starting a replica (its secrets, image, checkpoint to resume and workload);
//! - `replica.rs`: the actor owning a replica's process, and its checkpoints.
//!
//! This file holds the configuration, [`run`], and the state the parts share: the context
//! the spawned tasks carry, the main loop's state and the messages between them.

mod commands;
mod registration;
mod replica;
mod runtime;
mod start;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use nix::sys::signal::Signal;
use spotplane_core::agent::{
    CheckpointReport, CheckpointTrigger, CommandResult, Rendezvous, ReplicaLimits, ReplicaPhase,
    TerminationNotice,
};
use spotplane_core::{CheckpointId, CommandId, JobId, NodeId};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::checkpoint::UploadConfig;
use crate::client::{ClientError, ControlPlane};
use crate::container::{self, Engine, EngineSettings};
use crate::isolation::{self, Isolation, IsolationError, RunAs, UidPool};
use crate::logs::{LogSettings, Shipper};
use crate::mig::MigControl;
use crate::notice::{self, NoticeSource, NoticeView};
use crate::telemetry::TelemetrySource;
use crate::workload::ExitInfo;
use registration::register;

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
