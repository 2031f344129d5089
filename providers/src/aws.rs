//! `aws`: EC2 through aws-sdk-ec2, interruptions through EventBridge → SQS with aws-sdk-sqs.
//!
//! The SDK is narrowed to [`Ec2Api`] and [`QueueApi`], the handful of calls spotplane makes, so
//! the provider logic (offers, provisioning, event routing) reads without SDK builders in the
//! way and a test can stand in for a region. [`SdkEc2`] and [`SdkQueue`] are the real ones.
//!
//! - Offers: `DescribeSpotPriceHistory` from now (the price in effect now, per zone), paginated,
//!   the latest point per (zone, type) kept; `DescribeInstanceTypes` for vCPUs, memory and GPUs
//!   of types the catalog does not know; on-demand prices come from the catalog (EC2 has no
//!   on-demand price call; the Pricing API is a separate service). Zones are named by their
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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types as ec2t;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use spotplane_core::{Cloud, GpuModel, Market, Micros, NodeId};

use crate::catalog::CatalogRow;
use crate::clock::{SharedClock, SystemClock};
use crate::config::{AwsConfig, AwsLaunchApi};
use crate::{
    CloudProvider, Instance, InstanceState, InterruptionEvent, InterruptionKind, Offer,
    ProviderError, ProvisionRequest, tags,
};

/// How long listed offers are served from memory.
const OFFER_TTL: Duration = Duration::from_secs(300);
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
}

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
        Self::with_apis(cfg.clone(), catalog, regions, queue).await
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
        })
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
                let Some(on_demand) = row.map(|r| r.price) else {
                    // Without an on-demand price there is nothing to compare savings with.
                    tracing::debug!(instance_type = %t, "no on-demand price in the catalog; not offered");
                    continue;
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
                };
                let zone_name = region.zone_name_of.get(&zone);
                let spot = zone_name
                    .and_then(|n| latest.get(&(n.clone(), t.clone())))
                    .map(|p| p.price)
                    .or_else(|| row.and_then(|r| r.spot_price));
                if let Some(price) = spot {
                    offers.push(Offer {
                        market: Market::Spot,
                        price,
                        placement_score: row.and_then(|r| r.placement_score),
                        interruption_bucket: row.and_then(|r| r.interruption_bucket.clone()),
                        ..base.clone()
                    });
                }
                offers.push(base);
            }
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

/// What a queue message means.
#[derive(Debug, Clone, PartialEq)]
pub enum Routed {
    Events(Vec<InterruptionEvent>),
    /// A kind we do not act on; the reason is logged.
    Ignored(&'static str),
}

/// A message that is not a well-formed event of a kind we know.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("not an EventBridge event: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{detail_type}: {message}")]
    Detail {
        detail_type: String,
        message: String,
    },
}

#[derive(Deserialize)]
struct Envelope {
    source: String,
    #[serde(rename = "detail-type")]
    detail_type: String,
    time: DateTime<Utc>,
    #[serde(default)]
    detail: serde_json::Value,
}

