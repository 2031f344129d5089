//! The Azure provider against a fake Resource Manager and Retail Prices API (wiremock) that
//! answers in the documented shapes and checks what is sent: the api-version, the bearer
//! token, and the VM body. One test runs against real Azure when asked to.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use azure_core::time::{Duration as TimeDuration, OffsetDateTime};
use serde_json::{Value, json};
use spotplane_core::{Cloud, GpuModel, Market, Micros, NodeId};

use crate::PriceSource;
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use super::*;
use crate::catalog;

const SUB: &str = "00000000-0000-0000-0000-00000000000a";
const RG: &str = "spotplane-rg";
const TOKEN: &str = "fake-arm-token";
const SUBNET: &str = "/subscriptions/00000000-0000-0000-0000-00000000000a/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/vnet/subnets/gpu";

/// Hands out a fixed token and counts how often it was asked.
#[derive(Debug, Default)]
struct FakeCredential {
    calls: AtomicUsize,
}

#[async_trait]
impl TokenCredential for FakeCredential {
    async fn get_token(
        &self,
        scopes: &[&str],
        _options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        assert_eq!(scopes.len(), 1);
        assert!(scopes[0].ends_with("/.default"), "{scopes:?}");
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(AccessToken::new(
            TOKEN,
            OffsetDateTime::now_utc() + TimeDuration::hours(1),
        ))
    }
}

const CATALOG: &str = "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,Region,AvailabilityZone,Price,SpotPrice,PlacementScore,InterruptionBucket
Standard_NC24ads_A100_v4,24,220.0,A100-80GB,1,eastus,eastus-1,3.673,0.7346,,
Standard_NC24ads_A100_v4,24,220.0,A100-80GB,1,eastus,eastus-2,3.673,0.7346,,
Standard_NC16as_T4_v3,16,110.0,T4,1,eastus,eastus-1,1.204,0.143517,,
Standard_D4s_v5,4,16.0,,,eastus,eastus-1,0.192,0.0192,,
Standard_NC24ads_A100_v4,24,220.0,A100-80GB,1,westus2,westus2-1,3.673,0.7,,
";

fn config(server: &MockServer) -> AzureConfig {
    AzureConfig {
        subscription_id: SUB.into(),
        resource_group: RG.into(),
        locations: vec!["eastus".into()],
        endpoint_url: Some(server.uri()),
        prices_endpoint_url: Some(server.uri()),
        vm_sizes: vec![],
        subnet_id: SUBNET.into(),
        image: "microsoft-dsvm:ubuntu-hpc:2204:latest".into(),
        admin_username: "spotplane".into(),
        ssh_public_key: Some("ssh-ed25519 AAAAC3Nza test@spotplane".into()),
        eviction_policy: AzureEvictionPolicy::Delete,
        max_price_usd: Some(2.5),
    }
}

fn provider_with(cfg: &AzureConfig, credential: Arc<FakeCredential>) -> AzureProvider {
    let rows = catalog::parse(CATALOG, "test.csv").expect("catalog");
    AzureProvider::build(
        cfg,
        rows,
        credential,
        PollPolicy {
            interval: Duration::from_millis(1),
            max_interval: Duration::from_millis(20),
            max_polls: 5,
        },
    )
    .expect("provider")
}

fn provider(server: &MockServer) -> AzureProvider {
    provider_with(&config(server), Arc::new(FakeCredential::default()))
}

fn node() -> NodeId {
    "0190f3c4-5a6b-7c8d-9e0f-102132435465"
        .parse()
        .expect("node id")
}

fn offer(market: Market) -> Offer {
    Offer {
        cloud: Cloud::Azure,
        region: "eastus".into(),
        zone: "eastus-1".into(),
        instance_type: "Standard_NC24ads_A100_v4".into(),
        market,
        gpu_model: Some(GpuModel::A100_80GB),
        gpu_count: 1,
        vcpus: 24,
        memory_mib: 225_280,
        price: Micros::parse_usd("0.7346").expect("price"),
        on_demand_price: Micros::parse_usd("3.673").expect("price"),
        placement_score: None,
        interruption_bucket: None,
        price_source: crate::PriceSource::Catalog,
        on_demand_source: crate::PriceSource::Catalog,
    }
}

fn request(market: Market) -> ProvisionRequest {
    ProvisionRequest {
        node_id: node(),
        offer: offer(market),
        client_token: "tok-1".into(),
        tags: BTreeMap::from([
            ("spotplane-cluster".to_owned(), "prod".to_owned()),
            ("team".to_owned(), "research".to_owned()),
        ]),
        user_data: Some("#!/bin/sh\necho agent\n".into()),
    }
}

fn vm_path(name: &str) -> String {
    format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/{name}"
    )
}

fn list_path() -> String {
    format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines")
}

