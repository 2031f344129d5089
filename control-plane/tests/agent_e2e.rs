//! The real `spotplane-agent` binary against this control plane, on SQLite and PostgreSQL:
//! bootstrap exchange, telemetry-less heartbeats (no driver here), a job started by command,
//! a termination notice from an AWS metadata stub, the checkpoint uploaded to a local store
//! and recorded, the node draining; a team secret reaching a replica's environment and nothing
//! else.
//!
//! The agent and the example workload are found next to this test's executable
//! (`target/<profile>/`, where `cargo build --workspace --bins` and `scripts/test` put them);
//! without them the test says so and passes, unless `SPOTPLANE_TEST_REQUIRE_EMULATORS` is set.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, put};
use common::{ADMIN_TOKEN, Backend, TestServer};
use reqwest::Method;
use serde_json::{Value, json};
use spotplane::scheduler::{Assigned, Placement};
use spotplane::store::{NewGpu, NewNode};
use spotplane_core::{Cloud, GpuModel, JobId, Market, Micros, MigLayout, NodeId};

on_both_databases!(
    the_agent_binary_registers_runs_a_job_and_checkpoints_it_on_a_notice,
    a_team_secret_reaches_its_replicas_environment_and_no_record_or_log,
);

fn binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join(name);
    if path.exists() {
        return Some(path);
    }
    if std::env::var_os("SPOTPLANE_TEST_REQUIRE_EMULATORS").is_some() {
        panic!(
            "{} is not built; run `cargo build --workspace --bins` first",
            path.display()
        );
    }
    eprintln!(
        "skipped: {} is not built (cargo build --workspace --bins)",
        path.display()
    );
    None
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn imds(action: Arc<Mutex<Option<String>>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = Router::new()
        .route("/latest/api/token", put(|| async { "tok" }))
        .route("/latest/meta-data/instance-id", get(|| async { "i-0e2e" }))
        .route(
            "/latest/meta-data/spot/instance-action",
            get(move |h: HeaderMap| {
                let a = action.clone();
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
        );
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}")
}

async fn until<T>(what: &str, log: &Path, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..600 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "timed out waiting until {what}; agent log:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

async fn the_agent_binary_registers_runs_a_job_and_checkpoints_it_on_a_notice(backend: Backend) {
    let (Some(agent_bin), Some(example)) =
        (binary("spotplane-agent"), binary("spotplane-example-train"))
    else {
        return;
    };
    let srv = TestServer::start(backend).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let example = spotplane_tests::reachable_workload(tmp.path(), &example);
    let n = common::stored_node(
        "e2e-1",
        "g5.xlarge",
        "0.41",
        (4_000, 16_384),
        common::a10g(),
    );
    let node = n.id;
    srv.store()
        .create_node(n, chrono::Utc::now())
        .await
        .expect("node");
    let (_, v) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{node}/bootstrap-token"),
            Some(ADMIN_TOKEN),
            Some(&json!({})),
        )
        .await;
    let token_file = tmp.path().join("bootstrap-token");
    std::fs::write(&token_file, v["token"].as_str().expect("token")).expect("write");

    let action: Arc<Mutex<Option<String>>> = Arc::default();
    let imds_url = imds(action.clone()).await;
    let log = tmp.path().join("agent.log");
    let out = std::fs::File::create(&log).expect("log");
    let err = out.try_clone().expect("log");
    let child = Command::new(&agent_bin)
        .args(["run", "--control-plane", &srv.url, "--cloud", "aws"])
        .arg("--bootstrap-token-file")
        .arg(&token_file)
        .args(["--metadata-url", &imds_url])
        .arg("--work-dir")
        .arg(tmp.path().join("work"))
        .args(spotplane_tests::agent_isolation_args())
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .expect("agent starts");
    let pid = child.id();
    let _agent = Agent(child);

    let node_state = |srv: &TestServer| {
        let srv_url = srv.url.clone();
        let http = srv.http.clone();
        async move {
            let v: Value = http
                .get(format!("{srv_url}/v1/nodes"))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            v["items"]
                .as_array()?
                .iter()
                .find(|n| n["id"] == json!(node))
                .cloned()
        }
    };
    until("the node is ready", &log, async || {
        node_state(&srv).await.filter(|n| n["state"] == "ready")
    })
    .await;
    let status = until("a heartbeat arrives", &log, async || {
        let (s, v) = srv
            .call(
                Method::GET,
                &format!("/v1/nodes/{node}/agent"),
                Some(ADMIN_TOKEN),
                None,
            )
            .await;
        (s == StatusCode::OK && v["heartbeats"].as_u64().unwrap_or(0) >= 1).then_some(v)
    })
    .await;
    assert_eq!(status["instance_id"], "i-0e2e");
    let agent_log = std::fs::read_to_string(&log).unwrap_or_default();
    if std::path::Path::new("/proc/driver/nvidia/version").exists() {
        // On a GPU machine (scripts/gpu-check runs this test there): NVML's readings reach
        // the control plane under DCGM's names.
        let gpus = status["telemetry"].as_array().cloned().unwrap_or_default();
        assert!(!gpus.is_empty(), "a driver is loaded: {status}");
        for g in &gpus {
            assert!(
                g["DCGM_FI_DEV_FB_TOTAL"].as_u64().unwrap_or(0) > 0,
                "framebuffer size reported: {g}"
            );
            assert!(
                g["uuid"].as_str().is_some_and(|u| u.starts_with("GPU-")),
                "{g}"
            );
        }
        assert_eq!(
            agent_log.matches("no NVIDIA driver").count(),
            0,
            "{agent_log}"
        );
    } else {
        assert_eq!(
            status["telemetry"],
            json!([]),
            "no driver here: no GPU data"
        );
        assert_eq!(
            agent_log.matches("no NVIDIA driver").count(),
            1,
            "said once:\n{agent_log}"
        );
    }

    // A job placed on the node, started by command.
    srv.team_with_token("alpha").await;
    let store_uri = format!("{}/bucket/alpha", srv.db.config.object_store.url);
    let (_, j) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(ADMIN_TOKEN),
            Some(
                &json!({"name": "train", "team": "alpha", "shape": {"gpus": 1}, "command": ["x"],
                    "checkpoint": {"uri": store_uri}}),
            ),
        )
        .await;
    let job: JobId = j["id"].as_str().and_then(|s| s.parse().ok()).expect("job");
    srv.store()
        .admit_job(
            job,
            &[Placement {
                replica: 0,
                node,
                assigned: Assigned::Whole(vec![0]),
            }],
            chrono::Utc::now(),
        )
        .await
        .expect("admitted");
    let (s, cmd) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{node}/commands"),
            Some(ADMIN_TOKEN),
            Some(
                &json!({"type": "start", "job_id": job, "replica": 0, "attempt": 0,
                "command": [example], "env": {"TRAIN_STEP_MS": "10"}, "devices": ["0"],
                "checkpoint_uri": store_uri}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{cmd}");
    until("the replica runs", &log, async || {
        let (_, v) = srv
            .call(
                Method::GET,
                &format!("/v1/nodes/{node}/agent"),
                Some(ADMIN_TOKEN),
                None,
            )
            .await;
        (v["replicas"][0]["phase"] == "running").then_some(())
    })
    .await;
    let idle_rss = rss_kib(pid);

    // The two-minute warning.
    let deadline = chrono::Utc::now() + chrono::Duration::seconds(120);
    *action.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!(
        r#"{{"action": "terminate", "time": "{}"}}"#,
        deadline.format("%Y-%m-%dT%H:%M:%SZ")
    ));
    let ckpt = until("a durable checkpoint is recorded", &log, async || {
        let (_, v) = srv
            .call(
                Method::GET,
                &format!("/v1/jobs/{job}/checkpoints"),
                Some(ADMIN_TOKEN),
                None,
            )
            .await;
        v["items"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["state"] == "complete").cloned())
    })
    .await;
    assert_eq!(ckpt["trigger"], "notice");
    assert_eq!(ckpt["node_id"], json!(node));
    let uri = ckpt["uri"].as_str().expect("uri");
    let manifest = Path::new(uri.strip_prefix("file://").expect("a local URI"));
    assert!(manifest.exists(), "the manifest is in the store: {uri}");
    let n = until("the node drains", &log, async || {
        node_state(&srv).await.filter(|n| n["state"] == "draining")
    })
    .await;
    assert!(n["notice_deadline"].is_string(), "{n}");
    eprintln!("agent RSS with one replica running: {idle_rss} KiB");
    srv.stop().await;
}

