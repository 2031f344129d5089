//! A crash at every step: `spotplane serve` (built with the `failpoints` feature) is aborted at
//! each crash point that writes state (control-plane/src/failpoints.rs), restarted on the same
//! database, and the run goes on, on SQLite and on PostgreSQL, with real agents and the example
//! workload, as in tests/tests/recovery.rs. The simulated clouds keep their state in
//! `sim.state_dir`, so that, like real clouds, they outlive the control plane: its instances go
//! on running (and being billed) while it is down.
//!
//! Every point is armed from the start (`FAILPOINTS`); the first one the process reaches aborts
//! it; it is restarted with the others armed, and so on, while the test drives a life that
//! reaches them all: three jobs, a webhook endpoint, a spot node taken back with its notice,
//! the work done, a fourth job put on on-demand during a spot crunch and moved to spot by
//! consolidation once the crunch is over, the fleet released. At the end:
//!
//! - no acknowledged job is lost: all four succeeded, each at its last step;
//! - no instance leaked: every instance the clouds ran has ended, once the orphan grace passed;
//! - none was bought twice: one instance at most per node, each of a node the control plane
//!   knows;
//! - the ledger equals the clouds' bills to the micro-dollar;
//! - every webhook delivery was received at least once, and each job's events first arrived in
//!   the order they happened.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};
use spotplane_tests::agents::{
    Addresses, Agents, kill_all, launch_agents, replica_outputs, step_of,
};
use spotplane_tests::cluster::{
    ServeConfig, assert_one_instance_per_node, example_job, has_complete_checkpoint, job_instance,
    job_node,
};
use spotplane_tests::{Db, Proc, bin, free_port, tail};

const ADMIN: &str = "e2e-crash-admin-token-0123456789abcdef";
const SPEED: u32 = 10;

/// Every crash point the run must reach (control-plane/src/failpoints.rs `POINTS`).
const POINTS: &[&str] = &[
    "provision-after-node-row",
    "provision-after-cloud-call",
    "provision-before-booting",
    "admission",
    "checkpoint-report",
    "drain",
    "requeue",
    "ledger-write",
    "webhook-delivery",
    "consolidation",
    "release",
];

fn config(dir: &Path, port: u16, db: Db) -> String {
    let cluster = format!("crash-{port}");
    ServeConfig {
        speed: SPEED,
        cluster: &cluster,
        one_gpu_nodes: true,
        seeds: (21, 22),
        shared_clouds: true,
        // Consolidation looks at a node whose work has stayed put for a simulated minute.
        capacity: "idle_grace = \"1m\"\norphan_grace = \"2m\"\nconsolidate_after = \"1m\"",
        extra: "[finance]\ninterval = \"1s\"\nsettle = \"30s\"\n\n[webhooks]\ninterval = \"1s\"\nretry_base = \"1s\"\nallow_private = true",
    }
    .toml(dir, port, &db.config(dir, "crash", port))
}

/// What the webhook endpoint received: `(webhook-id, event_id, job id, type)` in arrival order.
type Received = Arc<Mutex<Vec<(String, u64, String, String)>>>;

async fn receiver() -> (String, Received) {
    let got: Received = Arc::default();
    let sink = got.clone();
    let app = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap, body: Bytes| {
            let sink = sink.clone();
            async move {
                let id = headers
                    .get("webhook-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                sink.lock().unwrap_or_else(|p| p.into_inner()).push((
                    id,
                    v["event_id"].as_u64().unwrap_or(0),
                    v["data"]["job"]["id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    v["type"].as_str().unwrap_or_default().to_owned(),
                ));
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), got)
}

struct Run {
    dir: tempfile::TempDir,
    url: String,
    config: PathBuf,
    serve: Proc,
    agents: Agents,
    launcher: tokio::task::JoinHandle<()>,
    http: reqwest::Client,
    /// The points still armed, and those that fired, in order.
    armed: Vec<&'static str>,
    fired: Vec<String>,
    starts: u32,
}

