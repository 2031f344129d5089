//! Running a replica's image through an OCI engine on the node: podman or docker, through
//! their command-line interfaces.
//!
//! # How a container replica runs
//!
//! 1. **At agent start** the engine is found ([`detect`]: `--container-runtime auto` tries
//!    podman, then docker, asking each for its version) and reported at registration
//!    ([`Engine::info`]); a node without one registers without and refuses every image start.
//!    Containers this node's agent left behind (labelled `spotplane.node=<node id>`) are
//!    removed ([`remove_leftovers`]): no container outlives its agent unsupervised for longer
//!    than it takes the agent to come back.
//! 2. **Pull** ([`ensure_image`]) before the start is acknowledged, with the job's registry
//!    login in a short-lived 0600 auth file when it has one. An image present locally is not
//!    pulled again unless its reference is `:latest` (or untagged).
//! 3. **Devices** ([`select_devices`]): with a CDI spec for the node's GPUs (listed by
//!    `nvidia-ctk cdi list`), `--device nvidia.com/gpu=<name>` for exactly the replica's GPUs
//!    or MIG device, by UUID where the spec names them so; otherwise the NVIDIA runtime's
//!    `NVIDIA_VISIBLE_DEVICES=<uuids>` (`void` without a GPU).
//! 4. **Create** ([`create`], arguments from [`plan_create`], a pure function): the job's
//!    command as the entrypoint, as the job's user, its folders bind-mounted at fixed paths
//!    ([`IN_CHECKPOINT`], [`IN_RESUME`], [`IN_HOME`], [`IN_TMP`]), its environment through an
//!    env file (0600, the agent's, removed once the container exists), CPU and memory limits,
//!    host networking in a gang, the OCI runtime, ulimits and extra flags of the settings.
//!    Anything the engine refuses here (an unknown runtime, a CDI device it cannot resolve)
//!    fails the start with the engine's reason.
//! 5. **Start**: `<engine> start --attach <name>` is the replica's child process
//!    ([`crate::workload::Workload`]); its stdout and stderr are the workload's, its exit code
//!    the workload's. Signals go through `<engine> kill --signal …` ([`ContainerRun::signal`]),
//!    which reaches the workload whatever happens to the attached CLI. Once it has exited (or
//!    when the agent lets go of it), the container is removed.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use spotplane_core::NodeId;
use spotplane_core::agent::{ContainerEngineInfo, RegistryCredential, ReplicaLimits};
use tokio::process::Command;

use crate::inventory::{ListedMigDevice, parse_mig_devices};
use crate::workload::{Launch, MARKER};

/// Where a container replica finds its checkpoint folder (`SPOTPLANE_CHECKPOINT_DIR`).
pub const IN_CHECKPOINT: &str = "/spotplane/checkpoint";
/// Where a container replica finds the checkpoint it resumes from (`SPOTPLANE_RESUME_DIR`).
pub const IN_RESUME: &str = "/spotplane/resume";
/// `HOME` of a container replica (unless the job's env sets it).
pub const IN_HOME: &str = "/spotplane/home";
/// `TMPDIR` of a container replica (unless the job's env sets it).
pub const IN_TMP: &str = "/spotplane/tmp";
/// The label naming the node whose agent made a container.
pub const NODE_LABEL: &str = "spotplane.node";
/// Every container of the agent's is named `spotplane-<job>-<replica>-<attempt>`.
pub const NAME_PREFIX: &str = "spotplane-";
/// Directories searched for CDI specs when none are given.
pub const DEFAULT_CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
/// A value longer than this does not go through the env file (the engines read it a line
/// at a time into a 64 KiB buffer).
const ENV_FILE_VALUE_MAX: usize = 32 * 1024;
/// How long an engine may take over a control command (version, inspect, kill, rm, ps).
const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);
/// At most this much of an engine's error goes into a message.
const ERROR_MAX: usize = 600;

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

    fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.stdin(Stdio::null()).kill_on_drop(true);
        c
    }

    /// Runs a control command, its output captured; an engine that does not answer within
    /// `timeout` is killed.
    async fn run<I, S>(&self, args: I, timeout: Duration) -> Result<std::process::Output, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut c = self.command();
        c.args(args);
        run_captured(c, timeout, self.kind.as_str()).await
    }
}