/// A VM as ARM returns it.
fn vm_json(name: &str, state: &str, priority: &str, tags: Value) -> Value {
    json!({
        "id": vm_path(name),
        "name": name,
        "type": "Microsoft.Compute/virtualMachines",
        "location": "eastus",
        "zones": ["1"],
        "tags": tags,
        "properties": {
            "vmId": "5c1b4a28-0000-0000-0000-000000000000",
            "hardwareProfile": {"vmSize": "Standard_NC24ads_A100_v4"},
            "priority": priority,
            "provisioningState": state,
            "timeCreated": "2026-11-30T08:00:00.1234567+00:00"
        }
    })
}

fn arm_error(status: u16, code: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .set_body_json(json!({"error": {"code": code, "message": message}}))
}

/// An ARM mock: the method and path, the pinned api-version and the fake bearer token.
fn arm(verb: &str, p: &str) -> wiremock::MockBuilder {
    Mock::given(method(verb))
        .and(path(p.to_owned()))
        .and(query_param("api-version", "2024-07-01"))
        .and(header("authorization", format!("Bearer {TOKEN}").as_str()))
}

async fn requests(server: &MockServer, verb: &str) -> Vec<Request> {
    server
        .received_requests()
        .await
        .expect("recording")
        .into_iter()
        .filter(|r| r.method.as_str() == verb)
        .collect()
}

#[tokio::test]
async fn spot_provision_puts_a_spot_vm_and_waits_for_the_async_operation() {
    let server = MockServer::start().await;
    let req = request(Market::Spot);
    let name = vm_name(req.node_id, &req.client_token);
    let tags =
        json!({"spotplane-cluster": "prod", "team": "research", NODE_ID_TAG: node().to_string()});
    let op = format!(
        "{}/subscriptions/{SUB}/providers/Microsoft.Compute/locations/eastus/operations/op-1?api-version=2024-07-01",
        server.uri()
    );
    arm("GET", &vm_path(&name))
        .respond_with(arm_error(404, "ResourceNotFound", "not found"))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    arm("PUT", &vm_path(&name))
        .respond_with(
            ResponseTemplate::new(201)
                .set_body_json(vm_json(&name, "Creating", "Spot", tags.clone()))
                .insert_header("Azure-AsyncOperation", op.as_str())
                .insert_header("Retry-After", "0"),
        )
        .expect(1)
        .mount(&server)
        .await;
    let op_path = format!(
        "/subscriptions/{SUB}/providers/Microsoft.Compute/locations/eastus/operations/op-1"
    );
    arm("GET", &op_path)
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"name": "op-1", "status": "InProgress", "startTime": "2026-11-30T08:00:00Z"}),
        ))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    arm("GET", &op_path)
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"name": "op-1", "status": "Succeeded"})),
        )
        .expect(1)
        .mount(&server)
        .await;
    arm("GET", &vm_path(&name))
        .respond_with(ResponseTemplate::new(200).set_body_json(vm_json(
            &name,
            "Succeeded",
            "Spot",
            tags,
        )))
        .expect(1)
        .mount(&server)
        .await;

    let credential = Arc::new(FakeCredential::default());
    let p = provider_with(&config(&server), Arc::clone(&credential));
    let inst = p.provision(&req).await.expect("provisioned");

    assert_eq!(inst.provider_id, vm_path(&name));
    assert_eq!(inst.node_id, Some(node()));
    assert_eq!(inst.zone, "eastus-1");
    assert_eq!(inst.instance_type, "Standard_NC24ads_A100_v4");
    assert_eq!(inst.market, Market::Spot);
    assert_eq!(inst.state, InstanceState::Running);
    assert_eq!(
        inst.launched_at.map(|t| t.to_rfc3339()),
        Some("2026-11-30T08:00:00.123456700+00:00".to_owned())
    );
    assert_eq!(inst.tags.get("team").map(String::as_str), Some("research"));
    // One token for the five calls.
    assert_eq!(credential.calls.load(Ordering::SeqCst), 1);

    let puts = requests(&server, "PUT").await;
    assert_eq!(puts.len(), 1);
    let body: Value = puts[0].body_json().expect("json body");
    assert_eq!(body["location"], "eastus");
    assert_eq!(body["zones"], json!(["1"]));
    assert_eq!(
        body["tags"],
        json!({"spotplane-cluster": "prod", "team": "research", "spotplane-node-id": node().to_string()})
    );
    let props = &body["properties"];
    assert_eq!(
        props["hardwareProfile"]["vmSize"],
        "Standard_NC24ads_A100_v4"
    );
    assert_eq!(props["priority"], "Spot");
    assert_eq!(props["evictionPolicy"], "Delete");
    assert_eq!(props["billingProfile"]["maxPrice"], 2.5);
    assert_eq!(
        props["storageProfile"]["imageReference"],
        json!({"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"})
    );
    assert_eq!(
        props["storageProfile"]["osDisk"]["createOption"],
        "FromImage"
    );
    assert_eq!(props["storageProfile"]["osDisk"]["deleteOption"], "Delete");
    let os = &props["osProfile"];
    assert_eq!(os["computerName"], name.as_str());
    assert_eq!(os["adminUsername"], "spotplane");
    assert_eq!(
        os["customData"],
        azure_core::base64::encode("#!/bin/sh\necho agent\n")
    );
    assert_eq!(
        os["linuxConfiguration"]["disablePasswordAuthentication"],
        true
    );
    assert_eq!(
        os["linuxConfiguration"]["ssh"]["publicKeys"],
        json!([{"path": "/home/spotplane/.ssh/authorized_keys", "keyData": "ssh-ed25519 AAAAC3Nza test@spotplane"}])
    );
    let net = &props["networkProfile"];
    assert_eq!(net["networkApiVersion"], "2020-11-01");
    let nic = &net["networkInterfaceConfigurations"][0];
    assert_eq!(nic["properties"]["primary"], true);
    assert_eq!(nic["properties"]["deleteOption"], "Delete");
    assert_eq!(
        nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"],
        SUBNET
    );
    // Read-only fields are not sent.
    assert!(props.get("provisioningState").is_none());
    assert!(body.get("id").is_none());
}

