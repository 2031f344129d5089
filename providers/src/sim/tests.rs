use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{Duration, TimeZone, Utc};
use spotplane_core::{Cloud, GpuModel, Market, Micros, NodeId};

use super::traces::{PricePoint, SimTraces, Trace};
use super::{SimCloud, SimConfig};
use crate::catalog::CatalogRow;
use crate::clock::{Clock, ManualClock};
use crate::{CloudProvider, InstanceState, InterruptionKind, ProviderError, ProvisionRequest};

fn row(itype: &str, zone: &str) -> CatalogRow {
    CatalogRow {
        instance_type: itype.into(),
        vcpus: 8,
        memory_gib: 61.0,
        gpu_model: Some(GpuModel::V100_16GB),
        gpu_count: 1,
        region: "us-east-1".into(),
        zone: zone.into(),
        price: Micros::parse_usd("3.06").expect("price"),
        spot_price: Some(Micros::parse_usd("0.918").expect("price")),
        placement_score: Some(3.0),
        interruption_bucket: Some("<5%".into()),
    }
}

/// One trace: available for 10 ticks of 60 s, then taken for 5, repeating.
fn traces() -> Arc<SimTraces> {
    let mut data = vec![0u8; 10];
    data.extend([1u8; 5]);
    Arc::new(SimTraces {
        availability: vec![Trace::new("t", 60, data, None)],
        gcp_prices: BTreeMap::new(),
        ..Default::default()
    })
}

fn setup(flavour: Cloud) -> (SimCloud, ManualClock) {
    let clock = ManualClock::new(
        Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0)
            .single()
            .expect("time"),
    );
    let mut cfg = SimConfig::new(flavour, 7);
    cfg.boot_seconds = (60, 60);
    cfg.pool_capacity = 2;
    let sim = SimCloud::new(
        cfg,
        vec![row("p3.2xlarge", "us-east-1a")],
        traces(),
        Arc::new(clock.clone()),
    );
    (sim, clock)
}

async fn request(sim: &SimCloud, market: Market, token: &str) -> ProvisionRequest {
    let offer = sim
        .list_offers()
        .await
        .expect("offers")
        .into_iter()
        .find(|o| o.market == market)
        .expect("offer");
    ProvisionRequest {
        node_id: NodeId(uuid::Uuid::now_v7()),
        offer,
        client_token: token.into(),
        tags: BTreeMap::from([("spotplane-cluster".to_owned(), "test".to_owned())]),
        user_data: None,
    }
}

/// Moves the clock to the start of the trace's next unavailable stretch for this pool.
fn to_next_loss(sim: &SimCloud, clock: &ManualClock) {
    for _ in 0..100 {
        if !sim.spot_available("us-east-1a", "p3.2xlarge", clock.now()) {
            return;
        }
        clock.advance(Duration::seconds(60));
    }
    panic!("the trace never takes capacity away");
}

#[tokio::test]
async fn every_catalog_row_is_offered_on_spot_and_on_demand() {
    let (sim, _) = setup(Cloud::Aws);
    let offers = sim.list_offers().await.expect("offers");
    assert_eq!(offers.len(), 2);
    let spot = offers
        .iter()
        .find(|o| o.market == Market::Spot)
        .expect("spot");
    let od = offers
        .iter()
        .find(|o| o.market == Market::OnDemand)
        .expect("on-demand");
    assert!(spot.price < od.price);
    assert_eq!(spot.on_demand_price, od.price);
    assert_eq!(spot.placement_score, Some(3.0));
}

#[tokio::test]
async fn provisioning_is_idempotent_by_client_token_and_boots_after_a_delay() {
    let (sim, clock) = setup(Cloud::Aws);
    // Start at a moment with spot capacity.
    while !sim.spot_available("us-east-1a", "p3.2xlarge", clock.now()) {
        clock.advance(Duration::seconds(60));
    }
    let req = request(&sim, Market::Spot, "tok-1").await;
    let a = sim.provision(&req).await.expect("provisioned");
    let b = sim.provision(&req).await.expect("repeat");
    assert_eq!(
        a.provider_id, b.provider_id,
        "the same token buys one instance"
    );
    assert!(a.provider_id.starts_with("i-0"));
    assert_eq!(a.state, InstanceState::Pending);
    clock.advance(Duration::seconds(61));
    let listed = sim.list_instances(&req.tags).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert!(matches!(
        listed[0].state,
        InstanceState::Running | InstanceState::Stopping
    ));
}

