//! The node agents: bootstrap tokens, registration, heartbeats, commands and checkpoint reports.
//!
//! # What is stored
//!
//! - `agent_bootstrap_tokens`: one-time secrets, hashed, one live per node. The control plane
//!   issues one when it creates a node (it goes into the instance's user data); the agent
//!   exchanges it once, at registration, for the node credential.
//! - The node credential is an `api_tokens` row of role `agent` bound to the node: it
//!   authenticates like every other token and acts for its own node only. A new exchange
//!   revokes the node's earlier credentials, and the node's termination revokes the last one:
//!   a credential of a terminated node is refused (`401`) on every route.
//! - `node_agents`: what the agent last said (inventory, telemetry, replicas, notice) and when.
//!   Only the latest is kept; history is the metrics' business.
//! - `agent_commands`: what the node should do, in order, until the agent reports a result.
//!   A command is handed out with every heartbeat until its result arrives (the agent ignores
//!   ids it has already run), so a lost answer costs a repeat, never a command.
//! - `checkpoints`: what the agents reported, durable or not, with the manifest of the durable
//!   ones. The resume point of a replica is its latest durable (`complete`) checkpoint.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionTrait,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use spotplane_core::agent::{
    CheckpointManifest, CheckpointOutcome, CheckpointReport, CheckpointTrigger, Command,
    CommandKind, CommandResult, GpuInfo, GpuTelemetry, Heartbeat, RegisterRequest, ReplicaPhase,
    ReplicaStatus, TerminationNotice,
};
use spotplane_core::job::JobSpec;
use spotplane_core::{CheckpointId, CommandId, JobId, NodeId, NodeState};
use utoipa::ToSchema;

use super::entity::{
    agent_bootstrap_token, agent_command, allocation, api_token, checkpoint, gpu, job, job_event,
    node, node_agent, outbox,
};
use super::jobs::job_note_in;
use super::tokens::{generate_secret, hash_secret, shown_prefix};
use super::{Store, StoreError, from_json, new_uuid, parse_col};
use crate::model::{Page, PageRequest, Role};

/// What an agent last told the control plane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentStatus {
    pub node_id: NodeId,
    pub protocol_version: u32,
    pub agent_version: String,
    pub hostname: String,
    /// The private address the agent registered, where gang peers reach the node (its
    /// hostname is used when it gave none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub instance_id: Option<String>,
    /// The GPUs the agent found at registration; empty on a node without a driver.
    pub gpus: Vec<GpuInfo>,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// The agent's clock minus ours at its last heartbeat, in milliseconds.
    pub clock_skew_ms: Option<i64>,
    pub heartbeats: u64,
    /// Per GPU and per MIG device, named after DCGM fields.
    pub telemetry: Vec<GpuTelemetry>,
    pub replicas: Vec<ReplicaStatus>,
    /// The termination notice the agent sees, if any.
    pub notice: Option<TerminationNotice>,
}

/// A command queued for a node's agent, with its delivery and outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CommandRecord {
    pub node_id: NodeId,
    pub command: Command,
    pub created_at: DateTime<Utc>,
    /// Last time a heartbeat answer carried it.
    pub delivered_at: Option<DateTime<Utc>>,
    pub deliveries: u32,
    pub completed_at: Option<DateTime<Utc>>,
    pub result: Option<CommandResult>,
}

/// A checkpoint as the control plane knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointRecord {
    pub id: CheckpointId,
    pub job_id: JobId,
    pub replica: u32,
    pub attempt: u32,
    /// The manifest's object-store URI.
    pub uri: String,
    /// `complete` (durable: a resume point), `missed_deadline` or `failed`.
    pub state: String,
    pub trigger: CheckpointTrigger,
    pub node_id: Option<NodeId>,
    pub manifest: Option<CheckpointManifest>,
    pub total_bytes: Option<u64>,
    pub message: Option<String>,
    pub created_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
}

/// The `checkpoints.state` of a durable checkpoint (what the scheduler reads).
pub const CHECKPOINT_COMPLETE: &str = "complete";

fn checkpoint_state(o: CheckpointOutcome) -> &'static str {
    match o {
        CheckpointOutcome::Durable => CHECKPOINT_COMPLETE,
        CheckpointOutcome::MissedDeadline => "missed_deadline",
        CheckpointOutcome::Failed => "failed",
    }
}

fn trigger_text(t: CheckpointTrigger) -> &'static str {
    match t {
        CheckpointTrigger::Notice => "notice",
        CheckpointTrigger::Command => "command",
        CheckpointTrigger::Drain => "drain",
    }
}

fn parse_trigger(id: &str, s: &str) -> Result<CheckpointTrigger, StoreError> {
    from_json("checkpoints", id, Value::String(s.to_owned()))
}

/// Who is registering: the holder of a bootstrap secret, or a node's agent with its credential.
#[derive(Debug, Clone)]
pub enum AgentCaller {
    Bootstrap(String),
    Node(NodeId),
}

/// What a registration came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Registration {
    /// Registered; `credential` is the new node credential when a bootstrap token was exchanged.
    Registered { credential: Option<String> },
    /// No live bootstrap token has this secret (unknown, used, revoked or expired).
    UnknownToken,
    /// The token belongs to another node than the one the request names.
    WrongNode,
}

/// Prefix of bootstrap secrets, so they are never mistaken for API tokens in logs or files.
/// A bootstrap secret is `spb_<node id, 32 hex digits>_<43 random base64url characters>`.
pub const BOOTSTRAP_PREFIX: &str = "spb_";

fn u32_col(table: &'static str, id: &str, v: i32) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|e| StoreError::corrupt(table, id, e))
}

fn to_json<T: Serialize>(v: &T) -> Result<Value, StoreError> {
    serde_json::to_value(v).map_err(|e| StoreError::Conflict(e.to_string()))
}

fn status_from_row(row: node_agent::Model) -> Result<AgentStatus, StoreError> {
    let id = row.node_id.clone();
    Ok(AgentStatus {
        node_id: parse_col("node_agents", &id, &row.node_id)?,
        protocol_version: u32::try_from(row.protocol_version)
            .map_err(|e| StoreError::corrupt("node_agents", &id, e))?,
        agent_version: row.agent_version,
        hostname: row.hostname,
        address: row.address,
        instance_id: row.instance_id,
        gpus: from_json("node_agents", &id, row.inventory)?,
        registered_at: row.registered_at,
        last_heartbeat_at: row.last_heartbeat_at,
        clock_skew_ms: row.clock_skew_ms,
        heartbeats: u64::try_from(row.heartbeats)
            .map_err(|e| StoreError::corrupt("node_agents", &id, e))?,
        telemetry: from_json("node_agents", &id, row.telemetry)?,
        replicas: from_json("node_agents", &id, row.replicas)?,
        notice: row
            .notice
            .map(|n| from_json("node_agents", &id, n))
            .transpose()?,
    })
}