#[tokio::test]
async fn on_demand_provision_sends_regular_priority_without_spot_fields() {
    let server = MockServer::start().await;
    let req = request(Market::OnDemand);
    let name = vm_name(req.node_id, &req.client_token);
    arm("GET", &vm_path(&name))
        .respond_with(arm_error(404, "ResourceNotFound", "not found"))
        .mount(&server)
        .await;
    // A 200 already Succeeded and no operation header: nothing to wait for.
    arm("PUT", &vm_path(&name))
        .respond_with(ResponseTemplate::new(200).set_body_json(vm_json(
            &name,
            "Succeeded",
            "Regular",
            json!({}),
        )))
        .expect(1)
        .mount(&server)
        .await;
    let inst = provider(&server)
        .provision(&req)
        .await
        .expect("provisioned");
    assert_eq!(inst.market, Market::OnDemand);
    assert_eq!(inst.state, InstanceState::Running);
    let body: Value = requests(&server, "PUT").await[0].body_json().expect("json");
    assert_eq!(body["properties"]["priority"], "Regular");
    assert!(body["properties"].get("evictionPolicy").is_none());
    assert!(body["properties"].get("billingProfile").is_none());
}

#[tokio::test]
async fn a_repeated_provision_returns_the_vm_the_first_call_created() {
    let server = MockServer::start().await;
    let req = request(Market::Spot);
    let name = vm_name(req.node_id, &req.client_token);
    assert_eq!(name, vm_name(node(), "tok-1"), "the name is stable");
    assert_ne!(name, vm_name(node(), "tok-2"), "another token, another VM");
    assert!(name.len() <= 64, "{name}");
    arm("GET", &vm_path(&name))
        .respond_with(ResponseTemplate::new(200).set_body_json(vm_json(
            &name,
            "Creating",
            "Spot",
            json!({NODE_ID_TAG: node().to_string()}),
        )))
        .mount(&server)
        .await;
    arm("PUT", &vm_path(&name))
        .respond_with(ResponseTemplate::new(500))
        .expect(0)
        .mount(&server)
        .await;
    let inst = provider(&server).provision(&req).await.expect("existing");
    assert_eq!(inst.provider_id, vm_path(&name));
    assert_eq!(inst.state, InstanceState::Pending);
    assert_eq!(inst.node_id, Some(node()));
}

#[tokio::test]
async fn an_asynchronous_allocation_failure_is_insufficient_capacity_and_the_vm_is_deleted() {
    let server = MockServer::start().await;
    let req = request(Market::Spot);
    let name = vm_name(req.node_id, &req.client_token);
    let op_path = format!(
        "/subscriptions/{SUB}/providers/Microsoft.Compute/locations/eastus/operations/op-2"
    );
    arm("GET", &vm_path(&name))
        .respond_with(arm_error(404, "ResourceNotFound", "not found"))
        .mount(&server)
        .await;
    arm("PUT", &vm_path(&name))
        .respond_with(
            ResponseTemplate::new(201)
                .set_body_json(vm_json(&name, "Creating", "Spot", json!({})))
                .insert_header(
                    "Azure-AsyncOperation",
                    format!("{}{op_path}?api-version=2024-07-01", server.uri()).as_str(),
                ),
        )
        .mount(&server)
        .await;
    arm("GET", &op_path)
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "status": "Failed",
            "error": {"code": "ZonalAllocationFailed", "message": "Allocation failed. We do not have sufficient capacity for the requested VM size in this zone."}
        })))
        .mount(&server)
        .await;
    arm("DELETE", &vm_path(&name))
        .and(query_param("forceDeletion", "true"))
        .respond_with(ResponseTemplate::new(202))
        .expect(1)
        .mount(&server)
        .await;
    let err = provider(&server)
        .provision(&req)
        .await
        .expect_err("no capacity");
    match err {
        ProviderError::InsufficientCapacity { offer_id, message } => {
            assert_eq!(offer_id, req.offer.id());
            assert!(message.contains("ZonalAllocationFailed"), "{message}");
        }
        other => panic!("expected InsufficientCapacity, got {other:?}"),
    }
}