#[tokio::test]
async fn spot_capacity_follows_the_trace_and_pools_have_a_limit() {
    let (sim, clock) = setup(Cloud::Aws);
    to_next_loss(&sim, &clock);
    let req = request(&sim, Market::Spot, "tok").await;
    match sim.provision(&req).await {
        Err(ProviderError::InsufficientCapacity { offer_id, .. }) => {
            assert_eq!(offer_id, req.offer.id())
        }
        other => panic!("expected a capacity error, got {other:?}"),
    }
    // On-demand capacity is there, up to the pool's limit.
    let od = request(&sim, Market::OnDemand, "od-1").await;
    sim.provision(&od).await.expect("first");
    sim.provision(&ProvisionRequest {
        client_token: "od-2".into(),
        ..od.clone()
    })
    .await
    .expect("second");
    let third = sim
        .provision(&ProvisionRequest {
            client_token: "od-3".into(),
            ..od
        })
        .await;
    assert!(matches!(
        third,
        Err(ProviderError::InsufficientCapacity { .. })
    ));
}

#[tokio::test]
async fn a_spot_instance_is_taken_with_the_flavours_notice_when_its_pool_loses_capacity() {
    for (flavour, window) in [(Cloud::Aws, 120), (Cloud::Gcp, 30), (Cloud::Azure, 30)] {
        let (sim, clock) = setup(flavour);
        while !sim.spot_available("us-east-1a", "p3.2xlarge", clock.now()) {
            clock.advance(Duration::seconds(60));
        }
        let req = request(&sim, Market::Spot, "tok").await;
        let inst = sim.provision(&req).await.expect("provisioned");
        to_next_loss(&sim, &clock);
        let notice = sim.notice(&inst.provider_id).expect("a notice is posted");
        assert_eq!(
            notice.deadline - notice.posted_at,
            Duration::seconds(window),
            "{flavour}"
        );
        let events = sim.drain_interruptions().await.expect("events");
        match flavour {
            Cloud::Aws => assert_eq!(
                events.iter().map(|e| e.kind).collect::<Vec<_>>(),
                [InterruptionKind::Preemption]
            ),
            _ => assert!(
                events.is_empty(),
                "{flavour} announces through the node's metadata only"
            ),
        }
        clock.advance(Duration::seconds(window + 1));
        let events = sim.drain_interruptions().await.expect("events");
        let stopped: &[InterruptionKind] = if flavour == Cloud::Aws {
            // The EventBridge state-change notification.
            &[InterruptionKind::Stopped]
        } else {
            &[]
        };
        assert_eq!(events.iter().map(|e| e.kind).collect::<Vec<_>>(), stopped);
        let listed = sim.list_instances(&req.tags).await.expect("list");
        assert_eq!(listed[0].state, InstanceState::Terminated);
        assert!(
            sim.drain_interruptions().await.expect("events").is_empty(),
            "reported once"
        );
    }
}

#[tokio::test]
async fn terminate_is_idempotent_and_unknown_instances_are_already_gone() {
    let (sim, clock) = setup(Cloud::Gcp);
    let req = request(&sim, Market::OnDemand, "tok").await;
    let inst = sim.provision(&req).await.expect("provisioned");
    sim.terminate(&inst.provider_id).await.expect("terminated");
    sim.terminate(&inst.provider_id).await.expect("again");
    sim.terminate("does-not-exist").await.expect("already gone");
    assert_eq!(
        sim.list_instances(&req.tags).await.expect("list")[0].state,
        InstanceState::Terminated
    );
    clock.advance(Duration::hours(2));
    assert!(
        sim.list_instances(&req.tags)
            .await
            .expect("list")
            .is_empty(),
        "long gone"
    );
    let other = BTreeMap::from([("team".to_owned(), "x".to_owned())]);
    assert!(sim.list_instances(&other).await.expect("list").is_empty());
}

