//! Preemption recovery with the real processes: `spotplane serve` on SQLite and on PostgreSQL
//! with two simulated clouds on an accelerated clock (5×), a real `spotplane-agent` started for
//! every node the control plane buys (pointed at the simulator's metadata service for its
//! instance, as on a real machine), a local-folder object store, and the example workload.
//!
//! - A notice: the replica checkpoints inside the window, the job is requeued and resumes on the
//!   other cloud (the first has a spot capacity crunch) from the saved step, and finishes with
//!   the right final step; no work is lost.
//! - A node that vanishes without notice: the job resumes from its last periodic checkpoint and
//!   the lost work is recorded on the job.
//! - The control plane SIGKILLed while a node drains, then restarted: the job still finishes.
//! - A four-replica gang on four nodes loses one: the whole gang restarts, every replica from
//!   its checkpoint of the same round, and every replica finishes at the right step.
//! - The same gang, elastic: only the lost replica runs again (from its own checkpoint, a new
//!   attempt); the three survivors run on to the end without restarting.
//! - A notice with the workload in a container (agents with podman, the job with an image
//!   built locally): it checkpoints through the container and resumes elsewhere at the saved
//!   step, in a container again.
//! - An image that cannot be pulled: the start fails with the engine's reason, nothing runs on
//!   the host instead, and the job (allowed no retry) fails.
//! - Logs: followed live with `spotplane job logs -f`, still readable (by the job's team only)
//!   after the node vanished, and archived beside the checkpoints.
//! - A two-node gang forms: rank 0 of the example workload listens at the master address and
//!   port its start carried, rank 1 connects, and both print the same rendezvous. Every agent
//!   advertises an address of its own in 127.0.0.0/8 (all of it is this machine's), so the
//!   peers named are the nodes' own; the gang tests above check the rendezvous of each new
//!   attempt too.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spotplane_tests::agents::{
    Addresses, Agents, kill_agent, kill_all, launch_agents, replica_outputs, step_of,
};
use spotplane_tests::cluster::ServeConfig;
use spotplane_tests::{Db, Proc, bin, free_port, tail};

const ADMIN: &str = "e2e-recovery-admin-token-0123456789";
const SPEED: u32 = 5;

struct Cluster {
    dir: tempfile::TempDir,
    url: String,
    config: PathBuf,
    serve: Proc,
    agents: Agents,
    addresses: Addresses,
    launcher: tokio::task::JoinHandle<()>,
    http: reqwest::Client,
    restarts: u32,
}

/// The clouds sell only one-GPU machines when `one_gpu_nodes` (a gang then spans nodes).
fn config(dir: &Path, port: u16, db: Db, one_gpu_nodes: bool) -> String {
    let cluster = format!("e2e-{port}");
    ServeConfig {
        speed: SPEED,
        cluster: &cluster,
        one_gpu_nodes,
        seeds: (11, 12),
        shared_clouds: false,
        capacity: "",
        extra: "",
    }
    .toml(dir, port, &db.config(dir, "recovery", port))
}

fn serve(dir: &Path, config: &Path, n: u32) -> Proc {
    let mut cmd = Command::new(bin("spotplane"));
    cmd.current_dir(dir)
        .env("SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN", ADMIN)
        .env("SPOTPLANE_LOG__LEVEL", "info")
        .arg("--config")
        .arg(config)
        .arg("serve");
    Proc::spawn(cmd, dir.join(format!("serve-{n}.log")))
}

impl Cluster {
    /// With `containers`, the agents run images with podman; else they have no engine.
    async fn start(db: Db, one_gpu_nodes: bool, containers: bool) -> Cluster {
        let dir = tempfile::tempdir().expect("tmp");
        // Agents run replicas as users of their own (docs/agent.md, isolation).
        spotplane_tests::reachable_workload(dir.path(), &bin("spotplane-example-train"));
        let port = free_port();
        let config = dir.path().join("spotplane.toml");
        std::fs::write(&config, self::config(dir.path(), port, db, one_gpu_nodes)).expect("config");
        let url = format!("http://127.0.0.1:{port}");
        let mut serve = serve(dir.path(), &config, 0);
        serve.wait_healthy(&format!("{url}/readyz")).await;
        let agents: Agents = Arc::default();
        let engine = if containers {
            spotplane_tests::container_engine_args()
        } else {
            vec!["--container-runtime".into(), "none".into()]
        };
        let addresses: Addresses = Arc::default();
        let launcher = tokio::spawn(launch_agents(
            ADMIN,
            url.clone(),
            dir.path().to_owned(),
            agents.clone(),
            engine,
            addresses.clone(),
            port.to_be_bytes(),
        ));
        Cluster {
            dir,
            url,
            config,
            serve,
            agents,
            addresses,
            launcher,
            http: reqwest::Client::new(),
            restarts: 0,
        }
    }