#[tokio::test]
async fn sku_not_available_on_put_is_insufficient_capacity() {
    let server = MockServer::start().await;
    let req = request(Market::Spot);
    let name = vm_name(req.node_id, &req.client_token);
    arm("GET", &vm_path(&name))
        .respond_with(arm_error(404, "ResourceNotFound", "not found"))
        .mount(&server)
        .await;
    arm("PUT", &vm_path(&name))
        .respond_with(arm_error(
            409,
            "SkuNotAvailable",
            "The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: Standard_NC24ads_A100_v4' is currently not available in location 'eastus'.",
        ))
        .mount(&server)
        .await;
    let err = provider(&server)
        .provision(&req)
        .await
        .expect_err("refused");
    assert!(
        matches!(&err, ProviderError::InsufficientCapacity { offer_id, .. } if *offer_id == req.offer.id()),
        "{err:?}"
    );
    assert!(requests(&server, "DELETE").await.is_empty());
}

#[tokio::test]
async fn throttling_carries_retry_after() {
    let server = MockServer::start().await;
    let req = request(Market::Spot);
    let name = vm_name(req.node_id, &req.client_token);
    arm("GET", &vm_path(&name))
        .respond_with(
            arm_error(429, "TooManyRequests", "The request is being throttled.")
                .insert_header("Retry-After", "17"),
        )
        .mount(&server)
        .await;
    let err = provider(&server)
        .provision(&req)
        .await
        .expect_err("throttled");
    assert_eq!(
        err,
        ProviderError::Throttled {
            retry_after: Duration::from_secs(17)
        }
    );
}

#[tokio::test]
async fn a_token_arm_refuses_is_an_auth_error() {
    // The fake ARM answers 401 to anything, as ARM does to an expired or foreign token.
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(arm_error(
            401,
            "InvalidAuthenticationToken",
            "The access token is invalid.",
        ))
        .mount(&server)
        .await;
    let err = provider(&server)
        .list_instances(&BTreeMap::new())
        .await
        .expect_err("401");
    assert!(matches!(err, ProviderError::Auth(_)), "{err:?}");
}

#[test]
fn arm_error_codes_map_to_what_the_planner_branches_on() {
    let resp = |status: u16, code: &str, message: &str, details: &[&str]| ArmError::Response {
        status,
        code: code.into(),
        message: message.into(),
        detail_codes: details.iter().map(|d| (*d).to_owned()).collect(),
        retry_after: None,
    };
    let op = |code: &str| ArmError::Operation {
        code: code.into(),
        message: "m".into(),
        detail_codes: vec![],
    };
    let cases: Vec<(ArmError, &str)> = vec![
        (
            resp(409, "SkuNotAvailable", "m", &[]),
            "insufficient_capacity",
        ),
        (op("AllocationFailed"), "insufficient_capacity"),
        (
            op("OverconstrainedAllocationRequest"),
            "insufficient_capacity",
        ),
        (
            op("OverconstrainedZonalAllocationRequest"),
            "insufficient_capacity",
        ),
        (
            resp(400, "DeploymentFailed", "m", &["SkuNotAvailable"]),
            "insufficient_capacity",
        ),
        (
            resp(
                409,
                "OperationNotAllowed",
                "Operation could not be completed as it results in exceeding approved LowPriorityCores quota.",
                &[],
            ),
            "quota",
        ),
        (
            resp(409, "OperationNotAllowed", "The VM is being moved.", &[]),
            "invalid_request",
        ),
        (resp(409, "QuotaExceeded", "m", &[]), "quota"),
        (
            resp(409, "SpotPriceGreaterThanProvidedMaxPrice", "m", &[]),
            "price_too_low",
        ),
        (op("SpotPriceGreaterThanProvidedMaxPrice"), "price_too_low"),
        (resp(403, "AuthorizationFailed", "m", &[]), "auth"),
        (resp(403, "LinkedAuthorizationFailed", "m", &[]), "auth"),
        (resp(401, "ExpiredAuthenticationToken", "m", &[]), "auth"),
        (resp(404, "ResourceGroupNotFound", "m", &[]), "not_found"),
        (
            resp(429, "SubscriptionRequestsThrottled", "m", &[]),
            "throttled",
        ),
        (resp(400, "InvalidParameter", "m", &[]), "invalid_request"),
        (resp(409, "RetryableError", "m", &[]), "transient"),
        (resp(500, "InternalServerError", "m", &[]), "transient"),
        (resp(503, "", "<html>", &[]), "transient"),
        (op("OSProvisioningTimedOut"), "transient"),
        (op("InvalidParameter"), "invalid_request"),
        (ArmError::Transport("connection reset".into()), "transient"),
        (
            ArmError::Credential {
                message: "az not logged in".into(),
                retryable: false,
            },
            "auth",
        ),
        (
            ArmError::Credential {
                message: "IMDS unreachable".into(),
                retryable: true,
            },
            "transient",
        ),
    ];
    for (e, kind) in cases {
        let shown = format!("{e}");
        assert_eq!(
            classify(e, "azure/eastus/eastus-1/x/spot").kind(),
            kind,
            "{shown}"
        );
    }
}

