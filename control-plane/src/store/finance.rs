//! The cost ledger's storage: price points of capacity pools, the ledger's progress per node,
//! its lines, lost-work memos and team budgets.
//!
//! The ledger reconciler reads a [`NodeInput`] per node not yet closed (its time since the
//! ledger's progress, its prices, its allocations), runs the pure core, and writes the lines
//! and the new progress in one transaction, so a line is written exactly once whatever crashes.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, ConnectionTrait, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, Set, TransactionTrait,
};
use serde_json::json;
use spotplane_core::{JobId, Market, Micros, MigInstance, NodeState};

use super::entity::{
    allocation, checkpoint, cursor, gpu, job, job_event, ledger_entry, ledger_progress, node,
    outbox, price_point, team_budget,
};
use super::{Store, StoreError, from_json, parse_col};
use crate::finance::LedgerEntry;
use crate::finance::ledger::{
    AllocSpan, Line, LineKind, LostRun, NodeInput, Price, Progress, Share,
};

/// A capacity pool some node not yet closed in the ledger is bought from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePool {
    /// The offer id, `cloud/region/zone/instance_type/market`.
    pub pool: String,
    pub cloud: spotplane_core::Cloud,
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub market: Market,
    /// The earliest billing start of its nodes, and the last price recorded (time, price,
    /// on-demand price).
    pub since: DateTime<Utc>,
    pub last: Option<(DateTime<Utc>, Micros, Micros)>,
}

/// A team's monthly budget and the last alert sent about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamBudget {
    pub team_id: String,
    pub team: spotplane_core::TeamName,
    pub monthly: Micros,
    pub alerted: Option<(String, u32)>,
}

/// The pool a node row is bought from (the id its offer has).
pub(crate) fn pool_of(n: &node::Model) -> String {
    format!(
        "{}/{}/{}/{}/{}",
        n.cloud, n.region, n.zone, n.instance_type, n.market
    )
}

/// What an allocation row holds, as a ledger share.
fn share_of(a: &allocation::Model) -> Result<Share, StoreError> {
    let gpus: Vec<u32> = from_json("allocations", &a.id, a.gpu_indices.clone())?;
    if let Some(m) = &a.mig {
        let inst: MigInstance = from_json("allocations", &a.id, m.clone())?;
        return Ok(Share::MigSlices(inst.class.compute_slices()));
    }
    Ok(match (gpus.len(), a.gpu_milli) {
        (0, _) => Share::Cpu(u64::try_from(a.cpu_milli).unwrap_or(0)),
        (1, m) if (1..1000).contains(&m) => Share::GpuMilli(m as u32),
        (n, _) => Share::Gpus(u32::try_from(n).unwrap_or(u32::MAX)),
    })
}

/// When a node is billed: from its request until it is terminated. A node that ended without
/// ever getting an instance (no instance id, never ready) was never billed.
/// A node's billed time: from its instance's launch to its end, as the cloud says when it has
/// (`launched_at`, `ended_at`), else as the control plane recorded them (`created_at`,
/// `terminated_at`). `None`: nothing to bill yet, a node whose instance is not recorded (its
/// cloud call has not answered, or its buyer stopped before recording it and the next sync
/// will adopt it): a node bought costs from its instance's launch, not from its row.
/// A billed span: its start, and its end once known.
type Billed = (DateTime<Utc>, Option<DateTime<Utc>>);

fn billing(n: &node::Model) -> Result<Option<Billed>, StoreError> {
    let state: NodeState = parse_col("nodes", &n.id, &n.state)?;
    let ended = state == NodeState::Terminated;
    if n.provider_instance_id.is_none() && n.ready_at.is_none() {
        return Ok(ended.then_some((n.created_at, Some(n.created_at))));
    }
    let from = n.launched_at.unwrap_or(n.created_at);
    let end = if ended {
        Some(
            n.ended_at
                .or(n.terminated_at)
                .unwrap_or(n.updated_at)
                .max(from),
        )
    } else {
        // The cloud may say it ended before the control plane has heard.
        n.ended_at.map(|e| e.max(from))
    };
    Ok(Some((from, end)))
}

