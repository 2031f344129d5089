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
