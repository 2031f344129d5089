//! The GCP provider against a fake Compute Engine and Cloud Billing Catalog (wiremock)
//! answering in the documented REST shapes (the Catalog's `ListSkusResponse`: `skus[]` with
//! `name, skuId, description, category, serviceRegions, pricingInfo[]`, and `nextPageToken`);
//! each test checks what the SDKs sent as well as what came back.
//! `real_gcp_lists_offers_in_one_zone` talks to Google and runs only when asked to.

use serde_json::{Value, json};
use spotplane_core::{GpuModel, NodeId};
use wiremock::matchers::{
    bearer_token, body_partial_json, method, path, query_param, query_param_is_missing,
};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use super::billing::{Component, GpuSku, Series, classify, current_price_nanos, read_description};
use super::*;
use crate::catalog::{self, HEADER};
use crate::{InstanceState, PriceSource};

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
        price_source: crate::PriceSource::Catalog,
        on_demand_source: crate::PriceSource::Catalog,
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

/// One SKU in the documented `Sku` shape. `price` is US dollars per `unit` (`h`, `GiBy.h`).
fn sku(description: &str, group: &str, usage: &str, unit: &str, price: &str) -> Value {
    let micros = usd(price).0;
    let id = format!("{:04X}-{:04X}-0000", description.len(), micros % 0xFFFF);
    json!({
        "name": format!("services/6F81-5844-456A/skus/{id}"),
        "skuId": id,
        "description": description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": "Compute",
            "resourceGroup": group,
            "usageType": usage
        },
        "serviceRegions": ["us-central1", "us-east1"],
        "pricingInfo": [{
            "summary": "",
            "pricingExpression": {
                "usageUnit": unit,
                "displayQuantity": 1,
                "tieredRates": [{
                    "startUsageAmount": 0,
                    "unitPrice": {
                        "currencyCode": "USD",
                        "units": (micros / 1_000_000).to_string(),
                        "nanos": (micros % 1_000_000) * 1000
                    }
                }],
                "usageUnitDescription": if unit == "h" { "hour" } else { "gibibyte hour" },
                "baseUnit": if unit == "h" { "s" } else { "By.s" },
                "baseUnitDescription": "second",
                "baseUnitConversionFactor": 3600
            },
            "currencyConversionRate": 1,
            "effectiveTime": "2026-11-30T00:00:00Z"
        }],
        "serviceProviderName": "Google"
    })
}

/// A series' core or RAM SKU (`A2 Instance Core running in Americas`, or its
/// `Spot Preemptible` form).
fn vm_sku(series: &str, resource: &str, market: Market, price: &str) -> Value {
    let (group, unit) = match (series, resource) {
        ("N1 Predefined", _) => (
            "N1Standard",
            if resource == "Core" { "h" } else { "GiBy.h" },
        ),
        (_, "Core") => ("CPU", "h"),
        _ => ("RAM", "GiBy.h"),
    };
    match market {
        Market::OnDemand => sku(
            &format!("{series} Instance {resource} running in Americas"),
            group,
            "OnDemand",
            unit,
            price,
        ),
        Market::Spot => sku(
            &format!("Spot Preemptible {series} Instance {resource} running in Americas"),
            group,
            "Preemptible",
            unit,
            price,
        ),
    }
}

/// A GPU SKU (`Nvidia L4 GPU running in Americas`, or `… attached to Spot Preemptible VMs …`).
fn gpu_sku(gpu: &str, market: Market, price: &str) -> Value {
    match market {
        Market::OnDemand => sku(
            &format!("{gpu} GPU running in Americas"),
            "GPU",
            "OnDemand",
            "h",
            price,
        ),
        Market::Spot => sku(
            &format!("{gpu} GPU attached to Spot Preemptible VMs running in Americas"),
            "GPU",
            "Preemptible",
            "h",
            price,
        ),
    }
}