    /// SIGKILL, then a new process on the same database.
    async fn kill_and_restart(&mut self) {
        self.serve.stop();
        self.restarts += 1;
        self.serve = serve(self.dir.path(), &self.config, self.restarts);
        self.serve
            .wait_healthy(&format!("{}/readyz", self.url))
            .await;
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(ADMIN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        match req.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                (status, r.json().await.unwrap_or(Value::Null))
            }
            Err(e) => (0, json!({"error": e.to_string()})),
        }
    }

    async fn job(&self, id: &str) -> Value {
        self.call(reqwest::Method::GET, &format!("/v1/jobs/{id}"), None)
            .await
            .1
    }

    /// The nodes (id, cloud, instance) the job's replicas run on now, in replica order.
    async fn placement(&self, job: &str) -> Vec<(String, String, String)> {
        self.replica_nodes(job).await.into_values().collect()
    }

    /// The replica each node runs: replica -> (node, cloud, instance).
    async fn replica_nodes(&self, job: &str) -> BTreeMap<u64, (String, String, String)> {
        let (_, o) = self.call(reqwest::Method::GET, "/v1/overview", None).await;
        let nodes = o["nodes"].as_array().cloned().unwrap_or_default();
        o["replicas"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|r| r["job_id"] == job)
            .filter_map(|r| {
                let n = nodes.iter().find(|n| n["id"] == r["node_id"])?;
                Some((
                    r["replica"].as_u64()?,
                    (
                        n["id"].as_str()?.to_owned(),
                        n["cloud"].as_str()?.to_owned(),
                        n["provider_instance_id"]
                            .as_str()?
                            .rsplit('/')
                            .next()?
                            .to_owned(),
                    ),
                ))
            })
            .collect()
    }

    /// Waits until each of the job's `replicas` has a complete checkpoint.
    async fn every_replica_checkpointed(&self, job: &str, replicas: usize) {
        self.until("a checkpoint of every replica", 90, async || {
            let (_, v) = self
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/jobs/{job}/checkpoints"),
                    None,
                )
                .await;
            let done: HashSet<u64> = v["items"]
                .as_array()?
                .iter()
                .filter(|c| c["state"] == "complete")
                .filter_map(|c| c["replica"].as_u64())
                .collect();
            (done.len() == replicas).then_some(())
        })
        .await;
    }

    async fn until<T>(&self, what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Some(v) = f().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        panic!(
            "{what}: not within {secs} s\n--- control plane ---\n{}\n--- agents ---\n{}",
            tail(&self.serve.output(), 60),
            self.agent_logs()
        );
    }

    /// Every agent's whole log.
    fn agent_logs_full(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self.dir.path().join("agents"))
            .into_iter()
            .flatten()
            .flatten()
        {
            out.push_str(&std::fs::read_to_string(e.path().join("agent.log")).unwrap_or_default());
        }
        out
    }

    fn agent_logs(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self.dir.path().join("agents"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let log = std::fs::read_to_string(e.path().join("agent.log")).unwrap_or_default();
            out.push_str(&format!(
                "[{}]\n{}\n",
                e.file_name().to_string_lossy(),
                tail(&log, 15)
            ));
        }
        out
    }

    /// Submits the example workload: `steps` steps of 50 ms, a checkpoint every `interval_s`
    /// simulated seconds.
    async fn submit(&self, name: &str, steps: u32, interval_s: u32) -> String {
        self.submit_gang(name, 1, steps, interval_s).await
    }

    async fn submit_gang(&self, name: &str, replicas: u32, steps: u32, interval_s: u32) -> String {
        self.submit_gang_as(name, replicas, steps, interval_s, false)
            .await
    }

    async fn submit_gang_as(
        &self,
        name: &str,
        replicas: u32,
        steps: u32,
        interval_s: u32,
        elastic: bool,
    ) -> String {
        let mut body = job_body(self, name, replicas, steps, interval_s, elastic);
        body["checkpoint"]["uri"] = json!(format!(
            "file://{}/objects/{name}",
            self.dir.path().display()
        ));
        self.submit_body(body).await
    }

    async fn submit_body(&self, body: Value) -> String {
        let (s, v) = self
            .call(reqwest::Method::POST, "/v1/jobs", Some(body))
            .await;
        assert_eq!(s, 201, "{v}");
        v["id"].as_str().expect("id").to_owned()
    }

    /// The example workload's output lines of every attempt of the job, oldest attempt first.
    fn outputs(&self, job: &str) -> Vec<(u32, String)> {
        self.replica_outputs(job, 0)
    }

    fn replica_outputs(&self, job: &str, replica: u32) -> Vec<(u32, String)> {
        replica_outputs(self.dir.path(), job, replica)
    }

    /// The cloud takes the instance back with its notice.
    async fn preempt(&self, cloud: &str, instance: &str) {
        let (s, v) = self
            .call(
                reqwest::Method::POST,
                &format!("/sim/control/{cloud}/instances/{instance}/preempt"),
                None,
            )
            .await;
        assert_eq!(s, 202, "{v}");
    }

    /// The instance is gone at once, without notice; its machine (agent and workload) with it.
    async fn vanish(&self, node: &str, cloud: &str, instance: &str) {
        let (s, v) = self
            .call(
                reqwest::Method::POST,
                &format!("/sim/control/{cloud}/instances/{instance}/vanish"),
                None,
            )
            .await;
        assert_eq!(s, 202, "{v}");
        kill_agent(&self.agents, node);
    }

    async fn stop(mut self) {
        self.launcher.abort();
        // Aborting only asks: a launcher busy on another worker could still start one more agent
        // after the list below is taken. Its end is awaited first.
        let _ = (&mut self.launcher).await;
        kill_all(&self.agents);
        // The containers of killed agents (a next agent of the node would remove them).
        let (_, all) = self.call(reqwest::Method::GET, "/v1/nodes", None).await;
        for n in all["items"].as_array().cloned().unwrap_or_default() {
            if let Some(id) = n["id"].as_str() {
                spotplane_tests::remove_node_containers(id);
            }
        }
    }
}

