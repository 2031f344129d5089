//! `aws`: EC2 through aws-sdk-ec2, interruptions through EventBridge → SQS with aws-sdk-sqs.
//!
//! The SDK is narrowed to [`Ec2Api`] and [`QueueApi`], the handful of calls spotplane makes, so
//! the provider logic (offers, provisioning, event routing) reads without SDK builders in the
//! way and a test can stand in for a region. [`SdkEc2`] and [`SdkQueue`] are the real ones.
//!
//! - Offers: `DescribeSpotPriceHistory` from now (the price in effect now, per zone), paginated,
//!   the latest point per (zone, type) kept; `DescribeInstanceTypes` for vCPUs, memory and GPUs
//!   of types the catalog does not know; on-demand prices from the Price List Query API
//!   (`pricing.rs`; EC2 has no on-demand price call), cached for a day, with the catalog's
//!   price where the Price List has none or cannot be read (logged, and the offer's
//!   `on_demand_source` says `catalog`). A type with neither is not offered: there is nothing
//!   to measure its saving against. Zones are named by their
//!   account-independent AZ id (`use1-az1`), as in the catalog, mapped from and to the
//!   account's AZ names with `DescribeAvailabilityZones`.
//! - Provisioning: `CreateFleet` `instant` with `price-capacity-optimized` (from a launch template
//!   kept per image/user data/security groups/profile), or `RunInstances` with spot market
//!   options; `ClientToken` makes both idempotent; tags go on the instance at launch.
//!   IMDSv2 is required on every node (the agent speaks it).
//! - Interruptions: the four EventBridge kinds of REFERENCE.md, routed on (source, detail-type);
//!   everything received is deleted once handled, malformed and unknown messages included
//!   (logged), so the queue never clogs; duplicates are harmless because callers deduplicate.
//!
//! The SDK's own retries are off: retrying is the decorators' job ([`crate::decorators`]).
//!
//! This file is the provider over the traits; `events.rs` routes the queue's EventBridge
//! messages, `pricing.rs` reads the Price List, and `sdk.rs` is [`SdkEc2`] and [`SdkQueue`]
//! with the SDK errors' mapping.

mod events;
pub mod pricing;
mod sdk;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use spotplane_core::{Cloud, GpuModel, Market, Micros, NodeId};
use tokio::time::Instant;

use crate::catalog::CatalogRow;
use crate::clock::{SharedClock, SystemClock};
use crate::config::{AwsConfig, AwsLaunchApi};
use crate::{
    CloudProvider, Instance, InstanceState, InterruptionEvent, Offer, PriceSource, ProviderError,
    ProvisionRequest, tags,
};
pub use events::{EventError, Routed, parse_event};
pub use pricing::{PricingApi, SdkPricing};
pub use sdk::{SdkEc2, SdkQueue};

/// How long listed offers are served from memory.
const OFFER_TTL: Duration = Duration::from_secs(300);
/// How long a region's Price List prices are kept: AWS changes on-demand prices a few times a
/// year, and a read is tens of pages.
const PRICE_LIST_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a failed Price List read leaves a region on catalog prices before the next try.
const PRICE_LIST_RETRY: Duration = Duration::from_secs(600);
/// AWS's spot interruption notice: the instance is taken two minutes after the warning.
const SPOT_NOTICE: chrono::Duration = chrono::Duration::seconds(120);
/// The operating system whose spot prices we read.
const PRODUCT: &str = "Linux/UNIX";
/// Batches of messages read per drain, at most ten each (SQS's maximum).
const MAX_BATCHES: usize = 10;

