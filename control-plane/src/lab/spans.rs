//! The control plane's spans (`crate::telemetry`), seen by a capturing subscriber: the
//! simulated world of `spotplane demo` (its scheduling, capacity and recovery loops, the
//! simulated clouds and agents) runs a few jobs while every span is recorded with its fields
//! and parent; then a request asks for one of the jobs through the API. Here rather than in
//! `telemetry` because it drives the lab's world, which production modules never name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tower::ServiceExt;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use tracing_subscriber::{EnvFilter, Layer};

use super::replay::{JobStream, ReplaySpec, World};
use crate::planner::PlanPolicy;

/// A span as it was recorded.
#[derive(Debug, Clone, Default)]
struct Seen {
    name: &'static str,
    parent: Option<&'static str>,
    parent_fields: HashMap<String, String>,
    fields: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<Seen>>>,
    /// Span id to its index in `spans` (ids are reused once a span closes).
    index: Arc<Mutex<HashMap<u64, usize>>>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S> Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut seen = Seen {
            name: attrs.metadata().name(),
            ..Seen::default()
        };
        attrs.record(&mut Fields(&mut seen.fields));
        let parent = attrs
            .parent()
            .cloned()
            .or_else(|| ctx.current_span().id().cloned());
        if let Some(p) = parent.and_then(|p| ctx.span(&p)) {
            seen.parent = Some(p.name());
            let index = self.index.lock().expect("index");
            if let Some(i) = index.get(&p.id().into_u64()) {
                seen.parent_fields = self.spans.lock().expect("spans")[*i].fields.clone();
            }
        }
        let mut spans = self.spans.lock().expect("spans");
        spans.push(seen);
        self.index
            .lock()
            .expect("index")
            .insert(id.into_u64(), spans.len() - 1);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let index = self.index.lock().expect("index");
        if let Some(i) = index.get(&id.into_u64()) {
            let mut spans = self.spans.lock().expect("spans");
            values.record(&mut Fields(&mut spans[*i].fields));
        }
    }
}

impl Capture {
    fn named(&self, name: &str) -> Vec<Seen> {
        self.spans
            .lock()
            .expect("spans")
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }
}

fn has(s: &Seen, field: &str) -> bool {
    s.fields.get(field).is_some_and(|v| !v.is_empty())
}

#[tokio::test]
async fn spans_carry_the_job_node_and_attempt_from_the_api_to_the_agents_commands() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry()
        .with(EnvFilter::new("debug"))
        .with(capture.clone());
    // This thread only: the test's runtime is single-threaded, so every task is seen.
    let _default = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::tempdir().expect("dir");
    let trace = dir.path().join("t.trace");
    let line = |steps: u32, at: u32, gpus: u32| {
        format!("ResNet-18\tpython3 main.py\t--num_steps\t1\t{steps}\t{at}.000000\t{gpus}\n")
    };
    std::fs::write(&trace, [line(6_000, 0, 1), line(6_000, 30, 2)].concat()).expect("trace");
    let spec = ReplaySpec {
        trace: JobStream::File(trace),
        days: 0.05,
        start: "2026-07-01T00:00:00Z".parse().expect("time"),
        step: chrono::Duration::seconds(60),
        market: spotplane_providers::sim::SimMarket::Shipped,
        max_jobs: 2,
        seconds_per_step: 0.1,
        consolidation: false,
        baseline_hears_notices: false,
    };
    let mut world = World::in_folder(&spec, PlanPolicy::ExpectedCost, dir.path())
        .await
        .expect("world");
    for _ in 0..40 {
        world.step().await.expect("step");
    }

    // The scheduling cycle placing a job: its job and node; the store's write under it.
    let admits = capture.named("admit");
    assert!(
        admits.iter().any(|s| has(s, "job_id") && has(s, "node_id")),
        "{admits:?}"
    );
    let stores = capture.named("store");
    assert!(
        stores.iter().any(|s| s.parent == Some("admit")
            && s.fields.get("op").map(String::as_str) == Some("admit_job")),
        "the admission's store write is a child of its span"
    );
    // Capacity buying a node, and the cloud call under it with the same node.
    let buys = capture.named("buy");
    let names: std::collections::BTreeSet<&str> = capture
        .spans
        .lock()
        .expect("spans")
        .iter()
        .map(|s| s.name)
        .collect();
    assert!(!buys.is_empty(), "a node was bought: spans {names:?}");
    let calls = capture.named("provider_call");
    assert!(
        calls.iter().any(|c| c.parent == Some("buy")
            && c.fields.get("op").map(String::as_str) == Some("provision")
            && c.fields.contains_key("node_id")
            && c.fields.get("node_id") == c.parent_fields.get("node_id")),
        "{calls:?}"
    );
    // The agent's start command: job, node, replica and attempt; its store write under it.
    let commands = capture.named("agent_command");
    let start = commands
        .iter()
        .find(|c| c.fields.get("command").map(String::as_str) == Some("start"))
        .unwrap_or_else(|| panic!("a start command: {commands:?}"));
    for f in ["job_id", "node_id", "replica", "attempt"] {
        assert!(has(start, f), "{f} on {start:?}");
    }
    assert_eq!(start.fields.get("attempt").map(String::as_str), Some("1"));
    assert!(
        stores.iter().any(|s| s.parent == Some("agent_command")
            && s.fields.get("op").map(String::as_str) == Some("start_replica")),
        "the command's store write is a child of its span"
    );

    // A request for that job: its span carries the job's id, the store read is under it.
    let job_id = start.fields["job_id"].clone();
    let config = crate::config::Config::embedded_default().expect("config");
    let state = crate::api::AppState::new(
        world.store.clone(),
        Arc::new(world.clock.clone()),
        crate::metrics::Metrics::new(),
        &config.server,
    );
    let token = "spans-test-admin-token-0123456789";
    world
        .store
        .bootstrap_admin(token, world.now())
        .await
        .expect("admin");
    let res = crate::api::router(state)
        .oneshot(
            axum::http::Request::get(format!("/v1/jobs/{job_id}"))
                .header("authorization", format!("Bearer {token}"))
                .body(axum::body::Body::empty())
                .expect("request"),
        )
        .await
        .expect("answer");
    assert_eq!(res.status(), 200);
    let requests = capture.named("request");
    let req = requests
        .iter()
        .find(|r| r.fields.get("job_id") == Some(&job_id))
        .unwrap_or_else(|| panic!("the request's span names the job: {requests:?}"));
    assert_eq!(
        req.fields.get("route").map(String::as_str),
        Some("/v1/jobs/{id}")
    );
    assert!(
        stores.len() < capture.named("store").len(),
        "the request made store calls"
    );
    assert!(
        capture
            .named("store")
            .iter()
            .any(|s| s.parent == Some("request")
                && s.parent_fields.get("job_id") == Some(&job_id)
                && s.fields.get("op").map(String::as_str) == Some("get_job")),
        "the store read is a child of the request's span"
    );
}