#[tokio::test]
async fn injected_errors_follow_the_seed() {
    let run = || async {
        let clock = ManualClock::new(
            Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0)
                .single()
                .expect("time"),
        );
        let mut cfg = SimConfig::new(Cloud::Aws, 42);
        cfg.error_rate = 0.3;
        cfg.throttle_rate = 0.2;
        let sim = SimCloud::new(
            cfg,
            vec![row("p3.2xlarge", "us-east-1a")],
            traces(),
            Arc::new(clock),
        );
        let mut outcomes = Vec::new();
        for _ in 0..50 {
            outcomes.push(match sim.list_offers().await {
                Ok(_) => "ok",
                Err(ProviderError::Throttled { .. }) => "throttled",
                Err(ProviderError::Transient(_)) => "transient",
                Err(_) => "other",
            });
        }
        outcomes
    };
    let a = run().await;
    assert_eq!(a, run().await);
    assert!(a.contains(&"throttled") && a.contains(&"transient") && a.contains(&"ok"));
}

#[tokio::test]
async fn gcp_prices_replay_the_history_at_the_simulated_date() {
    let clock = ManualClock::new(
        Utc.with_ymd_and_hms(2024, 6, 1, 0, 0, 0)
            .single()
            .expect("time"),
    );
    let d = |s: &str| chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").expect("date");
    let mut traces = SimTraces::default();
    traces.gcp_prices.insert(
        ("g2-standard-4".into(), "us-central1".into()),
        vec![
            PricePoint {
                date: d("2023-01-01"),
                on_demand: Micros(800_000),
                spot: Some(Micros(300_000)),
            },
            PricePoint {
                date: d("2024-07-01"),
                on_demand: Micros(700_000),
                spot: Some(Micros(220_000)),
            },
        ],
    );
    let mut r = row("g2-standard-4", "us-central1-a");
    r.region = "us-central1".into();
    let sim = SimCloud::new(
        SimConfig::new(Cloud::Gcp, 1),
        vec![r],
        Arc::new(traces),
        Arc::new(clock.clone()),
    );
    let prices =
        |offers: Vec<crate::Offer>| offers.into_iter().map(|o| o.price).collect::<Vec<_>>();
    assert_eq!(
        prices(sim.list_offers().await.expect("offers")),
        [Micros(300_000), Micros(800_000)]
    );
    clock.advance(Duration::days(45));
    assert_eq!(
        prices(sim.list_offers().await.expect("offers")),
        [Micros(220_000), Micros(700_000)]
    );
}

#[tokio::test]
async fn azure_notices_can_be_acknowledged_early() {
    let (sim, clock) = setup(Cloud::Azure);
    let req = request(&sim, Market::Spot, "tok").await;
    while !sim.spot_available("us-east-1a", "p3.2xlarge", clock.now()) {
        clock.advance(Duration::seconds(60));
    }
    let inst = sim
        .provision(&ProvisionRequest {
            client_token: "tok-2".into(),
            ..req.clone()
        })
        .await
        .expect("provisioned");
    assert!(sim.preempt_now(&inst.provider_id));
    let notice = sim.notice(&inst.provider_id).expect("notice");
    sim.acknowledge(&notice.event_id);
    let listed = sim.list_instances(&req.tags).await.expect("list");
    assert_eq!(
        listed
            .iter()
            .find(|i| i.provider_id == inst.provider_id)
            .map(|i| i.state),
        Some(InstanceState::Terminated)
    );
}

/// A trace whose recorded prices move every tick: 1, 1, 2, 2, 3 (relative to their mean).
fn moving_traces() -> Arc<SimTraces> {
    Arc::new(SimTraces {
        availability: vec![Trace::new(
            "moving",
            60,
            vec![0; 5],
            Some(vec![1.0, 1.0, 2.0, 2.0, 3.0]),
        )],
        gcp_prices: BTreeMap::new(),
        ..Default::default()
    })
}