/// The EC2 calls spotplane makes, in one region.
#[async_trait]
pub trait Ec2Api: Send + Sync {
    /// `(name, id)` of every availability zone of the region (`us-east-1a`, `use1-az4`).
    async fn availability_zones(&self) -> Result<Vec<(String, String)>, ProviderError>;
    /// The spot price in effect now of each type in each zone name (all pages).
    /// The spot prices in force at `now` (the price history from `now` on).
    async fn spot_prices(
        &self,
        types: &[String],
        now: DateTime<Utc>,
    ) -> Result<Vec<SpotPricePoint>, ProviderError>;
    /// vCPUs, memory and GPUs of instance types.
    async fn instance_types(
        &self,
        types: &[String],
    ) -> Result<Vec<InstanceTypeInfo>, ProviderError>;
    /// Launches one instance; returns its id.
    async fn launch(&self, spec: &LaunchSpec) -> Result<String, ProviderError>;
    /// Terminates instances; an id that does not exist is `NotFound`.
    async fn terminate(&self, ids: &[String]) -> Result<(), ProviderError>;
    /// Instances carrying every tag (all pages).
    async fn instances_by_tags(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<Ec2Instance>, ProviderError>;
    /// Instances by id.
    async fn instances_by_id(&self, ids: &[String]) -> Result<Vec<Ec2Instance>, ProviderError>;
}

/// The SQS calls of the interruption queue.
#[async_trait]
pub trait QueueApi: Send + Sync {
    /// Up to ten messages, without waiting.
    async fn receive(&self) -> Result<Vec<QueueMessage>, ProviderError>;
    async fn delete(&self, receipt_handle: &str) -> Result<(), ProviderError>;
}

#[derive(Debug, Clone, PartialEq)]
pub struct SpotPricePoint {
    pub zone_name: String,
    pub instance_type: String,
    pub price: Micros,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InstanceTypeInfo {
    pub instance_type: String,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub gpu_model: Option<GpuModel>,
    pub gpu_count: u32,
}

/// One launch, in the SDK's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchSpec {
    pub api: AwsLaunchApi,
    pub instance_type: String,
    pub zone_name: String,
    pub market: Market,
    pub client_token: String,
    pub image_id: String,
    pub subnet_id: Option<String>,
    pub security_group_ids: Vec<String>,
    pub instance_profile: Option<String>,
    pub user_data: Option<String>,
    pub tags: BTreeMap<String, String>,
}

impl LaunchSpec {
    /// The launch template CreateFleet uses: one per distinct node template, reused.
    fn template_name(&self) -> String {
        let mut h = Sha256::new();
        for part in [
            self.image_id.as_str(),
            self.user_data.as_deref().unwrap_or(""),
            self.instance_profile.as_deref().unwrap_or(""),
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        for sg in &self.security_group_ids {
            h.update(sg.as_bytes());
            h.update([0]);
        }
        format!("spotplane-{}", &hex::encode(h.finalize())[..20])
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Ec2Instance {
    pub id: String,
    pub zone_name: String,
    pub instance_type: String,
    pub spot: bool,
    pub state: InstanceState,
    pub launched_at: Option<DateTime<Utc>>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct QueueMessage {
    pub body: String,
    pub receipt_handle: String,
}

/// One region's clients and its zone names ↔ ids.
struct Region {
    name: String,
    ec2: Box<dyn Ec2Api>,
    zone_id_of: HashMap<String, String>,
    zone_name_of: HashMap<String, String>,
}

/// An AWS account in the configured regions.
pub struct AwsProvider {
    cfg: AwsConfig,
    regions: Vec<Region>,
    queue: Option<Box<dyn QueueApi>>,
    catalog: Vec<CatalogRow>,
    cache: Mutex<Option<(Instant, Vec<Offer>)>>,
    clock: SharedClock,
    pricing: Option<Box<dyn PricingApi>>,
    /// Per region: when its prices were read, for how long they hold, and the on-demand
    /// price of each type read.
    on_demand: tokio::sync::Mutex<HashMap<String, ListedPrices>>,
}

type ListedPrices = (Instant, Duration, HashMap<String, Micros>);

impl std::fmt::Debug for AwsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsProvider")
            .field("regions", &self.cfg.regions)
            .finish()
    }
}

impl AwsProvider {
    /// Builds the SDK clients from the standard credential chain (environment, profile, SSO,
    /// instance role), one per configured region, and reads each region's zones.
    pub async fn from_config(
        cfg: &AwsConfig,
        catalog: Vec<CatalogRow>,
    ) -> Result<Self, ProviderError> {
        let mut regions: Vec<(String, Box<dyn Ec2Api>)> = Vec::new();
        let mut queue: Option<Box<dyn QueueApi>> = None;
        for name in &cfg.regions {
            // The SDK's own retries off (its default is 3 attempts per call): the `Retrying`
            // decorator retries every cloud call, so one policy decides how often and how long,
            // instead of 3 attempts inside each of its own (as for GCP).
            let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .region(aws_config::Region::new(name.clone()))
                .retry_config(aws_config::retry::RetryConfig::disabled());
            if let Some(url) = &cfg.endpoint_url {
                loader = loader.endpoint_url(url);
            }
            let sdk = loader.load().await;
            regions.push((
                name.clone(),
                Box::new(SdkEc2(aws_sdk_ec2::Client::new(&sdk))),
            ));
            if queue.is_none()
                && let Some(url) = &cfg.interruption_queue_url
                && queue_region(url).is_none_or(|r| r == name)
            {
                queue = Some(Box::new(SdkQueue {
                    client: aws_sdk_sqs::Client::new(&sdk),
                    url: url.clone(),
                }));
            }
        }
        let provider = Self::with_apis(cfg.clone(), catalog, regions, queue).await?;
        if !cfg.price_list {
            return Ok(provider);
        }
        // One client for every region: the Price List answers for all of them from its own.
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(cfg.price_list_region.clone()))
            .retry_config(aws_config::retry::RetryConfig::disabled());
        if let Some(url) = cfg
            .price_list_endpoint_url
            .as_ref()
            .or(cfg.endpoint_url.as_ref())
        {
            loader = loader.endpoint_url(url);
        }
        let pricing = SdkPricing(aws_sdk_pricing::Client::new(&loader.load().await));
        Ok(provider.with_pricing(Box::new(pricing)))
    }

    /// Builds the provider on given API implementations.
    pub async fn with_apis(
        cfg: AwsConfig,
        catalog: Vec<CatalogRow>,
        apis: Vec<(String, Box<dyn Ec2Api>)>,
        queue: Option<Box<dyn QueueApi>>,
    ) -> Result<Self, ProviderError> {
        let mut regions = Vec::with_capacity(apis.len());
        for (name, ec2) in apis {
            let zones = ec2.availability_zones().await?;
            regions.push(Region {
                zone_id_of: zones.iter().cloned().collect(),
                zone_name_of: zones.into_iter().map(|(n, i)| (i, n)).collect(),
                name,
                ec2,
            });
        }
        Ok(AwsProvider {
            cfg,
            regions,
            queue,
            catalog: catalog.into_iter().filter(|r| r.gpu_count > 0).collect(),
            cache: Mutex::new(None),
            clock: Arc::new(SystemClock),
            pricing: None,
            on_demand: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Reads on-demand prices from `pricing` (the Price List) instead of the catalog alone.
    pub fn with_pricing(mut self, pricing: Box<dyn PricingApi>) -> Self {
        self.pricing = Some(pricing);
        self
    }

    /// The Price List's on-demand prices of `types` in `region`, from the cache while fresh.
    /// Empty (catalog prices) without a Price List or when it cannot be read.
    async fn on_demand_in(&self, region: &str, types: &[String]) -> HashMap<String, Micros> {
        let Some(api) = &self.pricing else {
            return HashMap::new();
        };
        let mut cache = self.on_demand.lock().await;
        if let Some((at, ttl, prices)) = cache.get(region)
            && at.elapsed() < *ttl
        {
            return prices.clone();
        }
        let (ttl, prices) = match pricing::on_demand_prices(api.as_ref(), region, types).await {
            Ok(p) => (PRICE_LIST_TTL, p),
            Err(e) => {
                // The last prices read are nearer the truth than the catalog: kept, and the
                // Price List asked again sooner.
                let kept = cache.remove(region).map(|(_, _, p)| p).unwrap_or_default();
                tracing::warn!(
                    region, error = %e, kept = kept.len(),
                    "the AWS Price List cannot be read; the last prices read are kept, the catalog's for the rest"
                );
                (PRICE_LIST_RETRY, kept)
            }
        };
        cache.insert(region.to_owned(), (Instant::now(), ttl, prices.clone()));
        prices
    }

    /// Reads the time from `clock` (the registry gives the control plane's).
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The instance types offered in a region: the configured ones, else the catalog's.
    fn types_in(&self, region: &str) -> Vec<String> {
        if !self.cfg.instance_types.is_empty() {
            return self.cfg.instance_types.clone();
        }
        let mut t: Vec<String> = self
            .catalog
            .iter()
            .filter(|r| &*r.region == region)
            .map(|r| r.instance_type.to_string())
            .collect();
        t.sort();
        t.dedup();
        t
    }

    async fn offers_in(&self, region: &Region) -> Result<Vec<Offer>, ProviderError> {
        let types = self.types_in(&region.name);
        if types.is_empty() {
            return Ok(Vec::new());
        }
        let in_catalog = |t: &str, zone_id: Option<&str>| {
            self.catalog.iter().find(|r| {
                *r.region == *region.name
                    && &*r.instance_type == t
                    && zone_id.is_none_or(|z| &*r.zone == z)
            })
        };
        // What the catalog does not describe, EC2 does.
        let unknown: Vec<String> = types
            .iter()
            .filter(|t| in_catalog(t, None).is_none())
            .cloned()
            .collect();
        let described: HashMap<String, InstanceTypeInfo> = if unknown.is_empty() {
            HashMap::new()
        } else {
            region
                .ec2
                .instance_types(&unknown)
                .await?
                .into_iter()
                .map(|i| (i.instance_type.clone(), i))
                .collect()
        };
        let live: Vec<SpotPricePoint> = match region.ec2.spot_prices(&types, self.clock.now()).await
        {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(region = %region.name, error = %e, "spot prices unavailable; using the catalog's");
                Vec::new()
            }
        };
        let latest = latest_per_zone(live);
        let listed = self.on_demand_in(&region.name, &types).await;
        let mut from_catalog: Vec<&str> = Vec::new();

        let mut offers = Vec::new();
        for t in &types {
            // Zones where the type is sold: where EC2 quotes a spot price, else the catalog's.
            let mut zones: Vec<String> = latest
                .keys()
                .filter(|(_, ty)| ty == t)
                .filter_map(|(zone_name, _)| region.zone_id_of.get(zone_name).cloned())
                .collect();
            if zones.is_empty() {
                zones = self
                    .catalog
                    .iter()
                    .filter(|r| *r.region == *region.name && &*r.instance_type == t)
                    .map(|r| r.zone.to_string())
                    .collect();
            }
            zones.sort();
            zones.dedup();
            for zone in zones {
                let row = in_catalog(t, Some(&zone)).or_else(|| in_catalog(t, None));
                let (gpu_model, gpu_count, vcpus, memory_mib) = match (row, described.get(t)) {
                    (Some(r), _) => (
                        r.gpu_model,
                        r.gpu_count,
                        r.vcpus,
                        (r.memory_gib * 1024.0).round() as u64,
                    ),
                    (None, Some(i)) => (i.gpu_model, i.gpu_count, i.vcpus, i.memory_mib),
                    (None, None) => continue,
                };
                if gpu_count == 0 {
                    continue;
                }
                let (on_demand, on_demand_source) = match (listed.get(t), row) {
                    (Some(p), _) => (*p, PriceSource::Live),
                    (None, Some(r)) => {
                        if self.pricing.is_some() && !from_catalog.contains(&t.as_str()) {
                            from_catalog.push(t);
                        }
                        (r.price, PriceSource::Catalog)
                    }
                    (None, None) => {
                        // Without an on-demand price there is nothing to compare savings with.
                        tracing::warn!(region = %region.name, instance_type = %t, "no on-demand price in the Price List or the catalog; not offered");
                        continue;
                    }
                };
                let base = Offer {
                    cloud: Cloud::Aws,
                    region: region.name.as_str().into(),
                    zone: zone.as_str().into(),
                    instance_type: t.as_str().into(),
                    market: Market::OnDemand,
                    gpu_model,
                    gpu_count,
                    vcpus,
                    memory_mib,
                    price: on_demand,
                    on_demand_price: on_demand,
                    placement_score: None,
                    interruption_bucket: None,
                    price_source: on_demand_source,
                    on_demand_source,
                };
                let zone_name = region.zone_name_of.get(&zone);
                let spot = zone_name
                    .and_then(|n| latest.get(&(n.clone(), t.clone())))
                    .map(|p| (p.price, PriceSource::Live))
                    .or_else(|| {
                        row.and_then(|r| r.spot_price)
                            .map(|p| (p, PriceSource::Catalog))
                    });
                if let Some((price, price_source)) = spot {
                    offers.push(Offer {
                        market: Market::Spot,
                        price,
                        price_source,
                        placement_score: row.and_then(|r| r.placement_score),
                        interruption_bucket: row.and_then(|r| r.interruption_bucket.clone()),
                        ..base.clone()
                    });
                }
                offers.push(base);
            }
        }
        if !from_catalog.is_empty() {
            tracing::warn!(
                region = %region.name,
                instance_types = %from_catalog.join(","),
                "the AWS Price List has no on-demand price for these types; the catalog's is used"
            );
        }
        Ok(offers)
    }

    fn region_of(&self, offer: &Offer) -> Result<&Region, ProviderError> {
        self.regions
            .iter()
            .find(|r| *r.name == *offer.region)
            .ok_or_else(|| {
                ProviderError::InvalidRequest(format!(
                    "region {} is not configured for this AWS provider",
                    offer.region
                ))
            })
    }

    fn to_instance(&self, region: &Region, i: Ec2Instance) -> Instance {
        let zone = region
            .zone_id_of
            .get(&i.zone_name)
            .cloned()
            .unwrap_or(i.zone_name);
        Instance {
            node_id: i
                .tags
                .get(tags::NODE_ID)
                .and_then(|v| v.parse::<NodeId>().ok()),
            provider_id: i.id,
            zone,
            instance_type: i.instance_type,
            market: if i.spot {
                Market::Spot
            } else {
                Market::OnDemand
            },
            state: i.state,
            launched_at: i.launched_at,
            ended_at: None,
            tags: i.tags,
        }
    }
}

/// The region of an SQS queue URL (`https://sqs.us-east-1.amazonaws.com/…`), when it says.
fn queue_region(url: &str) -> Option<&str> {
    let host = url.split("://").nth(1)?.split('/').next()?;
    let mut parts = host.split('.');
    match (parts.next(), parts.next()) {
        (Some("sqs"), Some(region)) if region.contains('-') => Some(region),
        _ => None,
    }
}

/// The newest price per (zone name, instance type).
fn latest_per_zone(points: Vec<SpotPricePoint>) -> HashMap<(String, String), SpotPricePoint> {
    let mut latest: HashMap<(String, String), SpotPricePoint> = HashMap::new();
    for p in points {
        let key = (p.zone_name.clone(), p.instance_type.clone());
        match latest.get(&key) {
            Some(have) if have.at >= p.at => {}
            _ => {
                latest.insert(key, p);
            }
        }
    }
    latest
}

#[async_trait]
impl CloudProvider for AwsProvider {
    fn cloud(&self) -> Cloud {
        Cloud::Aws
    }

    async fn list_offers(&self) -> Result<Vec<Offer>, ProviderError> {
        if let Ok(cache) = self.cache.lock()
            && let Some((at, offers)) = cache.as_ref()
            && at.elapsed() < OFFER_TTL
        {
            return Ok(offers.clone());
        }
        let mut all = Vec::new();
        for region in &self.regions {
            all.extend(self.offers_in(region).await?);
        }
        if let Ok(mut cache) = self.cache.lock() {
            *cache = Some((Instant::now(), all.clone()));
        }
        Ok(all)
    }

    async fn provision(&self, req: &ProvisionRequest) -> Result<Instance, ProviderError> {
        let region = self.region_of(&req.offer)?;
        let zone_name = region
            .zone_name_of
            .get(&*req.offer.zone)
            .cloned()
            .ok_or_else(|| {
                ProviderError::InvalidRequest(format!(
                    "zone {} is not in region {}",
                    req.offer.zone, region.name
                ))
            })?;
        let spec = LaunchSpec {
            api: self.cfg.launch_api,
            instance_type: req.offer.instance_type.to_string(),
            subnet_id: self.cfg.subnets.get(&zone_name).cloned(),
            zone_name,
            market: req.offer.market,
            client_token: req.client_token.clone(),
            image_id: self.cfg.image_id.clone(),
            security_group_ids: self.cfg.security_group_ids.clone(),
            instance_profile: self.cfg.instance_profile.clone(),
            user_data: req.user_data.clone(),
            tags: req.tags.clone(),
        };
        let id = region.ec2.launch(&spec).await.map_err(|e| match e {
            // The capacity error names the offer, so the planner can set it aside.
            ProviderError::InsufficientCapacity { message, .. } => {
                ProviderError::InsufficientCapacity {
                    offer_id: req.offer.id(),
                    message,
                }
            }
            other => other,
        })?;
        let described = region.ec2.instances_by_id(std::slice::from_ref(&id)).await;
        match described.ok().and_then(|v| v.into_iter().next()) {
            Some(i) => Ok(self.to_instance(region, i)),
            // Eventual consistency: a new id may not be described yet.
            None => Ok(Instance {
                provider_id: id,
                node_id: Some(req.node_id),
                zone: req.offer.zone.to_string(),
                instance_type: req.offer.instance_type.to_string(),
                market: req.offer.market,
                state: InstanceState::Pending,
                launched_at: None,
                ended_at: None,
                tags: req.tags.clone(),
            }),
        }
    }

    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        // Instance ids are unique across regions; the one holding it answers, the others say
        // not found. Not found everywhere means already gone.
        let ids = [provider_id.to_owned()];
        for region in &self.regions {
            match region.ec2.terminate(&ids).await {
                Ok(()) => return Ok(()),
                Err(ProviderError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn list_instances(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<Instance>, ProviderError> {
        let mut out = Vec::new();
        for region in &self.regions {
            for i in region.ec2.instances_by_tags(tags).await? {
                // Filters select; this checks, so a server that filters loosely cannot make
                // us adopt or sweep someone else's instance.
                if tags.iter().all(|(k, v)| i.tags.get(k) == Some(v)) {
                    out.push(self.to_instance(region, i));
                }
            }
        }
        Ok(out)
    }

    async fn drain_interruptions(&self) -> Result<Vec<InterruptionEvent>, ProviderError> {
        let Some(queue) = &self.queue else {
            return Ok(Vec::new());
        };
        let now = self.clock.now();
        let mut events = Vec::new();
        for _ in 0..MAX_BATCHES {
            let batch = queue.receive().await?;
            if batch.is_empty() {
                break;
            }
            for m in batch {
                match parse_event(&m.body, now) {
                    Ok(Routed::Events(evs)) => events.extend(evs),
                    Ok(Routed::Ignored(why)) => {
                        tracing::debug!(reason = why, "interruption queue: message ignored");
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, body = %truncate(&m.body, 512), "interruption queue: malformed message dropped");
                    }
                }
                // Deleted whatever it was: a message we cannot use must not come back forever.
                if let Err(e) = queue.delete(&m.receipt_handle).await {
                    tracing::warn!(error = %e, "interruption queue: delete failed; the message may come again");
                }
            }
        }
        Ok(events)
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests;
