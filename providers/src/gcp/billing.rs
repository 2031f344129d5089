//! The Cloud Billing Catalog: the SKU pages of Compute Engine's service, and the hourly GPU
//! prices by model, region and market read from them (the spot/on-demand ratio a row is priced
//! with).

use std::collections::HashMap;

use serde::Deserialize;
use spotplane_core::{GpuModel, Market, Micros};

use crate::catalog::CatalogRow;

/// One page of `services/{service}/skus`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct SkuPage {
    pub(super) skus: Vec<Sku>,
    pub(super) next_page_token: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct Sku {
    description: String,
    category: SkuCategory,
    service_regions: Vec<String>,
    pricing_info: Vec<PricingInfo>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct SkuCategory {
    resource_family: String,
    resource_group: String,
    usage_type: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PricingInfo {
    pricing_expression: PricingExpression,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PricingExpression {
    usage_unit: String,
    tiered_rates: Vec<TierRate>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct TierRate {
    start_usage_amount: f64,
    unit_price: Money,
}

/// `google.type.Money`: `units` is an int64, which JSON carries as a string.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct Money {
    currency_code: String,
    units: serde_json::Value,
    nanos: i64,
}

impl Money {
    pub(super) fn micros(&self) -> Option<Micros> {
        if !self.currency_code.is_empty() && self.currency_code != "USD" {
            return None;
        }
        let units = match &self.units {
            serde_json::Value::String(s) => s.parse::<i64>().ok()?,
            serde_json::Value::Number(n) => n.as_i64()?,
            serde_json::Value::Null => 0,
            _ => return None,
        };
        let micros = units
            .checked_mul(1_000_000)?
            .checked_add((self.nanos + 500) / 1000)?;
        Some(Micros(micros))
    }
}

/// Hourly GPU prices from the billing catalog, by GPU model, region and market.
#[derive(Debug, Default)]
pub(super) struct GpuPrices(pub(super) HashMap<(GpuModel, String, Market), Micros>);

impl GpuPrices {
    pub(super) fn add(&mut self, sku: &Sku) {
        let c = &sku.category;
        if c.resource_family != "Compute" || c.resource_group != "GPU" {
            return;
        }
        let market = match c.usage_type.as_str() {
            "OnDemand" => Market::OnDemand,
            "Preemptible" => Market::Spot,
            _ => return, // commitments
        };
        let Some(model) = sku_gpu_model(&sku.description) else {
            return;
        };
        // The last entry is the current price: the timeline is in chronological order.
        let Some(expr) = sku.pricing_info.last().map(|p| &p.pricing_expression) else {
            return;
        };
        if expr.usage_unit != "h" {
            return;
        }
        let Some(price) = expr
            .tiered_rates
            .iter()
            .filter(|r| r.start_usage_amount <= 0.0)
            .find_map(|r| r.unit_price.micros())
            .filter(|p| p.0 > 0)
        else {
            return;
        };
        for region in &sku.service_regions {
            self.0
                .entry((model, region.clone(), market))
                .and_modify(|p| *p = (*p).min(price))
                .or_insert(price);
        }
    }

    /// The spot and on-demand prices of a row's GPU in its region, when both are known and
    /// spot is the cheaper.
    pub(super) fn spot_ratio(&self, row: &CatalogRow) -> Option<(Micros, Micros)> {
        let model = row.gpu_model?;
        let region = row.region.to_string();
        let spot = *self.0.get(&(model, region.clone(), Market::Spot))?;
        let od = *self.0.get(&(model, region, Market::OnDemand))?;
        (spot.0 > 0 && spot <= od).then_some((spot, od))
    }
}

/// GPU SKU descriptions (without the `Spot Preemptible ` prefix and the ` running in …` suffix)
/// and the models they price. A model missing here is priced from the catalog.
const GPU_SKUS: &[(&str, GpuModel)] = &[
    ("nvidia tesla t4 gpu", GpuModel::T4),
    ("nvidia tesla v100 gpu", GpuModel::V100_16GB),
    ("nvidia tesla p100 gpu", GpuModel::P100),
    ("nvidia tesla a100 gpu", GpuModel::A100_40GB),
    ("nvidia tesla a100 80gb gpu", GpuModel::A100_80GB),
    ("nvidia l4 gpu", GpuModel::L4),
    ("nvidia h100 80gb gpu", GpuModel::H100_80GB),
    ("nvidia h200 141gb gpu", GpuModel::H200_141GB),
    ("nvidia b200 gpu", GpuModel::B200_180GB),
];

/// The GPU model a GPU SKU's description names, e.g. `Spot Preemptible Nvidia Tesla A100 80GB
/// GPU running in Americas` → A100-80GB. Exact names only: `… Virtual Workstation GPU` and
/// other variants are not the plain GPU's price.
pub(super) fn sku_gpu_model(description: &str) -> Option<GpuModel> {
    let d = description.trim().to_ascii_lowercase();
    let d = d.split(" running in ").next().unwrap_or(&d);
    let d = d
        .strip_prefix("spot preemptible ")
        .or_else(|| d.strip_prefix("preemptible "))
        .unwrap_or(d)
        .trim();
    GPU_SKUS.iter().find(|(n, _)| *n == d).map(|(_, m)| *m)
}
