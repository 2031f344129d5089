//! Azure: spot and on-demand GPU virtual machines in one subscription's resource group.
//!
//! Resource Manager is called over HTTPS through the narrow [`arm::VirtualMachines`] trait
//! (api-version [`arm::API_VERSION`]), authenticated with azure_identity 1.x credentials
//! ([`credential`]); prices come from the public Retail Prices API ([`prices`]) with the
//! catalog as fallback. docs/decisions/azure-arm.md says why not `azure_mgmt_compute`.
//!
//! Each VM is self-contained: its NIC is declared inline (`networkInterfaceConfigurations`)
//! and its NIC and OS disk have `deleteOption: Delete`, so one `PUT` buys a node and one
//! `DELETE` gives everything back. VM names are derived from the node id and the client token,
//! which is what makes `provision` idempotent.

mod arm;
mod credential;
mod prices;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::TokenCredential;
use chrono::{DateTime, Utc};
use spotplane_core::{Cloud, Market, NodeId};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::catalog::CatalogRow;
use crate::config::{AzureConfig, AzureEvictionPolicy};
use crate::{
    CloudProvider, Instance, InstanceState, InterruptionEvent, Offer, ProviderError,
    ProvisionRequest,
};
use arm::{
    ArmClient, ArmError, BillingProfile, HardwareProfile, ImageReference, IpConfiguration,
    IpConfigurationProperties, LinuxConfiguration, NetworkProfile, NicConfiguration, NicProperties,
    OsDisk, OsProfile, PollPolicy, SshConfiguration, SshPublicKey, StorageProfile, SubResource,
    VirtualMachine, VirtualMachines, VmProperties,
};
use prices::{RetailPrices, SizePrices};

/// The tag carrying the node id on every VM this provider creates.
pub const NODE_ID_TAG: &str = crate::tags::NODE_ID;

/// How long listed offers are served from memory when live prices were read.
const OFFERS_TTL: Duration = Duration::from_secs(5 * 60);
/// ... and when some region fell back to the catalog, so live prices return sooner.
const FALLBACK_OFFERS_TTL: Duration = Duration::from_secs(60);
/// Throttled without a `Retry-After`: wait this long.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(10);

/// An Azure subscription's resource group as a [`CloudProvider`].
pub struct AzureProvider {
    cfg: AzureConfig,
    /// The catalog rows of the configured locations.
    catalog: Vec<CatalogRow>,
    vms: Box<dyn VirtualMachines>,
    prices: RetailPrices,
    image: ImageReference,
    ssh_public_key: String,
    offers: Mutex<Option<CachedOffers>>,
}

struct CachedOffers {
    until: Instant,
    offers: Vec<Offer>,
}

impl std::fmt::Debug for AzureProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureProvider")
            .field("subscription_id", &self.cfg.subscription_id)
            .field("resource_group", &self.cfg.resource_group)
            .field("locations", &self.cfg.locations)
            .finish_non_exhaustive()
    }
}

impl AzureProvider {
    /// Builds the provider with the credential the environment provides (see [`credential`]:
    /// a service principal secret, workload identity, managed identity or `az login`).
    /// `endpoint_url` and `prices_endpoint_url` point Resource Manager and the Retail Prices
    /// API elsewhere (a sovereign cloud, a test server). Refuses a configuration it cannot
    /// turn into a VM (no SSH key, an unreadable image) before any call is made.
    pub async fn from_config(
        c: &AzureConfig,
        catalog: Vec<CatalogRow>,
    ) -> Result<AzureProvider, ProviderError> {
        let credential = credential::from_environment().map_err(ProviderError::Auth)?;
        AzureProvider::with_credential(c, catalog, credential)
    }

    /// As [`AzureProvider::from_config`], with a given credential (tests pass a fake one; an
    /// embedding program may pass any azure_identity credential).
    pub fn with_credential(
        c: &AzureConfig,
        catalog: Vec<CatalogRow>,
        credential: Arc<dyn TokenCredential>,
    ) -> Result<AzureProvider, ProviderError> {
        AzureProvider::build(c, catalog, credential, PollPolicy::default())
    }