impl Run {
    async fn start(db: Db) -> Run {
        for b in ["spotplane", "spotplane-agent", "spotplane-example-train"] {
            bin(b);
        }
        let dir = tempfile::tempdir().expect("tmp");
        spotplane_tests::reachable_workload(dir.path(), &bin("spotplane-example-train"));
        let port = free_port();
        let config = dir.path().join("spotplane.toml");
        std::fs::write(&config, self::config(dir.path(), port, db)).expect("config");
        let url = format!("http://127.0.0.1:{port}");
        let armed: Vec<&'static str> = POINTS.to_vec();
        let agents: Agents = Arc::default();
        let addresses: Addresses = Arc::default();
        let launcher = tokio::spawn(launch_agents(
            ADMIN,
            url.clone(),
            dir.path().to_owned(),
            agents.clone(),
            vec!["--container-runtime".into(), "none".into()],
            addresses,
            port.to_be_bytes(),
        ));
        let serve = Self::spawn(dir.path(), &config, &armed, 0);
        let mut run = Run {
            dir,
            url,
            config,
            serve,
            agents,
            launcher,
            http: reqwest::Client::new(),
            armed,
            fired: Vec::new(),
            starts: 0,
        };
        run.until_ready().await;
        run
    }

    fn spawn(dir: &Path, config: &Path, armed: &[&str], n: u32) -> Proc {
        let failpoints: Vec<String> = armed.iter().map(|p| format!("{p}=return")).collect();
        let mut cmd = Command::new(bin("spotplane"));
        cmd.current_dir(dir)
            .env("SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN", ADMIN)
            .env("SPOTPLANE_LOG__LEVEL", "info")
            .env("FAILPOINTS", failpoints.join(";"))
            .arg("--config")
            .arg(config)
            .arg("serve");
        Proc::spawn(cmd, dir.join(format!("serve-{n}.log")))
    }

