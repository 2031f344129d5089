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
//!
//! # Where it is
//!
//! - `engine.rs`: which engine the node has, its settings, and an engine's reason for a failure;
//! - `devices.rs`: a replica's GPUs as the engine is given them (`nvidia-smi -L`, CDI names);
//! - `image.rs`: image references, registry logins and pulls;
//! - `launch.rs`: what a container replica is launched with, and its `create` (planned by a
//!   pure function);
//! - `run.rs`: a created container as its workload drives it, and an earlier agent's leftovers.

mod devices;
mod engine;
mod image;
mod launch;
mod run;

use std::path::Path;
use std::time::Duration;

pub use devices::{
    DeviceSelection, ListedGpu, SmiList, cdi_names, devices_for, parse_cdi_list, parse_smi_list,
    select_devices,
};
pub use engine::{
    Engine, EngineKind, EngineSettings, RuntimeChoice, detect, engine_error, parse_ulimit,
};
pub use image::{
    ImageReady, auth_json, check_reference, ensure_image, normalize_image, refreshes, registry_host,
};
pub use launch::{
    ContainerLaunch, CreatePlan, container_env, container_name, create, engine_reads, plan_create,
};
pub use run::{ContainerRun, remove_leftovers};

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

#[cfg(test)]
mod tests;