fn command_from_row(row: agent_command::Model) -> Result<CommandRecord, StoreError> {
    let id = row.id.clone();
    Ok(CommandRecord {
        node_id: parse_col("agent_commands", &id, &row.node_id)?,
        command: Command {
            id: parse_col("agent_commands", &id, &row.id)?,
            kind: from_json("agent_commands", &id, row.body)?,
        },
        created_at: row.created_at,
        delivered_at: row.delivered_at,
        deliveries: u32_col("agent_commands", &id, row.deliveries)?,
        completed_at: row.completed_at,
        result: row
            .result
            .map(|r| from_json("agent_commands", &id, r))
            .transpose()?,
    })
}

fn checkpoint_from_row(row: checkpoint::Model) -> Result<CheckpointRecord, StoreError> {
    let id = row.id.clone();
    Ok(CheckpointRecord {
        id: parse_col("checkpoints", &id, &row.id)?,
        job_id: parse_col("checkpoints", &id, &row.job_id)?,
        replica: u32_col("checkpoints", &id, row.replica)?,
        attempt: u32_col("checkpoints", &id, row.attempt)?,
        uri: row.uri,
        trigger: parse_trigger(&id, &row.trigger)?,
        node_id: row
            .node_id
            .as_deref()
            .map(|n| parse_col("checkpoints", &id, n))
            .transpose()?,
        manifest: row
            .manifest
            .map(|m| from_json("checkpoints", &id, m))
            .transpose()?,
        total_bytes: row
            .total_bytes
            .map(|b| u64::try_from(b).map_err(|e| StoreError::corrupt("checkpoints", &id, e)))
            .transpose()?,
        state: row.state,
        message: row.message,
        created_at: row.created_at,
        completed_at: row.completed_at,
    })
}

/// The job a command concerns, if any.
fn command_job(kind: &CommandKind) -> Option<JobId> {
    match kind {
        CommandKind::Start { job_id, .. }
        | CommandKind::Checkpoint { job_id, .. }
        | CommandKind::Stop { job_id, .. } => Some(*job_id),
        CommandKind::ApplyMigLayout { .. } | CommandKind::Drain { .. } => None,
    }
}

fn command_kind_name(kind: &CommandKind) -> &'static str {
    match kind {
        CommandKind::Start { .. } => "start",
        CommandKind::Checkpoint { .. } => "checkpoint",
        CommandKind::Stop { .. } => "stop",
        CommandKind::ApplyMigLayout { .. } => "apply_mig_layout",
        CommandKind::Drain { .. } => "drain",
    }
}

/// Moves a node along its lifecycle inside the caller's transaction, with its outbox event.
/// Returns false (and writes nothing) when the lifecycle does not allow the move.
async fn node_transition_in<C: ConnectionTrait>(
    txn: &C,
    row: &node::Model,
    to: NodeState,
    reason: Option<String>,
    notice_deadline: Option<DateTime<Utc>>,
    extra: Value,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let from: NodeState = parse_col("nodes", &row.id, &row.state)?;
    if !from.can_transition_to(to) {
        return Ok(false);
    }
    let mut upd = node::Entity::update_many()
        .col_expr(node::Column::State, Expr::value(to.to_string()))
        .col_expr(node::Column::StateReason, Expr::value(reason.clone()))
        .col_expr(node::Column::UpdatedAt, Expr::value(now))
        .col_expr(node::Column::Version, Expr::value(row.version + 1))
        .filter(node::Column::Id.eq(row.id.clone()))
        .filter(node::Column::Version.eq(row.version));
    if to == NodeState::Ready {
        upd = upd.col_expr(node::Column::ReadyAt, Expr::value(Some(now)));
    }
    if let Some(d) = notice_deadline {
        upd = upd.col_expr(node::Column::NoticeDeadline, Expr::value(Some(d)));
    }
    if upd.exec(txn).await?.rows_affected != 1 {
        return Err(StoreError::Conflict(format!(
            "node {} changed concurrently; retry",
            row.id
        )));
    }
    outbox::ActiveModel {
        kind: Set(format!("node.{to}")),
        subject_kind: Set("node".into()),
        subject_id: Set(row.id.clone()),
        team_id: Set(None),
        payload: Set(
            json!({"node": {"id": row.id, "state": to, "cloud": row.cloud, "zone": row.zone,
            "instance_type": row.instance_type, "market": row.market}, "from_state": from,
            "reason": reason, "agent": extra}),
        ),
        created_at: Set(now),
        ..Default::default()
    }
    .insert(txn)
    .await?;
    Ok(true)
}

/// A termination notice with a deadline, from the node's agent or the cloud's event stream: a
/// live node moves to `draining` with the deadline (returns true); a node already draining
/// only takes an earlier deadline; a duplicate, late or out-of-order notice changes nothing else.
async fn notice_in<C: ConnectionTrait>(
    txn: &C,
    row: &node::Model,
    state: NodeState,
    deadline: DateTime<Utc>,
    reason: String,
    extra: Value,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    if matches!(
        state,
        NodeState::Requested | NodeState::Booting | NodeState::Ready
    ) {
        return node_transition_in(
            txn,
            row,
            NodeState::Draining,
            Some(reason),
            Some(deadline),
            extra,
            now,
        )
        .await;
    }
    if state == NodeState::Draining && row.notice_deadline.is_none_or(|d| deadline < d) {
        node::Entity::update_many()
            .col_expr(node::Column::NoticeDeadline, Expr::value(Some(deadline)))
            .filter(node::Column::Id.eq(row.id.clone()))
            .exec(txn)
            .await?;
    }
    Ok(false)
}

