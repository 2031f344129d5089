//! The cost ledger's pure core: node time priced at the prices in force, shared out to the jobs
//! that held the node, the rest an explicit idle line.
//!
//! [`ledger`] is a function of a snapshot and the horizon it may close up to (`now` minus a
//! settling delay): no I/O, no clock. For every node it takes the stretch from where the ledger
//! stopped to the horizon (or the node's end) and cuts it at every moment something changes:
//! a price, an allocation starting or ending, and every UTC hour (so a range of whole hours is
//! exact). Each piece is one interval of constant price and constant occupancy.
//!
//! # Money is exact
//!
//! A node's charge is its running total `Σ price × ms` (i128, no rounding) from the moment it is
//! billed, rounded once; an interval costs the rounded total at its end minus the rounded total
//! at its start. So however often the ledger runs and however a node's time is cut, the lines
//! of a node add up to exactly what its whole life rounded once costs — which is what a cloud
//! bills. The on-demand equivalent (`list_cost`) is kept the same way at the on-demand price.
//!
//! # Shares
//!
//! An interval's cost is shared by the GPU share each job held, in units of 1/7000 of a GPU so
//! every kind of share is a whole number: a whole GPU is 7000, a MIG instance 1000 per compute
//! slice (a GPU has 7), a shared GPU 7 per milli-GPU. What no job holds is the idle line. A
//! node without GPUs is shared by CPU milli-cores. The shares are apportioned with the largest
//! remainder method, so the lines of an interval sum to its cost exactly.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, DurationRound, Utc};
use spotplane_core::{JobId, Market, Micros, NodeId, PriceMillis};

/// Share units in one whole GPU (7 MIG compute slices × 1000, 1000 milli-GPUs × 7).
pub const UNITS_PER_GPU: u64 = 7000;

/// What one job's replica holds of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Whole GPUs.
    Gpus(u32),
    /// One MIG instance with this many compute slices.
    MigSlices(u8),
    /// Part of one GPU, in thousandths.
    GpuMilli(u32),
    /// No GPU: CPU milli-cores (counts only on nodes without GPUs).
    Cpu(u64),
}

impl Share {
    /// Share units on a node with or without GPUs.
    pub fn units(self, gpu_node: bool) -> u64 {
        match (self, gpu_node) {
            (Share::Gpus(n), _) => u64::from(n) * UNITS_PER_GPU,
            (Share::MigSlices(c), _) => u64::from(c) * 1000,
            (Share::GpuMilli(m), _) => u64::from(m) * 7,
            (Share::Cpu(_), true) => 0,
            (Share::Cpu(c), false) => c,
        }
    }
}

/// A node's price from a moment on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Price {
    pub at: DateTime<Utc>,
    /// What the node costs per hour (the spot price on spot).
    pub price: Micros,
    /// The on-demand price of the same capacity.
    pub on_demand: Micros,
}

/// One replica's allocation on a node, from `from` until `to` (still held when `None`).
#[derive(Debug, Clone, PartialEq)]
pub struct AllocSpan {
    pub job: JobId,
    /// Internal team id.
    pub team_id: String,
    /// The job's run this allocation belongs to.
    pub attempt: u32,
    pub share: Share,
    pub from: DateTime<Utc>,
    pub to: Option<DateTime<Utc>>,
}

/// Everything the ledger needs about one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInput {
    pub id: NodeId,
    pub market: Market,
    /// Billed from here...
    pub billed_from: DateTime<Utc>,
    /// ...to here (`None`: still running).
    pub billed_to: Option<DateTime<Utc>>,
    /// While it runs, billed no further than this: the last time its cloud showed it still
    /// there (`None`: no such limit). An end heard late is then not billed past.
    pub confirmed_until: Option<DateTime<Utc>>,
    /// The ledger has the node's time before this (`None`: nothing yet).
    pub until: Option<DateTime<Utc>>,
    pub gpus: u32,
    pub cpu_milli: u64,
    /// Prices, oldest first. The first applies from `billed_from` whatever its `at` says (the
    /// price the node was bought at); each later one from its `at`.
    pub prices: Vec<Price>,
    pub allocations: Vec<AllocSpan>,
}

impl NodeInput {
    /// Share units of the whole node.
    pub fn capacity(&self) -> u64 {
        if self.gpus > 0 {
            u64::from(self.gpus) * UNITS_PER_GPU
        } else {
            self.cpu_milli.max(1)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LineKind {
    /// A job's share of a node.
    Usage,
    /// The part of a node no job held.
    Idle,
    /// A memo of work lost (already paid for in usage lines), priced: not a charge.
    LostWork,
}

impl LineKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            LineKind::Usage => "usage",
            LineKind::Idle => "idle",
            LineKind::LostWork => "lost_work",
        }
    }

