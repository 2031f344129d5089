//! What the scheduler sees and what it decides: plain values, built by the reconciler from the
//! store and turned back into store writes and agent commands after the cycle.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use spotplane_core::shape::ResourceShape;
use spotplane_core::team::{Quota, QuotaResource};
use spotplane_core::{Cloud, GpuModel, JobId, Market, MigInstance, MigLayout, NodeId, TeamName};

/// Everything one scheduling cycle looks at.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub nodes: Vec<NodeSnap>,
    /// Jobs holding capacity: admitted, starting, running or draining.
    pub running: Vec<RunningJob>,
    /// Jobs waiting to be placed, in any order (the scheduler orders them).
    pub queued: Vec<QueuedJob>,
    pub teams: Vec<TeamSnap>,
}

/// One node's capacity. What is used follows from the placements of `Snapshot::running`.
#[derive(Debug, Clone)]
pub struct NodeSnap {
    pub id: NodeId,
    pub cloud: Cloud,
    pub region: String,
    pub zone: String,
    pub market: Market,
    /// Ready and not draining: new work may go here.
    pub schedulable: bool,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// The model of the node's GPUs; `None` for a CPU-only node.
    pub gpu_model: Option<GpuModel>,
    pub gpus: Vec<GpuSnap>,
    /// Its agent registered with a container engine: jobs that name an `image` may go here.
    pub runs_images: bool,
}

/// One GPU: plain (whole or shared), in MIG mode with its instances, or being re-laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSnap {
    Plain,
    Mig(MigLayout),
    /// A re-layout ordered earlier is not applied yet: nothing may be placed on the GPU.
    Relayout,
}

/// Where one replica runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub replica: u32,
    pub node: NodeId,
    pub assigned: Assigned,
}

/// Which part of the node a replica has.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Assigned {
    /// No GPU (a CPU-only replica).
    CpuOnly,
    /// Whole GPUs, by index.
    Whole(Vec<u32>),
    /// `milli` thousandths of GPU `gpu`.
    Share { gpu: u32, milli: u32 },
    /// The MIG instance `instance` of GPU `gpu`.
    Mig { gpu: u32, instance: MigInstance },
}

/// A job holding capacity.
#[derive(Debug, Clone)]
pub struct RunningJob {
    pub id: JobId,
    pub team: TeamName,
    pub priority: i32,
    pub shape: ResourceShape,
    pub placements: Vec<Placement>,
    /// Checkpointing or draining now: never chosen as a victim, and its capacity frees soon.
    pub draining: bool,
    /// When its last durable checkpoint was taken (or when it started, if none).
    pub progress_since: DateTime<Utc>,
}

/// A job waiting for capacity.
#[derive(Debug, Clone)]
pub struct QueuedJob {
    pub id: JobId,
    pub team: TeamName,
    pub priority: i32,
    /// Requeued after a preemption: goes ahead of its priority peers.
    pub requeued: bool,
    /// It preempted jobs in an earlier cycle and waits for them to drain.
    pub nominated: bool,
    pub replicas: u32,
    pub shape: ResourceShape,
    /// Allowed clouds and regions; any when empty.
    pub clouds: Vec<Cloud>,
    pub regions: Vec<String>,
    /// Whether spot nodes may be used.
    pub spot: bool,
    /// It names a container `image`: only nodes that run images may take it.
    pub image: bool,
}

/// A team's fair-share settings.
#[derive(Debug, Clone)]
pub struct TeamSnap {
    pub name: TeamName,
    pub weight: f64,
    pub cohort: Option<String>,
    pub quotas: BTreeMap<QuotaResource, Quota>,
}

/// What one cycle decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decisions {
    /// Jobs to start, with every replica's exact place.
    pub admissions: Vec<Admission>,
    /// Jobs to checkpoint and requeue to make room for `for_job`.
    pub preemptions: Vec<Preemption>,
    /// MIG re-layouts of GPUs with no instance in use.
    pub repartitions: Vec<Repartition>,
    /// Demand no node can take now: what the capacity planner should buy for.
    pub unmet: Vec<Unmet>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    pub job: JobId,
    pub placements: Vec<Placement>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Preemption {
    pub victim: JobId,
    pub for_job: JobId,
    pub reason: PreemptionReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreemptionReason {
    /// A higher-priority job of the same team needs the capacity.
    Priority,
    /// A team under its nominal quota reclaims what another team borrowed.
    Reclaim,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Repartition {
    pub node: NodeId,
    pub gpu: u32,
    /// The new MIG layout; `None` turns MIG off (the GPU becomes one plain GPU).
    pub layout: Option<MigLayout>,
}

/// Why a queued job is still waiting (its shape and constraints are in the snapshot).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unmet {
    pub job: JobId,
    pub reason: WaitReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    /// No node has room: buy capacity.
    NoCapacity,
    /// The team's quota (with what it may borrow) is used up: buying does not help.
    Quota,
    /// Victims are checkpointing; the job runs when they have drained.
    WaitingForPreemption,
    /// A MIG re-layout was ordered; the job runs when the node has applied it.
    WaitingForRepartition,
}

impl WaitReason {
    pub const ALL: [WaitReason; 4] = [
        WaitReason::NoCapacity,
        WaitReason::Quota,
        WaitReason::WaitingForPreemption,
        WaitReason::WaitingForRepartition,
    ];

    /// Its code in the store (`jobs.wait_reason`).
    pub fn code(self) -> &'static str {
        match self {
            WaitReason::NoCapacity => "no_capacity",
            WaitReason::Quota => "quota",
            WaitReason::WaitingForPreemption => "waiting_for_preemption",
            WaitReason::WaitingForRepartition => "waiting_for_repartition",
        }
    }

    /// How it reads on the job (`state_reason`).
    pub fn text(self) -> &'static str {
        match self {
            WaitReason::NoCapacity => "waiting for capacity",
            WaitReason::Quota => "waiting for quota",
            WaitReason::WaitingForPreemption => "waiting for preempted jobs to checkpoint",
            WaitReason::WaitingForRepartition => "waiting for a MIG re-layout",
        }
    }
}

impl std::str::FromStr for WaitReason {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WaitReason::ALL
            .into_iter()
            .find(|r| r.code() == s)
            .ok_or_else(|| {
                format!(
                    "not a wait reason code (one of {:?})",
                    WaitReason::ALL.map(WaitReason::code)
                )
            })
    }
}