async fn run_captured(
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
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
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

// ---------------------------------------------------------------------------------------
// GPUs: nvidia-smi -L and nvidia-ctk cdi list

/// A GPU line of `nvidia-smi -L`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGpu {
    pub index: u32,
    pub uuid: String,
}

/// What `nvidia-smi -L` lists: the GPUs, and their MIG devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmiList {
    pub gpus: Vec<ListedGpu>,
    pub migs: Vec<ListedMigDevice>,
}

/// Parses `nvidia-smi -L`:
/// ```text
/// GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5c1e…)
///   MIG 3g.40gb     Device  0: (UUID: MIG-2f0d…)
/// ```
/// A line that cannot be read is skipped.
pub fn parse_smi_list(text: &str) -> SmiList {
    let gpus = text
        .lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("GPU ")?;
            let (index, rest) = rest.split_once(':')?;
            let uuid = rest.rsplit_once("(UUID:")?.1.trim().trim_end_matches(')').trim();
            Some(ListedGpu {
                index: index.trim().parse().ok()?,
                uuid: uuid.to_owned(),
            })
            .filter(|g| g.uuid.starts_with("GPU-"))
        })
        .collect();
    SmiList {
        gpus,
        migs: parse_mig_devices(text),
    }
}

/// Parses `nvidia-ctk cdi list`: one fully qualified device name a line
/// (`nvidia.com/gpu=0`, `nvidia.com/gpu=GPU-…`, `nvidia.com/gpu=all`); the log lines it
/// prints (`INFO[0000] Found 5 CDI devices`) and anything else are skipped.
pub fn parse_cdi_list(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| {
            let Some((kind, name)) = l.split_once('=') else {
                return false;
            };
            let Some((vendor, class)) = kind.split_once('/') else {
                return false;
            };
            !vendor.is_empty()
                && !class.is_empty()
                && !name.is_empty()
                && vendor.contains('.')
                && !l.contains(char::is_whitespace)
                && !l.contains('[')
        })
        .map(str::to_owned)
        .collect()
}

/// The CDI devices of the spec directories, as `nvidia-ctk cdi list` names them; none when
/// no directory holds a spec. A spec without `nvidia-ctk` to read it is an error.
pub async fn cdi_names(dirs: &[PathBuf]) -> Result<Vec<String>, String> {
    let has_spec = dirs.iter().any(|d| {
        std::fs::read_dir(d).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                let p = e.path();
                matches!(
                    p.extension().and_then(|x| x.to_str()),
                    Some("yaml" | "yml" | "json")
                )
            })
        })
    });
    if !has_spec {
        return Ok(Vec::new());
    }
    let mut c = Command::new("nvidia-ctk");
    c.args(["cdi", "list"]).stdin(Stdio::null()).kill_on_drop(true);
    for d in dirs {
        c.arg("--spec-dir").arg(d);
    }
    let out = run_captured(c, CONTROL_TIMEOUT, "nvidia-ctk").await?;
    if !out.status.success() {
        return Err(format!("nvidia-ctk cdi list: {}", engine_error(&out, None)));
    }
    Ok(parse_cdi_list(&String::from_utf8_lossy(&out.stdout)))
}

/// How a container gets its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelection {
    /// `--device <name>` for each (none: no GPU), and `NVIDIA_VISIBLE_DEVICES=void`.
    Cdi(Vec<String>),
    /// `NVIDIA_VISIBLE_DEVICES=<value>`, for the NVIDIA runtime: UUIDs, or `void`.
    Visible(String),
}