/// The agent against the simulated clouds' metadata services this server serves
/// (`/sim/metadata/{cloud}/{instance}`): each cloud's notice reaches the control plane, and on
/// Azure the agent lets the eviction start at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_hears_each_simulated_clouds_notice_through_its_metadata_service() {
    use spotplane_providers::{CloudProvider, ProvisionRequest};
    let Some(agent_bin) = binary("spotplane-agent") else {
        return;
    };
    let srv = TestServer::start(Backend::Sqlite).await;
    for (cloud, source) in [
        (Cloud::Aws, "aws-instance-action"),
        (Cloud::Gcp, "gcp-preempted"),
        (Cloud::Azure, "azure-scheduled-event"),
    ] {
        let sim = srv
            .server
            .providers
            .sims
            .iter()
            .find(|s| s.config().flavour == cloud)
            .expect("a simulated cloud of each flavour")
            .clone();
        // The first spot pool with capacity now (the traces decide).
        let node = NodeId(uuid::Uuid::now_v7());
        let mut provisioned = None;
        for offer in sim
            .list_offers()
            .await
            .expect("offers")
            .into_iter()
            .filter(|o| o.market == Market::Spot)
        {
            let req = ProvisionRequest {
                node_id: node,
                offer: offer.clone(),
                client_token: format!("e2e-{node}"),
                tags: Default::default(),
                user_data: None,
            };
            if let Ok(inst) = sim.provision(&req).await {
                provisioned = Some((offer, inst));
                break;
            }
        }
        let (offer, inst) = provisioned.expect("some spot pool has capacity");
        let name = inst
            .provider_id
            .rsplit('/')
            .next()
            .expect("name")
            .to_owned();
        srv.store()
            .create_node(
                NewNode {
                    id: node,
                    name: name.clone(),
                    cloud,
                    region: offer.region.to_string(),
                    zone: offer.zone.to_string(),
                    instance_type: offer.instance_type.to_string(),
                    market: Market::Spot,
                    offer_id: None,
                    client_token: format!("e2e-{node}"),
                    hourly_price: offer.price,
                    on_demand_price: offer.on_demand_price,
                    cpu_milli: 8_000,
                    memory_mib: 65_536,
                    gpus: Vec::new(),
                    labels: Default::default(),
                },
                chrono::Utc::now(),
            )
            .await
            .expect("node");
        let tmp = tempfile::tempdir().expect("tmp");
        std::fs::set_permissions(
            tmp.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )
        .expect("chmod");
        let (_, v) = srv
            .call(
                Method::POST,
                &format!("/v1/nodes/{node}/bootstrap-token"),
                Some(ADMIN_TOKEN),
                Some(&json!({})),
            )
            .await;
        let token_file = tmp.path().join("bootstrap-token");
        std::fs::write(&token_file, v["token"].as_str().expect("token")).expect("write");
        let log = tmp.path().join("agent.log");
        let out = std::fs::File::create(&log).expect("log");
        let err = out.try_clone().expect("log");
        let child = Command::new(&agent_bin)
            .args([
                "run",
                "--control-plane",
                &srv.url,
                "--cloud",
                cloud.as_str(),
            ])
            .arg("--bootstrap-token-file")
            .arg(&token_file)
            .args([
                "--metadata-url",
                &format!("{}/sim/metadata/{cloud}/{name}", srv.url),
            ])
            .arg("--work-dir")
            .arg(tmp.path().join("work"))
            .args(spotplane_tests::agent_isolation_args())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("agent starts");
        let _agent = Agent(child);
        let status = until("the agent heartbeats", &log, async || {
            let (s, v) = srv
                .call(
                    Method::GET,
                    &format!("/v1/nodes/{node}/agent"),
                    Some(ADMIN_TOKEN),
                    None,
                )
                .await;
            (s == StatusCode::OK && v["heartbeats"].as_u64().unwrap_or(0) >= 1).then_some(v)
        })
        .await;
        assert_eq!(
            status["instance_id"],
            json!(name),
            "{cloud}: read from the metadata service"
        );
        sim.preempt_now(&inst.provider_id);
        let status = until("the notice reaches the control plane", &log, async || {
            let (_, v) = srv
                .call(
                    Method::GET,
                    &format!("/v1/nodes/{node}/agent"),
                    Some(ADMIN_TOKEN),
                    None,
                )
                .await;
            v["notice"].is_object().then_some(v)
        })
        .await;
        assert_eq!(status["notice"]["source"], source, "{cloud}");
        assert!(
            status["notice"]["deadline"].is_string(),
            "{cloud}: {status}"
        );
        let (_, nodes) = srv
            .call(Method::GET, "/v1/nodes", Some(ADMIN_TOKEN), None)
            .await;
        let n = nodes["items"]
            .as_array()
            .and_then(|a| a.iter().find(|n| n["id"] == json!(node)).cloned())
            .expect("listed");
        assert_eq!(n["state"], "draining", "{cloud}: {n}");
        if cloud == Cloud::Azure {
            // Nothing to checkpoint: the agent acknowledges the event and the VM goes now.
            until("the eviction is let go early", &log, async || {
                sim.instance_by_name(&name)
                    .and_then(|i| i.terminated_at)
                    .filter(|t| *t <= sim.now())
            })
            .await;
        }
    }
    srv.stop().await;
}