fn line_to_row(l: &Line, now: DateTime<Utc>) -> ledger_entry::ActiveModel {
    ledger_entry::ActiveModel {
        node_id: Set(l.node.to_string()),
        job_id: Set(l.job.map(|j| j.to_string())),
        team_id: Set(l.team_id.clone()),
        kind: Set(l.kind.as_str().to_owned()),
        market: Set(l.market.to_string()),
        period_start: Set(l.start),
        period_end: Set(l.end),
        millis: Set(l.millis()),
        gpu_milli: Set(i32::try_from(l.gpu_milli).unwrap_or(i32::MAX)),
        price_micros_per_hour: Set(l.price.0),
        on_demand_micros_per_hour: Set(l.on_demand.0),
        cost_micros: Set(l.cost.0),
        list_cost_micros: Set(l.list_cost.0),
        created_at: Set(now),
        attempt: Set(l.attempt.map(|a| i32::try_from(a).unwrap_or(i32::MAX))),
        ..Default::default()
    }
}

fn line_from_row(r: &ledger_entry::Model) -> Result<Line, StoreError> {
    let id = r.id.to_string();
    Ok(Line {
        node: parse_col("ledger_entries", &id, &r.node_id)?,
        job: r
            .job_id
            .as_deref()
            .map(|j| parse_col("ledger_entries", &id, j))
            .transpose()?,
        team_id: r.team_id.clone(),
        attempt: r.attempt.and_then(|a| u32::try_from(a).ok()),
        kind: LineKind::parse(&r.kind)
            .ok_or_else(|| StoreError::corrupt("ledger_entries", &id, "unknown kind"))?,
        market: parse_col("ledger_entries", &id, &r.market)?,
        start: r.period_start,
        end: r.period_end,
        gpu_milli: u32::try_from(r.gpu_milli).unwrap_or(0),
        price: Micros(r.price_micros_per_hour),
        on_demand: Micros(r.on_demand_micros_per_hour),
        cost: Micros(r.cost_micros),
        list_cost: Micros(r.list_cost_micros),
    })
}

/// The ledger's cursor over lost runs (job events).
const LOST_CURSOR: &str = "ledger.lost_work";

pub(crate) async fn set_cursor_in<C: ConnectionTrait>(
    conn: &C,
    name: &str,
    position: i64,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    cursor::Entity::insert(cursor::ActiveModel {
        name: Set(name.to_owned()),
        position: Set(position),
        updated_at: Set(now),
    })
    .on_conflict(
        OnConflict::column(cursor::Column::Name)
            .update_columns([cursor::Column::Position, cursor::Column::UpdatedAt])
            .to_owned(),
    )
    .exec(conn)
    .await?;
    Ok(())
}

pub(crate) async fn get_cursor<C: ConnectionTrait>(
    conn: &C,
    name: &str,
) -> Result<i64, StoreError> {
    Ok(cursor::Entity::find_by_id(name.to_owned())
        .one(conn)
        .await?
        .map_or(0, |c| c.position))
}

impl Store {
    /// Nodes whose time is not all in the ledger yet.
    async fn open_nodes(
        &self,
    ) -> Result<Vec<(node::Model, Option<ledger_progress::Model>)>, StoreError> {
        let closed: HashSet<String> = ledger_progress::Entity::find()
            .filter(ledger_progress::Column::Closed.eq(true))
            .select_only()
            .column(ledger_progress::Column::NodeId)
            .into_tuple::<String>()
            .all(&self.read)
            .await?
            .into_iter()
            .collect();
        let mut progress: HashMap<String, ledger_progress::Model> = ledger_progress::Entity::find()
            .filter(ledger_progress::Column::Closed.eq(false))
            .all(&self.read)
            .await?
            .into_iter()
            .map(|p| (p.node_id.clone(), p))
            .collect();
        Ok(node::Entity::find()
            .order_by_asc(node::Column::Id)
            .all(&self.read)
            .await?
            .into_iter()
            .filter(|n| !closed.contains(&n.id))
            .map(|n| {
                let p = progress.remove(&n.id);
                (n, p)
            })
            .collect())
    }

    /// The pools of nodes not closed in the ledger, with the last price recorded for each.
    pub async fn ledger_live_pools(&self) -> Result<Vec<LivePool>, StoreError> {
        self.measured("ledger_live_pools", || async {
            let nodes = self.open_nodes().await?;
            let mut pools: BTreeMap<String, LivePool> = BTreeMap::new();
            for (n, p) in nodes {
                let since = p.map_or(n.created_at, |p| p.until);
                let pool = pool_of(&n);
                let entry = pools.entry(pool.clone()).or_insert(LivePool {
                    pool,
                    cloud: parse_col("nodes", &n.id, &n.cloud)?,
                    region: n.region.clone(),
                    zone: n.zone.clone(),
                    instance_type: n.instance_type.clone(),
                    market: parse_col("nodes", &n.id, &n.market)?,
                    since,
                    last: None,
                });
                entry.since = entry.since.min(since);
            }
            for p in pools.values_mut() {
                p.last = price_point::Entity::find()
                    .filter(price_point::Column::Pool.eq(p.pool.clone()))
                    .order_by_desc(price_point::Column::At)
                    .one(&self.read)
                    .await?
                    .map(|r| (r.at, Micros(r.price_micros), Micros(r.on_demand_micros)));
            }
            Ok(pools.into_values().collect())
        })
        .await
    }

