//! Three `spotplane serve` replicas on one PostgreSQL, all serving the API, each loop led by one
//! of them (PostgreSQL advisory locks). The leader of the scheduling round is killed with
//! SIGKILL twice: while it provisions, then while a node it drains checkpoints and its job is
//! requeued. The simulated clouds are shared by the replicas and outlive them (`sim.state_dir`),
//! the agents reach the control plane through a balancer that skips dead replicas, as a load
//! balancer would, and a bounded API load runs on the survivors the whole time.
//!
//! - another replica leads within 15 s of each kill;
//! - no instance is bought twice (one per node in the clouds' own bills, each a known node's);
//! - no job is lost or runs twice (every job succeeds at its last step; no attempt of a replica
//!   ran on two nodes);
//! - the API load on the survivors sees no 5xx.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use spotplane_tests::agents::{
    Addresses, Agents, kill_all, launch_agents, replica_outputs, step_of,
};
use spotplane_tests::cluster::{
    ServeConfig, assert_one_instance_per_node, example_job, has_complete_checkpoint, job_instance,
};
use spotplane_tests::{Db, Proc, bin, free_port};

const ADMIN: &str = "e2e-failover-admin-token-0123456789ab";
const SPEED: u32 = 10;
const REPLICAS: usize = 3;

fn config(dir: &Path, port: u16, schema_port: u16) -> String {
    let cluster = format!("failover-{schema_port}");
    ServeConfig {
        speed: SPEED,
        cluster: &cluster,
        one_gpu_nodes: true,
        seeds: (31, 32),
        shared_clouds: true,
        capacity: "idle_grace = \"1m\"",
        extra: "",
    }
    .toml(
        dir,
        port,
        &Db::Postgres.config(dir, "failover", schema_port),
    )
}

struct Replica {
    url: String,
    serve: Option<Proc>,
}

/// Forwards every request to the first replica that answers, as a load balancer in front of
/// the replicas would (the agents and their metadata reads go through it).
#[derive(Clone)]
struct Balancer {
    backends: Arc<Vec<String>>,
    http: reqwest::Client,
}

async fn forward(State(b): State<Balancer>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 64 << 20).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    for backend in b.backends.iter() {
        let mut out = b
            .http
            .request(parts.method.clone(), format!("{backend}{path}"))
            .body(body.clone());
        for (k, v) in &parts.headers {
            if k != "host" {
                out = out.header(k, v);
            }
        }
        // A dead replica refuses the connection: try the next one.
        let Ok(r) = out.send().await else { continue };
        let status = r.status();
        let headers = r.headers().clone();
        let bytes = r.bytes().await.unwrap_or_default();
        let mut resp = Response::new(Body::from(bytes));
        *resp.status_mut() = status;
        for (k, v) in &headers {
            if k != "transfer-encoding" && k != "content-length" {
                resp.headers_mut().insert(k, v.clone());
            }
        }
        return resp;
    }
    StatusCode::BAD_GATEWAY.into_response()
}