/// Records what a (re-)registering agent reports and marks a booting node ready.
async fn record_registration_in<C: ConnectionTrait>(
    txn: &C,
    node_row: &node::Model,
    req: &RegisterRequest,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let inventory = to_json(&req.gpus)?;
    let engine = req.container_engine.as_ref().map(to_json).transpose()?;
    let existing = node_agent::Entity::find_by_id(node_row.id.clone())
        .one(txn)
        .await?;
    let protocol_version = i32::try_from(req.protocol_version).unwrap_or(i32::MAX);
    match existing {
        Some(_) => {
            node_agent::Entity::update_many()
                .col_expr(
                    node_agent::Column::ProtocolVersion,
                    Expr::value(protocol_version),
                )
                .col_expr(
                    node_agent::Column::AgentVersion,
                    Expr::value(req.agent_version.clone()),
                )
                .col_expr(
                    node_agent::Column::Hostname,
                    Expr::value(req.hostname.clone()),
                )
                .col_expr(
                    node_agent::Column::InstanceId,
                    Expr::value(req.instance_id.clone()),
                )
                .col_expr(node_agent::Column::Inventory, Expr::value(inventory))
                .col_expr(node_agent::Column::ContainerEngine, Expr::value(engine))
                .col_expr(
                    node_agent::Column::Address,
                    Expr::value(req.address.clone()),
                )
                .col_expr(node_agent::Column::RegisteredAt, Expr::value(now))
                .filter(node_agent::Column::NodeId.eq(node_row.id.clone()))
                .exec(txn)
                .await?;
        }
        None => {
            node_agent::ActiveModel {
                node_id: Set(node_row.id.clone()),
                protocol_version: Set(protocol_version),
                agent_version: Set(req.agent_version.clone()),
                hostname: Set(req.hostname.clone()),
                instance_id: Set(req.instance_id.clone()),
                inventory: Set(inventory),
                registered_at: Set(now),
                last_heartbeat_at: Set(None),
                clock_skew_ms: Set(None),
                heartbeats: Set(0),
                telemetry: Set(json!([])),
                replicas: Set(json!([])),
                notice: Set(None),
                container_engine: Set(engine),
                address: Set(req.address.clone()),
            }
            .insert(txn)
            .await?;
        }
    }
    // The GPUs the control plane expects get the UUIDs the driver reports, by index.
    for g in &req.gpus {
        gpu::Entity::update_many()
            .col_expr(gpu::Column::Uuid, Expr::value(Some(g.uuid.clone())))
            .filter(gpu::Column::NodeId.eq(node_row.id.clone()))
            .filter(gpu::Column::Idx.eq(i32::try_from(g.index).unwrap_or(i32::MAX)))
            .exec(txn)
            .await?;
    }
    if req.instance_id.is_some() && node_row.provider_instance_id.is_none() {
        node::Entity::update_many()
            .col_expr(
                node::Column::ProviderInstanceId,
                Expr::value(req.instance_id.clone()),
            )
            .filter(node::Column::Id.eq(node_row.id.clone()))
            .exec(txn)
            .await?;
    }
    let state: NodeState = parse_col("nodes", &node_row.id, &node_row.state)?;
    if matches!(state, NodeState::Requested | NodeState::Booting) {
        let fresh = node::Entity::find_by_id(node_row.id.clone())
            .one(txn)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("node {}", node_row.id)))?;
        node_transition_in(
            txn,
            &fresh,
            NodeState::Ready,
            Some("agent registered".into()),
            None,
            json!({"hostname": req.hostname, "agent_version": req.agent_version}),
            now,
        )
        .await?;
    }
    Ok(())
}

/// Writes one checkpoint report: the row, a history entry of the job and its outbox event.
/// Idempotent: the same report again changes nothing; a durable checkpoint is never replaced.
/// With `default_root` (an agent's report), its URI must be under the job's checkpoint
/// prefix; without, the caller built the URI from a command the control plane issued.
async fn record_checkpoint_in<C: ConnectionTrait>(
    txn: &C,
    node_id: NodeId,
    report: &CheckpointReport,
    default_root: Option<&str>,
    now: DateTime<Utc>,
) -> Result<CheckpointRecord, StoreError> {
    let job_row = job::Entity::find_by_id(report.job_id.to_string())
        .one(txn)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("job {} on this node", report.job_id)))?;
    // A node acts for its own jobs only: it must have run this attempt, or been told to
    // checkpoint the job. Anything else answers as a job that does not exist.
    let attempt = i32::try_from(report.attempt).unwrap_or(i32::MAX);
    let ran_it = allocation::Entity::find()
        .filter(allocation::Column::JobId.eq(job_row.id.clone()))
        .filter(allocation::Column::NodeId.eq(node_id.to_string()))
        .filter(allocation::Column::Attempt.eq(attempt))
        .one(txn)
        .await?
        .is_some();
    let told_to = ran_it
        || agent_command::Entity::find()
            .filter(agent_command::Column::NodeId.eq(node_id.to_string()))
            .all(txn)
            .await?
            .into_iter()
            .filter_map(|c| serde_json::from_value::<CommandKind>(c.body).ok())
            .any(|k| command_job(&k) == Some(report.job_id));
    if !told_to {
        return Err(StoreError::NotFound(format!(
            "job {} on this node",
            report.job_id
        )));
    }
    // A checkpoint is where the job's own go, or a node could point the job's next attempt
    // at anyone's storage.
    if let Some(root) = default_root {
        let spec: JobSpec = from_json("jobs", &job_row.id, job_row.spec.clone())?;
        let prefix = super::recovery::checkpoint_prefix(&spec, report.job_id, root);
        if !is_checkpoint_of(&report.uri, &prefix, report.replica, report.checkpoint_id) {
            return Err(StoreError::Invalid {
                field: "uri".into(),
                message: format!(
                    "must be the manifest of this checkpoint under the job's checkpoint prefix, {}/replica-{}/{}/manifest.json",
                    prefix.trim_end_matches('/'),
                    report.replica,
                    report.checkpoint_id
                ),
            });
        }
    }
    let state = checkpoint_state(report.outcome);
    let manifest = report.manifest.as_ref().map(to_json).transpose()?;
    let total = report
        .manifest
        .as_ref()
        .map(|m| i64::try_from(m.total_bytes).unwrap_or(i64::MAX));
    let id = report.checkpoint_id.to_string();
    if let Some(existing) = checkpoint::Entity::find_by_id(id.clone()).one(txn).await? {
        if existing.job_id != job_row.id || existing.replica != report.replica as i32 {
            return Err(StoreError::Conflict(format!(
                "checkpoint {id} belongs to another job or replica"
            )));
        }
        if existing.state == CHECKPOINT_COMPLETE {
            if state == CHECKPOINT_COMPLETE && existing.manifest == manifest {
                return checkpoint_from_row(existing);
            }
            return Err(StoreError::Conflict(format!(
                "checkpoint {id} is already durable with another manifest"
            )));
        }
        if existing.state == state && existing.message == report.message {
            return checkpoint_from_row(existing);
        }
        checkpoint::Entity::delete_by_id(id.clone())
            .exec(txn)
            .await?;
    }
    let row = checkpoint::ActiveModel {
        id: Set(id.clone()),
        job_id: Set(job_row.id.clone()),
        replica: Set(i32::try_from(report.replica).unwrap_or(i32::MAX)),
        attempt: Set(attempt),
        uri: Set(report.uri.clone()),
        state: Set(state.to_owned()),
        trigger: Set(trigger_text(report.trigger).to_owned()),
        manifest: Set(manifest),
        total_bytes: Set(total),
        created_at: Set(report.started_at),
        completed_at: Set((state == CHECKPOINT_COMPLETE).then_some(report.finished_at)),
        node_id: Set(Some(node_id.to_string())),
        message: Set(report.message.clone()),
    }
    .insert(txn)
    .await?;
    let kind = match report.outcome {
        CheckpointOutcome::Durable => "job.checkpointed",
        CheckpointOutcome::MissedDeadline => "job.checkpoint_missed_deadline",
        CheckpointOutcome::Failed => "job.checkpoint_failed",
    };
    let data = json!({"checkpoint_id": report.checkpoint_id, "replica": report.replica,
        "attempt": report.attempt, "uri": report.uri, "node_id": node_id,
        "trigger": report.trigger, "total_bytes": total,
        "seconds": (report.finished_at - report.started_at).num_milliseconds() as f64 / 1000.0});
    job_event::ActiveModel {
        job_id: Set(job_row.id.clone()),
        at: Set(now),
        kind: Set(kind.into()),
        from_state: Set(None),
        to_state: Set(None),
        reason: Set(report.message.clone()),
        data: Set(Some(data.clone())),
        ..Default::default()
    }
    .insert(txn)
    .await?;
    outbox::ActiveModel {
        kind: Set(kind.into()),
        subject_kind: Set("job".into()),
        subject_id: Set(job_row.id.clone()),
        team_id: Set(Some(job_row.team_id.clone())),
        payload: Set(
            json!({"job": {"id": job_row.id, "state": job_row.state, "attempt": job_row.attempt},
            "checkpoint": data}),
        ),
        created_at: Set(now),
        ..Default::default()
    }
    .insert(txn)
    .await?;
    checkpoint_from_row(row)
}

