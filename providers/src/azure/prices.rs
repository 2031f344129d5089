//! Live Linux VM prices from the Azure Retail Prices API (public, unauthenticated).
//!
//! `GET {endpoint}/api/retail/prices?api-version=2023-01-01-preview&$filter=…` answers
//! `{"Items": [...], "NextPageLink": "…" | null}`, 100 items a page. One VM size in one region
//! has several meters; the ones read here are `type == "Consumption"` priced per `1 Hour`,
//! Linux (a `productName` without "Windows"), and either spot (`skuName` ending " Spot") or
//! on-demand (neither " Spot" nor the retired " Low Priority"). When a meter has more than one
//! price, the one with the latest `effectiveStartDate` counts.

use std::collections::BTreeMap;

use reqwest::Url;
use serde::Deserialize;
use spotplane_core::Micros;
use spotplane_core::money::MoneyError;

/// Azure's public Retail Prices endpoint.
pub const PUBLIC_PRICES: &str = "https://prices.azure.com";
pub const PRICES_API_VERSION: &str = "2023-01-01-preview";

/// Pages followed at most per query (a region's GPU sizes are a few pages).
const MAX_PAGES: usize = 50;
/// Sizes per query: the `$filter` stays well inside URL length limits.
const SIZES_PER_QUERY: usize = 10;

/// The prices of one VM size in one region, per hour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SizePrices {
    pub on_demand: Option<Micros>,
    pub spot: Option<Micros>,
}

/// Reads prices; stateless besides the HTTP client.
pub struct RetailPrices {
    http: reqwest::Client,
    endpoint: Url,
}

impl RetailPrices {
    pub fn new(http: reqwest::Client, endpoint: &str) -> Result<Self, String> {
        let endpoint = Url::parse(endpoint.trim_end_matches('/'))
            .map_err(|e| format!("prices endpoint {endpoint}: {e}"))?;
        Ok(RetailPrices { http, endpoint })
    }

    /// Prices of `sizes` (ARM names, e.g. `Standard_NC24ads_A100_v4`) in `region`, keyed by the
    /// size as given. Sizes the API does not price are absent. Any failure fails the whole
    /// region: the caller falls back to the catalog for it.
    pub async fn region(
        &self,
        region: &str,
        sizes: &[&str],
    ) -> Result<BTreeMap<String, SizePrices>, String> {
        let mut best: BTreeMap<String, Best> = BTreeMap::new();
        for chunk in sizes.chunks(SIZES_PER_QUERY) {
            let mut url = self.first_page(region, chunk)?;
            let mut pages = 0;
            loop {
                pages += 1;
                let page = self.page(url).await?;
                for item in page.items {
                    let Some(size) = chunk
                        .iter()
                        .find(|s| s.eq_ignore_ascii_case(&item.arm_sku_name))
                    else {
                        continue;
                    };
                    if !item.arm_region_name.eq_ignore_ascii_case(region) {
                        continue;
                    }
                    if let Some((market, price)) = item.classify()? {
                        best.entry((*size).to_owned()).or_default().offer(
                            market,
                            price,
                            &item.effective_start_date,
                        );
                    }
                }
                match page.next_page_link.filter(|l| !l.is_empty()) {
                    None => break,
                    Some(_) if pages >= MAX_PAGES => {
                        return Err(format!("more than {MAX_PAGES} pages of prices"));
                    }
                    Some(link) => url = self.follow(&link)?,
                }
            }
        }
        Ok(best
            .into_iter()
            .map(|(size, b)| {
                (
                    size,
                    SizePrices {
                        on_demand: b.on_demand.map(|(p, _)| p),
                        spot: b.spot.map(|(p, _)| p),
                    },
                )
            })
            .collect())
    }

    fn first_page(&self, region: &str, sizes: &[&str]) -> Result<Url, String> {
        let skus: Vec<String> = sizes
            .iter()
            .map(|s| format!("armSkuName eq '{}'", odata_quote(s)))
            .collect();
        let filter = format!(
            "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and armRegionName eq '{}' and ({})",
            odata_quote(region),
            skus.join(" or ")
        );
        let base = self.endpoint.as_str().trim_end_matches('/');
        let mut url =
            Url::parse(&format!("{base}/api/retail/prices")).map_err(|e| e.to_string())?;
        url.query_pairs_mut()
            .append_pair("api-version", PRICES_API_VERSION)
            .append_pair("$filter", &filter);
        Ok(url)
    }

    /// `NextPageLink` is absolute; it is followed only on the configured endpoint.
    fn follow(&self, link: &str) -> Result<Url, String> {
        let url = Url::parse(link).map_err(|e| format!("NextPageLink {link}: {e}"))?;
        if url.origin() != self.endpoint.origin() {
            return Err(format!("NextPageLink {link} leaves {}", self.endpoint));
        }
        Ok(url)
    }