    fn build(
        c: &AzureConfig,
        catalog: Vec<CatalogRow>,
        credential: Arc<dyn TokenCredential>,
        poll: PollPolicy,
    ) -> Result<AzureProvider, ProviderError> {
        let invalid = ProviderError::InvalidRequest;
        let image = parse_image(&c.image).map_err(invalid)?;
        let ssh_public_key = c
            .ssh_public_key
            .clone()
            .filter(|k| !k.trim().is_empty())
            .ok_or_else(|| {
                invalid(
                    "ssh_public_key is required: Azure Linux VMs need a key when password login is off"
                        .into(),
                )
            })?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .user_agent(concat!("spotplane/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| invalid(format!("HTTP client: {e}")))?;
        let arm = ArmClient::new(
            http.clone(),
            c.endpoint_url.as_deref().unwrap_or(arm::PUBLIC_ARM),
            &c.subscription_id,
            &c.resource_group,
            credential,
            poll,
        )
        .map_err(|e| invalid(e.to_string()))?;
        let prices = RetailPrices::new(
            http,
            c.prices_endpoint_url
                .as_deref()
                .unwrap_or(prices::PUBLIC_PRICES),
        )
        .map_err(invalid)?;
        let catalog = catalog
            .into_iter()
            .filter(|r| {
                c.locations
                    .iter()
                    .any(|l| l.eq_ignore_ascii_case(&r.region))
            })
            .collect();
        Ok(AzureProvider {
            cfg: c.clone(),
            catalog,
            vms: Box::new(arm),
            prices,
            image,
            ssh_public_key,
            offers: Mutex::new(None),
        })
    }

    /// The resource id of a VM of the configured resource group.
    fn vm_id(&self, name: &str) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{name}",
            self.cfg.subscription_id, self.cfg.resource_group
        )
    }

    /// The VM sizes offered in `location`: the configured ones, else the catalog's GPU sizes.
    fn sizes_in(&self, location: &str) -> Vec<String> {
        if !self.cfg.vm_sizes.is_empty() {
            return self.cfg.vm_sizes.clone();
        }
        let sizes: BTreeSet<&str> = self
            .catalog
            .iter()
            .filter(|r| r.region.eq_ignore_ascii_case(location) && r.gpu_count > 0)
            .map(|r| &*r.instance_type)
            .collect();
        sizes.into_iter().map(str::to_owned).collect()
    }