#[derive(Deserialize)]
struct InstanceDetail {
    #[serde(rename = "instance-id")]
    instance_id: String,
    #[serde(default)]
    state: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HealthDetail {
    #[serde(default)]
    service: String,
    #[serde(default)]
    event_type_category: String,
    #[serde(default)]
    start_time: Option<String>,
    #[serde(default)]
    affected_entities: Vec<HealthEntity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HealthEntity {
    entity_value: String,
}

/// Routes one EventBridge message on (source, detail-type) — REFERENCE.md "AWS interruption
/// events". `now` stamps when we saw it.
pub fn parse_event(body: &str, now: DateTime<Utc>) -> Result<Routed, EventError> {
    let env: Envelope = serde_json::from_str(body)?;
    let detail_err = |e: serde_json::Error| EventError::Detail {
        detail_type: env.detail_type.clone(),
        message: e.to_string(),
    };
    let one = |kind, deadline| -> Result<Routed, EventError> {
        let d: InstanceDetail = serde_json::from_value(env.detail.clone()).map_err(detail_err)?;
        Ok(Routed::Events(vec![InterruptionEvent {
            provider_id: d.instance_id,
            kind,
            deadline,
            observed_at: now,
        }]))
    };
    match (env.source.as_str(), env.detail_type.as_str()) {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning") => {
            one(InterruptionKind::Preemption, Some(env.time + SPOT_NOTICE))
        }
        ("aws.ec2", "EC2 Instance Rebalance Recommendation") => {
            one(InterruptionKind::Rebalance, None)
        }
        ("aws.ec2", "EC2 Instance State-change Notification") => {
            let d: InstanceDetail =
                serde_json::from_value(env.detail.clone()).map_err(detail_err)?;
            match d.state.as_deref() {
                Some("stopping" | "stopped" | "shutting-down" | "terminated") => {
                    Ok(Routed::Events(vec![InterruptionEvent {
                        provider_id: d.instance_id,
                        kind: InterruptionKind::Stopped,
                        deadline: Some(env.time),
                        observed_at: now,
                    }]))
                }
                Some(_) => Ok(Routed::Ignored("a state change we do not act on")),
                None => Err(EventError::Detail {
                    detail_type: env.detail_type.clone(),
                    message: "no detail.state".into(),
                }),
            }
        }
        ("aws.health", "AWS Health Event") => {
            let d: HealthDetail = serde_json::from_value(env.detail.clone()).map_err(detail_err)?;
            if d.service != "EC2" || d.event_type_category != "scheduledChange" {
                return Ok(Routed::Ignored(
                    "a health event that is not an EC2 scheduled change",
                ));
            }
            let deadline = d.start_time.as_deref().and_then(parse_health_time);
            Ok(Routed::Events(
                d.affected_entities
                    .into_iter()
                    .filter(|e| e.entity_value.starts_with("i-"))
                    .map(|e| InterruptionEvent {
                        provider_id: e.entity_value,
                        kind: InterruptionKind::Maintenance,
                        deadline,
                        observed_at: now,
                    })
                    .collect(),
            ))
        }
        _ => Ok(Routed::Ignored("an event kind we do not know")),
    }
}

/// AWS Health writes times as RFC 2822-like `Wed, 30 Nov 2026 08:00:00 GMT` or RFC 3339.
fn parse_health_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .or_else(|_| DateTime::parse_from_rfc2822(s))
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

// ---------------------------------------------------------------------------------------------
// The SDK behind the narrow traits.

/// EC2 through aws-sdk-ec2.
pub struct SdkEc2(pub aws_sdk_ec2::Client);

/// The interruption queue through aws-sdk-sqs.
pub struct SdkQueue {
    pub client: aws_sdk_sqs::Client,
    pub url: String,
}

/// Maps an SDK failure to what the planner branches on.
fn sdk_error<E, R>(op: &str, e: SdkError<E, R>) -> ProviderError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match &e {
        SdkError::ServiceError(s) => {
            let err = s.err();
            let code = err.code().unwrap_or("Unknown");
            let message = format!("{op}: {code}: {}", err.message().unwrap_or(""));
            code_error(code, message)
        }
        SdkError::ConstructionFailure(_) => {
            ProviderError::InvalidRequest(format!("{op}: {}", aws_smithy_display(&e)))
        }
        _ => ProviderError::Transient(format!("{op}: {}", aws_smithy_display(&e))),
    }
}

fn aws_smithy_display<E: std::error::Error + 'static>(e: &E) -> String {
    // The SDK's Display is terse ("dispatch failure"); the sources say why.
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// EC2 error codes (docs: "Error codes for the Amazon EC2 API").
fn code_error(code: &str, message: String) -> ProviderError {
    match code {
        "InsufficientInstanceCapacity"
        | "InsufficientCapacity"
        | "InsufficientHostCapacity"
        | "InsufficientReservedInstanceCapacity"
        | "Unsupported" => ProviderError::InsufficientCapacity {
            offer_id: String::new(),
            message,
        },
        "MaxSpotInstanceCountExceeded"
        | "InstanceLimitExceeded"
        | "VcpuLimitExceeded"
        | "MaxSpotFleetRequestCountExceeded"
        | "ResourceLimitExceeded" => ProviderError::Quota(message),
        "SpotMaxPriceTooLow" => ProviderError::PriceTooLow(message),
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" | "RequestThrottled" => {
            ProviderError::Throttled {
                retry_after: Duration::from_secs(1),
            }
        }
        "AuthFailure"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "ExpiredToken"
        | "SignatureDoesNotMatch"
        | "OptInRequired"
        | "AccessDenied"
        | "AccessDeniedException" => ProviderError::Auth(message),
        c if c.ends_with(".NotFound") || c == "AWS.SimpleQueueService.NonExistentQueue" => {
            ProviderError::NotFound(message)
        }
        "InternalError" | "InternalFailure" | "ServiceUnavailable" | "Unavailable" => {
            ProviderError::Transient(message)
        }
        _ => ProviderError::InvalidRequest(message),
    }
}

fn ec2_tags(tags: &BTreeMap<String, String>) -> Vec<ec2t::Tag> {
    tags.iter()
        .map(|(k, v)| ec2t::Tag::builder().key(k).value(v).build())
        .collect()
}

