//! Running one replica of a job, and asking it for checkpoints.
//!
//! # The workload contract
//!
//! The agent starts the job's command with, in its environment:
//!
//! | variable | what it is |
//! | --- | --- |
//! | `SPOTPLANE_CHECKPOINT_DIR` | where to write a checkpoint when asked |
//! | `SPOTPLANE_CHECKPOINT_MARKER` | the file to create when a checkpoint is complete |
//! | `SPOTPLANE_CHECKPOINT_SIGNAL` | the signal that asks for one (`SIGUSR1` by default) |
//! | `SPOTPLANE_RESUME_DIR` | set only when resuming: the restored, verified checkpoint |
//! | `SPOTPLANE_JOB_ID`, `SPOTPLANE_REPLICA`, `SPOTPLANE_ATTEMPT`, `SPOTPLANE_NODE_ID` | who it is |
//! | `CUDA_VISIBLE_DEVICES` | its GPUs (indices) or MIG device (UUID), when it has any |
//! | `SPOTPLANE_RANK`, `SPOTPLANE_WORLD_SIZE`, `SPOTPLANE_NODE_RANK` | its place in its gang: its replica index, the gang's replicas, the index of its node among the gang's nodes |
//! | `SPOTPLANE_PEER_ADDRS` | the address of each replica's node, in rank order, comma-separated |
//! | `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` | the same for torchrun and PyTorch: rank 0's node address and the port it listens on (see [`crate::gang`]) |
//! | `HOME`, `TMPDIR` | folders of its own (unless the job's env sets them) |
//! | `PATH` | [`SAFE_PATH`] (unless the job's env sets it) |
//!
//! and the job's own `env` (the gang's names come in [`Launch::env`], from the start's
//! rendezvous); nothing of the agent's environment. With a [`RunAs`] it runs as
//! that uid and gid with no supplementary groups, and its folders are that user's, mode 0700
//! (see [`crate::isolation`]).
//!
//! On the signal, the workload writes its checkpoint under `SPOTPLANE_CHECKPOINT_DIR`, then
//! creates the marker file. From then until the marker is gone again (the agent removes it when
//! the upload is over), it must not change the directory: the agent is reading it. The marker
//! is never uploaded. Stopping is `SIGTERM` to the workload's process group, then `SIGKILL`
//! after the grace period.
//!
//! A replica of a job with an image runs in a container ([`Launch::container`],
//! [`crate::container`]): the same contract with the folders bind-mounted at fixed paths
//! inside, the child process being the engine's attached `start`, and the signals going
//! through the engine (`<engine> kill --signal …`).

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::str::FromStr;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use spotplane_core::{JobId, NodeId};
use tokio::process::{Child, Command};

use crate::container::{ContainerLaunch, ContainerRun};
use crate::isolation::{self, IsolationError, RunAs};
use crate::logs::{self, Capture, LogSink, RotatingLog};

/// The marker's file name inside the checkpoint directory.
pub const MARKER: &str = ".spotplane-checkpoint-complete";
/// `PATH` of a workload whose job sets none.
pub const SAFE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How often the agent looks for the marker.
const MARKER_POLL: Duration = Duration::from_millis(20);
/// How long a container killed with SIGKILL may take to be reported gone.
const CONTAINER_KILL_WAIT: Duration = Duration::from_secs(20);

/// What to start. Its `Debug` leaves out the environment's values: they may be secrets.
#[derive(Clone)]
pub struct Launch {
    pub job_id: JobId,
    pub replica: u32,
    pub attempt: u32,
    pub node_id: Option<NodeId>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// GPU indices or a MIG device UUID, for `CUDA_VISIBLE_DEVICES`.
    pub devices: Vec<String>,
    pub checkpoint_dir: PathBuf,
    pub resume_dir: Option<PathBuf>,
    /// `HOME` and `TMPDIR`, created for it (private to its user).
    pub home_dir: Option<PathBuf>,
    pub tmp_dir: Option<PathBuf>,
    pub signal: Signal,
    /// Where stdout and stderr go (read by the agent into files only it reads, shipped and
    /// archived: [`crate::logs`]); inherited when `None`.
    pub log: Option<LogSink>,
    /// The user it runs as; the agent's own when `None`.
    pub run_as: Option<RunAs>,
    /// Where the command starts: inside the image for a container (the image's own when
    /// `None`), on the host otherwise (the agent's when `None`).
    pub working_dir: Option<PathBuf>,
    /// Run in a container of the job's image, created beforehand by
    /// [`crate::container::create`]; on the host when `None`.
    pub container: Option<ContainerLaunch>,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("job_id", &self.job_id)
            .field("replica", &self.replica)
            .field("attempt", &self.attempt)
            .field("command", &self.command)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("devices", &self.devices)
            .field("checkpoint_dir", &self.checkpoint_dir)
            .field("run_as", &self.run_as)
            .field("working_dir", &self.working_dir)
            .field("container", &self.container)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("the command is empty")]
    EmptyCommand,
    #[error(transparent)]
    Isolation(#[from] IsolationError),
    #[error("cannot start {program:?}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot signal the workload: {0}")]
    Signal(nix::Error),
    #[error("cannot signal the workload's container: {0}")]
    ContainerSignal(String),
    #[error("the workload exited ({0}) before its checkpoint was complete")]
    ExitedDuringCheckpoint(ExitInfo),
    #[error("no checkpoint marker after {0:?}")]
    CheckpointTimeout(Duration),
}