    /// Offers from live prices where they could be read and catalog prices elsewhere. The
    /// flag says whether every location's live prices were read.
    async fn fresh_offers(&self) -> (Vec<Offer>, bool) {
        let mut out = Vec::new();
        let mut all_live = true;
        for location in &self.cfg.locations {
            let sizes = self.sizes_in(location);
            if sizes.is_empty() {
                continue;
            }
            let names: Vec<&str> = sizes.iter().map(String::as_str).collect();
            let live = match self.prices.region(location, &names).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(%location, error = %e, "Azure retail prices unavailable; using catalog prices");
                    all_live = false;
                    BTreeMap::new()
                }
            };
            let region: Arc<str> = location.as_str().into();
            for size in &sizes {
                let rows: Vec<&CatalogRow> = self
                    .catalog
                    .iter()
                    .filter(|r| {
                        r.region.eq_ignore_ascii_case(location)
                            && r.instance_type.eq_ignore_ascii_case(size)
                    })
                    .collect();
                if rows.is_empty() {
                    tracing::warn!(%location, size = %size, "VM size not in the Azure catalog for this location (its GPUs and zones are unknown); not offered");
                    continue;
                }
                let live = live.get(size).copied().unwrap_or_default();
                if all_live && (live.on_demand.is_none() || live.spot.is_none()) {
                    tracing::warn!(%location, size = %size, on_demand = live.on_demand.is_some(), spot = live.spot.is_some(), "no live Azure price; using the catalog's");
                }
                for row in rows {
                    out.extend(offers_of(row, &region, live));
                }
            }
        }
        (out, all_live)
    }

    /// The VM to PUT for a request.
    fn vm_body(&self, req: &ProvisionRequest, name: &str) -> VirtualMachine {
        let offer = &req.offer;
        let spot = offer.market == Market::Spot;
        let mut tags = req.tags.clone();
        tags.insert(NODE_ID_TAG.to_owned(), req.node_id.to_string());
        let admin = &self.cfg.admin_username;
        VirtualMachine {
            id: None,
            location: offer.region.to_string(),
            zones: zone_number(&offer.region, &offer.zone)
                .into_iter()
                .collect(),
            tags,
            properties: VmProperties {
                hardware_profile: Some(HardwareProfile {
                    vm_size: offer.instance_type.to_string(),
                }),
                priority: Some(if spot { "Spot" } else { "Regular" }.to_owned()),
                // Both are refused on a Regular VM.
                eviction_policy: spot.then(|| {
                    match self.cfg.eviction_policy {
                        AzureEvictionPolicy::Delete => "Delete",
                        AzureEvictionPolicy::Deallocate => "Deallocate",
                    }
                    .to_owned()
                }),
                billing_profile: spot.then(|| BillingProfile {
                    max_price: Some(self.cfg.max_price_usd.unwrap_or(-1.0)),
                }),
                storage_profile: Some(StorageProfile {
                    image_reference: Some(self.image.clone()),
                    os_disk: Some(OsDisk {
                        create_option: "FromImage".into(),
                        delete_option: Some("Delete".into()),
                    }),
                }),
                os_profile: Some(OsProfile {
                    computer_name: name.to_owned(),
                    admin_username: admin.clone(),
                    custom_data: req.user_data.as_deref().map(azure_core::base64::encode),
                    linux_configuration: Some(LinuxConfiguration {
                        disable_password_authentication: true,
                        ssh: Some(SshConfiguration {
                            public_keys: vec![SshPublicKey {
                                path: format!("/home/{admin}/.ssh/authorized_keys"),
                                key_data: self.ssh_public_key.clone(),
                            }],
                        }),
                    }),
                }),
                network_profile: Some(NetworkProfile {
                    network_api_version: Some(arm::NETWORK_API_VERSION.into()),
                    network_interface_configurations: vec![NicConfiguration {
                        name: format!("{name}-nic"),
                        properties: NicProperties {
                            primary: true,
                            delete_option: Some("Delete".into()),
                            ip_configurations: vec![IpConfiguration {
                                name: "ipconfig1".into(),
                                properties: IpConfigurationProperties {
                                    primary: true,
                                    subnet: Some(SubResource {
                                        id: self.cfg.subnet_id.clone(),
                                    }),
                                },
                            }],
                        },
                    }],
                }),
                provisioning_state: None,
                time_created: None,
            },
        }
    }

    /// Whether the VM's power state must be read: a deallocated spot VM (eviction policy
    /// `Deallocate`) still reports provisioning state `Succeeded`.
    fn needs_power_state(&self, vm: &VirtualMachine) -> bool {
        self.cfg.eviction_policy == AzureEvictionPolicy::Deallocate
            && market_of(vm) == Market::Spot
            && vm.provisioning_state() == Some("Succeeded")
    }
}

/// The spot and on-demand offers of one catalog row with the best prices known.
fn offers_of(row: &CatalogRow, region: &Arc<str>, live: SizePrices) -> Vec<Offer> {
    use crate::PriceSource::{Catalog, Live};
    let (on_demand, on_demand_source) = match live.on_demand {
        Some(p) => (p, Live),
        None => (row.price, Catalog),
    };
    let base = Offer {
        cloud: Cloud::Azure,
        region: Arc::clone(region),
        zone: Arc::clone(&row.zone),
        instance_type: Arc::clone(&row.instance_type),
        market: Market::OnDemand,
        gpu_model: row.gpu_model,
        gpu_count: row.gpu_count,
        vcpus: row.vcpus,
        memory_mib: (row.memory_gib * 1024.0).round() as u64,
        price: on_demand,
        on_demand_price: on_demand,
        placement_score: row.placement_score,
        interruption_bucket: row.interruption_bucket.clone(),
        price_source: on_demand_source,
        on_demand_source,
    };
    let mut out = Vec::with_capacity(2);
    let spot = match (live.spot, row.spot_price) {
        (Some(p), _) => Some((p, Live)),
        (None, Some(p)) => Some((p, Catalog)),
        (None, None) => None,
    };
    if let Some((spot, price_source)) = spot {
        out.push(Offer {
            market: Market::Spot,
            price: spot,
            price_source,
            ..base.clone()
        });
    }
    out.push(base);
    out
}

/// The VM name for a request: `spotplane-<node id>-<hash of the client token>` (51 characters;
/// Linux VM and computer names allow 64). The same request always names the same VM, so a
/// repeated `provision` finds what the first one bought; another token for the same node names
/// another VM, as the trait's contract asks.
fn vm_name(node_id: NodeId, client_token: &str) -> String {
    format!(
        "spotplane-{}-{:08x}",
        node_id.0.simple(),
        fnv1a32(client_token.as_bytes())
    )
}