    /// Records price points (pool, at, price, on-demand price); one already recorded for the
    /// same pool and moment is left as it is.
    pub async fn record_price_points(
        &self,
        points: &[(String, DateTime<Utc>, Micros, Micros)],
    ) -> Result<(), StoreError> {
        if points.is_empty() {
            return Ok(());
        }
        self.measured("record_price_points", || async {
            let txn = self.write.begin().await?;
            for chunk in points.chunks(200) {
                price_point::Entity::insert_many(chunk.iter().map(|(pool, at, p, od)| {
                    price_point::ActiveModel {
                        pool: Set(pool.clone()),
                        at: Set(*at),
                        price_micros: Set(p.0),
                        on_demand_micros: Set(od.0),
                        ..Default::default()
                    }
                }))
                .on_conflict(
                    OnConflict::columns([price_point::Column::Pool, price_point::Column::At])
                        .do_nothing()
                        .to_owned(),
                )
                .do_nothing()
                .exec(&txn)
                .await?;
            }
            txn.commit().await?;
            Ok(())
        })
        .await
    }

    /// What the ledger core needs of every node not yet closed, up to `horizon`.
    pub async fn ledger_snapshot(
        &self,
        horizon: DateTime<Utc>,
    ) -> Result<Vec<NodeInput>, StoreError> {
        self.measured("ledger_snapshot", || async {
            let nodes = self.open_nodes().await?;
            let ids: Vec<String> = nodes.iter().map(|(n, _)| n.id.clone()).collect();
            let mut gpus: HashMap<String, u32> = HashMap::new();
            let mut allocs: HashMap<String, Vec<allocation::Model>> = HashMap::new();
            for chunk in ids.chunks(500) {
                let rows: Vec<String> = gpu::Entity::find()
                    .filter(gpu::Column::NodeId.is_in(chunk.to_vec()))
                    .select_only()
                    .column(gpu::Column::NodeId)
                    .into_tuple()
                    .all(&self.read)
                    .await?;
                for r in rows {
                    *gpus.entry(r).or_default() += 1;
                }
                for a in allocation::Entity::find()
                    .filter(allocation::Column::NodeId.is_in(chunk.to_vec()))
                    .filter(allocation::Column::CreatedAt.lt(horizon))
                    .all(&self.read)
                    .await?
                {
                    allocs.entry(a.node_id.clone()).or_default().push(a);
                }
            }
            let job_ids: Vec<String> = allocs
                .values()
                .flatten()
                .map(|a| a.job_id.clone())
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            let mut teams: HashMap<String, String> = HashMap::new();
            for chunk in job_ids.chunks(500) {
                let rows: Vec<(String, String)> = job::Entity::find()
                    .filter(job::Column::Id.is_in(chunk.to_vec()))
                    .select_only()
                    .columns([job::Column::Id, job::Column::TeamId])
                    .into_tuple()
                    .all(&self.read)
                    .await?;
                teams.extend(rows);
            }
            let mut out = Vec::with_capacity(nodes.len());
            for (n, progress) in nodes {
                let Some((billed_from, billed_to)) = billing(&n)? else {
                    continue;
                };
                let until = progress.map(|p| p.until);
                let from = until.unwrap_or(billed_from).max(billed_from);
                // Prices: the one in force at the billing start, then every later point.
                let pool = pool_of(&n);
                let first = price_point::Entity::find()
                    .filter(price_point::Column::Pool.eq(pool.clone()))
                    .filter(price_point::Column::At.lte(billed_from))
                    .order_by_desc(price_point::Column::At)
                    .one(&self.read)
                    .await?;
                let mut prices = vec![match first {
                    Some(p) => Price {
                        at: billed_from,
                        price: Micros(p.price_micros),
                        on_demand: Micros(p.on_demand_micros),
                    },
                    None => Price {
                        at: billed_from,
                        price: Micros(n.hourly_price_micros),
                        on_demand: Micros(n.on_demand_price_micros),
                    },
                }];
                let end = billed_to.map_or(horizon, |t| t.min(horizon));
                if from < end {
                    for p in price_point::Entity::find()
                        .filter(price_point::Column::Pool.eq(pool.clone()))
                        .filter(price_point::Column::At.gt(billed_from))
                        .filter(price_point::Column::At.lt(end))
                        .order_by_asc(price_point::Column::At)
                        .all(&self.read)
                        .await?
                    {
                        prices.push(Price {
                            at: p.at,
                            price: Micros(p.price_micros),
                            on_demand: Micros(p.on_demand_micros),
                        });
                    }
                }
                let mut allocations = Vec::new();
                for a in allocs.remove(&n.id).unwrap_or_default() {
                    if a.released_at.is_some_and(|r| r <= from) {
                        continue;
                    }
                    let Some(team_id) = teams.get(&a.job_id) else {
                        continue;
                    };
                    allocations.push(AllocSpan {
                        job: parse_col("allocations", &a.id, &a.job_id)?,
                        team_id: team_id.clone(),
                        attempt: u32::try_from(a.attempt).unwrap_or(0),
                        share: share_of(&a)?,
                        from: a.created_at,
                        to: a.released_at,
                    });
                }
                out.push(NodeInput {
                    id: parse_col("nodes", &n.id, &n.id)?,
                    market: parse_col("nodes", &n.id, &n.market)?,
                    billed_from,
                    billed_to,
                    confirmed_until: n.cloud_seen_at,
                    until,
                    gpus: gpus.get(&n.id).copied().unwrap_or(0),
                    cpu_milli: u64::try_from(n.cpu_milli).unwrap_or(0),
                    prices,
                    allocations,
                });
            }
            Ok(out)
        })
        .await
    }

