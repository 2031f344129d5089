//! Stub servers speaking the real protocols over HTTP: the control plane's agent API and an
//! AWS instance metadata service (IMDSv2).
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde_json::{Value, json};
use spotplane_core::agent::{
    CheckpointReport, Command, CommandResult, GpuTelemetry, Heartbeat, RegisterRequest,
    ReplicaPhase, TerminationNotice, bootstrap_token_node,
};
use spotplane_core::{CommandId, JobId, NodeId};

/// How the tests' agents isolate replicas: a user of their own per job, as on a real node,
/// when the tests run as root (as in CI); else as the test's own user, said once per test.
pub fn isolation() -> spotplane_agent::isolation::Isolation {
    use spotplane_agent::isolation::{Isolation, effective_uid};
    if effective_uid().ok() == Some(0) {
        Isolation::User
    } else {
        eprintln!("not root: replicas run with --workload-isolation none");
        Isolation::None
    }
}

/// A node's folder for a test: searchable by the workloads' users (0711, as `/var/lib` is),
/// with the example workload where they can run it (the target folder may be under a home
/// only root may enter).
pub fn node_dir() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tmp");
    spotplane_tests::reachable_workload(
        tmp.path(),
        std::path::Path::new(env!("CARGO_BIN_EXE_spotplane-example-train")),
    );
    tmp
}

/// The example workload of a [`node_dir`].
pub fn example(node_dir: &std::path::Path) -> String {
    spotplane_tests::workload_path(node_dir)
        .display()
        .to_string()
}

/// Polls `f` every 50 ms for up to 60 s.
pub async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..1200 {
        if let Some(v) = f() {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}")
}

#[derive(Default)]
struct CpState {
    /// credential -> node
    credentials: HashMap<String, NodeId>,
    registered: HashMap<NodeId, RegisterRequest>,
    exchanges: usize,
    queued: HashMap<NodeId, Vec<Command>>,
    results: HashMap<CommandId, CommandResult>,
    heartbeats: HashMap<NodeId, Heartbeat>,
    heartbeat_count: HashMap<NodeId, usize>,
    checkpoints: Vec<CheckpointReport>,
}

#[derive(Clone)]
pub struct ControlPlaneStub {
    pub url: String,
    state: Arc<Mutex<CpState>>,
}

type S = Arc<Mutex<CpState>>;

fn bearer(h: &HeaderMap) -> String {
    h.get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_owned()
}

fn lock(s: &S) -> std::sync::MutexGuard<'_, CpState> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

async fn register(State(s): State<S>, h: HeaderMap, Json(req): Json<RegisterRequest>) -> Response {
    let token = bearer(&h);
    let mut st = lock(&s);
    let credential = if let Some(node) = bootstrap_token_node(&token) {
        if node != req.node_id
            || st.registered.contains_key(&node) && st.credentials.values().any(|n| *n == node)
        {
            return StatusCode::UNAUTHORIZED.into_response();
        }
        let cred = format!("spt_cred_{}", node.as_uuid().simple());
        st.credentials.insert(cred.clone(), node);
        st.exchanges += 1;
        Some(cred)
    } else if st.credentials.get(&token) == Some(&req.node_id) {
        None
    } else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    st.registered.insert(req.node_id, req.clone());
    Json(
        json!({"node_id": req.node_id, "credential": credential, "heartbeat_interval_ms": 200,
        "notice_poll_interval_ms": 100, "checkpoint_signal": "SIGUSR1"}),
    )
    .into_response()
}

