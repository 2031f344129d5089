//! Hostile input for the providers' parsers of outside input: the AWS interruption queue's
//! EventBridge messages, Price List documents, catalog CSV files and the GCP price history.
//! Each returns a value or an error that says why; none panics. Cases per property:
//! `hostile::CASES`.

#[path = "../../core/tests/support/hostile.rs"]
mod hostile;

use chrono::{DateTime, Utc};
use hostile::{assert_says_why, json_like, text_like};
use proptest::prelude::*;
use spotplane_providers::aws::{Routed, parse_event, pricing};
use spotplane_providers::{catalog, sim::traces};

const SPOT_WARNING: &str = r#"{"version": "0", "id": "7bf73129-1428-4cd3-a780-95db273d1602",
    "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
    "account": "123456789012", "time": "2026-11-30T08:22:00Z", "region": "us-east-2",
    "resources": ["arn:aws:ec2:us-east-2:123456789012:instance/i-0abc"],
    "detail": {"instance-id": "i-0abc", "instance-action": "terminate"}}"#;
const STATE_CHANGE: &str = r#"{"version": "0", "id": "7bf73129-1428-4cd3-a780-95db273d1603",
    "detail-type": "EC2 Instance State-change Notification", "source": "aws.ec2",
    "time": "2026-11-30T08:22:00Z", "detail": {"instance-id": "i-0abc", "state": "stopping"}}"#;
const HEALTH: &str = r#"{"detail-type": "AWS Health Event", "source": "aws.health",
    "time": "2026-11-30T08:22:00Z", "detail": {"service": "EC2",
    "eventTypeCategory": "scheduledChange", "startTime": "Wed, 30 Nov 2026 08:00:00 GMT",
    "affectedEntities": [{"entityValue": "i-0abc"}, {"entityValue": "vol-1"}]}}"#;
const PRODUCT: &str = r#"{"product": {"attributes": {"instanceType": "g6e.xlarge",
    "regionCode": "us-east-1", "operatingSystem": "Linux", "preInstalledSw": "NA",
    "tenancy": "Shared", "capacitystatus": "Used"}},
    "terms": {"OnDemand": {"T.JRTCKXETXF": {"priceDimensions": {"T.X": {
    "unit": "Hrs", "beginRange": "0", "pricePerUnit": {"USD": "1.8610000000"}}}}}}}"#;
const CATALOG: &str = "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,Region,AvailabilityZone,Price,SpotPrice,PlacementScore,InterruptionBucket
g4dn.12xlarge,48,192,T4,4,af-south-1,afs1-az2,5.19,0.519,,
p5.48xlarge,192,2048,H100,8,us-east-1,use1-az1,98.32,35.5,9,\"<5%\"
";
const GCP_HISTORY: &str = "snapshot_date,commit,machine_type,gpu_model,gpu_count,vcpus,ram_gb,region,hour_ondemand_usd,hour_spot_usd
2026-05-14,bc297ce725d0d3bd58e545757a4db4913b3b83e3,a2-highgpu-1g,a100,1,12,85,asia-northeast1,4.049590926,1.87147
2026-06-11,f660c20f16acbcc09ea1ee708be0d899a42e6be9,a2-highgpu-1g,a100,1,12,85,asia-northeast1,4.049590926,2.02487
";

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_796_000_000, 0).unwrap_or_default()
}

#[test]
fn the_samples_are_valid() {
    for body in [SPOT_WARNING, STATE_CHANGE, HEALTH] {
        assert!(
            matches!(parse_event(body, now()), Ok(Routed::Events(e)) if !e.is_empty()),
            "{body}"
        );
    }
    assert!(matches!(
        pricing::parse_product(PRODUCT, "us-east-1"),
        Ok(Some(_))
    ));
    assert_eq!(
        catalog::parse(CATALOG, "sample").map(|r| r.len()).ok(),
        Some(2)
    );
    assert!(traces::parse_gcp_history(GCP_HISTORY, "sample").is_ok());
}

/// A spot warning whose time is the last second chrono can hold: the deadline two minutes
/// later cannot be written down, and must be an error, not a panic.
#[test]
fn a_spot_warning_at_the_end_of_time_is_an_error() {
    let body = SPOT_WARNING.replace("2026-11-30T08:22:00Z", "+262142-12-31T23:59:59Z");
    match parse_event(&body, now()) {
        Err(e) => assert!(e.to_string().contains("no room for the notice"), "{e}"),
        Ok(r) => panic!("a deadline past the end of time: {r:?}"),
    }
}

proptest! {
    #![proptest_config(hostile::config())]

    #[test]
    fn interruption_queue_messages_route_or_say_why(
        warning in json_like(SPOT_WARNING),
        state in json_like(STATE_CHANGE),
        health in json_like(HEALTH),
    ) {
        for body in [warning, state, health] {
            match parse_event(&body, now()) {
                Ok(Routed::Ignored(why)) => assert_says_why("ignored", why),
                Ok(Routed::Events(_)) => {}
                Err(e) => assert_says_why("event", &e.to_string()),
            }
        }
    }

    #[test]
    fn price_list_documents_parse_or_say_why(doc in json_like(PRODUCT)) {
        if let Err(e) = pricing::parse_product(&doc, "us-east-1") {
            assert_says_why("product", &e);
        }
    }

    #[test]
    fn catalog_and_price_history_files_parse_or_say_why(
        csv in text_like(CATALOG),
        history in text_like(GCP_HISTORY),
    ) {
        if let Err(e) = catalog::parse(&csv, "catalog.csv") {
            assert_says_why("catalog", &e.to_string());
        }
        if let Err(e) = traces::parse_gcp_history(&history, "history.csv") {
            assert_says_why("history", &e.to_string());
        }
    }
}