/// How a workload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    /// The exit code, or 128 + the signal that killed it (the shell's convention).
    pub code: i32,
    pub signal: Option<i32>,
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.signal {
            Some(s) => write!(f, "killed by signal {s}"),
            None => write!(f, "exit code {}", self.code),
        }
    }
}

impl From<ExitStatus> for ExitInfo {
    fn from(s: ExitStatus) -> Self {
        match (s.code(), s.signal()) {
            (Some(code), _) => ExitInfo { code, signal: None },
            (None, Some(sig)) => ExitInfo {
                code: 128 + sig,
                signal: Some(sig),
            },
            (None, None) => ExitInfo {
                code: -1,
                signal: None,
            },
        }
    }
}

/// Parses `SIGUSR1`, `USR1` or `sigusr1`.
pub fn parse_signal(s: &str) -> Result<Signal, String> {
    let up = s.trim().to_ascii_uppercase();
    let name = if up.starts_with("SIG") {
        up
    } else {
        format!("SIG{up}")
    };
    Signal::from_str(&name).map_err(|_| format!("unknown signal {s:?}"))
}

/// How the workload's process is reached.
#[derive(Debug)]
enum Runner {
    /// The child is the workload, leading a process group of its own.
    Host,
    /// The child is the engine's attached `start` of the workload's container.
    Container(ContainerRun),
}

/// A running replica.
#[derive(Debug)]
pub struct Workload {
    child: Child,
    pid: Pid,
    checkpoint_dir: PathBuf,
    signal: Signal,
    run_as: Option<RunAs>,
    exit: Option<ExitInfo>,
    runner: Runner,
    /// Its output being read ([`Launch::log`]).
    capture: Option<Capture>,
}

