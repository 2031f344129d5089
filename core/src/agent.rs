//! The wire protocol between the control plane and the node agent.
//!
//! The agent speaks first and always: it registers once with its per-node token, then sends a
//! heartbeat every few seconds carrying telemetry, the state of the replicas it runs, a
//! termination notice if the cloud has posted one, and the results of earlier commands. The
//! control plane answers each heartbeat with the commands the node should carry out next. This
//! keeps agents behind NAT reachable and makes every exchange idempotent: a command is repeated
//! until its result has been seen, and the agent ignores a command id it has already run.
//!
//! Paths (JSON over HTTPS):
//! - `POST /v1/agent/register` ([`RegisterRequest`] → [`RegisterResponse`]), with the node's
//!   one-time bootstrap token (exchanged for the node credential returned in
//!   [`RegisterResponse::credential`]) or, after a restart, with the node credential itself;
//! - `POST /v1/agent/heartbeat` ([`Heartbeat`] → [`HeartbeatResponse`]);
//! - `POST /v1/agent/commands/{id}/result` ([`CommandResult`]), the same results a heartbeat
//!   can carry, sent at once when they matter (a checkpoint done before the node goes);
//! - `POST /v1/agent/checkpoints` ([`CheckpointReport`]): a checkpoint made durable, or one that
//!   could not be;
//! - `POST /v1/agent/logs` ([`LogBatch`]): the replicas' output.
//!
//! Every call but a first registration carries the node credential (a bearer token of role
//! `agent`), which acts for its own node only.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{CheckpointId, CommandId, JobId, NodeId};
use crate::mig::MigLayout;

/// Bumped when a change breaks older agents; the control plane refuses other versions.
pub const PROTOCOL_VERSION: u32 = 1;

/// Prefix of a node's one-time bootstrap token.
pub const BOOTSTRAP_TOKEN_PREFIX: &str = "spb_";

/// The node a bootstrap token was issued for: it is written into the token,
/// `spb_<node id as 32 hex digits>_<secret>`, so the agent needs nothing else to register.
pub fn bootstrap_token_node(token: &str) -> Option<NodeId> {
    let rest = token.trim().strip_prefix(BOOTSTRAP_TOKEN_PREFIX)?;
    let (hex, secret) = rest.split_once('_')?;
    if hex.len() != 32 || secret.is_empty() {
        return None;
    }
    uuid::Uuid::try_parse(hex).ok().map(NodeId)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    pub protocol_version: u32,
    pub node_id: NodeId,
    pub agent_version: String,
    pub hostname: String,
    /// The cloud's id for the instance, as read from the metadata service.
    #[serde(default)]
    pub instance_id: Option<String>,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    /// GPUs as NVML reports them; empty on a node without a driver.
    #[serde(default)]
    pub gpus: Vec<GpuInfo>,
    /// The OCI engine the agent runs container images with; `None` on a node without one,
    /// where the scheduler places no job that names an `image`.
    #[serde(default)]
    pub container_engine: Option<ContainerEngineInfo>,
    /// The node's private address, as its gang peers reach it (`SPOTPLANE_PEER_ADDRS`,
    /// `MASTER_ADDR`): an IP address without a port.
    #[serde(default)]
    pub address: Option<String>,
}

/// The container engine an agent found (or was told to use) on its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContainerEngineInfo {
    /// `podman` or `docker`.
    pub kind: String,
    /// The engine's version as it prints it.
    pub version: String,
    /// Whether the node has a CDI spec for its GPUs (`nvidia-ctk cdi generate`): devices are
    /// then passed as `--device nvidia.com/gpu=<uuid>`, else through `NVIDIA_VISIBLE_DEVICES`.
    #[serde(default)]
    pub cdi: bool,
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    /// NVML's product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    pub memory_mib: u64,
    pub mig_enabled: bool,
    #[serde(default)]
    pub mig_devices: Vec<MigDeviceInfo>,
}

