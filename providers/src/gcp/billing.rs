//! The Cloud Billing Catalog: Compute Engine's SKUs (read with `google-cloud-billing-v1`), the
//! hourly component prices they carry by region and market, and a catalog row's whole-VM price
//! summed from them.
//!
//! # Which SKUs price what
//!
//! Compute Engine bills a GPU VM per component: vCPUs at the machine series' core SKU, memory at
//! its RAM SKU (per GiB), and each GPU at the GPU model's SKU. A4 is the exception: one
//! "GPU slice" SKU per GPU that includes the slice's vCPUs and memory, and no core or RAM SKU.
//! Bundled Local SSD (A2 Ultra, A3) is billed too and is not summed here: at most about 1% of
//! those machine types' price.
//!
//! A SKU is recognised by its `category` (resource family `Compute`, the resource group the
//! component belongs to, usage type `OnDemand` or `Preemptible`) and by its description, read
//! without case: the ` running in <location>` suffix is dropped, then the spot markers (a
//! `Spot Preemptible ` prefix on core, RAM and A4 slice SKUs, an ` attached to Spot Preemptible
//! VMs` infix on GPU SKUs), and what is left must equal one of [`SKUS`] exactly, so
//! commitments, reservations, DWS and Calendar Mode, sole tenancy, custom machine types and
//! Virtual Workstation GPUs never match. The market is spot when the usage type is
//! `Preemptible` or the description carries a spot marker (a spot SKU filed as `OnDemand` has
//! been reported for the A4 slice), on-demand otherwise.
//!
//! Sources for the descriptions (checked 2026; Google publishes no list of them):
//!
//! - Cyclenerd/google-cloud-pricing-cost-calculator, `build/mapping.csv`: `A2 Instance`,
//!   `A3 Instance`, `G2 Instance`, `G4 Instance` core and RAM (groups `CPU`/`RAM`), their
//!   `Spot Preemptible …` forms, `N1 Predefined Instance Core|Ram` (group `N1Standard`), and
//!   the GPU SKUs `Nvidia Tesla T4|V100|P100|A100|A100 80GB GPU`, `Nvidia L4 GPU`,
//!   `Nvidia H100 80GB GPU`, `Nvidia H100 80GB Mega GPU`, `RTX 6000 96GB`, each
//!   `… running in` and `… attached to Spot …`.
//! - hail-is/hail, `batch/batch/cloud/gcp/driver/pricing.py` (SKU ids with their descriptions):
//!   `G2 Instance Core running in Iowa`, `Spot Preemptible G2 Instance Ram running in Dallas`,
//!   `Nvidia L4 GPU attached to Spot Preemptible VMs running in Virginia`; RAM priced in
//!   `GiBy.h`, the usage type deciding the market.
//! - dstackai/gpuhunt, `src/gpuhunt/providers/gcp.py`: `A3Plus Instance` core and RAM price
//!   `a3-megagpu`; `Nvidia H100 80GB Plus GPU` is the Mega GPU in some regions; A4 is priced per
//!   `(1 gpu slice)`, `Spot Preemptible A4 Nvidia B200 (1 gpu slice) …`.
//! - skypilot-org/skypilot, `sky/catalog/data_fetchers/fetch_gcp.py`: `H200 141GB GPU` (no
//!   `Nvidia` prefix), `Nvidia B200 (1 gpu slice)`, `Nvidia H100 Mega 80GB GPU`; "GCP does not
//!   have A4 instance in SKUs" (no A4 core/RAM SKU).
//!
//! Not verified from a citable source: `A3Ultra Instance Core|Ram` (the `a3-ultragpu` H200
//! machines; seen once in an unattributed listing), and the spot form of the H200 SKU (neither
//! `H200 141GB GPU attached to Spot Preemptible VMs` nor `Spot Preemptible H200 141GB GPU` was
//! found; both are read). A name that does not match leaves the row at its catalog price, with
//! the missing SKU in the log.

use std::collections::HashMap;

use google_cloud_billing_v1::model::Sku;
use spotplane_core::{GpuModel, Market, Micros};

use crate::catalog::CatalogRow;

/// A machine series, as its core and RAM SKUs name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Series {
    N1,
    A2,
    /// `a3-highgpu-*`.
    A3High,
    /// `a3-megagpu-*` (SKUs `A3Plus …`).
    A3Mega,
    /// `a3-ultragpu-*` (H200).
    A3Ultra,
    /// `a4-highgpu-*` (B200), priced per GPU slice.
    A4,
    G2,
    /// `g4-standard-*` (RTX PRO 6000).
    G4,
}