/// FNV-1a, 32 bits: stable across builds and platforms (unlike `std`'s hasher).
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// `eastus-1` in `eastus` is zone `1`; a zone that does not extend the region is no zone.
fn zone_number(region: &str, zone: &str) -> Option<String> {
    zone.strip_prefix(region)?
        .strip_prefix('-')
        .filter(|z| !z.is_empty())
        .map(str::to_owned)
}

/// `publisher:offer:sku:version`, or an image resource id (`/subscriptions/…/images/…`, a
/// gallery image version).
fn parse_image(s: &str) -> Result<ImageReference, String> {
    let s = s.trim();
    if s.starts_with('/') {
        return Ok(ImageReference {
            id: Some(s.to_owned()),
            ..Default::default()
        });
    }
    match s.split(':').collect::<Vec<_>>().as_slice() {
        [publisher, offer, sku, version]
            if [publisher, offer, sku, version]
                .iter()
                .all(|p| !p.is_empty()) =>
        {
            Ok(ImageReference {
                id: None,
                publisher: Some((*publisher).to_owned()),
                offer: Some((*offer).to_owned()),
                sku: Some((*sku).to_owned()),
                version: Some((*version).to_owned()),
            })
        }
        _ => Err(format!(
            "image {s:?}: expected publisher:offer:sku:version or an image resource id"
        )),
    }
}

fn market_of(vm: &VirtualMachine) -> Market {
    match vm.properties.priority.as_deref() {
        Some("Spot") | Some("Low") => Market::Spot,
        _ => Market::OnDemand,
    }
}

/// The instance state from the provisioning state and, where read, the power state.
/// A VM whose provisioning `Failed` exists but will not run: it is reported `Stopped`, so
/// reconciliation terminates it.
fn state_of(provisioning: Option<&str>, power: Option<&str>) -> InstanceState {
    if provisioning == Some("Deleting") {
        return InstanceState::Terminating;
    }
    match power {
        Some("starting") => return InstanceState::Pending,
        Some("running") => return InstanceState::Running,
        Some("stopping") | Some("deallocating") => return InstanceState::Stopping,
        Some("stopped") | Some("deallocated") => return InstanceState::Stopped,
        _ => {}
    }
    match provisioning {
        Some("Succeeded") | Some("Updating") | Some("Migrating") => InstanceState::Running,
        Some("Failed") | Some("Canceled") => InstanceState::Stopped,
        _ => InstanceState::Pending,
    }
}

/// An [`Instance`] from ARM's view of a VM; `fallback_id` when ARM left out the id.
fn instance_of(vm: &VirtualMachine, fallback_id: &str, power: Option<&str>) -> Instance {
    let zone = match vm.zones.first() {
        Some(z) => format!("{}-{z}", vm.location),
        None => vm.location.clone(),
    };
    Instance {
        provider_id: vm.id.clone().unwrap_or_else(|| fallback_id.to_owned()),
        node_id: vm.tags.get(NODE_ID_TAG).and_then(|v| v.parse().ok()),
        zone,
        instance_type: vm
            .properties
            .hardware_profile
            .as_ref()
            .map(|h| h.vm_size.clone())
            .unwrap_or_default(),
        market: market_of(vm),
        state: state_of(vm.provisioning_state(), power),
        launched_at: vm
            .properties
            .time_created
            .as_deref()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc)),
        ended_at: None,
        tags: vm.tags.clone(),
    }
}

/// Whether `id` names a virtual machine (`…/providers/Microsoft.Compute/virtualMachines/{name}`).
fn is_vm_id(id: &str) -> bool {
    let lower = id.to_ascii_lowercase();
    lower.starts_with("/subscriptions/")
        && lower
            .rsplit_once("/providers/microsoft.compute/virtualmachines/")
            .is_some_and(|(_, name)| !name.is_empty() && !name.contains('/'))
}

