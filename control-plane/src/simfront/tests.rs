use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use chrono::{TimeZone, Utc};
use http_body_util::BodyExt;
use serde_json::Value;
use spotplane_core::{Cloud, GpuModel, Market, Micros, NodeId};
use spotplane_providers::CloudProvider;
use spotplane_providers::ProvisionRequest;
use spotplane_providers::catalog::CatalogRow;
use spotplane_providers::clock::ManualClock;
use spotplane_providers::sim::{SimCloud, SimConfig, SimTraces, Trace};
use tower::ServiceExt;

/// A simulated cloud of `flavour` with one spot instance running; the trace never takes it,
/// so notices come only from `preempt_now`.
async fn node(flavour: Cloud) -> (Arc<SimCloud>, String, ManualClock) {
    let clock = ManualClock::new(
        Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0)
            .single()
            .expect("time"),
    );
    let mut cfg = SimConfig::new(flavour, 3);
    cfg.boot_seconds = (1, 1);
    let row = CatalogRow {
        instance_type: "gpu-1".into(),
        vcpus: 8,
        memory_gib: 64.0,
        gpu_model: Some(GpuModel::L4),
        gpu_count: 1,
        region: "region1".into(),
        zone: "region1-1".into(),
        price: Micros::parse_usd("1").expect("price"),
        spot_price: Some(Micros::parse_usd("0.3").expect("price")),
        placement_score: None,
        interruption_bucket: None,
    };
    let traces = Arc::new(SimTraces {
        availability: vec![Trace::new("always", 60, vec![0; 100], None)],
        gcp_prices: BTreeMap::new(),
        ..Default::default()
    });
    let sim = Arc::new(SimCloud::new(
        cfg,
        vec![row],
        traces,
        Arc::new(clock.clone()),
    ));
    let offer = sim
        .list_offers()
        .await
        .expect("offers")
        .into_iter()
        .find(|o| o.market == Market::Spot)
        .expect("spot offer");
    let inst = sim
        .provision(&ProvisionRequest {
            node_id: NodeId(uuid::Uuid::now_v7()),
            offer,
            client_token: "t".into(),
            tags: BTreeMap::new(),
            user_data: None,
        })
        .await
        .expect("provisioned");
    let name = inst
        .provider_id
        .rsplit('/')
        .next()
        .expect("name")
        .to_owned();
    clock.advance(chrono::Duration::seconds(5));
    (sim, name, clock)
}

async fn call(
    app: &axum::Router,
    req: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let resp = app.clone().oneshot(req).await.expect("response");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

fn get(uri: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::get(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::empty()).expect("request")
}

#[tokio::test]
async fn aws_imdsv2_needs_a_token_and_shows_the_instance_action_once_posted() {
    let (sim, name, _clock) = node(Cloud::Aws).await;
    let app = super::metadata_router(vec![sim.clone()]);
    let base = format!("/sim/metadata/aws/{name}/latest");
    let action = format!("{base}/meta-data/spot/instance-action");

    let (status, _, _) = call(&app, get(&action, &[])).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "IMDSv2 refuses calls without a token"
    );

    let no_ttl = Request::put(format!("{base}/api/token"))
        .body(Body::empty())
        .expect("req");
    assert_eq!(call(&app, no_ttl).await.0, StatusCode::BAD_REQUEST);
    let put = Request::put(format!("{base}/api/token"))
        .header("X-aws-ec2-metadata-token-ttl-seconds", "21600")
        .body(Body::empty())
        .expect("req");
    let (status, _, token) = call(&app, put).await;
    assert_eq!(status, StatusCode::OK);

    let auth = [("X-aws-ec2-metadata-token", token.as_str())];
    assert_eq!(
        call(&app, get(&action, &auth)).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&app, get(&format!("{base}/meta-data/instance-id"), &auth))
            .await
            .2,
        name
    );

    assert!(sim.preempt_now(&name));
    let (status, headers, body) = call(&app, get(&action, &auth)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["action"], "terminate");
    assert_eq!(
        v["time"], "2026-11-30T00:02:05Z",
        "two minutes after the notice"
    );
    let (status, _, body) = call(
        &app,
        get(
            &format!("{base}/meta-data/events/recommendations/rebalance"),
            &auth,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("\"noticeTime\":\"2026-11-30T00:00:05Z\""),
        "{body}"
    );
}

