//! The ledger loop: record the prices of the pools nodes are bought from, run the pure ledger
//! core up to `now - settle`, write its lines; price lost work; alert on budgets.
//!
//! Prices come from the provider's price history where it has one (exact: the simulated
//! clouds; AWS spot price history), else from its current offers, recorded at the moment they
//! are read. A cycle that fails leaves the store as it was (each write is one transaction) and
//! the next cycle picks up from the stored progress, so nothing is counted twice or lost.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Datelike, Utc};
use spotplane_core::{Cloud, Micros};
use spotplane_providers::registry::Providers;
use spotplane_providers::{CloudProvider, PoolRef};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::FinanceSettings;
use crate::finance::ledger::{budget_alert, ledger, price_lost_work};
use crate::reconcile::runner::{ReconcileError, Reconciler, Report};
use crate::store::{Store, StoreError};

/// Current prices by offer id: (price, on-demand price).
type OfferPrices = HashMap<String, (Micros, Micros)>;

/// What one cycle did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerReport {
    pub price_points: usize,
    pub nodes: usize,
    pub lines: usize,
    pub lost_runs: usize,
    pub budget_alerts: usize,
    /// Providers that could not be asked for prices (their nodes keep their last price).
    pub price_failures: usize,
}

impl Report for LedgerReport {
    fn is_quiet(&self) -> bool {
        // A ledger pass writes lines every time it runs: at debug level unless it alerts or
        // could not read prices.
        self.budget_alerts == 0 && self.price_failures == 0
    }

    fn events(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("ledger_lines", self.lines as u64),
            ("budget_alerts", self.budget_alerts as u64),
            ("price_failures", self.price_failures as u64),
        ]
    }
}

pub struct LedgerLoop {
    store: Store,
    clock: SharedClock,
    providers: Vec<Arc<dyn CloudProvider>>,
    settings: FinanceSettings,
}

#[async_trait]
impl Reconciler for LedgerLoop {
    fn name(&self) -> &'static str {
        "ledger"
    }

    async fn reconcile(
        &mut self,
        now: DateTime<Utc>,
        _cancel: &CancellationToken,
    ) -> Result<Box<dyn Report>, ReconcileError> {
        Ok(Box::new(self.run_at(now).await?))
    }
}

impl LedgerLoop {
    pub fn new(
        store: Store,
        clock: SharedClock,
        providers: Option<&Providers>,
        settings: FinanceSettings,
    ) -> Self {
        LedgerLoop {
            store,
            clock,
            providers: providers.map(|p| p.all.clone()).unwrap_or_default(),
            settings,
        }
    }

    fn provider(&self, cloud: Cloud) -> Option<&Arc<dyn CloudProvider>> {
        self.providers.iter().find(|p| p.cloud() == cloud)
    }

    /// Records the prices of every pool a node not yet closed is bought from, up to `now`.
    async fn record_prices(
        &self,
        now: DateTime<Utc>,
        report: &mut LedgerReport,
    ) -> Result<(), StoreError> {
        let pools = self.store.ledger_live_pools().await?;
        let mut points = Vec::new();
        let mut offers: HashMap<Cloud, Option<OfferPrices>> = HashMap::new();
        for p in pools {
            let Some(provider) = self.provider(p.cloud) else {
                continue;
            };
            let from = p.last.map_or(p.since, |l| l.0.max(p.since).min(now));
            let pool = PoolRef {
                region: &p.region,
                zone: &p.zone,
                instance_type: &p.instance_type,
                market: p.market,
            };
            let mut last = p.last.map(|l| (l.1, l.2));
            match provider.price_history(&pool, from, now).await {
                Ok(Some(changes)) => {
                    for c in changes {
                        if last != Some((c.price, c.on_demand_price)) {
                            points.push((p.pool.clone(), c.at, c.price, c.on_demand_price));
                            last = Some((c.price, c.on_demand_price));
                        }
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(pool = %p.pool, error = %e, "cannot read the price history");
                    report.price_failures += 1;
                    continue;
                }
            }
            // No history: the current offer's price, from now on.
            if let std::collections::hash_map::Entry::Vacant(slot) = offers.entry(p.cloud) {
                let listed = match provider.list_offers().await {
                    Ok(list) => Some(
                        list.into_iter()
                            .map(|o| (o.id(), (o.price, o.on_demand_price)))
                            .collect(),
                    ),
                    Err(e) => {
                        tracing::warn!(cloud = %p.cloud, error = %e, "cannot read offers for prices");
                        report.price_failures += 1;
                        None
                    }
                };
                slot.insert(listed);
            }
            if let Some(Some(listed)) = offers.get(&p.cloud)
                && let Some(price) = listed.get(&p.pool)
                && last != Some(*price)
            {
                points.push((p.pool.clone(), now, price.0, price.1));
            }
        }
        report.price_points = points.len();
        self.store.record_price_points(&points).await
    }

    /// One cycle at the clock's time.
    pub async fn run_once(&self) -> Result<LedgerReport, ReconcileError> {
        self.run_at(self.clock.now()).await
    }

    /// One cycle at `now`.
    pub async fn run_at(&self, now: DateTime<Utc>) -> Result<LedgerReport, ReconcileError> {
        let horizon = now - chrono::Duration::from_std(self.settings.settle).unwrap_or_default();
        let mut report = LedgerReport::default();
        self.record_prices(now, &mut report).await?;

        // 1. Node time up to the horizon.
        let snapshot = self.store.ledger_snapshot(horizon).await?;
        report.nodes = snapshot.len();
        let out = tokio::task::spawn_blocking(move || ledger(&snapshot, horizon))
            .await
            .map_err(|e| ReconcileError::task("ledger", e))?;
        report.lines = out.lines.len();
        self.store
            .write_ledger(&out.lines, &out.progress, now)
            .await?;
        if !out.lines.is_empty() {
            crate::crash_point!("ledger-write");
        }

        // 2. Lost work of runs lost before the horizon (their usage is in the ledger by now).
        let (runs, position) = self.store.lost_runs(horizon).await?;
        if !runs.is_empty() || position > 0 {
            let jobs: Vec<_> = runs.iter().map(|r| r.job).collect();
            let from = runs.iter().map(|r| r.since).min().unwrap_or(horizon);
            let to = runs.iter().map(|r| r.lost_at).max().unwrap_or(horizon);
            let usage = if runs.is_empty() {
                Vec::new()
            } else {
                self.store.usage_lines(&jobs, from, to).await?
            };
            let lost = price_lost_work(&runs, &usage);
            report.lost_runs = runs.len();
            self.store.write_lost_work(&lost, position, now).await?;
        }

        // 3. Budgets: this month's spending against each team's monthly budget.
        let budgets = self.store.team_budgets().await?;
        if !budgets.is_empty() {
            let month_start = crate::finance::month_start(now);
            let month = format!("{:04}-{:02}", now.year(), now.month());
            let spent = self.store.team_spend_since(month_start).await?;
            for b in budgets {
                let s = spent.get(&b.team_id).copied().unwrap_or_default();
                let alerted = b.alerted.as_ref().map(|(m, p)| (m.as_str(), *p));
                if let Some(pct) = budget_alert(&month, s, b.monthly, alerted) {
                    self.store
                        .record_budget_alert(&b, &month, pct, s, now)
                        .await?;
                    report.budget_alerts += 1;
                }
            }
        }
        Ok(report)
    }
}
