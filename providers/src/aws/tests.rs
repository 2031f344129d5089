use super::sdk::{code_error, gpu_model_of};
use super::*;
use crate::InterruptionKind;

fn now() -> DateTime<Utc> {
    "2026-11-30T08:22:05Z".parse().expect("time")
}

fn event(source: &str, detail_type: &str, detail: serde_json::Value) -> String {
    serde_json::json!({
        "version": "0", "id": "7bf73129-1428-4cd3-a780-95db273d1602",
        "detail-type": detail_type, "source": source, "account": "123456789012",
        "time": "2026-11-30T08:22:00Z", "region": "us-east-2",
        "resources": ["arn:aws:ec2:us-east-2:123456789012:instance/i-0abc"],
        "detail": detail,
    })
    .to_string()
}

fn events(body: &str) -> Vec<InterruptionEvent> {
    match parse_event(body, now()).expect("parses") {
        Routed::Events(e) => e,
        Routed::Ignored(why) => panic!("ignored: {why}"),
    }
}

#[test]
fn a_spot_warning_gives_two_minutes_from_the_event_time() {
    let e = events(&event(
        "aws.ec2",
        "EC2 Spot Instance Interruption Warning",
        serde_json::json!({"instance-id": "i-0abc", "instance-action": "terminate"}),
    ));
    assert_eq!(
        e,
        [InterruptionEvent {
            provider_id: "i-0abc".into(),
            kind: InterruptionKind::Preemption,
            deadline: Some("2026-11-30T08:24:00Z".parse().expect("time")),
            observed_at: now(),
        }]
    );
}

