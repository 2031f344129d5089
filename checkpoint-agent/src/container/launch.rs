//! What a container replica is launched with, and the `create` of its container: its
//! arguments and environment, planned by a pure function ([`plan_create`]), then run with the
//! env file alive only while it runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use spotplane_core::NodeId;
use spotplane_core::agent::ReplicaLimits;

use super::engine::run_captured;
use super::{
    CONTROL_TIMEOUT, DeviceSelection, ENV_FILE_VALUE_MAX, Engine, IN_CHECKPOINT, IN_HOME,
    IN_RESUME, IN_TMP, NAME_PREFIX, NODE_LABEL, check_reference, engine_error, write_private,
};
use crate::workload::{Launch, MARKER};

/// What makes a replica a container replica (`Launch::container`).
#[derive(Debug, Clone)]
pub struct ContainerLaunch {
    pub engine: Arc<Engine>,
    /// The image reference (normalized, [`normalize_image`](super::normalize_image)).
    pub image: String,
    /// `spotplane-<job>-<replica>-<attempt>` ([`container_name`]).
    pub name: String,
    /// The node whose agent runs it (its label, for [`remove_leftovers`](super::remove_leftovers)).
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
pub(super) fn cpus(milli: u32) -> String {
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

/// Creates the container of a replica (not started yet: [`ContainerRun::attach_command`](super::ContainerRun::attach_command)
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
