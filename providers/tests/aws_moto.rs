//! The AWS provider on the real SDK against `moto_server` (EC2 and SQS).
//!
//! `scripts/test` starts moto and sets `SPOTPLANE_TEST_MOTO_URL` (and fake credentials, read by
//! the SDK's standard chain like real ones). Run by hand, these tests say they were skipped
//! unless `SPOTPLANE_TEST_REQUIRE_EMULATORS` is set, in which case a missing moto fails them.
//!
//! moto's gaps, worked around below and noted where they matter:
//! - spot prices are fake: every type in every zone at $0.00001 with a 2006 timestamp;
//! - `ClientToken` is not honoured: a repeated RunInstances/CreateFleet launches again;
//! - CreateFleet ignores the override's availability zone;
//! - terminated instances stay listed (EC2 forgets them after about an hour).
#![cfg(feature = "aws")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use spotplane_core::{Cloud, Market, Micros, NodeId};
use spotplane_providers::aws::AwsProvider;
use spotplane_providers::clock::SystemClock;
use spotplane_providers::config::{AwsConfig, AwsLaunchApi, ProviderConfig};
use spotplane_providers::registry::{self, BuildContext, RETRY_ATTEMPTS, catalog_of};
use spotplane_providers::{
    CloudProvider, InstanceState, InterruptionKind, Offer, PriceSource, ProvisionRequest, tags,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "fakes/aws_price_list.rs"]
mod aws_price_list;

use aws_price_list::{PriceList, product};

const REGION: &str = "us-east-1";

fn moto() -> Option<String> {
    match std::env::var("SPOTPLANE_TEST_MOTO_URL") {
        Ok(url) => Some(url),
        Err(_) => {
            assert!(
                std::env::var_os("SPOTPLANE_TEST_REQUIRE_EMULATORS").is_none(),
                "SPOTPLANE_TEST_MOTO_URL is not set but emulators are required"
            );
            eprintln!("skipped: SPOTPLANE_TEST_MOTO_URL is not set (scripts/test starts moto)");
            None
        }
    }
}

fn config(url: &str, api: AwsLaunchApi, queue: Option<String>) -> AwsConfig {
    AwsConfig {
        regions: vec![REGION.into()],
        endpoint_url: Some(url.into()),
        interruption_queue_url: queue,
        instance_types: vec!["p4d.24xlarge".into(), "g5.xlarge".into()],
        // One of the AMIs moto knows.
        image_id: "ami-12c6146b".into(),
        subnets: BTreeMap::new(),
        security_group_ids: vec![],
        instance_profile: None,
        launch_api: api,
        // moto has no Price List: the offers fall back to the catalog's on-demand prices.
        price_list: true,
        price_list_region: "us-east-1".into(),
        price_list_endpoint_url: None,
    }
}

async fn provider(cfg: &AwsConfig) -> AwsProvider {
    let catalog = catalog_of(Cloud::Aws, None).expect("embedded catalog");
    AwsProvider::from_config(cfg, catalog)
        .await
        .expect("provider")
}

fn request(offer: &Offer, cluster: &str) -> ProvisionRequest {
    let node_id = NodeId::from_uuid(uuid::Uuid::now_v7());
    ProvisionRequest {
        node_id,
        offer: offer.clone(),
        client_token: format!("spotplane-{node_id}"),
        tags: BTreeMap::from([
            (tags::CLUSTER.to_owned(), cluster.to_owned()),
            (tags::NODE_ID.to_owned(), node_id.to_string()),
            (tags::TEAM.to_owned(), "vision".to_owned()),
        ]),
        user_data: Some("#!/bin/sh\necho spotplane-agent\n".into()),
    }
}

/// The embedded catalog's on-demand price of `instance_type` in [`REGION`].
fn catalog_price(instance_type: &str) -> Micros {
    catalog_of(Cloud::Aws, None)
        .expect("embedded catalog")
        .into_iter()
        .find(|r| &*r.instance_type == instance_type && &*r.region == REGION)
        .map(|r| r.price)
        .unwrap_or_else(|| panic!("{instance_type} is not in the catalog in {REGION}"))
}