    pub fn parse(s: &str) -> Option<LineKind> {
        [LineKind::Usage, LineKind::Idle, LineKind::LostWork]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// One ledger line: a share of one node over one interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub node: NodeId,
    pub job: Option<JobId>,
    pub team_id: Option<String>,
    pub attempt: Option<u32>,
    pub kind: LineKind,
    pub market: Market,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// The share held, in thousandths of a GPU (of a CPU core on nodes without GPUs), rounded.
    pub gpu_milli: u32,
    /// The node's price and on-demand price per hour over the interval.
    pub price: Micros,
    pub on_demand: Micros,
    /// This line's part of what was paid, and of what the same time costs on demand.
    pub cost: Micros,
    pub list_cost: Micros,
}

impl Line {
    pub fn millis(&self) -> i64 {
        (self.end - self.start).num_milliseconds()
    }
}

/// How far the ledger has a node after a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub node: NodeId,
    pub until: DateTime<Utc>,
    /// The node is gone and all its time is in the ledger.
    pub closed: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct LedgerOutput {
    pub lines: Vec<Line>,
    pub progress: Vec<Progress>,
}

/// The lines of every node's time between where the ledger stopped and `horizon`.
pub fn ledger(nodes: &[NodeInput], horizon: DateTime<Utc>) -> LedgerOutput {
    let mut out = LedgerOutput::default();
    for n in nodes {
        if let Some(p) = node_lines(n, horizon, &mut out.lines) {
            out.progress.push(p);
        }
    }
    out
}

/// Running totals of one node's charges from its billing start, at any moment.
struct Totals<'a> {
    node: &'a NodeInput,
}

impl Totals<'_> {
    /// The price in force at `t`.
    fn price_at(&self, t: DateTime<Utc>) -> Price {
        let ps = &self.node.prices;
        let idx = ps.partition_point(|p| p.at <= t);
        ps[idx.saturating_sub(1)]
    }

    /// `Σ price × ms` and `Σ on-demand × ms` from the billing start to `t`.
    fn at(&self, t: DateTime<Utc>) -> (PriceMillis, PriceMillis) {
        let n = self.node;
        let (mut paid, mut list) = (PriceMillis::default(), PriceMillis::default());
        for (i, p) in n.prices.iter().enumerate() {
            let from = if i == 0 {
                n.billed_from
            } else {
                p.at.max(n.billed_from)
            };
            let to = n.prices.get(i + 1).map_or(t, |next| next.at.min(t));
            if to <= from {
                continue;
            }
            let ms = (to - from).num_milliseconds();
            paid.add(p.price, ms);
            list.add(p.on_demand, ms);
        }
        (paid, list)
    }
}

fn node_lines(n: &NodeInput, horizon: DateTime<Utc>, lines: &mut Vec<Line>) -> Option<Progress> {
    if n.prices.is_empty() {
        return None;
    }
    let open_to = n.confirmed_until.map_or(horizon, |c| c.min(horizon));
    let end = n.billed_to.map_or(open_to, |t| t.min(horizon));
    let start = n.until.unwrap_or(n.billed_from).max(n.billed_from);
    let closed = n.billed_to.is_some_and(|t| t <= horizon);
    if start >= end {
        // Nothing new: either all of it is in already (closed when the node is gone), or the
        // horizon has not moved.
        return Some(Progress {
            node: n.id,
            until: start,
            closed,
        });
    }
    let totals = Totals { node: n };

    // Every moment something changes inside (start, end).
    let mut cuts: Vec<DateTime<Utc>> = Vec::new();
    for p in n.prices.iter().skip(1) {
        cuts.push(p.at);
    }
    for a in &n.allocations {
        cuts.push(a.from);
        if let Some(t) = a.to {
            cuts.push(t);
        }
    }
    let mut hour = start.duration_trunc(Duration::hours(1)).unwrap_or(start) + Duration::hours(1);
    while hour < end {
        cuts.push(hour);
        hour += Duration::hours(1);
    }
    cuts.retain(|t| *t > start && *t < end);
    cuts.push(start);
    cuts.push(end);
    cuts.sort_unstable();
    cuts.dedup();

    let gpu_node = n.gpus > 0;
    let capacity = n.capacity();
    let (mut paid_before, mut list_before) = {
        let (p, l) = totals.at(start);
        (Micros::from_price_millis(p), Micros::from_price_millis(l))
    };
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let (p, l) = totals.at(b);
        let (paid_after, list_after) = (Micros::from_price_millis(p), Micros::from_price_millis(l));
        let cost = paid_after - paid_before;
        let list_cost = list_after - list_before;
        (paid_before, list_before) = (paid_after, list_after);
        let price = totals.price_at(a);

        // Who held the node over [a, b): allocation ends are cuts, so overlap means cover.
        let mut holders: BTreeMap<(JobId, u32), (String, u64)> = BTreeMap::new();
        for al in &n.allocations {
            if al.from <= a && al.to.is_none_or(|t| t > a) {
                let e = holders
                    .entry((al.job, al.attempt))
                    .or_insert_with(|| (al.team_id.clone(), 0));
                e.1 += al.share.units(gpu_node);
            }
        }
        holders.retain(|_, (_, u)| *u > 0);
        let held: u64 = holders.values().map(|(_, u)| *u).sum();
        // More held than the node has would be a bookkeeping error upstream; the node's cost
        // is then shared by what was held, nothing idle.
        let whole = capacity.max(held);
        let mut weights: Vec<u64> = holders.values().map(|(_, u)| *u).collect();
        weights.push(whole - held);
        let costs = apportion(cost, &weights);
        let lists = apportion(list_cost, &weights);
        let milli = |u: u64| {
            let per = if gpu_node { 7 } else { 1 };
            u32::try_from((u + per / 2) / per).unwrap_or(u32::MAX)
        };
        let line = |job: Option<(JobId, u32, String)>, kind, units, cost, list_cost| Line {
            node: n.id,
            attempt: job.as_ref().map(|j| j.1),
            team_id: job.as_ref().map(|j| j.2.clone()),
            job: job.map(|j| j.0),
            kind,
            market: n.market,
            start: a,
            end: b,
            gpu_milli: milli(units),
            price: price.price,
            on_demand: price.on_demand,
            cost,
            list_cost,
        };
        for (i, ((job, attempt), (team, units))) in holders.into_iter().enumerate() {
            lines.push(line(
                Some((job, attempt, team)),
                LineKind::Usage,
                units,
                costs[i],
                lists[i],
            ));
        }
        let idle = whole - held;
        if idle > 0 {
            let k = weights.len() - 1;
            lines.push(line(None, LineKind::Idle, idle, costs[k], lists[k]));
        }
    }
    Some(Progress {
        node: n.id,
        until: end,
        closed,
    })
}