/// Whether `uri` names checkpoint `id`'s manifest of `replica` under `prefix`
/// (`<prefix>/replica-<r>/<id>/manifest.json`). Compared as URLs, segment by decoded segment,
/// so neither spelling (`%2e%2e`, doubled slashes) nor dot segments lead out of the prefix.
pub(crate) fn is_checkpoint_of(uri: &str, prefix: &str, replica: u32, id: CheckpointId) -> bool {
    fn parts(u: &str) -> Option<(String, String, Vec<String>)> {
        let url = url::Url::parse(u).ok()?;
        let segs = url
            .path_segments()
            .map(|s| {
                s.filter(|p| !p.is_empty())
                    .map(percent_decode)
                    .collect::<Option<Vec<_>>>()
            })
            .unwrap_or(Some(Vec::new()))?;
        Some((
            url.scheme().to_owned(),
            url.host_str().unwrap_or_default().to_owned(),
            segs,
        ))
    }
    fn percent_decode(p: &str) -> Option<String> {
        let bytes = p.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                let hex = p.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).ok()
    }
    let (Some((scheme, host, segs)), Some((p_scheme, p_host, p_segs))) =
        (parts(uri), parts(prefix))
    else {
        return false;
    };
    let tail = [
        format!("replica-{replica}"),
        id.to_string(),
        "manifest.json".to_owned(),
    ];
    scheme == p_scheme
        && host == p_host
        && segs.len() == p_segs.len() + tail.len()
        && segs[..p_segs.len()] == p_segs[..]
        && segs[p_segs.len()..] == tail[..]
}

/// Queues a command for a node's agent inside the caller's transaction, with its outbox event.
/// A terminated node takes no commands.
pub(crate) async fn enqueue_command_in<C: ConnectionTrait>(
    txn: &C,
    node_id: NodeId,
    kind: CommandKind,
    now: DateTime<Utc>,
) -> Result<CommandRecord, StoreError> {
    let id = CommandId::from_uuid(new_uuid(now));
    let node_row = node::Entity::find_by_id(node_id.to_string())
        .one(txn)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("node {node_id}")))?;
    if parse_col::<NodeState>("nodes", &node_row.id, &node_row.state)?.is_terminal() {
        return Err(StoreError::Conflict(format!(
            "node {node_id} is terminated"
        )));
    }
    let row = agent_command::ActiveModel {
        id: Set(id.to_string()),
        node_id: Set(node_id.to_string()),
        kind: Set(command_kind_name(&kind).to_owned()),
        body: Set(to_json(&kind)?),
        created_at: Set(now),
        delivered_at: Set(None),
        deliveries: Set(0),
        completed_at: Set(None),
        ok: Set(None),
        result: Set(None),
    }
    .insert(txn)
    .await?;
    outbox::ActiveModel {
        kind: Set("node.command_queued".into()),
        subject_kind: Set("node".into()),
        subject_id: Set(node_id.to_string()),
        team_id: Set(None),
        payload: Set(json!({"node": {"id": node_id}, "command": {"id": id, "type": command_kind_name(&kind)}})),
        created_at: Set(now),
        ..Default::default()
    }
    .insert(txn)
    .await?;
    command_from_row(row)
}

/// An allocation whose `start` command failed.
pub(crate) const PHASE_START_FAILED: &str = "start_failed";

/// The most of an agent's start error that is kept (an engine's stderr can be long).
const START_ERROR_MAX: usize = 2000;

/// An agent's reason for a failed start, trimmed to [`START_ERROR_MAX`] bytes on a character
/// boundary.
fn start_error_text(message: Option<&str>) -> String {
    let m = message
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .unwrap_or("the agent gave no reason");
    if m.len() <= START_ERROR_MAX {
        return m.to_owned();
    }
    let mut end = START_ERROR_MAX;
    while !m.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &m[..end])
}

pub(crate) fn phase_text(p: ReplicaPhase) -> &'static str {
    match p {
        ReplicaPhase::Starting => "starting",
        ReplicaPhase::Running => "running",
        ReplicaPhase::Checkpointing => "checkpointing",
        ReplicaPhase::Exited => "exited",
    }
}