/// Every SKU of the three GPU machine types in the test catalog, both markets, in us-central1
/// (see [`live`] for the sums).
fn priced_skus() -> Vec<Value> {
    use Market::{OnDemand, Spot};
    vec![
        vm_sku("A2", "Core", OnDemand, "0.031611"),
        vm_sku("A2", "Ram", OnDemand, "0.004237"),
        gpu_sku("Nvidia Tesla A100", OnDemand, "2.933908"),
        vm_sku("A2", "Core", Spot, "0.009483"),
        vm_sku("A2", "Ram", Spot, "0.001271"),
        gpu_sku("Nvidia Tesla A100", Spot, "1.1"),
        vm_sku("G2", "Core", OnDemand, "0.024988"),
        vm_sku("G2", "Ram", OnDemand, "0.002927"),
        gpu_sku("Nvidia L4", OnDemand, "0.56004"),
        vm_sku("G2", "Core", Spot, "0.00999"),
        vm_sku("G2", "Ram", Spot, "0.00117"),
        gpu_sku("Nvidia L4", Spot, "0.224"),
        vm_sku("N1 Predefined", "Core", OnDemand, "0.031611"),
        vm_sku("N1 Predefined", "Ram", OnDemand, "0.004237"),
        gpu_sku("Nvidia Tesla T4", OnDemand, "0.35"),
        vm_sku("N1 Predefined", "Core", Spot, "0.00698"),
        vm_sku("N1 Predefined", "Ram", Spot, "0.000936"),
        gpu_sku("Nvidia Tesla T4", Spot, "0.14"),
    ]
}

/// SKUs that price nothing spotplane sells, or not on these markets, whatever their price.
fn noise_skus() -> Vec<Value> {
    vec![
        sku(
            "Commitment v1: Nvidia Tesla A100 GPU running in Americas for 1 Year",
            "GPU",
            "Commit1Yr",
            "h",
            "0.001",
        ),
        sku(
            "Nvidia Tesla T4 Virtual Workstation GPU running in Americas",
            "GPU",
            "OnDemand",
            "h",
            "0.001",
        ),
        sku(
            "Nvidia L4 GPU attached to DWS Defined Duration VMs running in Americas",
            "GPU",
            "OnDemand",
            "h",
            "0.001",
        ),
        sku(
            "Reserved A2 Instance Core in Americas in Calendar Mode",
            "CPU",
            "OnDemand",
            "h",
            "0.001",
        ),
        sku(
            "G2 Custom Instance Core running in Americas",
            "CPU",
            "OnDemand",
            "h",
            "0.001",
        ),
        sku(
            "Network Vpn Internet Egress from Americas to Africa",
            "VPNInternetEgress",
            "OnDemand",
            "GiBy",
            "0.12",
        ),
    ]
}

/// The whole-VM prices the SKUs of [`priced_skus`] add up to, per hour.
fn live(instance_type: &str, market: Market) -> Micros {
    let dollars = match (instance_type, market) {
        // 12 × 0.031611 + 85 × 0.004237 + 2.933908
        ("a2-highgpu-1g", Market::OnDemand) => "3.673385",
        // 12 × 0.009483 + 85 × 0.001271 + 1.1
        ("a2-highgpu-1g", Market::Spot) => "1.321831",
        // 4 × 0.024988 + 16 × 0.002927 + 0.56004
        ("g2-standard-4", Market::OnDemand) => "0.706824",
        // 4 × 0.00999 + 16 × 0.00117 + 0.224
        ("g2-standard-4", Market::Spot) => "0.28268",
        // 8 × 0.031611 + 30 × 0.004237 + 0.35
        ("n1-standard-8", Market::OnDemand) => "0.729998",
        // 8 × 0.00698 + 30 × 0.000936 + 0.14
        ("n1-standard-8", Market::Spot) => "0.22392",
        other => panic!("no live price for {other:?}"),
    };
    usd(dollars)
}

/// Matches a page request by its `pageToken` (absent and empty are the first page).
fn page_token(token: &'static str) -> impl Fn(&Request) -> bool {
    move |r: &Request| {
        r.url
            .query_pairs()
            .find(|(k, _)| k == "pageToken")
            .map_or(String::new(), |(_, v)| v.into_owned())
            == token
    }
}

