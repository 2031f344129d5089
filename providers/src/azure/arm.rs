//! The few Azure Resource Manager calls the provider makes, typed, over plain HTTPS.
//!
//! `azure_mgmt_compute` is frozen on azure_core 0.21 and cannot take an azure_identity 1.x
//! credential (docs/decisions/azure-arm.md), so the virtual machine calls are written here:
//! [`VirtualMachines`] lists exactly the operations used, [`ArmClient`] implements them with
//! reqwest against a pinned api-version, and a maintained management crate can replace the
//! implementation without touching the provider. Only the fields spotplane reads or writes are
//! modelled; ARM ignores absent optional fields on create and serde ignores unknown ones on read.
//!
//! Long-running operations follow the ARM async pattern: a `PUT` answers 200/201 with an
//! `Azure-AsyncOperation` URL that is polled until its `status` is terminal. URLs taken from
//! responses (`Azure-AsyncOperation`, `nextLink`) are followed only when they point at the
//! configured endpoint, so the bearer token never goes to another host.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::{AccessToken, TokenCredential};
use azure_core::time::{Duration as TimeDuration, OffsetDateTime};
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

/// The Compute api-version every call uses; new fields need a deliberate bump.
pub const API_VERSION: &str = "2024-07-01";

/// Azure public cloud's Resource Manager.
pub const PUBLIC_ARM: &str = "https://management.azure.com";

/// The network api-version ARM uses for NICs declared inline in the VM (`networkInterfaceConfigurations`).
pub const NETWORK_API_VERSION: &str = "2020-11-01";

/// Pages followed at most when listing, a guard against a `nextLink` loop.
const MAX_PAGES: usize = 200;

/// A token is renewed when it has less than this left.
const TOKEN_REFRESH_MARGIN: TimeDuration = TimeDuration::minutes(5);
/// The longest a token fetch may take, its own retries included (see `Token::get`).
pub const TOKEN_FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Why a Resource Manager call failed, before it is turned into a `ProviderError`.
#[derive(Debug, Clone, PartialEq)]
pub enum ArmError {
    /// ARM answered with an error status.
    Response {
        status: u16,
        /// `error.code`, or empty when the body was not an ARM error.
        code: String,
        message: String,
        /// `error.details[].code`: deployment-style errors put the real reason there.
        detail_codes: Vec<String>,
        /// The `Retry-After` header, when ARM sent one in seconds.
        retry_after: Option<Duration>,
    },
    /// A long-running operation ended `Failed` or `Canceled`.
    Operation {
        code: String,
        message: String,
        detail_codes: Vec<String>,
    },
    /// No token: the credential failed. `retryable` when it failed to reach its endpoint.
    Credential { message: String, retryable: bool },
    /// The request did not complete (connection, timeout, reading the body).
    Transport(String),
    /// A success status whose body is not what the api-version promises.
    Decode(String),
    /// A URL that cannot be built from the configuration or an id.
    Url(String),
}

impl std::fmt::Display for ArmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArmError::Response {
                status,
                code,
                message,
                ..
            } => write!(f, "HTTP {status} {code}: {message}"),
            ArmError::Operation { code, message, .. } => {
                write!(f, "operation failed: {code}: {message}")
            }
            ArmError::Credential { message, .. } => write!(f, "credential: {message}"),
            ArmError::Transport(m) => write!(f, "transport: {m}"),
            ArmError::Decode(m) => write!(f, "unexpected response: {m}"),
            ArmError::Url(m) => write!(f, "url: {m}"),
        }
    }
}

/// The virtual machine operations the provider uses, addressed by resource id
/// (`/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}`).
#[async_trait]
pub trait VirtualMachines: Send + Sync {
    /// The VM's model view, or `None` when it does not exist.
    async fn get(&self, id: &str) -> Result<Option<VirtualMachine>, ArmError>;

    /// Creates or updates the VM and waits, within the poll policy, for the operation to end.
    /// Returns the VM as ARM reports it afterwards; if the policy runs out first, the VM as it
    /// is then (still `Creating`). A failed operation is [`ArmError::Operation`].
    async fn create_or_update(
        &self,
        id: &str,
        vm: &VirtualMachine,
    ) -> Result<VirtualMachine, ArmError>;