/// A GPU SKU. The H100 has two (A3 High and A3 Mega), and the B200's is the A4 slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum GpuSku {
    T4,
    V100,
    P100,
    A100,
    A100_80,
    L4,
    H100,
    H100Mega,
    H200,
    /// `A4 Nvidia B200 (1 gpu slice)`: one B200 with its share of vCPUs and memory.
    B200Slice,
    /// `RTX 6000 96GB`: the RTX PRO 6000 of G4.
    RtxPro6000,
}

/// One priced component of a GPU VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Component {
    /// Per vCPU-hour.
    Core(Series),
    /// Per GiB-hour of memory.
    Ram(Series),
    /// Per GPU-hour.
    Gpu(GpuSku),
}

impl Component {
    /// The `pricingExpression.usageUnit` its price must be in.
    fn usage_unit(self) -> &'static str {
        match self {
            Component::Ram(_) => "GiBy.h",
            Component::Core(_) | Component::Gpu(_) => "h",
        }
    }

    /// The on-demand description of its SKU, for logs.
    fn name(self) -> &'static str {
        SKUS.iter()
            .find(|s| s.2 == self)
            .map_or("unknown SKU", |s| s.3)
    }
}

/// The SKUs read: description stem (lowercase, without the market markers and the location),
/// the `category.resourceGroup` it must be filed under, what it prices, and its name in logs.
/// The sources are in the module doc.
pub(super) const SKUS: &[(&str, &str, Component, &str)] = &[
    // vCPUs
    (
        "n1 predefined instance core",
        "N1Standard",
        Component::Core(Series::N1),
        "N1 Predefined Instance Core",
    ),
    (
        "a2 instance core",
        "CPU",
        Component::Core(Series::A2),
        "A2 Instance Core",
    ),
    (
        "a3 instance core",
        "CPU",
        Component::Core(Series::A3High),
        "A3 Instance Core",
    ),
    (
        "a3plus instance core",
        "CPU",
        Component::Core(Series::A3Mega),
        "A3Plus Instance Core",
    ),
    // Unverified (see the module doc).
    (
        "a3ultra instance core",
        "CPU",
        Component::Core(Series::A3Ultra),
        "A3Ultra Instance Core",
    ),
    (
        "g2 instance core",
        "CPU",
        Component::Core(Series::G2),
        "G2 Instance Core",
    ),
    (
        "g4 instance core",
        "CPU",
        Component::Core(Series::G4),
        "G4 Instance Core",
    ),
    // Memory
    (
        "n1 predefined instance ram",
        "N1Standard",
        Component::Ram(Series::N1),
        "N1 Predefined Instance Ram",
    ),
    (
        "a2 instance ram",
        "RAM",
        Component::Ram(Series::A2),
        "A2 Instance Ram",
    ),
    (
        "a3 instance ram",
        "RAM",
        Component::Ram(Series::A3High),
        "A3 Instance Ram",
    ),
    (
        "a3plus instance ram",
        "RAM",
        Component::Ram(Series::A3Mega),
        "A3Plus Instance Ram",
    ),
    // Unverified (see the module doc).
    (
        "a3ultra instance ram",
        "RAM",
        Component::Ram(Series::A3Ultra),
        "A3Ultra Instance Ram",
    ),
    (
        "g2 instance ram",
        "RAM",
        Component::Ram(Series::G2),
        "G2 Instance Ram",
    ),
    (
        "g4 instance ram",
        "RAM",
        Component::Ram(Series::G4),
        "G4 Instance Ram",
    ),
    // GPUs
    (
        "nvidia tesla t4 gpu",
        "GPU",
        Component::Gpu(GpuSku::T4),
        "Nvidia Tesla T4 GPU",
    ),
    (
        "nvidia tesla v100 gpu",
        "GPU",
        Component::Gpu(GpuSku::V100),
        "Nvidia Tesla V100 GPU",
    ),
    (
        "nvidia tesla p100 gpu",
        "GPU",
        Component::Gpu(GpuSku::P100),
        "Nvidia Tesla P100 GPU",
    ),
    (
        "nvidia tesla a100 gpu",
        "GPU",
        Component::Gpu(GpuSku::A100),
        "Nvidia Tesla A100 GPU",
    ),
    (
        "nvidia tesla a100 80gb gpu",
        "GPU",
        Component::Gpu(GpuSku::A100_80),
        "Nvidia Tesla A100 80GB GPU",
    ),
    (
        "nvidia l4 gpu",
        "GPU",
        Component::Gpu(GpuSku::L4),
        "Nvidia L4 GPU",
    ),
    (
        "nvidia h100 80gb gpu",
        "GPU",
        Component::Gpu(GpuSku::H100),
        "Nvidia H100 80GB GPU",
    ),
    (
        "nvidia h100 80gb mega gpu",
        "GPU",
        Component::Gpu(GpuSku::H100Mega),
        "Nvidia H100 80GB Mega GPU",
    ),
    (
        "nvidia h100 80gb plus gpu",
        "GPU",
        Component::Gpu(GpuSku::H100Mega),
        "Nvidia H100 80GB Mega GPU",
    ),
    (
        "nvidia h100 mega 80gb gpu",
        "GPU",
        Component::Gpu(GpuSku::H100Mega),
        "Nvidia H100 80GB Mega GPU",
    ),
    (
        "h200 141gb gpu",
        "GPU",
        Component::Gpu(GpuSku::H200),
        "H200 141GB GPU",
    ),
    (
        "a4 nvidia b200 (1 gpu slice)",
        "GPU",
        Component::Gpu(GpuSku::B200Slice),
        "A4 Nvidia B200 (1 gpu slice)",
    ),
    (
        "rtx 6000 96gb",
        "GPU",
        Component::Gpu(GpuSku::RtxPro6000),
        "RTX 6000 96GB",
    ),
];