/// Serves `skus` as pages of `per_page`, linked by `nextPageToken`; each page expected once.
async fn mount_sku_pages(server: &MockServer, skus: Vec<Value>, per_page: usize) {
    let pages: Vec<&[Value]> = skus.chunks(per_page).collect();
    const TOKENS: [&str; 8] = [
        "", "page-2", "page-3", "page-4", "page-5", "page-6", "page-7", "page-8",
    ];
    assert!(pages.len() <= TOKENS.len());
    for (i, page) in pages.iter().enumerate() {
        let next = TOKENS
            .get(i + 1)
            .filter(|_| i + 1 < pages.len())
            .copied()
            .unwrap_or("");
        Mock::given(method("GET"))
            .and(path(SKUS))
            .and(query_param("currencyCode", "USD"))
            .and(query_param("pageSize", "5000"))
            .and(page_token(TOKENS[i]))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "skus": page,
                "nextPageToken": next
            })))
            .expect(1)
            .mount(server)
            .await;
    }
}

/// Every priced SKU and the noise, over three pages.
async fn mount_billing_pages(server: &MockServer) {
    let mut skus = priced_skus();
    skus.extend(noise_skus());
    let per_page = skus.len().div_ceil(3);
    mount_sku_pages(server, skus, per_page).await;
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
async fn offers_are_priced_from_skus_read_over_every_billing_page() {
    let server = MockServer::start().await;
    mount_billing_pages(&server).await;
    let offers = provider(&server).await.list_offers().await.expect("offers");
    // Each of the three pages asked for once, with currencyCode=USD and pageSize=5000.
    server.verify().await;
    let asked = server.received_requests().await.expect("recording");
    assert_eq!(asked.len(), 3, "{asked:#?}");

    // The configured zone only, GPU types only, each on both markets.
    assert_eq!(offers.len(), 6, "{offers:#?}");
    assert!(offers.iter().all(|o| &*o.zone == ZONE && o.gpu_count > 0));
    for t in ["a2-highgpu-1g", "g2-standard-4", "n1-standard-8"] {
        for m in [Market::OnDemand, Market::Spot] {
            let o = find(&offers, t, m);
            assert_eq!(o.price, live(t, m), "{t} {m}");
            assert_eq!(o.price_source, PriceSource::Live, "{t} {m}");
            assert_eq!(o.on_demand_price, live(t, Market::OnDemand), "{t} {m}");
            assert_eq!(o.on_demand_source, PriceSource::Live, "{t} {m}");
        }
    }
    assert_eq!(
        find(&offers, "a2-highgpu-1g", Market::Spot).memory_mib,
        85 * 1024
    );
}

/// The spot price is the Spot SKUs' sum, to the micro-dollar, not a ratio of on-demand.
#[tokio::test]
async fn spot_prices_are_the_spot_skus_summed_exactly() {
    let server = MockServer::start().await;
    use Market::{OnDemand, Spot};
    let skus = vec![
        vm_sku("A2", "Core", OnDemand, "0.031611"),
        vm_sku("A2", "Ram", OnDemand, "0.004237"),
        gpu_sku("Nvidia Tesla A100", OnDemand, "2.933908"),
        vm_sku("A2", "Core", Spot, "0.012345"),
        vm_sku("A2", "Ram", Spot, "0.000321"),
        gpu_sku("Nvidia Tesla A100", Spot, "0.987654"),
    ];
    mount_sku_pages(&server, skus, 10).await;
    let offers = provider(&server).await.list_offers().await.expect("offers");
    let spot = find(&offers, "a2-highgpu-1g", Spot);
    // 12 vCPUs, 85 GiB, 1 A100, in micro-dollars.
    assert_eq!(spot.price, Micros(12 * 12_345 + 85 * 321 + 987_654));
    assert_eq!(spot.price_source, PriceSource::Live);
    assert_eq!(
        spot.on_demand_price,
        Micros(12 * 31_611 + 85 * 4_237 + 2_933_908)
    );
    // Not derived: the on-demand price times the GPU's spot ratio would be about $1.24.
    assert_ne!(spot.price, spot.on_demand_price.scale(987_654, 2_933_908));
    // The other types have no SKUs here: their catalog prices, and the offers say so.
    let g2 = find(&offers, "g2-standard-4", Spot);
    assert_eq!(g2.price, usd("0.3"));
    assert_eq!(g2.price_source, PriceSource::Catalog);
}

#[tokio::test]
async fn a_missing_sku_leaves_that_row_and_market_at_the_catalog_price_and_says_so() {
    let server = MockServer::start().await;
    let skus: Vec<Value> = priced_skus()
        .into_iter()
        .filter(|s| s["description"] != "Spot Preemptible G2 Instance Ram running in Americas")
        .collect();
    mount_sku_pages(&server, skus, 100).await;
    let offers = provider(&server).await.list_offers().await.expect("offers");

    let spot = find(&offers, "g2-standard-4", Market::Spot);
    assert_eq!(spot.price, usd("0.3"), "the catalog's spot price");
    assert_eq!(spot.price_source, PriceSource::Catalog);
    // Its on-demand price is whole, so live, on both of its offers.
    assert_eq!(
        spot.on_demand_price,
        live("g2-standard-4", Market::OnDemand)
    );
    assert_eq!(spot.on_demand_source, PriceSource::Live);
    let od = find(&offers, "g2-standard-4", Market::OnDemand);
    assert_eq!(od.price, live("g2-standard-4", Market::OnDemand));
    assert_eq!(od.price_source, PriceSource::Live);
    // The rows whose SKUs are all there are live.
    let a2 = find(&offers, "a2-highgpu-1g", Market::Spot);
    assert_eq!(a2.price, live("a2-highgpu-1g", Market::Spot));
    assert_eq!(a2.price_source, PriceSource::Live);
}

#[tokio::test]
async fn a_price_change_shows_once_the_cache_has_expired() {
    let server = MockServer::start().await;
    mount_sku_pages(&server, priced_skus(), 100).await;
    let p = provider(&server).await;
    let before = p.list_offers().await.expect("offers");
    assert_eq!(
        find(&before, "a2-highgpu-1g", Market::Spot).price,
        live("a2-highgpu-1g", Market::Spot)
    );
    server.verify().await;

    // Google lowers the A100's spot price from $1.10 to $0.95.
    server.reset().await;
    let changed: Vec<Value> = priced_skus()
        .into_iter()
        .map(|s| {
            if s["description"]
                == "Nvidia Tesla A100 GPU attached to Spot Preemptible VMs running in Americas"
            {
                gpu_sku("Nvidia Tesla A100", Market::Spot, "0.95")
            } else {
                s
            }
        })
        .collect();
    mount_sku_pages(&server, changed, 100).await;

    // Still cached: the old price, and no call.
    let cached = p.list_offers().await.expect("offers");
    assert_eq!(cached, before);
    assert!(
        server
            .received_requests()
            .await
            .expect("recording")
            .is_empty()
    );

    // The refresh period passes (on tokio's clock; nothing sleeps).
    tokio::time::pause();
    tokio::time::advance(PRICE_REFRESH + Duration::from_secs(1)).await;
    tokio::time::resume();
    let after = p.list_offers().await.expect("offers");
    server.verify().await;
    let spot = find(&after, "a2-highgpu-1g", Market::Spot);
    assert_eq!(
        spot.price,
        live("a2-highgpu-1g", Market::Spot) - usd("0.15")
    );
    assert_eq!(spot.price_source, PriceSource::Live);
    assert_eq!(
        find(&after, "a2-highgpu-1g", Market::OnDemand).price,
        live("a2-highgpu-1g", Market::OnDemand)
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
    assert!(
        offers.iter().all(|o| o.price_source == PriceSource::Catalog
            && o.on_demand_source == PriceSource::Catalog)
    );
}

#[tokio::test]
async fn a_billing_answer_that_prices_nothing_leaves_the_catalog_prices() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SKUS))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "skus": [vm_sku("G2", "Core", Market::OnDemand, "0.024988")]
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
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"skus": priced_skus()})))
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
        live("a2-highgpu-1g", Market::Spot)
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