    async fn page(&self, url: Url) -> Result<PricePage, String> {
        let resp = self.http.get(url).send().await.map_err(|e| e.to_string())?;
        let status = resp.status();
        if !status.is_success() {
            return Err(format!("HTTP {status}"));
        }
        resp.json::<PricePage>().await.map_err(|e| e.to_string())
    }
}

/// The best price seen so far for each market, with its `effectiveStartDate`.
#[derive(Default)]
struct Best {
    on_demand: Option<(Micros, String)>,
    spot: Option<(Micros, String)>,
}

impl Best {
    fn offer(&mut self, market: PriceMarket, price: Micros, since: &str) {
        let slot = match market {
            PriceMarket::OnDemand => &mut self.on_demand,
            PriceMarket::Spot => &mut self.spot,
        };
        // RFC 3339 timestamps in one format compare as strings; on a tie, the lower price.
        let newer = match slot {
            None => true,
            Some((p, s)) => since > s.as_str() || (since == s.as_str() && price < *p),
        };
        if newer {
            *slot = Some((price, since.to_owned()));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PriceMarket {
    OnDemand,
    Spot,
}

#[derive(Debug, Deserialize)]
struct PricePage {
    #[serde(rename = "Items", default)]
    items: Vec<PriceItem>,
    #[serde(rename = "NextPageLink", default)]
    next_page_link: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PriceItem {
    #[serde(default)]
    arm_sku_name: String,
    #[serde(default)]
    arm_region_name: String,
    retail_price: f64,
    #[serde(default)]
    unit_of_measure: String,
    #[serde(default)]
    sku_name: String,
    #[serde(default)]
    product_name: String,
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    effective_start_date: String,
}

impl PriceItem {
    /// Which market this meter prices, if it is a Linux hourly consumption meter.
    fn classify(&self) -> Result<Option<(PriceMarket, Micros)>, String> {
        if self.kind != "Consumption"
            || self.unit_of_measure != "1 Hour"
            || self.product_name.contains("Windows")
            || self.sku_name.ends_with(" Low Priority")
            || self.retail_price <= 0.0
        {
            return Ok(None);
        }
        let market = if self.sku_name.ends_with(" Spot") {
            PriceMarket::Spot
        } else {
            PriceMarket::OnDemand
        };
        let price = micros_from_json(self.retail_price).map_err(|e| {
            format!(
                "{} retailPrice {}: {e}",
                self.arm_sku_name, self.retail_price
            )
        })?;
        Ok(Some((market, price)))
    }
}

/// A JSON price as micro-dollars. serde_json reads the number into the nearest `f64`; its
/// shortest round-trip text is the JSON text for any price written with up to 15 significant
/// digits, and that text is parsed exactly. A price finer than a micro-dollar is rounded half
/// away from zero, once, on the decimal digits.
pub fn micros_from_json(v: f64) -> Result<Micros, MoneyError> {
    if !v.is_finite() {
        return Err(MoneyError::NotFinite);
    }
    // `Display` for f64 never uses an exponent: "0.0000052", not "5.2e-6".
    let text = v.to_string();
    match Micros::parse_usd(&text) {
        Err(MoneyError::TooPrecise) => round_to_micros(&text),
        other => other,
    }
}

fn round_to_micros(text: &str) -> Result<Micros, MoneyError> {
    let (neg, t) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    let kept = &frac[..frac.len().min(6)];
    let round_up = frac.as_bytes().get(6).is_some_and(|d| *d >= b'5');
    let truncated = Micros::parse_usd(&format!("{int}.{kept}"))?;
    let magnitude = if round_up {
        truncated
            .checked_add(Micros(1))
            .ok_or(MoneyError::OutOfRange)?
    } else {
        truncated
    };
    Ok(if neg { -magnitude } else { magnitude })
}

/// Doubles single quotes, OData's escape inside a string literal.
fn odata_quote(s: &str) -> String {
    s.replace('\'', "''")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_prices_become_exact_micros_and_finer_ones_round_once() {
        assert_eq!(micros_from_json(0.176346), Ok(Micros(176_346)));
        assert_eq!(micros_from_json(3.673), Ok(Micros(3_673_000)));
        assert_eq!(micros_from_json(27.197), Ok(Micros(27_197_000)));
        assert_eq!(micros_from_json(0.1), Ok(Micros(100_000)));
        assert_eq!(micros_from_json(1.2345675), Ok(Micros(1_234_568)));
        assert_eq!(micros_from_json(1.2345674), Ok(Micros(1_234_567)));
        assert_eq!(micros_from_json(0.0000052), Ok(Micros(5)));
        assert_eq!(micros_from_json(f64::NAN), Err(MoneyError::NotFinite));
    }
}
