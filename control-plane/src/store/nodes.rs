//! Nodes with their GPUs, and offers.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    Set, TransactionTrait,
};
use serde_json::json;
use spotplane_core::{Cloud, GpuModel, Market, Micros, MigLayout, NodeId, NodeState};

use super::entity::{gpu, node, offer, outbox};
use super::{Store, StoreError, from_json, new_uuid, parse_col};
use spotplane_providers::Offer;

use crate::model::{Gpu, Node, Offer as OfferView, Page, PageRequest};

/// A node to record when it is requested from a cloud.
#[derive(Debug, Clone)]
pub struct NewNode {
    pub id: NodeId,
    pub name: String,
    pub cloud: Cloud,
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub market: Market,
    pub offer_id: Option<String>,
    /// Idempotency token sent to the cloud with the request.
    pub client_token: String,
    pub hourly_price: Micros,
    pub on_demand_price: Micros,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: Vec<NewGpu>,
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct NewGpu {
    pub model: GpuModel,
    pub memory_mib: u64,
    pub mig_enabled: bool,
    pub mig_layout: MigLayout,
}

fn gpu_from_row(row: gpu::Model) -> Result<Gpu, StoreError> {
    Ok(Gpu {
        index: u32::try_from(row.idx).map_err(|e| StoreError::corrupt("gpus", &row.id, e))?,
        model: parse_col("gpus", &row.id, &row.model)?,
        memory_mib: u64::try_from(row.memory_mib)
            .map_err(|e| StoreError::corrupt("gpus", &row.id, e))?,
        mig_enabled: row.mig_enabled,
        mig_layout: from_json("gpus", &row.id, row.mig_layout)?,
    })
}

fn node_from_row(row: node::Model, gpus: Vec<Gpu>) -> Result<Node, StoreError> {
    let id = row.id.clone();
    let non_negative = |v: i64| u64::try_from(v).map_err(|e| StoreError::corrupt("nodes", &id, e));
    Ok(Node {
        id: parse_col("nodes", &row.id, &row.id)?,
        cloud: parse_col("nodes", &row.id, &row.cloud)?,
        market: parse_col("nodes", &row.id, &row.market)?,
        state: parse_col("nodes", &row.id, &row.state)?,
        hourly_price: Micros(row.hourly_price_micros),
        on_demand_price: Micros(row.on_demand_price_micros),
        cpu_milli: non_negative(row.cpu_milli)?,
        memory_mib: non_negative(row.memory_mib)?,
        labels: from_json("nodes", &row.id, row.labels)?,
        gpus,
        name: row.name,
        region: row.region,
        zone: row.zone,
        instance_type: row.instance_type,
        state_reason: row.state_reason,
        provider_instance_id: row.provider_instance_id,
        offer_id: row.offer_id,
        notice_deadline: row.notice_deadline,
        created_at: row.created_at,
        ready_at: row.ready_at,
        terminated_at: row.terminated_at,
    })
}

fn offer_from_row(row: offer::Model) -> Result<OfferView, StoreError> {
    Ok(OfferView {
        cloud: parse_col("offers", &row.id, &row.cloud)?,
        market: parse_col("offers", &row.id, &row.market)?,
        gpu_model: row
            .gpu_model
            .as_deref()
            .map(|m| parse_col("offers", &row.id, m))
            .transpose()?,
        gpu_count: u32::try_from(row.gpu_count)
            .map_err(|e| StoreError::corrupt("offers", &row.id, e))?,
        vcpus: u32::try_from(row.vcpus).map_err(|e| StoreError::corrupt("offers", &row.id, e))?,
        memory_mib: u64::try_from(row.memory_mib)
            .map_err(|e| StoreError::corrupt("offers", &row.id, e))?,
        price_usd: Micros(row.price_micros).as_usd_f64(),
        on_demand_price_usd: Micros(row.on_demand_micros).as_usd_f64(),
        region: row.region,
        zone: row.zone,
        instance_type: row.instance_type,
        placement_score: row.placement_score,
        interruption_bucket: row.interruption_bucket,
        observed_at: row.observed_at,
        unavailable_until: row.unavailable_until,
        id: row.id,
    })
}

impl Store {
    /// Records a node the control plane is about to request, with its GPUs and a
    /// `node.requested` outbox event, in one transaction.
    pub async fn create_node(&self, new: NewNode, now: DateTime<Utc>) -> Result<Node, StoreError> {
        self.measured("create_node", || async {
            let txn = self.write.begin().await?;
            let labels = serde_json::to_value(&new.labels).map_err(|e| StoreError::Conflict(e.to_string()))?;
            node::ActiveModel {
                id: Set(new.id.to_string()),
                name: Set(new.name.clone()),
                cloud: Set(new.cloud.to_string()),
                region: Set(new.region.clone()),
                zone: Set(new.zone.clone()),
                instance_type: Set(new.instance_type.clone()),
                market: Set(new.market.to_string()),
                state: Set(NodeState::Requested.to_string()),
                state_reason: Set(None),
                offer_id: Set(new.offer_id.clone()),
                client_token: Set(new.client_token.clone()),
                provider_instance_id: Set(None),
                hourly_price_micros: Set(new.hourly_price.0),
                on_demand_price_micros: Set(new.on_demand_price.0),
                cpu_milli: Set(i64::try_from(new.cpu_milli).unwrap_or(i64::MAX)),
                memory_mib: Set(i64::try_from(new.memory_mib).unwrap_or(i64::MAX)),
                labels: Set(labels),
                notice_deadline: Set(None),
                agent_last_seen: Set(None),
                version: Set(0),
                created_at: Set(now),
                updated_at: Set(now),
                ready_at: Set(None),
                terminated_at: Set(None),
                launched_at: Set(None),
                ended_at: Set(None),
                cloud_seen_at: Set(None),
            }
            .insert(&txn)
            .await?;
            for (i, g) in new.gpus.iter().enumerate() {
                gpu::ActiveModel {
                    id: Set(new_uuid(now).to_string()),
                    node_id: Set(new.id.to_string()),
                    idx: Set(i32::try_from(i).unwrap_or(i32::MAX)),
                    model: Set(g.model.to_string()),
                    uuid: Set(None),
                    memory_mib: Set(i64::try_from(g.memory_mib).unwrap_or(i64::MAX)),
                    mig_enabled: Set(g.mig_enabled),
                    mig_layout: Set(serde_json::to_value(&g.mig_layout).map_err(|e| StoreError::Conflict(e.to_string()))?),
                    desired_mig_layout: Set(None),
                }
                .insert(&txn)
                .await?;
            }
            outbox::ActiveModel {
                kind: Set("node.requested".into()),
                subject_kind: Set("node".into()),
                subject_id: Set(new.id.to_string()),
                team_id: Set(None),
                payload: Set(json!({"node": {"id": new.id, "cloud": new.cloud, "region": new.region, "zone": new.zone,
                    "instance_type": new.instance_type, "market": new.market, "state": NodeState::Requested}})),
                created_at: Set(now),
                ..Default::default()
            }
            .insert(&txn)
            .await?;
            txn.commit().await?;
            Ok(())
        })
        .await?;
        self.get_node(new.id).await
    }

