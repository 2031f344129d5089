//! Heartbeats and termination notices: what an agent last said, and a notice with a
//! deadline, from the agent or from a cloud's event stream, moving its node to `draining`.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, Set,
    TransactionTrait,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use spotplane_core::agent::{
    Command, GpuInfo, GpuTelemetry, Heartbeat, ReplicaPhase, ReplicaStatus, TerminationNotice,
};
use spotplane_core::{GpuModel, NodeId, NodeState};
use utoipa::ToSchema;

use super::commands::{PHASE_START_FAILED, ResultApplied, apply_result_in, command_from_row};
use super::{node_transition_in, to_json};
use crate::store::entity::{agent_command, allocation, gpu, node, node_agent, outbox};
use crate::store::{Store, StoreError, from_json, parse_col};

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

pub(crate) fn phase_text(p: ReplicaPhase) -> &'static str {
    match p {
        ReplicaPhase::Starting => "starting",
        ReplicaPhase::Running => "running",
        ReplicaPhase::Checkpointing => "checkpointing",
        ReplicaPhase::Exited => "exited",
    }
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

/// Adds this heartbeat's GPU readings to the running sums of the replicas holding the
/// devices (see `crate::metrics::dcgm::attribute`), for each job's utilisation over its run.
async fn record_utilisation<C: ConnectionTrait>(
    txn: &C,
    node_id: NodeId,
    agent: &node_agent::Model,
    rows: &[GpuTelemetry],
) -> Result<(), StoreError> {
    use crate::metrics::dcgm::{attribute, replica_reading};
    let live = allocation::Entity::find()
        .filter(allocation::Column::NodeId.eq(node_id.to_string()))
        .filter(allocation::Column::ReleasedAt.is_null())
        .all(txn)
        .await?;
    if live.is_empty() {
        return Ok(());
    }
    let model = gpu::Entity::find()
        .filter(gpu::Column::NodeId.eq(node_id.to_string()))
        .one(txn)
        .await?
        .and_then(|g| g.model.parse::<GpuModel>().ok());
    // An inventory that does not parse only costs the UUID match.
    let inventory: Vec<GpuInfo> =
        serde_json::from_value(agent.inventory.clone()).unwrap_or_default();
    let held = live
        .iter()
        .map(crate::store::metrics::held_of)
        .collect::<Result<Vec<_>, _>>()?;
    let owners = attribute(rows, &inventory, model, &held);
    let mut per: Vec<Vec<&GpuTelemetry>> = vec![Vec::new(); live.len()];
    for (row, who) in rows.iter().zip(&owners) {
        for i in who {
            per[*i].push(row);
        }
    }
    for (a, mine) in live.iter().zip(per) {
        let Some((sm, mem)) = replica_reading(&mine) else {
            continue;
        };
        let mem = i64::try_from(mem).unwrap_or(i64::MAX);
        allocation::Entity::update_many()
            .col_expr(
                allocation::Column::UtilSamples,
                Expr::value(a.util_samples.saturating_add(1)),
            )
            .col_expr(
                allocation::Column::SmUtilSum,
                Expr::value(a.sm_util_sum.saturating_add(sm.round() as i64)),
            )
            .col_expr(
                allocation::Column::MemUsedMibSum,
                Expr::value(a.mem_used_mib_sum.saturating_add(mem)),
            )
            .col_expr(
                allocation::Column::MemUsedMibMax,
                Expr::value(a.mem_used_mib_max.max(mem)),
            )
            .filter(allocation::Column::Id.eq(a.id.clone()))
            .exec(txn)
            .await?;
    }
    Ok(())
}

impl Store {
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
            if !hb.gpus.is_empty() {
                record_utilisation(&txn, node_id, &agent, &hb.gpus).await?;
            }
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
                        payload: Set(json!({"node": {"id": node_id, "cloud": node_row.cloud}, "notice": n})),
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
}