/// A SKU as the SDK reads it from the documented JSON shape.
fn sdk_sku(v: Value) -> google_cloud_billing_v1::model::Sku {
    serde_json::from_value(v).expect("a Sku")
}

#[test]
fn skus_are_recognised_by_description_and_category() {
    use Market::{OnDemand, Spot};
    let cases = [
        (
            sku(
                "A2 Instance Core running in Americas",
                "CPU",
                "OnDemand",
                "h",
                "0.03",
            ),
            Some((Component::Core(Series::A2), OnDemand)),
        ),
        (
            sku(
                "Spot Preemptible A3 Instance Ram running in Belgium",
                "RAM",
                "Preemptible",
                "GiBy.h",
                "0.001",
            ),
            Some((Component::Ram(Series::A3High), Spot)),
        ),
        (
            sku(
                "A3Plus Instance Core running in Americas",
                "CPU",
                "OnDemand",
                "h",
                "0.03",
            ),
            Some((Component::Core(Series::A3Mega), OnDemand)),
        ),
        (
            sku(
                "N1 Predefined Instance Ram running in Americas",
                "N1Standard",
                "OnDemand",
                "GiBy.h",
                "0.004",
            ),
            Some((Component::Ram(Series::N1), OnDemand)),
        ),
        (
            sku(
                "Spot Preemptible G2 Instance Core running in Iowa",
                "CPU",
                "Preemptible",
                "h",
                "0.01",
            ),
            Some((Component::Core(Series::G2), Spot)),
        ),
        (
            sku(
                "Nvidia L4 GPU attached to Spot Preemptible VMs running in Virginia",
                "GPU",
                "Preemptible",
                "h",
                "0.2",
            ),
            Some((Component::Gpu(GpuSku::L4), Spot)),
        ),
        (
            sku(
                "Nvidia Tesla A100 80GB GPU running in Americas",
                "GPU",
                "OnDemand",
                "h",
                "3.9",
            ),
            Some((Component::Gpu(GpuSku::A100_80), OnDemand)),
        ),
        (
            sku(
                "Nvidia H100 80GB GPU running in Americas",
                "GPU",
                "OnDemand",
                "h",
                "9.8",
            ),
            Some((Component::Gpu(GpuSku::H100), OnDemand)),
        ),
        (
            sku(
                "Nvidia H100 80GB Plus GPU running in Americas",
                "GPU",
                "OnDemand",
                "h",
                "10.3",
            ),
            Some((Component::Gpu(GpuSku::H100Mega), OnDemand)),
        ),
        (
            sku(
                "Nvidia H100 80GB Mega GPU attached to Spot Preemptible VMs running in Tokyo",
                "GPU",
                "Preemptible",
                "h",
                "9.3",
            ),
            Some((Component::Gpu(GpuSku::H100Mega), Spot)),
        ),
        (
            sku(
                "H200 141GB GPU running in Netherlands",
                "GPU",
                "OnDemand",
                "h",
                "10.5",
            ),
            Some((Component::Gpu(GpuSku::H200), OnDemand)),
        ),
        (
            sku(
                "A4 Nvidia B200 (1 gpu slice) running in Americas",
                "GPU",
                "OnDemand",
                "h",
                "16.11",
            ),
            Some((Component::Gpu(GpuSku::B200Slice), OnDemand)),
        ),
        // A spot SKU filed as OnDemand is still spot.
        (
            sku(
                "Spot Preemptible A4 Nvidia B200 (1 gpu slice) running in Americas",
                "GPU",
                "OnDemand",
                "h",
                "4.9542",
            ),
            Some((Component::Gpu(GpuSku::B200Slice), Spot)),
        ),
        // The old guess at the H200's name is not Google's.
        (
            sku(
                "Nvidia H200 141GB GPU running in Americas",
                "GPU",
                "OnDemand",
                "h",
                "10",
            ),
            None,
        ),
        // Right name, wrong category.
        (
            sku(
                "A2 Instance Core running in Americas",
                "RAM",
                "OnDemand",
                "h",
                "0.03",
            ),
            None,
        ),
        (
            sku(
                "Nvidia L4 GPU running in Americas",
                "GPU",
                "Commit1Yr",
                "h",
                "0.3",
            ),
            None,
        ),
        // Variants that are not the plain component's price.
        (
            sku(
                "Nvidia Tesla T4 Virtual Workstation GPU running in Americas",
                "GPU",
                "OnDemand",
                "h",
                "0.5",
            ),
            None,
        ),
        (
            sku(
                "Nvidia H100 Mega 80GB GPU attached to DWS Defined Duration VMs running in Americas",
                "GPU",
                "OnDemand",
                "h",
                "4.4",
            ),
            None,
        ),
        (
            sku(
                "Reserved Nvidia H100 80GB Mega GPU in Americas in Calendar Mode",
                "GPU",
                "OnDemand",
                "h",
                "4.8",
            ),
            None,
        ),
        (
            sku(
                "DWS Calendar Mode A4 Nvidia B200 (1 gpu slice) running in Americas",
                "GPU",
                "OnDemand",
                "h",
                "9",
            ),
            None,
        ),
        (
            sku(
                "Commitment v1: A2 Cpu in Americas for 1 Year",
                "CPU",
                "Commit1Yr",
                "h",
                "0.02",
            ),
            None,
        ),
        (
            sku(
                "G2 Custom Instance Core running in Americas",
                "CPU",
                "OnDemand",
                "h",
                "0.03",
            ),
            None,
        ),
    ];
    for (v, want) in cases {
        let description = v["description"].as_str().unwrap_or_default().to_owned();
        assert_eq!(classify(&sdk_sku(v)), want, "{description}");
    }
    let mut not_compute = sku(
        "A2 Instance Core running in Americas",
        "CPU",
        "OnDemand",
        "h",
        "0.03",
    );
    not_compute["category"]["resourceFamily"] = json!("Storage");
    assert_eq!(classify(&sdk_sku(not_compute)), None);
    assert_eq!(
        read_description("Spot Preemptible A2 Instance Ram running in Americas"),
        Some(("a2 instance ram".to_owned(), true))
    );
    assert_eq!(read_description("Reserved A2 Ram in Netherlands"), None);
}