async fn heartbeat(State(s): State<S>, h: HeaderMap, Json(hb): Json<Heartbeat>) -> Response {
    let mut st = lock(&s);
    if st.credentials.get(&bearer(&h)) != Some(&hb.node_id) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    for r in &hb.results {
        st.results.insert(r.command_id, r.clone());
    }
    *st.heartbeat_count.entry(hb.node_id).or_default() += 1;
    st.heartbeats.insert(hb.node_id, hb.clone());
    let pending: Vec<Command> = st
        .queued
        .get(&hb.node_id)
        .map(|v| {
            v.iter()
                .filter(|c| !st.results.contains_key(&c.id))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    Json(json!({ "commands": pending })).into_response()
}

async fn result(
    State(s): State<S>,
    Path(_id): Path<String>,
    Json(r): Json<CommandResult>,
) -> Response {
    lock(&s).results.insert(r.command_id, r.clone());
    Json(json!({})).into_response()
}

async fn checkpoint(State(s): State<S>, h: HeaderMap, Json(r): Json<CheckpointReport>) -> Response {
    let mut st = lock(&s);
    if !st.credentials.contains_key(&bearer(&h)) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    st.checkpoints.push(r);
    Json(json!({})).into_response()
}

impl ControlPlaneStub {
    pub async fn start() -> Self {
        let state: S = Arc::default();
        let router = Router::new()
            .route("/v1/agent/register", post(register))
            .route("/v1/agent/heartbeat", post(heartbeat))
            .route("/v1/agent/commands/{id}/result", post(result))
            .route("/v1/agent/checkpoints", post(checkpoint))
            .with_state(state.clone());
        ControlPlaneStub {
            url: serve(router).await,
            state,
        }
    }

    /// Queues a command (`{"type": …}`) for a node; returns its id.
    pub fn queue(&self, node: NodeId, kind: Value) -> CommandId {
        let id = CommandId(uuid::Uuid::now_v7());
        let mut body = kind;
        body["id"] = json!(id);
        let cmd: Command = serde_json::from_value(body).expect("a command");
        lock(&self.state).queued.entry(node).or_default().push(cmd);
        id
    }

    pub fn registered(&self, node: NodeId) -> bool {
        lock(&self.state).registered.contains_key(&node)
    }

    /// What the node said of itself when it last registered.
    pub fn registration(&self, node: NodeId) -> Option<RegisterRequest> {
        lock(&self.state).registered.get(&node).cloned()
    }

    /// The address the node's agent registered, if it gave one.
    pub fn registered_address(&self, node: NodeId) -> Option<String> {
        lock(&self.state)
            .registered
            .get(&node)
            .and_then(|r| r.address.clone())
    }

    pub fn exchanges(&self) -> usize {
        lock(&self.state).exchanges
    }

    pub fn heartbeats(&self, node: NodeId) -> usize {
        lock(&self.state)
            .heartbeat_count
            .get(&node)
            .copied()
            .unwrap_or(0)
    }

    pub fn result(&self, id: CommandId) -> Option<CommandResult> {
        lock(&self.state).results.get(&id).cloned()
    }

    pub fn checkpoints(&self) -> Vec<CheckpointReport> {
        lock(&self.state).checkpoints.clone()
    }

    pub fn notice(&self, node: NodeId) -> Option<TerminationNotice> {
        lock(&self.state)
            .heartbeats
            .get(&node)
            .and_then(|h| h.notice.clone())
    }

    pub fn telemetry(&self, node: NodeId) -> Vec<GpuTelemetry> {
        lock(&self.state)
            .heartbeats
            .get(&node)
            .map(|h| h.gpus.clone())
            .unwrap_or_default()
    }

    pub fn replica_phase(&self, node: NodeId, job: JobId) -> Option<ReplicaPhase> {
        lock(&self.state)
            .heartbeats
            .get(&node)
            .and_then(|h| h.replicas.iter().find(|r| r.job_id == job).map(|r| r.phase))
    }

    pub fn replica_exit(&self, node: NodeId, job: JobId) -> Option<i32> {
        lock(&self.state)
            .heartbeats
            .get(&node)
            .and_then(|h| h.replicas.iter().find(|r| r.job_id == job))
            .and_then(|r| r.exit_code)
    }
}

/// IMDSv2 with a settable `spot/instance-action`.
pub struct ImdsStub {
    pub url: String,
    action: Arc<Mutex<Option<String>>>,
}

impl ImdsStub {
    pub async fn start() -> Self {
        let action: Arc<Mutex<Option<String>>> = Arc::default();
        let a = action.clone();
        let router = Router::new()
            .route("/latest/api/token", put(|| async { "tok" }))
            .route(
                "/latest/meta-data/spot/instance-action",
                get(move |h: HeaderMap| {
                    let a = a.clone();
                    async move {
                        if h.get("x-aws-ec2-metadata-token").is_none() {
                            return StatusCode::UNAUTHORIZED.into_response();
                        }
                        match a.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                            Some(b) => b.into_response(),
                            None => StatusCode::NOT_FOUND.into_response(),
                        }
                    }
                }),
            )
            .route(
                "/latest/meta-data/instance-id",
                get(|| async { "i-0123456789abcdef0" }),
            );
        ImdsStub {
            url: serve(router).await,
            action,
        }
    }

    pub fn set_instance_action(&self, body: Option<&str>) {
        *self.action.lock().unwrap_or_else(|p| p.into_inner()) = body.map(str::to_owned);
    }
}
