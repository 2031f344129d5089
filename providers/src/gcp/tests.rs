//! The GCP provider against a fake Compute Engine and Cloud Billing (wiremock) answering in
//! the documented REST shapes; each test checks what the SDK sent as well as what came back.
//! `real_gcp_lists_offers_in_one_zone` talks to Google and runs only when asked to.

use serde_json::{Value, json};
use spotplane_core::{GpuModel, NodeId};
use wiremock::matchers::{
    bearer_token, body_partial_json, method, path, query_param, query_param_is_missing,
};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::billing::{Money, sku_gpu_model};
use super::*;
use crate::InstanceState;
use crate::catalog::{self, HEADER};

const PROJECT: &str = "proj";
const ZONE: &str = "us-central1-a";
const SKUS: &str = "/v1/services/6F81-5844-456A/skus";
const INSTANCES: &str = "/compute/v1/projects/proj/zones/us-central1-a/instances";

fn catalog_rows() -> Vec<CatalogRow> {
    let text = format!(
        "{HEADER}\n\
         a2-highgpu-1g,12,85,A100-40GB,1,us-central1,us-central1-a,4.0,1.9,,\n\
         g2-standard-4,4,16,L4,1,us-central1,us-central1-a,0.8,0.3,,\n\
         n1-standard-8,8,30,T4,1,us-central1,us-central1-a,0.73,0.2,,\n\
         a2-highgpu-1g,12,85,A100-40GB,1,europe-west4,europe-west4-a,4.2,1.7,,\n\
         e2-standard-4,4,16,,,us-central1,us-central1-a,0.13,0.04,,\n"
    );
    catalog::parse(&text, "test").expect("catalog")
}

fn config(server: &MockServer) -> GcpConfig {
    GcpConfig {
        project: PROJECT.into(),
        zones: vec![ZONE.into()],
        endpoint_url: Some(server.uri()),
        billing_endpoint_url: Some(server.uri()),
        machine_types: vec![],
        source_image: "projects/deeplearning-platform-release/global/images/family/common-cu124"
            .into(),
        boot_disk_gb: 200,
        network: None,
        subnetwork: Some("gpu-subnet".into()),
        service_account: Some("nodes@proj.iam.gserviceaccount.com".into()),
        termination_action: GcpTerminationAction::Delete,
        anonymous_credentials: true,
    }
}

async fn provider(server: &MockServer) -> GcpProvider {
    GcpProvider::from_config(&config(server), catalog_rows())
        .await
        .expect("builds")
}

fn usd(s: &str) -> Micros {
    Micros::parse_usd(s).expect("price")
}

fn node() -> NodeId {
    NodeId(Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_00ab))
}

fn offer_of(instance_type: &str, market: Market, gpu: GpuModel) -> Offer {
    Offer {
        cloud: Cloud::Gcp,
        region: "us-central1".into(),
        zone: ZONE.into(),
        instance_type: instance_type.into(),
        market,
        gpu_model: Some(gpu),
        gpu_count: 1,
        vcpus: 12,
        memory_mib: 87_040,
        price: usd("1.6"),
        on_demand_price: usd("4.0"),
        placement_score: None,
        interruption_bucket: None,
    }
}

fn request(offer: Offer) -> ProvisionRequest {
    ProvisionRequest {
        node_id: node(),
        offer,
        client_token: "provision-0190-ab-1".into(),
        tags: BTreeMap::from([
            ("spotplane-cluster".to_owned(), "prod".to_owned()),
            ("Team".to_owned(), "ML Research".to_owned()),
        ]),
        user_data: Some("#!/bin/sh\nexec /opt/spotplane/agent".into()),
    }
}

// ---------------------------------------------------------------------------------------------
// REST shapes

fn gpu_sku(description: &str, usage: &str, regions: &[&str], units: &str, nanos: i64) -> Value {
    json!({
        "name": "services/6F81-5844-456A/skus/0000-0000-0000",
        "skuId": "0000-0000-0000",
        "description": description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": "Compute",
            "resourceGroup": "GPU",
            "usageType": usage
        },
        "serviceRegions": regions,
        "pricingInfo": [{
            "summary": "",
            "pricingExpression": {
                "usageUnit": "h",
                "displayQuantity": 1,
                "tieredRates": [{
                    "startUsageAmount": 0,
                    "unitPrice": {"currencyCode": "USD", "units": units, "nanos": nanos}
                }],
                "usageUnitDescription": "hour",
                "baseUnit": "s",
                "baseUnitDescription": "second",
                "baseUnitConversionFactor": 3600
            },
            "currencyConversionRate": 1,
            "effectiveTime": "2026-11-30T00:00:00Z"
        }],
        "serviceProviderName": "Google"
    })
}