/// One MIG device (GPU instance + compute instance) as NVML reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MigDeviceInfo {
    pub uuid: String,
    /// Profile name as NVML prints it, e.g. `3g.40gb`.
    pub profile: String,
    /// Memory-slice index the GPU instance starts at.
    pub start: u8,
    pub memory_mib: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RegisterResponse {
    pub node_id: NodeId,
    /// The node credential (a bearer token of role `agent` for this node only), present when a
    /// bootstrap token was exchanged: it is shown this once, and the bootstrap token no longer
    /// works. Absent when the agent re-registered with its credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// How often to send a heartbeat.
    pub heartbeat_interval_ms: u64,
    /// How often to poll the cloud's metadata endpoint for a termination notice.
    pub notice_poll_interval_ms: u64,
    /// Signal sent to the workload to ask for a checkpoint (e.g. `SIGUSR1`).
    pub checkpoint_signal: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    pub node_id: NodeId,
    /// Agent's clock when it sent this; the control plane records skew, it does not trust it.
    pub sent_at: DateTime<Utc>,
    #[serde(default)]
    pub gpus: Vec<GpuTelemetry>,
    #[serde(default)]
    pub replicas: Vec<ReplicaStatus>,
    #[serde(default)]
    pub notice: Option<TerminationNotice>,
    #[serde(default)]
    pub results: Vec<CommandResult>,
}

/// Telemetry of one GPU (or of one MIG device, when `mig_uuid` is set).
///
/// On the wire each reading is named after the DCGM field that carries it (NVIDIA DCGM
/// `dcgm_fields.h`), so dashboards built for dcgm-exporter read the same names. A reading the
/// driver does not give (utilisation of a MIG device, ECC on a GPU without ECC) is absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuTelemetry {
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_uuid: Option<String>,
    /// A MIG device's profile (`1g.10gb`), as dcgm-exporter's `GPU_I_PROFILE` label.
    #[serde(
        default,
        rename = "GPU_I_PROFILE",
        skip_serializing_if = "Option::is_none"
    )]
    pub mig_profile: Option<String>,
    /// A MIG device's GPU instance id (the driver's), as dcgm-exporter's `GPU_I_ID` label.
    #[serde(default, rename = "GPU_I_ID", skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
    /// Percent of time a kernel ran over the last sample period.
    #[serde(
        default,
        rename = "DCGM_FI_DEV_GPU_UTIL",
        skip_serializing_if = "Option::is_none"
    )]
    pub utilization_pct: Option<u8>,
    /// Percent of time device memory was read or written.
    #[serde(
        default,
        rename = "DCGM_FI_DEV_MEM_COPY_UTIL",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_utilization_pct: Option<u8>,
    /// Framebuffer memory used, MiB.
    #[serde(
        default,
        rename = "DCGM_FI_DEV_FB_USED",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_used_mib: Option<u64>,
    /// Framebuffer memory in total, MiB.
    #[serde(
        default,
        rename = "DCGM_FI_DEV_FB_TOTAL",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_total_mib: Option<u64>,
    /// GPU temperature, °C.
    #[serde(
        default,
        rename = "DCGM_FI_DEV_GPU_TEMP",
        skip_serializing_if = "Option::is_none"
    )]
    pub temperature_c: Option<i16>,
    /// Power draw, watts.
    #[serde(
        default,
        rename = "DCGM_FI_DEV_POWER_USAGE",
        skip_serializing_if = "Option::is_none"
    )]
    pub power_w: Option<f64>,
    /// Single-bit (corrected) ECC errors since the driver loaded.
    #[serde(
        default,
        rename = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        skip_serializing_if = "Option::is_none"
    )]
    pub ecc_sbe_volatile: Option<u64>,
    /// Double-bit (uncorrected) ECC errors since the driver loaded.
    #[serde(
        default,
        rename = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        skip_serializing_if = "Option::is_none"
    )]
    pub ecc_dbe_volatile: Option<u64>,
    /// Double-bit (uncorrected) ECC errors over the GPU's life.
    #[serde(
        default,
        rename = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        skip_serializing_if = "Option::is_none"
    )]
    pub ecc_dbe_aggregate: Option<u64>,
    /// SM clock, MHz.
    #[serde(
        default,
        rename = "DCGM_FI_DEV_SM_CLOCK",
        skip_serializing_if = "Option::is_none"
    )]
    pub sm_clock_mhz: Option<u32>,
    /// Fraction (0 to 1) of cycles the tensor (HMMA) pipe was active: a DCGM profiling field,
    /// absent where only NVML is read.
    #[serde(
        default,
        rename = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        skip_serializing_if = "Option::is_none"
    )]
    pub tensor_active: Option<f64>,
    /// Fraction (0 to 1) of time the graphics or compute engine was active: a DCGM profiling
    /// field, which NVML does not give (a node running DCGM does); absent otherwise.
    #[serde(
        default,
        rename = "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        skip_serializing_if = "Option::is_none"
    )]
    pub gr_engine_active: Option<f64>,
}