#[test]
fn each_known_kind_is_routed_and_the_rest_ignored() {
    let table: Vec<(String, Option<(InterruptionKind, &str)>)> = vec![
        (
            event(
                "aws.ec2",
                "EC2 Instance Rebalance Recommendation",
                serde_json::json!({"instance-id": "i-1"}),
            ),
            Some((InterruptionKind::Rebalance, "i-1")),
        ),
        (
            event(
                "aws.ec2",
                "EC2 Instance State-change Notification",
                serde_json::json!({"instance-id": "i-2", "state": "shutting-down"}),
            ),
            Some((InterruptionKind::Stopped, "i-2")),
        ),
        (
            event(
                "aws.ec2",
                "EC2 Instance State-change Notification",
                serde_json::json!({"instance-id": "i-3", "state": "running"}),
            ),
            None,
        ),
        (
            event(
                "aws.health",
                "AWS Health Event",
                serde_json::json!({
                    "service": "EC2", "eventTypeCategory": "scheduledChange",
                    "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
                    "startTime": "Wed, 02 Dec 2026 08:00:00 GMT",
                    "affectedEntities": [{"entityValue": "i-4"}]
                }),
            ),
            Some((InterruptionKind::Maintenance, "i-4")),
        ),
        (
            event(
                "aws.health",
                "AWS Health Event",
                serde_json::json!({"service": "RDS", "eventTypeCategory": "scheduledChange",
                    "affectedEntities": [{"entityValue": "db-1"}]}),
            ),
            None,
        ),
        (
            event("aws.s3", "Object Created", serde_json::json!({})),
            None,
        ),
    ];
    for (body, want) in table {
        match (parse_event(&body, now()).expect("parses"), want) {
            (Routed::Events(e), Some((kind, id))) => {
                assert_eq!(e.len(), 1, "{body}");
                assert_eq!((e[0].kind, e[0].provider_id.as_str()), (kind, id));
            }
            (Routed::Ignored(_), None) => {}
            (got, want) => panic!("{body}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn a_health_event_has_its_start_as_deadline() {
    let e = events(&event(
        "aws.health",
        "AWS Health Event",
        serde_json::json!({"service": "EC2", "eventTypeCategory": "scheduledChange",
            "startTime": "Wed, 02 Dec 2026 08:00:00 GMT",
            "affectedEntities": [{"entityValue": "i-4"}, {"entityValue": "vol-9"}]}),
    ));
    assert_eq!(e.len(), 1, "only instances");
    assert_eq!(
        e[0].deadline,
        Some("2026-12-02T08:00:00Z".parse().expect("time"))
    );
}

#[test]
fn malformed_messages_are_errors_not_panics() {
    for body in [
        "",
        "not json",
        "{}",
        r#"{"source":"aws.ec2","detail-type":"EC2 Spot Instance Interruption Warning","time":"2026-11-30T08:22:00Z","detail":{}}"#,
        r#"{"source":"aws.ec2","detail-type":"EC2 Instance State-change Notification","time":"2026-11-30T08:22:00Z","detail":{"instance-id":"i-1"}}"#,
        r#"{"source":"aws.ec2","detail-type":"EC2 Spot Instance Interruption Warning","time":"yesterday","detail":{"instance-id":"i-1"}}"#,
    ] {
        assert!(parse_event(body, now()).is_err(), "{body:?}");
    }
}

#[test]
fn ec2_error_codes_map_to_what_the_planner_branches_on() {
    let table = [
        ("InsufficientInstanceCapacity", "insufficient_capacity"),
        ("MaxSpotInstanceCountExceeded", "quota"),
        ("VcpuLimitExceeded", "quota"),
        ("SpotMaxPriceTooLow", "price_too_low"),
        ("RequestLimitExceeded", "throttled"),
        ("UnauthorizedOperation", "auth"),
        ("AuthFailure", "auth"),
        ("InvalidInstanceID.NotFound", "not_found"),
        ("InternalError", "transient"),
        ("InvalidParameterValue", "invalid_request"),
    ];
    for (code, kind) in table {
        assert_eq!(code_error(code, code.into()).kind(), kind, "{code}");
    }
}

#[test]
fn the_newest_price_per_zone_wins() {
    let p = |zone: &str, price: &str, at: &str| SpotPricePoint {
        zone_name: zone.into(),
        instance_type: "p4d.24xlarge".into(),
        price: Micros::parse_usd(price).expect("price"),
        at: at.parse().expect("time"),
    };
    let latest = latest_per_zone(vec![
        p("us-east-1a", "9.1", "2026-11-30T06:00:00Z"),
        p("us-east-1a", "9.7", "2026-11-30T08:00:00Z"),
        p("us-east-1a", "8.0", "2026-11-29T08:00:00Z"),
        p("us-east-1b", "10.2", "2026-11-30T07:00:00Z"),
    ]);
    let a = &latest[&("us-east-1a".to_owned(), "p4d.24xlarge".to_owned())];
    assert_eq!(a.price, Micros::parse_usd("9.7").expect("price"));
    assert_eq!(latest.len(), 2);
}

#[test]
fn queue_urls_name_their_region() {
    assert_eq!(
        queue_region("https://sqs.us-east-2.amazonaws.com/123456789012/spotplane"),
        Some("us-east-2")
    );
    assert_eq!(queue_region("http://127.0.0.1:5000/123456789012/q"), None);
}

#[test]
fn ec2_gpu_names_map_to_models_by_memory() {
    assert_eq!(gpu_model_of("A100", Some(40960)), Some(GpuModel::A100_40GB));
    assert_eq!(gpu_model_of("A100", Some(81920)), Some(GpuModel::A100_80GB));
    assert_eq!(gpu_model_of("H100", Some(81920)), Some(GpuModel::H100_80GB));
    assert_eq!(gpu_model_of("L4", Some(22888)), Some(GpuModel::L4));
    assert_eq!(gpu_model_of("Radeon Pro V520", Some(8192)), None);
}

#[test]
fn launch_templates_are_shared_by_identical_nodes_only() {
    let spec = LaunchSpec {
        api: AwsLaunchApi::CreateFleet,
        instance_type: "g5.xlarge".into(),
        zone_name: "us-east-1a".into(),
        market: Market::Spot,
        client_token: "t1".into(),
        image_id: "ami-1".into(),
        subnet_id: None,
        security_group_ids: vec!["sg-1".into()],
        instance_profile: None,
        user_data: Some("#!/bin/sh".into()),
        tags: BTreeMap::new(),
    };
    let other_token = LaunchSpec {
        client_token: "t2".into(),
        instance_type: "g6.xlarge".into(),
        ..spec.clone()
    };
    let other_image = LaunchSpec {
        image_id: "ami-2".into(),
        ..spec.clone()
    };
    assert_eq!(spec.template_name(), other_token.template_name());
    assert_ne!(spec.template_name(), other_image.template_name());
    assert!(spec.template_name().len() <= 128);
}

/// One region of EC2 with one zone, no spot prices and no instance type it describes.
struct QuietEc2;

#[async_trait]
impl Ec2Api for QuietEc2 {
    async fn availability_zones(&self) -> Result<Vec<(String, String)>, ProviderError> {
        Ok(vec![("us-east-1a".into(), "use1-az1".into())])
    }
    async fn spot_prices(
        &self,
        _: &[String],
        _: DateTime<Utc>,
    ) -> Result<Vec<SpotPricePoint>, ProviderError> {
        Ok(Vec::new())
    }
    async fn instance_types(&self, _: &[String]) -> Result<Vec<InstanceTypeInfo>, ProviderError> {
        Ok(Vec::new())
    }
    async fn launch(&self, _: &LaunchSpec) -> Result<String, ProviderError> {
        Err(ProviderError::InvalidRequest("not in this test".into()))
    }
    async fn terminate(&self, _: &[String]) -> Result<(), ProviderError> {
        Err(ProviderError::InvalidRequest("not in this test".into()))
    }
    async fn instances_by_tags(
        &self,
        _: &BTreeMap<String, String>,
    ) -> Result<Vec<Ec2Instance>, ProviderError> {
        Ok(Vec::new())
    }
    async fn instances_by_id(&self, _: &[String]) -> Result<Vec<Ec2Instance>, ProviderError> {
        Ok(Vec::new())
    }
}

/// A Price List whose p5.48xlarge rate the test sets, or that fails.
#[derive(Clone, Default)]
struct ScriptedPrices(Arc<Mutex<Option<&'static str>>>);

#[async_trait]
impl PricingApi for ScriptedPrices {
    async fn products_page(
        &self,
        region: &str,
        _: &[String],
        _: Option<String>,
    ) -> Result<(Vec<String>, Option<String>), ProviderError> {
        let rate = *self.0.lock().expect("lock");
        let rate = rate.ok_or_else(|| ProviderError::Transient("GetProducts: 503".into()))?;
        let doc = serde_json::json!({
            "product": {"attributes": {
                "instanceType": "p5.48xlarge", "regionCode": region, "operatingSystem": "Linux",
                "preInstalledSw": "NA", "tenancy": "Shared", "capacitystatus": "Used"}},
            "terms": {"OnDemand": {"T.JRTCKXETXF": {"priceDimensions": {"T.JRTCKXETXF.6YS6EN2CT7": {
                "unit": "Hrs", "beginRange": "0", "endRange": "Inf", "pricePerUnit": {"USD": rate}}}}}}
        });
        Ok((vec![doc.to_string()], None))
    }
}

fn p5_row() -> CatalogRow {
    CatalogRow {
        instance_type: "p5.48xlarge".into(),
        vcpus: 192,
        memory_gib: 2048.0,
        gpu_model: Some(GpuModel::H100_80GB),
        gpu_count: 8,
        region: "us-east-1".into(),
        zone: "use1-az1".into(),
        price: Micros::parse_usd("98.32").expect("usd"),
        spot_price: Some(Micros::parse_usd("30.00").expect("usd")),
        placement_score: None,
        interruption_bucket: None,
    }
}

fn aws_config() -> AwsConfig {
    AwsConfig {
        regions: vec!["us-east-1".into()],
        endpoint_url: None,
        interruption_queue_url: None,
        instance_types: Vec::new(),
        image_id: "ami-1".into(),
        subnets: BTreeMap::new(),
        security_group_ids: Vec::new(),
        instance_profile: None,
        launch_api: AwsLaunchApi::CreateFleet,
        price_list: true,
        price_list_region: "us-east-1".into(),
        price_list_endpoint_url: None,
    }
}

/// One region with the p5 row, on-demand prices from `prices`.
async fn p5_provider(prices: ScriptedPrices) -> AwsProvider {
    AwsProvider::with_apis(
        aws_config(),
        vec![p5_row()],
        vec![("us-east-1".into(), Box::new(QuietEc2))],
        None,
    )
    .await
    .expect("provider")
    .with_pricing(Box::new(prices))
}

async fn on_demand(p: &AwsProvider) -> (Micros, PriceSource) {
    let offers = p.list_offers().await.expect("offers");
    let o = offers
        .iter()
        .find(|o| o.market == Market::OnDemand)
        .expect("an on-demand offer");
    assert!(
        offers
            .iter()
            .all(|x| x.on_demand_price == o.on_demand_price),
        "spot offers compare with the same on-demand price"
    );
    (o.on_demand_price, o.on_demand_source)
}

#[tokio::test(start_paused = true)]
async fn a_price_change_is_read_when_the_price_list_cache_expires() {
    let prices = ScriptedPrices::default();
    *prices.0.lock().expect("lock") = Some("55.0400000000");
    let p = p5_provider(prices.clone()).await;
    let usd = |s: &str| Micros::parse_usd(s).expect("usd");
    assert_eq!(on_demand(&p).await, (usd("55.04"), PriceSource::Live));

    // AWS changes the price: the offers (5 minutes) refresh, the Price List read (a day) not yet.
    *prices.0.lock().expect("lock") = Some("49.7500000000");
    tokio::time::advance(OFFER_TTL + Duration::from_secs(1)).await;
    assert_eq!(on_demand(&p).await, (usd("55.04"), PriceSource::Live));
    tokio::time::advance(PRICE_LIST_TTL).await;
    assert_eq!(on_demand(&p).await, (usd("49.75"), PriceSource::Live));

    // The Price List fails: the last prices read stay, and it is asked again sooner.
    *prices.0.lock().expect("lock") = None;
    tokio::time::advance(PRICE_LIST_TTL).await;
    assert_eq!(on_demand(&p).await, (usd("49.75"), PriceSource::Live));
    *prices.0.lock().expect("lock") = Some("51.0000000000");
    tokio::time::advance(PRICE_LIST_RETRY + Duration::from_secs(1)).await;
    assert_eq!(on_demand(&p).await, (usd("51.00"), PriceSource::Live));
}

#[tokio::test(start_paused = true)]
async fn without_a_price_list_answer_the_catalog_prices_and_the_offer_says_so() {
    let p = p5_provider(ScriptedPrices::default()).await;
    assert_eq!(
        on_demand(&p).await,
        (
            Micros::parse_usd("98.32").expect("usd"),
            PriceSource::Catalog
        )
    );
}

#[test]
fn price_list_documents_are_read_strictly() {
    let doc = |os: &str, region: &str, usd: &str| {
        serde_json::json!({
            "product": {"attributes": {
                "instanceType": "g6e.xlarge", "regionCode": region, "operatingSystem": os,
                "preInstalledSw": "NA", "tenancy": "Shared", "capacitystatus": "Used"}},
            "terms": {"OnDemand": {"T.JRTCKXETXF": {"priceDimensions": {"T.X": {
                "unit": "Hrs", "beginRange": "0", "pricePerUnit": {"USD": usd}}}}}}
        })
        .to_string()
    };
    assert_eq!(
        pricing::parse_product(&doc("Linux", "us-east-1", "1.8610000000"), "us-east-1"),
        Ok(Some((
            "g6e.xlarge".into(),
            Micros::parse_usd("1.861").expect("usd")
        )))
    );
    assert_eq!(
        pricing::parse_product(&doc("Windows", "us-east-1", "2.0"), "us-east-1"),
        Ok(None)
    );
    assert_eq!(
        pricing::parse_product(&doc("Linux", "us-west-2", "2.0"), "us-east-1"),
        Ok(None)
    );
    assert_eq!(
        pricing::parse_product(&doc("Linux", "us-east-1", "0.0000000000"), "us-east-1"),
        Ok(None),
        "a zero rate is no price"
    );
    assert!(pricing::parse_product(&doc("Linux", "us-east-1", "cheap"), "us-east-1").is_err());
    assert!(pricing::parse_product("{not json", "us-east-1").is_err());
}