    /// When the process has aborted at a crash point: records it and starts a new process on
    /// the same database with the other points armed. Any other exit fails the test.
    fn supervise(&mut self) -> bool {
        let Ok(Some(status)) = self.serve.child.try_wait() else {
            return false;
        };
        let out = self.serve.output();
        let point = out
            .lines()
            .find_map(|l| l.strip_prefix("crash point "))
            .and_then(|l| l.split(':').next())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("serve exited ({status}) without a crash point:\n{out}"));
        assert!(!status.success(), "an abort, not a clean exit: {status}");
        assert!(
            self.armed.contains(&point.as_str()),
            "{point} fired though disarmed"
        );
        self.armed.retain(|p| *p != point);
        self.fired.push(point);
        self.starts += 1;
        self.serve = Self::spawn(self.dir.path(), &self.config, &self.armed, self.starts);
        true
    }

    /// Waits until the API answers, restarting the process as often as it crashes meanwhile.
    async fn until_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            self.supervise();
            if let Ok(r) = self.http.get(format!("{}/readyz", self.url)).send().await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("not ready within 120 s:\n{}", self.serve.output());
    }

    /// One API call, retried through crashes and restarts until it gets an answer.
    async fn call(
        &mut self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        for _ in 0..50 {
            let mut req = self
                .http
                .request(method.clone(), format!("{}{path}", self.url))
                .bearer_auth(ADMIN);
            if let Some(b) = &body {
                req = req.json(b);
            }
            match req.send().await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let v = r.json::<Value>().await.unwrap_or(Value::Null);
                    return (status, v);
                }
                Err(_) => self.until_ready().await,
            }
        }
        panic!("{method} {path} got no answer through 50 restarts");
    }

    /// Polls `f` (supervising crashes) until it says yes, for up to `secs`.
    async fn until<T>(
        &mut self,
        what: &str,
        secs: u64,
        mut f: impl AsyncFnMut(&mut Run) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            self.supervise();
            if let Some(v) = f(self).await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!(
            "timed out after {secs} s waiting for {what}; crash points fired: {:?}\n{}",
            self.fired,
            tail(&self.serve.output(), 60)
        );
    }

    /// Submits the example job `crash-{i}` of `steps` steps once, whatever crashes meanwhile
    /// (one idempotency key: a retry after a crash must not queue it twice); returns its id.
    async fn submit(&mut self, i: usize, steps: u32) -> String {
        let body = example_job(self.dir.path(), &format!("crash-{i}"), 1, steps, 30);
        let key = format!("crash-job-{i}");
        for _ in 0..50 {
            let r = self
                .http
                .post(format!("{}/v1/jobs", self.url))
                .bearer_auth(ADMIN)
                .header("Idempotency-Key", &key)
                .json(&body)
                .send()
                .await;
            match r {
                Ok(r) => {
                    let s = r.status().as_u16();
                    let v = r.json::<Value>().await.unwrap_or_default();
                    assert!(s == 201 || s == 200, "{s} {v}");
                    return v["id"].as_str().expect("job id").to_owned();
                }
                Err(_) => self.until_ready().await,
            }
        }
        panic!("job crash-{i} not submitted through 50 restarts");
    }

    /// Switches a simulated market condition (`spot-outage`, `calm`) on or off on both clouds.
    async fn market(&mut self, control: &str, on: bool) {
        for cloud in ["aws", "gcp"] {
            let (s, v) = self
                .call(
                    reqwest::Method::POST,
                    &format!("/sim/control/{cloud}/{control}?on={on}"),
                    None,
                )
                .await;
            assert_eq!(s, 200, "{v}");
        }
    }

    /// The market of the node running `job`'s first replica, if it runs.
    async fn market_of(&mut self, job: &str) -> Option<String> {
        let (_, o) = self.call(reqwest::Method::GET, "/v1/overview", None).await;
        Some(job_node(&o, job)?["market"].as_str()?.to_owned())
    }

    async fn job(&mut self, id: &str) -> Value {
        self.call(reqwest::Method::GET, &format!("/v1/jobs/{id}"), None)
            .await
            .1
    }

    /// The example workload's output of the job's last attempt.
    fn last_output(&self, job: &str) -> String {
        replica_outputs(self.dir.path(), job, 0)
            .pop()
            .map(|(_, o)| o)
            .unwrap_or_default()
    }

    async fn stop(mut self) {
        self.launcher.abort();
        let _ = (&mut self.launcher).await;
        kill_all(&self.agents);
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.launcher.abort();
        if std::thread::panicking()
            && let Ok(spare) = tempfile::tempdir()
        {
            // Its logs and databases, for the one who reads the failure.
            let kept = std::mem::replace(&mut self.dir, spare).keep();
            eprintln!("the run's folder is kept: {}", kept.display());
        }
        kill_all(&self.agents);
    }
}

/// Per node, where the ledger's lines (from the plain CSV export) and the cloud's bill part.
fn ledger_against_bills(csv: &str, bills: &[Value]) -> String {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| header.iter().position(|c| *c == name).expect(name);
    let (node, start, end, cost) = (
        col("node_id"),
        col("period_start"),
        col("period_end"),
        col("cost_usd"),
    );
    let mut by_node: BTreeMap<String, (f64, String, String)> = BTreeMap::new();
    for l in lines {
        let f: Vec<&str> = l.split(',').collect();
        let e = by_node.entry(f[node].to_owned()).or_insert((
            0.0,
            f[start].to_owned(),
            f[end].to_owned(),
        ));
        e.0 += f[cost].parse::<f64>().unwrap_or(f64::NAN);
        if f[start] < e.1.as_str() {
            e.1 = f[start].to_owned();
        }
        if f[end] > e.2.as_str() {
            e.2 = f[end].to_owned();
        }
    }
    let mut out = String::new();
    for b in bills {
        let n = b["node_id"].as_str().unwrap_or_default();
        let billed = b["cost"].as_i64().unwrap_or(0) as f64 / 1e6;
        let (cost, from, to) = by_node
            .remove(n)
            .unwrap_or((0.0, String::new(), String::new()));
        if (cost - billed).abs() > 5e-7 {
            out.push_str(&format!(
                "node {n}: billed ${billed:.6} {} .. {}, ledger ${cost:.6} {from} .. {to}\n",
                b["from"], b["to"]
            ));
        }
    }
    for (n, (cost, from, to)) in by_node {
        out.push_str(&format!(
            "node {n}: no bill, ledger ${cost:.6} {from} .. {to}\n"
        ));
    }
    out
}