impl GpuTelemetry {
    /// The readings present, by DCGM field name, as numbers (for metrics).
    pub fn dcgm_fields(&self) -> Vec<(&'static str, f64)> {
        let mut out = Vec::new();
        let mut push = |name, v: Option<f64>| {
            if let Some(v) = v {
                out.push((name, v));
            }
        };
        push("DCGM_FI_DEV_GPU_UTIL", self.utilization_pct.map(f64::from));
        push(
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            self.memory_utilization_pct.map(f64::from),
        );
        push(
            "DCGM_FI_DEV_FB_USED",
            self.memory_used_mib.map(|v| v as f64),
        );
        push(
            "DCGM_FI_DEV_FB_TOTAL",
            self.memory_total_mib.map(|v| v as f64),
        );
        // dcgm-exporter's FB_FREE; NVML gives used and total.
        push(
            "DCGM_FI_DEV_FB_FREE",
            self.memory_total_mib
                .zip(self.memory_used_mib)
                .map(|(t, u)| t.saturating_sub(u) as f64),
        );
        push("DCGM_FI_DEV_GPU_TEMP", self.temperature_c.map(f64::from));
        push("DCGM_FI_DEV_POWER_USAGE", self.power_w);
        push(
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            self.ecc_sbe_volatile.map(|v| v as f64),
        );
        push(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            self.ecc_dbe_volatile.map(|v| v as f64),
        );
        push(
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
            self.ecc_dbe_aggregate.map(|v| v as f64),
        );
        push("DCGM_FI_DEV_SM_CLOCK", self.sm_clock_mhz.map(f64::from));
        push("DCGM_FI_PROF_GR_ENGINE_ACTIVE", self.gr_engine_active);
        push("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", self.tensor_active);
        out
    }
}

/// The state of one replica as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReplicaStatus {
    pub job_id: JobId,
    pub replica: u32,
    pub attempt: u32,
    pub phase: ReplicaPhase,
    #[serde(default)]
    pub exit_code: Option<i32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReplicaPhase {
    Starting,
    Running,
    Checkpointing,
    Exited,
}

pub use crate::notice::{NoticeAction, NoticeSource, TerminationNotice};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeartbeatResponse {
    pub commands: Vec<Command>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Command {
    pub id: CommandId,
    #[serde(flatten)]
    pub kind: CommandKind,
}

/// What the control plane asks a node to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CommandKind {
    /// Start one replica of a job, restoring from `resume_from` when set.
    Start {
        job_id: JobId,
        replica: u32,
        attempt: u32,
        command: Vec<String>,
        #[serde(default)]
        image: Option<String>,
        /// The job's `working_dir`: where the command starts.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        working_dir: Option<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
        /// GPU indices for whole/shared GPUs, or the MIG device UUID for a MIG slice.
        devices: Vec<String>,
        /// Object-store prefix the job's checkpoints go under.
        checkpoint_uri: String,
        /// Manifest of the checkpoint to resume from.
        #[serde(default)]
        resume_from: Option<String>,
        /// The job refers to team secrets (its `secrets`, or `image_pull_secret`): the agent
        /// fetches their values with [`AgentSecrets`] before it starts the replica. The values
        /// never travel in the command itself, which the control plane keeps.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        secrets: bool,
        /// Who the replica is in its gang and where its peers are.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rendezvous: Option<Rendezvous>,
        /// The replica's share of the node (its job's `cpu_milli` and `memory_mib`): the
        /// container's limits.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limits: Option<ReplicaLimits>,
    },
    /// Checkpoint one replica now and upload it before `deadline`.
    Checkpoint {
        job_id: JobId,
        replica: u32,
        checkpoint_id: CheckpointId,
        /// The job's checkpoint prefix (as in `Start::checkpoint_uri`).
        uri: String,
        deadline: Option<DateTime<Utc>>,
    },
    /// Stop one replica, giving it `grace_ms` to exit after SIGTERM. With `attempt`, only
    /// that attempt of the replica (a newer one started since is left running).
    Stop {
        job_id: JobId,
        replica: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
        grace_ms: u64,
    },
    /// Re-lay a GPU's MIG instances; only instances no replica uses are destroyed.
    ApplyMigLayout {
        gpu_index: u32,
        #[cfg_attr(feature = "openapi", schema(value_type = Vec<crate::MigInstance>))]
        layout: MigLayout,
    },
    /// Drain the node: checkpoint every running replica, upload before `deadline`, then stop
    /// them. Sent when the control plane hears of a termination first (the cloud's event
    /// stream) or retires the node.
    Drain {
        #[serde(default)]
        deadline: Option<DateTime<Utc>>,
        #[serde(default)]
        reason: Option<String>,
    },
}

