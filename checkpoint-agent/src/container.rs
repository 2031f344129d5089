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
            let uuid = rest
                .rsplit_once("(UUID:")?
                .1
                .trim()
                .trim_end_matches(')')
                .trim();
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
    c.args(["cdi", "list"])
        .stdin(Stdio::null())
        .kill_on_drop(true);
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

/// Checks that `image` is an image reference (`[registry/]name[:tag][@digest]`) and nothing an
/// engine could read as a flag: it starts with a letter or digit and holds only the
/// characters references use.
/// The control plane checks the same at submit ([`spotplane_core::job::check_image_reference`]);
/// the agent checks again, since a command may come from an older control plane.
pub fn check_reference(image: &str) -> Result<(), String> {
    spotplane_core::job::check_image_reference(image)
        .map_err(|m| format!("{image:?} is not an image reference: it {m}"))
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
    check_reference(image.trim()).map_err(|e| format!("pulling {image}: {e}"))?;
    let image = normalize_image(image);
    let present = engine
        .run(
            ["image", "inspect", "--format", "{{.Id}}", image.as_str()],
            CONTROL_TIMEOUT,
        )
        .await
        .map_err(|e| format!("pulling {image}: {e}"))?
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

/// What `create` is run with. Its `Debug` leaves out the environment's values: they may be
/// secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct CreatePlan {
    /// The engine's arguments, from `create` to the command's last argument.
    pub args: Vec<String>,
    /// The env file's content: `NAME=value` lines.
    pub env_file: String,
    /// Variables whose value cannot go through an env file (a line break, a very long
    /// value): passed as `--env NAME`, the value in the engine process's own environment.
    pub engine_env: Vec<(String, String)>,
}

