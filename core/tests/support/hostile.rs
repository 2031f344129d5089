//! Hostile input for the parsers of outside input: arbitrary text and bytes, and mutations of a
//! valid sample (cut short, a byte changed, text spliced in, a field dropped or given the wrong
//! type, huge numbers, deep nesting).
//!
//! One file for every crate's `tests/hostile_input.rs`, which include it with `#[path]`: the
//! crates share no test-only dependency, and a helper crate for sixty lines would be more.

#![allow(dead_code)]

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::Value;

/// Cases per property and run: enough to reach every mutation of every sample, few enough
/// that the normal test run stays fast.
pub const CASES: u32 = 256;

pub fn config() -> Config {
    Config {
        cases: CASES,
        // Failures are reported with their input; no files are left in the source tree.
        failure_persistence: None,
        ..Config::default()
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Bytes derived from `sample`, or arbitrary ones.
pub fn bytes_like(sample: &'static str) -> BoxedStrategy<Vec<u8>> {
    let s = sample.as_bytes();
    let n = s.len().max(1);
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        any::<String>().prop_map(String::into_bytes),
        // Cut short.
        (0..=s.len()).prop_map(move |k| s[..k].to_vec()),
        // One byte changed.
        (0..n, any::<u8>()).prop_map(move |(i, b)| {
            let mut v = s.to_vec();
            if let Some(x) = v.get_mut(i) {
                *x = b;
            }
            v
        }),
        // Syntax spliced in.
        (0..n, r#"[\[\]{}",:0-9a-z\\ \n\t.-]{1,12}"#).prop_map(move |(i, ins)| {
            let mut v = s.to_vec();
            let at = i.min(v.len());
            v.splice(at..at, ins.into_bytes());
            v
        }),
        // A digit run made huge.
        prop_oneof![
            Just("99999999999999999999999999999999"),
            Just("1e400"),
            Just("-1"),
            Just("18446744073709551616"),
            Just("NaN"),
        ]
        .prop_map(move |big| huge_number(sample, big).into_bytes()),
        // Deep nesting.
        (1usize..4000).prop_map(|d| format!("{}{}", "[".repeat(d), "]".repeat(d)).into_bytes()),
        (1usize..4000)
            .prop_map(|d| format!("{}1{}", "{\"a\":".repeat(d), "}".repeat(d)).into_bytes()),
        // Long.
        (0usize..200_000).prop_map(|n| "x".repeat(n).into_bytes()),
    ]
    .boxed()
}

/// Text derived from `sample` (bytes that are not UTF-8 made into replacement characters).
pub fn text_like(sample: &'static str) -> BoxedStrategy<String> {
    bytes_like(sample).prop_map(|b| lossy(&b)).boxed()
}

fn huge_number(sample: &str, big: &str) -> String {
    match sample.find(|c: char| c.is_ascii_digit()) {
        Some(start) => {
            let end = sample[start..]
                .find(|c: char| !c.is_ascii_digit())
                .map_or(sample.len(), |e| start + e);
            format!("{}{big}{}", &sample[..start], &sample[end..])
        }
        None => format!("{sample}{big}"),
    }
}

fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(o) => o.values().map(count).sum(),
        _ => 0,
    }
}

/// Replaces the `at`-th node of `v` (pre-order) with what `f` makes of it; true once done.
fn replace_at(v: &mut Value, at: &mut usize, f: &dyn Fn(&Value) -> Value) -> bool {
    if *at == 0 {
        *v = f(v);
        return true;
    }
    *at -= 1;
    match v {
        Value::Array(a) => a.iter_mut().any(|c| replace_at(c, at, f)),
        Value::Object(o) => o.values_mut().any(|c| replace_at(c, at, f)),
        _ => false,
    }
}

/// What `how` makes of a node.
fn changed(node: &Value, how: u8, n: i64, s: &str) -> Value {
    let pick = |len: usize| usize::try_from(n.unsigned_abs()).unwrap_or(0) % len;
    match (how, node) {
        // Drop one of an object's fields, or one of an array's items.
        (0, Value::Object(o)) if !o.is_empty() => {
            let mut o = o.clone();
            if let Some(k) = o.keys().nth(pick(o.len())).cloned() {
                o.remove(&k);
            }
            Value::Object(o)
        }
        (0, Value::Array(a)) if !a.is_empty() => {
            let mut a = a.clone();
            a.remove(pick(a.len()));
            Value::Array(a)
        }
        (0 | 1, _) => Value::Null,
        (2, _) => Value::Bool(n % 2 == 0),
        (3, _) => Value::from(n),
        (4, _) => Value::from(u64::MAX),
        (5, _) => Value::String(s.to_owned()),
        (6, _) => (0..20).fold(serde_json::json!({"a": [s]}), |v, _| serde_json::json!([v])),
        (7, _) => Value::from(f64::MAX),
        // An extra field.
        (8, Value::Object(o)) => {
            let mut o = o.clone();
            o.insert(s.to_owned(), Value::from(n));
            Value::Object(o)
        }
        _ => serde_json::json!({}),
    }
}