/// A SKU's description read as in the module doc: the stem to look up in [`SKUS`] and whether
/// a spot marker was on it. `None` for descriptions without a location (`… in Americas for 1
/// Year`, reservations).
pub(super) fn read_description(description: &str) -> Option<(String, bool)> {
    let d = description.trim().to_ascii_lowercase();
    let (head, _location) = d.split_once(" running in ")?;
    let mut stem = head.trim();
    let mut spot = false;
    if let Some(rest) = stem.strip_prefix("spot preemptible ") {
        stem = rest;
        spot = true;
    } else if let Some(rest) = stem.strip_prefix("preemptible ") {
        stem = rest;
        spot = true;
    }
    if let Some(rest) = stem.strip_suffix(" attached to spot preemptible vms") {
        stem = rest;
        spot = true;
    }
    Some((stem.trim().to_owned(), spot))
}

/// What a SKU prices, and on which market; `None` for SKUs that price nothing spotplane sells.
pub(super) fn classify(sku: &Sku) -> Option<(Component, Market)> {
    let c = sku.category.as_ref()?;
    if c.resource_family != "Compute" {
        return None;
    }
    let (stem, spot_marked) = read_description(&sku.description)?;
    let &(_, group, component, _) = SKUS.iter().find(|s| s.0 == stem)?;
    if c.resource_group != group {
        return None;
    }
    let market = match c.usage_type.as_str() {
        "Preemptible" => Market::Spot,
        "OnDemand" if spot_marked => Market::Spot,
        "OnDemand" => Market::OnDemand,
        _ => return None, // commitments
    };
    Some((component, market))
}

/// A SKU's current hourly price in nano-dollars per unit: the last entry of its pricing
/// timeline (chronological), in the component's usage unit, its first tier, in US dollars,
/// above zero.
pub(super) fn current_price_nanos(sku: &Sku, unit: &str) -> Option<i64> {
    let expr = sku.pricing_info.last()?.pricing_expression.as_ref()?;
    if expr.usage_unit != unit {
        return None;
    }
    let money = expr
        .tiered_rates
        .iter()
        .find(|r| r.start_usage_amount <= 0.0)?
        .unit_price
        .as_ref()?;
    if !money.currency_code.is_empty() && money.currency_code != "USD" {
        return None;
    }
    let nanos = money
        .units
        .checked_mul(1_000_000_000)?
        .checked_add(i64::from(money.nanos))?;
    (nanos > 0).then_some(nanos)
}

/// Component prices from the billing catalog, in nano-dollars per unit-hour, by component,
/// market and region.
#[derive(Debug, Default)]
pub(super) struct SkuPrices(pub(super) HashMap<(Component, Market, String), i64>);

impl SkuPrices {
    /// Takes what a SKU prices, if anything. Two SKUs for the same component, market and
    /// region (which Google does not publish) keep the lower price, whatever their order.
    pub(super) fn add(&mut self, sku: &Sku) {
        let Some((component, market)) = classify(sku) else {
            return;
        };
        let Some(price) = current_price_nanos(sku, component.usage_unit()) else {
            tracing::debug!(
                sku = %sku.sku_id, description = %sku.description,
                "GCP billing SKU without a usable hourly USD price; ignored"
            );
            return;
        };
        for region in &sku.service_regions {
            self.0
                .entry((component, market, region.clone()))
                .and_modify(|p| *p = (*p).min(price))
                .or_insert(price);
        }
    }