/// Maps a replica's devices (`Start.devices`: GPU indices, or a MIG device's UUID) to what
/// the engine is given. With `cdi` (the names `nvidia-ctk cdi list` prints), each device
/// becomes the CDI name of exactly that GPU or MIG device, by UUID where the spec has UUID
/// names, else by index (`0`, `gpu0`; `0:1`, `mig0:1` for MIG device 1 of GPU 0); one that
/// has no CDI name is an error (the spec is stale: regenerate it). Without CDI, each becomes
/// its UUID where `nvidia-smi -L` knows it, else stays as given (an index the NVIDIA runtime
/// reads too).
pub fn select_devices(
    devices: &[String],
    smi: &SmiList,
    cdi: Option<&[String]>,
) -> Result<DeviceSelection, String> {
    let mut names = Vec::new();
    for d in devices {
        let d = d.trim();
        // (uuid, index forms) of the device.
        let (uuid, indexed): (Option<String>, Vec<String>) = if d.starts_with("MIG-") {
            let forms = smi
                .migs
                .iter()
                .find(|m| m.uuid == d)
                .map(|m| {
                    vec![
                        format!("{}:{}", m.gpu, m.device),
                        format!("mig{}:{}", m.gpu, m.device),
                    ]
                })
                .unwrap_or_default();
            (Some(d.to_owned()), forms)
        } else if d.starts_with("GPU-") {
            let forms = smi
                .gpus
                .iter()
                .find(|g| g.uuid == d)
                .map(|g| vec![g.index.to_string(), format!("gpu{}", g.index)])
                .unwrap_or_default();
            (Some(d.to_owned()), forms)
        } else if let Ok(index) = d.parse::<u32>() {
            let uuid = smi
                .gpus
                .iter()
                .find(|g| g.index == index)
                .map(|g| g.uuid.clone());
            (uuid, vec![index.to_string(), format!("gpu{index}")])
        } else {
            return Err(format!(
                "device {d:?} is neither a GPU index nor a GPU or MIG UUID"
            ));
        };
        match cdi {
            Some(list) => {
                let found = uuid
                    .iter()
                    .chain(&indexed)
                    .map(|n| format!("nvidia.com/gpu={n}"))
                    .find(|n| list.contains(n));
                match found {
                    Some(n) => names.push(n),
                    None => {
                        return Err(format!(
                            "device {d} has no CDI name in the node's spec (nvidia-ctk cdi list lists {}); regenerate it with nvidia-ctk cdi generate",
                            if list.is_empty() {
                                "nothing".to_owned()
                            } else {
                                list.join(", ")
                            }
                        ));
                    }
                }
            }
            None => names.push(uuid.unwrap_or_else(|| d.to_owned())),
        }
    }
    // A device named twice (two shares of one GPU) is given once.
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    Ok(match cdi {
        Some(_) => DeviceSelection::Cdi(names),
        None if names.is_empty() => DeviceSelection::Visible("void".into()),
        None => DeviceSelection::Visible(names.join(",")),
    })
}

/// The devices of a replica about to start, read from the node now (a MIG re-layout makes
/// new devices).
pub async fn devices_for(engine: &Engine, devices: &[String]) -> Result<DeviceSelection, String> {
    if devices.is_empty() {
        return Ok(if engine.cdi {
            DeviceSelection::Cdi(Vec::new())
        } else {
            DeviceSelection::Visible("void".into())
        });
    }
    let mut c = Command::new("nvidia-smi");
    c.arg("-L").stdin(Stdio::null()).kill_on_drop(true);
    let smi = match run_captured(c, CONTROL_TIMEOUT, "nvidia-smi").await {
        Ok(out) if out.status.success() => parse_smi_list(&String::from_utf8_lossy(&out.stdout)),
        Ok(out) => {
            tracing::warn!(error = %engine_error(&out, None), "nvidia-smi -L failed; devices go by index");
            SmiList::default()
        }
        Err(e) => {
            tracing::warn!(error = %e, "devices go by index");
            SmiList::default()
        }
    };
    if engine.cdi {
        let names = cdi_names(&engine.settings.cdi_spec_dirs).await?;
        select_devices(devices, &smi, Some(&names))
    } else {
        select_devices(devices, &smi, None)
    }
}

// ---------------------------------------------------------------------------------------
// Images: references and pulls

/// An image reference as both engines read it alike: Docker Hub's short names made whole
/// (`ubuntu:22.04` → `docker.io/library/ubuntu:22.04`, `acme/train` →
/// `docker.io/acme/train`), so podman never asks which registry a short name means.
pub fn normalize_image(image: &str) -> String {
    let image = image.trim();
    match image.split_once('/') {
        None => format!("docker.io/library/{image}"),
        Some((first, _)) if is_registry(first) => image.to_owned(),
        Some(_) => format!("docker.io/{image}"),
    }
}

fn is_registry(component: &str) -> bool {
    component.contains('.') || component.contains(':') || component == "localhost"
}

/// The registry host of a (normalized) reference: `ghcr.io`, `localhost:5000`, `docker.io`.
pub fn registry_host(image: &str) -> String {
    let n = normalize_image(image);
    n.split('/').next().unwrap_or_default().to_owned()
}

