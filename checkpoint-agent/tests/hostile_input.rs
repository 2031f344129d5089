//! Hostile input for the agent's parsers of outside input: the three clouds' metadata services
//! (AWS IMDSv2, GCP `preempted`, Azure Scheduled Events) answering anything with any status,
//! the control plane's answers, and what the agent reads from `nvidia-smi` and its command
//! line. Each gives a value or an error that says why; none panics. Cases per property:
//! `hostile::CASES`.

#[path = "../../core/tests/support/hostile.rs"]
mod hostile;

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hostile::{assert_says_why, bytes_like, json_like, text_like};
use proptest::prelude::*;
use spotplane_agent::notice::aws::{AwsImds, INSTANCE_ACTION_PATH, REBALANCE_PATH, TOKEN_PATH};
use spotplane_agent::notice::azure::AzureScheduledEvents;
use spotplane_agent::notice::gcp::GcpMetadata;
use spotplane_agent::notice::{
    MetaRequest, MetaResponse, MetadataHttp, NoticeSource, TransportError,
};
use spotplane_agent::{bench, gang, inventory, mig, workload};

/// A metadata service that answers each path with a fixed status and body.
struct Answers(Vec<(&'static str, u16, Vec<u8>)>);

#[async_trait]
impl MetadataHttp for Answers {
    async fn send(&self, _base: &str, req: MetaRequest) -> Result<MetaResponse, TransportError> {
        let (_, status, body) = self
            .0
            .iter()
            .find(|(p, _, _)| req.path.starts_with(p))
            .ok_or_else(|| TransportError(format!("no answer for {}", req.path)))?;
        Ok(MetaResponse {
            status: *status,
            body: body.clone(),
            etag: Some(String::from_utf8_lossy(body).chars().take(8).collect()),
        })
    }
}

const ACTION: &str = r#"{"action": "terminate", "time": "2026-11-30T08:24:00Z"}"#;
const REBALANCE: &str = r#"{"noticeTime": "2026-11-30T08:22:00Z"}"#;
const AZURE: &str = r#"{"DocumentIncarnation": 2, "Events": [
    {"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": "Preempt",
     "ResourceType": "VirtualMachine", "Resources": ["vm-1"], "EventStatus": "Scheduled",
     "NotBefore": "Mon, 30 Nov 2026 08:24:00 GMT", "Description": "evicted",
     "EventSource": "Platform", "DurationInSeconds": -1}]}"#;

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_796_000_000, 0).unwrap_or_default()
}

fn status() -> impl Strategy<Value = u16> {
    prop_oneof![4 => Just(200u16), 1 => Just(404u16), 1 => 100u16..600]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime")
}

/// Polls `source` once: a notice, nothing, or an error that says why.
fn poll(rt: &tokio::runtime::Runtime, source: &dyn NoticeSource) {
    if let Err(e) = rt.block_on(source.poll(now())) {
        assert_says_why(source.name(), &e.to_string());
    }
}

proptest! {
    #![proptest_config(hostile::config())]

    #[test]
    fn aws_imds_answers_are_notices_nothing_or_errors(
        token in (status(), text_like("AQAEAJwXbXo=")),
        action in (status(), json_like(ACTION)),
        rebalance in (status(), json_like(REBALANCE)),
    ) {
        let http = Answers(vec![
            (TOKEN_PATH, token.0, token.1.into_bytes()),
            (INSTANCE_ACTION_PATH, action.0, action.1.into_bytes()),
            (REBALANCE_PATH, rebalance.0, rebalance.1.into_bytes()),
        ]);
        poll(&runtime(), &AwsImds::new(Arc::new(http), "http://imds"));
    }

    #[test]
    fn gcp_preempted_answers_are_notices_nothing_or_errors(
        answer in (status(), bytes_like("TRUE")),
    ) {
        let http = Answers(vec![("computeMetadata/", answer.0, answer.1)]);
        poll(&runtime(), &GcpMetadata::new(Arc::new(http), "http://metadata"));
    }

    #[test]
    fn azure_scheduled_events_are_notices_nothing_or_errors(
        answer in (status(), json_like(AZURE)),
        vm in prop::option::of(prop_oneof![Just("vm-1".to_owned()), "[a-z0-9-]{0,8}"]),
    ) {
        let http = Answers(vec![("metadata/", answer.0, answer.1.into_bytes())]);
        poll(&runtime(), &AzureScheduledEvents::new(Arc::new(http), "http://169.254.169.254", vm));
    }

    #[test]
    fn nvidia_smi_output_and_command_line_values_parse_or_say_why(
        gpus in text_like("0, GPU-5c1e, NVIDIA H100 80GB HBM3, 81559, Enabled\n"),
        mig_devices in text_like("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5c1e)\n  MIG 3g.40gb     Device  0: (UUID: MIG-1a2b)\n"),
        processes in text_like("0, 1, 12345\n"),
        signal in text_like("SIGUSR1"),
        address in text_like("10.0.3.7"),
        size in text_like("512MiB"),
    ) {
        let _ = inventory::parse_gpu_list(&gpus);
        let _ = inventory::parse_mig_devices(&mig_devices);
        let _ = inventory::parse_gpu_instances(&mig_devices);
        let _ = inventory::parse_profile_geometry(&mig_devices, &processes);
        let _ = mig::parse_mig_processes(&processes);
        if let Err(e) = workload::parse_signal(&signal) {
            assert_says_why("signal", &e);
        }
        if let Err(e) = gang::parse_advertise_address(&address) {
            assert_says_why("address", &e);
        }
        if let Err(e) = bench::parse_size(&size) {
            assert_says_why("size", &e);
        }
    }
}
