//! Google Cloud: Compute Engine GPU VMs, spot and on-demand, through Google's
//! `google-cloud-compute-v1` client, priced from the Cloud Billing Catalog through
//! `google-cloud-billing-v1`.
//!
//! # Offers and prices
//!
//! An offer is a machine type in a configured zone on one market. The machine types are
//! `machine_types` from the configuration, else every catalog row with GPUs; the shapes (vCPUs,
//! memory, GPU model and count) always come from the catalog, so a configured type without a
//! catalog row in a zone is skipped with a warning.
//!
//! Prices are read from the Cloud Billing Catalog (`CloudCatalog::list_skus` on
//! `services/6F81-5844-456A`, in US dollars, every page). Compute Engine bills a GPU VM per
//! component, so each row is priced as a whole VM, per market, from the SKUs of its region:
//! vCPUs × the machine series' core SKU + memory (GiB) × its RAM SKU + GPUs × the GPU SKU
//! (A2, A3, G2 and G4 machine types include their GPUs; N1 types get theirs attached; A4 is
//! one "GPU slice" SKU per GPU that includes its vCPUs and memory). On-demand prices come
//! from the `OnDemand` SKUs, spot prices from the Spot (`Preemptible`) SKUs: both are read,
//! neither is derived from the other. Which SKU descriptions are read, and where their names
//! were checked, is in `billing.rs`.
//!
//! Where a component SKU is missing for a row on a market, that row keeps its catalog price on
//! that market and its offer says so ([`PriceSource::Catalog`]; live ones are
//! [`PriceSource::Live`]); the missing SKUs are logged per row at debug level, and summed up in
//! one warning per refresh. When the billing call fails, or prices nothing at all, every row
//! keeps its catalog prices and a warning is logged: `list_offers` never fails for want of
//! prices. Offers are cached for [`PRICE_REFRESH`] (when none is live-priced, for
//! [`FALLBACK_REFRESH`], so a billing outage is retried sooner).
//!
//! # Provisioning
//!
//! `instances.insert` in the offer's zone, then `zoneOperations.wait` (at most
//! [`MAX_OPERATION_WAITS`] times, each up to GCE's two minutes), then `instances.get`.
//! Spot: `scheduling.provisioningModel = SPOT`, `instanceTerminationAction` from the
//! configuration, `onHostMaintenance = TERMINATE`, `automaticRestart = false`; on-demand:
//! `STANDARD`, `TERMINATE` (GPU VMs cannot live-migrate), automatic restart on. N1 machine types
//! get their GPUs as `guestAccelerators`; A2, A3, G2 and later families include them. The VM has
//! one boot disk from `source_image`, one NIC on `network`/`subnetwork` with an ephemeral
//! external IP (the default network has no Cloud NAT, and the node agent must reach the control
//! plane), the configured service account with the `cloud-platform` scope, and the request's
//! user data as the `startup-script` metadata item.
//!
//! Idempotency: the instance name is derived from the node id and GCE's `requestId` is a UUIDv5
//! of the client token, so a repeated request gets the first one's operation back, and an
//! `alreadyExists` answer means an earlier attempt created the instance: it is read and returned.
//!
//! # Identifiers
//!
//! - provider id: `zones/{zone}/instances/{name}`;
//! - instance name: `spotplane-{node id as 32 hex digits}`;
//! - labels: the request's tags, sanitized to GCE's label rules (see [`label_key`]), plus
//!   [`NODE_ID_LABEL`] with the node id, from which `list_instances` reads `node_id`.
//!
//! # Errors
//!
//! From the HTTP status and GCE's error reasons (synchronous `error.errors[].reason` or a failed
//! operation's `error.errors[].code`): `ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS]` →
//! `InsufficientCapacity`, `QUOTA_EXCEEDED`/`quotaExceeded` → `Quota` (GCE sends it as a 403),
//! `rateLimitExceeded` and 429 → `Throttled`, other 401/403 → `Auth`, 404 → `NotFound`, 400 →
//! `InvalidRequest`, 5xx and network failures → `Transient`. The SDK's own retries are off:
//! retrying is the decorators' job ([`crate::decorators`]).
//!
//! # Credentials and endpoints
//!
//! Application Default Credentials (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's ADC file, the
//! metadata server) for Compute Engine and Cloud Billing alike. `endpoint_url` and
//! `billing_endpoint_url` point the clients at other servers; `anonymous_credentials` sends no
//! credentials, for a test server.
//!
//! # Interruptions
//!
//! GCE publishes no interruption stream a provider could drain here (preemption notices reach a
//! VM through its metadata server, `instance/preempted`), so [`GcpProvider::drain_interruptions`]
//! returns nothing and the node agents report them.
//!
//! # Where it is
//!
//! This file is the provider: its configuration, the offers and their cache, provisioning,
//! termination and listing. `names.rs` holds the identifiers (instance names, request ids,
//! provider ids, labels) and the reading of an instance; `errors.rs` the mapping of GCE's
//! errors; `billing.rs` the Cloud Billing Catalog's SKUs and the VM prices summed from them.