/// Whether a present image is pulled again: `:latest` or no tag (which means latest), and
/// no digest (`@sha256:…` never changes).
pub fn refreshes(image: &str) -> bool {
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains('@') {
        return false;
    }
    match last.split_once(':') {
        Some((_, tag)) => tag == "latest",
        None => true,
    }
}

/// The auth file of one registry login, in the engines' common format
/// (`{"auths": {"<host>": {"auth": base64(user:password)}}}`). Docker keys Docker Hub as
/// `https://index.docker.io/v1/`.
pub fn auth_json(kind: EngineKind, host: &str, cred: &RegistryCredential) -> String {
    use base64::Engine as _;
    let key = match (kind, host) {
        (EngineKind::Docker, "docker.io") => "https://index.docker.io/v1/",
        _ => host,
    };
    let auth = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", cred.username, cred.password));
    serde_json::json!({ "auths": { key: { "auth": auth } } }).to_string()
}

/// What [`ensure_image`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageReady {
    /// Present locally and pinned: not pulled.
    Present,
    Pulled,
    /// A `:latest` present locally could not be pulled again: the local one runs (podman's
    /// `--pull newer`). The reason is logged.
    KeptLocal(String),
}

/// Makes sure the image is on the node, pulling it with `credential` when there is one.
/// The login goes into an auth file of its own (0600, in a 0700 folder under `scratch`,
/// deleted before this returns): podman's `--authfile`, docker's `DOCKER_CONFIG`. An image
/// that is neither present nor pullable is `Err("pulling <image>: <the engine's reason>")`.
pub async fn ensure_image(
    engine: &Engine,
    image: &str,
    credential: Option<&RegistryCredential>,
    scratch: &Path,
) -> Result<ImageReady, String> {
    let image = normalize_image(image);
    let present = engine
        .run(
            ["image", "inspect", "--format", "{{.Id}}", image.as_str()],
            CONTROL_TIMEOUT,
        )
        .await?
        .status
        .success();
    if present && !refreshes(&image) {
        return Ok(ImageReady::Present);
    }
    let mut c = engine.command();
    c.arg("pull");
    // Dropped (the folder and its file deleted) when this function returns.
    let _auth = match credential {
        Some(cred) => {
            let dir = tempfile::Builder::new()
                .prefix(".pull-")
                .tempdir_in(scratch)
                .map_err(|e| format!("pulling {image}: cannot make its auth folder: {e}"))?;
            let file = match engine.kind {
                EngineKind::Podman => dir.path().join("auth.json"),
                EngineKind::Docker => dir.path().join("config.json"),
            };
            write_private(
                &file,
                auth_json(engine.kind, &registry_host(&image), cred).as_bytes(),
            )
            .map_err(|e| format!("pulling {image}: cannot write its auth file: {e}"))?;
            match engine.kind {
                EngineKind::Podman => {
                    c.arg("--authfile").arg(&file);
                }
                EngineKind::Docker => {
                    c.env("DOCKER_CONFIG", dir.path());
                }
            }
            Some(dir)
        }
        None => None,
    };
    c.arg(&image);
    let out = run_captured(c, engine.settings.pull_timeout, engine.kind.as_str()).await;
    let secret = credential.map(|c| c.password.as_str());
    let failed = match out {
        Ok(out) if out.status.success() => return Ok(ImageReady::Pulled),
        Ok(out) => engine_error(&out, secret),
        Err(e) => e,
    };
    if present {
        tracing::warn!(%image, reason = %failed, "pulling a newer image failed; the local one runs");
        return Ok(ImageReady::KeptLocal(failed));
    }
    Err(format!("pulling {image}: {failed}"))
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(data)
}

// ---------------------------------------------------------------------------------------
// Containers

/// What makes a replica a container replica (`Launch::container`).
#[derive(Debug, Clone)]
pub struct ContainerLaunch {
    pub engine: Arc<Engine>,
    /// The image reference (normalized, [`normalize_image`]).
    pub image: String,
    /// `spotplane-<job>-<replica>-<attempt>` ([`container_name`]).
    pub name: String,
    /// The node whose agent runs it (its label, for [`remove_leftovers`]).
    pub node_id: NodeId,
    pub devices: DeviceSelection,
    pub limits: Option<ReplicaLimits>,
    /// Host networking: for a replica of a gang (NCCL between nodes).
    pub host_network: bool,
    /// The env file written for `create` (the agent's, 0600; removed once it has run).
    pub env_file: PathBuf,
}