/// What happened to one reported command result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResultApplied {
    Recorded,
    AlreadyRecorded,
    NotThisNodes,
}

/// Records a command's result and its consequences (a MIG layout now in force, a checkpoint
/// made durable), inside the caller's transaction.
async fn apply_result_in<C: ConnectionTrait>(
    txn: &C,
    node_id: NodeId,
    result: &CommandResult,
    now: DateTime<Utc>,
) -> Result<ResultApplied, StoreError> {
    let Some(row) = agent_command::Entity::find_by_id(result.command_id.to_string())
        .one(txn)
        .await?
        .filter(|r| r.node_id == node_id.to_string())
    else {
        return Ok(ResultApplied::NotThisNodes);
    };
    if row.completed_at.is_some() {
        return Ok(ResultApplied::AlreadyRecorded);
    }
    let kind: CommandKind = from_json("agent_commands", &row.id, row.body.clone())?;
    let done = agent_command::Entity::update_many()
        .col_expr(agent_command::Column::CompletedAt, Expr::value(Some(now)))
        .col_expr(agent_command::Column::Ok, Expr::value(Some(result.ok)))
        .col_expr(
            agent_command::Column::Result,
            Expr::value(Some(to_json(result)?)),
        )
        .filter(agent_command::Column::Id.eq(row.id.clone()))
        .filter(agent_command::Column::CompletedAt.is_null())
        .exec(txn)
        .await?;
    if done.rows_affected != 1 {
        return Ok(ResultApplied::AlreadyRecorded);
    }
    match (&kind, &result.mig_layout, &result.manifest) {
        (CommandKind::ApplyMigLayout { gpu_index, .. }, Some(applied), _)
            if applied.gpu_index == *gpu_index =>
        {
            // The layout the GPU has now, whether or not the command succeeded: the scheduler
            // plans on what is, and may order the re-layout again.
            gpu::Entity::update_many()
                .col_expr(
                    gpu::Column::MigLayout,
                    Expr::value(to_json(&applied.layout)?),
                )
                // An empty layout was MIG turned off.
                .col_expr(
                    gpu::Column::MigEnabled,
                    Expr::value(!applied.layout.is_empty()),
                )
                .col_expr(
                    gpu::Column::DesiredMigLayout,
                    Expr::value(Option::<Value>::None),
                )
                .filter(gpu::Column::NodeId.eq(node_id.to_string()))
                .filter(gpu::Column::Idx.eq(i32::try_from(*gpu_index).unwrap_or(i32::MAX)))
                .exec(txn)
                .await?;
        }
        (
            CommandKind::Checkpoint {
                job_id,
                replica,
                uri,
                ..
            },
            _,
            Some(m),
        ) if result.ok && m.job_id == *job_id && m.replica == *replica => {
            // The agent's layout (docs/agent.md): <prefix>/replica-<r>/<id>/manifest.json.
            let report = CheckpointReport {
                job_id: m.job_id,
                replica: m.replica,
                attempt: m.attempt,
                checkpoint_id: m.checkpoint_id,
                uri: format!(
                    "{}/replica-{}/{}/manifest.json",
                    uri.trim_end_matches('/'),
                    m.replica,
                    m.checkpoint_id
                ),
                trigger: CheckpointTrigger::Command,
                outcome: CheckpointOutcome::Durable,
                manifest: Some(m.clone()),
                message: None,
                started_at: m.created_at,
                finished_at: now,
            };
            // The agent reports the checkpoint itself too (with its URI); whichever comes
            // first records it, the other is a no-op.
            if checkpoint::Entity::find_by_id(m.checkpoint_id.to_string())
                .one(txn)
                .await?
                .is_none()
            {
                record_checkpoint_in(txn, node_id, &report, None, now).await?;
            }
        }
        (
            CommandKind::Start {
                job_id,
                replica,
                attempt,
                ..
            },
            _,
            _,
        ) if !result.ok => {
            // The replica never ran (its image would not pull, its checkpoint could not be
            // restored, the command was not found): the recovery loop counts it as a failure
            // of the job, and the job's events and webhooks say why.
            let why = start_error_text(result.message.as_deref());
            let marked = allocation::Entity::update_many()
                .col_expr(allocation::Column::Phase, Expr::value(PHASE_START_FAILED))
                .col_expr(allocation::Column::PhaseAt, Expr::value(Some(now)))
                .col_expr(
                    allocation::Column::StartError,
                    Expr::value(Some(why.clone())),
                )
                .filter(allocation::Column::JobId.eq(job_id.to_string()))
                .filter(allocation::Column::Replica.eq(i32::try_from(*replica).unwrap_or(i32::MAX)))
                .filter(allocation::Column::Attempt.eq(i32::try_from(*attempt).unwrap_or(i32::MAX)))
                .filter(allocation::Column::NodeId.eq(node_id.to_string()))
                .filter(allocation::Column::ReleasedAt.is_null())
                .exec(txn)
                .await?;
            if marked.rows_affected > 0
                && let Some(job_row) = job::Entity::find_by_id(job_id.to_string()).one(txn).await?
            {
                job_note_in(
                    txn,
                    job_row,
                    "start_failed",
                    &format!("replica {replica} could not start on node {node_id}: {why}"),
                    json!({"replica": replica, "attempt": attempt, "node_id": node_id, "error": why}),
                    now,
                )
                .await?;
            }
        }
        _ => {}
    }
    Ok(ResultApplied::Recorded)
}