#[tokio::test]
async fn the_price_history_is_the_path_list_offers_follows() {
    let start = Utc
        .with_ymd_and_hms(2026, 11, 30, 0, 0, 0)
        .single()
        .expect("time");
    let clock = ManualClock::new(start);
    let sim = SimCloud::new(
        SimConfig::new(Cloud::Aws, 3),
        vec![row("p3.2xlarge", "us-east-1a")],
        moving_traces(),
        Arc::new(clock.clone()),
    );
    let pool = crate::PoolRef {
        region: "us-east-1",
        zone: "us-east-1a",
        instance_type: "p3.2xlarge",
        market: Market::Spot,
    };
    let to = start + Duration::minutes(30);
    let path = sim
        .price_history(&pool, start, to)
        .await
        .expect("answers")
        .expect("the sim has a history");
    assert_eq!(path[0].at, start);
    assert!(path.len() > 3, "the price moves: {path:?}");
    assert!(
        path.windows(2)
            .all(|w| w[0].at < w[1].at && w[0].price != w[1].price)
    );
    // At every second of the span, the offer's price is the last change at or before it.
    for s in (0..1800).step_by(7) {
        clock.set(start + Duration::seconds(s));
        let now = clock.now();
        let offered = sim
            .list_offers()
            .await
            .expect("offers")
            .into_iter()
            .find(|o| o.market == Market::Spot)
            .expect("spot offer")
            .price;
        let in_force = path
            .iter()
            .rev()
            .find(|p| p.at <= now)
            .expect("a price")
            .price;
        assert_eq!(offered, in_force, "at {now}");
    }
    let on_demand = crate::PoolRef {
        market: Market::OnDemand,
        ..pool
    };
    let flat = sim
        .price_history(&on_demand, start, to)
        .await
        .expect("answers")
        .expect("history");
    assert_eq!(flat.len(), 1, "on-demand does not move: {flat:?}");
    assert_eq!(flat[0].price, Micros::parse_usd("3.06").expect("price"));
}

#[tokio::test]
async fn an_instance_is_billed_from_launch_to_its_end_at_the_prices_in_force() {
    let start = Utc
        .with_ymd_and_hms(2026, 11, 30, 0, 0, 0)
        .single()
        .expect("time");
    let clock = ManualClock::new(start);
    let sim = SimCloud::new(
        SimConfig::new(Cloud::Aws, 3),
        vec![row("p3.2xlarge", "us-east-1a")],
        moving_traces(),
        Arc::new(clock.clone()),
    );
    clock.advance(Duration::seconds(30));
    let req = request(&sim, Market::OnDemand, "bill").await;
    let inst = sim.provision(&req).await.expect("provisioned");
    clock.advance(Duration::minutes(90));
    sim.terminate(&inst.provider_id).await.expect("terminated");
    // Forgotten an hour later, still billed.
    clock.advance(Duration::hours(3));
    let bills = sim.bills();
    assert_eq!(bills.len(), 1);
    let b = &bills[0];
    assert_eq!(b.to - b.from, Duration::minutes(90));
    // $3.06/h on demand for 1.5 h.
    assert_eq!(b.cost, Micros(4_590_000));
    assert_eq!(b.on_demand_cost, b.cost);
}

#[tokio::test]
async fn a_calm_market_sells_spot_and_takes_nothing_back() {
    let (sim, clock) = setup(Cloud::Aws);
    while !sim.spot_available("us-east-1a", "p3.2xlarge", clock.now()) {
        clock.advance(Duration::seconds(60));
    }
    let running = sim
        .provision(&request(&sim, Market::Spot, "before").await)
        .await
        .expect("provisioned");
    sim.set_calm(true);
    // Where the trace takes the pool's capacity away, spot is still sold, and neither the
    // instance bought before nor the one bought now gets a notice.
    to_next_loss(&sim, &clock);
    let bought = sim
        .provision(&request(&sim, Market::Spot, "during").await)
        .await
        .expect("spot is there in a calm market");
    clock.advance(Duration::hours(48));
    for inst in [&running, &bought] {
        assert!(sim.notice(&inst.provider_id).is_none(), "{inst:?}");
    }
    assert!(sim.drain_interruptions().await.expect("events").is_empty());
    // Calm off: the traces rule again.
    sim.set_calm(false);
    to_next_loss(&sim, &clock);
    for inst in [&running, &bought] {
        sim.terminate(&inst.provider_id).await.expect("terminated");
    }
    match sim
        .provision(&request(&sim, Market::Spot, "after").await)
        .await
    {
        Err(ProviderError::InsufficientCapacity { message, .. }) => {
            assert_eq!(message, "no spot capacity in this pool now")
        }
        other => panic!("expected the trace's capacity error, got {other:?}"),
    }
}

