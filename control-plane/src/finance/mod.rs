//! Finance: the cost ledger, its summaries and its exports.
//!
//! - [`ledger`]: the pure core that turns node time, prices and allocations into ledger lines
//!   (no I/O, no clock; `reconcile::ledger` runs it and writes its lines).
//! - [`summary`]: cost, on-demand equivalent, saving, idle and lost work, grouped.
//! - [`export`]: the ledger as CSV, and as a FinOps FOCUS file.

pub mod export;
pub mod held;
pub mod ledger;
pub mod summary;

use chrono::{DateTime, Utc};
use serde::Serialize;
use spotplane_core::{Cloud, JobId, Market, Micros, NodeId, TeamName};
use utoipa::ToSchema;

use ledger::LineKind;

/// The first instant of `now`'s calendar month in UTC: where a monthly budget starts.
pub fn month_start(now: DateTime<Utc>) -> DateTime<Utc> {
    use chrono::{Datelike as _, TimeZone as _};
    Utc.with_ymd_and_hms(now.year(), now.month(), 1, 0, 0, 0)
        .single()
        .unwrap_or(now)
}

/// A stored ledger line with what is known of its node and team, as exports and summaries
/// read it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct LedgerEntry {
    pub id: i64,
    #[schema(value_type = String)]
    pub kind: LineKind,
    pub node_id: NodeId,
    pub node_name: String,
    /// The cloud's id of the instance, when known.
    pub provider_instance_id: Option<String>,
    pub cloud: Cloud,
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub market: Market,
    pub job_id: Option<JobId>,
    pub team: Option<TeamName>,
    /// Which run of the job.
    pub attempt: Option<u32>,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub millis: i64,
    /// Share of the node held, in thousandths of a GPU.
    pub gpu_milli: u32,
    /// The node's price per hour over the line, and the on-demand price of the same capacity.
    pub price: Micros,
    pub on_demand_price: Micros,
    /// What this share cost, and what it would have cost on demand.
    pub cost: Micros,
    pub list_cost: Micros,
}

impl serde::Serialize for LineKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}