mod billing;
mod errors;
mod names;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use google_cloud_auth::credentials::Credentials;
use google_cloud_billing_v1::client::CloudCatalog;
use google_cloud_compute_v1::client::{Instances, ZoneOperations};
use google_cloud_compute_v1::model::{
    self, AcceleratorConfig, AccessConfig, AttachedDisk, AttachedDiskInitializeParams, Metadata,
    NetworkInterface, Operation, Scheduling, ServiceAccount, access_config, operation, scheduling,
};
use google_cloud_gax::options::RequestOptionsBuilder as _;
use google_cloud_gax::paginator::Paginator as _;
use google_cloud_gax::retry_policy::NeverRetry;
use spotplane_core::{Cloud, Market, Micros};
use tokio::time::Instant;
use uuid::Uuid;

use crate::catalog::CatalogRow;
use crate::config::{GcpConfig, GcpTerminationAction};
use crate::{
    CloudProvider, Instance, InterruptionEvent, Offer, PriceSource, ProviderError, ProvisionRequest,
};
use billing::SkuPrices;
use errors::{OpOutcome, is_already_exists, op_error, sdk_error};
pub use names::{instance_name, label_key, label_value, request_id};
use names::{is_n1, label_filter, labels, n1_accelerator, parse_provider_id, to_instance};

#[cfg(test)]
mod tests;

/// The label carrying the node id on every instance spotplane creates.
pub const NODE_ID_LABEL: &str = crate::tags::NODE_ID;

/// Compute Engine's service id in the Cloud Billing Catalog.
pub const COMPUTE_BILLING_SERVICE: &str = "6F81-5844-456A";

/// How long offers priced from the billing API are served from the cache.
pub const PRICE_REFRESH: Duration = Duration::from_secs(300);

/// How long offers at catalog prices (the billing call failed) are served from the cache.
pub const FALLBACK_REFRESH: Duration = Duration::from_secs(60);

/// `zoneOperations.wait` calls per insert; each returns after at most two minutes.
pub const MAX_OPERATION_WAITS: u32 = 4;

/// Pages read from one listing at most; a bound against a server that never stops paging.
const MAX_PAGES: usize = 200;

const BILLING_PAGE_SIZE: i32 = 5000;
const BILLING_TIMEOUT: Duration = Duration::from_secs(30);

/// When GCE throttles without saying for how long.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(2);

/// The namespace of the UUIDv5 `requestId`s made from client tokens. Changing it would make a
/// retry after an upgrade look like a new request to GCE.
const REQUEST_ID_NAMESPACE: Uuid = Uuid::from_u128(0x5f0a_7c1e_3b2d_4e8f_9a61_0c4d_2e7b_8a93);

const NAME_PREFIX: &str = "spotplane-";
const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
const LABEL_MAX: usize = 63;

/// A GCP project's Compute Engine capacity in the configured zones.
pub struct GcpProvider {
    cfg: GcpConfig,
    catalog: Vec<CatalogRow>,
    instances: Instances,
    operations: ZoneOperations,
    billing: CloudCatalog,
    refresh: Duration,
    offers: tokio::sync::Mutex<Option<CachedOffers>>,
}

struct CachedOffers {
    until: Instant,
    offers: Vec<Offer>,
}

impl GcpProvider {
    /// Builds the clients: Application Default Credentials, or none when the configuration asks
    /// for `anonymous_credentials`. Calls neither Compute Engine nor Cloud Billing (credentials
    /// from the metadata server may ask it for their universe domain).
    pub async fn from_config(
        cfg: &GcpConfig,
        catalog: Vec<CatalogRow>,
    ) -> Result<Self, ProviderError> {
        let credentials = if cfg.anonymous_credentials {
            google_cloud_auth::credentials::anonymous::Builder::new().build()
        } else {
            google_cloud_auth::credentials::Builder::default()
                .build()
                .map_err(|e| ProviderError::Auth(format!("Application Default Credentials: {e}")))?
        };
        Self::with_credentials(cfg, catalog, credentials).await
    }

