//! Hostile input for the control plane's parsers of outside input: job specs as JSON (the API)
//! and YAML (the CLI's job files), the agent protocol's requests as the API reads them, webhook
//! target URLs and secrets, the configuration file, the lab's trace files and the log query.
//! Each returns a value or an error that says why; none panics. Cases per property:
//! `hostile::CASES`.

#[path = "../../core/tests/support/hostile.rs"]
mod hostile;

use std::path::Path;

use hostile::samples::{HEARTBEAT, JOB, LOGS, REGISTER, REPORT, RESULT};
use hostile::{assert_says_why, bytes_like, json_like, text_like};
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use spotplane::api::extract::parse_json;
use spotplane::api::logs::parse_query;
use spotplane::config::Config;
use spotplane::lab::{deadline, openb, replay};
use spotplane::webhooks::{signing, target};
use spotplane_core::JobSpec;
use spotplane_core::agent::{
    CheckpointReport, CommandResult, Heartbeat, LogBatch, RegisterRequest,
};

const JOB_YAML: &str = "name: train\nshape:\n  gpus: 1\ncommand: [python, train.py]\nreplicas: 2\nenv:\n  LR: \"0.1\"\ncheckpoint:\n  uri: s3://b/p\n  interval_s: 600\n";
const CONFIG: &str = "[server]\nlisten = \"127.0.0.1:8080\"\nmax_body_bytes = 262144\nrequest_timeout = \"30s\"\n\n[database]\nurl = \"sqlite://data/spotplane.sqlite\"\nmax_connections = 8\n\n[scheduler]\nenabled = true\n";
const DEADLINE_TRACE: &str =
    r#"{"metadata": {"gap_seconds": 600}, "data": [0, 0, 1, 0], "prices": [0.3, 0.3, 0.9, 0.4]}"#;
const OPENB_NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,786432,8,V100M32\n";
const OPENB_PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,10,0,500,T4\np1,2000,20,1,1500,V100M16||V100M32\n";
const GAVEL: &str =
    "ResNet-18 (batch size 64)\tcd x && python3 main.py\t--num_steps\t1\t72000\t0.000000\t1\n";

/// Reads `body` as the API does: a value, or a problem that says why.
fn api_parses<T: DeserializeOwned>(what: &str, body: &[u8]) -> Option<T> {
    match parse_json::<T>(body) {
        Ok(v) => Some(v),
        Err(e) => {
            let p = e.to_problem();
            assert!(
                (400..500).contains(&p.status),
                "{what}: {} for bad input",
                p.status
            );
            let said = p.detail.clone().unwrap_or_default()
                + &p.errors
                    .iter()
                    .map(|e| e.message.clone())
                    .collect::<String>();
            assert_says_why(what, &said);
            None
        }
    }
}

fn validates(spec: &JobSpec) {
    let now = chrono::DateTime::from_timestamp(1_767_225_600, 0).unwrap_or_default();
    for e in spec.validate(now).iter() {
        assert_says_why(&e.field, &e.message);
    }
}

#[test]
fn the_samples_are_valid() {
    assert!(api_parses::<JobSpec>("job", JOB.as_bytes()).is_some());
    let yaml: serde_json::Value = serde_yaml_ng::from_str(JOB_YAML).expect("YAML");
    assert!(api_parses::<JobSpec>("yaml job", yaml.to_string().as_bytes()).is_some());
    assert!(target::parse("https://hooks.example.com/spotplane").is_ok());
    assert!(deadline::trace::parse(Path::new("t.json"), DEADLINE_TRACE.as_bytes()).is_ok());
    assert!(openb::trace::parse_nodes(Path::new("n.csv"), OPENB_NODES).is_ok());
    assert!(openb::trace::parse_pods(Path::new("p.csv"), OPENB_PODS).is_ok());
    assert!(replay::parse_trace(GAVEL, "gavel.txt", 0.1).is_ok());
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("spotplane.toml");
    std::fs::write(&file, CONFIG).expect("written");
    assert!(Config::load(Some(&file)).is_ok());
}

proptest! {
    #![proptest_config(hostile::config())]

    #[test]
    fn job_specs_in_json_parse_and_validate_or_say_why(body in json_like(JOB)) {
        if let Some(spec) = api_parses::<JobSpec>("job spec", body.as_bytes()) {
            validates(&spec);
        }
    }

    /// The CLI reads a YAML job file into JSON and sends that.
    #[test]
    fn job_specs_in_yaml_parse_and_validate_or_say_why(text in text_like(JOB_YAML)) {
        match serde_yaml_ng::from_str::<serde_json::Value>(&text) {
            Ok(v) => {
                if let Some(spec) = api_parses::<JobSpec>("yaml job spec", v.to_string().as_bytes()) {
                    validates(&spec);
                }
            }
            Err(e) => assert_says_why("yaml", &e.to_string()),
        }
    }

    #[test]
    fn agent_requests_parse_or_say_why(
        register in json_like(REGISTER),
        heartbeat in json_like(HEARTBEAT),
        result in json_like(RESULT),
        report in json_like(REPORT),
        logs in json_like(LOGS),
    ) {
        api_parses::<RegisterRequest>("register", register.as_bytes());
        api_parses::<Heartbeat>("heartbeat", heartbeat.as_bytes());
        api_parses::<CommandResult>("command result", result.as_bytes());
        api_parses::<CheckpointReport>("checkpoint report", report.as_bytes());
        api_parses::<LogBatch>("log batch", logs.as_bytes());
    }

    #[test]
    fn webhook_urls_secrets_and_log_queries_parse_or_say_why(
        url in text_like("https://hooks.example.com:8443/spotplane?x=1"),
        secret in text_like("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        query in text_like("replica=0&attempt=1&follow=true&tail=100"),
    ) {
        if let Err(e) = target::parse(&url) {
            assert_says_why("url", &e);
        }
        if let Err(e) = signing::Secret::parse(&secret) {
            assert_says_why("secret", &e);
        }
        if let Err(e) = parse_query(&query) {
            assert_says_why("log query", &e.to_string());
        }
    }

    #[test]
    fn configuration_files_load_or_say_why(text in text_like(CONFIG)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("spotplane.toml");
        std::fs::write(&file, text).expect("written");
        if let Err(e) = Config::load(Some(&file)) {
            assert_says_why("config", &e.to_string());
        }
    }

    #[test]
    fn lab_traces_parse_or_say_why(
        deadline_trace in bytes_like(DEADLINE_TRACE),
        nodes in text_like(OPENB_NODES),
        pods in text_like(OPENB_PODS),
        gavel in text_like(GAVEL),
        seconds_per_step in prop_oneof![Just(0.1f64), any::<f64>()],
    ) {
        if let Err(e) = deadline::trace::parse(Path::new("trace.json"), &deadline_trace) {
            assert_says_why("deadline trace", &e.to_string());
        }
        if let Err(e) = openb::trace::parse_nodes(Path::new("nodes.csv"), &nodes) {
            assert_says_why("openb nodes", &e.to_string());
        }
        if let Err(e) = openb::trace::parse_pods(Path::new("pods.csv"), &pods) {
            assert_says_why("openb pods", &e.to_string());
        }
        if let Err(e) = replay::parse_trace(&gavel, "gavel.txt", seconds_per_step) {
            assert_says_why("gavel trace", &format!("{e:#}"));
        }
    }
}
