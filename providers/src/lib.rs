//! Cloud providers behind one narrow trait.
//!
//! [`CloudProvider`] is everything the control plane asks of a cloud: what capacity is offered
//! and at what price, buy one node, give one back, say what exists, and report interruptions.
//! Each method's contract is in its doc comment; errors are a [`ProviderError`] the capacity
//! planner branches on, never strings. Implementations: `sim` (the embedded default, replaying
//! real spot traces), and `aws`, `gcp`, `azure` behind cargo features of the same names.
//! Metrics, retries and rate limits are decorators around the trait, not provider code.

#[cfg(feature = "aws")]
pub mod aws;
#[cfg(feature = "azure")]
pub mod azure;
pub mod catalog;
pub mod clock;
pub mod config;
pub mod decorators;
#[cfg(feature = "gcp")]
pub mod gcp;
pub mod registry;
pub mod sim;

/// The tags (AWS, Azure) and labels (GCP, sanitized to its rules) every instance carries.
pub mod tags {
    /// The control plane's cluster name: what the orphan sweeper lists by.
    pub const CLUSTER: &str = "spotplane-cluster";
    /// The node id the instance was bought for.
    pub const NODE_ID: &str = "spotplane-node-id";
    /// The team whose demand bought it.
    pub const TEAM: &str = "spotplane-team";
    /// Set on a node bought to replace another (consolidation): the node it replaces, which is
    /// drained once this one is ready.
    pub const REPLACES: &str = "spotplane-replaces";
}

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use spotplane_core::{Cloud, GpuModel, Market, Micros, NodeId};

/// Capacity a provider offers: one instance type in one zone on one market.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Offer {
    pub cloud: Cloud,
    // Shared, not copied: offers are cloned into every poll, plan and request.
    pub region: Arc<str>,
    pub zone: Arc<str>,
    pub instance_type: Arc<str>,
    pub market: Market,
    pub gpu_model: Option<GpuModel>,
    pub gpu_count: u32,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// Price now, per hour.
    pub price: Micros,
    /// The on-demand price of the same instance type in the same region, per hour.
    pub on_demand_price: Micros,
    /// AWS spot placement score (1–3) or an equivalent, where the cloud publishes one.
    pub placement_score: Option<f64>,
    /// Interruption-frequency bucket (`<5%`, `5-10%`, ...), where the cloud publishes one.
    pub interruption_bucket: Option<Arc<str>>,
    /// Where `price` came from.
    #[serde(default)]
    pub price_source: PriceSource,
    /// Where `on_demand_price` came from.
    #[serde(default)]
    pub on_demand_source: PriceSource,
}

/// Where a price of an [`Offer`] came from, so a user can tell a quote from a fallback.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PriceSource {
    /// The cloud's price API, read for this offer (EC2 spot price history, the AWS Price
    /// List, the Cloud Billing Catalog, Azure Retail Prices); a simulated cloud's own market.
    Live,
    /// The built-in catalog (or `catalog.dir`): the price API could not be read, or had no
    /// price for this instance type in this region.
    #[default]
    Catalog,
}

impl PriceSource {
    pub fn as_str(self) -> &'static str {
        match self {
            PriceSource::Live => "live",
            PriceSource::Catalog => "catalog",
        }
    }
}

impl Offer {
    /// A stable key: the same capacity has the same id across polls.
    pub fn id(&self) -> String {
        format!(
            "{}/{}/{}/{}/{}",
            self.cloud, self.region, self.zone, self.instance_type, self.market
        )
    }
}

/// A capacity pool: one instance type in one zone on one market (what an [`Offer`] sells).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolRef<'a> {
    pub region: &'a str,
    pub zone: &'a str,
    pub instance_type: &'a str,
    pub market: Market,
}

/// A pool's price from a moment on, as the cloud reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriceChange {
    pub at: DateTime<Utc>,
    /// What an instance of the pool costs per hour from `at` (the spot price on spot).
    pub price: Micros,
    /// The on-demand price of the same instance type in the same region from `at`.
    pub on_demand_price: Micros,
}

/// What to buy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProvisionRequest {
    pub node_id: NodeId,
    pub offer: Offer,
    /// Makes the call idempotent: the same token never buys a second instance
    /// (EC2 ClientToken, GCE requestId, a deterministic Azure VM name).
    pub client_token: String,
    /// Tags/labels every instance carries: the cluster, the node id, the team.
    pub tags: BTreeMap<String, String>,
    /// Startup script/user data that installs and starts the node agent.
    pub user_data: Option<String>,
}

/// An instance as the cloud reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    /// The cloud's id (`i-0abc…`, the GCE instance name, the Azure VM resource id).
    pub provider_id: String,
    pub node_id: Option<NodeId>,
    pub zone: String,
    pub instance_type: String,
    pub market: Market,
    pub state: InstanceState,
    pub launched_at: Option<DateTime<Utc>>,
    /// When it ended, where the cloud says (the simulated clouds do; the real ones' listings
    /// carry no such time, and their nodes are billed to when the control plane saw the end).
    #[serde(default)]
    pub ended_at: Option<DateTime<Utc>>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    Pending,
    Running,
    Stopping,
    Stopped,
    Terminating,
    Terminated,
}

/// An interruption the cloud announced through its own event stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InterruptionEvent {
    pub provider_id: String,
    pub kind: InterruptionKind,
    /// When the instance will be taken, if the cloud said.
    pub deadline: Option<DateTime<Utc>>,
    pub observed_at: DateTime<Utc>,
}