/// A cloud of the same flavour and seed as `setup`'s, on `clock`, kept in `path`.
fn shared_at(clock: &ManualClock, path: &std::path::Path) -> SimCloud {
    let mut cfg = SimConfig::new(Cloud::Aws, 7);
    cfg.boot_seconds = (60, 60);
    cfg.pool_capacity = 2;
    SimCloud::new(
        cfg,
        vec![row("p3.2xlarge", "us-east-1a")],
        traces(),
        Arc::new(clock.clone()),
    )
    .shared(path)
    .expect("state file")
}

#[tokio::test]
async fn a_cloud_with_a_state_file_outlives_its_process_and_is_shared() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("aws.json");
    let (_, clock) = setup(Cloud::Aws);
    let a = shared_at(&clock, &path);
    // Another process (a replica) on the same file, started later: the same cloud.
    clock.advance(Duration::minutes(3));
    let b = shared_at(&clock, &path);
    let req = request(&a, Market::OnDemand, "tok-1").await;
    let bought = a.provision(&req).await.expect("bought");
    let listed = b.list_instances(&BTreeMap::new()).await.expect("listed");
    assert_eq!(
        listed.iter().map(|i| &i.provider_id).collect::<Vec<_>>(),
        [&bought.provider_id],
        "the replica sees the instance"
    );
    // The replica retrying the call with the same client token gets the same instance.
    let again = b.provision(&req).await.expect("idempotent");
    assert_eq!(again.provider_id, bought.provider_id);
    clock.advance(Duration::minutes(30));
    b.terminate(&bought.provider_id).await.expect("terminated");
    let seen = a.list_instances(&BTreeMap::new()).await.expect("listed");
    assert!(
        seen.iter()
            .all(|i| i.state == InstanceState::Terminated || i.state == InstanceState::Terminating),
        "{seen:?}"
    );
    // A restart: the bills of every instance ever run are still there, the same in all.
    let restarted = shared_at(&clock, &path);
    let bills = restarted.bills();
    assert_eq!(bills.len(), 1, "{bills:?}");
    assert_eq!(bills, a.bills());
    assert_eq!(bills[0].node_id, Some(req.node_id));
    assert!(bills[0].cost > Micros::ZERO);
    // Trace offsets count from the first process's start, whoever reads them.
    let t = clock.now();
    for at in 0..30 {
        let t = t + Duration::minutes(at);
        assert_eq!(
            a.spot_available("us-east-1a", "p3.2xlarge", t),
            b.spot_available("us-east-1a", "p3.2xlarge", t)
        );
    }
}

#[test]
fn a_state_file_of_another_cloud_or_corrupt_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("aws.json");
    let (_, clock) = setup(Cloud::Aws);
    drop(shared_at(&clock, &path));
    let other = SimCloud::new(
        SimConfig::new(Cloud::Gcp, 7),
        vec![],
        traces(),
        Arc::new(clock.clone()),
    )
    .shared(&path)
    .expect_err("another cloud's file");
    let text = other.to_string();
    assert!(text.contains("aws.json") && text.contains("gcp"), "{text}");
    std::fs::write(&path, b"{\"flavour\":").expect("write");
    let corrupt = SimCloud::new(
        SimConfig::new(Cloud::Aws, 7),
        vec![],
        traces(),
        Arc::new(clock.clone()),
    )
    .shared(&path)
    .expect_err("corrupt");
    let text = corrupt.to_string();
    assert!(
        text.contains("aws.json") && text.contains("move it away"),
        "{text}"
    );
}