/// Where a replica stands in its gang, as distributed training frameworks need to know it.
///
/// The agent hands it to the workload as `SPOTPLANE_RANK`, `SPOTPLANE_WORLD_SIZE`,
/// `SPOTPLANE_NODE_RANK`, `SPOTPLANE_PEER_ADDRS`, and as the names torchrun and PyTorch read:
/// `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (docs/agent.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rendezvous {
    /// The replica's index in the gang (0-based).
    pub rank: u32,
    /// How many replicas the gang has.
    pub world_size: u32,
    /// The index of this replica's node among the gang's distinct nodes, in rank order.
    pub node_rank: u32,
    /// The private address of each replica's node, in rank order (one per replica).
    pub peers: Vec<String>,
    /// Rank 0's node address.
    pub master_addr: String,
    /// The port rank 0 listens on for the rendezvous; the same for every replica of one run.
    pub master_port: u16,
}

/// A replica's resource limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReplicaLimits {
    pub cpu_milli: u32,
    pub memory_mib: u64,
}

/// `GET /v1/agent/jobs/{job_id}/secrets`: the values of the team secrets a job refers to,
/// answered only to the node that runs one of its replicas. Never logged, never stored by the
/// agent outside the replica's environment (and a pull's short-lived auth file).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentSecrets {
    /// Environment variable name → the secret's value (the job's `secrets`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Registry credentials for pulling the job's image (its `image_pull_secret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistryCredential>,
}

impl std::fmt::Debug for AgentSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSecrets")
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("registry", &self.registry)
            .finish()
    }
}

/// A registry login: the team secret named by `image_pull_secret` holds `username:password`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RegistryCredential {
    pub username: String,
    pub password: String,
}

impl RegistryCredential {
    /// Reads a secret's value, `username:password` (the password may hold colons).
    pub fn parse(value: &str) -> Option<RegistryCredential> {
        let (user, password) = value.trim_end_matches(['\r', '\n']).split_once(':')?;
        (!user.is_empty() && !password.is_empty()).then(|| RegistryCredential {
            username: user.to_owned(),
            password: password.to_owned(),
        })
    }
}

impl std::fmt::Debug for RegistryCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredential")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The outcome of a command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommandResult {
    pub command_id: CommandId,
    pub ok: bool,
    #[serde(default)]
    pub message: Option<String>,
    /// Set when a checkpoint command finished: the uploaded manifest.
    #[serde(default)]
    pub manifest: Option<CheckpointManifest>,
    /// Set when a MIG layout command finished (or failed): the layout the GPU has now.
    #[serde(default)]
    pub mig_layout: Option<AppliedMigLayout>,
}

/// A GPU's MIG layout as the agent found it after applying (or failing to apply) a command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AppliedMigLayout {
    pub gpu_index: u32,
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<crate::MigInstance>))]
    pub layout: MigLayout,
}

/// What started a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CheckpointTrigger {
    /// The cloud's termination notice, seen by the agent.
    Notice,
    /// A `checkpoint` command.
    Command,
    /// A `drain` command.
    Drain,
}

/// How a checkpoint ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CheckpointOutcome {
    /// Every file and then the manifest are in the object store: a resume point.
    Durable,
    /// The upload could not finish before the deadline; nothing of it counts, the previous
    /// durable checkpoint stays the resume point.
    MissedDeadline,
    /// The workload did not write its checkpoint, or the upload failed for good.
    Failed,
}