/// What an interruption means; the same type the agent's notices map to.
pub use spotplane_core::notice::InterruptionKind;

/// Failures the planner branches on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// No capacity for this offer now (`InsufficientInstanceCapacity`, `ZONE_RESOURCE_POOL_EXHAUSTED`,
    /// `SkuNotAvailable`): mark the offer unavailable for a while and try the next.
    #[error("insufficient capacity for {offer_id}: {message}")]
    InsufficientCapacity { offer_id: String, message: String },
    /// An account quota or limit is reached (`MaxSpotInstanceCountExceeded`, `QUOTA_EXCEEDED`).
    #[error("quota exceeded: {0}")]
    Quota(String),
    /// The spot price is above the maximum we offered (`SpotMaxPriceTooLow`).
    #[error("spot price above our maximum: {0}")]
    PriceTooLow(String),
    /// Slow down; try again after the given time.
    #[error("throttled; retry after {retry_after:?}")]
    Throttled { retry_after: Duration },
    /// Credentials are missing, expired or lack a permission.
    #[error("not authorized: {0}")]
    Auth(String),
    #[error("not found: {0}")]
    NotFound(String),
    /// A request the cloud refuses as malformed: a bug on our side or bad configuration.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Network trouble or a 5xx: retry.
    #[error("transient: {0}")]
    Transient(String),
}

impl ProviderError {
    /// Whether trying the same call again later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ProviderError::Throttled { .. } | ProviderError::Transient(_)
        )
    }

    /// A short, stable name for metrics labels and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderError::InsufficientCapacity { .. } => "insufficient_capacity",
            ProviderError::Quota(_) => "quota",
            ProviderError::PriceTooLow(_) => "price_too_low",
            ProviderError::Throttled { .. } => "throttled",
            ProviderError::Auth(_) => "auth",
            ProviderError::NotFound(_) => "not_found",
            ProviderError::InvalidRequest(_) => "invalid_request",
            ProviderError::Transient(_) => "transient",
        }
    }
}

/// One cloud account, in the regions it is configured for.
#[async_trait]
pub trait CloudProvider: Send + Sync {
    /// Which cloud this is.
    fn cloud(&self) -> Cloud;

    /// Offers in the configured regions, spot and on-demand, with current prices and capacity
    /// signals. May be served from a cache no older than the provider's price refresh period.
    async fn list_offers(&self) -> Result<Vec<Offer>, ProviderError>;

    /// Buys one instance for `req.offer`. Idempotent by `req.client_token`: repeating a
    /// request returns the instance the first call created. The instance carries `req.tags`.
    async fn provision(&self, req: &ProvisionRequest) -> Result<Instance, ProviderError>;

    /// Gives an instance back. Idempotent: an instance already gone is success.
    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError>;

    /// Every instance carrying `tags` (all of them must match), in any state but long gone.
    /// Used to reconcile the store with the cloud and to find orphans to terminate.
    async fn list_instances(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<Instance>, ProviderError>;

    /// Interruption events the cloud published since the last call (AWS: the EventBridge SQS
    /// queue). Clouds without such a stream return nothing; their notices come from the
    /// node agents. A message may be delivered twice; callers deduplicate.
    async fn drain_interruptions(&self) -> Result<Vec<InterruptionEvent>, ProviderError>;

    /// The price of one pool over `[from, to)`: the price in force at `from`, then every change
    /// before `to`, oldest first. For clouds that publish a price history (AWS
    /// `DescribeSpotPriceHistory`; the simulated clouds, exactly); `Ok(None)` where the cloud has
    /// none, and the cost ledger then prices with the prices it polls. Read-only, safe to repeat.
    async fn price_history(
        &self,
        _pool: &PoolRef<'_>,
        _from: DateTime<Utc>,
        _to: DateTime<Utc>,
    ) -> Result<Option<Vec<PriceChange>>, ProviderError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offer_ids_are_stable_and_readable() {
        let o = Offer {
            cloud: Cloud::Aws,
            region: "us-east-1".into(),
            zone: "use1-az1".into(),
            instance_type: "p4d.24xlarge".into(),
            market: Market::Spot,
            gpu_model: Some(GpuModel::A100_40GB),
            gpu_count: 8,
            vcpus: 96,
            memory_mib: 1_179_648,
            price: Micros::parse_usd("9.8318").expect("price"),
            on_demand_price: Micros::parse_usd("32.7726").expect("price"),
            placement_score: Some(2.0),
            interruption_bucket: Some("<5%".into()),
            price_source: PriceSource::Catalog,
            on_demand_source: PriceSource::Catalog,
        };
        assert_eq!(o.id(), "aws/us-east-1/use1-az1/p4d.24xlarge/spot");
    }

    #[test]
    fn only_throttling_and_transient_errors_are_retryable() {
        assert!(ProviderError::Transient("reset".into()).is_retryable());
        assert!(
            ProviderError::Throttled {
                retry_after: Duration::from_secs(1)
            }
            .is_retryable()
        );
        assert!(!ProviderError::Quota("vCPU".into()).is_retryable());
        assert!(
            !ProviderError::InsufficientCapacity {
                offer_id: "x".into(),
                message: "none".into()
            }
            .is_retryable()
        );
    }
}
