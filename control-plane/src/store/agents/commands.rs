//! The command queue: what a node's agent should do, handed out with every heartbeat until
//! its result arrives, and what a result changes (a MIG layout now in force, a checkpoint made
//! durable, a start that failed).

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionTrait,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use spotplane_core::agent::{
    CheckpointOutcome, CheckpointReport, CheckpointTrigger, Command, CommandKind, CommandResult,
};
use spotplane_core::{CommandId, JobId, NodeId, NodeState};
use utoipa::ToSchema;

use super::checkpoints::record_checkpoint_in;
use super::{to_json, u32_col};
use crate::model::{Page, PageRequest};
use crate::store::entity::{agent_command, allocation, checkpoint, gpu, job, node, outbox};
use crate::store::jobs::job_note_in;
use crate::store::{Store, StoreError, from_json, new_uuid, parse_col};

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

pub(super) fn command_from_row(row: agent_command::Model) -> Result<CommandRecord, StoreError> {
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

/// The job a command concerns, if any.
pub(super) fn command_job(kind: &CommandKind) -> Option<JobId> {
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

/// What happened to one reported command result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ResultApplied {
    Recorded,
    AlreadyRecorded,
    NotThisNodes,
}

/// Records a command's result and its consequences (a MIG layout now in force, a checkpoint
/// made durable), inside the caller's transaction.
pub(super) async fn apply_result_in<C: ConnectionTrait>(
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
}
