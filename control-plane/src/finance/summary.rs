//! Summaries of the ledger: cost, on-demand equivalent, saving, idle and lost work, grouped.
//!
//! Pure: folds [`LedgerEntry`] values. Charges are the usage and idle lines; lost-work lines
//! are memos of what was already paid and are summed apart.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::Serialize;
use spotplane_core::Micros;
use utoipa::ToSchema;

use super::LedgerEntry;
use super::ledger::LineKind;

/// What a summary is grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    Team,
    Job,
    Provider,
    Region,
    Market,
}

impl GroupBy {
    pub const ALL: [GroupBy; 5] = [
        GroupBy::Team,
        GroupBy::Job,
        GroupBy::Provider,
        GroupBy::Region,
        GroupBy::Market,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            GroupBy::Team => "team",
            GroupBy::Job => "job",
            GroupBy::Provider => "provider",
            GroupBy::Region => "region",
            GroupBy::Market => "market",
        }
    }
}

impl fmt::Display for GroupBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GroupBy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GroupBy::ALL
            .into_iter()
            .find(|g| g.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not one of team, job, provider, region, market"))
    }
}

/// The key idle lines are grouped under when grouping by team or job.
pub const IDLE_KEY: &str = "(idle)";

/// Figures of one group (or of everything). Money in micro-dollars, exact.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct Figures {
    /// What was paid: usage and idle lines.
    #[schema(value_type = i64)]
    pub cost_micros: Micros,
    /// The same time at on-demand prices.
    #[schema(value_type = i64)]
    pub on_demand_cost_micros: Micros,
    /// `on_demand_cost - cost`.
    #[schema(value_type = i64)]
    pub saving_micros: Micros,
    /// Part of `cost` that no job held.
    #[schema(value_type = i64)]
    pub idle_micros: Micros,
    /// Work lost (since the last checkpoint) when a run was lost, priced; part of `cost`.
    #[schema(value_type = i64)]
    pub lost_work_micros: Micros,
    /// GPU-hours held by jobs, in thousandths.
    pub gpu_milli_hours: i64,
}

impl Figures {
    fn add(&mut self, e: &LedgerEntry) {
        match e.kind {
            LineKind::Usage | LineKind::Idle => {
                self.cost_micros += e.cost;
                self.on_demand_cost_micros += e.list_cost;
                self.saving_micros = self.on_demand_cost_micros - self.cost_micros;
                if e.kind == LineKind::Idle {
                    self.idle_micros += e.cost;
                } else {
                    self.gpu_milli_hours += i64::from(e.gpu_milli) * e.millis / 3_600_000;
                }
            }
            LineKind::LostWork => self.lost_work_micros += e.cost,
        }
    }
}

/// One group's figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SummaryRow {
    /// The team's name, the job id, the cloud, the region or the market; `(idle)` for what
    /// no job held when grouping by team or job.
    pub key: String,
    #[serde(flatten)]
    pub figures: Figures,
}

/// `GET /v1/finance/summary`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Summary {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub group_by: GroupBy,
    pub currency: &'static str,
    pub rows: Vec<SummaryRow>,
    pub total: Figures,
}

fn key(e: &LedgerEntry, by: GroupBy) -> String {
    match by {
        GroupBy::Team => e
            .team
            .as_ref()
            .map_or_else(|| IDLE_KEY.to_owned(), |t| t.to_string()),
        GroupBy::Job => e
            .job_id
            .map_or_else(|| IDLE_KEY.to_owned(), |j| j.to_string()),
        GroupBy::Provider => e.cloud.to_string(),
        GroupBy::Region => format!("{}/{}", e.cloud, e.region),
        GroupBy::Market => e.market.to_string(),
    }
}

/// Sums `entries` (already limited to the range and what the caller may see) by `by`.
pub fn summarize(
    entries: &[LedgerEntry],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    by: GroupBy,
) -> Summary {
    let mut groups: BTreeMap<String, Figures> = BTreeMap::new();
    let mut total = Figures::default();
    for e in entries {
        groups.entry(key(e, by)).or_default().add(e);
        total.add(e);
    }
    Summary {
        from,
        to,
        group_by: by,
        currency: "USD",
        rows: groups
            .into_iter()
            .map(|(key, figures)| SummaryRow { key, figures })
            .collect(),
        total,
    }
}