#[tokio::test]
async fn terminate_counts_accepted_no_content_and_not_found_as_done() {
    let server = MockServer::start().await;
    for (name, status) in [("vm-a", 202), ("vm-b", 204), ("vm-c", 200)] {
        arm("DELETE", &vm_path(name))
            .and(query_param("forceDeletion", "true"))
            .respond_with(ResponseTemplate::new(status))
            .expect(1)
            .mount(&server)
            .await;
    }
    arm("DELETE", &vm_path("vm-gone"))
        .respond_with(arm_error(404, "ResourceNotFound", "not found"))
        .expect(1)
        .mount(&server)
        .await;
    arm("DELETE", &vm_path("vm-locked"))
        .respond_with(arm_error(
            403,
            "AuthorizationFailed",
            "no delete permission",
        ))
        .mount(&server)
        .await;
    let p = provider(&server);
    for name in ["vm-a", "vm-b", "vm-c", "vm-gone"] {
        p.terminate(&vm_path(name)).await.expect(name);
    }
    assert!(matches!(
        p.terminate(&vm_path("vm-locked")).await,
        Err(ProviderError::Auth(_))
    ));
    assert!(matches!(
        p.terminate("i-0abc").await,
        Err(ProviderError::InvalidRequest(_))
    ));
    assert!(matches!(
        p.terminate(&format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/networkInterfaces/nic")).await,
        Err(ProviderError::InvalidRequest(_))
    ));
}

#[tokio::test]
async fn list_instances_follows_next_link_and_keeps_vms_with_every_tag() {
    let server = MockServer::start().await;
    let n = node();
    let next = format!(
        "{}{}?api-version=2024-07-01&$skiptoken=page2",
        server.uri(),
        list_path()
    );
    arm("GET", &list_path())
        .and(query_param_is_missing("$skiptoken"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "value": [
                vm_json("vm-a", "Succeeded", "Spot", json!({"spotplane-cluster": "c1", NODE_ID_TAG: n.to_string()})),
                vm_json("vm-b", "Succeeded", "Spot", json!({"spotplane-cluster": "c2"})),
            ],
            "nextLink": next,
        })))
        .expect(2)
        .mount(&server)
        .await;
    arm("GET", &list_path())
        .and(query_param("$skiptoken", "page2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "value": [
                vm_json("vm-c", "Deleting", "Regular", json!({"spotplane-cluster": "c1", "team": "x"})),
                vm_json("vm-d", "Creating", "Spot", Value::Null),
            ]
        })))
        .expect(2)
        .mount(&server)
        .await;
    let p = provider(&server);

    let c1 = p
        .list_instances(&BTreeMap::from([("spotplane-cluster".into(), "c1".into())]))
        .await
        .expect("listed");
    let ids: Vec<&str> = c1.iter().map(|i| i.provider_id.as_str()).collect();
    assert_eq!(ids, [vm_path("vm-a"), vm_path("vm-c")]);
    assert_eq!(c1[0].node_id, Some(n));
    assert_eq!(c1[0].state, InstanceState::Running);
    assert_eq!(c1[0].market, Market::Spot);
    assert_eq!(c1[0].zone, "eastus-1");
    assert_eq!(c1[1].node_id, None);
    assert_eq!(c1[1].state, InstanceState::Terminating);
    assert_eq!(c1[1].market, Market::OnDemand);

    let both = p
        .list_instances(&BTreeMap::from([
            ("spotplane-cluster".into(), "c1".into()),
            ("team".into(), "x".into()),
        ]))
        .await
        .expect("listed");
    assert_eq!(both.len(), 1);
    assert_eq!(both[0].provider_id, vm_path("vm-c"));
}

#[tokio::test]
async fn a_next_link_to_another_host_is_not_followed() {
    let server = MockServer::start().await;
    arm("GET", &list_path())
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "value": [],
            "nextLink": "https://attacker.example/steal?api-version=2024-07-01",
        })))
        .mount(&server)
        .await;
    let err = provider(&server)
        .list_instances(&BTreeMap::new())
        .await
        .expect_err("refused");
    assert_eq!(err.kind(), "transient", "{err:?}");
}

#[tokio::test]
async fn an_evicted_deallocated_spot_vm_is_reported_stopped() {
    let server = MockServer::start().await;
    let mut cfg = config(&server);
    cfg.eviction_policy = AzureEvictionPolicy::Deallocate;
    arm("GET", &list_path())
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "value": [vm_json("vm-a", "Succeeded", "Spot", json!({"k": "v"}))]
        })))
        .mount(&server)
        .await;
    arm("GET", &format!("{}/instanceView", vm_path("vm-a")))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "statuses": [
                {"code": "ProvisioningState/succeeded", "level": "Info", "displayStatus": "Provisioning succeeded"},
                {"code": "PowerState/deallocated", "level": "Info", "displayStatus": "VM deallocated"}
            ]
        })))
        .expect(1)
        .mount(&server)
        .await;
    let p = provider_with(&cfg, Arc::new(FakeCredential::default()));
    let listed = p.list_instances(&BTreeMap::new()).await.expect("listed");
    assert_eq!(listed[0].state, InstanceState::Stopped);
}