fn tag_spec(kind: ec2t::ResourceType, tags: &BTreeMap<String, String>) -> ec2t::TagSpecification {
    ec2t::TagSpecification::builder()
        .resource_type(kind)
        .set_tags(Some(ec2_tags(tags)))
        .build()
}

fn smithy_time(t: &aws_sdk_ec2::primitives::DateTime) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.secs(), t.subsec_nanos())
}

fn state_of(name: Option<&ec2t::InstanceStateName>) -> InstanceState {
    use ec2t::InstanceStateName as S;
    match name {
        Some(S::Pending) => InstanceState::Pending,
        Some(S::Running) => InstanceState::Running,
        Some(S::Stopping) => InstanceState::Stopping,
        Some(S::Stopped) => InstanceState::Stopped,
        Some(S::ShuttingDown) => InstanceState::Terminating,
        Some(S::Terminated) => InstanceState::Terminated,
        _ => InstanceState::Pending,
    }
}

fn from_sdk_instance(i: &ec2t::Instance) -> Option<Ec2Instance> {
    Some(Ec2Instance {
        id: i.instance_id()?.to_owned(),
        zone_name: i
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default()
            .to_owned(),
        instance_type: i
            .instance_type()
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default(),
        spot: i.instance_lifecycle() == Some(&ec2t::InstanceLifecycleType::Spot),
        state: state_of(i.state().and_then(|s| s.name())),
        launched_at: i.launch_time().and_then(smithy_time),
        tags: i
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?.to_owned(), t.value()?.to_owned())))
            .collect(),
    })
}

/// Maps an EC2 GPU (`NVIDIA`, `A100`, 40960 MiB) to our model.
fn gpu_model_of(name: &str, memory_mib: Option<i32>) -> Option<GpuModel> {
    if let Some(mib) = memory_mib {
        let with_memory = format!("{name}-{}GB", (mib + 512) / 1024);
        if let Ok(m) = with_memory.parse() {
            return Some(m);
        }
    }
    name.parse().ok()
}

#[async_trait]
impl Ec2Api for SdkEc2 {
    async fn availability_zones(&self) -> Result<Vec<(String, String)>, ProviderError> {
        let out = self
            .0
            .describe_availability_zones()
            .send()
            .await
            .map_err(|e| sdk_error("DescribeAvailabilityZones", e))?;
        Ok(out
            .availability_zones()
            .iter()
            .filter_map(|z| Some((z.zone_name()?.to_owned(), z.zone_id()?.to_owned())))
            .collect())
    }