/// JSON text derived from the JSON `sample`: its tree changed in one place, or its text as in
/// [`text_like`].
pub fn json_like(sample: &'static str) -> BoxedStrategy<String> {
    let v: Value = serde_json::from_str(sample).expect("the sample is JSON");
    let nodes = count(&v);
    prop_oneof![
        2 => text_like(sample),
        3 => (0..nodes, 0u8..10, any::<i64>(), "[a-z_.]{0,8}").prop_map(move |(at, how, n, s)| {
            let mut v = v.clone();
            replace_at(&mut v, &mut { at }, &|node| changed(node, how, n, &s));
            v.to_string()
        }),
    ]
    .boxed()
}

/// An error must say something.
pub fn assert_says_why(what: &str, message: &str) {
    assert!(
        !message.trim().is_empty(),
        "{what}: an error without a message"
    );
}

/// Valid messages of the agent protocol and a valid job spec, to mutate.
pub mod samples {
    pub const REGISTER: &str = r#"{"protocol_version": 1, "node_id": "0190b5a0-0000-7000-8000-000000000001",
        "agent_version": "0.1.0", "hostname": "ip-10-0-0-1", "instance_id": "i-0abc",
        "cpu_milli": 192000, "memory_mib": 2097152, "address": "10.0.3.7",
        "gpus": [{"index": 0, "uuid": "GPU-5c1e", "name": "NVIDIA H100 80GB HBM3",
                  "memory_mib": 81559, "mig_enabled": true, "mig_devices": []}]}"#;
    pub const HEARTBEAT: &str = r#"{"node_id": "0190b5a0-0000-7000-8000-000000000001",
        "sent_at": "2026-01-01T00:00:00Z", "gpus": [], "replicas": [], "notice": null,
        "results": [{"command_id": "0190b5a0-0000-7000-8000-000000000002", "ok": true,
                     "message": "2 replicas checkpointed"}]}"#;
    pub const COMMANDS: &str = r#"{"commands": [{"id": "0190b5a0-0000-7000-8000-000000000002",
        "type": "drain", "reason": "retiring the node"}]}"#;
    pub const RESULT: &str =
        r#"{"command_id": "0190b5a0-0000-7000-8000-000000000002", "ok": false, "message": "no"}"#;
    pub const REPORT: &str = r#"{"job_id": "0190b5a0-0000-7000-8000-000000000003", "replica": 0,
        "attempt": 1, "checkpoint_id": "0190b5a0-0000-7000-8000-000000000004",
        "uri": "s3://ckpt/alpha/replica-0/0190b5a0-0000-7000-8000-000000000004/manifest.json",
        "trigger": "notice", "outcome": "durable", "started_at": "2026-01-01T00:00:00Z",
        "finished_at": "2026-01-01T00:00:05Z",
        "manifest": {"job_id": "0190b5a0-0000-7000-8000-000000000003", "replica": 0,
            "checkpoint_id": "0190b5a0-0000-7000-8000-000000000004", "attempt": 1,
            "created_at": "2026-01-01T00:00:05Z", "total_bytes": 15,
            "files": [{"path": "state/step.json", "size": 15,
                       "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}]}}"#;
    pub const LOGS: &str = r#"{"chunks": [{"job_id": "0190b5a0-0000-7000-8000-000000000003",
        "replica": 0, "attempt": 1, "offset": 0, "data": "eA==", "eof": true}]}"#;
    pub const REGISTERED: &str = r#"{"node_id": "0190b5a0-0000-7000-8000-000000000001",
        "credential": "spt_abc", "heartbeat_interval_ms": 5000, "notice_poll_interval_ms": 1000,
        "checkpoint_signal": "SIGUSR1"}"#;
    pub const JOB: &str = r#"{"name": "train", "shape": {"gpus": 1},
        "command": ["python", "train.py"], "replicas": 2, "cpu_milli": 4000, "memory_mib": 16384,
        "env": {"LR": "0.1"}, "labels": {"k": "v"},
        "checkpoint": {"uri": "s3://b/p", "interval_s": 600}}"#;
}