impl std::fmt::Debug for CreatePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatePlan")
            .field("args", &self.args)
            .field(
                "env_file",
                &self
                    .env_file
                    .lines()
                    .filter_map(|l| l.split_once('=').map(|(k, _)| k))
                    .collect::<Vec<_>>(),
            )
            .field(
                "engine_env",
                &self.engine_env.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
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
    check_reference(&c.image)?;
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
        let h = host.to_str().filter(|h| !h.contains(',')).ok_or_else(|| {
            format!(
                "cannot bind-mount {} (a path with a comma or not UTF-8)",
                host.display()
            )
        })?;
        a.push("--mount".into());
        a.push(format!("type=bind,src={h},dst={inside}"));
    }
    let mut env_file = String::new();
    let mut engine_env = Vec::new();
    for (k, v) in container_env(l, c) {
        let name_ok = k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !name_ok {
            return Err(format!("env {k:?}: not a variable name"));
        }
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
        a.push(format!("--env={k}"));
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
    if let Some(d) = &l.working_dir {
        a.push("--workdir".into());
        a.push(d.display().to_string());
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
    // The job's command replaces the image's entrypoint, as a Kubernetes `command` does. In
    // one argument with its flag, so no value of the job's is read as a flag of the engine's
    // (and the image reference is checked); what follows the image is the container's.
    a.push(format!("--entrypoint={program}"));
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
        format!("{whole}.{frac:03}")
            .trim_end_matches('0')
            .to_owned()
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
    write_private(&c.env_file, plan.env_file.as_bytes())
        .or_else(|e| {
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
            [
                "ps",
                "--all",
                "--filter",
                filter.as_str(),
                "--format",
                "{{.Names}}",
            ],
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolation::RunAs;
    use nix::sys::signal::Signal;
    use spotplane_core::JobId;

    const SMI: &str = include_str!("../tests/fixtures/nvidia-smi-L-h100x2-mig.txt");
    const CDI: &str = include_str!("../tests/fixtures/nvidia-ctk-cdi-list-h100x2-mig.txt");
    const CDI_TYPE_INDEX: &str =
        include_str!("../tests/fixtures/nvidia-ctk-cdi-list-type-index.txt");
    const GPU0: &str = "GPU-5c1e8a52-2f3b-6a1d-9c0e-3b7f1d2a4e61";
    const GPU1: &str = "GPU-a4f0c9d3-71e2-4b8a-8d5c-6e9f2b1a7c38";
    const MIG_1_0: &str = "MIG-2f0d6c1e-8b4a-5f3d-9e2c-7a1b0c4d3e5f";
    const MIG_1_2: &str = "MIG-0e4b7d2c-6a1f-5c3e-8d9b-2f1a3c4e5d6b";

    fn output(code: i32, stdout: &str, stderr: &str) -> std::process::Output {
        use std::os::unix::process::ExitStatusExt;
        std::process::Output {
            status: std::process::ExitStatus::from_raw(code << 8),
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
        }
    }

    #[test]
    fn ulimits_are_name_equals_soft_and_optional_hard() {
        for ok in [
            "nofile=1024:1024",
            "nproc=1024",
            "memlock=-1:-1",
            "stack=8192:-1",
        ] {
            assert_eq!(parse_ulimit(ok).as_deref(), Ok(ok));
        }
        for bad in [
            "nofile",
            "nofile=",
            "NOFILE=1",
            "nofile=1:",
            "nofile=a:b",
            "=1",
            "no-file=1",
        ] {
            let e = parse_ulimit(bad).expect_err(bad);
            assert!(e.contains("name=soft[:hard]") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn an_engines_reason_is_its_last_error_lines_without_the_password() {
        // podman 4.3.1 pulling from nothing, as recorded on this project's test machine.
        let podman = "Trying to pull localhost:1/nope:1...\n\
            time=\"2026-12-03T06:27:54Z\" level=warning msg=\"Failed, retrying in 1s ... (1/3). Error: initializing source docker://localhost:1/nope:1: pinging container registry localhost:1: Get \\\"https://localhost:1/v2/\\\": dial tcp 127.0.0.1:1: connect: connection refused\"\n\
            Error: initializing source docker://localhost:1/nope:1: pinging container registry localhost:1: Get \"https://localhost:1/v2/\": dial tcp 127.0.0.1:1: connect: connection refused\n";
        let cases: [(&str, &str, Option<&str>, &str); 5] = [
            (
                "",
                podman,
                None,
                "initializing source docker://localhost:1/nope:1: pinging container registry localhost:1: Get \"https://localhost:1/v2/\": dial tcp 127.0.0.1:1: connect: connection refused",
            ),
            (
                "",
                "Error response from daemon: pull access denied for acme/train, repository does not exist or may require 'docker login'\n",
                None,
                "pull access denied for acme/train, repository does not exist or may require 'docker login'",
            ),
            (
                "",
                "Error: unable to retrieve auth token: invalid username/password: hunter2 refused\n",
                Some("hunter2"),
                "unable to retrieve auth token: invalid username/password: <redacted> refused",
            ),
            ("", "some warning\nthe last line\n", None, "the last line"),
            ("only stdout\n", "", None, "only stdout"),
        ];
        for (stdout, stderr, secret, want) in cases {
            assert_eq!(engine_error(&output(125, stdout, stderr), secret), want);
        }
        let silent = engine_error(&output(3, "", ""), None);
        assert!(silent.contains("exit status: 3"), "{silent}");
        let long = engine_error(
            &output(1, "", &format!("Error: {}", "é".repeat(1000))),
            None,
        );
        assert!(long.len() <= ERROR_MAX + '…'.len_utf8() && long.ends_with('…'));
    }

    #[test]
    fn image_references_are_made_whole_as_docker_reads_them() {
        let cases = [
            ("ubuntu", "docker.io/library/ubuntu", "docker.io"),
            (
                "ubuntu:22.04",
                "docker.io/library/ubuntu:22.04",
                "docker.io",
            ),
            ("acme/train:1", "docker.io/acme/train:1", "docker.io"),
            ("ghcr.io/acme/train:1", "ghcr.io/acme/train:1", "ghcr.io"),
            (
                "localhost/spotplane-example-train:test",
                "localhost/spotplane-example-train:test",
                "localhost",
            ),
            ("localhost:1/nope:1", "localhost:1/nope:1", "localhost:1"),
            (
                "registry.example.com:5000/team/img@sha256:abc",
                "registry.example.com:5000/team/img@sha256:abc",
                "registry.example.com:5000",
            ),
        ];
        for (image, whole, host) in cases {
            assert_eq!(normalize_image(image), whole, "{image}");
            assert_eq!(registry_host(image), host, "{image}");
        }
    }

    #[test]
    fn an_image_reference_is_never_read_as_a_flag() {
        for ok in [
            "ubuntu",
            "ghcr.io/acme/train:1",
            "localhost:5000/a/b_c-d.e:v1.2",
            "ghcr.io/acme/train@sha256:0123abc",
        ] {
            assert_eq!(check_reference(ok), Ok(()), "{ok}");
        }
        for bad in [
            "--privileged",
            "-v/:/host",
            "--privileged.io/x",
            "a b",
            "a\nb",
            "ghcr.io//x",
            "",
            "x;y",
        ] {
            let e = check_reference(bad).expect_err(bad);
            assert!(e.contains("is not an image reference"), "{e}");
        }
        let mut c = container(EngineSettings::default());
        c.image = "--privileged.io/x:1".into();
        assert!(plan_create(&launch(), &c).is_err());
        // The job's command cannot be a flag of the engine's either.
        let mut l = launch();
        l.command = vec!["--privileged".into(), "-v".into()];
        let p = plan_create(&l, &container(EngineSettings::default())).expect("plan");
        let at = p
            .args
            .iter()
            .position(|x| x == "ghcr.io/acme/train:1")
            .expect("image");
        assert_eq!(p.args[at - 1], "--entrypoint=--privileged");
        assert_eq!(p.args[at + 1..], ["-v"]);
    }

    #[test]
    fn only_latest_or_untagged_images_are_pulled_again_when_present() {
        let cases = [
            ("ghcr.io/acme/train:1", false),
            ("ghcr.io/acme/train:latest", true),
            ("ghcr.io/acme/train", true),
            ("localhost:5000/train", true),
            ("localhost:5000/train:2", false),
            ("ghcr.io/acme/train@sha256:0123", false),
            ("ghcr.io/acme/train:latest@sha256:0123", false),
        ];
        for (image, again) in cases {
            assert_eq!(refreshes(image), again, "{image}");
        }
    }

    #[test]
    fn the_auth_file_holds_one_login_for_the_images_registry() {
        use base64::Engine as _;
        let cred = RegistryCredential {
            username: "robot$ci".into(),
            password: "pa:ss".into(),
        };
        let cases = [
            (EngineKind::Podman, "ghcr.io", "ghcr.io"),
            (EngineKind::Docker, "ghcr.io", "ghcr.io"),
            (EngineKind::Podman, "docker.io", "docker.io"),
            (
                EngineKind::Docker,
                "docker.io",
                "https://index.docker.io/v1/",
            ),
        ];
        for (kind, host, key) in cases {
            let v: serde_json::Value =
                serde_json::from_str(&auth_json(kind, host, &cred)).expect("json");
            let auths = v["auths"].as_object().expect("auths");
            assert_eq!(auths.keys().collect::<Vec<_>>(), [key], "{kind:?} {host}");
            let auth = auths[key]["auth"].as_str().expect("auth");
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth)
                .expect("base64");
            assert_eq!(decoded, b"robot$ci:pa:ss");
        }
    }

    #[test]
    fn nvidia_smi_lists_gpus_and_their_mig_devices() {
        let l = parse_smi_list(SMI);
        assert_eq!(
            l.gpus,
            [
                ListedGpu {
                    index: 0,
                    uuid: GPU0.into()
                },
                ListedGpu {
                    index: 1,
                    uuid: GPU1.into()
                }
            ]
        );
        let migs: Vec<(u32, &str, u32, &str)> = l
            .migs
            .iter()
            .map(|m| (m.gpu, m.profile.as_str(), m.device, m.uuid.as_str()))
            .collect();
        assert_eq!(
            migs,
            [
                (1, "3g.40gb", 0, MIG_1_0),
                (1, "2g.20gb", 1, "MIG-7c3e1a9b-4d2f-5e8a-b1c0-9f6d2e3a4b5c"),
                (1, "1g.10gb", 2, MIG_1_2),
            ]
        );
        assert_eq!(
            parse_smi_list("No devices were found\n"),
            SmiList::default()
        );
    }

    #[test]
    fn cdi_lists_give_the_device_names_and_skip_their_log_lines() {
        let names = parse_cdi_list(CDI);
        assert_eq!(names.len(), 9, "{names:?}");
        assert_eq!(names[0], "nvidia.com/gpu=0");
        assert!(names.contains(&format!("nvidia.com/gpu={GPU0}")));
        assert!(names.contains(&format!("nvidia.com/gpu={MIG_1_0}")));
        assert!(names.contains(&"nvidia.com/gpu=1:2".to_owned()));
        assert_eq!(names.last().map(String::as_str), Some("nvidia.com/gpu=all"));
        assert_eq!(
            parse_cdi_list(CDI_TYPE_INDEX),
            [
                "nvidia.com/gpu=all",
                "nvidia.com/gpu=gpu0",
                "nvidia.com/gpu=mig1:0",
                "nvidia.com/gpu=mig1:1",
                "nvidia.com/gpu=mig1:2"
            ]
        );
    }

    #[test]
    fn a_replicas_devices_become_exactly_its_cdi_names_or_uuids() {
        let smi = parse_smi_list(SMI);
        let uuid_spec = parse_cdi_list(CDI);
        let index_spec = parse_cdi_list(CDI_TYPE_INDEX);
        let cdi = |v: &[&str]| {
            Ok(DeviceSelection::Cdi(
                v.iter().map(|s| s.to_string()).collect(),
            ))
        };
        let visible = |v: &str| Ok(DeviceSelection::Visible(v.to_owned()));
        let bare = ["nvidia.com/gpu=0".to_owned()];
        let gpu0 = format!("nvidia.com/gpu={GPU0}");
        let mig10 = format!("nvidia.com/gpu={MIG_1_0}");
        type Case<'a> = (
            &'a str,
            Vec<&'a str>,
            Option<&'a [String]>,
            Result<DeviceSelection, String>,
        );
        let cases: Vec<Case> = vec![
            (
                "whole GPU by its UUID name",
                vec!["0"],
                Some(&uuid_spec),
                cdi(&[&gpu0]),
            ),
            (
                "a MIG device by its UUID name",
                vec![MIG_1_0],
                Some(&uuid_spec),
                cdi(&[&mig10]),
            ),
            (
                "a GPU given by UUID",
                vec![GPU0],
                Some(&uuid_spec),
                cdi(&[&gpu0]),
            ),
            ("no GPU: no device", vec![], Some(&uuid_spec), cdi(&[])),
            (
                "two shares of one GPU: once",
                vec!["0", "0"],
                Some(&uuid_spec),
                cdi(&[&gpu0]),
            ),
            (
                "index names only",
                vec!["0"],
                Some(&index_spec),
                cdi(&["nvidia.com/gpu=gpu0"]),
            ),
            (
                "MIG by index names",
                vec![MIG_1_2],
                Some(&index_spec),
                cdi(&["nvidia.com/gpu=mig1:2"]),
            ),
            (
                "no UUID known: the index name",
                vec!["0"],
                Some(&bare[..]),
                cdi(&["nvidia.com/gpu=0"]),
            ),
            (
                "without CDI: UUIDs",
                vec!["0", "1"],
                None,
                visible(&format!("{GPU0},{GPU1}")),
            ),
            (
                "without CDI: a MIG UUID",
                vec![MIG_1_0],
                None,
                visible(MIG_1_0),
            ),
            (
                "without CDI and no GPU: void",
                vec![],
                None,
                visible("void"),
            ),
        ];
        for (what, devices, spec, want) in cases {
            let devices: Vec<String> = devices.into_iter().map(str::to_owned).collect();
            assert_eq!(select_devices(&devices, &smi, spec), want, "{what}");
        }
        // Unknown to nvidia-smi: the index as given (the NVIDIA runtime reads indices too).
        assert_eq!(
            select_devices(&["3".into()], &SmiList::default(), None),
            visible("3")
        );
        // GPU 1 has MIG on: the spec has no whole-GPU device for it.
        let e = select_devices(&["1".into()], &smi, Some(&uuid_spec)).expect_err("stale");
        assert!(
            e.contains("device 1 has no CDI name") && e.contains("nvidia-ctk cdi generate"),
            "{e}"
        );
        let e = select_devices(&["MIG-gone".into()], &smi, Some(&index_spec)).expect_err("gone");
        assert!(e.contains("MIG-gone"), "{e}");
        let e = select_devices(&["gpu zero".into()], &smi, None).expect_err("garbage");
        assert!(e.contains("neither a GPU index"), "{e}");
    }

    #[test]
    fn cpu_shares_are_decimal_cpus() {
        for (milli, want) in [
            (1000, "1"),
            (2500, "2.5"),
            (250, "0.25"),
            (1, "0.001"),
            (16000, "16"),
        ] {
            assert_eq!(cpus(milli), want);
        }
    }

    fn engine(settings: EngineSettings) -> Arc<Engine> {
        Arc::new(Engine {
            kind: EngineKind::Podman,
            program: "podman".into(),
            version: "4.3.1".into(),
            settings,
            cdi: false,
        })
    }

    fn launch() -> Launch {
        Launch {
            job_id: JobId::new_at(1, 1),
            replica: 2,
            attempt: 3,
            node_id: Some(NodeId(uuid::Uuid::from_u128(7))),
            command: vec!["python".into(), "train.py".into(), "--lr=1e-3".into()],
            env: BTreeMap::from([("EPOCHS".into(), "3".into())]),
            devices: vec!["0".into()],
            checkpoint_dir: "/w/jobs/j/replica-2/attempt-3/checkpoint".into(),
            resume_dir: None,
            home_dir: Some("/w/jobs/j/replica-2/attempt-3/home".into()),
            tmp_dir: Some("/w/jobs/j/replica-2/attempt-3/tmp".into()),
            signal: Signal::SIGUSR1,
            log: None,
            run_as: Some(RunAs {
                uid: 200_001,
                gid: 200_001,
            }),
            working_dir: None,
            container: None,
        }
    }

    fn container(settings: EngineSettings) -> ContainerLaunch {
        let l = launch();
        ContainerLaunch {
            engine: engine(settings),
            image: "ghcr.io/acme/train:1".into(),
            name: container_name(l.job_id, l.replica, l.attempt),
            node_id: NodeId(uuid::Uuid::from_u128(7)),
            devices: DeviceSelection::Visible(GPU0.into()),
            limits: None,
            host_network: false,
            env_file: "/w/jobs/j/replica-2/attempt-3/container.env".into(),
        }
    }

    /// The value following `flag`, each time it appears.
    fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn a_replicas_create_names_labels_and_confines_it() {
        let l = launch();
        let c = container(EngineSettings::default());
        let p = plan_create(&l, &c).expect("plan");
        let a = &p.args;
        assert_eq!(a[0], "create");
        assert_eq!(values(a, "--name"), [format!("spotplane-{}-2-3", l.job_id)]);
        assert_eq!(
            values(a, "--label"),
            [
                format!("spotplane.node={}", c.node_id),
                format!("spotplane.job={}", l.job_id),
                "spotplane.replica=2".into(),
                "spotplane.attempt=3".into()
            ]
        );
        assert_eq!(values(a, "--user"), ["200001:200001"]);
        assert_eq!(values(a, "--pull"), ["never"]);
        assert_eq!(values(a, "--log-driver"), ["none"]);
        assert_eq!(values(a, "--security-opt"), ["no-new-privileges"]);
        assert_eq!(
            values(a, "--mount"),
            [
                "type=bind,src=/w/jobs/j/replica-2/attempt-3/checkpoint,dst=/spotplane/checkpoint",
                "type=bind,src=/w/jobs/j/replica-2/attempt-3/home,dst=/spotplane/home",
                "type=bind,src=/w/jobs/j/replica-2/attempt-3/tmp,dst=/spotplane/tmp",
            ]
        );
        assert_eq!(
            values(a, "--env-file"),
            ["/w/jobs/j/replica-2/attempt-3/container.env"]
        );
        // The engine's defaults: no network, runtime, limits or devices flags.
        for flag in [
            "--network",
            "--runtime",
            "--ulimit",
            "--cpus",
            "--memory",
            "--device",
            "--init",
            "--env",
        ] {
            assert!(!a.iter().any(|x| x == flag), "{flag} in {a:?}");
        }
        // The job's command replaces the entrypoint; its arguments follow the image.
        let tail: Vec<&str> = a[a.len() - 4..].iter().map(String::as_str).collect();
        assert_eq!(
            tail,
            [
                "--entrypoint=python",
                "ghcr.io/acme/train:1",
                "train.py",
                "--lr=1e-3"
            ]
        );
        assert!(p.engine_env.is_empty());
    }

    #[test]
    fn the_env_file_holds_the_jobs_env_and_the_contract_with_the_paths_inside() {
        let mut l = launch();
        l.resume_dir = Some("/w/jobs/j/replica-2/attempt-3/resume".into());
        l.env.insert("NVIDIA_VISIBLE_DEVICES".into(), "all".into());
        l.env.insert("SPACED".into(), "  a b  ".into());
        let c = container(EngineSettings::default());
        let p = plan_create(&l, &c).expect("plan");
        let env: BTreeMap<&str, &str> = p
            .env_file
            .lines()
            .filter_map(|l| l.split_once('='))
            .collect();
        let job = l.job_id.to_string();
        let want = BTreeMap::from([
            ("EPOCHS", "3"),
            ("HOME", IN_HOME),
            // The job cannot widen its GPUs.
            ("NVIDIA_VISIBLE_DEVICES", GPU0),
            ("SPACED", "  a b  "),
            ("SPOTPLANE_ATTEMPT", "3"),
            ("SPOTPLANE_CHECKPOINT_DIR", IN_CHECKPOINT),
            (
                "SPOTPLANE_CHECKPOINT_MARKER",
                "/spotplane/checkpoint/.spotplane-checkpoint-complete",
            ),
            ("SPOTPLANE_CHECKPOINT_SIGNAL", "SIGUSR1"),
            ("SPOTPLANE_JOB_ID", job.as_str()),
            ("SPOTPLANE_NODE_ID", "00000000-0000-0000-0000-000000000007"),
            ("SPOTPLANE_REPLICA", "2"),
            ("SPOTPLANE_RESUME_DIR", IN_RESUME),
            ("TMPDIR", IN_TMP),
        ]);
        assert_eq!(env, want);
        // No PATH of the agent's: the image's own applies. No CUDA_VISIBLE_DEVICES: the
        // container sees only its GPUs, numbered from 0.
        assert!(!env.contains_key("PATH") && !env.contains_key("CUDA_VISIBLE_DEVICES"));
        assert!(
            values(&p.args, "--mount").contains(
                &"type=bind,src=/w/jobs/j/replica-2/attempt-3/resume,dst=/spotplane/resume"
            )
        );
        // The job's own HOME wins, as on the host.
        let mut l = launch();
        l.env.insert("HOME".into(), "/root".into());
        let p = plan_create(&l, &c).expect("plan");
        assert!(
            p.env_file.lines().any(|x| x == "HOME=/root"),
            "{}",
            p.env_file
        );
    }

    #[test]
    fn a_multi_line_value_goes_through_the_engines_environment_unless_the_engine_reads_it() {
        let mut l = launch();
        let pem = "-----BEGIN KEY-----\nabc\n-----END KEY-----\n";
        l.env.insert("TLS_KEY".into(), pem.into());
        let c = container(EngineSettings::default());
        let p = plan_create(&l, &c).expect("plan");
        assert_eq!(p.engine_env, [("TLS_KEY".to_owned(), pem.to_owned())]);
        assert!(p.args.contains(&"--env=TLS_KEY".to_owned()), "{:?}", p.args);
        assert!(!p.env_file.contains("TLS_KEY") && !p.env_file.contains("BEGIN"));
        for name in [
            "LD_PRELOAD",
            "DOCKER_HOST",
            "CONTAINERS_CONF",
            "http_proxy",
            "PATH",
            "GODEBUG",
            "XDG_RUNTIME_DIR",
        ] {
            let mut l = launch();
            l.env.insert(name.into(), "a\nb".into());
            let e = plan_create(&l, &c).expect_err(name);
            assert!(e.starts_with(&format!("env {name}:")), "{e}");
        }
        let mut l = launch();
        l.env.insert("A=B".into(), "x".into());
        assert!(
            plan_create(&l, &c)
                .expect_err("name")
                .contains("not a variable name")
        );
        let mut l = launch();
        l.env.insert("NUL".into(), "a\0b".into());
        assert!(plan_create(&l, &c).expect_err("nul").contains("NUL byte"));
    }

    #[test]
    fn limits_devices_networking_and_the_settings_reach_the_create() {
        let settings = EngineSettings {
            oci_runtime: Some("runc".into()),
            ulimits: vec!["nofile=1024:1024".into(), "nproc=1024:1024".into()],
            extra_args: vec!["--security-opt=label=disable".into()],
            init: true,
            ..EngineSettings::default()
        };
        let mut c = container(settings);
        c.limits = Some(ReplicaLimits {
            cpu_milli: 2500,
            memory_mib: 16384,
        });
        c.devices = DeviceSelection::Cdi(vec![
            format!("nvidia.com/gpu={GPU0}"),
            format!("nvidia.com/gpu={MIG_1_0}"),
        ]);
        c.host_network = true;
        let p = plan_create(&launch(), &c).expect("plan");
        let a = &p.args;
        assert_eq!(values(a, "--cpus"), ["2.5"]);
        assert_eq!(values(a, "--memory"), ["16384m"]);
        assert_eq!(values(a, "--memory-swap"), ["16384m"]);
        assert_eq!(
            values(a, "--device"),
            [
                format!("nvidia.com/gpu={GPU0}"),
                format!("nvidia.com/gpu={MIG_1_0}")
            ]
        );
        assert_eq!(values(a, "--network"), ["host"]);
        assert!(values(a, "--workdir").is_empty(), "the image's own");
        assert_eq!(values(a, "--runtime"), ["runc"]);
        assert_eq!(
            values(a, "--ulimit"),
            ["nofile=1024:1024", "nproc=1024:1024"]
        );
        assert!(a.iter().any(|x| x == "--init"));
        assert!(a.iter().any(|x| x == "--security-opt=label=disable"));
        // With CDI the runtime's variable is void: the devices come from the spec alone.
        assert!(
            p.env_file
                .lines()
                .any(|l| l == "NVIDIA_VISIBLE_DEVICES=void")
        );
        // The settings go before the entrypoint and the image.
        let image_at = a
            .iter()
            .position(|x| x == "ghcr.io/acme/train:1")
            .expect("image");
        let extra_at = a
            .iter()
            .position(|x| x == "--security-opt=label=disable")
            .expect("extra");
        assert!(extra_at < image_at);
        let mut l = launch();
        l.working_dir = Some("/workspace".into());
        let p = plan_create(&l, &c).expect("plan");
        let workdir_at = p
            .args
            .iter()
            .position(|x| x == "--workdir")
            .expect("workdir");
        assert_eq!(p.args[workdir_at + 1], "/workspace");
        assert!(workdir_at < image_at);
        // Zero limits are no limits.
        c.limits = Some(ReplicaLimits {
            cpu_milli: 0,
            memory_mib: 0,
        });
        let p = plan_create(&launch(), &c).expect("plan");
        assert!(values(&p.args, "--cpus").is_empty() && values(&p.args, "--memory").is_empty());
    }

    #[test]
    fn a_replica_without_a_user_or_a_command_is_planned_so() {
        let c = container(EngineSettings::default());
        let mut l = launch();
        l.run_as = None;
        let p = plan_create(&l, &c).expect("plan");
        assert!(values(&p.args, "--user").is_empty(), "the image's own user");
        l.command.clear();
        assert_eq!(plan_create(&l, &c), Err("the command is empty".into()));
        let mut l = launch();
        l.checkpoint_dir = "/w/a,b/checkpoint".into();
        assert!(plan_create(&l, &c).expect_err("comma").contains("comma"));
    }

    #[test]
    fn engine_settings_default_to_auto_and_the_usual_cdi_dirs() {
        let s = EngineSettings::default();
        assert_eq!(s.runtime, RuntimeChoice::Auto);
        assert_eq!(
            s.cdi_spec_dirs,
            [PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]
        );
        assert_eq!(
            engine(s).info(),
            ContainerEngineInfo {
                kind: "podman".into(),
                version: "4.3.1".into(),
                cdi: false
            }
        );
    }

    #[tokio::test]
    async fn docker_counts_only_with_a_daemon_that_answers() {
        let docker = EngineSettings {
            runtime: RuntimeChoice::Docker,
            ..EngineSettings::default()
        };
        // Here the docker CLI is installed without a daemon (elsewhere it may be missing, or
        // have one): never an engine that cannot run anything.
        match detect(&docker).await {
            Ok(e) => {
                assert_eq!(e.kind, EngineKind::Docker);
                assert!(!e.version.is_empty());
            }
            Err(why) => {
                assert!(why.starts_with("docker: "), "{why}");
                assert!(
                    why.contains("daemon") || why.contains("not installed"),
                    "{why}"
                );
            }
        }
    }

    #[tokio::test]
    async fn no_engine_is_a_reason_not_a_fallback() {
        let none = EngineSettings {
            runtime: RuntimeChoice::None,
            ..EngineSettings::default()
        };
        assert_eq!(
            detect(&none).await.err().as_deref(),
            Some("--container-runtime none")
        );
    }
}