impl Drop for Cluster {
    /// A test that fails before `stop` still leaves no agent behind: a `Child` is not killed
    /// when it is dropped.
    fn drop(&mut self) {
        self.launcher.abort();
        kill_all(&self.agents);
    }
}

/// What a replica of the example workload printed when its gang formed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Formed {
    rank: u64,
    world: u64,
    node_rank: u64,
    /// `ADDR:PORT`.
    master: String,
    peers: Vec<String>,
}

/// The last `rendezvous rank=R world=N node_rank=K master=A:P peers=…` line of an output.
fn formed(output: &str) -> Option<Formed> {
    let line = output
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("rendezvous "))?;
    let fields: HashMap<&str, &str> = line
        .split_whitespace()
        .filter_map(|f| f.split_once('='))
        .collect();
    Some(Formed {
        rank: fields.get("rank")?.parse().ok()?,
        world: fields.get("world")?.parse().ok()?,
        node_rank: fields.get("node_rank")?.parse().ok()?,
        master: (*fields.get("master")?).to_owned(),
        peers: fields.get("peers")?.split(',').map(str::to_owned).collect(),
    })
}

impl Cluster {
    /// The address the agent of `node` advertises.
    fn address(&self, node: &str) -> String {
        self.addresses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .cloned()
            .unwrap_or_else(|| panic!("no agent was started for node {node}"))
    }

    /// Waits until every replica's latest attempt (`attempt` at least) printed its rendezvous;
    /// returns them by replica.
    async fn gang_formed(&self, job: &str, replicas: u32, attempt: u32) -> BTreeMap<u32, Formed> {
        self.until(
            &format!("the gang of job {job} formed (attempt {attempt})"),
            120,
            async || {
                let mut out = BTreeMap::new();
                for r in 0..replicas {
                    let outputs = self.replica_outputs(job, r);
                    let (a, text) = outputs.last()?;
                    if *a < attempt {
                        return None;
                    }
                    out.insert(r, formed(text)?);
                }
                Some(out)
            },
        )
        .await
    }

    /// The peers a gang placed as `placed` (replica -> node) must name, in rank order.
    fn peers_of(&self, placed: &BTreeMap<u64, (String, String, String)>) -> Vec<String> {
        placed.values().map(|(n, _, _)| self.address(n)).collect()
    }
}

/// Every replica formed the same gang: its own rank, the peers and master given.
fn assert_one_gang(formed: &BTreeMap<u32, Formed>, peers: &[String]) {
    let master = &formed[&0].master;
    assert!(
        master.starts_with(&format!("{}:", peers[0])),
        "rank 0's node is the master: {formed:?}"
    );
    let port: u16 = master
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port");
    assert!((29_500..31_500).contains(&port), "{port}");
    for (r, f) in formed {
        assert_eq!(u64::from(*r), f.rank, "{formed:?}");
        assert_eq!(f.world, peers.len() as u64, "{formed:?}");
        assert_eq!(&f.master, master, "replica {r}: {formed:?}");
        assert_eq!(f.peers, peers, "replica {r}: {formed:?}");
    }
}