fn other_sku(description: &str, group: &str, usage: &str) -> Value {
    let mut s = gpu_sku(description, usage, &["us-central1"], "0", 31_611_000);
    s["category"]["resourceGroup"] = json!(group);
    s
}

/// The A100 at $3.00 on demand and $1.20 on spot in us-central1, over two pages.
async fn mount_billing_pages(server: &MockServer) {
    Mock::given(method("GET"))
        .and(path(SKUS))
        .and(query_param("currencyCode", "USD"))
        .and(query_param_is_missing("pageToken"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "skus": [
                gpu_sku("Nvidia Tesla A100 GPU running in Americas", "OnDemand",
                        &["us-central1", "us-east1"], "3", 0),
                other_sku("A2 Instance Core running in Americas", "CPU", "OnDemand"),
                gpu_sku("Nvidia Tesla A100 80GB GPU running in Americas", "OnDemand",
                        &["us-central1"], "3", 900_000_000),
            ],
            "nextPageToken": "page-2"
        })))
        .expect(1)
        .mount(server)
        .await;
    Mock::given(method("GET"))
        .and(path(SKUS))
        .and(query_param("currencyCode", "USD"))
        .and(query_param("pageToken", "page-2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "skus": [
                gpu_sku("Spot Preemptible Nvidia Tesla A100 GPU running in Americas",
                        "Preemptible", &["us-central1", "us-east1"], "1", 200_000_000),
                gpu_sku("Commitment v1: Nvidia Tesla A100 GPU in Americas for 1 Year",
                        "Commit1Yr", &["us-central1"], "0", 100_000_000),
                gpu_sku("Nvidia Tesla T4 Virtual Workstation GPU running in Americas",
                        "Preemptible", &["us-central1"], "0", 1_000),
            ],
            "nextPageToken": ""
        })))
        .expect(1)
        .mount(server)
        .await;
}

fn operation(name: &str, status: &str) -> Value {
    json!({
        "kind": "compute#operation",
        "name": name,
        "zone": "https://www.googleapis.com/compute/v1/projects/proj/zones/us-central1-a",
        "operationType": "insert",
        "targetLink": "https://www.googleapis.com/compute/v1/projects/proj/zones/us-central1-a/instances/x",
        "status": status,
        "progress": if status == "DONE" { 100 } else { 0 },
    })
}

fn failed_operation(code: &str, message: &str, http: i32) -> Value {
    let mut op = operation("operation-1", "DONE");
    op["error"] = json!({"errors": [{"code": code, "message": message}]});
    op["httpErrorStatusCode"] = json!(http);
    op["httpErrorMessage"] = json!("FAILED");
    op
}

fn gce_error(code: u16, reason: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(code).set_body_json(json!({
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}]
        }
    }))
}

fn gce_instance(name: &str, machine_type: &str, status: &str, model: &str, labels: Value) -> Value {
    json!({
        "kind": "compute#instance",
        "name": name,
        "zone": "https://www.googleapis.com/compute/v1/projects/proj/zones/us-central1-a",
        "machineType": format!(
            "https://www.googleapis.com/compute/v1/projects/proj/zones/us-central1-a/machineTypes/{machine_type}"
        ),
        "status": status,
        "creationTimestamp": "2026-11-30T08:00:00.000-08:00",
        "labels": labels,
        "scheduling": {
            "provisioningModel": model,
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": model != "SPOT",
        }
    })
}

async fn sent_bodies(server: &MockServer, method_name: &str, p: &str) -> Vec<Value> {
    server
        .received_requests()
        .await
        .expect("recording")
        .into_iter()
        .filter(|r| r.method.as_str() == method_name && r.url.path() == p)
        .map(|r| serde_json::from_slice(&r.body).expect("json body"))
        .collect()
}

fn find<'a>(offers: &'a [Offer], instance_type: &str, market: Market) -> &'a Offer {
    offers
        .iter()
        .find(|o| &*o.instance_type == instance_type && o.market == market)
        .unwrap_or_else(|| panic!("no {instance_type} {market} offer in {offers:#?}"))
}

// ---------------------------------------------------------------------------------------------
// Offers

#[tokio::test]
async fn offers_price_spot_from_the_gpu_skus_read_over_every_billing_page() {
    let server = MockServer::start().await;
    mount_billing_pages(&server).await;
    let offers = provider(&server).await.list_offers().await.expect("offers");
    server.verify().await;

    // The configured zone only, GPU types only, each on both markets.
    assert_eq!(offers.len(), 6, "{offers:#?}");
    assert!(offers.iter().all(|o| &*o.zone == ZONE && o.gpu_count > 0));

    // A100: the catalog's $4.00 on demand, spot at the live GPU ratio 1.20/3.00.
    let a2 = find(&offers, "a2-highgpu-1g", Market::Spot);
    assert_eq!(a2.price, usd("1.6"));
    assert_eq!(a2.on_demand_price, usd("4.0"));
    assert_eq!(a2.memory_mib, 85 * 1024);
    assert_eq!(
        find(&offers, "a2-highgpu-1g", Market::OnDemand).price,
        usd("4.0")
    );
    // L4 and T4 have no SKUs here: catalog prices.
    assert_eq!(
        find(&offers, "g2-standard-4", Market::Spot).price,
        usd("0.3")
    );
    assert_eq!(
        find(&offers, "n1-standard-8", Market::OnDemand).price,
        usd("0.73")
    );
}