/// The container's name for one attempt of a replica.
pub fn container_name(job: spotplane_core::JobId, replica: u32, attempt: u32) -> String {
    format!("{NAME_PREFIX}{job}-{replica}-{attempt}")
}

/// What `create` is run with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePlan {
    /// The engine's arguments, from `create` to the command's last argument.
    pub args: Vec<String>,
    /// The env file's content: `NAME=value` lines.
    pub env_file: String,
    /// Variables whose value cannot go through an env file (a line break, a very long
    /// value): passed as `--env NAME`, the value in the engine process's own environment.
    pub engine_env: Vec<(String, String)>,
}

/// The environment of a container replica: the job's, then the contract's with the paths
/// inside the container; its GPUs' variable last, so neither the job nor the image can
/// widen them.
pub fn container_env(l: &Launch, c: &ContainerLaunch) -> BTreeMap<String, String> {
    let mut env = l.env.clone();
    if l.home_dir.is_some() {
        env.entry("HOME".into()).or_insert_with(|| IN_HOME.into());
    }
    if l.tmp_dir.is_some() {
        env.entry("TMPDIR".into()).or_insert_with(|| IN_TMP.into());
    }
    let ours = [
        ("SPOTPLANE_CHECKPOINT_DIR", IN_CHECKPOINT.to_owned()),
        (
            "SPOTPLANE_CHECKPOINT_MARKER",
            format!("{IN_CHECKPOINT}/{MARKER}"),
        ),
        ("SPOTPLANE_CHECKPOINT_SIGNAL", l.signal.as_str().to_owned()),
        ("SPOTPLANE_JOB_ID", l.job_id.to_string()),
        ("SPOTPLANE_REPLICA", l.replica.to_string()),
        ("SPOTPLANE_ATTEMPT", l.attempt.to_string()),
    ];
    for (k, v) in ours {
        env.insert(k.into(), v);
    }
    env.remove("SPOTPLANE_RESUME_DIR");
    env.remove("SPOTPLANE_NODE_ID");
    if l.resume_dir.is_some() {
        env.insert("SPOTPLANE_RESUME_DIR".into(), IN_RESUME.into());
    }
    if let Some(n) = l.node_id {
        env.insert("SPOTPLANE_NODE_ID".into(), n.to_string());
    }
    let visible = match &c.devices {
        DeviceSelection::Cdi(_) => "void".to_owned(),
        DeviceSelection::Visible(v) => v.clone(),
    };
    env.insert("NVIDIA_VISIBLE_DEVICES".into(), visible);
    env
}

/// Whether the engine (or the libraries and runtimes under it) reads a variable of this
/// name from its own environment: such a variable never goes there.
pub fn engine_reads(name: &str) -> bool {
    const EXACT: [&str; 22] = [
        "PATH",
        "HOME",
        "TMPDIR",
        "TMP",
        "TEMP",
        "USER",
        "SHELL",
        "TZ",
        "TZDIR",
        "LANG",
        "LANGUAGE",
        "NOTIFY_SOCKET",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "RES_OPTIONS",
        "GCONV_PATH",
        "LOCPATH",
        "NLSPATH",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
    ];
    const PREFIXES: [&str; 20] = [
        "LD_",
        "LC_",
        "GO",
        "MALLOC_",
        "DOCKER",
        "CONTAINER",
        "PODMAN",
        "BUILDAH",
        "STORAGE",
        "REGISTRY",
        "XDG_",
        "DBUS_",
        "SYSTEMD_",
        "LISTEN_",
        "CGROUP",
        "NVIDIA",
        "CDI",
        "SSL_",
        "OCI",
        "_",
    ];
    let up = name.to_ascii_uppercase();
    EXACT.contains(&up.as_str()) || PREFIXES.iter().any(|p| up.starts_with(p))
}