/// Shares `total` in proportion to `weights` with the largest remainder method: each gets the
/// floor of its exact share, and the micro-dollars left go one each to the largest remainders
/// (ties to the earlier). The parts always sum to `total`. All weights zero: all to the last.
pub fn apportion(total: Micros, weights: &[u64]) -> Vec<Micros> {
    let mut out = vec![Micros::ZERO; weights.len()];
    if weights.is_empty() {
        return out;
    }
    let sum: u128 = weights.iter().map(|w| u128::from(*w)).sum();
    if sum == 0 {
        if let Some(last) = out.last_mut() {
            *last = total;
        }
        return out;
    }
    let negative = total.0 < 0;
    let t = u128::from(total.0.unsigned_abs());
    let mut rems: Vec<(u128, usize)> = Vec::with_capacity(weights.len());
    let mut given: u128 = 0;
    for (i, w) in weights.iter().enumerate() {
        let exact = t * u128::from(*w);
        let q = exact / sum;
        given += q;
        out[i] = Micros(q as i64);
        rems.push((exact % sum, i));
    }
    // Largest remainder first; among equals, the earlier.
    rems.sort_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)));
    let left = (t - given) as usize;
    for (_, i) in rems.into_iter().take(left) {
        out[i].0 += 1;
    }
    if negative {
        for m in &mut out {
            m.0 = -m.0;
        }
    }
    out
}

/// A run of a job that ended in `lost`: the work since `since` (its last durable checkpoint,
/// or the run's start) until `lost_at` is gone.
#[derive(Debug, Clone, PartialEq)]
pub struct LostRun {
    pub job: JobId,
    pub team_id: String,
    pub since: DateTime<Utc>,
    pub lost_at: DateTime<Utc>,
}

/// Prices lost work: the part of the job's usage lines that falls in the lost stretch, pro rata
/// of each line's time. The memo lines say on which node and market the work was lost.
pub fn price_lost_work(runs: &[LostRun], usage: &[Line]) -> Vec<Line> {
    let mut out = Vec::new();
    for r in runs {
        for l in usage {
            if l.kind != LineKind::Usage || l.job != Some(r.job) {
                continue;
            }
            let (a, b) = (l.start.max(r.since), l.end.min(r.lost_at));
            if a >= b || l.millis() <= 0 {
                continue;
            }
            let ms = (b - a).num_milliseconds();
            out.push(Line {
                kind: LineKind::LostWork,
                start: a,
                end: b,
                cost: l.cost.scale(ms, l.millis()),
                list_cost: l.list_cost.scale(ms, l.millis()),
                team_id: Some(r.team_id.clone()),
                ..l.clone()
            });
        }
    }
    out
}

/// Alert thresholds of a monthly budget, in percent.
pub const BUDGET_THRESHOLDS: [u32; 3] = [50, 80, 100];

/// The highest threshold a team's spending has reached that was not alerted yet this month.
/// `alerted` is the month and threshold of the last alert.
pub fn budget_alert(
    month: &str,
    spent: Micros,
    budget: Micros,
    alerted: Option<(&str, u32)>,
) -> Option<u32> {
    if budget.0 <= 0 {
        return None;
    }
    let already = match alerted {
        Some((m, pct)) if m == month => pct,
        _ => 0,
    };
    BUDGET_THRESHOLDS
        .into_iter()
        .filter(|t| i128::from(spent.0) * 100 >= i128::from(budget.0) * i128::from(*t))
        .max()
        .filter(|t| *t > already)
}

#[cfg(test)]
mod tests;