/// Each machine series is priced from its own SKUs: A3 Mega from `A3Plus` and the Mega GPU,
/// A4 from its GPU slice alone, A3 Ultra from the H200 under either spot spelling.
#[test]
fn whole_vm_prices_follow_the_machine_series() {
    use super::billing::SkuPrices;
    use Market::{OnDemand, Spot};
    let text = format!(
        "{HEADER}\n\
         a3-highgpu-8g,208,1872,H100-80GB,8,us-central1,us-central1-a,88.0,30.0,,\n\
         a3-megagpu-8g,208,1872,H100-80GB,8,us-central1,us-central1-a,92.0,31.0,,\n\
         a3-ultragpu-8g,224,2952,H200-141GB,8,us-central1,us-central1-a,84.0,30.0,,\n\
         a4-highgpu-8g,224,3968,B200-180GB,8,us-central1,us-central1-a,130.0,40.0,,\n\
         g4-standard-48,48,180,RTX-PRO-6000,1,us-central1,us-central1-a,4.5,1.8,,\n\
         n1-standard-4,4,15,V100-16GB,1,us-central1,us-central1-a,2.7,0.9,,\n\
         e2-standard-4,4,16,,,us-central1,us-central1-a,0.13,0.04,,\n"
    );
    let rows = catalog::parse(&text, "test").expect("catalog");
    let row = |t: &str| rows.iter().find(|r| &*r.instance_type == t).expect("row");
    let mut prices = SkuPrices::default();
    for v in [
        vm_sku("A3", "Core", OnDemand, "0.02"),
        vm_sku("A3", "Ram", OnDemand, "0.002"),
        gpu_sku("Nvidia H100 80GB", OnDemand, "9.8"),
        vm_sku("A3Plus", "Core", OnDemand, "0.03"),
        vm_sku("A3Plus", "Ram", OnDemand, "0.003"),
        gpu_sku("Nvidia H100 80GB Plus", OnDemand, "10.3"),
        vm_sku("A3Ultra", "Core", Spot, "0.01"),
        vm_sku("A3Ultra", "Ram", Spot, "0.001"),
        sku(
            "Spot Preemptible H200 141GB GPU running in Americas",
            "GPU",
            "Preemptible",
            "h",
            "3.5",
        ),
        sku(
            "A4 Nvidia B200 (1 gpu slice) running in Americas",
            "GPU",
            "OnDemand",
            "h",
            "16.11",
        ),
        sku(
            "Spot Preemptible A4 Nvidia B200 (1 gpu slice) running in Americas",
            "GPU",
            "Preemptible",
            "h",
            "4.9542",
        ),
        vm_sku("G4", "Core", OnDemand, "0.04"),
        vm_sku("G4", "Ram", OnDemand, "0.004"),
        sku(
            "RTX 6000 96GB running in Americas",
            "GPU",
            "OnDemand",
            "h",
            "2.5",
        ),
        vm_sku("N1 Predefined", "Core", OnDemand, "0.031611"),
        vm_sku("N1 Predefined", "Ram", OnDemand, "0.004237"),
        gpu_sku("Nvidia Tesla V100", OnDemand, "2.48"),
    ] {
        prices.add(&sdk_sku(v));
    }
    let price = |t: &str, m: Market| prices.vm_price(row(t), m);
    assert_eq!(
        price("a3-highgpu-8g", OnDemand),
        Ok(usd("86.304")) // 208 × 0.02 + 1872 × 0.002 + 8 × 9.8
    );
    assert_eq!(
        price("a3-megagpu-8g", OnDemand),
        Ok(usd("94.256")) // 208 × 0.03 + 1872 × 0.003 + 8 × 10.3
    );
    assert_eq!(
        price("a3-ultragpu-8g", Spot),
        Ok(usd("33.192")) // 224 × 0.01 + 2952 × 0.001 + 8 × 3.5
    );
    assert_eq!(price("a4-highgpu-8g", OnDemand), Ok(usd("128.88"))); // 8 × 16.11
    assert_eq!(price("a4-highgpu-8g", Spot), Ok(usd("39.6336"))); // 8 × 4.9542
    assert_eq!(
        price("g4-standard-48", OnDemand),
        Ok(usd("5.14")) // 48 × 0.04 + 180 × 0.004 + 2.5
    );
    assert_eq!(
        price("n1-standard-4", OnDemand),
        Ok(usd("2.669999")) // 4 × 0.031611 + 15 × 0.004237 + 2.48
    );
    // What is missing is named.
    assert_eq!(
        price("a3-highgpu-8g", Spot),
        Err(vec![
            "A3 Instance Core (spot, us-central1)".to_owned(),
            "A3 Instance Ram (spot, us-central1)".to_owned(),
            "Nvidia H100 80GB GPU (spot, us-central1)".to_owned(),
        ])
    );
    assert_eq!(
        price("e2-standard-4", OnDemand),
        Err(vec![
            "no SKU mapping for e2-standard-4 with no GPU".to_owned()
        ])
    );
    // The other spelling of a spot H200.
    let mut other = SkuPrices::default();
    for v in [
        vm_sku("A3Ultra", "Core", Spot, "0.01"),
        vm_sku("A3Ultra", "Ram", Spot, "0.001"),
        gpu_sku("H200 141GB", Spot, "3.5"),
    ] {
        other.add(&sdk_sku(v));
    }
    assert_eq!(
        other.vm_price(row("a3-ultragpu-8g"), Spot),
        Ok(usd("33.192"))
    );
}

