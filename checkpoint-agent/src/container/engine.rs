//! The engine: podman or docker, found by asking each for its version, with the settings
//! every container gets; how its commands are run, and its reason when one fails.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use spotplane_core::agent::ContainerEngineInfo;
use tokio::process::Command;

use super::{CONTROL_TIMEOUT, DEFAULT_CDI_SPEC_DIRS, ERROR_MAX, cdi_names};

/// Which engine runs images: `--container-runtime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RuntimeChoice {
    /// podman if it answers, else docker if its daemon answers, else none.
    #[default]
    Auto,
    Podman,
    Docker,
    /// Run no images on this node.
    None,
}

/// An OCI engine the agent drives through its CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Podman,
    Docker,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Podman => "podman",
            EngineKind::Docker => "docker",
        }
    }

    /// The arguments that print the engine's version, alone on a line. Docker's is the
    /// daemon's: a client without a reachable daemon runs nothing.
    fn version_args(self) -> [&'static str; 3] {
        match self {
            EngineKind::Podman => ["version", "--format", "{{.Client.Version}}"],
            EngineKind::Docker => ["version", "--format", "{{.Server.Version}}"],
        }
    }
}

/// The engine settings of `spotplane-agent run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSettings {
    pub runtime: RuntimeChoice,
    /// `--runtime` of every container: an OCI runtime's name or path (`runc`, `crun`,
    /// `nvidia`); the engine's default when `None`.
    pub oci_runtime: Option<String>,
    /// `--ulimit` of every container, `name=soft[:hard]` (checked by [`parse_ulimit`]).
    pub ulimits: Vec<String>,
    /// Flags added to every `create`, as they are (e.g. `--security-opt=label=disable`).
    pub extra_args: Vec<String>,
    /// Where CDI specs are looked for.
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// `--init`: a tiny init (catatonit, tini) is the container's PID 1 and the workload its
    /// child, so a workload without a SIGTERM handler still ends on SIGTERM.
    pub init: bool,
    /// How long a pull may take.
    pub pull_timeout: Duration,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            runtime: RuntimeChoice::Auto,
            oci_runtime: None,
            ulimits: Vec::new(),
            extra_args: Vec::new(),
            cdi_spec_dirs: DEFAULT_CDI_SPEC_DIRS.iter().map(PathBuf::from).collect(),
            init: false,
            pull_timeout: Duration::from_secs(30 * 60),
        }
    }
}

/// Checks a `--container-ulimit`: `nofile=1024:1024`, `nproc=4096`, `memlock=-1:-1`.
pub fn parse_ulimit(s: &str) -> Result<String, String> {
    let bad = || {
        format!("expected name=soft[:hard] with a lower-case name and numbers (or -1), got {s:?}")
    };
    let (name, limits) = s.split_once('=').ok_or_else(bad)?;
    let number = |v: &str| v == "-1" || (!v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
    let ok_name = !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase());
    let ok_limits = match limits.split_once(':') {
        Some((soft, hard)) => number(soft) && number(hard),
        None => number(limits),
    };
    if ok_name && ok_limits {
        Ok(s.to_owned())
    } else {
        Err(bad())
    }
}

/// The engine found on the node, with the settings every container gets.
#[derive(Debug)]
pub struct Engine {
    pub kind: EngineKind,
    /// The CLI (looked up on `PATH`).
    pub program: PathBuf,
    pub version: String,
    pub settings: EngineSettings,
    /// Whether a CDI spec lists the node's NVIDIA GPUs: devices then go as CDI names.
    pub cdi: bool,
}

impl Engine {
    /// What registration says of it.
    pub fn info(&self) -> ContainerEngineInfo {
        ContainerEngineInfo {
            kind: self.kind.as_str().to_owned(),
            version: self.version.clone(),
            cdi: self.cdi,
        }
    }

    pub(super) fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.stdin(Stdio::null()).kill_on_drop(true);
        c
    }

    /// Runs a control command, its output captured; an engine that does not answer within
    /// `timeout` is killed.
    pub(super) async fn run<I, S>(
        &self,
        args: I,
        timeout: Duration,
    ) -> Result<std::process::Output, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut c = self.command();
        c.args(args);
        run_captured(c, timeout, self.kind.as_str()).await
    }
}

pub(super) async fn run_captured(
    mut c: Command,
    timeout: Duration,
    what: &str,
) -> Result<std::process::Output, String> {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    match tokio::time::timeout(timeout, c.output()).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("{what} is not installed (not found on PATH)"))
        }
        Ok(Err(e)) => Err(format!("cannot run {what}: {e}")),
        Err(_) => Err(format!("{what} did not answer within {timeout:?}")),
    }
}

/// Finds the engine of the settings. `Err` says why there is none: the agent then registers
/// without one and refuses images with that reason.
pub async fn detect(settings: &EngineSettings) -> Result<Engine, String> {
    let kinds: &[EngineKind] = match settings.runtime {
        RuntimeChoice::Auto => &[EngineKind::Podman, EngineKind::Docker],
        RuntimeChoice::Podman => &[EngineKind::Podman],
        RuntimeChoice::Docker => &[EngineKind::Docker],
        RuntimeChoice::None => return Err("--container-runtime none".into()),
    };
    let mut why = Vec::new();
    for &kind in kinds {
        match probe(kind).await {
            Ok(version) => {
                let cdi = match cdi_names(&settings.cdi_spec_dirs).await {
                    Ok(names) => names.iter().any(|n| n.starts_with("nvidia.com/gpu=")),
                    Err(e) => {
                        tracing::warn!(error = %e, "CDI specs are not usable; GPUs go through NVIDIA_VISIBLE_DEVICES");
                        false
                    }
                };
                return Ok(Engine {
                    kind,
                    program: PathBuf::from(kind.as_str()),
                    version,
                    settings: settings.clone(),
                    cdi,
                });
            }
            Err(e) => why.push(format!("{}: {e}", kind.as_str())),
        }
    }
    Err(why.join("; "))
}

async fn probe(kind: EngineKind) -> Result<String, String> {
    let mut c = Command::new(kind.as_str());
    c.args(kind.version_args())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = run_captured(c, CONTROL_TIMEOUT, kind.as_str()).await?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || version.is_empty() {
        return Err(engine_error(&out, None));
    }
    Ok(version)
}

/// The engine's reason for a failed command: its `Error:` lines (the last few), else its
/// last line of output, trimmed to a few hundred characters, with `secret` blanked out.
pub fn engine_error(out: &std::process::Output, secret: Option<&str>) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let text = if stderr.trim().is_empty() {
        stdout
    } else {
        stderr
    };
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let errors: Vec<&str> = lines
        .iter()
        .filter_map(|l| {
            l.strip_prefix("Error response from daemon:")
                .or_else(|| l.strip_prefix("Error:"))
                .or_else(|| l.strip_prefix("error:"))
                .map(str::trim)
        })
        .collect();
    let mut msg = match (errors.as_slice(), lines.last()) {
        ([], Some(last)) => (*last).to_owned(),
        ([], None) => format!("{} with no output", out.status),
        (e, _) => e[e.len().saturating_sub(2)..].join("; "),
    };
    if let Some(s) = secret.filter(|s| !s.is_empty()) {
        msg = msg.replace(s, "<redacted>");
    }
    if msg.len() > ERROR_MAX {
        let mut cut = ERROR_MAX;
        while !msg.is_char_boundary(cut) {
            cut -= 1;
        }
        msg.truncate(cut);
        msg.push('…');
    }
    msg
}