/// A Retail Prices item in the API's shape.
fn price(sku: &str, sku_name: &str, product: &str, kind: &str, retail: f64) -> Value {
    json!({
        "currencyCode": "USD",
        "tierMinimumUnits": 0.0,
        "retailPrice": retail,
        "unitPrice": retail,
        "armRegionName": "eastus",
        "location": "US East",
        "effectiveStartDate": "2024-06-01T00:00:00Z",
        "meterName": sku_name,
        "productName": product,
        "skuName": sku_name,
        "serviceName": "Virtual Machines",
        "serviceFamily": "Compute",
        "unitOfMeasure": "1 Hour",
        "type": kind,
        "isPrimaryMeterRegion": true,
        "armSkuName": sku
    })
}

fn find(offers: &[Offer], size: &str, zone: &str, market: Market) -> Offer {
    offers
        .iter()
        .find(|o| &*o.instance_type == size && &*o.zone == zone && o.market == market)
        .cloned()
        .unwrap_or_else(|| panic!("no {size} {zone} {market:?} in {offers:#?}"))
}

#[tokio::test]
async fn offers_take_live_prices_across_pages_and_the_catalog_where_a_price_is_missing() {
    let server = MockServer::start().await;
    let a100 = "Standard_NC24ads_A100_v4";
    let t4 = "Standard_NC16as_T4_v3";
    Mock::given(method("GET"))
        .and(path("/api/retail/prices"))
        .and(query_param("api-version", "2023-01-01-preview"))
        .and(query_param_is_missing("$skip"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "BillingCurrency": "USD",
            "CustomerEntityId": "Default",
            "CustomerEntityType": "Retail",
            "Items": [
                price(a100, "NC24ads A100 v4", "Virtual Machines NCads A100 v4 Series", "Consumption", 3.673),
                price(a100, "NC24ads A100 v4", "Virtual Machines NCads A100 v4 Series Windows", "Consumption", 4.409),
                price(a100, "NC24ads A100 v4 Spot", "Virtual Machines NCads A100 v4 Series Windows", "Consumption", 1.1),
                price(a100, "NC24ads A100 v4", "Virtual Machines NCads A100 v4 Series", "DevTestConsumption", 2.0),
                price(t4, "NC16as T4 v3 Low Priority", "Virtual Machines NCasT4 v3 Series", "Consumption", 0.2408),
            ],
            "NextPageLink": format!("{}/api/retail/prices?api-version=2023-01-01-preview&$skip=100", server.uri()),
            "Count": 5
        })))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/retail/prices"))
        .and(query_param("$skip", "100"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "Items": [
                price(a100, "NC24ads A100 v4 Spot", "Virtual Machines NCads A100 v4 Series", "Consumption", 0.52894),
                price(t4, "NC16as T4 v3", "Virtual Machines NCasT4 v3 Series", "Consumption", 1.2),
            ],
            "NextPageLink": null,
            "Count": 2
        })))
        .expect(1)
        .mount(&server)
        .await;
    let p = provider(&server);
    let offers = p.list_offers().await.expect("offers");

    // A100 in two zones and T4 in one, each spot and on demand; not the CPU size, not westus2.
    assert_eq!(offers.len(), 6, "{offers:#?}");
    assert!(
        offers
            .iter()
            .all(|o| o.cloud == Cloud::Azure && &*o.region == "eastus")
    );
    let spot = find(&offers, a100, "eastus-2", Market::Spot);
    assert_eq!(spot.price, Micros(528_940));
    assert_eq!(spot.on_demand_price, Micros(3_673_000));
    assert_eq!(spot.gpu_model, Some(GpuModel::A100_80GB));
    assert_eq!(spot.memory_mib, 225_280);
    assert_eq!(
        find(&offers, a100, "eastus-1", Market::OnDemand).price,
        Micros(3_673_000)
    );
    assert_eq!(spot.price_source, PriceSource::Live);
    assert_eq!(spot.on_demand_source, PriceSource::Live);
    // T4: the live on-demand price, the catalog's spot price (the API had none), and the
    // offer says which is which.
    let t4_od = find(&offers, t4, "eastus-1", Market::OnDemand);
    assert_eq!(t4_od.price, Micros(1_200_000));
    assert_eq!(t4_od.on_demand_source, PriceSource::Live);
    let t4_spot = find(&offers, t4, "eastus-1", Market::Spot);
    assert_eq!(t4_spot.price, Micros(143_517));
    assert_eq!(
        (t4_spot.price_source, t4_spot.on_demand_source),
        (PriceSource::Catalog, PriceSource::Live)
    );

    let gets = requests(&server, "GET").await;
    let first = &gets[0];
    let filter = first
        .url
        .query_pairs()
        .find(|(k, _)| k == "$filter")
        .map(|(_, v)| v.into_owned())
        .expect("$filter");
    assert!(
        filter.contains("serviceName eq 'Virtual Machines'"),
        "{filter}"
    );
    assert!(filter.contains("armRegionName eq 'eastus'"), "{filter}");
    assert!(
        filter.contains(&format!("armSkuName eq '{a100}'")),
        "{filter}"
    );
    assert!(
        filter.contains(&format!("armSkuName eq '{t4}'")),
        "{filter}"
    );
    assert!(!filter.contains("Standard_D4s_v5"), "{filter}");
    // The public price API gets no ARM token.
    assert!(
        gets.iter()
            .all(|r| !r.headers.contains_key("authorization"))
    );

    // Served from the cache: no further price calls (the mocks expect one call each).
    let again = p.list_offers().await.expect("cached");
    assert_eq!(again, offers);
}

