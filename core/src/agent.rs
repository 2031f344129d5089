//! The wire protocol between the control plane and the node agent.
//!
//! The agent speaks first and always: it registers once with its per-node token, then sends a
//! heartbeat every few seconds carrying telemetry, the state of the replicas it runs, a
//! termination notice if the cloud has posted one, and the results of earlier commands. The
//! control plane answers each heartbeat with the commands the node should carry out next. This
//! keeps agents behind NAT reachable and makes every exchange idempotent: a command is repeated
//! until its result has been seen, and the agent ignores a command id it has already run.
//!
//! Paths (JSON over HTTPS, bearer token of role `agent`):
//! `POST /v1/agent/register` ([`RegisterRequest`] → [`RegisterResponse`]) and
//! `POST /v1/agent/heartbeat` ([`Heartbeat`] → [`HeartbeatResponse`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{CheckpointId, CommandId, JobId, NodeId};
use crate::mig::MigLayout;

/// Bumped when a change breaks older agents; the control plane refuses other versions.
pub const PROTOCOL_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
pub struct MigDeviceInfo {
    pub uuid: String,
    /// Profile name as NVML prints it, e.g. `3g.40gb`.
    pub profile: String,
    /// Memory-slice index the GPU instance starts at.
    pub start: u8,
    pub memory_mib: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterResponse {
    pub node_id: NodeId,
    /// How often to send a heartbeat.
    pub heartbeat_interval_ms: u64,
    /// How often to poll the cloud's metadata endpoint for a termination notice.
    pub notice_poll_interval_ms: u64,
    /// Signal sent to the workload to ask for a checkpoint (e.g. `SIGUSR1`).
    pub checkpoint_signal: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuTelemetry {
    pub index: u32,
    #[serde(default)]
    pub mig_uuid: Option<String>,
    pub utilization_pct: Option<u8>,
    pub memory_used_mib: Option<u64>,
    pub temperature_c: Option<i16>,
    pub power_w: Option<u32>,
}

/// The state of one replica as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    pub job_id: JobId,
    pub replica: u32,
    pub attempt: u32,
    pub phase: ReplicaPhase,
    #[serde(default)]
    pub exit_code: Option<i32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaPhase {
    Starting,
    Running,
    Checkpointing,
    Exited,
}

/// Where a termination notice came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoticeSource {
    /// AWS IMDS `spot/instance-action`.
    AwsInstanceAction,
    /// AWS IMDS `events/recommendations/rebalance` (a warning with no deadline).
    AwsRebalance,
    /// AWS EventBridge via SQS (the control plane's own stream).
    AwsEventBridge,
    /// GCP metadata `instance/preempted`.
    GcpPreempted,
    /// Azure Scheduled Events `Preempt`.
    AzureScheduledEvent,
    /// A simulated cloud.
    Simulated,
}

/// A cloud's announcement that it is taking the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminationNotice {
    pub source: NoticeSource,
    /// `terminate`, `stop`, `hibernate`, `preempt` or `rebalance`, as the cloud said it.
    pub action: String,
    /// When the node will be taken; `None` for a warning without a deadline.
    pub deadline: Option<DateTime<Utc>>,
    pub observed_at: DateTime<Utc>,
    /// The cloud's own id for the event (Azure `EventId`), to acknowledge it.
    #[serde(default)]
    pub event_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    pub commands: Vec<Command>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Command {
    pub id: CommandId,
    #[serde(flatten)]
    pub kind: CommandKind,
}

/// What the control plane asks a node to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
        #[serde(default)]
        env: BTreeMap<String, String>,
        /// GPU indices for whole/shared GPUs, or the MIG device UUID for a MIG slice.
        devices: Vec<String>,
        /// Object-store prefix the job's checkpoints go under.
        checkpoint_uri: String,
        /// Manifest of the checkpoint to resume from.
        #[serde(default)]
        resume_from: Option<String>,
    },
    /// Checkpoint one replica now and upload it before `deadline`.
    Checkpoint {
        job_id: JobId,
        replica: u32,
        checkpoint_id: CheckpointId,
        uri: String,
        deadline: Option<DateTime<Utc>>,
    },
    /// Stop one replica, giving it `grace_ms` to exit after SIGTERM.
    Stop {
        job_id: JobId,
        replica: u32,
        grace_ms: u64,
    },
    /// Re-lay a GPU's MIG instances; only instances no replica uses are destroyed.
    ApplyMigLayout { gpu_index: u32, layout: MigLayout },
}

/// The outcome of a command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandResult {
    pub command_id: CommandId,
    pub ok: bool,
    #[serde(default)]
    pub message: Option<String>,
    /// Set when a checkpoint command finished: the uploaded manifest.
    #[serde(default)]
    pub manifest: Option<CheckpointManifest>,
}

/// The last object of a checkpoint, written only after every file is uploaded: a checkpoint
/// without a manifest does not exist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
pub struct ManifestFile {
    /// Path relative to the checkpoint directory.
    pub path: String,
    pub size: u64,
    /// Hex SHA-256 of the content.
    pub sha256: String,
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
    fn heartbeats_reject_unknown_fields() {
        let hb = r#"{"node_id": "0192d4e0-0000-7000-8000-000000000000", "sent_at": "2026-11-30T00:00:00Z", "bogus": 1}"#;
        assert!(serde_json::from_str::<Heartbeat>(hb).is_err());
    }
}