#[test]
fn sku_prices_are_read_exactly_from_the_current_usd_tier() {
    let one = |units: Value, nanos: i64, currency: &str, unit: &str| {
        let mut v = sku(
            "A2 Instance Core running in Americas",
            "CPU",
            "OnDemand",
            unit,
            "1",
        );
        v["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"] =
            json!({"currencyCode": currency, "units": units, "nanos": nanos});
        current_price_nanos(&sdk_sku(v), "h")
    };
    assert_eq!(
        one(json!("2"), 933_908_000, "USD", "h"),
        Some(2_933_908_000)
    );
    assert_eq!(one(json!("0"), 31_611_001, "USD", "h"), Some(31_611_001));
    assert_eq!(one(json!("1"), 0, "EUR", "h"), None);
    assert_eq!(one(json!("1"), 0, "USD", "GiBy.h"), None, "another unit");
    assert_eq!(one(json!("0"), 0, "USD", "h"), None, "free is no price");

    // The last entry of the pricing timeline is the current price; a tier from 0 is read.
    let mut v = sku(
        "A2 Instance Core running in Americas",
        "CPU",
        "OnDemand",
        "h",
        "0.5",
    );
    let mut newer = v["pricingInfo"][0].clone();
    newer["pricingExpression"]["tieredRates"] = json!([
        {"startUsageAmount": 0, "unitPrice": {"currencyCode": "USD", "units": "0", "nanos": 400_000_000}},
        {"startUsageAmount": 100, "unitPrice": {"currencyCode": "USD", "units": "0", "nanos": 300_000_000}}
    ]);
    v["pricingInfo"] = json!([v["pricingInfo"][0].clone(), newer]);
    assert_eq!(current_price_nanos(&sdk_sku(v), "h"), Some(400_000_000));
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
        .sku_prices()
        .await
        .expect("the billing catalog is readable");
    assert!(
        !prices.0.is_empty(),
        "the billing catalog priced no component"
    );
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
