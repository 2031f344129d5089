//! What the configured providers offer now: gathered from all of them, filtered and ranked.

use std::fmt::Write as _;

use serde::Serialize;
use spotplane_core::{GpuModel, Market, Micros};
use spotplane_providers::Offer;
use spotplane_providers::registry::Providers;

/// Which offers to keep.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OfferFilter {
    pub gpu: Option<GpuModel>,
    pub market: Option<Market>,
    pub min_gpus: u32,
    /// Rank by the price of one GPU-hour rather than the node-hour.
    pub per_gpu: bool,
}

/// The offers of every provider, and the providers that could not be asked.
#[derive(Debug, Default, Serialize)]
pub struct Gathered {
    pub offers: Vec<Offer>,
    pub failures: Vec<(String, String)>,
}

/// Asks every provider at once; a failing provider is reported, not fatal.
pub async fn gather(providers: &Providers) -> Gathered {
    let calls = providers
        .all
        .iter()
        .map(|p| async move { (p.cloud(), p.list_offers().await) });
    let mut out = Gathered::default();
    for (cloud, result) in futures::future::join_all(calls).await {
        match result {
            Ok(mut offers) => out.offers.append(&mut offers),
            Err(e) => out.failures.push((cloud.to_string(), e.to_string())),
        }
    }
    out
}

/// Price of one GPU-hour.
pub fn per_gpu_price(o: &Offer) -> Micros {
    Micros(o.price.0 / i64::from(o.gpu_count.max(1)))
}

/// Filters and ranks, cheapest first; ties by cloud, region, zone, type, so output is stable.
pub fn select(mut offers: Vec<Offer>, f: &OfferFilter) -> Vec<Offer> {
    offers.retain(|o| {
        f.gpu.is_none_or(|g| o.gpu_model == Some(g))
            && f.market.is_none_or(|m| o.market == m)
            && o.gpu_count >= f.min_gpus
    });
    let key = |o: &Offer| if f.per_gpu { per_gpu_price(o) } else { o.price };
    offers.sort_by(|a, b| key(a).cmp(&key(b)).then_with(|| a.id().cmp(&b.id())));
    offers
}

/// A table for people.
pub fn table(offers: &[Offer]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<6} {:<16} {:<22} {:<26} {:<9} {:<10} {:>4} {:>11} {:>11} {:>9} {:>6}  {:<10} PRICES",
        "CLOUD",
        "REGION",
        "ZONE",
        "INSTANCE TYPE",
        "MARKET",
        "GPU",
        "GPUS",
        "$/HOUR",
        "$/GPU-HOUR",
        "SAVES",
        "SCORE",
        "INTERRUPTS",
    );
    for o in offers {
        let saves = if o.on_demand_price.0 > 0 && o.market == Market::Spot {
            format!(
                "{:.0}%",
                100.0 * (1.0 - o.price.0 as f64 / o.on_demand_price.0 as f64)
            )
        } else {
            "-".into()
        };
        let _ = writeln!(
            s,
            "{:<6} {:<16} {:<22} {:<26} {:<9} {:<10} {:>4} {:>11} {:>11} {:>9} {:>6}  {:<10} {}",
            o.cloud.to_string(),
            o.region,
            o.zone,
            o.instance_type,
            o.market.to_string(),
            o.gpu_model.map(|m| m.name()).unwrap_or("-"),
            o.gpu_count,
            dollars(o.price),
            dollars(per_gpu_price(o)),
            saves,
            o.placement_score
                .map(|p| format!("{p}"))
                .unwrap_or_else(|| "-".into()),
            o.interruption_bucket.as_deref().unwrap_or("-"),
            prices_from(o),
        );
    }
    s
}

/// Where the offer's prices came from: one word when both agree, else `price/on-demand`.
fn prices_from(o: &Offer) -> String {
    if o.price_source == o.on_demand_source {
        o.price_source.as_str().to_owned()
    } else {
        format!(
            "{}/{}",
            o.price_source.as_str(),
            o.on_demand_source.as_str()
        )
    }
}

fn dollars(m: Micros) -> String {
    format!("{:.4}", m.0 as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spotplane_core::Cloud;

    fn offer(cloud: Cloud, itype: &str, market: Market, gpus: u32, usd: &str) -> Offer {
        Offer {
            cloud,
            region: "r".into(),
            zone: "z".into(),
            instance_type: itype.into(),
            market,
            gpu_model: Some(GpuModel::H100_80GB),
            gpu_count: gpus,
            vcpus: 8,
            memory_mib: 1024,
            price: Micros::parse_usd(usd).expect("price"),
            on_demand_price: Micros::parse_usd("100").expect("price"),
            placement_score: None,
            interruption_bucket: None,
            price_source: spotplane_providers::PriceSource::Catalog,
            on_demand_source: spotplane_providers::PriceSource::Catalog,
        }
    }

    #[test]
    fn cheapest_first_by_node_or_by_gpu_hour() {
        let offers = vec![
            offer(Cloud::Aws, "eight", Market::Spot, 8, "16"),
            offer(Cloud::Gcp, "one", Market::Spot, 1, "3"),
            offer(Cloud::Azure, "one-od", Market::OnDemand, 1, "5"),
        ];
        let by_node: Vec<_> = select(offers.clone(), &OfferFilter::default())
            .into_iter()
            .map(|o| o.instance_type.to_string())
            .collect();
        assert_eq!(by_node, ["one", "one-od", "eight"]);
        let f = OfferFilter {
            per_gpu: true,
            ..OfferFilter::default()
        };
        let by_gpu: Vec<_> = select(offers.clone(), &f)
            .into_iter()
            .map(|o| o.instance_type.to_string())
            .collect();
        assert_eq!(by_gpu, ["eight", "one", "one-od"]);
        let f = OfferFilter {
            market: Some(Market::OnDemand),
            ..OfferFilter::default()
        };
        assert_eq!(select(offers.clone(), &f).len(), 1);
        let f = OfferFilter {
            min_gpus: 4,
            ..OfferFilter::default()
        };
        assert_eq!(select(offers, &f).len(), 1);
    }

    #[test]
    fn the_table_shows_the_saving_against_on_demand() {
        let t = table(&[offer(Cloud::Aws, "p5.48xlarge", Market::Spot, 8, "25")]);
        assert!(t.contains("75%"), "{t}");
        assert!(t.contains("25.0000") && t.contains("3.1250"), "{t}");
        assert!(t.contains(" catalog\n"), "where the prices are from: {t}");
        let mut live = offer(Cloud::Aws, "p5.48xlarge", Market::Spot, 8, "25");
        live.price_source = spotplane_providers::PriceSource::Live;
        assert!(table(&[live]).contains(" live/catalog\n"));
    }
}
