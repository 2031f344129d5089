//! How each provider is configured: one `[[providers]]` table per cloud account.
//!
//! These types exist whether or not a cloud's cargo feature is built, so a configuration that
//! names a cloud the binary was built without is read, and refused with a clear reason, rather
//! than failing to parse.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use spotplane_core::{Cloud, FieldErrors};

use crate::sim::SimConfig;

/// One provider, by kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProviderConfig {
    /// A simulated cloud replaying recorded traces (the embedded default).
    Sim(SimConfig),
    Aws(AwsConfig),
    Gcp(GcpConfig),
    Azure(AzureConfig),
}

impl ProviderConfig {
    /// The cloud whose offers this provider lists.
    pub fn cloud(&self) -> Cloud {
        match self {
            ProviderConfig::Sim(c) => c.flavour,
            ProviderConfig::Aws(_) => Cloud::Aws,
            ProviderConfig::Gcp(_) => Cloud::Gcp,
            ProviderConfig::Azure(_) => Cloud::Azure,
        }
    }

    /// The kind, as written in the configuration.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderConfig::Sim(_) => "sim",
            ProviderConfig::Aws(_) => "aws",
            ProviderConfig::Gcp(_) => "gcp",
            ProviderConfig::Azure(_) => "azure",
        }
    }

    /// Checks what serde cannot; `at` is the table's path, e.g. `providers[1]`.
    pub fn validate(&self, at: &str, errs: &mut FieldErrors) {
        let nonempty = |errs: &mut FieldErrors, field: &str, v: &str| {
            if v.trim().is_empty() {
                errs.push(format!("{at}.{field}"), "must not be empty");
            }
        };
        match self {
            ProviderConfig::Sim(c) => {
                for (field, rate) in [
                    ("error_rate", c.error_rate),
                    ("throttle_rate", c.throttle_rate),
                ] {
                    if !(0.0..=1.0).contains(&rate) {
                        errs.push(format!("{at}.{field}"), "must be between 0 and 1");
                    }
                }
                if c.boot_seconds.0 > c.boot_seconds.1 {
                    errs.push(
                        format!("{at}.boot_seconds"),
                        "the shortest boot is longer than the longest",
                    );
                }
            }
            ProviderConfig::Aws(c) => {
                if c.regions.is_empty() {
                    errs.push(format!("{at}.regions"), "name at least one region");
                }
                nonempty(errs, "image_id", &c.image_id);
                if let Some(url) = &c.endpoint_url {
                    check_url(errs, &format!("{at}.endpoint_url"), url);
                }
            }
            ProviderConfig::Gcp(c) => {
                nonempty(errs, "project", &c.project);
                if c.zones.is_empty() {
                    errs.push(format!("{at}.zones"), "name at least one zone");
                }
                nonempty(errs, "source_image", &c.source_image);
                if let Some(url) = &c.endpoint_url {
                    check_url(errs, &format!("{at}.endpoint_url"), url);
                }
                if let Some(url) = &c.billing_endpoint_url {
                    check_url(errs, &format!("{at}.billing_endpoint_url"), url);
                }
                if c.anonymous_credentials && c.endpoint_url.is_none() {
                    errs.push(
                        format!("{at}.anonymous_credentials"),
                        "only with an endpoint_url (a test server); Google's own endpoints need credentials",
                    );
                }
            }
            ProviderConfig::Azure(c) => {
                nonempty(errs, "subscription_id", &c.subscription_id);
                nonempty(errs, "resource_group", &c.resource_group);
                nonempty(errs, "subnet_id", &c.subnet_id);
                // Password login is off, so Azure refuses a Linux VM without a key.
                if c.ssh_public_key
                    .as_deref()
                    .is_none_or(|k| k.trim().is_empty())
                {
                    errs.push(
                        format!("{at}.ssh_public_key"),
                        "required: nodes allow SSH-key login only",
                    );
                }
                if c.locations.is_empty() {
                    errs.push(format!("{at}.locations"), "name at least one location");
                }
                if let Some(url) = &c.endpoint_url {
                    check_url(errs, &format!("{at}.endpoint_url"), url);
                }
                if let Some(p) = c.max_price_usd
                    && p <= 0.0
                    && p != -1.0
                {
                    errs.push(
                        format!("{at}.max_price_usd"),
                        "must be positive, or -1 for up to the on-demand price",
                    );
                }
            }
        }
    }
}

fn check_url(errs: &mut FieldErrors, field: &str, url: &str) {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        errs.push(field.to_owned(), "must be an http:// or https:// URL");
    }
}

/// An AWS account in some regions (aws-sdk-ec2, aws-sdk-sqs). Credentials and the default region
/// come from the SDK's standard chain (environment, profile, SSO, instance role).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsConfig {
    pub regions: Vec<String>,
    /// Another endpoint for EC2 and SQS (a VPC endpoint, LocalStack, moto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_url: Option<String>,
    /// The SQS queue EventBridge sends spot interruption, rebalance, state-change and health
    /// events to (REFERENCE.md "AWS interruption events").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interruption_queue_url: Option<String>,
    /// GPU instance types to offer; every GPU type of the catalog when empty.
    #[serde(default)]
    pub instance_types: Vec<String>,
    /// The AMI nodes boot (with NVIDIA drivers and the node agent's prerequisites).
    pub image_id: String,
    /// The subnet to launch into, per availability zone name; the default VPC's when absent.
    #[serde(default)]
    pub subnets: BTreeMap<String, String>,
    #[serde(default)]
    pub security_group_ids: Vec<String>,
    /// The instance profile (by name) nodes run as, for checkpoint uploads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_profile: Option<String>,
    /// How to buy: `create_fleet` (instant, price-capacity-optimized) or `run_instances`.
    #[serde(default)]
    pub launch_api: AwsLaunchApi,
    /// Read on-demand prices from the AWS Price List Query API (`pricing:GetProducts`); the
    /// catalog's are used where it has none, and for every type when this is off.
    #[serde(default = "yes")]
    pub price_list: bool,
    /// The region whose Price List endpoint is asked: `us-east-1`, `eu-central-1` or
    /// `ap-south-1` (each answers for every region).
    #[serde(default = "default_price_list_region")]
    pub price_list_region: String,
    /// Another Price List endpoint; `endpoint_url` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_list_endpoint_url: Option<String>,
}