/// `POST /v1/agent/checkpoints`: the end of one replica's checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CheckpointReport {
    pub job_id: JobId,
    pub replica: u32,
    pub attempt: u32,
    pub checkpoint_id: CheckpointId,
    /// Where the manifest is (or would have been), e.g. `s3://bucket/jobs/…/manifest.json`.
    pub uri: String,
    pub trigger: CheckpointTrigger,
    pub outcome: CheckpointOutcome,
    /// The manifest, for a durable checkpoint.
    #[serde(default)]
    pub manifest: Option<CheckpointManifest>,
    /// Why it was not durable.
    #[serde(default)]
    pub message: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
}

/// The last object of a checkpoint, written only after every file is uploaded: a checkpoint
/// without a manifest does not exist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckpointManifest {
    pub job_id: JobId,
    pub replica: u32,
    pub checkpoint_id: CheckpointId,
    pub attempt: u32,
    pub created_at: DateTime<Utc>,
    pub files: Vec<ManifestFile>,
    pub total_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ManifestFile {
    /// Path relative to the checkpoint directory.
    pub path: String,
    pub size: u64,
    /// Hex SHA-256 of the content.
    pub sha256: String,
}

/// Most chunks one `POST /v1/agent/logs` may carry.
pub const MAX_LOG_CHUNKS: usize = crate::limits::LOG_CHUNKS.max as usize;
/// Most bytes of output (before base64) one chunk may carry.
pub const MAX_LOG_CHUNK_BYTES: usize = crate::limits::LOG_CHUNK_BYTES.max as usize;

/// `POST /v1/agent/logs`: replicas' output, in order, from the node that runs them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LogBatch {
    pub chunks: Vec<LogChunk>,
}

/// A run of bytes of one replica attempt's output (its stdout and stderr, interleaved by
/// line), at `offset` in that attempt's log. Sending a chunk again changes nothing: the first
/// one stored at an offset is kept, so a batch is retried safely.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LogChunk {
    pub job_id: JobId,
    pub replica: u32,
    pub attempt: u32,
    /// Where the chunk's first byte is in the attempt's log (bytes since it started). A gap
    /// before it is output the agent had to drop.
    pub offset: u64,
    /// The bytes, base64 (standard alphabet, padded); at most [`MAX_LOG_CHUNK_BYTES`] decoded.
    pub data: String,
    /// The attempt's output is over: this is its last chunk (it may be empty).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub eof: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_tagged_by_type_on_the_wire() {
        let cmd = Command {
            id: CommandId::new_at(1, 1),
            kind: CommandKind::Stop {
                job_id: JobId::new_at(1, 2),
                replica: 0,
                attempt: None,
                grace_ms: 30_000,
            },
        };
        let v = serde_json::to_value(&cmd).expect("ser");
        assert_eq!(v["type"], "stop");
        assert_eq!(v["grace_ms"], 30_000);
        let back: Command = serde_json::from_value(v).expect("de");
        assert_eq!(back, cmd);
    }

    #[test]
    fn bootstrap_tokens_carry_their_node() {
        let node = NodeId::new_at(1_800_000_000_000, 7);
        let token = format!("spb_{}_secret-_part", node.as_uuid().simple());
        assert_eq!(bootstrap_token_node(&token), Some(node));
        assert_eq!(bootstrap_token_node(&format!("{token}\n")), Some(node));
        assert_eq!(bootstrap_token_node("spt_abc"), None);
        assert_eq!(bootstrap_token_node("spb_1234_x"), None);
        assert_eq!(
            bootstrap_token_node(&format!("spb_{}_", node.as_uuid().simple())),
            None
        );
    }

    #[test]
    fn telemetry_readings_are_named_after_dcgm_fields() {
        let t = GpuTelemetry {
            index: 1,
            temperature_c: Some(60),
            ..GpuTelemetry::default()
        };
        let v = serde_json::to_value(&t).expect("ser");
        assert_eq!(
            v,
            serde_json::json!({"index": 1, "DCGM_FI_DEV_GPU_TEMP": 60})
        );
        assert_eq!(serde_json::from_value::<GpuTelemetry>(v).expect("de"), t);
    }

    #[test]
    fn heartbeats_reject_unknown_fields() {
        let hb = r#"{"node_id": "0192d4e0-0000-7000-8000-000000000000", "sent_at": "2026-11-30T00:00:00Z", "bogus": 1}"#;
        assert!(serde_json::from_str::<Heartbeat>(hb).is_err());
    }
}
