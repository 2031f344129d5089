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
//!
//! # Where it is
//!
//! - `register.rs`: bootstrap tokens and registration;
//! - `heartbeat.rs`: heartbeats, what an agent last reported, and termination notices (the
//!   agent's or a cloud's event stream's);
//! - `commands.rs`: the command queue and the results the agents report;
//! - `checkpoints.rs`: checkpoint reports and the resume points they make.
//!
//! This file keeps what they share: a node's lifecycle move with its outbox event
//! (`node_transition_in`), and two helpers of the rows (`u32_col`, `to_json`).

mod checkpoints;
mod commands;
mod heartbeat;
mod register;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Set};
use serde::Serialize;
use serde_json::{Value, json};
use spotplane_core::NodeState;

use super::entity::{node, outbox};
use super::{StoreError, parse_col};

pub use checkpoints::{CHECKPOINT_COMPLETE, CheckpointRecord};
pub use commands::CommandRecord;
pub(crate) use commands::{PHASE_START_FAILED, enqueue_command_in};
pub use heartbeat::AgentStatus;
pub use register::{AgentCaller, BOOTSTRAP_PREFIX, Registration};

fn u32_col(table: &'static str, id: &str, v: i32) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|e| StoreError::corrupt(table, id, e))
}

fn to_json<T: Serialize>(v: &T) -> Result<Value, StoreError> {
    serde_json::to_value(v).map_err(|e| StoreError::Conflict(e.to_string()))
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