#[tokio::test]
async fn a_failing_billing_api_leaves_the_catalog_prices() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SKUS))
        .respond_with(gce_error(503, "backendError", "Backend Error"))
        .expect(1)
        .mount(&server)
        .await;
    let offers = provider(&server).await.list_offers().await.expect("offers");
    assert_eq!(offers.len(), 6);
    assert_eq!(
        find(&offers, "a2-highgpu-1g", Market::Spot).price,
        usd("1.9")
    );
    assert_eq!(
        find(&offers, "a2-highgpu-1g", Market::Spot).on_demand_price,
        usd("4.0")
    );
}

#[tokio::test]
async fn a_billing_answer_that_prices_nothing_leaves_the_catalog_prices() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SKUS))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "skus": [other_sku("G2 Instance Core running in Americas", "CPU", "OnDemand")]
        })))
        .mount(&server)
        .await;
    let offers = provider(&server).await.list_offers().await.expect("offers");
    assert_eq!(
        find(&offers, "a2-highgpu-1g", Market::Spot).price,
        usd("1.9")
    );
}

#[tokio::test]
async fn an_unreachable_billing_api_leaves_the_catalog_prices() {
    let server = MockServer::start().await;
    let mut cfg = config(&server);
    // Nothing listens on port 9 of localhost.
    cfg.billing_endpoint_url = Some("http://127.0.0.1:9".into());
    let p = GcpProvider::from_config(&cfg, catalog_rows())
        .await
        .expect("builds");
    let offers = p.list_offers().await.expect("offers");
    assert_eq!(
        find(&offers, "a2-highgpu-1g", Market::Spot).price,
        usd("1.9")
    );
}

#[tokio::test]
async fn offers_are_served_from_the_cache_until_the_refresh_period_ends() {
    let server = MockServer::start().await;
    mount_billing_pages(&server).await; // each page expected once
    let p = provider(&server).await;
    let first = p.list_offers().await.expect("offers");
    let second = p.list_offers().await.expect("offers");
    assert_eq!(first, second);
    server.verify().await;

    let mut p = provider(&server).await;
    p.refresh = Duration::ZERO;
    server.reset().await;
    mount_billing_pages(&server).await;
    p.list_offers().await.expect("offers");
    server.verify().await;
}

#[tokio::test]
async fn configured_machine_types_limit_the_offers() {
    let server = MockServer::start().await;
    let mut cfg = config(&server);
    cfg.machine_types = vec!["g2-standard-4".into(), "a3-highgpu-8g".into()];
    cfg.billing_endpoint_url = Some("http://127.0.0.1:9".into());
    let p = GcpProvider::from_config(&cfg, catalog_rows())
        .await
        .expect("builds");
    let offers = p.list_offers().await.expect("offers");
    assert_eq!(offers.len(), 2, "{offers:#?}");
    assert!(offers.iter().all(|o| &*o.instance_type == "g2-standard-4"));
}

// ---------------------------------------------------------------------------------------------
// Provisioning