impl Workload {
    /// Starts the command in a process group of its own, as its user, with the contract's
    /// environment only.
    pub fn start(l: &Launch) -> Result<Workload, WorkloadError> {
        let (program, args) = l.command.split_first().ok_or(WorkloadError::EmptyCommand)?;
        // A container not started after all is removed when this is dropped.
        let runner = match &l.container {
            None => Runner::Host,
            Some(c) => Runner::Container(ContainerRun::new(c)),
        };
        prepare_folders(l)?;
        if let (Runner::Host, Some(dir)) = (&runner, &l.working_dir)
            && !dir.is_dir()
        {
            return Err(WorkloadError::Io {
                what: format!("the working directory {}", dir.display()),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "is not a folder on this node",
                ),
            });
        }
        let marker = l.checkpoint_dir.join(MARKER);
        remove_if_present(&marker)?;
        let mut cmd = match &runner {
            Runner::Host => Self::host_command(l, program, args, &marker),
            Runner::Container(c) => c.attach_command(),
        };
        cmd.stdin(Stdio::null()).process_group(0).kill_on_drop(true);
        let log = match &l.log {
            Some(sink) => {
                if let Some(dir) = sink.path.parent() {
                    isolation::create_dirs(dir, 0o711)?;
                }
                let file = RotatingLog::create(&sink.path, sink.max_file_bytes, sink.keep)
                    .map_err(|source| WorkloadError::Io {
                        what: format!("opening {}", sink.path.display()),
                        source,
                    })?;
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
                Some((file, sink))
            }
            None => None,
        };
        let program = match &runner {
            Runner::Host => program.clone(),
            Runner::Container(c) => format!("the container engine for {}", c.name()),
        };
        let mut child = cmd.spawn().map_err(|source| WorkloadError::Spawn {
            program: match (l.run_as, source.kind(), &runner) {
                (Some(r), std::io::ErrorKind::PermissionDenied, Runner::Host) => format!(
                    "{program} (as uid {}: the program and the folders above it must be readable and searchable by others)",
                    r.uid
                ),
                _ => program.clone(),
            },
            source,
        })?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| WorkloadError::Io {
                what: "the new process has no pid".into(),
                source: std::io::Error::other("no pid"),
            })?;
        let capture = match (log, child.stdout.take(), child.stderr.take()) {
            (Some((file, sink)), Some(out), Some(err)) => {
                Some(logs::capture(file, out, err, sink.clone()))
            }
            _ => None,
        };
        Ok(Workload {
            child,
            pid,
            checkpoint_dir: l.checkpoint_dir.clone(),
            signal: l.signal,
            run_as: l.run_as,
            exit: None,
            runner,
            capture,
        })
    }

    /// The workload itself as the child: the contract's environment only, as its user.
    fn host_command(l: &Launch, program: &str, args: &[String], marker: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear().env("PATH", SAFE_PATH);
        if let Some(h) = &l.home_dir {
            cmd.env("HOME", h);
        }
        if let Some(t) = &l.tmp_dir {
            cmd.env("TMPDIR", t);
        }
        cmd.args(args)
            .envs(&l.env)
            .env("SPOTPLANE_CHECKPOINT_DIR", &l.checkpoint_dir)
            .env("SPOTPLANE_CHECKPOINT_MARKER", marker)
            .env("SPOTPLANE_CHECKPOINT_SIGNAL", l.signal.as_str())
            .env("SPOTPLANE_JOB_ID", l.job_id.to_string())
            .env("SPOTPLANE_REPLICA", l.replica.to_string())
            .env("SPOTPLANE_ATTEMPT", l.attempt.to_string())
            .env_remove("SPOTPLANE_RESUME_DIR")
            .env_remove("SPOTPLANE_NODE_ID")
            .env_remove("CUDA_VISIBLE_DEVICES");
        // std drops the supplementary groups (setgroups(0)) when a root parent sets a uid.
        if let Some(r) = l.run_as {
            cmd.uid(r.uid).gid(r.gid);
        }
        if let Some(d) = &l.working_dir {
            cmd.current_dir(d);
        }
        if let Some(n) = l.node_id {
            cmd.env("SPOTPLANE_NODE_ID", n.to_string());
        }
        if let Some(r) = &l.resume_dir {
            cmd.env("SPOTPLANE_RESUME_DIR", r);
        }
        if !l.devices.is_empty() {
            cmd.env("CUDA_VISIBLE_DEVICES", l.devices.join(","));
        }
        cmd
    }

    /// The container's name, for a container replica.
    pub fn container(&self) -> Option<&str> {
        match &self.runner {
            Runner::Host => None,
            Runner::Container(c) => Some(c.name()),
        }
    }

    /// Sends `signal` to the workload: its process for a host replica, its container's PID 1
    /// through the engine for a container replica.
    async fn send(&self, signal: Signal) -> Result<(), WorkloadError> {
        match &self.runner {
            Runner::Host => kill(self.pid, signal).map_err(WorkloadError::Signal),
            Runner::Container(c) => c
                .signal(signal)
                .await
                .map_err(WorkloadError::ContainerSignal),
        }
    }

    /// Sends `signal` to the whole workload: its process group on the host.
    async fn send_all(&self, signal: Signal) {
        let sent = match &self.runner {
            Runner::Host => killpg(self.pid, signal).map_err(|e| e.to_string()),
            Runner::Container(c) => c.signal(signal).await,
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, %signal, "signalling the workload failed");
        }
    }

    /// Records the exit, and lets go of the container once there is one.
    fn exited(&mut self, info: ExitInfo) -> ExitInfo {
        if let Runner::Container(c) = &mut self.runner {
            c.remove();
        }
        self.exit = Some(info);
        info
    }

    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    pub fn checkpoint_dir(&self) -> &Path {
        &self.checkpoint_dir
    }

    /// The user it runs as (`None`: the agent's).
    pub fn run_as(&self) -> Option<RunAs> {
        self.run_as
    }

    /// The exit, if the process has ended (without waiting).
    pub fn try_exit(&mut self) -> Option<ExitInfo> {
        if self.exit.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.exited(status.into());
            if let Some(c) = &self.capture {
                c.exited();
            }
        }
        self.exit
    }

    /// Waits for the process to end and for its output to be all in its log file.
    /// Cancel-safe: waiting again after a cancelled wait picks up where it was.
    pub async fn wait(&mut self) -> ExitInfo {
        if let Some(e) = self.exit {
            if let Some(c) = &mut self.capture {
                c.drained().await;
            }
            return e;
        }
        let info = match self.child.wait().await {
            Ok(s) => s.into(),
            Err(e) => {
                tracing::error!(error = %e, pid = self.pid.as_raw(), "waiting for the workload failed");
                ExitInfo {
                    code: -1,
                    signal: None,
                }
            }
        };
        if let Some(c) = &mut self.capture {
            c.exited();
            c.drained().await;
        }
        self.exited(info)
    }

    /// Asks for a checkpoint and waits until the workload says it is complete (the marker
    /// exists), the workload exits, or `within` passes.
    pub async fn checkpoint(&mut self, within: Duration) -> Result<(), WorkloadError> {
        let marker = self.checkpoint_dir.join(MARKER);
        remove_if_present(&marker)?;
        if let Some(e) = self.try_exit() {
            return Err(WorkloadError::ExitedDuringCheckpoint(e));
        }
        self.send(self.signal).await?;
        let waited = async {
            loop {
                if tokio::fs::try_exists(&marker).await.unwrap_or(false) {
                    return Ok(());
                }
                if let Some(e) = self.try_exit() {
                    // It may have written the marker just before it went.
                    if tokio::fs::try_exists(&marker).await.unwrap_or(false) {
                        return Ok(());
                    }
                    return Err(WorkloadError::ExitedDuringCheckpoint(e));
                }
                tokio::time::sleep(MARKER_POLL).await;
            }
        };
        tokio::time::timeout(within, waited)
            .await
            .map_err(|_| WorkloadError::CheckpointTimeout(within))?
    }

    /// Lets the workload write to its checkpoint directory again.
    pub fn release_checkpoint(&self) -> Result<(), WorkloadError> {
        remove_if_present(&self.checkpoint_dir.join(MARKER))
    }

    /// Stops the workload: SIGTERM to its process group, SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) -> ExitInfo {
        if let Some(e) = self.try_exit() {
            return e;
        }
        self.send_all(Signal::SIGTERM).await;
        if let Ok(info) = tokio::time::timeout(grace, self.wait()).await {
            return info;
        }
        tracing::warn!(
            pid = self.pid.as_raw(),
            container = self.container(),
            ?grace,
            "workload ignored SIGTERM; killing it"
        );
        self.send_all(Signal::SIGKILL).await;
        if matches!(self.runner, Runner::Host) {
            return self.wait().await;
        }
        // The engine reports a container killed so as exit code 137, as a shell would.
        let info = match tokio::time::timeout(CONTAINER_KILL_WAIT, self.wait()).await {
            Ok(info) => info,
            Err(_) => {
                // The container is gone but its attached CLI hangs on: let go of both.
                if let Runner::Container(c) = &mut self.runner {
                    c.remove();
                }
                let _ = self.child.start_kill();
                self.wait().await
            }
        };
        if info.code == 128 + Signal::SIGKILL as i32 {
            let info = ExitInfo {
                code: info.code,
                signal: Some(Signal::SIGKILL as i32),
            };
            self.exit = Some(info);
            return info;
        }
        info
    }
}