    async fn spot_prices(
        &self,
        types: &[String],
        now: DateTime<Utc>,
    ) -> Result<Vec<SpotPricePoint>, ProviderError> {
        // From now: EC2 answers with the price in effect at the start time, per zone.
        let mut pages = self
            .0
            .describe_spot_price_history()
            .set_instance_types(Some(
                types
                    .iter()
                    .map(|t| ec2t::InstanceType::from(t.as_str()))
                    .collect(),
            ))
            .product_descriptions(PRODUCT)
            .start_time(aws_sdk_ec2::primitives::DateTime::from_secs(
                now.timestamp(),
            ))
            .into_paginator()
            .send();
        let mut points = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error("DescribeSpotPriceHistory", e))?;
            for p in page.spot_price_history() {
                let (Some(zone), Some(ty), Some(price), Some(at)) = (
                    p.availability_zone(),
                    p.instance_type(),
                    p.spot_price(),
                    p.timestamp().and_then(smithy_time),
                ) else {
                    continue;
                };
                match Micros::parse_usd(price) {
                    Ok(price) => points.push(SpotPricePoint {
                        zone_name: zone.to_owned(),
                        instance_type: ty.as_str().to_owned(),
                        price,
                        at,
                    }),
                    Err(e) => tracing::warn!(price, error = %e, "unreadable spot price skipped"),
                }
            }
        }
        Ok(points)
    }

    async fn instance_types(
        &self,
        types: &[String],
    ) -> Result<Vec<InstanceTypeInfo>, ProviderError> {
        let mut pages = self
            .0
            .describe_instance_types()
            .set_instance_types(Some(
                types
                    .iter()
                    .map(|t| ec2t::InstanceType::from(t.as_str()))
                    .collect(),
            ))
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error("DescribeInstanceTypes", e))?;
            for t in page.instance_types() {
                let Some(ty) = t.instance_type() else {
                    continue;
                };
                let gpus = t.gpu_info().map(|g| g.gpus()).unwrap_or_default();
                let gpu_count: i32 = gpus.iter().filter_map(|g| g.count()).sum();
                let gpu_model = gpus.first().and_then(|g| {
                    gpu_model_of(g.name()?, g.memory_info().and_then(|m| m.size_in_mib()))
                });
                out.push(InstanceTypeInfo {
                    instance_type: ty.as_str().to_owned(),
                    vcpus: t
                        .v_cpu_info()
                        .and_then(|v| v.default_v_cpus())
                        .and_then(|v| u32::try_from(v).ok())
                        .unwrap_or(0),
                    memory_mib: t
                        .memory_info()
                        .and_then(|m| m.size_in_mib())
                        .and_then(|m| u64::try_from(m).ok())
                        .unwrap_or(0),
                    gpu_model,
                    gpu_count: u32::try_from(gpu_count).unwrap_or(0),
                });
            }
        }
        Ok(out)
    }

    async fn launch(&self, spec: &LaunchSpec) -> Result<String, ProviderError> {
        let user_data = spec
            .user_data
            .as_ref()
            .map(|u| base64::engine::general_purpose::STANDARD.encode(u));
        // IMDSv2 only: the node agent asks for a token first.
        let imds = ec2t::LaunchTemplateInstanceMetadataOptionsRequest::builder()
            .http_tokens(ec2t::LaunchTemplateHttpTokensState::Required)
            .http_endpoint(ec2t::LaunchTemplateInstanceMetadataEndpointState::Enabled)
            .build();
        match spec.api {
            AwsLaunchApi::RunInstances => {
                let mut call = self
                    .0
                    .run_instances()
                    .image_id(&spec.image_id)
                    .instance_type(ec2t::InstanceType::from(spec.instance_type.as_str()))
                    .min_count(1)
                    .max_count(1)
                    .client_token(&spec.client_token)
                    .placement(
                        ec2t::Placement::builder()
                            .availability_zone(&spec.zone_name)
                            .build(),
                    )
                    .metadata_options(
                        ec2t::InstanceMetadataOptionsRequest::builder()
                            .http_tokens(ec2t::HttpTokensState::Required)
                            .http_endpoint(ec2t::InstanceMetadataEndpointState::Enabled)
                            .build(),
                    )
                    .tag_specifications(tag_spec(ec2t::ResourceType::Instance, &spec.tags))
                    .set_subnet_id(spec.subnet_id.clone())
                    .set_user_data(user_data)
                    .set_security_group_ids(if spec.security_group_ids.is_empty() {
                        None
                    } else {
                        Some(spec.security_group_ids.clone())
                    });
                if let Some(profile) = &spec.instance_profile {
                    call = call.iam_instance_profile(
                        ec2t::IamInstanceProfileSpecification::builder()
                            .name(profile)
                            .build(),
                    );
                }
                if spec.market == Market::Spot {
                    call = call.instance_market_options(
                        ec2t::InstanceMarketOptionsRequest::builder()
                            .market_type(ec2t::MarketType::Spot)
                            .spot_options(
                                ec2t::SpotMarketOptions::builder()
                                    .spot_instance_type(ec2t::SpotInstanceType::OneTime)
                                    .instance_interruption_behavior(
                                        ec2t::InstanceInterruptionBehavior::Terminate,
                                    )
                                    .build(),
                            )
                            .build(),
                    );
                }
                let out = call
                    .send()
                    .await
                    .map_err(|e| sdk_error("RunInstances", e))?;
                out.instances()
                    .first()
                    .and_then(|i| i.instance_id())
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        ProviderError::Transient("RunInstances returned no instance".into())
                    })
            }
            AwsLaunchApi::CreateFleet => {
                let template = spec.template_name();
                let mut data = ec2t::RequestLaunchTemplateData::builder()
                    .image_id(&spec.image_id)
                    .metadata_options(imds)
                    .set_user_data(user_data)
                    .set_security_group_ids(if spec.security_group_ids.is_empty() {
                        None
                    } else {
                        Some(spec.security_group_ids.clone())
                    });
                if let Some(profile) = &spec.instance_profile {
                    data = data.iam_instance_profile(
                        ec2t::LaunchTemplateIamInstanceProfileSpecificationRequest::builder()
                            .name(profile)
                            .build(),
                    );
                }
                let created = self
                    .0
                    .create_launch_template()
                    .launch_template_name(&template)
                    .launch_template_data(data.build())
                    .send()
                    .await;
                match created {
                    Ok(_) => {}
                    Err(SdkError::ServiceError(s))
                        if s.err().code()
                            == Some("InvalidLaunchTemplateName.AlreadyExistsException") => {}
                    Err(e) => return Err(sdk_error("CreateLaunchTemplate", e)),
                }
                let spot = spec.market == Market::Spot;
                let capacity = ec2t::TargetCapacitySpecificationRequest::builder()
                    .total_target_capacity(1)
                    .default_target_capacity_type(if spot {
                        ec2t::DefaultTargetCapacityType::Spot
                    } else {
                        ec2t::DefaultTargetCapacityType::OnDemand
                    })
                    .build();
                let mut overrides = ec2t::FleetLaunchTemplateOverridesRequest::builder()
                    .instance_type(ec2t::InstanceType::from(spec.instance_type.as_str()))
                    .availability_zone(&spec.zone_name);
                if let Some(subnet) = &spec.subnet_id {
                    overrides = overrides.subnet_id(subnet);
                }
                let mut call = self
                    .0
                    .create_fleet()
                    .r#type(ec2t::FleetType::Instant)
                    .client_token(&spec.client_token)
                    .target_capacity_specification(capacity)
                    .launch_template_configs(
                        ec2t::FleetLaunchTemplateConfigRequest::builder()
                            .launch_template_specification(
                                ec2t::FleetLaunchTemplateSpecificationRequest::builder()
                                    .launch_template_name(&template)
                                    .version("$Latest")
                                    .build(),
                            )
                            .overrides(overrides.build())
                            .build(),
                    )
                    .tag_specifications(tag_spec(ec2t::ResourceType::Instance, &spec.tags));
                call = if spot {
                    call.spot_options(
                        ec2t::SpotOptionsRequest::builder()
                            .allocation_strategy(
                                ec2t::SpotAllocationStrategy::PriceCapacityOptimized,
                            )
                            .build(),
                    )
                } else {
                    call.on_demand_options(
                        ec2t::OnDemandOptionsRequest::builder()
                            .allocation_strategy(ec2t::FleetOnDemandAllocationStrategy::LowestPrice)
                            .build(),
                    )
                };
                let out = call.send().await.map_err(|e| sdk_error("CreateFleet", e))?;
                if let Some(id) = out.instances().iter().flat_map(|i| i.instance_ids()).next() {
                    return Ok(id.clone());
                }
                // An instant fleet reports launch failures in the response, not as an error.
                Err(match out.errors().first() {
                    Some(e) => code_error(
                        e.error_code().unwrap_or("Unknown"),
                        format!(
                            "CreateFleet: {}: {}",
                            e.error_code().unwrap_or("Unknown"),
                            e.error_message().unwrap_or("")
                        ),
                    ),
                    None => ProviderError::Transient("CreateFleet launched nothing".into()),
                })
            }
        }
    }

    async fn terminate(&self, ids: &[String]) -> Result<(), ProviderError> {
        self.0
            .terminate_instances()
            .set_instance_ids(Some(ids.to_vec()))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sdk_error("TerminateInstances", e))
    }

    async fn instances_by_tags(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<Ec2Instance>, ProviderError> {
        let filters = tags
            .iter()
            .map(|(k, v)| {
                ec2t::Filter::builder()
                    .name(format!("tag:{k}"))
                    .values(v)
                    .build()
            })
            .collect();
        self.describe(self.0.describe_instances().set_filters(Some(filters)))
            .await
    }

    async fn instances_by_id(&self, ids: &[String]) -> Result<Vec<Ec2Instance>, ProviderError> {
        self.describe(
            self.0
                .describe_instances()
                .set_instance_ids(Some(ids.to_vec())),
        )
        .await
    }
}

impl SdkEc2 {
    async fn describe(
        &self,
        call: aws_sdk_ec2::operation::describe_instances::builders::DescribeInstancesFluentBuilder,
    ) -> Result<Vec<Ec2Instance>, ProviderError> {
        let mut pages = call.into_paginator().send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error("DescribeInstances", e))?;
            for r in page.reservations() {
                out.extend(r.instances().iter().filter_map(from_sdk_instance));
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl QueueApi for SdkQueue {
    async fn receive(&self) -> Result<Vec<QueueMessage>, ProviderError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(10)
            .wait_time_seconds(0)
            .send()
            .await
            .map_err(|e| sdk_error("ReceiveMessage", e))?;
        Ok(out
            .messages()
            .iter()
            .filter_map(|m| {
                Some(QueueMessage {
                    body: m.body()?.to_owned(),
                    receipt_handle: m.receipt_handle()?.to_owned(),
                })
            })
            .collect())
    }

    async fn delete(&self, receipt_handle: &str) -> Result<(), ProviderError> {
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(receipt_handle)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sdk_error("DeleteMessage", e))
    }
}

#[cfg(test)]
mod tests;