#[tokio::test]
async fn a_spot_vm_is_inserted_with_spot_scheduling_labels_and_a_request_id_then_awaited() {
    let server = MockServer::start().await;
    let name = instance_name(node());
    let req = request(offer_of("a2-highgpu-1g", Market::Spot, GpuModel::A100_40GB));
    Mock::given(method("POST"))
        .and(path(INSTANCES))
        .and(query_param(
            "requestId",
            request_id("provision-0190-ab-1").to_string(),
        ))
        .and(body_partial_json(json!({
            "name": name,
            "machineType": "zones/us-central1-a/machineTypes/a2-highgpu-1g",
            "scheduling": {
                "provisioningModel": "SPOT",
                "instanceTerminationAction": "DELETE",
                "onHostMaintenance": "TERMINATE",
                "automaticRestart": false
            },
            "labels": {
                "spotplane-cluster": "prod",
                "team": "ml_research",
                "spotplane-node-id": node().to_string()
            }
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(operation("operation-1", "RUNNING")))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(
            "/compute/v1/projects/proj/zones/us-central1-a/operations/operation-1/wait",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(operation("operation-1", "DONE")))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!("{INSTANCES}/{name}")))
        .respond_with(ResponseTemplate::new(200).set_body_json(gce_instance(
            &name,
            "a2-highgpu-1g",
            "STAGING",
            "SPOT",
            json!({"spotplane-cluster": "prod", "team": "ml_research",
                   "spotplane-node-id": node().to_string()}),
        )))
        .expect(1)
        .mount(&server)
        .await;

    let got = provider(&server)
        .await
        .provision(&req)
        .await
        .expect("provisioned");
    server.verify().await;
    assert_eq!(
        got.provider_id,
        format!("zones/us-central1-a/instances/{name}")
    );
    assert_eq!(got.node_id, Some(node()));
    assert_eq!(got.zone, ZONE);
    assert_eq!(got.instance_type, "a2-highgpu-1g");
    assert_eq!(got.market, Market::Spot);
    assert_eq!(got.state, InstanceState::Pending);
    assert_eq!(
        got.launched_at,
        Some("2026-11-30T16:00:00Z".parse().expect("time"))
    );
    // The tags come back as the request gave them.
    assert_eq!(
        got.tags.get("Team").map(String::as_str),
        Some("ML Research")
    );
    assert_eq!(
        got.tags.get("spotplane-cluster").map(String::as_str),
        Some("prod")
    );

    let body = &sent_bodies(&server, "POST", INSTANCES).await[0];
    let no_accelerators = body
        .get("guestAccelerators")
        .is_none_or(|a| a.as_array().is_some_and(Vec::is_empty));
    assert!(no_accelerators, "A2 types include their GPUs: {body}");
    let disk = &body["disks"][0];
    assert_eq!(disk["boot"], json!(true));
    assert_eq!(disk["autoDelete"], json!(true));
    assert_eq!(
        disk["initializeParams"]["sourceImage"],
        json!("projects/deeplearning-platform-release/global/images/family/common-cu124")
    );
    let size = &disk["initializeParams"]["diskSizeGb"];
    assert!(size == &json!("200") || size == &json!(200), "{size}");
    let nic = &body["networkInterfaces"][0];
    assert_eq!(nic["network"], json!("global/networks/default"));
    assert_eq!(
        nic["subnetwork"],
        json!("regions/us-central1/subnetworks/gpu-subnet")
    );
    assert_eq!(nic["accessConfigs"][0]["type"], json!("ONE_TO_ONE_NAT"));
    assert_eq!(
        body["serviceAccounts"][0],
        json!({"email": "nodes@proj.iam.gserviceaccount.com",
               "scopes": ["https://www.googleapis.com/auth/cloud-platform"]})
    );
    assert_eq!(
        body["metadata"]["items"],
        json!([{"key": "startup-script", "value": "#!/bin/sh\nexec /opt/spotplane/agent"}])
    );
}

#[tokio::test]
async fn an_on_demand_n1_vm_is_standard_and_gets_its_gpus_as_accelerators() {
    let server = MockServer::start().await;
    let name = instance_name(node());
    let mut cfg = config(&server);
    cfg.termination_action = GcpTerminationAction::Stop;
    Mock::given(method("POST"))
        .and(path(INSTANCES))
        .and(body_partial_json(json!({
            "scheduling": {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE"}
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(operation("operation-2", "DONE")))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!("{INSTANCES}/{name}")))
        .respond_with(ResponseTemplate::new(200).set_body_json(gce_instance(
            &name,
            "n1-standard-8",
            "RUNNING",
            "STANDARD",
            json!({"spotplane-node-id": node().to_string()}),
        )))
        .mount(&server)
        .await;
    let p = GcpProvider::from_config(&cfg, catalog_rows())
        .await
        .expect("builds");
    let got = p
        .provision(&request(offer_of(
            "n1-standard-8",
            Market::OnDemand,
            GpuModel::T4,
        )))
        .await
        .expect("provisioned");
    assert_eq!(got.market, Market::OnDemand);
    assert_eq!(got.state, InstanceState::Running);

    let body = &sent_bodies(&server, "POST", INSTANCES).await[0];
    assert!(
        body["scheduling"]
            .get("instanceTerminationAction")
            .is_none(),
        "{body}"
    );
    assert_eq!(
        body["guestAccelerators"],
        json!([{"acceleratorType": "projects/proj/zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
                "acceleratorCount": 1}])
    );
    // A finished operation is not waited for.
    let waits = server
        .received_requests()
        .await
        .expect("recording")
        .iter()
        .filter(|r| r.url.path().ends_with("/wait"))
        .count();
    assert_eq!(waits, 0);
}

#[tokio::test]
async fn a_repeated_request_whose_instance_exists_returns_that_instance() {
    let server = MockServer::start().await;
    let name = instance_name(node());
    Mock::given(method("POST"))
        .and(path(INSTANCES))
        .respond_with(gce_error(
            409,
            "alreadyExists",
            &format!(
                "The resource 'projects/proj/zones/us-central1-a/instances/{name}' already exists"
            ),
        ))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!("{INSTANCES}/{name}")))
        .respond_with(ResponseTemplate::new(200).set_body_json(gce_instance(
            &name,
            "a2-highgpu-1g",
            "RUNNING",
            "SPOT",
            json!({"spotplane-node-id": node().to_string()}),
        )))
        .expect(1)
        .mount(&server)
        .await;
    let got = provider(&server)
        .await
        .provision(&request(offer_of(
            "a2-highgpu-1g",
            Market::Spot,
            GpuModel::A100_40GB,
        )))
        .await
        .expect("the existing instance");
    assert_eq!(got.node_id, Some(node()));
    assert_eq!(got.state, InstanceState::Running);
}

#[tokio::test]
async fn a_zone_stockout_is_insufficient_capacity_for_the_offer() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(INSTANCES))
        .respond_with(ResponseTemplate::new(200).set_body_json(operation("operation-1", "RUNNING")))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(
            "/compute/v1/projects/proj/zones/us-central1-a/operations/operation-1/wait",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(failed_operation(
            "ZONE_RESOURCE_POOL_EXHAUSTED",
            "The zone 'projects/proj/zones/us-central1-a' does not have enough resources available to fulfill the request.  Try a different zone, or try again later.",
            503,
        )))
        .mount(&server)
        .await;
    let offer = offer_of("a2-highgpu-1g", Market::Spot, GpuModel::A100_40GB);
    let err = provider(&server)
        .await
        .provision(&request(offer.clone()))
        .await
        .expect_err("stockout");
    match err {
        ProviderError::InsufficientCapacity { offer_id, message } => {
            assert_eq!(offer_id, offer.id());
            assert!(
                message.contains("ZONE_RESOURCE_POOL_EXHAUSTED"),
                "{message}"
            );
        }
        other => panic!("expected InsufficientCapacity, got {other:?}"),
    }
}