#[tokio::test]
async fn on_demand_prices_come_from_the_price_list_and_from_the_catalog_where_it_has_none() {
    let Some(url) = moto() else { return };
    let products = vec![
        product("p5.48xlarge", REGION, "Linux", "Used", "55.0400000000"),
        // What the filters must leave out: another OS, a reservation's unused capacity,
        // another region.
        product("p5.48xlarge", REGION, "Windows", "Used", "60.0000000000"),
        product(
            "p5.48xlarge",
            REGION,
            "Linux",
            "UnusedCapacityReservation",
            "1.0000000000",
        ),
        product("p5.48xlarge", "us-west-2", "Linux", "Used", "70.0000000000"),
        product("g6e.xlarge", REGION, "Linux", "Used", "1.8610000000"),
        product("p4d.24xlarge", REGION, "Linux", "Used", "21.9576500000"),
    ];
    // One product a page: the reader must follow NextToken to the end.
    let fake = PriceList::start(products, 1).await;
    let cfg = AwsConfig {
        instance_types: ["p5.48xlarge", "g6e.xlarge", "p4d.24xlarge", "p5en.48xlarge"]
            .map(String::from)
            .to_vec(),
        price_list_endpoint_url: Some(fake.server.uri()),
        ..config(&url, AwsLaunchApi::CreateFleet, None)
    };
    let p = provider(&cfg).await;
    let offers = p.list_offers().await.expect("offers");
    let of =
        |t: &str| -> Vec<&Offer> { offers.iter().filter(|o| &*o.instance_type == t).collect() };
    for (t, usd) in [
        ("p5.48xlarge", "55.04"),
        ("g6e.xlarge", "1.861"),
        ("p4d.24xlarge", "21.957650"),
    ] {
        let all = of(t);
        assert!(!all.is_empty(), "{t} offered");
        for o in all {
            assert_eq!(
                o.on_demand_price,
                Micros::parse_usd(usd).expect("usd"),
                "{t}"
            );
            assert_eq!(o.on_demand_source, PriceSource::Live, "{t}");
        }
    }
    assert_eq!(
        fake.pages(),
        3,
        "one page per matching product, every page read"
    );
    // p5en is not in the Price List: the catalog's price, and the offer says where it is from.
    let p5en = of("p5en.48xlarge");
    assert!(!p5en.is_empty(), "p5en offered from the catalog");
    for o in p5en {
        assert_eq!(o.on_demand_price, catalog_price("p5en.48xlarge"));
        assert_eq!(o.on_demand_source, PriceSource::Catalog);
    }
    // Cached: a second listing within the offer cache reads no page.
    p.list_offers().await.expect("offers");
    assert_eq!(fake.pages(), 3);
}

#[tokio::test]
async fn a_price_list_that_fails_leaves_the_catalog_prices() {
    let Some(url) = moto() else { return };
    let fake = PriceList::start(Vec::new(), 100).await;
    // A server that answers every call with the service's error shape.
    fake.server.reset().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .respond_with(
            wiremock::ResponseTemplate::new(400)
                .insert_header("content-type", "application/x-amz-json-1.1")
                .set_body_string(
                    r#"{"__type":"AccessDeniedException","Message":"not authorized to perform: pricing:GetProducts"}"#,
                ),
        )
        .mount(&fake.server)
        .await;
    let cfg = AwsConfig {
        price_list_endpoint_url: Some(fake.server.uri()),
        ..config(&url, AwsLaunchApi::CreateFleet, None)
    };
    let offers = provider(&cfg).await.list_offers().await.expect("offers");
    let p4d: Vec<&Offer> = offers
        .iter()
        .filter(|o| &*o.instance_type == "p4d.24xlarge")
        .collect();
    assert!(!p4d.is_empty());
    for o in p4d {
        assert_eq!(o.on_demand_price, catalog_price("p4d.24xlarge"));
        assert_eq!(o.on_demand_source, PriceSource::Catalog);
    }
}