async fn a_crash_at_every_step_loses_nothing(db: Db) {
    let mut run = Run::start(db).await;
    let (hook, received) = receiver().await;
    let (s, v) = run
        .call(
            reqwest::Method::POST,
            "/v1/teams",
            Some(json!({"name": "ml"})),
        )
        .await;
    assert!(s == 201 || s == 409, "{s} {v}");
    let (s, v) = run
        .call(
            reqwest::Method::POST,
            "/v1/webhooks",
            Some(json!({"url": hook, "team": "ml", "event_types": [
                "job.queued", "job.admitted", "job.running", "job.checkpointed", "job.preempted",
                "job.resumed", "job.succeeded", "job.failed"]})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let webhook = v["id"].as_str().expect("webhook id").to_owned();
    // Three one-GPU jobs with periodic checkpoints, each submitted once with an idempotency
    // key (a retry after a crash must not queue it twice).
    let mut jobs = Vec::new();
    for (i, steps) in [600u32, 700, 800].into_iter().enumerate() {
        jobs.push((run.submit(i, steps).await, u64::from(steps)));
    }
    // Once the first job runs and has checkpointed, its spot node is taken back with notice.
    let first = jobs[0].0.clone();
    let (cloud, name) = run
        .until("the first job running with a checkpoint", 240, async |r| {
            if r.job(&first).await["state"] != "running" {
                return None;
            }
            let (_, c) = r
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/jobs/{first}/checkpoints"),
                    None,
                )
                .await;
            if !has_complete_checkpoint(&c) {
                return None;
            }
            let (_, o) = r.call(reqwest::Method::GET, "/v1/overview", None).await;
            job_instance(&o, &first)
        })
        .await;
    let (s, v) = run
        .call(
            reqwest::Method::POST,
            &format!("/sim/control/{cloud}/instances/{name}/preempt"),
            None,
        )
        .await;
    assert_eq!(s, 202, "{v}");
    // Every job finishes, at its last step.
    for (job, steps) in &jobs {
        let j = run
            .until(&format!("job {job} succeeded"), 600, async |r| {
                let j = r.job(job).await;
                assert_ne!(j["state"], "failed", "{j}");
                (j["state"] == "succeeded").then_some(j)
            })
            .await;
        let out = run.last_output(job);
        assert_eq!(
            step_of(&out, "done step="),
            Some(*steps),
            "{job}: {j}\n{out}"
        );
    }
    // Consolidation: while no spot is to be had anywhere, a fourth job lands on on-demand;
    // once spot is back (a calm market: the traces' own crunches would make the move wait),
    // a cheaper replacement is bought, the on-demand node is drained (the crash point), and
    // the job resumes on the replacement and finishes.
    run.market("spot-outage", true).await;
    let moved = run.submit(3, 1200).await;
    run.until("the fourth job running on on-demand", 240, async |r| {
        if r.job(&moved).await["state"] != "running" {
            return None;
        }
        (r.market_of(&moved).await.as_deref() == Some("on-demand")).then_some(())
    })
    .await;
    run.market("calm", true).await;
    run.market("spot-outage", false).await;
    let j = run
        .until("the fourth job succeeded", 600, async |r| {
            let j = r.job(&moved).await;
            assert_ne!(j["state"], "failed", "{j}");
            (j["state"] == "succeeded").then_some(j)
        })
        .await;
    let out = run.last_output(&moved);
    assert_eq!(step_of(&out, "done step="), Some(1200), "{j}\n{out}");
    assert!(
        !run.armed.contains(&"consolidation"),
        "the on-demand node was never consolidated: {j}"
    );

    // The fleet is released when idle; then no instance runs on past the orphan grace.
    let bills = run
        .until("every instance ended", 300, async |r| {
            let mut all = Vec::new();
            for cloud in ["aws", "gcp"] {
                let (s, v) = r
                    .call(
                        reqwest::Method::GET,
                        &format!("/sim/control/{cloud}/bills"),
                        None,
                    )
                    .await;
                assert_eq!(s, 200, "{v}");
                let items = v["items"].as_array()?.clone();
                if items.iter().any(|b| b["ended"] != true) {
                    return None;
                }
                all.extend(items);
            }
            Some(all)
        })
        .await;
    // No instance bought twice, none unknown to the control plane.
    let (_, nodes) = run
        .call(reqwest::Method::GET, "/v1/nodes?limit=500", None)
        .await;
    assert_one_instance_per_node(&nodes, &bills);
    // The ledger equals the clouds' bills, once it has settled past the last instance's end.
    let billed: i64 = bills
        .iter()
        .map(|b| b["cost"].as_i64().expect("cost"))
        .sum();
    let start = |b: &Value| -> chrono::DateTime<chrono::Utc> {
        b["from"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .expect("from")
    };
    let first = bills
        .iter()
        .map(start)
        .min()
        .expect("instances were bought");
    let from =
        (first - chrono::Duration::days(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let to = (first + chrono::Duration::days(7)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut ledger = None;
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        let (s, v) = run
            .call(
                reqwest::Method::GET,
                &format!("/v1/finance/summary?from={from}&to={to}"),
                None,
            )
            .await;
        assert_eq!(s, 200, "{v}");
        ledger = v["total"]["cost_micros"].as_i64();
        if ledger == Some(billed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if ledger != Some(billed) {
        let csv = run
            .http
            .get(format!(
                "{}/v1/finance/export.csv?from={from}&to={to}",
                run.url
            ))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("export")
            .text()
            .await
            .expect("csv");
        panic!(
            "the ledger ({ledger:?} micro-dollars) is not the clouds' bills ({billed}):\n{}",
            ledger_against_bills(&csv, &bills)
        );
    }
    // Every delivery was received, and each job's events first arrived in order.
    let deliveries = run
        .until("every webhook delivered", 120, async |r| {
            let (s, v) = r
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/webhooks/{webhook}/deliveries?limit=500"),
                    None,
                )
                .await;
            assert_eq!(s, 200, "{v}");
            let items = v["items"].as_array()?.clone();
            items
                .iter()
                .all(|d| d["state"] == "delivered")
                .then_some(items)
        })
        .await;
    let got = received.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let ids: BTreeSet<&str> = got.iter().map(|(id, ..)| id.as_str()).collect();
    for d in &deliveries {
        let id = d["id"].as_str().expect("delivery id");
        assert!(ids.contains(id), "delivery {id} never received: {d}");
    }
    let mut first_seen: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for (id, event, job, _) in &got {
        if seen.insert(id) {
            first_seen.entry(job).or_default().push(*event);
        }
    }
    for (job, events) in &first_seen {
        assert!(
            events.is_sorted(),
            "job {job}'s events out of order: {events:?}"
        );
    }
    let types: BTreeSet<&str> = got.iter().map(|(.., t)| t.as_str()).collect();
    for t in ["job.preempted", "job.resumed", "job.succeeded"] {
        assert!(types.contains(t), "no {t} among {types:?}");
    }
    // Every crash point was reached, each crash survived.
    let missing: Vec<&&str> = POINTS.iter().filter(|p| run.armed.contains(p)).collect();
    assert!(
        missing.is_empty(),
        "crash points never reached: {missing:?}; fired: {:?}",
        run.fired
    );
    println!(
        "{db:?}: {} crashes survived ({:?}); {} instances, ${:.6} billed = ledger; {} deliveries, {} received",
        run.fired.len(),
        run.fired,
        bills.len(),
        billed as f64 / 1e6,
        deliveries.len(),
        got.len()
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_every_step_loses_nothing_on_sqlite() {
    a_crash_at_every_step_loses_nothing(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_every_step_loses_nothing_on_postgres() {
    a_crash_at_every_step_loses_nothing(Db::Postgres).await;
}