#[tokio::test(start_paused = true)]
async fn gcp_preempted_needs_the_flavor_header_and_long_polls_until_it_changes() {
    let (sim, name, _clock) = node(Cloud::Gcp).await;
    let app = super::metadata_router(vec![sim.clone()]);
    let uri = format!("/sim/metadata/gcp/{name}/computeMetadata/v1/instance/preempted");
    let flavor = [("Metadata-Flavor", "Google")];

    assert_eq!(call(&app, get(&uri, &[])).await.0, StatusCode::FORBIDDEN);
    let (status, headers, body) = call(&app, get(&uri, &flavor)).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "FALSE"));
    assert_eq!(headers["metadata-flavor"], "Google");

    let waiting = tokio::spawn({
        let app = app.clone();
        let uri = format!("{uri}?wait_for_change=true");
        async move { call(&app, get(&uri, &[("Metadata-Flavor", "Google")])).await }
    });
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(!waiting.is_finished(), "held while nothing changes");
    assert!(sim.preempt_now(&name));
    let (status, _, body) = waiting.await.expect("joined");
    assert_eq!((status, body.as_str()), (StatusCode::OK, "TRUE"));
}

#[tokio::test]
async fn azure_scheduled_events_show_the_preempt_event_and_accept_start_requests() {
    let (sim, name, _clock) = node(Cloud::Azure).await;
    let app = super::metadata_router(vec![sim.clone()]);
    let uri = format!("/sim/metadata/azure/{name}/metadata/scheduledevents?api-version=2020-07-01");
    let md = [("Metadata", "true")];

    assert_eq!(call(&app, get(&uri, &[])).await.0, StatusCode::BAD_REQUEST);
    let no_version = format!("/sim/metadata/azure/{name}/metadata/scheduledevents");
    assert_eq!(
        call(&app, get(&no_version, &md)).await.0,
        StatusCode::BAD_REQUEST
    );
    let (_, _, body) = call(&app, get(&uri, &md)).await;
    let doc: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(doc["Events"].as_array().map(Vec::len), Some(0));

    let full_id = sim.instance_by_name(&name).expect("instance").id;
    assert!(sim.preempt_now(&full_id));
    let (_, _, body) = call(&app, get(&uri, &md)).await;
    let doc: Value = serde_json::from_str(&body).expect("json");
    let ev = &doc["Events"][0];
    assert_eq!(ev["EventType"], "Preempt");
    assert_eq!(ev["EventStatus"], "Scheduled");
    assert_eq!(ev["Resources"][0], name.as_str());
    assert_eq!(
        ev["NotBefore"], "Mon, 30 Nov 2026 00:00:35 GMT",
        "30 s after the notice"
    );

    let bad = Request::post(&uri)
        .header("Metadata", "true")
        .body(Body::from("{}"))
        .expect("req");
    assert_eq!(call(&app, bad).await.0, StatusCode::BAD_REQUEST);
    let ack = serde_json::json!({"StartRequests": [{"EventId": ev["EventId"]}]});
    let post = Request::post(&uri)
        .header("Metadata", "true")
        .body(Body::from(ack.to_string()))
        .expect("req");
    assert_eq!(call(&app, post).await.0, StatusCode::OK);
    // Acknowledged: the eviction starts now, and the VM (and its metadata service) is gone.
    assert_eq!(
        call(&app, get(&uri, &md)).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn unknown_instances_and_clouds_are_404() {
    let (sim, _name, _clock) = node(Cloud::Aws).await;
    let app = super::metadata_router(vec![sim]);
    assert_eq!(
        call(
            &app,
            get(
                "/sim/metadata/aws/i-nothing/latest/meta-data/instance-id",
                &[]
            )
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(
            &app,
            get(
                "/sim/metadata/gcp/x/computeMetadata/v1/instance/preempted",
                &[]
            )
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&app, get("/sim/metadata/ibm/x/y", &[])).await.0,
        StatusCode::NOT_FOUND
    );
}