/// Each failure GCE reports on insert, synchronously or in the operation, and what it becomes.
#[tokio::test]
async fn insert_failures_map_to_the_errors_the_planner_branches_on() {
    let offer = offer_of("a2-highgpu-1g", Market::Spot, GpuModel::A100_40GB);
    let op = |code: &str, msg: &str, http: i32| {
        ResponseTemplate::new(200).set_body_json(failed_operation(code, msg, http))
    };
    let cases: Vec<(&str, ResponseTemplate, &str)> = vec![
        (
            "operation quota",
            op(
                "QUOTA_EXCEEDED",
                "Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 0.0 in region us-central1.",
                403,
            ),
            "quota",
        ),
        (
            "synchronous quota (a 403)",
            gce_error(
                403,
                "quotaExceeded",
                "Quota 'PREEMPTIBLE_NVIDIA_A100_GPUS' exceeded.",
            ),
            "quota",
        ),
        (
            "stockout with details",
            op(
                "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                "A a2-highgpu-1g VM instance is currently unavailable in the us-central1-a zone.",
                503,
            ),
            "insufficient_capacity",
        ),
        (
            "a stockout named only in the message",
            gce_error(
                503,
                "resourceExhausted",
                "The zone 'projects/proj/zones/us-central1-a' does not have enough resources available to fulfill the request.",
            ),
            "insufficient_capacity",
        ),
        (
            "missing permission",
            gce_error(
                403,
                "forbidden",
                "Required 'compute.instances.create' permission",
            ),
            "auth",
        ),
        (
            "bad token",
            gce_error(401, "authError", "Invalid Credentials"),
            "auth",
        ),
        (
            "rate limit (429)",
            gce_error(429, "rateLimitExceeded", "Rate Limit Exceeded"),
            "throttled",
        ),
        (
            "rate limit (403)",
            gce_error(403, "rateLimitExceeded", "Rate Limit Exceeded"),
            "throttled",
        ),
        (
            "bad image",
            gce_error(
                400,
                "invalid",
                "Invalid value for field 'resource.disks[0]'",
            ),
            "invalid_request",
        ),
        (
            "server error",
            gce_error(503, "backendError", "Backend Error"),
            "transient",
        ),
        (
            "no such zone",
            gce_error(
                404,
                "notFound",
                "The resource 'projects/proj/zones/us-central1-a' was not found",
            ),
            "not_found",
        ),
    ];
    for (what, answer, kind) in cases {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(INSTANCES))
            .respond_with(answer)
            .mount(&server)
            .await;
        let err = provider(&server)
            .await
            .provision(&request(offer.clone()))
            .await
            .expect_err(what);
        assert_eq!(err.kind(), kind, "{what}: {err:?}");
        if let ProviderError::InsufficientCapacity { offer_id, .. } = &err {
            assert_eq!(offer_id, &offer.id(), "{what}");
        }
    }
}