/// Issue 29's break-in, rerun: team A's and team B's jobs on one node with the real agent.
/// B's job tries to read the agent's credential and A's secret from `/proc/*/environ`, and
/// to look into A's folders; each fails. With the credential taken anyway (read here as
/// root), a "durable" checkpoint of A's job pointing at B's storage is refused, so A's next
/// attempt cannot be made to resume from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_teams_job_cannot_take_over_a_node_it_shares_with_another() {
    if !spotplane_tests::is_root() {
        eprintln!("skipped: needs root, to run the jobs as users of their own (CI runs as root)");
        return;
    }
    let Some(agent_bin) = binary("spotplane-agent") else {
        return;
    };
    let srv = TestServer::start(Backend::Sqlite).await;
    let tmp = tempfile::tempdir().expect("tmp");
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .expect("chmod");
    let work = tmp.path().join("work");
    let node = NodeId(uuid::Uuid::now_v7());
    let gpu = |_| NewGpu {
        model: GpuModel::A10G,
        memory_mib: 23_028,
        mig_enabled: false,
        mig_layout: MigLayout::empty(),
    };
    srv.store()
        .create_node(
            NewNode {
                id: node,
                name: "shared-1".into(),
                cloud: Cloud::Aws,
                region: "us-east-1".into(),
                zone: "us-east-1a".into(),
                instance_type: "g5.12xlarge".into(),
                market: Market::Spot,
                offer_id: None,
                client_token: "ct-shared".into(),
                hourly_price: Micros::parse_usd("1.2").expect("price"),
                on_demand_price: Micros::parse_usd("5.6").expect("price"),
                cpu_milli: 48_000,
                memory_mib: 196_608,
                gpus: (0..2).map(gpu).collect(),
                labels: Default::default(),
            },
            chrono::Utc::now(),
        )
        .await
        .expect("node");
    let (_, v) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{node}/bootstrap-token"),
            Some(ADMIN_TOKEN),
            Some(&json!({})),
        )
        .await;
    let token_file = tmp.path().join("bootstrap-token");
    std::fs::write(&token_file, v["token"].as_str().expect("token")).expect("write");
    let imds_url = imds(Arc::default()).await;
    let log = tmp.path().join("agent.log");
    let out = std::fs::File::create(&log).expect("log");
    let err = out.try_clone().expect("log");
    let child = Command::new(&agent_bin)
        .args(["run", "--control-plane", &srv.url, "--cloud", "aws"])
        .arg("--bootstrap-token-file")
        .arg(&token_file)
        .args(["--metadata-url", &imds_url])
        .arg("--work-dir")
        .arg(&work)
        .args(spotplane_tests::agent_isolation_args())
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .expect("agent starts");
    let _agent = Agent(child);
    until("the agent registers", &log, async || {
        work.join("credential.json").exists().then_some(())
    })
    .await;

    // Team A's job holds a secret in its environment; team B's job goes looking.
    let secret = format!("a-secret-{}", uuid::Uuid::now_v7().simple());
    let a_store = format!("{}/bucket/team-a", srv.db.config.object_store.url);
    let b_store = format!("{}/bucket/team-b", srv.db.config.object_store.url);
    let mut jobs = Vec::new();
    for (team, store) in [("team-a", &a_store), ("team-b", &b_store)] {
        srv.team_with_token(team).await;
        let (s, j) = srv
            .call(
                Method::POST,
                "/v1/jobs",
                Some(ADMIN_TOKEN),
                Some(
                    &json!({"name": team, "team": team, "shape": {"gpus": 1}, "command": ["x"],
                    "checkpoint": {"uri": store}}),
                ),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{j}");
        let job: JobId = j["id"].as_str().and_then(|s| s.parse().ok()).expect("job");
        let replica_gpu = u32::try_from(jobs.len()).expect("small");
        srv.store()
            .admit_job(
                job,
                &[Placement {
                    replica: 0,
                    node,
                    assigned: Assigned::Whole(vec![replica_gpu]),
                }],
                chrono::Utc::now(),
            )
            .await
            .expect("admitted");
        jobs.push(job);
    }
    let (job_a, job_b) = (jobs[0], jobs[1]);
    let a_attempt = work.join(format!("jobs/{job_a}/replica-0/attempt-1"));
    let probe = format!(
        r#"W={work}; A={a}
        echo "uid=$(id -u)"
        cat "$W/credential.json" > /dev/null 2>&1 && echo STOLE-CREDENTIAL
        for f in /proc/[0-9]*/environ; do {{ tr '\0' '\n' < "$f"; }} 2> /dev/null; done | grep -q "^TEAM_A_SECRET=" && echo STOLE-SECRET
        ls "$W/jobs" > /dev/null 2>&1 && echo LISTED-JOBS
        cat "$A/output.log" > /dev/null 2>&1 && echo READ-A-LOG
        ls "$A/checkpoint" > /dev/null 2>&1 && echo LISTED-A-CHECKPOINT
        ls "$A/home" > /dev/null 2>&1 && echo LISTED-A-HOME
        kill -0 $(pgrep -f "^a-sleeper") 2> /dev/null && echo CAN-SIGNAL-A
        echo probe-done; exec sleep 600"#,
        work = work.display(),
        a = a_attempt.display(),
    );
    let starts = [
        (
            job_a,
            &a_store,
            json!(["bash", "-c", "exec -a a-sleeper sleep 600"]),
            json!({"TEAM_A_SECRET": secret}),
            "0",
        ),
        (
            job_b,
            &b_store,
            json!(["bash", "-c", probe]),
            json!({}),
            "1",
        ),
    ];
    for (job, store, command, env, device) in starts {
        let (s, cmd) = srv
            .call(
                Method::POST,
                &format!("/v1/nodes/{node}/commands"),
                Some(ADMIN_TOKEN),
                Some(
                    &json!({"type": "start", "job_id": job, "replica": 0, "attempt": 1,
                    "command": command, "env": env, "devices": [device], "checkpoint_uri": store}),
                ),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{cmd}");
        if job == job_a {
            until("A's job runs", &log, async || {
                let (_, v) = srv
                    .call(
                        Method::GET,
                        &format!("/v1/nodes/{node}/agent"),
                        Some(ADMIN_TOKEN),
                        None,
                    )
                    .await;
                v["replicas"]
                    .as_array()
                    .and_then(|r| r.iter().find(|r| r["job_id"] == json!(job_a)))
                    .filter(|r| r["phase"] == "running")
                    .map(|_| ())
            })
            .await;
        }
    }
    let b_log = work.join(format!("jobs/{job_b}/replica-0/attempt-1/output.log"));
    let seen = until("B's probe is over", &log, async || {
        std::fs::read_to_string(&b_log)
            .ok()
            .filter(|l| l.contains("probe-done"))
    })
    .await;
    let uid_line = seen.lines().next().unwrap_or_default();
    assert!(
        uid_line.starts_with("uid=") && uid_line != "uid=0",
        "B runs as a user of its own: {seen}"
    );
    assert_eq!(
        seen.lines().skip(1).collect::<Vec<_>>(),
        ["probe-done"],
        "B got at nothing: {seen}"
    );

    // The credential, taken all the same: a "durable" checkpoint of A's job in B's storage.
    let cred: Value =
        serde_json::from_slice(&std::fs::read(work.join("credential.json")).expect("credential"))
            .expect("json");
    let cred = cred["credential"].as_str().expect("credential").to_owned();
    let c = uuid::Uuid::now_v7();
    let at = chrono::Utc::now();
    let forged = json!({"job_id": job_a, "replica": 0, "attempt": 1, "checkpoint_id": c,
        "uri": format!("{b_store}/replica-0/{c}/manifest.json"),
        "trigger": "notice", "outcome": "durable", "started_at": at, "finished_at": at,
        "manifest": {"job_id": job_a, "replica": 0, "checkpoint_id": c, "attempt": 1,
            "created_at": at, "total_bytes": 0, "files": []}});
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/checkpoints",
            Some(&cred),
            Some(&forged),
        )
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("uri")),
        "{v}"
    );
    assert!(
        srv.store()
            .latest_durable_checkpoint(job_a, 0)
            .await
            .expect("query")
            .is_none(),
        "A has no resume point in B's storage"
    );
    srv.stop().await;
}