    /// The whole VM of a catalog row on a market, per hour: the sum of its components, rounded
    /// once to the micro-dollar. Else the SKUs that are missing, named for the log.
    pub(super) fn vm_price(&self, row: &CatalogRow, market: Market) -> Result<Micros, Vec<String>> {
        let parts = components(row)?;
        let mib = (row.memory_gib * 1024.0).round() as i128;
        // In nano-dollars × 1024, so that memory in MiB is exact.
        let mut total: i128 = 0;
        let mut missing = Vec::new();
        for (component, quantity) in parts {
            let Some(&price) = self.0.get(&(component, market, row.region.to_string())) else {
                missing.push(format!("{} ({market}, {})", component.name(), row.region));
                continue;
            };
            total += match component {
                Component::Ram(_) => i128::from(price) * mib,
                Component::Core(_) | Component::Gpu(_) => {
                    i128::from(price) * i128::from(quantity) * 1024
                }
            };
        }
        if !missing.is_empty() {
            return Err(missing);
        }
        let micros = (total + 512_000) / 1_024_000;
        match i64::try_from(micros) {
            Ok(m) if m > 0 => Ok(Micros(m)),
            _ => Err(vec![format!(
                "an out-of-range sum for {}",
                row.instance_type
            )]),
        }
    }
}

/// The machine series of a machine type, by its name.
pub(super) fn series(machine_type: &str) -> Option<Series> {
    let mut parts = machine_type.split('-');
    let family = parts.next()?;
    Some(match (family, parts.next()?) {
        ("n1", _) => Series::N1,
        ("a2", _) => Series::A2,
        ("a3", "highgpu") => Series::A3High,
        ("a3", "megagpu") => Series::A3Mega,
        ("a3", "ultragpu") => Series::A3Ultra,
        ("a4", "highgpu") => Series::A4,
        ("g2", _) => Series::G2,
        ("g4", _) => Series::G4,
        _ => return None,
    })
}

/// The GPU SKU of a row's GPUs on a machine series.
fn gpu_sku(series: Series, model: GpuModel) -> Option<GpuSku> {
    Some(match (series, model) {
        (Series::N1, GpuModel::T4) => GpuSku::T4,
        (Series::N1, GpuModel::V100_16GB) => GpuSku::V100,
        (Series::N1, GpuModel::P100) => GpuSku::P100,
        (Series::A2, GpuModel::A100_40GB) => GpuSku::A100,
        (Series::A2, GpuModel::A100_80GB) => GpuSku::A100_80,
        (Series::A3High, GpuModel::H100_80GB) => GpuSku::H100,
        (Series::A3Mega, GpuModel::H100_80GB) => GpuSku::H100Mega,
        (Series::A3Ultra, GpuModel::H200_141GB) => GpuSku::H200,
        (Series::A4, GpuModel::B200_180GB) => GpuSku::B200Slice,
        (Series::G2, GpuModel::L4) => GpuSku::L4,
        (Series::G4, GpuModel::RtxPro6000) => GpuSku::RtxPro6000,
        _ => return None,
    })
}

/// The components a row is billed for, with the number of vCPUs or GPUs (memory is the row's,
/// in MiB); the reason for the log when its machine type or GPU is not one spotplane prices
/// from SKUs.
fn components(row: &CatalogRow) -> Result<Vec<(Component, u32)>, Vec<String>> {
    let unknown = || {
        vec![format!(
            "no SKU mapping for {} with {}",
            row.instance_type,
            row.gpu_model.map_or("no GPU", |m| m.name())
        )]
    };
    let Some(s) = series(&row.instance_type) else {
        return Err(unknown());
    };
    let gpu = match row.gpu_model {
        Some(m) if row.gpu_count > 0 => Some(gpu_sku(s, m).ok_or_else(unknown)?),
        _ => None,
    };
    if s == Series::A4 {
        // The slice carries the vCPUs and memory.
        return match gpu {
            Some(g) => Ok(vec![(Component::Gpu(g), row.gpu_count)]),
            None => Err(unknown()),
        };
    }
    let mut parts = vec![(Component::Core(s), row.vcpus), (Component::Ram(s), 0)];
    if let Some(g) = gpu {
        parts.push((Component::Gpu(g), row.gpu_count));
    }
    Ok(parts)
}