    /// Starts deleting the VM (forced: no graceful shutdown) and returns once ARM accepted it.
    /// A VM that does not exist is success.
    async fn delete(&self, id: &str) -> Result<(), ArmError>;

    /// Every VM in the resource group, all pages.
    async fn list(&self) -> Result<Vec<VirtualMachine>, ArmError>;

    /// The VM's instance view (power state, provisioning failures), `None` when it is gone.
    async fn instance_view(&self, id: &str) -> Result<Option<InstanceView>, ArmError>;
}

/// How long a long-running operation is waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollPolicy {
    /// Between polls when ARM sends no `Retry-After`.
    pub interval: Duration,
    /// The longest wait between polls, whatever `Retry-After` says.
    pub max_interval: Duration,
    /// Polls before giving up waiting (the operation goes on in Azure).
    pub max_polls: u32,
}

impl Default for PollPolicy {
    /// About ten minutes: a GPU VM usually allocates and boots in two to five.
    fn default() -> Self {
        PollPolicy {
            interval: Duration::from_secs(5),
            max_interval: Duration::from_secs(30),
            max_polls: 120,
        }
    }
}

/// [`VirtualMachines`] over reqwest, authenticated with an azure_identity credential.
pub struct ArmClient {
    http: reqwest::Client,
    /// The Resource Manager endpoint, without a trailing slash.
    endpoint: Url,
    subscription_id: String,
    resource_group: String,
    token: TokenSource,
    poll: PollPolicy,
}

impl ArmClient {
    /// A client for one subscription's resource group at `endpoint`.
    pub fn new(
        http: reqwest::Client,
        endpoint: &str,
        subscription_id: &str,
        resource_group: &str,
        credential: Arc<dyn TokenCredential>,
        poll: PollPolicy,
    ) -> Result<Self, ArmError> {
        let endpoint = Url::parse(endpoint.trim_end_matches('/'))
            .map_err(|e| ArmError::Url(format!("{endpoint}: {e}")))?;
        // The audience of a Resource Manager token is the endpoint itself (sovereign clouds too).
        let scope = format!("{}/.default", endpoint.as_str().trim_end_matches('/'));
        Ok(ArmClient {
            http,
            endpoint,
            subscription_id: subscription_id.to_owned(),
            resource_group: resource_group.to_owned(),
            token: TokenSource::new(credential, scope),
            poll,
        })
    }

