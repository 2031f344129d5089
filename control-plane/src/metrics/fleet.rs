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
use std::sync::atomic::AtomicU64;

use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use spotplane_core::{JobId, Micros, NodeId, NodeState};

use super::dcgm;
use crate::model::Node;
use crate::scheduler::snapshot::{Assigned, GpuSnap, Snapshot, WaitReason};
use crate::store::MetricsView;

type FloatGauge = Gauge<f64, AtomicU64>;

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MigLabels {
    pub cloud: &'static str,
    pub model: String,
    pub profile: String,
    /// `allocated` or `idle`.
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TeamLabels {
    pub team: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabels {
    pub team: String,
    /// A GPU model (amounts in GPUs) or a MIG profile (amounts in instances).
    pub flavour: String,
}

/// A team's monthly budget and what it has spent this month.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetUse {
    pub team: String,
    pub monthly: Micros,
    pub used: Micros,
}

/// The figures the live page charts over time, from the same scrape.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, utoipa::ToSchema)]
pub struct FleetSummary {
    pub spend_usd_per_hour: f64,
    pub on_demand_usd_per_hour: f64,
    pub queued: u64,
    pub gpu_allocation_ratio: f64,
    /// Mean SM utilisation of the devices jobs hold, percent; none without readings.
    pub sm_utilization_pct: Option<f64>,
}

/// What the store said, for one scrape.
#[derive(Debug)]
pub struct FleetState<'a> {
    pub now: DateTime<Utc>,
    /// Live nodes (every state but `terminated`).
    pub nodes: &'a [Node],
    /// The scheduler's snapshot: schedulable capacity, the jobs holding it, the queue.
    pub snapshot: &'a Snapshot,
    /// Each queued job's wait reason.
    pub reasons: &'a HashMap<JobId, Option<WaitReason>>,
    /// The rest: queue times, lost work, backlogs, GPU telemetry.
    pub view: &'a MetricsView,
    /// Teams with a budget.
    pub budgets: &'a [BudgetUse],
}

impl FleetState<'_> {
    /// Seconds from `t` to now (0 without a time, or for one in the future).
    fn age(&self, t: Option<DateTime<Utc>>) -> f64 {
        t.map_or(0.0, |t| {
            (self.now - t).num_milliseconds().max(0) as f64 / 1000.0
        })
    }
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

/// The gauges of `state`, in a registry of their own: spotplane's under the `spotplane`
/// prefix, the GPU telemetry under dcgm-exporter's names. Also the figures the live page
/// charts.
pub fn fleet_registry(state: &FleetState<'_>) -> (Registry, FleetSummary) {
    let mut top = Registry::default();
    let summary = gpu_telemetry(&mut top, state);
    let registry = top.sub_registry_with_prefix("spotplane");
    let mut summary = FleetSummary {
        sm_utilization_pct: summary,
        ..FleetSummary::default()
    };

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
        summary.spend_usd_per_hour += usd(price);
        summary.on_demand_usd_per_hour += usd(od);
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
        summary.gpu_allocation_ratio = allocated as f64 / total as f64;
    }
    registry.register(
        "gpu_allocation_ratio",
        "Allocated GPUs over all GPUs of ready nodes (0 with none)",
        ratio,
    );

    mig_instances(registry, state, &held_mig(state));

    let queue = Family::<QueueLabels, Gauge>::default();
    let oldest = Family::<QueueLabels, FloatGauge>::default();
    for q in &state.snapshot.queued {
        let reason = state
            .reasons
            .get(&q.id)
            .copied()
            .flatten()
            .map_or("none", WaitReason::code);
        let labels = QueueLabels {
            team: q.team.to_string(),
            priority: q.priority,
            reason,
        };
        queue.get_or_create(&labels).inc();
        let waited = state.age(state.view.queued_since.get(&q.id).copied());
        let g = oldest.get_or_create(&labels);
        if waited > g.get() {
            g.set(waited);
        }
        summary.queued += 1;
    }
    registry.register(
        "queued_jobs",
        "Jobs waiting to be placed, by team, priority and wait reason",
        queue,
    );
    registry.register(
        "queue_oldest_wait_seconds",
        "How long the longest-waiting queued job has waited since it last entered the queue",
        oldest,
    );
    teams(registry, state);
    plumbing(registry, state);
    (top, summary)
}

