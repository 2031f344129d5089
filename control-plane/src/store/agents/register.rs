//! Bootstrap tokens and registration: a node's one-time secret, exchanged once for its
//! credential, and what a (re-)registering agent reports.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Set, TransactionTrait,
};
use serde_json::json;
use spotplane_core::agent::RegisterRequest;
use spotplane_core::{NodeId, NodeState};

use super::{node_transition_in, to_json};
use crate::model::Role;
use crate::store::entity::{agent_bootstrap_token, api_token, gpu, node, node_agent};
use crate::store::tokens::{generate_secret, hash_secret, shown_prefix};
use crate::store::{Store, StoreError, new_uuid, parse_col};

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
        new: crate::store::NewNode,
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
}
