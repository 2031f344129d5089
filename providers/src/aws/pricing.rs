//! On-demand prices from the AWS Price List Query API (`GetProducts` on service `AmazonEC2`),
//! through aws-sdk-pricing.
//!
//! EC2 has no on-demand price call of its own; the Price List is where AWS publishes them. A
//! region's prices are read with one filter set, every page: `regionCode`, Linux with no
//! pre-installed software, shared tenancy, `capacitystatus = Used` (the price of running an
//! instance, not of a reservation's unused capacity) and the instance types asked for
//! (`ANY_OF`). Each answer is a JSON document per product (its attributes and its terms, AWS's
//! "Price List file" shape); the hourly USD rate of its `OnDemand` term is the price. A
//! document that does not read is logged and skipped, never a failed call.
//!
//! The Price List Query API is served from `us-east-1` (also `eu-central-1` and `ap-south-1`)
//! and answers for every region, so one client serves all the configured regions.

use std::collections::HashMap;

use async_trait::async_trait;
use serde::Deserialize;
use spotplane_core::Micros;

use crate::ProviderError;

/// The Price List calls spotplane makes.
#[async_trait]
pub trait PricingApi: Send + Sync {
    /// One page of `GetProducts`: EC2's Linux on-demand products of `types` in `region`, and
    /// the token of the next page.
    async fn products_page(
        &self,
        region: &str,
        types: &[String],
        next_token: Option<String>,
    ) -> Result<(Vec<String>, Option<String>), ProviderError>;
}

/// The most pages one read takes (100 products each): a region has fewer than a thousand
/// instance types, so more means the filters did not apply.
const MAX_PAGES: usize = 50;

/// The attribute filters of a price read, as `(field, value)`; the instance types are added
/// with `ANY_OF`.
pub const FILTERS: [(&str, &str); 4] = [
    ("operatingSystem", "Linux"),
    ("preInstalledSw", "NA"),
    ("tenancy", "Shared"),
    ("capacitystatus", "Used"),
];

/// The on-demand price per hour of each of `types` in `region` that the Price List has. A type
/// it has no product for is absent from the answer.
pub async fn on_demand_prices(
    api: &dyn PricingApi,
    region: &str,
    types: &[String],
) -> Result<HashMap<String, Micros>, ProviderError> {
    let mut prices = HashMap::new();
    if types.is_empty() {
        return Ok(prices);
    }
    let mut token = None;
    for _ in 0..MAX_PAGES {
        let (docs, next) = api.products_page(region, types, token).await?;
        for doc in &docs {
            match parse_product(doc, region) {
                Ok(Some((t, price))) if types.contains(&t) => {
                    // Two products for one type (a duplicate listing) keep the lower rate.
                    prices
                        .entry(t)
                        .and_modify(|p: &mut Micros| *p = (*p).min(price))
                        .or_insert(price);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(region, error = %e, "a Price List product does not read; skipped")
                }
            }
        }
        match next {
            Some(t) if !t.is_empty() => token = Some(t),
            _ => return Ok(prices),
        }
    }
    Err(ProviderError::Transient(format!(
        "GetProducts: more than {MAX_PAGES} pages for {region}"
    )))
}

/// A Price List product document (the part read).
#[derive(Debug, Deserialize)]
struct Product {
    product: ProductInfo,
    #[serde(default)]
    terms: Terms,
}

#[derive(Debug, Deserialize)]
struct ProductInfo {
    #[serde(default)]
    attributes: HashMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
struct Terms {
    #[serde(rename = "OnDemand", default)]
    on_demand: HashMap<String, Term>,
}

#[derive(Debug, Deserialize)]
struct Term {
    #[serde(rename = "priceDimensions", default)]
    price_dimensions: HashMap<String, PriceDimension>,
}

#[derive(Debug, Deserialize)]
struct PriceDimension {
    #[serde(default)]
    unit: String,
    #[serde(rename = "beginRange", default)]
    begin_range: String,
    #[serde(rename = "pricePerUnit", default)]
    price_per_unit: HashMap<String, String>,
}

/// The instance type and hourly on-demand rate of one product document, or `None` when the
/// product is not a Linux, shared, used-capacity instance of `region` with an hourly USD rate.
pub fn parse_product(doc: &str, region: &str) -> Result<Option<(String, Micros)>, String> {
    let p: Product = serde_json::from_str(doc).map_err(|e| format!("not a product: {e}"))?;
    let attr = |k: &str| p.product.attributes.get(k).map(String::as_str);
    let Some(instance_type) = attr("instanceType") else {
        return Ok(None);
    };
    if attr("regionCode").is_some_and(|r| r != region)
        || FILTERS
            .iter()
            .any(|(k, v)| attr(k).is_some_and(|a| a != *v))
    {
        return Ok(None);
    }
    let rate = p
        .terms
        .on_demand
        .values()
        .flat_map(|t| t.price_dimensions.values())
        .filter(|d| d.unit == "Hrs" && matches!(d.begin_range.as_str(), "" | "0"))
        .find_map(|d| d.price_per_unit.get("USD"));
    let Some(rate) = rate else {
        return Ok(None);
    };
    let price = Micros::parse_usd(rate.trim())
        .map_err(|e| format!("{instance_type}: price {rate:?}: {e}"))?;
    // A zero rate is a placeholder listing, not a price to compare savings with.
    Ok((price.0 > 0).then(|| (instance_type.to_owned(), price)))
}

/// The Price List through aws-sdk-pricing.
pub struct SdkPricing(pub aws_sdk_pricing::Client);

#[async_trait]
impl PricingApi for SdkPricing {
    async fn products_page(
        &self,
        region: &str,
        types: &[String],
        next_token: Option<String>,
    ) -> Result<(Vec<String>, Option<String>), ProviderError> {
        use aws_sdk_pricing::types::{Filter, FilterType};
        let filter = |kind: FilterType, field: &str, value: &str| {
            Filter::builder()
                .r#type(kind)
                .field(field)
                .value(value)
                .build()
                .map_err(|e| ProviderError::InvalidRequest(format!("GetProducts filter: {e}")))
        };
        let mut req = self
            .0
            .get_products()
            .service_code("AmazonEC2")
            .format_version("aws_v1")
            .max_results(100)
            .filters(filter(FilterType::TermMatch, "regionCode", region)?)
            .filters(filter(FilterType::AnyOf, "instanceType", &types.join(","))?)
            .set_next_token(next_token);
        for (field, value) in FILTERS {
            req = req.filters(filter(FilterType::TermMatch, field, value)?);
        }
        let out = req
            .send()
            .await
            .map_err(|e| super::sdk::sdk_error("GetProducts", e))?;
        Ok((
            out.price_list().to_vec(),
            out.next_token().map(str::to_owned),
        ))
    }
}