    /// [`from_config`](Self::from_config) with the given credentials.
    pub(crate) async fn with_credentials(
        cfg: &GcpConfig,
        catalog: Vec<CatalogRow>,
        credentials: Credentials,
    ) -> Result<Self, ProviderError> {
        let mut instances = Instances::builder()
            .with_credentials(credentials.clone())
            .with_retry_policy(NeverRetry);
        let mut operations = ZoneOperations::builder()
            .with_credentials(credentials.clone())
            .with_retry_policy(NeverRetry);
        let mut billing = CloudCatalog::builder()
            .with_credentials(credentials)
            .with_retry_policy(NeverRetry);
        if let Some(url) = &cfg.endpoint_url {
            instances = instances.with_endpoint(url.trim_end_matches('/'));
            operations = operations.with_endpoint(url.trim_end_matches('/'));
        }
        if let Some(url) = &cfg.billing_endpoint_url {
            billing = billing.with_endpoint(url.trim_end_matches('/'));
        }
        let setup = |client: &'static str| {
            move |e: google_cloud_gax::client_builder::Error| {
                if e.is_default_credentials() {
                    ProviderError::Auth(e.to_string())
                } else {
                    ProviderError::InvalidRequest(format!("the {client} client: {e}"))
                }
            }
        };
        let instances = instances.build().await.map_err(setup("Compute Engine"))?;
        let operations = operations.build().await.map_err(setup("Compute Engine"))?;
        let billing = billing.build().await.map_err(setup("Cloud Billing"))?;
        Ok(Self {
            cfg: cfg.clone(),
            catalog,
            instances,
            operations,
            billing,
            refresh: PRICE_REFRESH,
            offers: tokio::sync::Mutex::new(None),
        })
    }

    /// Catalog rows to offer: the configured zones, and the configured machine types or else
    /// every type with GPUs.
    fn rows(&self) -> Vec<&CatalogRow> {
        let zones = |r: &&CatalogRow| self.cfg.zones.iter().any(|z| **z == *r.zone);
        if self.cfg.machine_types.is_empty() {
            return self
                .catalog
                .iter()
                .filter(|r| r.gpu_count > 0)
                .filter(zones)
                .collect();
        }
        let rows: Vec<&CatalogRow> = self
            .catalog
            .iter()
            .filter(|r| {
                self.cfg
                    .machine_types
                    .iter()
                    .any(|t| **t == *r.instance_type)
            })
            .filter(zones)
            .collect();
        for t in &self.cfg.machine_types {
            for z in &self.cfg.zones {
                if !rows
                    .iter()
                    .any(|r| *r.instance_type == **t && *r.zone == **z)
                {
                    tracing::warn!(
                        machine_type = %t, zone = %z,
                        "no catalog row for this GCP machine type in this zone; not offered"
                    );
                }
            }
        }
        rows
    }

    /// Offers at the prices read now; whether any is live-priced.
    async fn fresh_offers(&self) -> (Vec<Offer>, bool) {
        let rows = self.rows();
        let prices = match self.sku_prices().await {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(error = %e, "GCP billing catalog unreadable; offering at catalog prices");
                None
            }
        };
        let mut offers = Vec::with_capacity(rows.len() * 2);
        let (mut live, mut fallbacks) = (0usize, 0usize);
        let mut missing: Vec<String> = Vec::new();
        let mut price = |row: &CatalogRow, market: Market| -> Option<Micros> {
            let p = prices.as_ref()?;
            match p.vm_price(row, market) {
                Ok(m) => {
                    live += 1;
                    Some(m)
                }
                Err(skus) => {
                    fallbacks += 1;
                    tracing::debug!(
                        machine_type = %row.instance_type, zone = %row.zone, %market,
                        missing = %skus.join(", "),
                        "GCP billing catalog lacks a SKU for this machine type; catalog price kept"
                    );
                    for s in skus {
                        if !missing.contains(&s) {
                            missing.push(s);
                        }
                    }
                    None
                }
            }
        };
        for row in &rows {
            let (on_demand, od_source) = match price(row, Market::OnDemand) {
                Some(p) => (p, PriceSource::Live),
                None => (row.price, PriceSource::Catalog),
            };
            offers.push(offer(
                row,
                Market::OnDemand,
                (on_demand, od_source),
                (on_demand, od_source),
            ));
            let spot = match price(row, Market::Spot) {
                Some(p) => Some((p, PriceSource::Live)),
                None => row.spot_price.map(|p| (p, PriceSource::Catalog)),
            };
            if let Some(spot) = spot {
                offers.push(offer(row, Market::Spot, spot, (on_demand, od_source)));
            }
        }
        if prices.is_some() && live == 0 && !rows.is_empty() {
            tracing::warn!(
                missing = %summary(&missing),
                "GCP billing catalog priced none of the offered machine types; offering at catalog prices"
            );
        } else if fallbacks > 0 {
            tracing::warn!(
                fallbacks, live, missing = %summary(&missing),
                "GCP billing catalog lacks SKUs for some offers; those keep their catalog prices"
            );
        }
        (offers, live > 0)
    }

    /// Component prices from every page of Compute Engine's SKUs in the billing catalog.
    async fn sku_prices(&self) -> Result<SkuPrices, String> {
        let mut pages = self
            .billing
            .list_skus()
            .set_parent(format!("services/{COMPUTE_BILLING_SERVICE}"))
            .set_currency_code("USD")
            .set_page_size(BILLING_PAGE_SIZE)
            .with_attempt_timeout(BILLING_TIMEOUT)
            .by_page();
        let mut prices = SkuPrices::default();
        let mut read = 0usize;
        while let Some(page) = pages.next().await {
            read += 1;
            if read > MAX_PAGES {
                return Err(format!("services.skus.list: more than {MAX_PAGES} pages"));
            }
            let page = page.map_err(|e| format!("services.skus.list: {e}"))?;
            for sku in &page.skus {
                prices.add(sku);
            }
        }
        Ok(prices)
    }

    /// Waits for a zone operation to finish, at most [`MAX_OPERATION_WAITS`] calls. Returns the
    /// operation as last seen, done or not.
    async fn wait(&self, zone: &str, mut op: Operation) -> Result<Operation, ProviderError> {
        for _ in 0..MAX_OPERATION_WAITS {
            if op.status == Some(operation::Status::Done) {
                break;
            }
            let Some(name) = op.name.clone() else {
                return Err(ProviderError::Transient(
                    "GCE returned an operation without a name".into(),
                ));
            };
            op = self
                .operations
                .wait()
                .set_project(&self.cfg.project)
                .set_zone(zone)
                .set_operation(name)
                .send()
                .await
                .map_err(|e| sdk_error(&e, None))?;
        }
        Ok(op)
    }

    /// Reads one instance; `asked` as in [`to_instance`].
    async fn get(
        &self,
        zone: &str,
        name: &str,
        asked: &BTreeMap<String, String>,
    ) -> Result<Instance, ProviderError> {
        let i = self
            .instances
            .get()
            .set_project(&self.cfg.project)
            .set_zone(zone)
            .set_instance(name)
            .send()
            .await
            .map_err(|e| sdk_error(&e, None))?;
        Ok(to_instance(&i, zone, asked))
    }

    /// The instance to insert for a request.
    fn instance_for(&self, req: &ProvisionRequest) -> Result<model::Instance, ProviderError> {
        let o = &req.offer;
        let zone = &*o.zone;
        let mut i = model::Instance::default();
        i.name = Some(instance_name(req.node_id));
        i.machine_type = Some(format!("zones/{zone}/machineTypes/{}", o.instance_type));
        i.labels = labels(&req.tags, req.node_id);

        let mut init = AttachedDiskInitializeParams::default();
        init.source_image = Some(self.cfg.source_image.clone());
        init.disk_size_gb = Some(i64::from(self.cfg.boot_disk_gb));
        let mut disk = AttachedDisk::default();
        disk.boot = Some(true);
        disk.auto_delete = Some(true);
        disk.initialize_params = Some(init);
        i.disks = vec![disk];

        let mut nic = NetworkInterface::default();
        nic.network = Some(match self.cfg.network.as_deref() {
            Some(n) if n.contains('/') => n.to_owned(),
            Some(n) => format!("global/networks/{n}"),
            None => "global/networks/default".to_owned(),
        });
        nic.subnetwork = self.cfg.subnetwork.as_deref().map(|s| {
            if s.contains('/') {
                s.to_owned()
            } else {
                format!("regions/{}/subnetworks/{s}", o.region)
            }
        });
        let mut nat = AccessConfig::default();
        nat.name = Some("External NAT".into());
        nat.r#type = Some(access_config::Type::OneToOneNat);
        nic.access_configs = vec![nat];
        i.network_interfaces = vec![nic];

        if let Some(email) = &self.cfg.service_account {
            let mut sa = ServiceAccount::default();
            sa.email = Some(email.clone());
            sa.scopes = vec![CLOUD_PLATFORM_SCOPE.into()];
            i.service_accounts = vec![sa];
        }
        if let Some(script) = &req.user_data {
            let mut item = model::metadata::Items::default();
            item.key = Some("startup-script".into());
            item.value = Some(script.clone());
            let mut md = Metadata::default();
            md.items = vec![item];
            i.metadata = Some(md);
        }

        let mut s = Scheduling::default();
        s.on_host_maintenance = Some(scheduling::OnHostMaintenance::Terminate);
        match o.market {
            Market::Spot => {
                s.provisioning_model = Some(scheduling::ProvisioningModel::Spot);
                s.instance_termination_action = Some(match self.cfg.termination_action {
                    GcpTerminationAction::Delete => scheduling::InstanceTerminationAction::Delete,
                    GcpTerminationAction::Stop => scheduling::InstanceTerminationAction::Stop,
                });
                s.automatic_restart = Some(false);
            }
            Market::OnDemand => {
                s.provisioning_model = Some(scheduling::ProvisioningModel::Standard);
                s.automatic_restart = Some(true);
            }
        }
        i.scheduling = Some(s);

        if is_n1(&o.instance_type) && o.gpu_count > 0 {
            let Some(model) = o.gpu_model else {
                return Err(ProviderError::InvalidRequest(format!(
                    "{} needs a GPU model to attach",
                    o.instance_type
                )));
            };
            let Some(accel) = n1_accelerator(model) else {
                return Err(ProviderError::InvalidRequest(format!(
                    "GCE does not attach {} GPUs to N1 machine types",
                    model.name()
                )));
            };
            let mut a = AcceleratorConfig::default();
            a.accelerator_type = Some(format!(
                "projects/{}/zones/{zone}/acceleratorTypes/{accel}",
                self.cfg.project
            ));
            a.accelerator_count = Some(i32::try_from(o.gpu_count).unwrap_or(i32::MAX));
            i.guest_accelerators = vec![a];
        }
        Ok(i)
    }
}