fn cluster() -> String {
    format!("test-{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test]
async fn offers_carry_live_spot_prices_and_the_catalog_on_demand_prices() {
    let Some(url) = moto() else { return };
    let p = provider(&config(&url, AwsLaunchApi::CreateFleet, None)).await;
    let offers = p.list_offers().await.expect("offers");
    let spot: Vec<&Offer> = offers.iter().filter(|o| o.market == Market::Spot).collect();
    // Zones are where EC2 quotes a spot price (moto: its offerings data), named by AZ id.
    for ty in ["p4d.24xlarge", "g5.xlarge"] {
        let zones: Vec<&str> = spot
            .iter()
            .filter(|o| &*o.instance_type == ty)
            .map(|o| &*o.zone)
            .collect();
        assert!(zones.len() >= 4, "{ty}: {zones:?}");
        assert!(zones.iter().all(|z| z.starts_with("use1-az")), "{zones:?}");
    }
    // The price is moto's (fake, $0.00001), read live, not the catalog's.
    let live = Micros::parse_usd("0.00001").expect("price");
    assert!(spot.iter().all(|o| o.price == live));
    let p4d = offers
        .iter()
        .find(|o| &*o.instance_type == "p4d.24xlarge" && &*o.zone == "use1-az2")
        .expect("p4d in use1-az2");
    // moto has no Price List: the on-demand price is the catalog's, and the offer says so.
    assert_eq!(p4d.on_demand_price, catalog_price("p4d.24xlarge"));
    assert_eq!(p4d.on_demand_source, PriceSource::Catalog);
    assert_eq!(p4d.gpu_count, 8);
    assert_eq!(p4d.vcpus, 96);
    assert!(
        offers
            .iter()
            .any(|o| o.market == Market::OnDemand && o.price == o.on_demand_price)
    );
}

async fn provision_list_terminate(api: AwsLaunchApi, market: Market) {
    let Some(url) = moto() else { return };
    let p = provider(&config(&url, api, None)).await;
    let offers = p.list_offers().await.expect("offers");
    let offer = offers
        .iter()
        .find(|o| &*o.instance_type == "g5.xlarge" && o.market == market)
        .expect("a g5.xlarge offer");
    let cluster = cluster();
    let req = request(offer, &cluster);

    let inst = p.provision(&req).await.expect("provisioned");
    assert!(inst.provider_id.starts_with("i-"), "{}", inst.provider_id);
    assert_eq!(inst.node_id, Some(req.node_id));
    assert_eq!(inst.instance_type, "g5.xlarge");
    assert_eq!(inst.market, market);
    assert_eq!(
        inst.tags.get(tags::TEAM).map(String::as_str),
        Some("vision")
    );
    assert!(
        inst.zone.starts_with("use1-az"),
        "zone by id: {}",
        inst.zone
    );
    if api == AwsLaunchApi::RunInstances {
        // (CreateFleet in moto ignores the override's zone.)
        assert_eq!(inst.zone, *offer.zone);
    }

    let by_cluster = BTreeMap::from([(tags::CLUSTER.to_owned(), cluster.clone())]);
    let listed = p.list_instances(&by_cluster).await.expect("listed");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].provider_id, inst.provider_id);
    assert!(matches!(
        listed[0].state,
        InstanceState::Pending | InstanceState::Running
    ));
    // Every tag must match.
    let other_team = BTreeMap::from([
        (tags::CLUSTER.to_owned(), cluster.clone()),
        (tags::TEAM.to_owned(), "nlp".to_owned()),
    ]);
    assert!(
        p.list_instances(&other_team)
            .await
            .expect("listed")
            .is_empty()
    );

    p.terminate(&inst.provider_id).await.expect("terminated");
    // Idempotent: again, and an id that never existed.
    p.terminate(&inst.provider_id).await.expect("again");
    p.terminate("i-0123456789abcdef0")
        .await
        .expect("already gone");
    // moto keeps terminated instances listed, as EC2 does for about an hour.
    let after = p.list_instances(&by_cluster).await.expect("listed");
    assert!(
        after.iter().all(|i| matches!(
            i.state,
            InstanceState::Terminated | InstanceState::Terminating
        )),
        "{after:?}"
    );
}

#[tokio::test]
async fn create_fleet_buys_a_tagged_spot_instance_that_is_listed_and_terminated() {
    provision_list_terminate(AwsLaunchApi::CreateFleet, Market::Spot).await;
}