    /// Writes ledger lines and the progress they make, in one transaction.
    pub async fn write_ledger(
        &self,
        lines: &[Line],
        progress: &[Progress],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.measured("write_ledger", || async {
            let txn = self.write.begin().await?;
            for chunk in lines.chunks(300) {
                ledger_entry::Entity::insert_many(chunk.iter().map(|l| line_to_row(l, now)))
                    .exec(&txn)
                    .await?;
            }
            for p in progress {
                ledger_progress::Entity::insert(ledger_progress::ActiveModel {
                    node_id: Set(p.node.to_string()),
                    until: Set(p.until),
                    closed: Set(p.closed),
                })
                .on_conflict(
                    OnConflict::column(ledger_progress::Column::NodeId)
                        .update_columns([
                            ledger_progress::Column::Until,
                            ledger_progress::Column::Closed,
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

    /// Runs lost since the ledger last looked, before `horizon`, with where their lost work
    /// starts (the later of the last completed checkpoint and the run's start), and the cursor
    /// to store once they are priced.
    pub async fn lost_runs(
        &self,
        horizon: DateTime<Utc>,
    ) -> Result<(Vec<LostRun>, i64), StoreError> {
        self.measured("lost_runs", || async {
            let after = get_cursor(&self.read, LOST_CURSOR).await?;
            let events = job_event::Entity::find()
                .filter(job_event::Column::Id.gt(after))
                .filter(job_event::Column::ToState.eq("lost"))
                .filter(job_event::Column::At.lt(horizon))
                .order_by_asc(job_event::Column::Id)
                .limit(500)
                .all(&self.read)
                .await?;
            let mut position = after;
            let mut runs = Vec::new();
            for e in events {
                position = e.id;
                let Some(j) = job::Entity::find_by_id(e.job_id.clone())
                    .one(&self.read)
                    .await?
                else {
                    continue;
                };
                let run_start = allocation::Entity::find()
                    .filter(allocation::Column::JobId.eq(e.job_id.clone()))
                    .filter(allocation::Column::CreatedAt.lte(e.at))
                    .order_by_desc(allocation::Column::CreatedAt)
                    .one(&self.read)
                    .await?
                    .map(|a| a.created_at);
                let Some(run_start) = run_start else {
                    continue;
                };
                let ckpt = checkpoint::Entity::find()
                    .filter(checkpoint::Column::JobId.eq(e.job_id.clone()))
                    .filter(checkpoint::Column::State.eq("complete"))
                    .filter(checkpoint::Column::CompletedAt.lte(e.at))
                    .order_by_desc(checkpoint::Column::CompletedAt)
                    .one(&self.read)
                    .await?
                    .and_then(|c| c.completed_at);
                runs.push(LostRun {
                    job: parse_col("job_events", &e.id.to_string(), &e.job_id)?,
                    team_id: j.team_id,
                    since: ckpt.map_or(run_start, |c| c.max(run_start)),
                    lost_at: e.at,
                });
            }
            Ok((runs, position))
        })
        .await
    }

    /// Usage lines of `jobs` overlapping `[from, to)`.
    pub async fn usage_lines(
        &self,
        jobs: &[JobId],
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<Line>, StoreError> {
        self.measured("usage_lines", || async {
            let ids: Vec<String> = jobs.iter().map(|j| j.to_string()).collect();
            let mut out = Vec::new();
            for chunk in ids.chunks(500) {
                for r in ledger_entry::Entity::find()
                    .filter(ledger_entry::Column::JobId.is_in(chunk.to_vec()))
                    .filter(ledger_entry::Column::Kind.eq(LineKind::Usage.as_str()))
                    .filter(ledger_entry::Column::PeriodEnd.gt(from))
                    .filter(ledger_entry::Column::PeriodStart.lt(to))
                    .all(&self.read)
                    .await?
                {
                    out.push(line_from_row(&r)?);
                }
            }
            Ok(out)
        })
        .await
    }

    /// Writes lost-work memo lines and moves the lost-run cursor, in one transaction.
    pub async fn write_lost_work(
        &self,
        lines: &[Line],
        cursor_position: i64,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.measured("write_lost_work", || async {
            let txn = self.write.begin().await?;
            for chunk in lines.chunks(300) {
                ledger_entry::Entity::insert_many(chunk.iter().map(|l| line_to_row(l, now)))
                    .exec(&txn)
                    .await?;
            }
            set_cursor_in(&txn, LOST_CURSOR, cursor_position, now).await?;
            txn.commit().await?;
            Ok(())
        })
        .await
    }

    /// Ledger lines starting in `[from, to)`, oldest first, with their node and team; only
    /// `team_id`'s usage and lost-work lines when given.
    pub async fn ledger_entries(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        team_id: Option<&str>,
    ) -> Result<Vec<LedgerEntry>, StoreError> {
        self.measured("ledger_entries", || async {
            let mut q = ledger_entry::Entity::find()
                .filter(ledger_entry::Column::PeriodStart.gte(from))
                .filter(ledger_entry::Column::PeriodStart.lt(to))
                .order_by_asc(ledger_entry::Column::PeriodStart)
                .order_by_asc(ledger_entry::Column::Id);
            if let Some(t) = team_id {
                q = q.filter(ledger_entry::Column::TeamId.eq(t));
            }
            let rows = q.all(&self.read).await?;
            let node_ids: Vec<String> = rows
                .iter()
                .map(|r| r.node_id.clone())
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            let mut nodes: HashMap<String, node::Model> = HashMap::new();
            for chunk in node_ids.chunks(500) {
                for n in node::Entity::find()
                    .filter(node::Column::Id.is_in(chunk.to_vec()))
                    .all(&self.read)
                    .await?
                {
                    nodes.insert(n.id.clone(), n);
                }
            }
            let teams = super::teams::team_names(&self.read).await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows {
                let id = r.id.to_string();
                let n = nodes
                    .get(&r.node_id)
                    .ok_or_else(|| StoreError::corrupt("ledger_entries", &id, "unknown node"))?;
                let line = line_from_row(&r)?;
                out.push(LedgerEntry {
                    id: r.id,
                    kind: line.kind,
                    node_id: line.node,
                    node_name: n.name.clone(),
                    provider_instance_id: n.provider_instance_id.clone(),
                    cloud: parse_col("nodes", &n.id, &n.cloud)?,
                    region: n.region.clone(),
                    zone: n.zone.clone(),
                    instance_type: n.instance_type.clone(),
                    market: line.market,
                    job_id: line.job,
                    team: r
                        .team_id
                        .as_ref()
                        .and_then(|t| teams.get(t))
                        .map(|name| parse_col("teams", name, name))
                        .transpose()?,
                    attempt: line.attempt,
                    start: line.start,
                    end: line.end,
                    millis: r.millis,
                    gpu_milli: line.gpu_milli,
                    price: line.price,
                    on_demand_price: line.on_demand,
                    cost: line.cost,
                    list_cost: line.list_cost,
                });
            }
            Ok(out)
        })
        .await
    }

    /// Sets (or with `None` removes) a team's monthly budget.
    pub async fn set_team_budget(
        &self,
        team_id: &str,
        monthly: Option<Micros>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.measured("set_team_budget", || async {
            match monthly {
                None => {
                    team_budget::Entity::delete_by_id(team_id.to_owned())
                        .exec(&self.write)
                        .await?;
                }
                Some(m) => {
                    team_budget::Entity::insert(team_budget::ActiveModel {
                        team_id: Set(team_id.to_owned()),
                        monthly_micros: Set(m.0),
                        alerted_month: Set(None),
                        alerted_percent: Set(0),
                        updated_at: Set(now),
                    })
                    .on_conflict(
                        OnConflict::column(team_budget::Column::TeamId)
                            .update_columns([
                                team_budget::Column::MonthlyMicros,
                                team_budget::Column::UpdatedAt,
                            ])
                            .to_owned(),
                    )
                    .exec(&self.write)
                    .await?;
                }
            }
            Ok(())
        })
        .await
    }

    /// Every team budget.
    pub async fn team_budgets(&self) -> Result<Vec<TeamBudget>, StoreError> {
        self.measured("team_budgets", || async {
            let names = super::teams::team_names(&self.read).await?;
            let mut out = Vec::new();
            for b in team_budget::Entity::find().all(&self.read).await? {
                let Some(name) = names.get(&b.team_id) else {
                    continue;
                };
                out.push(TeamBudget {
                    team: parse_col("teams", &b.team_id, name)?,
                    monthly: Micros(b.monthly_micros),
                    alerted: b
                        .alerted_month
                        .map(|m| (m, u32::try_from(b.alerted_percent).unwrap_or(0))),
                    team_id: b.team_id,
                });
            }
            Ok(out)
        })
        .await
    }

    /// What each team's usage lines cost since `since`.
    pub async fn team_spend_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<HashMap<String, Micros>, StoreError> {
        self.measured("team_spend_since", || async {
            let rows: Vec<(Option<String>, i64)> = ledger_entry::Entity::find()
                .filter(ledger_entry::Column::Kind.eq(LineKind::Usage.as_str()))
                .filter(ledger_entry::Column::PeriodStart.gte(since))
                .select_only()
                .columns([
                    ledger_entry::Column::TeamId,
                    ledger_entry::Column::CostMicros,
                ])
                .into_tuple()
                .all(&self.read)
                .await?;
            let mut out: HashMap<String, Micros> = HashMap::new();
            for (team, cost) in rows {
                if let Some(t) = team {
                    *out.entry(t).or_default() += Micros(cost);
                }
            }
            Ok(out)
        })
        .await
    }

    /// Records a budget alert: the team's alert state and a `budget.alert` outbox event for
    /// its webhooks, in one transaction.
    pub async fn record_budget_alert(
        &self,
        budget: &TeamBudget,
        month: &str,
        percent: u32,
        spent: Micros,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.measured("record_budget_alert", || async {
            let txn = self.write.begin().await?;
            let res = team_budget::Entity::update_many()
                .col_expr(
                    team_budget::Column::AlertedMonth,
                    sea_orm::sea_query::Expr::value(month),
                )
                .col_expr(
                    team_budget::Column::AlertedPercent,
                    sea_orm::sea_query::Expr::value(i32::try_from(percent).unwrap_or(0)),
                )
                .filter(team_budget::Column::TeamId.eq(budget.team_id.clone()))
                .filter(
                    Condition::any()
                        .add(team_budget::Column::AlertedMonth.is_null())
                        .add(team_budget::Column::AlertedMonth.ne(month))
                        .add(
                            team_budget::Column::AlertedPercent
                                .lt(i32::try_from(percent).unwrap_or(0)),
                        ),
                )
                .exec(&txn)
                .await?;
            if res.rows_affected == 1 {
                outbox::ActiveModel {
                    kind: Set("budget.alert".into()),
                    subject_kind: Set("team".into()),
                    subject_id: Set(budget.team_id.clone()),
                    team_id: Set(Some(budget.team_id.clone())),
                    payload: Set(json!({
                        "team": budget.team,
                        "month": month,
                        "threshold_percent": percent,
                        "spent_micros": spent.0,
                        "budget_micros": budget.monthly.0,
                    })),
                    created_at: Set(now),
                    ..Default::default()
                }
                .insert(&txn)
                .await?;
            }
            txn.commit().await?;
            Ok(())
        })
        .await
    }
}