    pub async fn get_node(&self, id: NodeId) -> Result<Node, StoreError> {
        self.measured("get_node", || async {
            let row = node::Entity::find_by_id(id.to_string())
                .one(&self.read)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("node {id}")))?;
            let gpus = gpu::Entity::find()
                .filter(gpu::Column::NodeId.eq(row.id.clone()))
                .order_by_asc(gpu::Column::Idx)
                .all(&self.read)
                .await?
                .into_iter()
                .map(gpu_from_row)
                .collect::<Result<Vec<_>, _>>()?;
            node_from_row(row, gpus)
        })
        .await
    }

    /// Nodes, newest first; terminated ones only when `include_terminated`.
    pub async fn list_nodes(&self, states: &[NodeState]) -> Result<Vec<Node>, StoreError> {
        self.measured("list_nodes", || async {
            let mut q = node::Entity::find().order_by_desc(node::Column::Id);
            if !states.is_empty() {
                q = q.filter(node::Column::State.is_in(states.iter().map(|s| s.to_string())));
            }
            let rows = q.all(&self.read).await?;
            self.nodes_with_gpus(rows).await
        })
        .await
    }

    /// One page of nodes in `states` (all when empty), newest first.
    pub async fn list_nodes_page(
        &self,
        states: &[NodeState],
        page: &PageRequest<NodeId>,
    ) -> Result<Page<Node>, StoreError> {
        self.measured("list_nodes_page", || async {
            let mut q = node::Entity::find()
                .order_by_desc(node::Column::Id)
                .limit(page.rows_to_read());
            if !states.is_empty() {
                q = q.filter(node::Column::State.is_in(states.iter().map(|s| s.to_string())));
            }
            if let Some(after) = page.after {
                q = q.filter(node::Column::Id.lt(after.to_string()));
            }
            let (rows, next_cursor) = page.cut(q.all(&self.read).await?, |r| r.id.clone());
            Ok(Page {
                items: self.nodes_with_gpus(rows).await?,
                next_cursor,
            })
        })
        .await
    }

    async fn nodes_with_gpus(&self, rows: Vec<node::Model>) -> Result<Vec<Node>, StoreError> {
        let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
        let mut gpus: HashMap<String, Vec<Gpu>> = HashMap::new();
        if !ids.is_empty() {
            for g in gpu::Entity::find()
                .filter(gpu::Column::NodeId.is_in(ids))
                .order_by_asc(gpu::Column::Idx)
                .all(&self.read)
                .await?
            {
                let node_id = g.node_id.clone();
                gpus.entry(node_id).or_default().push(gpu_from_row(g)?);
            }
        }
        rows.into_iter()
            .map(|r| {
                let g = gpus.remove(&r.id).unwrap_or_default();
                node_from_row(r, g)
            })
            .collect()
    }

    /// Records the cloud's id of a node's instance once the cloud has accepted the request.
    pub async fn set_node_instance(
        &self,
        id: NodeId,
        provider_instance_id: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.measured("set_node_instance", || async {
            let res = node::Entity::update_many()
                .col_expr(
                    node::Column::ProviderInstanceId,
                    sea_orm::sea_query::Expr::value(Some(provider_instance_id.to_owned())),
                )
                .col_expr(
                    node::Column::UpdatedAt,
                    sea_orm::sea_query::Expr::value(now),
                )
                .filter(node::Column::Id.eq(id.to_string()))
                .exec(&self.write)
                .await?;
            if res.rows_affected == 0 {
                return Err(StoreError::NotFound(format!("node {id}")));
            }
            Ok(())
        })
        .await
    }

    /// Records what the cloud says of a node's instance: when it was launched and when it
    /// ended. Each is written once, the first time the cloud tells it (the ledger bills from
    /// these; a later, different answer does not move a bill already running). Returns whether
    /// anything was written.
    pub async fn record_cloud_times(
        &self,
        id: NodeId,
        launched_at: Option<DateTime<Utc>>,
        ended_at: Option<DateTime<Utc>>,
    ) -> Result<bool, StoreError> {
        self.measured("record_cloud_times", || async {
            let mut wrote = false;
            for (column, at) in [
                (node::Column::LaunchedAt, launched_at),
                (node::Column::EndedAt, ended_at),
            ] {
                let Some(at) = at else { continue };
                let res = node::Entity::update_many()
                    .col_expr(column, sea_orm::sea_query::Expr::value(Some(at)))
                    .filter(node::Column::Id.eq(id.to_string()))
                    .filter(column.is_null())
                    .exec(&self.write)
                    .await?;
                wrote |= res.rows_affected > 0;
            }
            Ok(wrote)
        })
        .await
    }

    /// Records that a listing of their cloud at `at` showed these nodes' instances still there
    /// (the ledger bills a node whose end is not known up to here).
    pub async fn record_cloud_seen(
        &self,
        nodes: &[NodeId],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if nodes.is_empty() {
            return Ok(());
        }
        self.measured("record_cloud_seen", || async {
            for chunk in nodes.chunks(500) {
                node::Entity::update_many()
                    .col_expr(
                        node::Column::CloudSeenAt,
                        sea_orm::sea_query::Expr::value(Some(at)),
                    )
                    .filter(node::Column::Id.is_in(chunk.iter().map(|n| n.to_string())))
                    .filter(node::Column::EndedAt.is_null())
                    .exec(&self.write)
                    .await?;
            }
            Ok(())
        })
        .await
    }

    /// Inserts or refreshes offers (keyed by their id).
    pub async fn upsert_offers(
        &self,
        offers: &[Offer],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if offers.is_empty() {
            return Ok(());
        }
        self.measured("upsert_offers", || async {
            let txn = self.write.begin().await?;
            for chunk in offers.chunks(200) {
                let rows = chunk.iter().map(|o| offer::ActiveModel {
                    id: Set(o.id()),
                    cloud: Set(o.cloud.to_string()),
                    region: Set(o.region.to_string()),
                    zone: Set(o.zone.to_string()),
                    instance_type: Set(o.instance_type.to_string()),
                    market: Set(o.market.to_string()),
                    gpu_model: Set(o.gpu_model.map(|m| m.to_string())),
                    gpu_count: Set(i32::try_from(o.gpu_count).unwrap_or(i32::MAX)),
                    vcpus: Set(i32::try_from(o.vcpus).unwrap_or(i32::MAX)),
                    memory_mib: Set(i64::try_from(o.memory_mib).unwrap_or(i64::MAX)),
                    price_micros: Set(o.price.0),
                    on_demand_micros: Set(o.on_demand_price.0),
                    placement_score: Set(o.placement_score),
                    interruption_bucket: Set(o.interruption_bucket.as_deref().map(str::to_owned)),
                    observed_at: Set(now),
                    unavailable_until: Set(None),
                });
                offer::Entity::insert_many(rows)
                    .on_conflict(
                        OnConflict::column(offer::Column::Id)
                            .update_columns([
                                offer::Column::PriceMicros,
                                offer::Column::OnDemandMicros,
                                offer::Column::PlacementScore,
                                offer::Column::InterruptionBucket,
                                offer::Column::ObservedAt,
                            ])
                            .to_owned(),
                    )
                    .exec(&txn)
                    .await?;
            }
            txn.commit().await?;
            Ok(())
        })
        .await
    }

    /// Offers, cheapest first.
    /// One page of the offers, cheapest first (ties by id). The cursor is the last offer's
    /// price in micro-dollars and its id, `<micros>:<id>`.
    pub async fn list_offers(
        &self,
        page: &PageRequest<OfferCursor>,
    ) -> Result<Page<OfferView>, StoreError> {
        self.measured("list_offers", || async {
            let mut q = offer::Entity::find()
                .order_by_asc(offer::Column::PriceMicros)
                .order_by_asc(offer::Column::Id)
                .limit(page.rows_to_read());
            if let Some(after) = &page.after {
                q = q.filter(
                    Condition::any()
                        .add(offer::Column::PriceMicros.gt(after.price_micros))
                        .add(
                            Condition::all()
                                .add(offer::Column::PriceMicros.eq(after.price_micros))
                                .add(offer::Column::Id.gt(after.id.as_str())),
                        ),
                );
            }
            let (rows, next_cursor) = page.cut(q.all(&self.read).await?, |r| {
                OfferCursor {
                    price_micros: r.price_micros,
                    id: r.id.clone(),
                }
                .to_string()
            });
            Ok(Page {
                items: rows
                    .into_iter()
                    .map(offer_from_row)
                    .collect::<Result<_, _>>()?,
                next_cursor,
            })
        })
        .await
    }
}

/// Where a page of offers starts: after this price and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferCursor {
    pub price_micros: i64,
    pub id: String,
}

impl std::fmt::Display for OfferCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.price_micros, self.id)
    }
}

impl std::str::FromStr for OfferCursor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (price, id) = s
            .split_once(':')
            .ok_or_else(|| "expected <micros>:<offer id>".to_owned())?;
        let price_micros = price
            .parse::<i64>()
            .map_err(|_| "expected <micros>:<offer id>".to_owned())?;
        if id.is_empty() || id.len() > 512 {
            return Err("expected <micros>:<offer id>".into());
        }
        Ok(OfferCursor {
            price_micros,
            id: id.to_owned(),
        })
    }
}