#[tokio::test]
async fn run_instances_buys_spot_in_the_offers_zone() {
    provision_list_terminate(AwsLaunchApi::RunInstances, Market::Spot).await;
}

#[tokio::test]
async fn on_demand_through_create_fleet() {
    provision_list_terminate(AwsLaunchApi::CreateFleet, Market::OnDemand).await;
}

#[tokio::test]
async fn an_unknown_zone_is_refused_before_any_call() {
    let Some(url) = moto() else { return };
    let p = provider(&config(&url, AwsLaunchApi::RunInstances, None)).await;
    let offers = p.list_offers().await.expect("offers");
    let mut offer = offers.first().expect("an offer").clone();
    offer.zone = "use1-az99".into();
    let err = p
        .provision(&request(&offer, &cluster()))
        .await
        .expect_err("no such zone");
    assert_eq!(err.kind(), "invalid_request", "{err}");
}

#[tokio::test]
async fn the_interruption_queue_is_drained_parsed_and_emptied() {
    let Some(url) = moto() else { return };
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(REGION))
        .endpoint_url(&url)
        .load()
        .await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue_url = sqs
        .create_queue()
        .queue_name(cluster())
        .send()
        .await
        .expect("queue")
        .queue_url()
        .expect("url")
        .to_owned();
    let event = |detail_type: &str, source: &str, detail: serde_json::Value| {
        serde_json::json!({
            "version": "0", "id": uuid::Uuid::new_v4().to_string(),
            "detail-type": detail_type, "source": source, "account": "123456789012",
            "time": "2026-11-30T08:22:00Z", "region": REGION, "resources": [],
            "detail": detail,
        })
        .to_string()
    };
    let warning = event(
        "EC2 Spot Instance Interruption Warning",
        "aws.ec2",
        serde_json::json!({"instance-id": "i-0aaa", "instance-action": "terminate"}),
    );
    let bodies = [
        warning.clone(),
        // Delivered twice: harmless, the caller deduplicates.
        warning,
        event(
            "EC2 Instance Rebalance Recommendation",
            "aws.ec2",
            serde_json::json!({"instance-id": "i-0bbb"}),
        ),
        event(
            "EC2 Instance State-change Notification",
            "aws.ec2",
            serde_json::json!({"instance-id": "i-0ccc", "state": "stopping"}),
        ),
        event(
            "AWS Health Event",
            "aws.health",
            serde_json::json!({"service": "EC2", "eventTypeCategory": "scheduledChange",
                "affectedEntities": [{"entityValue": "i-0ddd"}]}),
        ),
        event("Object Created", "aws.s3", serde_json::json!({})),
        "this is not an event".to_owned(),
    ];
    for b in &bodies {
        sqs.send_message()
            .queue_url(&queue_url)
            .message_body(b)
            .send()
            .await
            .expect("sent");
    }

    let p = provider(&config(
        &url,
        AwsLaunchApi::CreateFleet,
        Some(queue_url.clone()),
    ))
    .await;
    let mut events = p.drain_interruptions().await.expect("drained");
    events.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
    let got: Vec<(&str, InterruptionKind)> = events
        .iter()
        .map(|e| (e.provider_id.as_str(), e.kind))
        .collect();
    assert_eq!(
        got,
        [
            ("i-0aaa", InterruptionKind::Preemption),
            ("i-0aaa", InterruptionKind::Preemption),
            ("i-0bbb", InterruptionKind::Rebalance),
            ("i-0ccc", InterruptionKind::Stopped),
            ("i-0ddd", InterruptionKind::Maintenance),
        ]
    );
    assert_eq!(
        events[0].deadline,
        Some("2026-11-30T08:24:00Z".parse().expect("time"))
    );

    // Everything was deleted, the unknown and the malformed messages too.
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(&queue_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(
            aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        )
        .send()
        .await
        .expect("attributes");
    let left: u64 = attrs
        .attributes()
        .map(|a| a.values().filter_map(|v| v.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    assert_eq!(left, 0, "{attrs:?}");
    assert!(p.drain_interruptions().await.expect("drained").is_empty());
}

/// A front for moto on loopback: every request of one EC2 action is counted and answered with
/// EC2's `503 Unavailable` (retryable for the SDK and for spotplane alike); everything else is
/// passed to moto. One request per connection (`Connection: close` both ways), so requests
/// cannot be miscounted or mixed up.
async fn failing_front(moto: &str, action: &'static str) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let upstream = moto
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let (upstream, counted) = (upstream.clone(), Arc::clone(&counted));
            tokio::spawn(async move {
                // A broken connection only fails the request on it, which the test sees.
                let _ = pass_or_fail(conn, &upstream, action, &counted).await;
            });
        }
    });
    (url, hits)
}