async fn balancer(backends: Vec<String>) -> String {
    let app = Router::new().fallback(forward).with_state(Balancer {
        backends: Arc::new(backends),
        http: reqwest::Client::new(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// Counts of the API load's answers on the survivors.
#[derive(Default)]
struct Load {
    ok: AtomicU64,
    server_errors: AtomicU64,
    refused: AtomicU64,
    errors: Mutex<Vec<String>>,
}

struct Cluster {
    dir: tempfile::TempDir,
    replicas: Vec<Replica>,
    front: String,
    agents: Agents,
    launcher: tokio::task::JoinHandle<()>,
    http: reqwest::Client,
}

impl Cluster {
    async fn start() -> Cluster {
        for b in ["spotplane", "spotplane-agent", "spotplane-example-train"] {
            bin(b);
        }
        let dir = tempfile::tempdir().expect("tmp");
        spotplane_tests::reachable_workload(dir.path(), &bin("spotplane-example-train"));
        let ports: Vec<u16> = (0..REPLICAS).map(|_| free_port()).collect();
        let mut replicas = Vec::new();
        for (n, port) in ports.iter().enumerate() {
            let config = dir.path().join(format!("spotplane-{n}.toml"));
            std::fs::write(&config, self::config(dir.path(), *port, ports[0])).expect("config");
            let url = format!("http://127.0.0.1:{port}");
            let mut serve = spawn(dir.path(), &config, n);
            serve.wait_healthy(&format!("{url}/readyz")).await;
            replicas.push(Replica {
                url,
                serve: Some(serve),
            });
        }
        let front = balancer(replicas.iter().map(|r| r.url.clone()).collect()).await;
        let agents: Agents = Arc::default();
        let addresses: Addresses = Arc::default();
        let launcher = tokio::spawn(launch_agents(
            ADMIN,
            front.clone(),
            dir.path().to_owned(),
            agents.clone(),
            vec!["--container-runtime".into(), "none".into()],
            addresses,
            ports[0].to_be_bytes(),
        ));
        Cluster {
            dir,
            replicas,
            front,
            agents,
            launcher,
            http: reqwest::Client::new(),
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.front))
            .bearer_auth(ADMIN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.expect("the balancer answers");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn until<T>(&self, what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Some(v) = f().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        panic!("timed out after {secs} s waiting for {what}");
    }

    /// The replica leading `lock` now: the last to log that it leads it among the live ones.
    fn leader(&self, lock: &str) -> Option<(usize, chrono::DateTime<chrono::Utc>)> {
        self.replicas
            .iter()
            .enumerate()
            .filter_map(|(n, r)| Some((n, r.serve.as_ref()?)))
            .filter_map(|(n, p)| {
                p.output()
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .filter(|v| v["fields"]["message"] == "leading" && v["fields"]["lock"] == lock)
                    .filter_map(|v| v["timestamp"].as_str()?.parse().ok())
                    .next_back()
                    .map(|t| (n, t))
            })
            .max_by_key(|(_, t)| *t)
    }

    /// SIGKILLs the scheduling round's leader; returns how long it took another to lead.
    async fn kill_leader(&mut self) -> (usize, Duration) {
        let (n, _) = self.leader("scheduling").expect("a leader");
        let killed_at = chrono::Utc::now();
        let started = Instant::now();
        if let Some(mut p) = self.replicas[n].serve.take() {
            p.stop();
        }
        let (m, at) = self
            .until("another replica to lead", 30, async || {
                self.leader("scheduling").filter(|(_, t)| *t > killed_at)
            })
            .await;
        assert_ne!(m, n);
        let took = (at - killed_at).to_std().unwrap_or_default();
        assert!(started.elapsed() < Duration::from_secs(30));
        (n, took)
    }

    async fn job(&self, id: &str) -> Value {
        self.call(reqwest::Method::GET, &format!("/v1/jobs/{id}"), None)
            .await
            .1
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.launcher.abort();
        kill_all(&self.agents);
    }
}

fn spawn(dir: &Path, config: &Path, n: usize) -> Proc {
    let mut cmd = Command::new(bin("spotplane"));
    cmd.current_dir(dir)
        .env("SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN", ADMIN)
        .env("SPOTPLANE_LOG__LEVEL", "info")
        .env("SPOTPLANE_LOG__FORMAT", "json")
        .arg("--config")
        .arg(config)
        .arg("serve");
    Proc::spawn(cmd, dir.join(format!("serve-{n}.log")))
}

/// Reads the survivors' API, as users would, until told to stop.
async fn load(urls: Vec<String>, counts: Arc<Load>, stop: Arc<AtomicBool>) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let paths = ["/v1/jobs", "/v1/nodes", "/v1/overview", "/v1/teams"];
    let mut i = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let url = &urls[i % urls.len()];
        let path = paths[i % paths.len()];
        i += 1;
        match http
            .get(format!("{url}{path}"))
            .bearer_auth(ADMIN)
            .send()
            .await
        {
            Ok(r) if r.status().is_server_error() => {
                counts.server_errors.fetch_add(1, Ordering::Relaxed);
                counts
                    .errors
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("{path}: {}", r.status()));
            }
            Ok(_) => {
                counts.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                counts.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_twice_loses_nothing_and_buys_nothing_twice() {
    let mut c = Cluster::start().await;
    let (s, v) = c
        .call(
            reqwest::Method::POST,
            "/v1/teams",
            Some(json!({"name": "ml"})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let (first_leader, _) = c.leader("scheduling").expect("a leader");
    let mut jobs = Vec::new();
    for (i, steps) in [600u32, 700, 800].into_iter().enumerate() {
        let (s, v) = c
            .call(
                reqwest::Method::POST,
                "/v1/jobs",
                Some(example_job(
                    c.dir.path(),
                    &format!("failover-{i}"),
                    1,
                    steps,
                    30,
                )),
            )
            .await;
        assert_eq!(s, 201, "{v}");
        jobs.push((v["id"].as_str().expect("id").to_owned(), u64::from(steps)));
    }
    // The load on the replicas that will survive the first kill.
    let survivors: Vec<String> = c
        .replicas
        .iter()
        .enumerate()
        .filter(|(n, _)| *n != first_leader)
        .map(|(_, r)| r.url.clone())
        .collect();
    let counts = Arc::new(Load::default());
    let stop = Arc::new(AtomicBool::new(false));
    let loader = tokio::spawn(load(survivors, counts.clone(), stop.clone()));
    // 1. While it provisions: the first nodes requested, not yet ready.
    c.until("nodes being bought", 60, async || {
        let (_, n) = c.call(reqwest::Method::GET, "/v1/nodes", None).await;
        n["items"]
            .as_array()?
            .iter()
            .any(|n| matches!(n["state"].as_str(), Some("requested" | "booting")))
            .then_some(())
    })
    .await;
    let (killed, first_takeover) = c.kill_leader().await;
    assert_eq!(killed, first_leader);
    // 2. While a node drains: its job checkpoints and is requeued.
    let first = jobs[0].0.clone();
    let (cloud, name) = c
        .until("the first job running with a checkpoint", 240, async || {
            if c.job(&first).await["state"] != "running" {
                return None;
            }
            let (_, cp) = c
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/jobs/{first}/checkpoints"),
                    None,
                )
                .await;
            if !has_complete_checkpoint(&cp) {
                return None;
            }
            let (_, o) = c.call(reqwest::Method::GET, "/v1/overview", None).await;
            job_instance(&o, &first)
        })
        .await;
    let (s, v) = c
        .call(
            reqwest::Method::POST,
            &format!("/sim/control/{cloud}/instances/{name}/preempt"),
            None,
        )
        .await;
    assert_eq!(s, 202, "{v}");
    c.until("the node draining", 60, async || {
        (c.job(&first).await["state"] == "draining").then_some(())
    })
    .await;
    let (_, second_takeover) = c.kill_leader().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::SeqCst);
    let _ = loader.await;
    // Every job finishes at its last step, each attempt of a replica on one node only.
    for (job, steps) in &jobs {
        let j = c
            .until(&format!("job {job} succeeded"), 600, async || {
                let j = c.job(job).await;
                assert_ne!(j["state"], "failed", "{j}");
                (j["state"] == "succeeded").then_some(j)
            })
            .await;
        let outputs = replica_outputs(c.dir.path(), job, 0);
        let attempts: Vec<u32> = outputs.iter().map(|(a, _)| *a).collect();
        let distinct: BTreeSet<u32> = attempts.iter().copied().collect();
        assert_eq!(
            attempts.len(),
            distinct.len(),
            "an attempt ran twice: {attempts:?}"
        );
        let last = outputs.last().map(|(_, o)| o.as_str()).unwrap_or_default();
        assert_eq!(
            step_of(last, "done step="),
            Some(*steps),
            "{job}: {j}\n{last}"
        );
    }
    // No instance bought twice.
    let (_, nodes) = c
        .call(reqwest::Method::GET, "/v1/nodes?limit=500", None)
        .await;
    let mut bills = Vec::new();
    for cloud in ["aws", "gcp"] {
        let (s, v) = c
            .call(
                reqwest::Method::GET,
                &format!("/sim/control/{cloud}/bills"),
                None,
            )
            .await;
        assert_eq!(s, 200, "{v}");
        bills.extend(v["items"].as_array().cloned().unwrap_or_default());
    }
    let instances = assert_one_instance_per_node(&nodes, &bills);
    let errors = counts
        .errors
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    assert_eq!(
        counts.server_errors.load(Ordering::Relaxed),
        0,
        "{errors:?}"
    );
    for took in [first_takeover, second_takeover] {
        assert!(took <= Duration::from_secs(15), "took over after {took:?}");
    }
    println!(
        "failover: takeovers {:.2} s and {:.2} s; API load on the survivors: {} answered, {} 5xx, {} refused (the second kill's replica); {} instances, one per node; {} jobs succeeded",
        first_takeover.as_secs_f64(),
        second_takeover.as_secs_f64(),
        counts.ok.load(Ordering::Relaxed),
        counts.server_errors.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
        instances,
        jobs.len()
    );
}