/// The `create` of a container replica (pure: table-tested).
pub fn plan_create(l: &Launch, c: &ContainerLaunch) -> Result<CreatePlan, String> {
    let (program, args) = l
        .command
        .split_first()
        .ok_or_else(|| "the command is empty".to_owned())?;
    let s = &c.engine.settings;
    let mut a: Vec<String> = vec![
        "create".into(),
        "--name".into(),
        c.name.clone(),
        "--label".into(),
        format!("{NODE_LABEL}={}", c.node_id),
        "--label".into(),
        format!("spotplane.job={}", l.job_id),
        "--label".into(),
        format!("spotplane.replica={}", l.replica),
        "--label".into(),
        format!("spotplane.attempt={}", l.attempt),
        // Pulled (with the job's login) before; never behind the agent's back.
        "--pull".into(),
        "never".into(),
        // The agent keeps the output (the attached stdout and stderr); the engine keeps none.
        "--log-driver".into(),
        "none".into(),
        "--security-opt".into(),
        "no-new-privileges".into(),
    ];
    if let Some(r) = l.run_as {
        a.push("--user".into());
        a.push(format!("{}:{}", r.uid, r.gid));
    }
    let mounts = std::iter::once((Some(&l.checkpoint_dir), IN_CHECKPOINT))
        .chain([
            (l.resume_dir.as_ref(), IN_RESUME),
            (l.home_dir.as_ref(), IN_HOME),
            (l.tmp_dir.as_ref(), IN_TMP),
        ])
        .filter_map(|(host, inside)| host.map(|h| (h, inside)));
    for (host, inside) in mounts {
        let h = host
            .to_str()
            .filter(|h| !h.contains(','))
            .ok_or_else(|| format!("cannot bind-mount {} (a path with a comma or not UTF-8)", host.display()))?;
        a.push("--mount".into());
        a.push(format!("type=bind,src={h},dst={inside}"));
    }
    let mut env_file = String::new();
    let mut engine_env = Vec::new();
    for (k, v) in container_env(l, c) {
        if v.contains(['\n', '\r']) || v.len() > ENV_FILE_VALUE_MAX {
            if engine_reads(&k) {
                return Err(format!(
                    "env {k}: a value with a line break (or over {ENV_FILE_VALUE_MAX} bytes) reaches a container only through the engine's own environment, which {k} would change; make it one line"
                ));
            }
            engine_env.push((k, v));
        } else if v.contains('\0') {
            return Err(format!("env {k}: a value holds a NUL byte"));
        } else {
            env_file.push_str(&k);
            env_file.push('=');
            env_file.push_str(&v);
            env_file.push('\n');
        }
    }
    a.push("--env-file".into());
    a.push(c.env_file.display().to_string());
    for (k, _) in &engine_env {
        a.push("--env".into());
        a.push(k.clone());
    }
    if let Some(lim) = c.limits {
        if lim.cpu_milli > 0 {
            a.push("--cpus".into());
            a.push(cpus(lim.cpu_milli));
        }
        if lim.memory_mib > 0 {
            // Swap as large as memory: none beyond it.
            a.push("--memory".into());
            a.push(format!("{}m", lim.memory_mib));
            a.push("--memory-swap".into());
            a.push(format!("{}m", lim.memory_mib));
        }
    }
    if let DeviceSelection::Cdi(names) = &c.devices {
        for n in names {
            a.push("--device".into());
            a.push(n.clone());
        }
    }
    if c.host_network {
        a.push("--network".into());
        a.push("host".into());
    }
    if let Some(r) = &s.oci_runtime {
        a.push("--runtime".into());
        a.push(r.clone());
    }
    for u in &s.ulimits {
        a.push("--ulimit".into());
        a.push(u.clone());
    }
    if s.init {
        a.push("--init".into());
    }
    a.extend(s.extra_args.iter().cloned());
    // The job's command replaces the image's entrypoint, as a Kubernetes `command` does.
    a.push("--entrypoint".into());
    a.push(program.clone());
    a.push(c.image.clone());
    a.extend(args.iter().cloned());
    Ok(CreatePlan {
        args: a,
        env_file,
        engine_env,
    })
}

/// `--cpus` of a share in thousandths: 2500 → `2.5`.
fn cpus(milli: u32) -> String {
    let whole = milli / 1000;
    let frac = milli % 1000;
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{frac:03}").trim_end_matches('0').to_owned()
    }
}