/// The head of an HTTP message without its `Connection` header, with `Connection: close`.
fn closing(head: &str) -> String {
    let mut out: Vec<&str> = head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    out.push("Connection: close");
    out.join("\r\n") + "\r\n\r\n"
}

async fn pass_or_fail(
    mut conn: TcpStream,
    upstream: &str,
    action: &str,
    hits: &AtomicUsize,
) -> std::io::Result<()> {
    let mut req = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let head_end = loop {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        req.extend_from_slice(&buf[..n]);
        if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
    };
    let head = String::from_utf8_lossy(&req[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while req.len() < head_end + 4 + length {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let body = &req[head_end + 4..];
    if String::from_utf8_lossy(body).contains(&format!("Action={action}&")) {
        hits.fetch_add(1, Ordering::SeqCst);
        let xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>\
            <Code>Unavailable</Code><Message>The server is overloaded</Message></Error></Errors>\
            <RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>";
        let resp = format!(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{xml}",
            xml.len()
        );
        conn.write_all(resp.as_bytes()).await?;
        return conn.shutdown().await;
    }
    let mut up = TcpStream::connect(upstream).await?;
    up.write_all(closing(&head).as_bytes()).await?;
    up.write_all(body).await?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp).await?;
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(resp.len());
    conn.write_all(closing(&String::from_utf8_lossy(&resp[..split])).as_bytes())
        .await?;
    conn.write_all(resp.get(split + 4..).unwrap_or_default())
        .await?;
    conn.shutdown().await
}

#[tokio::test]
async fn a_failing_call_is_sent_as_often_as_the_retry_decorator_says_and_no_more() {
    let Some(url) = moto() else { return };
    let (front, hits) = failing_front(&url, "DescribeInstances").await;
    // Built as `serve` builds it: the real SDK clients under the decorators.
    let providers = registry::build(
        &[ProviderConfig::Aws(config(
            &front,
            AwsLaunchApi::CreateFleet,
            None,
        ))],
        &BuildContext {
            clock: Arc::new(SystemClock),
            sim_market: spotplane_providers::sim::SimMarket::Recorded(std::env::temp_dir()),
            catalog_dir: None,
            observer: None,
            sim_state_dir: None,
        },
    )
    .await
    .expect("the provider is built through the front (zones come from moto)");
    let tags = BTreeMap::from([(tags::CLUSTER.to_owned(), cluster())]);
    let err = providers.all[0]
        .list_instances(&tags)
        .await
        .expect_err("DescribeInstances always fails");
    assert_eq!(err.kind(), "transient", "{err}");
    // One request per attempt of the decorator: the SDK retries nothing itself (its default,
    // 3 attempts inside each of the decorator's, made 12).
    assert_eq!(hits.load(Ordering::SeqCst), RETRY_ATTEMPTS as usize);
}

#[tokio::test]
async fn real_aws_lists_offers_when_credentials_are_given() {
    if std::env::var_os("SPOTPLANE_REAL_AWS").is_none() {
        eprintln!(
            "skipped: set SPOTPLANE_REAL_AWS=1 (and AWS credentials) to list real offers in {REGION}"
        );
        return;
    }
    let cfg = AwsConfig {
        endpoint_url: None,
        ..config("", AwsLaunchApi::CreateFleet, None)
    };
    let p = provider(&cfg).await;
    let offers = p.list_offers().await.expect("real offers");
    assert!(offers.iter().any(|o| o.market == Market::Spot));
}