#[async_trait]
impl CloudProvider for GcpProvider {
    fn cloud(&self) -> Cloud {
        Cloud::Gcp
    }

    /// Served from the cache while it is fresh; see the module doc for how prices are read.
    /// Never fails for want of live prices.
    async fn list_offers(&self) -> Result<Vec<Offer>, ProviderError> {
        // Held across the refresh so concurrent callers wait for one billing read.
        let mut cache = self.offers.lock().await;
        if let Some(c) = cache.as_ref()
            && Instant::now() < c.until
        {
            return Ok(c.offers.clone());
        }
        let (offers, live) = self.fresh_offers().await;
        let ttl = if live {
            self.refresh
        } else {
            self.refresh.min(FALLBACK_REFRESH)
        };
        *cache = Some(CachedOffers {
            until: Instant::now() + ttl,
            offers: offers.clone(),
        });
        Ok(offers)
    }

    /// Inserts the instance and waits for GCE to create it. Idempotent by the client token
    /// (GCE `requestId`) and the node id (the instance name). If the operation is still running
    /// after the last wait, returns the instance as it is then (pending).
    async fn provision(&self, req: &ProvisionRequest) -> Result<Instance, ProviderError> {
        let o = &req.offer;
        if o.cloud != Cloud::Gcp {
            return Err(ProviderError::InvalidRequest(format!(
                "offer {} is not a GCP offer",
                o.id()
            )));
        }
        let zone = &*o.zone;
        let name = instance_name(req.node_id);
        let body = self.instance_for(req)?;
        let inserted = self
            .instances
            .insert()
            .set_project(&self.cfg.project)
            .set_zone(zone)
            .set_request_id(request_id(&req.client_token).to_string())
            .set_body(body)
            .send()
            .await;
        let op = match inserted {
            Ok(op) => op,
            Err(e) if is_already_exists(&e) => {
                tracing::info!(instance = %name, zone, "GCE instance exists already: an earlier attempt created it");
                return self.get(zone, &name, &req.tags).await;
            }
            Err(e) => return Err(sdk_error(&e, Some(o))),
        };
        let op = self.wait(zone, op).await?;
        if let Some(err) = op_error(&op, Some(o)) {
            return match err {
                OpOutcome::AlreadyExists => self.get(zone, &name, &req.tags).await,
                OpOutcome::Failed(e) => Err(e),
            };
        }
        if op.status == Some(operation::Status::Done) {
            return self.get(zone, &name, &req.tags).await;
        }
        tracing::warn!(instance = %name, zone, "GCE insert still running after the last wait");
        match self.get(zone, &name, &req.tags).await {
            // Not visible yet: the same request again (same requestId) picks the insert up.
            Err(ProviderError::NotFound(m)) => Err(ProviderError::Transient(format!(
                "GCE is still creating {name}: {m}"
            ))),
            other => other,
        }
    }