/// The MIG instances held, by node, GPU and placement start.
fn held_mig(state: &FleetState<'_>) -> HashSet<(NodeId, u32, u8)> {
    let mut held = HashSet::new();
    for r in &state.snapshot.running {
        for p in &r.placements {
            if let Assigned::Mig { gpu, instance } = &p.assigned {
                held.insert((p.node, *gpu, instance.start));
            }
        }
    }
    held
}

fn mig_instances(
    registry: &mut Registry,
    state: &FleetState<'_>,
    held: &HashSet<(NodeId, u32, u8)>,
) {
    let family = Family::<MigLabels, Gauge>::default();
    for n in &state.snapshot.nodes {
        let Some(model) = n.gpu_model else {
            continue;
        };
        for (i, g) in n.gpus.iter().enumerate() {
            let GpuSnap::Mig(layout) = g else {
                continue;
            };
            let gpu = u32::try_from(i).unwrap_or(u32::MAX);
            for inst in layout.instances() {
                let profile = spotplane_core::mig::profile_name(model, inst.class)
                    .map_or_else(|| format!("{:?}", inst.class), str::to_owned);
                let taken = held.contains(&(n.id, gpu, inst.start));
                family
                    .get_or_create(&MigLabels {
                        cloud: n.cloud.as_str(),
                        model: model.to_string(),
                        profile,
                        state: if taken { "allocated" } else { "idle" },
                    })
                    .inc();
            }
        }
    }
    registry.register(
        "mig_instances",
        "MIG instances of ready nodes by cloud, model, profile and whether a replica holds them",
        family,
    );
}

/// Each team's dominant share and quotas, its budget, the work it lost.
fn teams(registry: &mut Registry, state: &FleetState<'_>) {
    let share = Family::<TeamLabels, FloatGauge>::default();
    let nominal = Family::<QuotaLabels, FloatGauge>::default();
    let used = Family::<QuotaLabels, FloatGauge>::default();
    let borrowed = Family::<QuotaLabels, FloatGauge>::default();
    for t in crate::scheduler::team_standing(state.snapshot) {
        let team = t.team.to_string();
        share
            .get_or_create(&TeamLabels { team: team.clone() })
            .set(t.dominant_share);
        for (flavour, n, u, b) in t.quotas {
            let l = QuotaLabels {
                team: team.clone(),
                flavour,
            };
            nominal.get_or_create(&l).set(n);
            used.get_or_create(&l).set(u);
            borrowed.get_or_create(&l).set(b);
        }
    }
    registry.register(
        "team_dominant_share",
        "Each team's weighted dominant share (its largest share of any GPU model or of the CPU, over its weight): the fair-share order, smallest first",
        share,
    );
    registry.register(
        "team_quota_nominal",
        "Each team's nominal quota per flavour (GPUs of a model, or instances of a MIG profile)",
        nominal,
    );
    registry.register(
        "team_quota_used",
        "What each team uses of each flavour it has a quota on",
        used,
    );
    registry.register(
        "team_quota_borrowed",
        "What each team uses beyond its nominal quota, borrowed from its cohort",
        borrowed,
    );

    let budget = Family::<TeamLabels, FloatGauge>::default();
    let spent = Family::<TeamLabels, FloatGauge>::default();
    let ratio = Family::<TeamLabels, FloatGauge>::default();
    for b in state.budgets {
        let l = TeamLabels {
            team: b.team.clone(),
        };
        budget.get_or_create(&l).set(usd(b.monthly.0));
        spent.get_or_create(&l).set(usd(b.used.0));
        if b.monthly.0 > 0 {
            ratio
                .get_or_create(&l)
                .set(b.used.0 as f64 / b.monthly.0 as f64);
        }
    }
    registry.register(
        "team_budget_usd",
        "Each team's monthly budget (teams with one)",
        budget,
    );
    registry.register(
        "team_budget_used_usd",
        "What each team with a budget has spent this calendar month (UTC), from the ledger",
        spent,
    );
    registry.register(
        "team_budget_used_ratio",
        "Spent this month over the monthly budget",
        ratio,
    );

    let lost = Family::<TeamLabels, Counter>::default();
    for (team, s) in &state.view.lost_gpu_seconds {
        lost.get_or_create(&TeamLabels { team: team.clone() })
            .inc_by(u64::try_from(*s).unwrap_or(0));
    }
    registry.register(
        "lost_gpu_seconds",
        "GPU-seconds of work lost over the jobs' lives (runs that ended without a durable checkpoint, counted from their resume point)",
        lost,
    );
}