#[tokio::test]
async fn throttling_says_how_long_to_wait_when_gce_does() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(INSTANCES))
        .respond_with(
            gce_error(429, "rateLimitExceeded", "Rate Limit Exceeded")
                .insert_header("retry-after", "7"),
        )
        .mount(&server)
        .await;
    let err = provider(&server)
        .await
        .provision(&request(offer_of(
            "a2-highgpu-1g",
            Market::Spot,
            GpuModel::A100_40GB,
        )))
        .await
        .expect_err("throttled");
    assert_eq!(
        err,
        ProviderError::Throttled {
            retry_after: Duration::from_secs(7)
        }
    );
}

#[tokio::test]
async fn an_offer_of_another_cloud_is_refused() {
    let server = MockServer::start().await;
    let mut offer = offer_of("a2-highgpu-1g", Market::Spot, GpuModel::A100_40GB);
    offer.cloud = Cloud::Aws;
    let err = provider(&server)
        .await
        .provision(&request(offer))
        .await
        .expect_err("refused");
    assert_eq!(err.kind(), "invalid_request");
}

// ---------------------------------------------------------------------------------------------
// Terminating and listing

#[tokio::test]
async fn terminate_deletes_and_an_instance_already_gone_is_success() {
    let server = MockServer::start().await;
    Mock::given(method("DELETE"))
        .and(path(format!("{INSTANCES}/spotplane-live")))
        .respond_with(ResponseTemplate::new(200).set_body_json(operation("operation-9", "RUNNING")))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .and(path(format!("{INSTANCES}/spotplane-gone")))
        .respond_with(gce_error(404, "notFound", "The resource was not found"))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .and(path(format!("{INSTANCES}/spotplane-forbidden")))
        .respond_with(gce_error(
            403,
            "forbidden",
            "Required 'compute.instances.delete' permission",
        ))
        .mount(&server)
        .await;
    let p = provider(&server).await;
    p.terminate("zones/us-central1-a/instances/spotplane-live")
        .await
        .expect("deleted");
    p.terminate("zones/us-central1-a/instances/spotplane-gone")
        .await
        .expect("already gone");
    let denied = p
        .terminate("zones/us-central1-a/instances/spotplane-forbidden")
        .await
        .expect_err("forbidden");
    assert_eq!(denied.kind(), "auth");
    for bad in [
        "spotplane-live",
        "zones/us-central1-a/spotplane-live",
        "zones//instances/x",
    ] {
        let err = p.terminate(bad).await.expect_err(bad);
        assert_eq!(err.kind(), "invalid_request", "{bad}");
    }
    server.verify().await;
}

#[tokio::test]
async fn list_instances_filters_on_labels_reads_every_page_and_zone() {
    let server = MockServer::start().await;
    let mut cfg = config(&server);
    cfg.zones = vec![ZONE.into(), "us-central1-b".into()];
    let filter = "(labels.spotplane-cluster = \"prod\") AND (labels.team = \"ml_research\")";
    let other = NodeId(Uuid::from_u128(7));
    Mock::given(method("GET"))
        .and(path(INSTANCES))
        .and(query_param("filter", filter))
        .and(query_param_is_missing("pageToken"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "kind": "compute#instanceList",
            "items": [
                gce_instance("spotplane-a", "a2-highgpu-1g", "RUNNING", "SPOT",
                    json!({"spotplane-cluster": "prod", "team": "ml_research",
                           "spotplane-node-id": node().to_string()})),
                gce_instance("spotplane-b", "g2-standard-4", "PROVISIONING", "SPOT",
                    json!({"spotplane-cluster": "prod", "team": "ml_research"})),
            ],
            "nextPageToken": "p2"
        })))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(INSTANCES))
        .and(query_param("filter", filter))
        .and(query_param("pageToken", "p2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "items": [
                gce_instance(&instance_name(other), "n1-standard-8", "TERMINATED", "STANDARD",
                    json!({"spotplane-cluster": "prod", "team": "ml_research"})),
                gce_instance("spotplane-d", "a2-highgpu-1g", "STOPPING", "SPOT", json!({})),
            ]
        })))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(
            "/compute/v1/projects/proj/zones/us-central1-b/instances",
        ))
        .and(query_param("filter", filter))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"kind": "compute#instanceList"})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let p = GcpProvider::from_config(&cfg, catalog_rows())
        .await
        .expect("builds");
    let tags = BTreeMap::from([
        ("spotplane-cluster".to_owned(), "prod".to_owned()),
        ("Team".to_owned(), "ML Research".to_owned()),
    ]);
    let got = p.list_instances(&tags).await.expect("listed");
    server.verify().await;

    let seen: Vec<(&str, InstanceState, Market)> = got
        .iter()
        .map(|i| (i.provider_id.as_str(), i.state, i.market))
        .collect();
    let third = format!("zones/us-central1-a/instances/{}", instance_name(other));
    assert_eq!(
        seen,
        [
            (
                "zones/us-central1-a/instances/spotplane-a",
                InstanceState::Running,
                Market::Spot
            ),
            (
                "zones/us-central1-a/instances/spotplane-b",
                InstanceState::Pending,
                Market::Spot
            ),
            (third.as_str(), InstanceState::Stopped, Market::OnDemand),
            (
                "zones/us-central1-a/instances/spotplane-d",
                InstanceState::Stopping,
                Market::Spot
            ),
        ]
    );
    assert_eq!(got[0].node_id, Some(node()));
    assert_eq!(got[1].node_id, None);
    // Without the label, the node id is read from the instance name.
    assert_eq!(got[2].node_id, Some(other));
    assert_eq!(
        got[0].tags.get("Team").map(String::as_str),
        Some("ML Research")
    );
    assert_eq!(got[0].instance_type, "a2-highgpu-1g");
}