/// Everything this test process logs (the control plane runs in it), at debug level.
#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    /// Installs the capture as this process's subscriber (nextest runs each test in a process
    /// of its own).
    fn install() -> CapturedLogs {
        let logs = CapturedLogs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("no subscriber yet");
        logs
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

/// A webhook endpoint that keeps every body it is sent.
async fn webhook_receiver() -> (String, Arc<Mutex<Vec<String>>>) {
    let bodies: Arc<Mutex<Vec<String>>> = Arc::default();
    let kept = bodies.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = Router::new().route(
        "/hook",
        axum::routing::post(move |body: String| {
            let kept = kept.clone();
            async move {
                kept.lock().unwrap_or_else(|p| p.into_inner()).push(body);
                StatusCode::NO_CONTENT
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (format!("http://{addr}/hook"), bodies)
}

/// Every file under `dir`, with its path, as (lossy) text.
fn files_under(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                todo.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                out.push((p, String::from_utf8_lossy(&bytes).into_owned()));
            }
        }
    }
    out
}

/// The output log of the newest attempt of a job's replica 0 on this agent.
fn replica_output(work: &Path, job: JobId) -> Option<String> {
    let mut attempts: Vec<PathBuf> = std::fs::read_dir(work.join(format!("jobs/{job}/replica-0")))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .collect();
    attempts.sort();
    std::fs::read_to_string(attempts.last()?.join("output.log")).ok()
}

/// The whole path with the real agent, the scheduler and the recovery loop: a team secret
/// named by a job reaches its replica's environment (the example workload prints its hash),
/// while its value is in none of the job's read model, its events, the webhook deliveries, the
/// agent's command rows, the control plane's log (at debug level), the agent's log or any file
/// of the agent's. A second job whose secret is deleted before it starts fails its start,
/// naming the secret.
async fn a_team_secret_reaches_its_replicas_environment_and_no_record_or_log(backend: Backend) {
    use sha2::Digest;
    let (Some(agent_bin), Some(example)) =
        (binary("spotplane-agent"), binary("spotplane-example-train"))
    else {
        return;
    };
    let logs = CapturedLogs::install();
    let srv = TestServer::start_with(backend, |c| {
        c.scheduler.enabled = true;
        c.scheduler.interval = Duration::from_millis(200);
        c.recovery.enabled = true;
        c.capacity.enabled = false;
        c.providers.clear();
        c.webhooks.enabled = true;
        c.webhooks.allow_private = true;
        c.webhooks.interval = Duration::from_millis(100);
    })
    .await;
    let tmp = tempfile::tempdir().expect("tmp");
    let example = spotplane_tests::reachable_workload(tmp.path(), &example);
    let work = tmp.path().join("work");
    let n = common::stored_node(
        "secrets-1",
        "g5.xlarge",
        "0.41",
        (4_000, 16_384),
        common::a10g(),
    );
    let node = n.id;
    srv.store()
        .create_node(n, chrono::Utc::now())
        .await
        .expect("node");
    let (_, v) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{node}/bootstrap-token"),
            Some(ADMIN_TOKEN),
            Some(&json!({})),
        )
        .await;
    let token_file = tmp.path().join("bootstrap-token");
    std::fs::write(&token_file, v["token"].as_str().expect("token")).expect("write");
    let imds_url = imds(Arc::default()).await;
    let log = tmp.path().join("agent.log");
    let out = std::fs::File::create(&log).expect("log");
    let err = out.try_clone().expect("log");
    let child = Command::new(&agent_bin)
        .args(["run", "--control-plane", &srv.url, "--cloud", "aws"])
        .arg("--bootstrap-token-file")
        .arg(&token_file)
        .args(["--metadata-url", &imds_url])
        .arg("--work-dir")
        .arg(&work)
        .args(spotplane_tests::agent_isolation_args())
        .env("RUST_LOG", "debug")
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .expect("agent starts");
    let _agent = Agent(child);

    let alpha = srv.team_with_token("alpha").await;
    let (hook, bodies) = webhook_receiver().await;
    let (s, sub) = srv
        .call(
            Method::POST,
            "/v1/webhooks",
            Some(&alpha),
            Some(
                &json!({"url": hook, "event_types": ["job.queued", "job.admitted",
                "job.running", "job.cancelled", "job.failed", "job.succeeded"]}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{sub}");
    let secret = format!("hf_{}", uuid::Uuid::now_v7().simple());
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/teams/alpha/secrets",
            Some(&alpha),
            Some(&json!({"name": "hf-token", "value": secret})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    let submit = |name: &'static str| {
        let srv = &srv;
        let alpha = alpha.clone();
        let example = example.clone();
        async move {
            let (s, j) = srv
                .call(
                    Method::POST,
                    "/v1/jobs",
                    Some(&alpha),
                    Some(
                        &json!({"name": name, "shape": {"gpus": 1}, "command": [example],
                        "env": {"TRAIN_STEP_MS": "50", "TRAIN_PRINT_SHA256_OF": "HF_TOKEN"},
                        "secrets": {"HF_TOKEN": "hf-token"}}),
                    ),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED, "{j}");
            j["id"]
                .as_str()
                .and_then(|s| s.parse::<JobId>().ok())
                .expect("job id")
        }
    };
    let first = submit("first").await;
    let printed = until("the replica prints its secret's hash", &log, async || {
        replica_output(&work, first).filter(|o| o.contains("secret "))
    })
    .await;
    let hash = hex::encode(sha2::Sha256::digest(secret.as_bytes()));
    assert!(
        printed
            .lines()
            .any(|l| l == format!("secret sha256={hash}")),
        "the replica has HF_TOKEN set to the secret's value:\n{printed}"
    );
    let job_state = |job: JobId| {
        let srv = &srv;
        async move {
            let (_, v) = srv
                .call(
                    Method::GET,
                    &format!("/v1/jobs/{job}"),
                    Some(ADMIN_TOKEN),
                    None,
                )
                .await;
            v
        }
    };
    until("the first job runs", &log, async || {
        (job_state(first).await["state"] == "running").then_some(())
    })
    .await;

    // A second job waits for the node's one GPU; its secret is deleted before it gets it.
    let second = submit("second").await;
    let (s, _) = srv
        .call(
            Method::DELETE,
            "/v1/teams/alpha/secrets/hf-token",
            Some(&alpha),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v) = srv
        .call(
            Method::POST,
            &format!("/v1/jobs/{first}/cancel"),
            Some(&alpha),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let commands = |srv: &TestServer| {
        let srv_url = srv.url.clone();
        let http = srv.http.clone();
        async move {
            let v: Value = http
                .get(format!("{srv_url}/v1/nodes/{node}/commands?limit=500"))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            Some(v)
        }
    };
    let failed = until("the second job's start fails", &log, async || {
        commands(&srv).await?["items"]
            .as_array()?
            .iter()
            .find(|c| {
                c["command"]["type"] == "start"
                    && c["command"]["job_id"] == json!(second)
                    && c["result"]["ok"] == json!(false)
            })
            .cloned()
    })
    .await;
    let message = failed["result"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("fetching the job's secrets")
            && message.contains("secrets.HF_TOKEN (hf-token)"),
        "{failed}"
    );
    until("the job events reach the webhook", &log, async || {
        let b = bodies.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let running = b.iter().any(|b| b.contains("job.running"));
        let cancelled = b.iter().any(|b| b.contains("job.cancelled"));
        (running && cancelled).then_some(())
    })
    .await;

    // Where the value must not be.
    let mut places: Vec<(String, String)> = Vec::new();
    for job in [first, second] {
        places.push((
            format!("GET /v1/jobs/{job}"),
            job_state(job).await.to_string(),
        ));
        let (_, events) = srv
            .call(
                Method::GET,
                &format!("/v1/jobs/{job}/events?limit=500"),
                Some(ADMIN_TOKEN),
                None,
            )
            .await;
        places.push((format!("the events of {job}"), events.to_string()));
    }
    let cmds = commands(&srv).await.expect("commands");
    let start = cmds["items"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|c| c["command"]["type"] == "start" && c["command"]["job_id"] == json!(first))
        })
        .expect("the first job's start");
    assert_eq!(
        start["command"]["secrets"], true,
        "the agent was told to fetch: {start}"
    );
    places.push(("the agent_commands rows".into(), cmds.to_string()));
    let sub_id = sub["id"].as_str().expect("subscription id");
    let (_, deliveries) = srv
        .call(
            Method::GET,
            &format!("/v1/webhooks/{sub_id}/deliveries?limit=500"),
            Some(&alpha),
            None,
        )
        .await;
    places.push(("the delivery log".into(), deliveries.to_string()));
    for (i, b) in bodies
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .enumerate()
    {
        places.push((format!("webhook body {i}"), b.clone()));
    }
    let cp_log = logs.text();
    assert!(
        cp_log.contains("handed a job's secrets to its node"),
        "the control plane's log was captured"
    );
    places.push(("the control plane's log".into(), cp_log));
    places.push((
        "the agent's log".into(),
        std::fs::read_to_string(&log).unwrap_or_default(),
    ));
    for (path, text) in files_under(&work) {
        places.push((path.display().to_string(), text));
    }
    for (place, text) in &places {
        assert!(!text.contains(&secret), "the secret's value is in {place}");
    }
    srv.stop().await;
}