    /// `{endpoint}{path}?api-version=…` plus `extra` query pairs.
    fn url(&self, path: &str, extra: &[(&str, &str)]) -> Result<Url, ArmError> {
        let base = self.endpoint.as_str().trim_end_matches('/');
        let mut url = Url::parse(&format!("{base}{path}"))
            .map_err(|e| ArmError::Url(format!("{path}: {e}")))?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("api-version", API_VERSION);
            for (k, v) in extra {
                q.append_pair(k, v);
            }
        }
        Ok(url)
    }

    /// A URL from a response header or body, accepted only on the configured endpoint.
    fn follow(&self, link: &str) -> Option<Url> {
        let url = Url::parse(link).ok()?;
        (url.origin() == self.endpoint.origin()).then_some(url)
    }

    async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<&VirtualMachine>,
    ) -> Result<reqwest::Response, ArmError> {
        let token = self.token.get().await?;
        let mut req = self
            .http
            .request(method, url)
            .bearer_auth(token.token.secret())
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(b) = body {
            req = req.json(b);
        }
        req.send().await.map_err(transport)
    }

    /// Sends a request and decodes a success body, or turns an error status into [`ArmError`].
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: Option<&VirtualMachine>,
    ) -> Result<(T, reqwest::header::HeaderMap), ArmError> {
        let resp = self.send(method, url, body).await?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.map_err(transport)?;
        if !status.is_success() {
            return Err(error_from(status, &headers, &bytes));
        }
        let value = serde_json::from_slice(&bytes).map_err(|e| ArmError::Decode(e.to_string()))?;
        Ok((value, headers))
    }

    /// Polls an `Azure-AsyncOperation` URL until the operation ends or the policy runs out.
    /// `Ok(true)`: it succeeded; `Ok(false)`: still running when the policy ran out.
    async fn wait_operation(
        &self,
        url: Url,
        first_wait: Option<Duration>,
    ) -> Result<bool, ArmError> {
        let mut wait = first_wait.unwrap_or(self.poll.interval);
        for _ in 0..self.poll.max_polls {
            tokio::time::sleep(wait.min(self.poll.max_interval)).await;
            let (op, headers): (AsyncOperation, _) =
                self.call(Method::GET, url.clone(), None).await?;
            match op.status.as_str() {
                "Succeeded" => return Ok(true),
                "Failed" | "Canceled" => {
                    let e = op.error.unwrap_or_default();
                    return Err(ArmError::Operation {
                        code: if e.code.is_empty() { op.status } else { e.code },
                        message: e.message,
                        detail_codes: e.details.into_iter().map(|d| d.code).collect(),
                    });
                }
                _ => wait = retry_after(&headers).unwrap_or(self.poll.interval),
            }
        }
        Ok(false)
    }

    /// Without an operation URL: polls the VM itself until its provisioning state is terminal.
    async fn wait_vm(&self, id: &str) -> Result<Option<VirtualMachine>, ArmError> {
        let mut last = None;
        for _ in 0..self.poll.max_polls {
            tokio::time::sleep(self.poll.interval).await;
            let Some(vm) = self.get(id).await? else {
                return Ok(None);
            };
            match vm.provisioning_state() {
                Some("Succeeded") => return Ok(Some(vm)),
                Some("Failed") | Some("Canceled") => {
                    // The reason is in the instance view: `ProvisioningState/failed/<code>`.
                    let view = self.instance_view(id).await?.unwrap_or_default();
                    let (code, message) = view.failure().unwrap_or_else(|| {
                        (
                            "ProvisioningFailed".to_owned(),
                            "the VM's provisioning state is Failed".to_owned(),
                        )
                    });
                    return Err(ArmError::Operation {
                        code,
                        message,
                        detail_codes: Vec::new(),
                    });
                }
                _ => last = Some(vm),
            }
        }
        Ok(last)
    }
}

