//! The real `spotplane-agent` binary against this control plane, on SQLite and PostgreSQL:
//! bootstrap exchange, telemetry-less heartbeats (no driver here), a job started by command,
//! a termination notice from an AWS metadata stub, the checkpoint uploaded to a local store
//! and recorded, the node draining.
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

on_both_databases!(the_agent_binary_registers_runs_a_job_and_checkpoints_it_on_a_notice);

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
    let node = NodeId(uuid::Uuid::now_v7());
    srv.store()
        .create_node(
            NewNode {
                id: node,
                name: "e2e-1".into(),
                cloud: Cloud::Aws,
                region: "us-east-1".into(),
                zone: "us-east-1a".into(),
                instance_type: "g5.xlarge".into(),
                market: Market::Spot,
                offer_id: None,
                client_token: "ct-e2e".into(),
                hourly_price: Micros::parse_usd("0.41").expect("price"),
                on_demand_price: Micros::parse_usd("1.0").expect("price"),
                cpu_milli: 4_000,
                memory_mib: 16_384,
                gpus: vec![NewGpu {
                    model: GpuModel::A10G,
                    memory_mib: 23_028,
                    mig_enabled: false,
                    mig_layout: MigLayout::empty(),
                }],
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
    let (_, j) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(ADMIN_TOKEN),
            Some(
                &json!({"name": "train", "team": "alpha", "shape": {"gpus": 1}, "command": ["x"]}),
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
    let store_uri = format!("file://{}/bucket/jobs/{job}", tmp.path().display());
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
