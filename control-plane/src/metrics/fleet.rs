//! The fleet, the queue and the money, as gauges read from the store at scrape time.
//!
//! Every replica answers `/metrics` with the same figures, whichever leads the loops: they are
//! the store's state, not a loop's memory, so a scrape of any replica (or of a replica that
//! just took over) is right. [`fleet_registry`] is pure: it takes what the store said and
//! builds a registry of gauges, encoded after the process's own metrics.
//!
//! Label sets are bounded: clouds, regions, markets, node states, GPU models, teams, job
//! priorities and wait reasons, all from small closed or configured sets; never a job or node
//! id.

use std::collections::{BTreeMap, HashMap, HashSet};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use spotplane_core::{JobId, NodeId, NodeState};

use crate::model::Node;
use crate::scheduler::snapshot::{Assigned, Snapshot, WaitReason};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub cloud: &'static str,
    pub region: String,
    pub market: &'static str,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    pub cloud: &'static str,
    pub model: String,
    /// `allocated` (some replica holds all or part of it) or `idle`.
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MarketLabels {
    pub cloud: &'static str,
    pub market: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub team: String,
    pub priority: i32,
    /// The scheduler's wait reason (`no_capacity`, `quota`, ...), `none` before its first look.
    pub reason: &'static str,
}

/// What the store said, for one scrape.
#[derive(Debug)]
pub struct FleetState<'a> {
    /// Live nodes (every state but `terminated`).
    pub nodes: &'a [Node],
    /// The scheduler's snapshot: schedulable capacity, the jobs holding it, the queue.
    pub snapshot: &'a Snapshot,
    /// Each queued job's wait reason.
    pub reasons: &'a HashMap<JobId, Option<WaitReason>>,
}

/// Node states whose instance exists and is billed.
const BILLED: [NodeState; 4] = [
    NodeState::Booting,
    NodeState::Ready,
    NodeState::Draining,
    NodeState::Terminating,
];

/// Dollars per hour from micro-dollars per hour.
fn usd(micros: i64) -> f64 {
    micros as f64 / 1e6
}

/// The gauges of `state`, in a registry of their own (prefix `spotplane`).
pub fn fleet_registry(state: &FleetState<'_>) -> Registry {
    let mut registry = Registry::with_prefix("spotplane");

    let nodes = Family::<NodeLabels, Gauge>::default();
    for n in state.nodes {
        nodes
            .get_or_create(&NodeLabels {
                cloud: n.cloud.as_str(),
                region: n.region.clone(),
                market: n.market.as_str(),
                state: n.state.as_str(),
            })
            .inc();
    }
    registry.register(
        "nodes",
        "Live nodes by cloud, region, market and state",
        nodes,
    );

    // Money: what the billed nodes cost per hour, what the same capacity costs on demand.
    let mut spend: BTreeMap<(&'static str, &'static str), (i64, i64)> = BTreeMap::new();
    for n in state.nodes.iter().filter(|n| BILLED.contains(&n.state)) {
        let e = spend
            .entry((n.cloud.as_str(), n.market.as_str()))
            .or_default();
        e.0 += n.hourly_price.0;
        e.1 += n.on_demand_price.0;
    }
    let rate = Family::<MarketLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let on_demand = Family::<MarketLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let saving = Family::<MarketLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    for ((cloud, market), (price, od)) in spend {
        let l = MarketLabels { cloud, market };
        rate.get_or_create(&l).set(usd(price));
        on_demand.get_or_create(&l).set(usd(od));
        saving.get_or_create(&l).set(usd(od - price));
    }
    registry.register(
        "spend_rate_usd_per_hour",
        "What the fleet's billed nodes cost per hour at the prices they were bought at",
        rate,
    );
    registry.register(
        "on_demand_equivalent_usd_per_hour",
        "What the same nodes would cost per hour on demand",
        on_demand,
    );
    registry.register(
        "saving_rate_usd_per_hour",
        "On-demand equivalent less spend, per hour",
        saving,
    );

    // GPUs: a GPU is allocated when any replica holds all or part of it.
    let mut held: HashSet<(NodeId, u32)> = HashSet::new();
    for r in &state.snapshot.running {
        for p in &r.placements {
            match &p.assigned {
                Assigned::CpuOnly => {}
                Assigned::Whole(gpus) => held.extend(gpus.iter().map(|g| (p.node, *g))),
                Assigned::Share { gpu, .. } | Assigned::Mig { gpu, .. } => {
                    held.insert((p.node, *gpu));
                }
            }
        }
    }
    let gpus = Family::<GpuLabels, Gauge>::default();
    let (mut total, mut allocated) = (0u64, 0u64);
    for n in &state.snapshot.nodes {
        let Some(model) = n.gpu_model else {
            continue;
        };
        for i in 0..n.gpus.len() {
            let taken = held.contains(&(n.id, u32::try_from(i).unwrap_or(u32::MAX)));
            total += 1;
            allocated += u64::from(taken);
            gpus.get_or_create(&GpuLabels {
                cloud: n.cloud.as_str(),
                model: model.to_string(),
                state: if taken { "allocated" } else { "idle" },
            })
            .inc();
        }
    }
    registry.register(
        "gpus",
        "GPUs of ready nodes by cloud, model and whether a replica holds them",
        gpus,
    );
    let ratio = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    if total > 0 {
        ratio.set(allocated as f64 / total as f64);
    }
    registry.register(
        "gpu_allocation_ratio",
        "Allocated GPUs over all GPUs of ready nodes (0 with none)",
        ratio,
    );

    let queue = Family::<QueueLabels, Gauge>::default();
    for q in &state.snapshot.queued {
        let reason = state
            .reasons
            .get(&q.id)
            .copied()
            .flatten()
            .map_or("none", WaitReason::code);
        queue
            .get_or_create(&QueueLabels {
                team: q.team.to_string(),
                priority: q.priority,
                reason,
            })
            .inc();
    }
    registry.register(
        "queued_jobs",
        "Jobs waiting to be placed, by team, priority and wait reason",
        queue,
    );
    registry
}

#[cfg(test)]
mod tests;