#[async_trait]
impl VirtualMachines for ArmClient {
    async fn get(&self, id: &str) -> Result<Option<VirtualMachine>, ArmError> {
        let url = self.url(id, &[])?;
        match self.call(Method::GET, url, None).await {
            Ok((vm, _)) => Ok(Some(vm)),
            Err(ArmError::Response { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn create_or_update(
        &self,
        id: &str,
        vm: &VirtualMachine,
    ) -> Result<VirtualMachine, ArmError> {
        let url = self.url(id, &[])?;
        let (created, headers): (VirtualMachine, _) = self.call(Method::PUT, url, Some(vm)).await?;
        let operation = headers
            .get("azure-asyncoperation")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| self.follow(s));
        match operation {
            Some(op) => {
                self.wait_operation(op, retry_after(&headers)).await?;
                // Succeeded or still running: report the VM as it is now.
                Ok(self.get(id).await?.unwrap_or(created))
            }
            None if created.provisioning_state() == Some("Succeeded") => Ok(created),
            None => Ok(self.wait_vm(id).await?.unwrap_or(created)),
        }
    }

    async fn delete(&self, id: &str) -> Result<(), ArmError> {
        let url = self.url(id, &[("forceDeletion", "true")])?;
        let resp = self.send(Method::DELETE, url, None).await?;
        let status = resp.status();
        if status.is_success() || status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.map_err(transport)?;
        Err(error_from(status, &headers, &bytes))
    }

    async fn list(&self) -> Result<Vec<VirtualMachine>, ArmError> {
        let path = format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines",
            self.subscription_id, self.resource_group
        );
        let mut url = self.url(&path, &[])?;
        let mut out = Vec::new();
        for _ in 0..MAX_PAGES {
            let (page, _): (VmList, _) = self.call(Method::GET, url, None).await?;
            out.extend(page.value);
            match page.next_link.filter(|l| !l.is_empty()) {
                None => return Ok(out),
                Some(link) => {
                    url = self.follow(&link).ok_or_else(|| {
                        ArmError::Decode(format!("nextLink {link} is not on the ARM endpoint"))
                    })?;
                }
            }
        }
        Err(ArmError::Decode(format!(
            "more than {MAX_PAGES} pages of virtual machines"
        )))
    }

    async fn instance_view(&self, id: &str) -> Result<Option<InstanceView>, ArmError> {
        let url = self.url(&format!("{id}/instanceView"), &[])?;
        match self.call(Method::GET, url, None).await {
            Ok((view, _)) => Ok(Some(view)),
            Err(ArmError::Response { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn transport(e: reqwest::Error) -> ArmError {
    ArmError::Transport(e.to_string())
}

/// `Retry-After` in seconds (ARM does not send the HTTP-date form).
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// An error status and its body, `{"error": {"code", "message", "details"}}` when ARM wrote it.
fn error_from(status: StatusCode, headers: &reqwest::header::HeaderMap, body: &[u8]) -> ArmError {
    let parsed = serde_json::from_slice::<ErrorResponse>(body)
        .ok()
        .and_then(|r| r.error);
    let (code, message, detail_codes) = match parsed {
        Some(e) => (
            e.code,
            e.message,
            e.details.into_iter().map(|d| d.code).collect(),
        ),
        None => {
            let text = String::from_utf8_lossy(body);
            let text: String = text.chars().take(500).collect();
            (String::new(), text, Vec::new())
        }
    };
    ArmError::Response {
        status: status.as_u16(),
        code,
        message,
        detail_codes,
        retry_after: retry_after(headers),
    }
}

/// Caches the credential's token for the Resource Manager scope until shortly before it expires
/// (the developer-tool credentials run a CLI on every call and cache nothing themselves).
struct TokenSource {
    credential: Arc<dyn TokenCredential>,
    scope: String,
    cached: Mutex<Option<AccessToken>>,
}

impl TokenSource {
    fn new(credential: Arc<dyn TokenCredential>, scope: String) -> Self {
        TokenSource {
            credential,
            scope,
            cached: Mutex::new(None),
        }
    }

    async fn get(&self) -> Result<AccessToken, ArmError> {
        // Held across the fetch: concurrent callers wait for one token instead of each asking.
        let mut cached = self.cached.lock().await;
        if let Some(t) = cached.as_ref()
            && t.expires_on - OffsetDateTime::now_utc() > TOKEN_REFRESH_MARGIN
        {
            return Ok(t.clone());
        }
        // azure_identity retries inside a token fetch (managed identity up to six times in
        // about 72 s, a service principal eight in 60 s) and cannot be told not to: the fetch
        // is bounded here, so one call path keeps one retry policy, the decorator's.
        let scopes = [self.scope.as_str()];
        let fetch = self.credential.get_token(&scopes, None);
        let token = tokio::time::timeout(TOKEN_FETCH_TIMEOUT, fetch)
            .await
            .map_err(|_| ArmError::Credential {
                message: format!("no token within {TOKEN_FETCH_TIMEOUT:?}"),
                retryable: true,
            })?
            .map_err(|e| {
                let retryable = matches!(
                    e.kind(),
                    azure_core::error::ErrorKind::Connection | azure_core::error::ErrorKind::Io
                );
                ArmError::Credential {
                    message: e.to_string(),
                    retryable,
                }
            })?;
        *cached = Some(token.clone());
        Ok(token)
    }
}

// ---- the resource shapes (Microsoft.Compute 2024-07-01), only the fields used ----

/// A virtual machine resource.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachine {
    #[serde(default, skip_serializing)]
    pub id: Option<String>,
    #[serde(default)]
    pub location: String,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub zones: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub tags: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "null_default")]
    pub properties: VmProperties,
}

impl VirtualMachine {
    pub fn provisioning_state(&self) -> Option<&str> {
        self.properties.provisioning_state.as_deref()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmProperties {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_profile: Option<HardwareProfile>,
    /// `Regular`, `Spot` or `Low` (the old name of Spot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// `Deallocate` or `Delete`; Spot only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_policy: Option<String>,
    /// Spot only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billing_profile: Option<BillingProfile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_profile: Option<StorageProfile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_profile: Option<OsProfile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_profile: Option<NetworkProfile>,
    /// Read only: `Creating`, `Updating`, `Succeeded`, `Failed`, `Deleting`, ...
    #[serde(default, skip_serializing)]
    pub provisioning_state: Option<String>,
    /// Read only: RFC 3339.
    #[serde(default, skip_serializing)]
    pub time_created: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HardwareProfile {
    #[serde(default)]
    pub vm_size: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BillingProfile {
    /// US dollars per hour; -1: up to the on-demand price, evicted only for capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_price: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageProfile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_reference: Option<ImageReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_disk: Option<OsDisk>,
}

/// A marketplace image (`publisher`, `offer`, `sku`, `version`) or an image resource `id`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sku: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OsDisk {
    #[serde(default)]
    pub create_option: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_option: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OsProfile {
    #[serde(default)]
    pub computer_name: String,
    #[serde(default)]
    pub admin_username: String,
    /// Base64; cloud-init runs it. Write-only: ARM never returns it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linux_configuration: Option<LinuxConfiguration>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinuxConfiguration {
    #[serde(default)]
    pub disable_password_authentication: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshConfiguration>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SshConfiguration {
    #[serde(default)]
    pub public_keys: Vec<SshPublicKey>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SshPublicKey {
    pub path: String,
    pub key_data: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkProfile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_interface_configurations: Vec<NicConfiguration>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NicConfiguration {
    pub name: String,
    #[serde(default)]
    pub properties: NicProperties,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NicProperties {
    #[serde(default)]
    pub primary: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_option: Option<String>,
    #[serde(default)]
    pub ip_configurations: Vec<IpConfiguration>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpConfiguration {
    pub name: String,
    #[serde(default)]
    pub properties: IpConfigurationProperties,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpConfigurationProperties {
    #[serde(default)]
    pub primary: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<SubResource>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubResource {
    pub id: String,
}

/// `GET …/virtualMachines/{name}/instanceView`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceView {
    #[serde(default, deserialize_with = "null_default")]
    pub statuses: Vec<InstanceViewStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceViewStatus {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: Option<String>,
}

impl InstanceView {
    /// The `PowerState/…` suffix: `running`, `starting`, `stopping`, `stopped`,
    /// `deallocating`, `deallocated`.
    pub fn power_state(&self) -> Option<&str> {
        self.statuses
            .iter()
            .find_map(|s| s.code.strip_prefix("PowerState/"))
    }

    /// `ProvisioningState/failed/<code>` as (code, message).
    pub fn failure(&self) -> Option<(String, String)> {
        self.statuses.iter().find_map(|s| {
            let code = s.code.strip_prefix("ProvisioningState/failed/")?;
            Some((code.to_owned(), s.message.clone().unwrap_or_default()))
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct VmList {
    #[serde(default, deserialize_with = "null_default")]
    value: Vec<VirtualMachine>,
    #[serde(default)]
    next_link: Option<String>,
}

/// The body of an `Azure-AsyncOperation` URL.
#[derive(Debug, Deserialize)]
struct AsyncOperation {
    #[serde(default)]
    status: String,
    #[serde(default)]
    error: Option<ErrorDetail>,
}

#[derive(Debug, Deserialize)]
struct ErrorResponse {
    #[serde(default)]
    error: Option<ErrorDetail>,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    code: String,
    #[serde(default, deserialize_with = "null_default")]
    message: String,
    #[serde(default, deserialize_with = "null_default")]
    details: Vec<ErrorDetail>,
}

/// ARM writes `null` for some absent values; read it as the default.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}