/// The example workload as a job: `steps` steps of 50 ms, a checkpoint every `interval_s`
/// simulated seconds, to the default object store's folder for the job.
fn job_body(
    c: &Cluster,
    name: &str,
    replicas: u32,
    steps: u32,
    interval_s: u32,
    elastic: bool,
) -> Value {
    json!({
        "name": name, "team": "ml", "replicas": replicas, "elastic": elastic,
        "shape": {"gpus": 1},
        "command": [spotplane_tests::workload_path(c.dir.path())],
        "env": {"TRAIN_STEPS": steps.to_string(), "TRAIN_STEP_MS": "50", "TRAIN_WEIGHTS_BYTES": "65536"},
        "checkpoint": {"interval_s": interval_s},
    })
}

async fn setup(db: Db) -> Cluster {
    setup_with(db, false).await
}

async fn setup_with(db: Db, one_gpu_nodes: bool) -> Cluster {
    setup_full(db, one_gpu_nodes, false).await
}

async fn setup_full(db: Db, one_gpu_nodes: bool, containers: bool) -> Cluster {
    for b in ["spotplane", "spotplane-agent", "spotplane-example-train"] {
        bin(b); // built by scripts/test; says how to build it otherwise
    }
    let c = Cluster::start(db, one_gpu_nodes, containers).await;
    let (s, v) = c
        .call(
            reqwest::Method::POST,
            "/v1/teams",
            Some(json!({"name": "ml"})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    c
}

async fn running(c: &Cluster, job: &str, attempt: u64) -> Value {
    c.until(
        &format!("job {job} running (attempt {attempt})"),
        150,
        async || {
            let j = c.job(job).await;
            (j["state"] == "running" && j["attempt"].as_u64() == Some(attempt)).then_some(j)
        },
    )
    .await
}

async fn succeeded(c: &Cluster, job: &str) -> Value {
    c.until(&format!("job {job} succeeded"), 180, async || {
        let j = c.job(job).await;
        assert_ne!(j["state"], "failed", "{j}");
        (j["state"] == "succeeded").then_some(j)
    })
    .await
}

async fn a_notice_resumes_the_job_on_the_other_cloud_from_its_checkpoint(db: Db) {
    let c = setup(db).await;
    let job = c.submit("notice", 500, 3600).await;
    notice_resumes_on_the_other_cloud(c, job).await;
}

// Issue 21: the same with the workload in a container of a locally built image.
async fn a_notice_resumes_a_container_job_on_the_other_cloud_at_the_saved_step(db: Db) {
    if !spotplane_tests::podman_or_skip() {
        return;
    }
    let image = spotplane_tests::test_image(&bin("spotplane-example-train"));
    let c = setup_full(db, false, true).await;
    let mut body = job_body(&c, "container", 1, 500, 3600, false);
    body["image"] = json!(image);
    body["command"] = json!([spotplane_tests::IMAGE_WORKLOAD]);
    body["checkpoint"]["uri"] = json!(format!(
        "file://{}/objects/container",
        c.dir.path().display()
    ));
    let job = c.submit_body(body).await;
    running(&c, &job, 1).await;
    // The replica is a container of the image on its node.
    let (node, _, _) = c.placement(&job).await.first().cloned().expect("placed");
    let name = format!("spotplane-{job}-0-1");
    assert!(
        spotplane_tests::container_exists(&name),
        "{name} on {node}\n{}",
        c.agent_logs()
    );
    notice_resumes_on_the_other_cloud(c, job).await;
}

// Issue 21: a pull that fails is the start's failure, with the engine's reason.
async fn an_image_that_cannot_be_pulled_fails_the_job_with_the_engines_reason(db: Db) {
    if !spotplane_tests::podman_or_skip() {
        return;
    }
    let c = setup_full(db, false, true).await;
    let mut body = job_body(&c, "nopull", 1, 100, 3600, false);
    body["image"] = json!("localhost:1/nope:1");
    body["command"] = json!([spotplane_tests::IMAGE_WORKLOAD]);
    body["max_retries"] = json!(0);
    body.as_object_mut().expect("object").remove("checkpoint");
    let job = c.submit_body(body).await;
    let j = c
        .until(&format!("job {job} failed"), 150, async || {
            let j = c.job(&job).await;
            assert_ne!(j["state"], "succeeded", "{j}");
            (j["state"] == "failed").then_some(j)
        })
        .await;
    // The node's agent said why (the lead's start-failure event carries the same message).
    let logs = c.agent_logs_full();
    assert!(
        logs.contains("pulling localhost:1/nope:1: ") && logs.contains("connection refused"),
        "{j}\n{logs}"
    );
    // Nothing ran, in a container or on the host.
    assert!(
        c.outputs(&job).iter().all(|(_, out)| out.is_empty()),
        "{:?}",
        c.outputs(&job)
    );
    c.stop().await;
}

/// A running job's node gets a notice while a spot crunch on its cloud sends the
/// replacement to the other: it checkpoints, resumes there from the saved step and succeeds.
async fn notice_resumes_on_the_other_cloud(c: Cluster, job: String) {
    running(&c, &job, 1).await;
    // Let it make progress, then the cloud takes the node back with its notice, while a spot
    // crunch on that cloud sends the replacement elsewhere.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let first = c.placement(&job).await;
    let (node, cloud, instance) = first.first().cloned().expect("placed");
    let (s, _) = c
        .call(
            reqwest::Method::POST,
            &format!("/sim/control/{cloud}/spot-outage?on=true"),
            None,
        )
        .await;
    assert_eq!(s, 200);
    c.preempt(&cloud, &instance).await;
    running(&c, &job, 2).await;
    let now = c.placement(&job).await;
    assert!(
        now.iter().all(|(n, cl, _)| *n != node && *cl != cloud),
        "resumed on another cloud: {now:?} (was {cloud})"
    );
    let j = succeeded(&c, &job).await;
    assert_eq!(j["lost_gpu_seconds"], 0, "{j}");
    let (_, events) = c
        .call(
            reqwest::Method::GET,
            &format!("/v1/jobs/{job}/events"),
            None,
        )
        .await;
    let kinds: Vec<&str> = events["items"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["type"].as_str()).collect())
        .unwrap_or_default();
    for k in [
        "job.draining",
        "job.checkpointed",
        "job.queued",
        "job.succeeded",
    ] {
        assert!(kinds.contains(&k), "{k} in {kinds:?}");
    }
    let outputs = c.outputs(&job);
    let last = &outputs.last().expect("an attempt ran").1;
    let resumed = step_of(last, "resumed step=").expect("the last attempt resumed");
    let saved = step_of(&outputs[0].1, "checkpoint step=").expect("the first saved");
    assert_eq!(resumed, saved, "resumed from what was saved on the notice");
    assert!(resumed > 0);
    assert_eq!(step_of(last, "done step="), Some(500), "{last}");
    c.stop().await;
}

// Issue 29 D: with the default relative `file://data/objects`, a job without a checkpoint URI
// was given `file://data/objects/jobs/<id>`, which the agent refused; it never ran.
async fn a_job_without_a_checkpoint_uri_runs_under_the_relative_default_store(db: Db) {
    let c = setup(db).await;
    let mut body = job_body(&c, "default-store", 1, 60, 30, false);
    body.as_object_mut().expect("object").remove("checkpoint");
    let job = c.submit_body(body).await;
    let j = succeeded(&c, &job).await;
    assert_eq!(j["attempt"].as_u64(), Some(1), "ran once, first time: {j}");
}

async fn a_node_lost_without_notice_resumes_from_the_periodic_checkpoint(db: Db) {
    let c = setup(db).await;
    // A checkpoint every 30 simulated seconds (6 s here).
    let job = c.submit("vanish", 600, 30).await;
    running(&c, &job, 1).await;
    c.until("a periodic checkpoint", 60, async || {
        let (_, v) = c
            .call(
                reqwest::Method::GET,
                &format!("/v1/jobs/{job}/checkpoints"),
                None,
            )
            .await;
        v["items"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["state"] == "complete").cloned())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (node, cloud, instance) = c.placement(&job).await.first().cloned().expect("placed");
    c.vanish(&node, &cloud, &instance).await;
    let j = running(&c, &job, 2).await;
    assert!(
        j["lost_gpu_seconds"].as_i64().unwrap_or(0) > 0,
        "lost work recorded: {j}"
    );
    let j = succeeded(&c, &job).await;
    let outputs = c.outputs(&job);
    let last = &outputs.last().expect("an attempt ran").1;
    let resumed = step_of(last, "resumed step=").expect("resumed from the periodic checkpoint");
    assert!(resumed > 0, "{last}");
    assert_eq!(step_of(last, "done step="), Some(600), "{last}: {j}");
    c.stop().await;
}

async fn the_control_plane_killed_during_a_drain_still_finishes_the_job(db: Db) {
    let mut c = setup(db).await;
    let job = c.submit("sigkill", 400, 3600).await;
    running(&c, &job, 1).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (_, cloud, instance) = c.placement(&job).await.first().cloned().expect("placed");
    c.preempt(&cloud, &instance).await;
    c.until("the node drains", 60, async || {
        (c.job(&job).await["state"] == "draining").then_some(())
    })
    .await;
    c.kill_and_restart().await;
    // (The simulated clouds live in the control plane's process: they restart empty, so the
    // old instances are gone for them too, and the work must come back from the checkpoint.)
    let j = succeeded(&c, &job).await;
    let outputs = c.outputs(&job);
    let last = &outputs.last().expect("an attempt ran").1;
    assert_eq!(step_of(last, "done step="), Some(400), "{last}: {j}");
    // Nothing leaked: every node the control plane knows is terminated or still serving.
    let (_, nodes) = c.call(reqwest::Method::GET, "/v1/nodes", None).await;
    for n in nodes["items"].as_array().cloned().unwrap_or_default() {
        assert!(
            matches!(
                n["state"].as_str(),
                Some("terminated" | "ready" | "booting" | "terminating")
            ),
            "{n}"
        );
    }
    c.stop().await;
}

async fn a_four_replica_gang_losing_one_node_restarts_whole_from_one_round(db: Db) {
    let c = setup_with(db, true).await;
    // Four replicas on four one-GPU nodes, a checkpoint round every 30 simulated seconds.
    let job = c.submit_gang("gang", 4, 500, 30).await;
    running(&c, &job, 1).await;
    let placed = c.replica_nodes(&job).await;
    let nodes: Vec<(String, String, String)> = placed.values().cloned().collect();
    let distinct: HashSet<&String> = nodes.iter().map(|(n, _, _)| n).collect();
    assert_eq!(distinct.len(), 4, "one replica per node: {nodes:?}");
    let first = c.gang_formed(&job, 4, 1).await;
    assert_one_gang(&first, &c.peers_of(&placed));
    let node_ranks: Vec<u64> = first.values().map(|f| f.node_rank).collect();
    assert_eq!(node_ranks, [0, 1, 2, 3], "a node each");
    c.every_replica_checkpointed(&job, 4).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // One node vanishes; its machine (agent and workload) with it.
    let (node, cloud, instance) = nodes[0].clone();
    c.vanish(&node, &cloud, &instance).await;
    let j = running(&c, &job, 2).await;
    assert!(j["lost_gpu_seconds"].as_i64().unwrap_or(0) > 0, "{j}");
    // The whole gang restarted, every replica from its checkpoint of the same round.
    let resume = &j["resume_from"];
    assert_eq!(resume.as_object().map(|m| m.len()), Some(4), "{j}");
    let times: Vec<&str> = (0..4)
        .filter_map(|r| resume[r.to_string()]["completed_at"].as_str())
        .collect();
    assert_eq!(times.len(), 4, "{resume}");
    // The new attempt formed anew, with the nodes it runs on now.
    let again = c.replica_nodes(&job).await;
    let peers = c.peers_of(&again);
    assert!(
        !peers.contains(&c.address(&node)),
        "the lost node is no peer: {peers:?}"
    );
    assert_one_gang(&c.gang_formed(&job, 4, 2).await, &peers);
    succeeded(&c, &job).await;
    for r in 0..4 {
        let outputs = c.replica_outputs(&job, r);
        let last = &outputs.last().expect("ran").1;
        assert!(
            step_of(last, "resumed step=").is_some_and(|s| s > 0),
            "replica {r}: {last}"
        );
        assert_eq!(
            step_of(last, "done step="),
            Some(500),
            "replica {r}: {last}"
        );
    }
    c.stop().await;
}

async fn an_elastic_gang_losing_one_node_keeps_its_survivors(db: Db) {
    let c = setup_with(db, true).await;
    let job = c.submit_gang_as("elastic", 4, 500, 30, true).await;
    running(&c, &job, 1).await;
    let placed = c.replica_nodes(&job).await;
    assert_eq!(placed.len(), 4, "{placed:?}");
    let first = c.gang_formed(&job, 4, 1).await;
    assert_one_gang(&first, &c.peers_of(&placed));
    c.every_replica_checkpointed(&job, 4).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Replica 1's node vanishes, its agent and workload with it.
    let (node, cloud, instance) = placed[&1].clone();
    c.vanish(&node, &cloud, &instance).await;
    // It alone is placed again (a new attempt of that replica); the job never left `running`.
    let j = c
        .until("replica 1 placed again", 150, async || {
            let j = c.job(&job).await;
            assert_eq!(j["state"], "running", "{j}");
            let now = c.replica_nodes(&job).await;
            (j["attempt"] == 2 && now.get(&1).is_some_and(|(n, _, _)| *n != node)).then_some(j)
        })
        .await;
    assert!(j["lost_gpu_seconds"].as_i64().unwrap_or(0) > 0, "{j}");
    // Replica 1 joined the survivors' gang: the master they formed with, the peers as they are
    // now (its new node at rank 1); rank 0 saw it come back.
    let now = c.replica_nodes(&job).await;
    let rejoined = c
        .until("replica 1 rejoined", 120, async || {
            let outputs = c.replica_outputs(&job, 1);
            let (a, text) = outputs.last()?;
            (*a == 2).then_some(())?;
            formed(text)
        })
        .await;
    assert_eq!(rejoined.master, first[&0].master);
    assert_eq!(rejoined.peers, c.peers_of(&now));
    assert_eq!(rejoined.peers[1], c.address(&now[&1].0));
    assert_ne!(rejoined.peers[1], c.address(&node));
    c.until("rank 0 saw replica 1 rejoin", 60, async || {
        let outputs = c.replica_outputs(&job, 0);
        outputs
            .last()
            .is_some_and(|(_, text)| text.contains("peer rejoined rank=1"))
            .then_some(())
    })
    .await;
    let j = succeeded(&c, &job).await;
    for r in 0..4 {
        let outputs = c.replica_outputs(&job, r);
        let attempts: Vec<u32> = outputs.iter().map(|(a, _)| *a).collect();
        let last = &outputs.last().expect("ran").1;
        assert_eq!(
            step_of(last, "done step="),
            Some(500),
            "replica {r}: {last}"
        );
        if r == 1 {
            assert_eq!(attempts, [1, 2], "replica 1 ran twice");
            assert!(
                step_of(last, "resumed step=").is_some_and(|s| s > 0),
                "replica 1 resumed from its checkpoint: {last}"
            );
        } else {
            assert_eq!(attempts, [1], "replica {r} ran on, never restarted: {j}");
        }
    }
    c.stop().await;
}

/// A team token for `team` (created when `create`).
async fn team_token(c: &Cluster, team: &str, create: bool) -> String {
    if create {
        let (s, v) = c
            .call(
                reqwest::Method::POST,
                "/v1/teams",
                Some(json!({"name": team})),
            )
            .await;
        assert_eq!(s, 201, "{v}");
    }
    let (s, v) = c
        .call(
            reqwest::Method::POST,
            &format!("/v1/teams/{team}/tokens"),
            Some(json!({"name": "logs"})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    v["token"].as_str().expect("token").to_owned()
}

/// The lines a process prints, each with when it was read.
fn timed_lines(out: std::process::ChildStdout) -> Arc<Mutex<Vec<(Instant, String)>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let into = lines.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            into.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((Instant::now(), line));
        }
    });
    lines
}