fn yes() -> bool {
    true
}

fn default_price_list_region() -> String {
    "us-east-1".into()
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AwsLaunchApi {
    #[default]
    CreateFleet,
    RunInstances,
}

/// A GCP project in some zones (google-cloud-compute-v1). Credentials from Application Default
/// Credentials.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcpConfig {
    pub project: String,
    pub zones: Vec<String>,
    /// Another Compute Engine endpoint (a private endpoint or a test server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_url: Option<String>,
    /// Another Cloud Billing Catalog endpoint; prices fall back to the catalog when it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billing_endpoint_url: Option<String>,
    /// GPU machine types to offer; every GPU type of the catalog when empty.
    #[serde(default)]
    pub machine_types: Vec<String>,
    /// The boot disk image, e.g. `projects/deeplearning-platform-release/global/images/family/common-cu124`.
    pub source_image: String,
    #[serde(default = "default_boot_disk_gb")]
    pub boot_disk_gb: u32,
    /// The network (self link or name); `default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnetwork: Option<String>,
    /// The service account nodes run as, for checkpoint uploads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// What GCE does with a preempted spot VM: `DELETE` (default) or `STOP`.
    #[serde(default)]
    pub termination_action: GcpTerminationAction,
    /// Send no credentials, instead of Application Default Credentials: only for a test server
    /// or emulator at `endpoint_url`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub anonymous_credentials: bool,
}

fn default_boot_disk_gb() -> u32 {
    200
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum GcpTerminationAction {
    #[default]
    Delete,
    Stop,
}

/// An Azure subscription's resource group in some locations (ARM REST with azure_identity).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureConfig {
    pub subscription_id: String,
    pub resource_group: String,
    pub locations: Vec<String>,
    /// Another Resource Manager endpoint (a sovereign cloud or a test server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_url: Option<String>,
    /// Another Retail Prices endpoint; prices fall back to the catalog when it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices_endpoint_url: Option<String>,
    /// GPU VM sizes to offer; every GPU size of the catalog when empty.
    #[serde(default)]
    pub vm_sizes: Vec<String>,
    /// The subnet (resource id) NICs are created in.
    pub subnet_id: String,
    /// The image: a resource id, or `publisher:offer:sku:version`.
    #[serde(default = "default_azure_image")]
    pub image: String,
    #[serde(default = "default_admin_username")]
    pub admin_username: String,
    /// The public key allowed to log in as `admin_username`; password login is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_public_key: Option<String>,
    /// `Delete` (default) or `Deallocate` when Azure evicts a spot VM.
    #[serde(default)]
    pub eviction_policy: AzureEvictionPolicy,
    /// The most to pay per hour in US dollars; -1 (default) pays up to the on-demand price and
    /// is evicted only for capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_price_usd: Option<f64>,
}

fn default_azure_image() -> String {
    "microsoft-dsvm:ubuntu-hpc:2204:latest".into()
}

fn default_admin_username() -> String {
    "spotplane".into()
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AzureEvictionPolicy {
    #[default]
    Delete,
    Deallocate,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_reads_from_toml_and_unknown_keys_are_refused() {
        #[derive(Deserialize)]
        struct Doc {
            providers: Vec<ProviderConfig>,
        }
        let doc: Doc = toml_from(
            r#"
            [[providers]]
            kind = "sim"
            flavour = "gcp"
            seed = 7

            [[providers]]
            kind = "aws"
            regions = ["us-east-1"]
            image_id = "ami-0123"
            interruption_queue_url = "https://sqs.us-east-1.amazonaws.com/1/q"
            "#,
        );
        assert_eq!(doc.providers[0].cloud(), Cloud::Gcp);
        assert_eq!(doc.providers[1].kind(), "aws");
        let bad = serde_json::from_value::<ProviderConfig>(serde_json::json!({
            "kind": "aws", "regions": ["us-east-1"], "image_id": "ami-1", "region": "typo"
        }));
        assert!(bad.is_err());
    }

    #[test]
    fn validation_names_each_wrong_field() {
        let cfg = ProviderConfig::Azure(AzureConfig {
            subscription_id: String::new(),
            resource_group: "rg".into(),
            locations: vec![],
            endpoint_url: Some("ftp://x".into()),
            prices_endpoint_url: None,
            vm_sizes: vec![],
            subnet_id: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/s".into(),
            image: default_azure_image(),
            admin_username: default_admin_username(),
            ssh_public_key: None,
            eviction_policy: AzureEvictionPolicy::Delete,
            max_price_usd: Some(0.0),
        });
        let mut errs = FieldErrors::default();
        cfg.validate("providers[0]", &mut errs);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "providers[0].subscription_id",
                "providers[0].ssh_public_key",
                "providers[0].locations",
                "providers[0].endpoint_url",
                "providers[0].max_price_usd"
            ]
        );
    }

    fn toml_from<T: serde::de::DeserializeOwned>(s: &str) -> T {
        toml::from_str(s).expect("parses")
    }
}