/// Turns a Resource Manager failure into what the planner branches on. ARM error codes are
/// matched first (on the top-level code, then on `details`, where deployment-style errors put
/// the reason), the HTTP status second. `offer_id` names the offer in capacity errors.
fn classify(e: ArmError, offer_id: &str) -> ProviderError {
    match e {
        ArmError::Credential { message, retryable } => {
            if retryable {
                ProviderError::Transient(message)
            } else {
                ProviderError::Auth(message)
            }
        }
        ArmError::Transport(m) => ProviderError::Transient(m),
        ArmError::Decode(m) => ProviderError::Transient(format!("unexpected ARM response: {m}")),
        ArmError::Url(m) => ProviderError::InvalidRequest(m),
        ArmError::Response {
            status,
            code,
            message,
            detail_codes,
            retry_after,
        } => by_code(&code, &detail_codes, &message, offer_id, retry_after).unwrap_or_else(|| {
            let text = format!("{code}: {message}");
            match status {
                401 | 403 => ProviderError::Auth(text),
                404 => ProviderError::NotFound(text),
                429 => ProviderError::Throttled {
                    retry_after: retry_after.unwrap_or(DEFAULT_RETRY_AFTER),
                },
                500..=599 => ProviderError::Transient(text),
                400..=499 => ProviderError::InvalidRequest(text),
                _ => ProviderError::Transient(text),
            }
        }),
        ArmError::Operation {
            code,
            message,
            detail_codes,
        } => by_code(&code, &detail_codes, &message, offer_id, None).unwrap_or_else(|| {
            let text = format!("{code}: {message}");
            match code.as_str() {
                "InvalidParameter" | "BadRequest" | "InvalidRequestFormat" => {
                    ProviderError::InvalidRequest(text)
                }
                // OS provisioning timeouts, internal errors: another attempt may succeed.
                _ => ProviderError::Transient(text),
            }
        }),
    }
}

/// The class of the first code that has one. Matching on message text is limited to
/// `OperationNotAllowed`, the code ARM uses for exceeded core quotas among other refusals.
fn by_code(
    code: &str,
    details: &[String],
    message: &str,
    offer_id: &str,
    retry_after: Option<Duration>,
) -> Option<ProviderError> {
    let text = format!("{code}: {message}");
    std::iter::once(code)
        .chain(details.iter().map(String::as_str))
        .find_map(|c| match c {
            // Documented in "Error messages for Azure Spot Virtual Machines" and "Allocation failures".
            "SkuNotAvailable"
            | "AllocationFailed"
            | "ZonalAllocationFailed"
            | "OverconstrainedAllocationRequest"
            | "OverconstrainedZonalAllocationRequest"
            | "AzureSpotIsNotSupportedForThisVMSize" => Some(ProviderError::InsufficientCapacity {
                offer_id: offer_id.to_owned(),
                message: text.clone(),
            }),
            "SpotPriceGreaterThanProvidedMaxPrice" => {
                Some(ProviderError::PriceTooLow(text.clone()))
            }
            "OperationNotAllowed" if message.to_ascii_lowercase().contains("quota") => {
                Some(ProviderError::Quota(text.clone()))
            }
            c if c.to_ascii_lowercase().contains("quotaexceeded") => {
                Some(ProviderError::Quota(text.clone()))
            }
            "AuthorizationFailed"
            | "LinkedAuthorizationFailed"
            | "AuthenticationFailed"
            | "InvalidAuthenticationToken"
            | "InvalidAuthenticationTokenTenant"
            | "ExpiredAuthenticationToken" => Some(ProviderError::Auth(text.clone())),
            "TooManyRequests" | "SubscriptionRequestsThrottled" => Some(ProviderError::Throttled {
                retry_after: retry_after.unwrap_or(DEFAULT_RETRY_AFTER),
            }),
            "RetryableError"
            | "InternalServerError"
            | "InternalExecutionError"
            | "OperationPreempted" => Some(ProviderError::Transient(text.clone())),
            _ => None,
        })
}

#[async_trait]
impl CloudProvider for AzureProvider {
    fn cloud(&self) -> Cloud {
        Cloud::Azure
    }

    /// Every configured location × VM size (the configured sizes, else the catalog's GPU
    /// sizes there), in each zone the catalog lists, on demand and — where a spot price is
    /// known — on spot. Prices are the Retail Prices API's; a location whose prices cannot be
    /// read, or a size the API does not price, takes the catalog's (with a warning): this never
    /// fails for prices. Served from memory for five minutes (one when prices fell back).
    async fn list_offers(&self) -> Result<Vec<Offer>, ProviderError> {
        let mut cache = self.offers.lock().await;
        if let Some(c) = cache.as_ref()
            && Instant::now() < c.until
        {
            return Ok(c.offers.clone());
        }
        let (offers, all_live) = self.fresh_offers().await;
        let ttl = if all_live {
            OFFERS_TTL
        } else {
            FALLBACK_OFFERS_TTL
        };
        *cache = Some(CachedOffers {
            until: Instant::now() + ttl,
            offers: offers.clone(),
        });
        Ok(offers)
    }