#[tokio::test]
async fn offers_fall_back_to_catalog_prices_when_the_price_api_fails() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/retail/prices"))
        .respond_with(ResponseTemplate::new(503).set_body_string("unavailable"))
        .mount(&server)
        .await;
    let mut cfg = config(&server);
    cfg.vm_sizes = vec![
        "Standard_NC24ads_A100_v4".into(),
        "Standard_Unknown_v9".into(),
    ];
    let p = provider_with(&cfg, Arc::new(FakeCredential::default()));
    let offers = p.list_offers().await.expect("never fails for prices");
    assert_eq!(offers.len(), 4, "{offers:#?}");
    let spot = find(
        &offers,
        "Standard_NC24ads_A100_v4",
        "eastus-1",
        Market::Spot,
    );
    assert_eq!(spot.price, Micros(734_600));
    assert_eq!(spot.on_demand_price, Micros(3_673_000));
}

#[test]
fn configuration_is_checked_before_any_call() {
    let rows = catalog::parse(CATALOG, "test.csv").expect("catalog");
    let cred = || Arc::new(FakeCredential::default()) as Arc<dyn TokenCredential>;
    let base = AzureConfig {
        subscription_id: SUB.into(),
        resource_group: RG.into(),
        locations: vec!["eastus".into()],
        endpoint_url: None,
        prices_endpoint_url: None,
        vm_sizes: vec![],
        subnet_id: SUBNET.into(),
        image: "microsoft-dsvm:ubuntu-hpc:2204:latest".into(),
        admin_username: "spotplane".into(),
        ssh_public_key: Some("ssh-ed25519 AAAA".into()),
        eviction_policy: AzureEvictionPolicy::Delete,
        max_price_usd: None,
    };
    assert!(AzureProvider::with_credential(&base, rows.clone(), cred()).is_ok());
    let mut no_key = base.clone();
    no_key.ssh_public_key = None;
    assert!(matches!(
        AzureProvider::with_credential(&no_key, rows.clone(), cred()),
        Err(ProviderError::InvalidRequest(m)) if m.contains("ssh_public_key")
    ));
    let mut bad_image = base.clone();
    bad_image.image = "ubuntu".into();
    assert!(matches!(
        AzureProvider::with_credential(&bad_image, rows, cred()),
        Err(ProviderError::InvalidRequest(m)) if m.contains("publisher:offer:sku:version")
    ));
}

#[test]
fn images_zones_and_ids_are_read_as_azure_writes_them() {
    let gallery = "/subscriptions/s/resourceGroups/img/providers/Microsoft.Compute/galleries/g/images/gpu/versions/1.0.0";
    assert_eq!(
        parse_image(gallery).expect("id").id.as_deref(),
        Some(gallery)
    );
    let market = parse_image("Canonical:ubuntu-24_04-lts:server:latest").expect("urn");
    assert_eq!(market.publisher.as_deref(), Some("Canonical"));
    assert_eq!(market.version.as_deref(), Some("latest"));
    assert!(parse_image("a:b::d").is_err());

    assert_eq!(zone_number("eastus", "eastus-1").as_deref(), Some("1"));
    assert_eq!(zone_number("eastus", "eastus2-1"), None);
    assert_eq!(zone_number("westeurope", "westeurope"), None);

    assert!(is_vm_id(&vm_path("vm-a")));
    assert!(is_vm_id(&vm_path("vm-a").to_lowercase()));
    assert!(!is_vm_id(&format!("{}/extensions/x", vm_path("vm-a"))));

    assert_eq!(state_of(Some("Succeeded"), None), InstanceState::Running);
    assert_eq!(state_of(Some("Creating"), None), InstanceState::Pending);
    assert_eq!(state_of(Some("Failed"), None), InstanceState::Stopped);
    assert_eq!(
        state_of(Some("Deleting"), Some("running")),
        InstanceState::Terminating
    );
    assert_eq!(
        state_of(Some("Succeeded"), Some("deallocating")),
        InstanceState::Stopping
    );
}