    /// Deletes the instance named by a provider id `zones/{zone}/instances/{name}` and returns
    /// once GCE has accepted the deletion (the instance shows as stopping until it is gone).
    /// An instance already gone is success.
    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        let (zone, name) = parse_provider_id(provider_id).ok_or_else(|| {
            ProviderError::InvalidRequest(format!(
                "{provider_id:?} is not a GCE provider id (zones/ZONE/instances/NAME)"
            ))
        })?;
        let deleted = self
            .instances
            .delete()
            .set_project(&self.cfg.project)
            .set_zone(zone)
            .set_instance(name)
            .send()
            .await;
        match deleted {
            Ok(op) => match op_error(&op, None) {
                Some(OpOutcome::Failed(ProviderError::NotFound(_)))
                | Some(OpOutcome::AlreadyExists)
                | None => Ok(()),
                Some(OpOutcome::Failed(e)) => Err(e),
            },
            Err(e) => match sdk_error(&e, None) {
                ProviderError::NotFound(_) => Ok(()),
                other => Err(other),
            },
        }
    }

    /// Instances in the configured zones whose labels match every tag (keys and values
    /// sanitized as on insert); tags that were changed by sanitizing are reported as given.
    async fn list_instances(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<Instance>, ProviderError> {
        let filter = label_filter(tags);
        let mut out = Vec::new();
        for zone in &self.cfg.zones {
            let mut token = String::new();
            let mut pages = 0usize;
            loop {
                pages += 1;
                if pages > MAX_PAGES {
                    return Err(ProviderError::Transient(format!(
                        "instances.list in {zone}: more than {MAX_PAGES} pages"
                    )));
                }
                let mut call = self
                    .instances
                    .list()
                    .set_project(&self.cfg.project)
                    .set_zone(zone);
                if !filter.is_empty() {
                    call = call.set_filter(filter.clone());
                }
                if !token.is_empty() {
                    call = call.set_page_token(token.clone());
                }
                let page = call.send().await.map_err(|e| sdk_error(&e, None))?;
                out.extend(page.items.iter().map(|i| to_instance(i, zone, tags)));
                match page.next_page_token {
                    Some(t) if !t.is_empty() => token = t,
                    _ => break,
                }
            }
        }
        Ok(out)
    }

    /// Always empty: GCE preemption notices come from the node agents (the metadata server's
    /// `instance/preempted`), not from a stream this provider could read.
    async fn drain_interruptions(&self) -> Result<Vec<InterruptionEvent>, ProviderError> {
        Ok(Vec::new())
    }
}

/// The first few of a list of missing SKUs, for one log line.
fn summary(missing: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut s = missing
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if missing.len() > SHOWN {
        s.push_str(&format!(" and {} more", missing.len() - SHOWN));
    }
    s
}

/// The offer of a row on a market, at a price and an on-demand price with their sources.
fn offer(
    row: &CatalogRow,
    market: Market,
    (price, price_source): (Micros, PriceSource),
    (on_demand, on_demand_source): (Micros, PriceSource),
) -> Offer {
    Offer {
        cloud: Cloud::Gcp,
        region: Arc::clone(&row.region),
        zone: Arc::clone(&row.zone),
        instance_type: Arc::clone(&row.instance_type),
        market,
        gpu_model: row.gpu_model,
        gpu_count: row.gpu_count,
        vcpus: row.vcpus,
        memory_mib: (row.memory_gib * 1024.0).round() as u64,
        price,
        on_demand_price: on_demand,
        placement_score: row.placement_score,
        interruption_bucket: row.interruption_bucket.clone(),
        price_source,
        on_demand_source,
    }
}