/// Creates the replica's checkpoint, home and temporary folders, private to its user (a
/// container's bind mounts need them before it is created).
pub fn prepare_folders(l: &Launch) -> Result<(), WorkloadError> {
    for dir in std::iter::once(&l.checkpoint_dir)
        .chain(&l.home_dir)
        .chain(&l.tmp_dir)
    {
        isolation::private_dir(dir, l.run_as)?;
    }
    Ok(())
}

fn remove_if_present(p: &Path) -> Result<(), WorkloadError> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(WorkloadError::Io {
            what: format!("removing {}", p.display()),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(dir: &Path, script: &str) -> Launch {
        Launch {
            job_id: JobId::new_at(1, 1),
            replica: 2,
            attempt: 3,
            node_id: None,
            command: vec!["bash".into(), "-c".into(), script.into()],
            env: BTreeMap::from([("EXTRA".into(), "x".into())]),
            devices: vec!["0".into(), "1".into()],
            checkpoint_dir: dir.join("ckpt"),
            resume_dir: None,
            home_dir: Some(dir.join("home")),
            tmp_dir: Some(dir.join("tmp")),
            signal: Signal::SIGUSR1,
            log: Some(LogSink::file(dir.join("log.txt"))),
            run_as: None,
            working_dir: None,
            container: None,
        }
    }

    #[tokio::test]
    async fn the_workload_sees_the_contract_and_its_env_and_nothing_of_the_agents() {
        let dir = tempfile::tempdir().expect("tmp");
        // The test runner's environment is the agent's here: none of it may reach the workload.
        let agent_vars: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .collect();
        assert!(!agent_vars.is_empty());
        let mut l = launch(dir.path(), "");
        // Not through bash, which adds variables of its own.
        l.command = vec!["env".into(), "-0".into()];
        l.node_id = Some(NodeId(uuid::Uuid::now_v7()));
        let mut w = Workload::start(&l).expect("start");
        assert_eq!(w.wait().await.code, 0);
        let out = std::fs::read(dir.path().join("log.txt")).expect("log");
        let seen: BTreeMap<String, String> = out
            .split(|b| *b == 0)
            .filter(|v| !v.is_empty())
            .filter_map(|v| {
                let v = String::from_utf8_lossy(v);
                v.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect();
        let names: Vec<&str> = seen.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "CUDA_VISIBLE_DEVICES",
                "EXTRA",
                "HOME",
                "PATH",
                "SPOTPLANE_ATTEMPT",
                "SPOTPLANE_CHECKPOINT_DIR",
                "SPOTPLANE_CHECKPOINT_MARKER",
                "SPOTPLANE_CHECKPOINT_SIGNAL",
                "SPOTPLANE_JOB_ID",
                "SPOTPLANE_NODE_ID",
                "SPOTPLANE_REPLICA",
                "TMPDIR",
            ]
        );
        assert_eq!(seen["PATH"], SAFE_PATH);
        assert_eq!(seen["HOME"], dir.path().join("home").display().to_string());
        // The job's own env wins over the defaults.
        let mut l = launch(dir.path(), "echo \"$PATH|$HOME\"");
        l.env
            .insert("PATH".into(), "/opt/job/bin:/usr/bin:/bin".into());
        l.env.insert("HOME".into(), "/job-home".into());
        l.log = Some(LogSink::file(dir.path().join("log2.txt")));
        let mut w = Workload::start(&l).expect("start");
        assert_eq!(w.wait().await.code, 0);
        let out = std::fs::read_to_string(dir.path().join("log2.txt")).expect("log");
        assert_eq!(out.trim(), "/opt/job/bin:/usr/bin:/bin|/job-home");
    }

    #[tokio::test]
    async fn a_workload_with_a_user_runs_as_it_without_groups_in_folders_of_its_own() {
        if crate::isolation::effective_uid().ok() != Some(0) {
            eprintln!("skipped: needs root to run a workload as another user");
            return;
        }
        let tmp = tempfile::tempdir().expect("tmp");
        crate::isolation::set_mode(tmp.path(), 0o711).expect("chmod");
        let mut l = launch(
            tmp.path(),
            "echo \"$(id -u) $(id -g) [$(grep Groups: /proc/self/status | cut -f2 | tr -d ' ')]\"; cat /proc/1/environ > /dev/null 2>&1 && echo read-pid-1; true",
        );
        l.run_as = Some(RunAs {
            uid: 200_555,
            gid: 200_555,
        });
        let mut w = Workload::start(&l).expect("start");
        assert_eq!(w.wait().await.code, 0);
        let out = std::fs::read_to_string(tmp.path().join("log.txt")).expect("log");
        // No supplementary groups (root's would be 0), and pid 1's environment unreadable.
        assert_eq!(out.trim(), "200555 200555 []");
        use std::os::unix::fs::MetadataExt;
        for d in ["ckpt", "home", "tmp"] {
            let m = std::fs::metadata(tmp.path().join(d)).expect("meta");
            assert_eq!((m.uid(), m.mode() & 0o777), (200_555, 0o700), "{d}");
        }
        let log = std::fs::metadata(tmp.path().join("log.txt")).expect("meta");
        assert_eq!((log.uid(), log.mode() & 0o777), (0, 0o600));
    }

    #[tokio::test]
    async fn a_host_replica_starts_in_its_working_directory_or_says_it_is_missing() {
        let dir = tempfile::tempdir().expect("tmp");
        let wd = dir.path().join("work space");
        std::fs::create_dir(&wd).expect("mkdir");
        let mut l = launch(dir.path(), "pwd");
        l.working_dir = Some(wd.clone());
        let mut w = Workload::start(&l).expect("start");
        assert_eq!(w.wait().await.code, 0);
        let log = std::fs::read_to_string(dir.path().join("log.txt")).expect("log");
        assert_eq!(log.trim(), wd.display().to_string());

        l.working_dir = Some(dir.path().join("missing"));
        let e = match Workload::start(&l) {
            Ok(_) => panic!("a missing folder must fail the start"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("working directory") && e.contains("missing") && e.contains("not a folder"),
            "{e}"
        );
    }

    #[test]
    fn signals_parse_with_or_without_their_prefix() {
        assert_eq!(parse_signal("SIGUSR1"), Ok(Signal::SIGUSR1));
        assert_eq!(parse_signal("usr2"), Ok(Signal::SIGUSR2));
        assert!(parse_signal("SIGNOPE").is_err());
    }

    #[tokio::test]
    async fn the_workload_gets_the_contract_environment_and_its_exit_is_reported() {
        let dir = tempfile::tempdir().expect("tmp");
        let script = "echo \"$SPOTPLANE_CHECKPOINT_DIR|$SPOTPLANE_JOB_ID|$SPOTPLANE_REPLICA|$SPOTPLANE_ATTEMPT|$CUDA_VISIBLE_DEVICES|$EXTRA|${SPOTPLANE_RESUME_DIR-unset}|$SPOTPLANE_CHECKPOINT_SIGNAL\"; exit 7";
        let l = launch(dir.path(), script);
        let mut w = Workload::start(&l).expect("start");
        assert_eq!(
            w.wait().await,
            ExitInfo {
                code: 7,
                signal: None
            }
        );
        let log = std::fs::read_to_string(dir.path().join("log.txt")).expect("log");
        assert_eq!(
            log.trim(),
            format!(
                "{}|{}|2|3|0,1|x|unset|SIGUSR1",
                l.checkpoint_dir.display(),
                l.job_id
            )
        );
    }

    #[tokio::test]
    async fn a_checkpoint_request_is_a_signal_answered_by_the_marker() {
        let dir = tempfile::tempdir().expect("tmp");
        let script = r#"trap 'echo 42 > "$SPOTPLANE_CHECKPOINT_DIR/step"; touch "$SPOTPLANE_CHECKPOINT_MARKER"' USR1
                        trap 'exit 143' TERM
                        while true; do sleep 0.05; done"#;
        let mut w = Workload::start(&launch(dir.path(), script)).expect("start");
        // Give bash a moment to install its traps.
        tokio::time::sleep(Duration::from_millis(300)).await;
        w.checkpoint(Duration::from_secs(10))
            .await
            .expect("checkpoint");
        let ckpt = dir.path().join("ckpt");
        assert_eq!(
            std::fs::read_to_string(ckpt.join("step"))
                .expect("written")
                .trim(),
            "42"
        );
        assert!(ckpt.join(MARKER).exists());
        w.release_checkpoint().expect("release");
        assert!(!ckpt.join(MARKER).exists());
        let exit = w.stop(Duration::from_secs(5)).await;
        assert_eq!(exit.code, 143, "{exit}");
    }

    #[tokio::test]
    async fn a_workload_that_exits_instead_of_checkpointing_is_an_error() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut w = Workload::start(&launch(
            dir.path(),
            "trap 'exit 3' USR1; while true; do sleep 0.05; done",
        ))
        .expect("start");
        tokio::time::sleep(Duration::from_millis(300)).await;
        match w.checkpoint(Duration::from_secs(10)).await {
            Err(WorkloadError::ExitedDuringCheckpoint(e)) => assert_eq!(e.code, 3),
            other => panic!("expected an exit, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_workload_that_ignores_sigterm_is_killed_after_the_grace_period() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut w = Workload::start(&launch(
            dir.path(),
            "trap '' TERM; while true; do sleep 0.05; done",
        ))
        .expect("start");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let exit = w.stop(Duration::from_millis(300)).await;
        assert_eq!(exit.signal, Some(9), "{exit}");
        assert_eq!(exit.code, 137);
    }

    #[tokio::test]
    async fn no_marker_in_time_is_a_timeout() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut w = Workload::start(&launch(
            dir.path(),
            "trap '' USR1; while true; do sleep 0.05; done",
        ))
        .expect("start");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(matches!(
            w.checkpoint(Duration::from_millis(300)).await,
            Err(WorkloadError::CheckpointTimeout(_))
        ));
        w.stop(Duration::from_secs(1)).await;
    }
}