impl Store {
    /// Issues a node's bootstrap token, valid until `expires_at`, revoking any earlier one not
    /// yet used. Returns the secret, which only its hash is kept of.
    pub async fn issue_agent_bootstrap(
        &self,
        node_id: NodeId,
        expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<String, StoreError> {
        // The node id rides in the token, so an agent needs nothing else to register.
        let secret = format!(
            "{BOOTSTRAP_PREFIX}{}_{}",
            node_id.as_uuid().simple(),
            generate_secret().trim_start_matches("spt_")
        );
        self.measured("issue_agent_bootstrap", || async {
            let txn = self.write.begin().await?;
            let node_row = node::Entity::find_by_id(node_id.to_string())
                .one(&txn)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("node {node_id}")))?;
            if parse_col::<NodeState>("nodes", &node_row.id, &node_row.state)?.is_terminal() {
                return Err(StoreError::Conflict(format!(
                    "node {node_id} is terminated"
                )));
            }
            agent_bootstrap_token::Entity::update_many()
                .col_expr(
                    agent_bootstrap_token::Column::RevokedAt,
                    Expr::value(Some(now)),
                )
                .filter(agent_bootstrap_token::Column::NodeId.eq(node_id.to_string()))
                .filter(agent_bootstrap_token::Column::UsedAt.is_null())
                .filter(agent_bootstrap_token::Column::RevokedAt.is_null())
                .exec(&txn)
                .await?;
            agent_bootstrap_token::ActiveModel {
                id: Set(new_uuid(now).to_string()),
                node_id: Set(node_id.to_string()),
                secret_hash: Set(hash_secret(&secret)),
                created_at: Set(now),
                expires_at: Set(expires_at),
                used_at: Set(None),
                revoked_at: Set(None),
            }
            .insert(&txn)
            .await?;
            txn.commit().await?;
            Ok(())
        })
        .await?;
        Ok(secret)
    }

    /// Records a node about to be requested from a cloud (see [`Store::create_node`]) and
    /// issues its bootstrap token, for the instance's user data. Provisioning calls this; a
    /// retry after a failure in between issues a fresh token (the unused one is revoked).
    pub async fn create_node_with_bootstrap(
        &self,
        new: super::NewNode,
        bootstrap_expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(crate::model::Node, String), StoreError> {
        let id = new.id;
        let node = self.create_node(new, now).await?;
        let secret = self
            .issue_agent_bootstrap(id, bootstrap_expires_at, now)
            .await?;
        Ok((node, secret))
    }

    /// Registers a node's agent. With a bootstrap secret: exchanges it (once) for a new node
    /// credential, revoking the node's earlier credentials. With the credential (an agent
    /// that restarted): refreshes what it reported. Either way a node still booting becomes
    /// ready, with its event. A terminated node cannot register (conflict).
    pub async fn register_agent(
        &self,
        caller: AgentCaller,
        req: &RegisterRequest,
        now: DateTime<Utc>,
    ) -> Result<Registration, StoreError> {
        let credential = generate_secret();
        let outcome = self
            .measured("register_agent", || async {
                let txn = self.write.begin().await?;
                let exchanged = match &caller {
                    AgentCaller::Node(n) if *n != req.node_id => {
                        return Ok(Registration::WrongNode);
                    }
                    AgentCaller::Node(_) => false,
                    AgentCaller::Bootstrap(secret) => {
                        let Some(tok) = agent_bootstrap_token::Entity::find()
                            .filter(
                                agent_bootstrap_token::Column::SecretHash.eq(hash_secret(secret)),
                            )
                            .one(&txn)
                            .await?
                        else {
                            return Ok(Registration::UnknownToken);
                        };
                        if tok.used_at.is_some()
                            || tok.revoked_at.is_some()
                            || tok.expires_at <= now
                        {
                            tracing::warn!(node = %tok.node_id, used = ?tok.used_at, revoked = ?tok.revoked_at,
                                expires = %tok.expires_at, "a spent or expired bootstrap token was presented");
                            return Ok(Registration::UnknownToken);
                        }
                        if tok.node_id != req.node_id.to_string() {
                            return Ok(Registration::WrongNode);
                        }
                        true
                    }
                };
                let node_row = node::Entity::find_by_id(req.node_id.to_string())
                    .one(&txn)
                    .await?
                    .ok_or_else(|| StoreError::NotFound(format!("node {}", req.node_id)))?;
                if parse_col::<NodeState>("nodes", &node_row.id, &node_row.state)?.is_terminal() {
                    return Err(StoreError::Conflict(format!(
                        "node {} is terminated",
                        req.node_id
                    )));
                }
                if exchanged {
                    let used = agent_bootstrap_token::Entity::update_many()
                        .col_expr(agent_bootstrap_token::Column::UsedAt, Expr::value(Some(now)))
                        .filter(
                            agent_bootstrap_token::Column::SecretHash.eq(hash_secret(
                                match &caller {
                                    AgentCaller::Bootstrap(s) => s.as_str(),
                                    AgentCaller::Node(_) => "",
                                },
                            )),
                        )
                        .filter(agent_bootstrap_token::Column::UsedAt.is_null())
                        .exec(&txn)
                        .await?;
                    if used.rows_affected != 1 {
                        // Another registration with the same secret won the race.
                        return Ok(Registration::UnknownToken);
                    }
                    api_token::Entity::update_many()
                        .col_expr(api_token::Column::RevokedAt, Expr::value(Some(now)))
                        .filter(api_token::Column::Role.eq(Role::Agent.as_str()))
                        .filter(api_token::Column::NodeId.eq(node_row.id.clone()))
                        .filter(api_token::Column::RevokedAt.is_null())
                        .exec(&txn)
                        .await?;
                    api_token::ActiveModel {
                        id: Set(new_uuid(now).to_string()),
                        name: Set(format!("agent {}", node_row.name)),
                        role: Set(Role::Agent.as_str().to_owned()),
                        team_id: Set(None),
                        node_id: Set(Some(node_row.id.clone())),
                        secret_hash: Set(hash_secret(&credential)),
                        prefix: Set(shown_prefix(&credential)),
                        created_at: Set(now),
                        expires_at: Set(None),
                        revoked_at: Set(None),
                    }
                    .insert(&txn)
                    .await?;
                }
                record_registration_in(&txn, &node_row, req, now).await?;
                txn.commit().await?;
                Ok(Registration::Registered {
                    credential: exchanged.then(|| credential.clone()),
                })
            })
            .await?;
        if matches!(
            outcome,
            Registration::Registered {
                credential: Some(_)
            }
        ) {
            // The node's earlier credentials stop working on this replica at once.
            self.tokens.clear();
        }
        Ok(outcome)
    }

    /// Records a heartbeat and returns the commands the node should carry out, oldest first.
    ///
    /// In one transaction: what the agent reports replaces what it reported before; the
    /// results it carries complete their commands; a termination notice with a deadline moves
    /// the node to `draining` with that deadline (a rebalance warning is only recorded); and
    /// every command without a result is handed out again.
    pub async fn agent_heartbeat(
        &self,
        node_id: NodeId,
        hb: &Heartbeat,
        now: DateTime<Utc>,
    ) -> Result<Vec<Command>, StoreError> {
        self.measured("agent_heartbeat", || async {
            let txn = self.write.begin().await?;
            let agent = node_agent::Entity::find_by_id(node_id.to_string())
                .one(&txn)
                .await?
                .ok_or_else(|| {
                    StoreError::Conflict(format!(
                        "node {node_id} has not registered; POST /v1/agent/register first"
                    ))
                })?;
            let node_row = node::Entity::find_by_id(node_id.to_string())
                .one(&txn)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("node {node_id}")))?;
            let notice = hb.notice.as_ref().map(to_json).transpose()?;
            let skew = (hb.sent_at - now).num_milliseconds();
            node_agent::Entity::update_many()
                .col_expr(node_agent::Column::LastHeartbeatAt, Expr::value(Some(now)))
                .col_expr(node_agent::Column::ClockSkewMs, Expr::value(Some(skew)))
                .col_expr(
                    node_agent::Column::Heartbeats,
                    Expr::value(agent.heartbeats.saturating_add(1)),
                )
                .col_expr(node_agent::Column::Telemetry, Expr::value(to_json(&hb.gpus)?))
                .col_expr(node_agent::Column::Replicas, Expr::value(to_json(&hb.replicas)?))
                .col_expr(node_agent::Column::Notice, Expr::value(notice.clone()))
                .filter(node_agent::Column::NodeId.eq(node_id.to_string()))
                .exec(&txn)
                .await?;
            node::Entity::update_many()
                .col_expr(node::Column::AgentLastSeen, Expr::value(Some(now)))
                .filter(node::Column::Id.eq(node_id.to_string()))
                .exec(&txn)
                .await?;
            // Each replica's phase goes on its allocation (this attempt, this node), so an exit
            // is kept until the recovery loop has acted on it.
            for r in &hb.replicas {
                allocation::Entity::update_many()
                    .col_expr(allocation::Column::Phase, Expr::value(phase_text(r.phase)))
                    .col_expr(allocation::Column::ExitCode, Expr::value(r.exit_code))
                    .col_expr(allocation::Column::PhaseAt, Expr::value(Some(now)))
                    .filter(allocation::Column::JobId.eq(r.job_id.to_string()))
                    .filter(allocation::Column::Replica.eq(i32::try_from(r.replica).unwrap_or(i32::MAX)))
                    .filter(allocation::Column::Attempt.eq(i32::try_from(r.attempt).unwrap_or(i32::MAX)))
                    .filter(allocation::Column::NodeId.eq(node_id.to_string()))
                    .filter(allocation::Column::ReleasedAt.is_null())
                    .filter(allocation::Column::Phase.ne(PHASE_START_FAILED).or(allocation::Column::Phase.is_null()))
                    .exec(&txn)
                    .await?;
            }
            for r in &hb.results {
                if apply_result_in(&txn, node_id, r, now).await? == ResultApplied::NotThisNodes {
                    tracing::warn!(node = %node_id, command = %r.command_id, "result for a command this node was not sent; ignored");
                }
            }
            // A new notice is one event: `node.draining` when it moves the node there (the
            // webhooks make that the teams' `node.notice`), else `node.notice` (a rebalance
            // warning, or a node already draining).
            if notice != agent.notice
                && let Some(n) = &hb.notice
            {
                let mut drained = false;
                if let Some(deadline) = n.drain_deadline() {
                    let state: NodeState = parse_col("nodes", &node_row.id, &node_row.state)?;
                    let reason = format!(
                        "termination notice ({}, {}) for {}",
                        serde_json::to_value(n.source)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default(),
                        n.action,
                        deadline.to_rfc3339()
                    );
                    drained = notice_in(&txn, &node_row, state, deadline, reason, json!({"notice": n}), now).await?;
                }
                if !drained {
                    outbox::ActiveModel {
                        kind: Set("node.notice".into()),
                        subject_kind: Set("node".into()),
                        subject_id: Set(node_id.to_string()),
                        team_id: Set(None),
                        payload: Set(json!({"node": {"id": node_id}, "notice": n})),
                        created_at: Set(now),
                        ..Default::default()
                    }
                    .insert(&txn)
                    .await?;
                }
            }
            let pending = agent_command::Entity::find()
                .filter(agent_command::Column::NodeId.eq(node_id.to_string()))
                .filter(agent_command::Column::CompletedAt.is_null())
                .order_by_asc(agent_command::Column::Id)
                .all(&txn)
                .await?;
            let mut out = Vec::with_capacity(pending.len());
            for row in pending {
                agent_command::Entity::update_many()
                    .col_expr(agent_command::Column::DeliveredAt, Expr::value(Some(now)))
                    .col_expr(
                        agent_command::Column::Deliveries,
                        Expr::value(row.deliveries.saturating_add(1)),
                    )
                    .filter(agent_command::Column::Id.eq(row.id.clone()))
                    .exec(&txn)
                    .await?;
                out.push(command_from_row(row)?.command);
            }
            txn.commit().await?;
            Ok(out)
        })
        .await
    }

    /// Records the result of one command of this node; a second report of the same result
    /// changes nothing. A command of another node, or none, is not found.
    pub async fn complete_agent_command(
        &self,
        node_id: NodeId,
        result: &CommandResult,
        now: DateTime<Utc>,
    ) -> Result<CommandRecord, StoreError> {
        self.measured("complete_agent_command", || async {
            let txn = self.write.begin().await?;
            if apply_result_in(&txn, node_id, result, now).await? == ResultApplied::NotThisNodes {
                return Err(StoreError::NotFound(format!(
                    "command {} of this node",
                    result.command_id
                )));
            }
            let row = agent_command::Entity::find_by_id(result.command_id.to_string())
                .one(&txn)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("command {}", result.command_id)))?;
            txn.commit().await?;
            command_from_row(row)
        })
        .await
    }

    /// Records a checkpoint report of this node (see [`CheckpointReport`]); a job the node
    /// neither ran (this attempt) nor was told to checkpoint is not found.
    /// Its `uri` must be the checkpoint's manifest under the job's checkpoint prefix (its own
    /// `checkpoint.uri`, else `<default_root>/jobs/<id>`), or it is refused as invalid.
    pub async fn record_checkpoint(
        &self,
        node_id: NodeId,
        report: &CheckpointReport,
        default_root: &str,
        now: DateTime<Utc>,
    ) -> Result<CheckpointRecord, StoreError> {
        self.measured("record_checkpoint", || async {
            let txn = self.write.begin().await?;
            let rec = record_checkpoint_in(&txn, node_id, report, Some(default_root), now).await?;
            txn.commit().await?;
            Ok(rec)
        })
        .await
    }

    /// Queues a command for a node's agent; it goes out with the node's next heartbeat.
    pub async fn enqueue_agent_command(
        &self,
        node_id: NodeId,
        kind: CommandKind,
        now: DateTime<Utc>,
    ) -> Result<CommandRecord, StoreError> {
        self.measured("enqueue_agent_command", || async {
            let txn = self.write.begin().await?;
            let rec = enqueue_command_in(&txn, node_id, kind.clone(), now).await?;
            txn.commit().await?;
            Ok(rec)
        })
        .await
    }

    /// A termination notice from a cloud's event stream for the instance `provider_id`: the
    /// node moves to `draining` as with an agent's notice (see `notice_in`). Returns the node,
    /// or `None` when no live node has that instance (logged and dropped by the caller).
    pub async fn provider_notice(
        &self,
        cloud: spotplane_core::Cloud,
        provider_id: &str,
        deadline: DateTime<Utc>,
        what: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<NodeId>, StoreError> {
        self.measured("provider_notice", || async {
            let txn = self.write.begin().await?;
            let Some(row) = node::Entity::find()
                .filter(node::Column::Cloud.eq(cloud.to_string()))
                .filter(node::Column::ProviderInstanceId.eq(provider_id.to_owned()))
                .one(&txn)
                .await?
            else {
                return Ok(None);
            };
            let state: NodeState = parse_col("nodes", &row.id, &row.state)?;
            let reason = format!(
                "termination notice ({cloud} event stream, {what}) for {}",
                deadline.to_rfc3339()
            );
            notice_in(
                &txn,
                &row,
                state,
                deadline,
                reason,
                json!({"source": "provider"}),
                now,
            )
            .await?;
            txn.commit().await?;
            Ok(Some(parse_col("nodes", &row.id, &row.id)?))
        })
        .await
    }

    /// A node's commands, newest first.
    /// One page of the commands sent to a node's agent, newest first.
    pub async fn agent_commands(
        &self,
        node_id: NodeId,
        page: &PageRequest<CommandId>,
    ) -> Result<Page<CommandRecord>, StoreError> {
        self.measured("agent_commands", || async {
            let mut q = agent_command::Entity::find()
                .filter(agent_command::Column::NodeId.eq(node_id.to_string()))
                .order_by_desc(agent_command::Column::Id)
                .limit(page.rows_to_read());
            if let Some(after) = page.after {
                q = q.filter(agent_command::Column::Id.lt(after.to_string()));
            }
            let (rows, next_cursor) = page.cut(q.all(&self.read).await?, |r| r.id.clone());
            Ok(Page {
                items: rows
                    .into_iter()
                    .map(command_from_row)
                    .collect::<Result<_, _>>()?,
                next_cursor,
            })
        })
        .await
    }

    /// What a node's agent last reported; not found before it registers.
    pub async fn agent_status(&self, node_id: NodeId) -> Result<AgentStatus, StoreError> {
        self.measured("agent_status", || async {
            let row = node_agent::Entity::find_by_id(node_id.to_string())
                .one(&self.read)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("agent of node {node_id}")))?;
            status_from_row(row)
        })
        .await
    }

    /// A job's checkpoints, newest first.
    /// One page of a job's checkpoints, newest first.
    pub async fn job_checkpoints_page(
        &self,
        job_id: JobId,
        page: &PageRequest<CheckpointId>,
    ) -> Result<Page<CheckpointRecord>, StoreError> {
        self.measured("job_checkpoints_page", || async {
            let mut q = checkpoint::Entity::find()
                .filter(checkpoint::Column::JobId.eq(job_id.to_string()))
                .order_by_desc(checkpoint::Column::Id)
                .limit(page.rows_to_read());
            if let Some(after) = page.after {
                q = q.filter(checkpoint::Column::Id.lt(after.to_string()));
            }
            let (rows, next_cursor) = page.cut(q.all(&self.read).await?, |r| r.id.clone());
            Ok(Page {
                items: rows
                    .into_iter()
                    .map(checkpoint_from_row)
                    .collect::<Result<_, _>>()?,
                next_cursor,
            })
        })
        .await
    }

    pub async fn job_checkpoints(
        &self,
        job_id: JobId,
    ) -> Result<Vec<CheckpointRecord>, StoreError> {
        self.measured("job_checkpoints", || async {
            checkpoint::Entity::find()
                .filter(checkpoint::Column::JobId.eq(job_id.to_string()))
                .order_by_desc(checkpoint::Column::Id)
                .all(&self.read)
                .await?
                .into_iter()
                .map(checkpoint_from_row)
                .collect()
        })
        .await
    }

    /// The resume point of one replica: its latest durable checkpoint, if it has one.
    pub async fn latest_durable_checkpoint(
        &self,
        job_id: JobId,
        replica: u32,
    ) -> Result<Option<CheckpointRecord>, StoreError> {
        self.measured("latest_durable_checkpoint", || async {
            checkpoint::Entity::find()
                .filter(checkpoint::Column::JobId.eq(job_id.to_string()))
                .filter(checkpoint::Column::Replica.eq(i32::try_from(replica).unwrap_or(i32::MAX)))
                .filter(checkpoint::Column::State.eq(CHECKPOINT_COMPLETE))
                .order_by_desc(checkpoint::Column::CompletedAt)
                .order_by_desc(checkpoint::Column::Id)
                .one(&self.read)
                .await?
                .map(checkpoint_from_row)
                .transpose()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_the_jobs_only_as_its_manifest_under_the_jobs_prefix() {
        let id = CheckpointId(uuid::Uuid::now_v7());
        let ok = |uri: &str, prefix: &str| is_checkpoint_of(uri, prefix, 0, id);
        let a = "file:///tmp/.tmpx/bucket/team-a";
        assert!(ok(&format!("{a}/replica-0/{id}/manifest.json"), a));
        assert!(ok(
            &format!("{a}/replica-0/{id}/manifest.json"),
            &format!("{a}/")
        ));
        assert!(ok(
            &format!("s3://b/p/replica-0/{id}/manifest.json"),
            "s3://b/p"
        ));
        for bad in [
            format!("file:///tmp/.tmpx/bucket/team-b/replica-0/{id}/manifest.json"),
            format!("{a}/../team-b/replica-0/{id}/manifest.json"),
            format!("{a}/replica-1/{id}/manifest.json"),
            format!("s3://tmp/.tmpx/bucket/team-a/replica-0/{id}/manifest.json"),
            "garbage".to_owned(),
        ] {
            assert!(!ok(&bad, a), "{bad}");
        }
    }
}