    /// Creates the VM named after the node id and client token and waits (about ten minutes at
    /// most) for ARM's operation to end. If that VM already exists, it is returned as it is
    /// (idempotency); one whose earlier creation failed is created again. A creation that
    /// fails asynchronously (allocation failures usually do) deletes the failed VM before
    /// returning the error. The VM carries `req.tags` plus [`NODE_ID_TAG`].
    async fn provision(&self, req: &ProvisionRequest) -> Result<Instance, ProviderError> {
        let offer_id = req.offer.id();
        if req.offer.cloud != Cloud::Azure {
            return Err(ProviderError::InvalidRequest(format!(
                "offer {offer_id} is not an Azure offer"
            )));
        }
        let name = vm_name(req.node_id, &req.client_token);
        let id = self.vm_id(&name);
        match self
            .vms
            .get(&id)
            .await
            .map_err(|e| classify(e, &offer_id))?
        {
            Some(vm) if vm.provisioning_state() == Some("Deleting") => {
                return Err(ProviderError::Transient(format!(
                    "{name} is being deleted after a failed attempt; try again"
                )));
            }
            Some(vm) if !matches!(vm.provisioning_state(), Some("Failed") | Some("Canceled")) => {
                return Ok(instance_of(&vm, &id, None));
            }
            _ => {}
        }
        let body = self.vm_body(req, &name);
        match self.vms.create_or_update(&id, &body).await {
            Ok(vm) => Ok(instance_of(&vm, &id, None)),
            Err(e @ ArmError::Operation { .. }) => {
                // The VM resource stays behind, Failed; its NIC and disk go with it.
                if let Err(d) = self.vms.delete(&id).await {
                    tracing::warn!(vm = %id, error = %d, "could not delete a VM whose creation failed; reconciliation will");
                }
                Err(classify(e, &offer_id))
            }
            Err(e) => Err(classify(e, &offer_id)),
        }
    }

    /// Force-deletes the VM with resource id `provider_id` (with its NIC and OS disk) and returns
    /// once ARM accepted (200, 202 or 204); the VM shows as `Terminating` until it is gone. A VM
    /// that does not exist (404) is success. An id that is not a VM's is an invalid request.
    async fn terminate(&self, provider_id: &str) -> Result<(), ProviderError> {
        if !is_vm_id(provider_id) {
            return Err(ProviderError::InvalidRequest(format!(
                "{provider_id:?} is not a virtual machine resource id"
            )));
        }
        self.vms
            .delete(provider_id)
            .await
            .map_err(|e| classify(e, provider_id))
    }

    /// The resource group's VMs carrying every tag in `tags` (filtered here: ARM lists cannot
    /// filter on several tags). State comes from the provisioning state; with eviction policy
    /// `Deallocate`, a spot VM's power state is read too, since an evicted one stays
    /// `Succeeded` while deallocated. The node id comes from [`NODE_ID_TAG`].
    async fn list_instances(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<Instance>, ProviderError> {
        let vms = self.vms.list().await.map_err(|e| classify(e, ""))?;
        let mut out = Vec::new();
        for vm in vms
            .iter()
            .filter(|vm| tags.iter().all(|(k, v)| vm.tags.get(k) == Some(v)))
        {
            let id = vm.id.clone().unwrap_or_default();
            let view = if self.needs_power_state(vm) && !id.is_empty() {
                self.vms
                    .instance_view(&id)
                    .await
                    .map_err(|e| classify(e, &id))?
            } else {
                None
            };
            out.push(instance_of(
                vm,
                &id,
                view.as_ref().and_then(|v| v.power_state()),
            ));
        }
        Ok(out)
    }

    /// Always empty: Azure publishes spot evictions only inside the VM, through Scheduled
    /// Events (`Preempt`, at least 30 s ahead), which the node agent polls and reports.
    async fn drain_interruptions(&self) -> Result<Vec<InterruptionEvent>, ProviderError> {
        Ok(Vec::new())
    }
}