/// The webhook and ledger backlogs.
fn plumbing(registry: &mut Registry, state: &FleetState<'_>) {
    let v = state.view;
    let pending = Gauge::<i64>::default();
    pending.set(i64::try_from(v.webhooks_pending).unwrap_or(i64::MAX));
    registry.register(
        "webhook_deliveries_pending",
        "Webhook deliveries waiting to go out (new or retrying)",
        pending,
    );
    let age = |t| state.age(t);
    let lag = FloatGauge::default();
    lag.set(age(v.oldest_pending_delivery));
    registry.register(
        "webhook_delivery_lag_seconds",
        "Age of the oldest webhook delivery not yet delivered (0 with none)",
        lag,
    );
    let ledger = FloatGauge::default();
    ledger.set(age(v.ledger_until));
    registry.register(
        "ledger_lag_seconds",
        "How far behind now the ledger has billed the open node it is furthest behind on (0 with none)",
        ledger,
    );
}

/// The names of the DCGM fields exported, with their help (dcgm-exporter's).
const DCGM_HELP: [(&str, &str); 13] = [
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB)."),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Total number of double-bit persistent ECC errors.",
    ),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
    ),
];

/// The GPU telemetry under dcgm-exporter's names and labels (see [`dcgm`]); returns the mean
/// SM utilisation of the devices jobs hold.
fn gpu_telemetry(registry: &mut Registry, state: &FleetState<'_>) -> Option<f64> {
    let families: Vec<Family<Vec<(String, String)>, FloatGauge>> =
        DCGM_HELP.iter().map(|_| Family::default()).collect();
    let (mut util_sum, mut util_n) = (0.0, 0u32);
    for node in &state.view.telemetry {
        let held: Vec<dcgm::Held> = node.holders.iter().map(|h| h.held.clone()).collect();
        let owners = dcgm::attribute(&node.rows, &node.inventory, node.model, &held);
        for (row, who) in node.rows.iter().zip(owners) {
            let inv = node.inventory.iter().find(|g| g.index == row.index);
            let model_name = inv
                .map(|g| g.name.clone())
                .or_else(|| node.model.map(|m| m.product_name().to_owned()));
            let mut base: Vec<(String, String)> = vec![
                ("gpu".into(), row.index.to_string()),
                (
                    "UUID".into(),
                    row.uuid
                        .clone()
                        .or_else(|| inv.map(|g| g.uuid.clone()))
                        .unwrap_or_default(),
                ),
                ("device".into(), format!("nvidia{}", row.index)),
                ("modelName".into(), model_name.unwrap_or_default()),
                ("Hostname".into(), node.hostname.clone()),
            ];
            if row.mig_uuid.is_some() {
                let profile = row.mig_profile.clone().or_else(|| {
                    inv.and_then(|g| {
                        g.mig_devices
                            .iter()
                            .find(|d| Some(&d.uuid) == row.mig_uuid.as_ref())
                            .map(|d| d.profile.clone())
                    })
                });
                base.push(("GPU_I_PROFILE".into(), profile.unwrap_or_default()));
                base.push((
                    "GPU_I_ID".into(),
                    row.gpu_instance_id
                        .map(|i| i.to_string())
                        .unwrap_or_default(),
                ));
            }
            if !who.is_empty()
                && let Some(sm) = dcgm::sm_pct(row)
            {
                util_sum += sm;
                util_n += 1;
            }
            let label_sets: Vec<Vec<(String, String)>> = if who.is_empty() {
                vec![base]
            } else {
                who.iter()
                    .map(|i| {
                        let h = &node.holders[*i];
                        let mut l = base.clone();
                        l.push(("job_id".into(), h.job_id.clone()));
                        l.push(("job_name".into(), h.job_name.clone()));
                        l.push(("team".into(), h.team.clone()));
                        l
                    })
                    .collect()
            };
            let fields = row.dcgm_fields();
            for (k, (name, _)) in DCGM_HELP.iter().enumerate() {
                let Some((_, v)) = fields.iter().find(|(f, _)| f == name) else {
                    continue;
                };
                for l in &label_sets {
                    families[k].get_or_create(l).set(*v);
                }
            }
        }
    }
    for ((name, help), family) in DCGM_HELP.iter().zip(families) {
        registry.register(*name, *help, family);
    }
    (util_n > 0).then(|| util_sum / f64::from(util_n))
}

#[cfg(test)]
mod tests;