/// Creates the container of a replica (not started yet: [`ContainerRun::attach_command`]
/// starts it). A container of the same name left from before is removed first. The env
/// file lives only while `create` runs.
pub async fn create(l: &Launch, c: &ContainerLaunch) -> Result<(), String> {
    let plan = plan_create(l, c)?;
    crate::workload::prepare_folders(l).map_err(|e| e.to_string())?;
    let _ = c
        .engine
        .run(["rm", "--force", c.name.as_str()], CONTROL_TIMEOUT)
        .await;
    write_private(&c.env_file, plan.env_file.as_bytes()).or_else(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            std::fs::remove_file(&c.env_file)
                .and_then(|()| write_private(&c.env_file, plan.env_file.as_bytes()))
        } else {
            Err(e)
        }
    })
    .map_err(|e| format!("writing {}: {e}", c.env_file.display()))?;
    let mut cmd = c.engine.command();
    cmd.args(&plan.args);
    for (k, v) in &plan.engine_env {
        cmd.env(k, v);
    }
    let out = run_captured(cmd, CONTROL_TIMEOUT, c.engine.kind.as_str()).await;
    if let Err(e) = std::fs::remove_file(&c.env_file) {
        tracing::error!(error = %e, file = %c.env_file.display(), "cannot remove a container's env file");
    }
    let out = out.map_err(|e| format!("creating the container: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "creating the container of {}: {}",
            c.image,
            engine_error(&out, None)
        ));
    }
    Ok(())
}

/// A created container, as its [`crate::workload::Workload`] drives it.
#[derive(Debug)]
pub struct ContainerRun {
    engine: Arc<Engine>,
    name: String,
    removed: bool,
}

impl ContainerRun {
    pub fn new(c: &ContainerLaunch) -> ContainerRun {
        ContainerRun {
            engine: c.engine.clone(),
            name: c.name.clone(),
            removed: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `<engine> start --attach <name>`: the replica's child process. Its stdout and stderr
    /// are the workload's, its exit code the workload's.
    pub fn attach_command(&self) -> Command {
        let mut c = Command::new(&self.engine.program);
        c.args(["start", "--attach", self.name.as_str()]);
        c
    }

    /// Sends `signal` to the workload (its PID 1 in the container).
    pub async fn signal(&self, signal: nix::sys::signal::Signal) -> Result<(), String> {
        let out = self
            .engine
            .run(
                ["kill", "--signal", signal.as_str(), self.name.as_str()],
                CONTROL_TIMEOUT,
            )
            .await?;
        if out.status.success() {
            Ok(())
        } else {
            Err(engine_error(&out, None))
        }
    }

    /// Removes the container (killing it if it still runs), in the background, once.
    pub fn remove(&mut self) {
        if std::mem::replace(&mut self.removed, true) {
            return;
        }
        let mut c = std::process::Command::new(&self.engine.program);
        c.args(["rm", "--force", self.name.as_str()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let name = self.name.clone();
        // Off the runtime's threads: this also runs from Drop.
        std::thread::spawn(move || match c.output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                tracing::warn!(container = %name, error = %engine_error(&out, None), "cannot remove the container");
            }
            Err(e) => tracing::warn!(container = %name, error = %e, "cannot remove the container"),
        });
    }
}

impl Drop for ContainerRun {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Removes the containers an earlier agent of this node left (after a crash or a kill), so
/// none runs on unsupervised. Returns how many it removed.
pub async fn remove_leftovers(engine: &Engine, node: NodeId) -> usize {
    let filter = format!("label={NODE_LABEL}={node}");
    let listed = engine
        .run(
            ["ps", "--all", "--filter", filter.as_str(), "--format", "{{.Names}}"],
            CONTROL_TIMEOUT,
        )
        .await;
    let names: Vec<String> = match listed {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim)
            .filter(|n| n.starts_with(NAME_PREFIX))
            .map(str::to_owned)
            .collect(),
        Ok(out) => {
            tracing::warn!(error = %engine_error(&out, None), "cannot list leftover containers");
            return 0;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot list leftover containers");
            return 0;
        }
    };
    if names.is_empty() {
        return 0;
    }
    let mut args: Vec<OsString> = vec!["rm".into(), "--force".into()];
    args.extend(names.iter().map(OsString::from));
    match engine.run(args, CONTROL_TIMEOUT).await {
        Ok(out) if out.status.success() => {
            tracing::warn!(containers = ?names, "removed containers an earlier agent of this node left");
            names.len()
        }
        Ok(out) => {
            tracing::error!(containers = ?names, error = %engine_error(&out, None), "cannot remove leftover containers");
            0
        }
        Err(e) => {
            tracing::error!(containers = ?names, error = %e, "cannot remove leftover containers");
            0
        }
    }
}
