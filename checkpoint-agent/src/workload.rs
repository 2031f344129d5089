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

use crate::isolation::{self, IsolationError, RunAs};

/// The marker's file name inside the checkpoint directory.
pub const MARKER: &str = ".spotplane-checkpoint-complete";
/// `PATH` of a workload whose job sets none.
pub const SAFE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How often the agent looks for the marker.
const MARKER_POLL: Duration = Duration::from_millis(20);

/// What to start.
#[derive(Debug, Clone)]
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
    /// Where stdout and stderr go (a file only the agent reads); inherited when `None`.
    pub log: Option<PathBuf>,
    /// The user it runs as; the agent's own when `None`.
    pub run_as: Option<RunAs>,
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

/// A running replica.
#[derive(Debug)]
pub struct Workload {
    child: Child,
    pid: Pid,
    checkpoint_dir: PathBuf,
    signal: Signal,
    run_as: Option<RunAs>,
    exit: Option<ExitInfo>,
}

impl Workload {
    /// Starts the command in a process group of its own, as its user, with the contract's
    /// environment only.
    pub fn start(l: &Launch) -> Result<Workload, WorkloadError> {
        let (program, args) = l.command.split_first().ok_or(WorkloadError::EmptyCommand)?;
        for dir in std::iter::once(&l.checkpoint_dir)
            .chain(&l.home_dir)
            .chain(&l.tmp_dir)
        {
            isolation::private_dir(dir, l.run_as)?;
        }
        let marker = l.checkpoint_dir.join(MARKER);
        remove_if_present(&marker)?;
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
            .env("SPOTPLANE_CHECKPOINT_MARKER", &marker)
            .env("SPOTPLANE_CHECKPOINT_SIGNAL", l.signal.as_str())
            .env("SPOTPLANE_JOB_ID", l.job_id.to_string())
            .env("SPOTPLANE_REPLICA", l.replica.to_string())
            .env("SPOTPLANE_ATTEMPT", l.attempt.to_string())
            .env_remove("SPOTPLANE_RESUME_DIR")
            .env_remove("SPOTPLANE_NODE_ID")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        // std drops the supplementary groups (setgroups(0)) when a root parent sets a uid.
        if let Some(r) = l.run_as {
            cmd.uid(r.uid).gid(r.gid);
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
        if let Some(log) = &l.log {
            use std::os::unix::fs::OpenOptionsExt;
            if let Some(dir) = log.parent() {
                isolation::create_dirs(dir, 0o711)?;
            }
            let out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(log)
                .map_err(|source| WorkloadError::Io {
                    what: format!("opening {}", log.display()),
                    source,
                })?;
            let err = out.try_clone().map_err(|source| WorkloadError::Io {
                what: format!("opening {}", log.display()),
                source,
            })?;
            cmd.stdout(Stdio::from(out)).stderr(Stdio::from(err));
        }
        let child = cmd.spawn().map_err(|source| WorkloadError::Spawn {
            program: match (l.run_as, source.kind()) {
                (Some(r), std::io::ErrorKind::PermissionDenied) => format!(
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
        Ok(Workload {
            child,
            pid,
            checkpoint_dir: l.checkpoint_dir.clone(),
            signal: l.signal,
            run_as: l.run_as,
            exit: None,
        })
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
            self.exit = Some(status.into());
        }
        self.exit
    }

    /// Waits for the process to end.
    pub async fn wait(&mut self) -> ExitInfo {
        if let Some(e) = self.exit {
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
        self.exit = Some(info);
        info
    }

    /// Asks for a checkpoint and waits until the workload says it is complete (the marker
    /// exists), the workload exits, or `within` passes.
    pub async fn checkpoint(&mut self, within: Duration) -> Result<(), WorkloadError> {
        let marker = self.checkpoint_dir.join(MARKER);
        remove_if_present(&marker)?;
        if let Some(e) = self.try_exit() {
            return Err(WorkloadError::ExitedDuringCheckpoint(e));
        }
        kill(self.pid, self.signal).map_err(WorkloadError::Signal)?;
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
        if let Err(e) = killpg(self.pid, Signal::SIGTERM) {
            tracing::debug!(error = %e, "SIGTERM to the workload's group failed");
        }
        if let Ok(info) = tokio::time::timeout(grace, self.wait()).await {
            return info;
        }
        tracing::warn!(
            pid = self.pid.as_raw(),
            ?grace,
            "workload ignored SIGTERM; killing it"
        );
        if let Err(e) = killpg(self.pid, Signal::SIGKILL) {
            tracing::debug!(error = %e, "SIGKILL to the workload's group failed");
        }
        self.wait().await
    }
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
            log: Some(dir.join("log.txt")),
            run_as: None,
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
        l.log = Some(dir.path().join("log2.txt"));
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