#[tokio::test]
async fn drain_interruptions_is_empty_on_gcp() {
    let server = MockServer::start().await;
    let p = provider(&server).await;
    assert_eq!(p.cloud(), Cloud::Gcp);
    assert!(p.drain_interruptions().await.expect("drained").is_empty());
}

// ---------------------------------------------------------------------------------------------
// Credentials

/// The path production takes, with user credentials (`authorized_user`, as ADC reads them)
/// whose token endpoint is the fake: both APIs receive the access token.
#[tokio::test]
async fn credentials_reach_compute_engine_and_the_billing_api() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/token"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "access_token": "ya29.fake-token", "expires_in": 3600, "token_type": "Bearer"
        })))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(SKUS))
        .and(bearer_token("ya29.fake-token"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "skus": [
                gpu_sku("Nvidia Tesla A100 GPU running in Americas", "OnDemand", &["us-central1"], "3", 0),
                gpu_sku("Spot Preemptible Nvidia Tesla A100 GPU running in Americas", "Preemptible", &["us-central1"], "1", 200_000_000),
            ]
        })))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(INSTANCES))
        .and(bearer_token("ya29.fake-token"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({})))
        .expect(1)
        .mount(&server)
        .await;
    let user = json!({
        "type": "authorized_user",
        "client_id": "spotplane-test.apps.googleusercontent.com",
        "client_secret": "not-a-secret",
        "refresh_token": "1//refresh"
    });
    let creds = google_cloud_auth::credentials::user_account::Builder::new(user)
        .with_token_uri(format!("{}/token", server.uri()))
        .build()
        .expect("credentials");
    let mut cfg = config(&server);
    cfg.anonymous_credentials = false;
    let p = GcpProvider::with_credentials(&cfg, catalog_rows(), creds)
        .await
        .expect("builds");
    let offers = p.list_offers().await.expect("offers");
    assert_eq!(
        find(&offers, "a2-highgpu-1g", Market::Spot).price,
        usd("1.6")
    );
    assert!(
        p.list_instances(&BTreeMap::new())
            .await
            .expect("listed")
            .is_empty()
    );
    server.verify().await;
}

#[test]
fn anonymous_credentials_are_refused_without_a_test_endpoint() {
    use crate::config::ProviderConfig;
    use spotplane_core::FieldErrors;
    let cfg: ProviderConfig = toml::from_str(
        r#"
        kind = "gcp"
        project = "proj"
        zones = ["us-central1-a"]
        source_image = "projects/p/global/images/i"
        anonymous_credentials = true
        "#,
    )
    .expect("parses");
    let mut errs = FieldErrors::default();
    cfg.validate("providers[0]", &mut errs);
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["providers[0].anonymous_credentials"]);
}

// ---------------------------------------------------------------------------------------------
// Names, labels, SKUs

#[test]
fn instance_names_are_valid_gce_names_derived_from_the_node_id() {
    let name = instance_name(node());
    assert_eq!(name, "spotplane-019000000000700080000000000000ab");
    assert!(name.len() <= 63);
    assert!(name.starts_with(|c: char| c.is_ascii_lowercase()));
    assert!(
        name.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    );
}

#[test]
fn request_ids_are_uuids_fixed_by_the_client_token() {
    let a = request_id("token-1");
    assert_eq!(a, request_id("token-1"));
    assert_ne!(a, request_id("token-2"));
    assert_eq!(a.get_version_num(), 5);
}

