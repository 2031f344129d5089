//! Spend by node time held: every bought node's price in force times the time from its purchase
//! to its end (or `now`), against the on-demand price of the same capacity. A quick figure for
//! the live page and the replays; the ledger (`finance::ledger`) is the one finance reads.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::model::Node;

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct HeldSpend {
    pub cost_usd: f64,
    pub ondemand_equivalent_usd: f64,
    /// Percent saved against on-demand.
    pub saving_pct: f64,
    /// GPU-hours of the nodes held.
    pub node_gpu_hours: f64,
}

pub fn held_spend(nodes: &[Node], now: DateTime<Utc>) -> HeldSpend {
    let (mut cost, mut od) = (0i128, 0i128);
    // GPU-milliseconds, summed exactly: the hours do not depend on the order of the nodes.
    let mut gpu_ms = 0i128;
    for n in nodes.iter().filter(|n| n.provider_instance_id.is_some()) {
        let until = n.terminated_at.unwrap_or(now);
        let ms = i128::from((until - n.created_at).num_milliseconds().max(0));
        cost += i128::from(n.hourly_price.0) * ms;
        od += i128::from(n.on_demand_price.0) * ms;
        gpu_ms += n.gpus.len() as i128 * ms;
    }
    let usd = |v: i128| v as f64 / 3_600_000.0 / 1e6;
    HeldSpend {
        cost_usd: usd(cost),
        ondemand_equivalent_usd: usd(od),
        saving_pct: if od > 0 {
            100.0 * (1.0 - cost as f64 / od as f64)
        } else {
            0.0
        },
        node_gpu_hours: gpu_ms as f64 / 3_600_000.0,
    }
}