/// Logs: `spotplane job logs -f` shows the workload's checkpoint lines within 2 s of the agent's
/// `output.log` having them; after the node vanished, the first attempt's output is still
/// readable (never by another team); the last attempt's is archived in object storage.
async fn a_followed_jobs_output_arrives_live_and_outlives_its_node(db: Db) {
    let c = setup(db).await;
    let ml = team_token(&c, "ml", false).await;
    let other = team_token(&c, "rivals", true).await;
    // A checkpoint every 30 simulated seconds (6 s here): `checkpoint step=` lines.
    let job = c.submit("logs", 600, 30).await;
    running(&c, &job, 1).await;
    let (node, cloud, instance) = c.placement(&job).await.first().cloned().expect("placed");
    let file = c
        .dir
        .path()
        .join("agents")
        .join(&node)
        .join("jobs")
        .join(&job)
        .join("replica-0/attempt-1/output.log");
    let mut follow = Command::new(bin("spotplane"))
        .args(["job", "logs", &job, "-f"])
        .env("SPOTPLANE_URL", &c.url)
        .env("SPOTPLANE_TOKEN", &ml)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spotplane job logs starts");
    let seen = timed_lines(follow.stdout.take().expect("stdout"));
    // When each checkpoint line first appears in the agent's file, and in the follower.
    let mut in_file: BTreeMap<String, Instant> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    let lag = loop {
        assert!(
            Instant::now() < deadline,
            "no checkpoint lines followed: file {in_file:?}, follower {:?}",
            seen.lock().unwrap_or_else(|p| p.into_inner())
        );
        let now = Instant::now();
        for l in std::fs::read_to_string(&file).unwrap_or_default().lines() {
            if l.starts_with("checkpoint step=") {
                in_file.entry(l.to_owned()).or_insert(now);
            }
        }
        let followed: Vec<(Instant, String)> =
            seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let lags: Vec<Duration> = in_file
            .iter()
            .filter_map(|(l, at)| {
                let (got, _) = followed.iter().find(|(_, f)| f == l)?;
                Some(got.saturating_duration_since(*at))
            })
            .collect();
        if lags.len() >= 2 {
            break lags;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for l in &lag {
        assert!(
            *l < Duration::from_secs(2),
            "followed {l:?} after the file: {lag:?}"
        );
    }
    // The node vanishes, agent and workload with it: the follower ends with the attempt.
    c.vanish(&node, &cloud, &instance).await;
    let ended = c
        .until("the follower ends with the attempt", 90, async || {
            follow.try_wait().ok().flatten()
        })
        .await;
    assert!(ended.success(), "{ended}");
    // The first attempt's output is the control plane's: readable with the node gone.
    let read = |token: String| {
        let url = format!("{}/v1/jobs/{job}/logs?attempt=1", c.url);
        async move {
            let r = reqwest::Client::new()
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .expect("sent");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        }
    };
    let (s, text) = read(ml.clone()).await;
    assert_eq!(s, 200);
    for l in in_file.keys() {
        assert!(text.lines().any(|t| t == l), "{l} in {text}");
    }
    let (s, text) = read(other).await;
    assert_eq!(s, 404, "{text}");
    assert!(!text.contains("step="), "{text}");
    // The attempt that finished archived its output beside its checkpoints.
    succeeded(&c, &job).await;
    let archived = c
        .dir
        .path()
        .join("objects/logs/logs/replica-0/attempt-2/0.log");
    let done = c
        .until("the last attempt's log archived", 60, async || {
            std::fs::read_to_string(&archived)
                .ok()
                .filter(|t| t.contains("done step=600"))
        })
        .await;
    assert!(done.contains("resumed step="), "{done}");
    c.stop().await;
}

async fn a_two_node_gang_forms_through_the_rendezvous_of_its_starts(db: Db) {
    let c = setup_with(db, true).await;
    let job = c.submit_gang("pair", 2, 200, 3600).await;
    running(&c, &job, 1).await;
    let placed = c.replica_nodes(&job).await;
    assert_eq!(placed.len(), 2, "{placed:?}");
    assert_ne!(placed[&0].0, placed[&1].0, "two nodes: {placed:?}");
    let gang = c.gang_formed(&job, 2, 1).await;
    let peers = c.peers_of(&placed);
    assert_one_gang(&gang, &peers);
    assert_eq!(
        gang.values().map(|f| f.node_rank).collect::<Vec<_>>(),
        [0, 1]
    );
    assert_ne!(peers[0], peers[1], "each node its own address");
    // Rank 0 really heard from rank 1.
    let lead = &c.replica_outputs(&job, 0)[0].1;
    assert!(lead.contains("peer joined rank=1 from="), "{lead}");
    succeeded(&c, &job).await;
    for r in 0..2 {
        let outputs = c.replica_outputs(&job, r);
        let text = &outputs.last().expect("ran").1;
        assert_eq!(
            step_of(text, "done step="),
            Some(200),
            "replica {r}: {text}"
        );
    }
    c.stop().await;
}

macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name(super::Db::Sqlite).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    super::$name(super::Db::Postgres).await
                }
            }
        )*
    };
}

on_both_databases!(
    a_notice_resumes_the_job_on_the_other_cloud_from_its_checkpoint,
    a_notice_resumes_a_container_job_on_the_other_cloud_at_the_saved_step,
    an_image_that_cannot_be_pulled_fails_the_job_with_the_engines_reason,
    a_job_without_a_checkpoint_uri_runs_under_the_relative_default_store,
    a_node_lost_without_notice_resumes_from_the_periodic_checkpoint,
    the_control_plane_killed_during_a_drain_still_finishes_the_job,
    a_four_replica_gang_losing_one_node_restarts_whole_from_one_round,
    an_elastic_gang_losing_one_node_keeps_its_survivors,
    a_followed_jobs_output_arrives_live_and_outlives_its_node,
    a_two_node_gang_forms_through_the_rendezvous_of_its_starts,
);