#[test]
fn labels_follow_gce_rules() {
    assert_eq!(label_key("Team"), "team");
    assert_eq!(label_key("spotplane.io/cluster"), "spotplane_io_cluster");
    assert_eq!(label_key("9lives"), "k_9lives");
    assert_eq!(label_key(&"x".repeat(80)).len(), 63);
    assert_eq!(label_value("ML Research"), "ml_research");
    assert_eq!(label_value(""), "");
    assert_eq!(label_value("Zürich"), "z_rich");
    let l = labels(&BTreeMap::from([("A".into(), "B".into())]), node());
    assert_eq!(l.get("a").map(String::as_str), Some("b"));
    assert_eq!(
        l.get(NODE_ID_LABEL).map(String::as_str),
        Some("01900000-0000-7000-8000-0000000000ab")
    );
}

#[test]
fn provider_ids_name_the_zone_and_the_instance() {
    assert_eq!(
        parse_provider_id("zones/us-central1-a/instances/spotplane-x"),
        Some(("us-central1-a", "spotplane-x"))
    );
    assert_eq!(parse_provider_id("us-central1-a/spotplane-x"), None);
    assert_eq!(parse_provider_id("zones/a/instances/"), None);
}

#[test]
fn gpu_skus_are_recognised_by_their_exact_names() {
    let cases = [
        (
            "Nvidia Tesla A100 GPU running in Americas",
            Some(GpuModel::A100_40GB),
        ),
        (
            "Spot Preemptible Nvidia Tesla A100 80GB GPU running in EMEA",
            Some(GpuModel::A100_80GB),
        ),
        (
            "Nvidia H100 80GB GPU running in Americas",
            Some(GpuModel::H100_80GB),
        ),
        ("Nvidia L4 GPU running in APAC", Some(GpuModel::L4)),
        (
            "Nvidia Tesla T4 Virtual Workstation GPU running in Americas",
            None,
        ),
        (
            "Commitment v1: Nvidia Tesla A100 GPU in Americas for 1 Year",
            None,
        ),
    ];
    for (d, want) in cases {
        assert_eq!(sku_gpu_model(d), want, "{d}");
    }
}

#[test]
fn billing_money_is_read_exactly() {
    let m: Money =
        serde_json::from_value(json!({"currencyCode": "USD", "units": "2", "nanos": 933_908_000}))
            .expect("money");
    assert_eq!(m.micros(), Some(usd("2.933908")));
    let m: Money = serde_json::from_value(json!({"currencyCode": "USD", "nanos": 350_000_000}))
        .expect("money");
    assert_eq!(m.micros(), Some(usd("0.35")));
    let m: Money =
        serde_json::from_value(json!({"currencyCode": "EUR", "units": "1"})).expect("money");
    assert_eq!(m.micros(), None);
}

// ---------------------------------------------------------------------------------------------
// Against Google

/// Lists offers in one zone of a real project with Application Default Credentials, and reads
/// the billing catalog. Runs only with `SPOTPLANE_REAL_GCP=1` and `GOOGLE_CLOUD_PROJECT` set
/// (`SPOTPLANE_REAL_GCP_ZONE` picks the zone, `us-central1-a` by default).
#[tokio::test]
async fn real_gcp_lists_offers_in_one_zone() {
    let project = std::env::var("GOOGLE_CLOUD_PROJECT").unwrap_or_default();
    if std::env::var("SPOTPLANE_REAL_GCP").as_deref() != Ok("1") || project.is_empty() {
        eprintln!(
            "skipped: set SPOTPLANE_REAL_GCP=1 and GOOGLE_CLOUD_PROJECT to run against Google"
        );
        return;
    }
    let zone = std::env::var("SPOTPLANE_REAL_GCP_ZONE").unwrap_or_else(|_| ZONE.to_owned());
    let cfg = GcpConfig {
        project,
        zones: vec![zone.clone()],
        endpoint_url: None,
        billing_endpoint_url: None,
        machine_types: vec![],
        source_image: "projects/deeplearning-platform-release/global/images/family/common-cu124"
            .into(),
        boot_disk_gb: 200,
        network: None,
        subnetwork: None,
        service_account: None,
        termination_action: GcpTerminationAction::Delete,
        anonymous_credentials: false,
    };
    let catalog = catalog::parse(catalog::embedded(Cloud::Gcp), "gcp.csv").expect("catalog");
    let p = GcpProvider::from_config(&cfg, catalog)
        .await
        .expect("builds");
    let prices = p
        .gpu_prices()
        .await
        .expect("the billing catalog is readable");
    assert!(!prices.0.is_empty(), "the billing catalog priced no GPU");
    let offers = p.list_offers().await.expect("offers");
    assert!(!offers.is_empty(), "no offers in {zone}");
    assert!(offers.iter().all(|o| *o.zone == *zone));
    let mine = BTreeMap::from([(
        "spotplane-test".to_owned(),
        "real-gcp-lists-offers".to_owned(),
    )]);
    p.list_instances(&mine)
        .await
        .expect("instances.list answers");
    eprintln!("{} offers in {zone}", offers.len());
}