#[tokio::test]
async fn interruptions_come_from_the_node_agents_not_the_provider() {
    let server = MockServer::start().await;
    let events = provider(&server)
        .drain_interruptions()
        .await
        .expect("empty");
    assert!(events.is_empty());
}

/// Against real Azure, read-only apart from deleting a VM that does not exist: lists offers
/// (live prices), lists the resource group's VMs, and terminates a made-up VM (404 → Ok).
/// Needs `SPOTPLANE_REAL_AZURE=1`, `AZURE_SUBSCRIPTION_ID`, `AZURE_RESOURCE_GROUP`, credentials
/// for the standard chain, and optionally `AZURE_LOCATION` (default eastus).
#[tokio::test]
async fn real_azure_lists_offers_and_instances_and_terminates_idempotently() {
    let (Ok(sub), Ok("1")) = (
        std::env::var("AZURE_SUBSCRIPTION_ID"),
        std::env::var("SPOTPLANE_REAL_AZURE").as_deref(),
    ) else {
        eprintln!(
            "skipped: set SPOTPLANE_REAL_AZURE=1 and AZURE_SUBSCRIPTION_ID to run against Azure"
        );
        return;
    };
    let Ok(rg) = std::env::var("AZURE_RESOURCE_GROUP") else {
        eprintln!("skipped: AZURE_RESOURCE_GROUP is not set");
        return;
    };
    let location = std::env::var("AZURE_LOCATION").unwrap_or_else(|_| "eastus".into());
    let cfg = AzureConfig {
        subscription_id: sub.clone(),
        resource_group: rg.clone(),
        locations: vec![location.clone()],
        endpoint_url: None,
        prices_endpoint_url: None,
        vm_sizes: vec![],
        subnet_id: format!(
            "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/virtualNetworks/unused/subnets/unused"
        ),
        image: "microsoft-dsvm:ubuntu-hpc:2204:latest".into(),
        admin_username: "spotplane".into(),
        ssh_public_key: Some("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN0t+used+for+reads+only".into()),
        eviction_policy: AzureEvictionPolicy::Delete,
        max_price_usd: None,
    };
    let rows = catalog::parse(catalog::embedded(Cloud::Azure), "azure.csv").expect("catalog");
    let p = AzureProvider::from_config(&cfg, rows)
        .await
        .expect("provider");
    let offers = p.list_offers().await.expect("offers");
    assert!(
        offers.iter().any(|o| o.market == Market::Spot),
        "{offers:#?}"
    );
    let listed = p.list_instances(&BTreeMap::new()).await.expect("instances");
    eprintln!("{} offers, {} VMs in {rg}", offers.len(), listed.len());
    p.terminate(&format!(
        "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/spotplane-does-not-exist"
    ))
    .await
    .expect("a VM that does not exist is terminated");
}

/// Serves one page of retail prices: the A100 size on demand at `usd`, spot at a fifth of it.
async fn serve_a100_at(server: &MockServer, usd: f64) {
    let a100 = "Standard_NC24ads_A100_v4";
    server.reset().await;
    Mock::given(method("GET"))
        .and(path("/api/retail/prices"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "Items": [
                price(a100, "NC24ads A100 v4", "Virtual Machines NCads A100 v4 Series", "Consumption", usd),
                price(a100, "NC24ads A100 v4 Spot", "Virtual Machines NCads A100 v4 Series", "Consumption", usd / 5.0),
            ],
            "NextPageLink": null,
        })))
        .mount(server)
        .await;
}

#[tokio::test]
async fn a_price_change_is_read_once_the_offers_expire() {
    let server = MockServer::start().await;
    let a100 = "Standard_NC24ads_A100_v4";
    serve_a100_at(&server, 3.673).await;
    let p = provider(&server);
    let od = |offers: &[Offer]| find(offers, a100, "eastus-1", Market::OnDemand).price;
    assert_eq!(
        od(&p.list_offers().await.expect("offers")),
        Micros(3_673_000)
    );

    // Azure changes the price: the offers in memory stand until they expire.
    serve_a100_at(&server, 3.2).await;
    assert_eq!(
        od(&p.list_offers().await.expect("cached")),
        Micros(3_673_000)
    );
    assert!(
        requests(&server, "GET").await.is_empty(),
        "served from memory"
    );
    // Five minutes pass on tokio's clock (nothing sleeps).
    tokio::time::pause();
    tokio::time::advance(OFFERS_TTL + Duration::from_secs(1)).await;
    tokio::time::resume();
    let after = p.list_offers().await.expect("offers");
    assert_eq!(od(&after), Micros(3_200_000));
    let spot = find(&after, a100, "eastus-1", Market::Spot);
    assert_eq!(
        (spot.price, spot.on_demand_price, spot.price_source),
        (Micros(640_000), Micros(3_200_000), PriceSource::Live)
    );
}
