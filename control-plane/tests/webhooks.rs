//! Webhooks end to end: a real server and database, deliveries made by the delivery loop
//! (driven explicitly, on a manual clock where timing matters), received by a Python receiver
//! that verifies every signature with the `standardwebhooks` package, and by in-process
//! receivers for failure patterns.
//!
//! The Python receiver runs from the venv `scripts/test` prepares ($SPOTPLANE_TEST_PYTHON, or
//! `$SPOTPLANE_TEST_VENV/bin/python`, or `~/.cache/spotplane/venv/bin/python`). Without it the
//! tests that need it skip, unless `SPOTPLANE_TEST_REQUIRE_EMULATORS` is set: then they fail.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::StatusCode as AxumStatus;
use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use spotplane::clock::{Clock, ManualClock, SharedClock, SystemClock};
use spotplane::config::WebhookSettings;
use spotplane::reconcile::webhooks::WebhookLoop;
use spotplane::webhooks::sender::{Message, Sender};
use tokio::sync::Mutex;

use common::{ADMIN_TOKEN, Backend, TestServer};

fn python() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("SPOTPLANE_TEST_PYTHON").map(PathBuf::from),
        std::env::var_os("SPOTPLANE_TEST_VENV").map(|v| PathBuf::from(v).join("bin/python")),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/spotplane/venv/bin/python")),
    ];
    let found = candidates.into_iter().flatten().find(|p| {
        Command::new(p)
            .args(["-c", "import standardwebhooks"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("SPOTPLANE_TEST_REQUIRE_EMULATORS").is_none(),
            "no Python with standardwebhooks, but emulators are required (scripts/test installs it)"
        );
        eprintln!(
            "skipped: no Python with the standardwebhooks package (scripts/test installs it)"
        );
    }
    found
}

/// The Python receiver, stopped by its PID when dropped.
struct Receiver {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Receiver {
    fn start(extra: &[&str]) -> Option<Receiver> {
        let py = python()?;
        let dir = tempfile::tempdir().expect("tempdir");
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/webhook_receiver.py");
        let mut child = Command::new(py)
            .arg(script)
            .arg("--secrets")
            .arg(dir.path().join("secrets"))
            .arg("--log")
            .arg(dir.path().join("log.jsonl"))
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("the receiver starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the receiver prints its port");
        let port = line.trim().parse().expect("a port");
        Some(Receiver { child, port, dir })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks/spotplane", self.port)
    }

    fn set_secrets(&self, secrets: &[&str]) {
        std::fs::write(self.dir.path().join("secrets"), secrets.join("\n")).expect("write secrets");
    }

    fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("log.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON record"))
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // Child::kill signals this child's PID only.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Loopback receivers need private targets allowed.
async fn server(backend: Backend) -> TestServer {
    TestServer::start_with(backend, |c| c.webhooks.allow_private = true).await
}

fn delivery_loop(
    ts: &TestServer,
    clock: SharedClock,
    tweak: impl FnOnce(&mut WebhookSettings),
) -> WebhookLoop {
    let mut s = ts.db.config.webhooks.clone();
    tweak(&mut s);
    let sender = Arc::new(Sender::new(&s).expect("client"));
    let key = ts
        .server
        .state
        .secrets_key()
        .expect("a secrets key")
        .clone();
    WebhookLoop::new(ts.store().clone(), clock, sender, s, key)
}

async fn subscribe(ts: &TestServer, token: &str, url: &str, types: &[&str]) -> (String, String) {
    let (s, v) = ts
        .call(
            Method::POST,
            "/v1/webhooks",
            Some(token),
            Some(&json!({"url": url, "event_types": types})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    (
        v["id"].as_str().expect("id").to_owned(),
        v["secret"].as_str().expect("secret").to_owned(),
    )
}

async fn submit(ts: &TestServer, token: &str, name: &str) -> String {
    let (s, v) = ts
        .call(
            Method::POST,
            "/v1/jobs",
            Some(token),
            Some(&json!({"name": name, "shape": {"gpus": 1}, "command": ["train"]})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v["id"].as_str().expect("id").to_owned()
}

async fn cancel(ts: &TestServer, token: &str, job: &str) {
    let (s, v) = ts
        .call(
            Method::POST,
            &format!("/v1/jobs/{job}/cancel"),
            Some(token),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

async fn log_of(ts: &TestServer, token: &str, sub: &str) -> Vec<Value> {
    let (s, v) = ts
        .call(
            Method::GET,
            &format!("/v1/webhooks/{sub}/deliveries"),
            Some(token),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v["items"].as_array().cloned().unwrap_or_default()
}

async fn a_python_receiver_verifies_every_signature_including_during_rotation(backend: Backend) {
    let ts = server(backend).await;
    let Some(rx) = Receiver::start(&[]) else {
        ts.stop().await;
        return;
    };
    let team = ts.team_with_token("ml").await;
    let (sub, s1) = subscribe(&ts, &team, &rx.url(), &["job.queued", "job.cancelled"]).await;
    assert!(s1.starts_with("whsec_"));
    rx.set_secrets(&[&s1]);
    let wl = delivery_loop(&ts, Arc::new(SystemClock), |_| {});

    let job = submit(&ts, &team, "first").await;
    cancel(&ts, &team, &job).await;
    let r = wl.run_once().await.expect("cycle");
    assert_eq!((r.attempted, r.delivered), (2, 2), "{r:?}");
    let recs = rx.records();
    assert_eq!(recs.len(), 2);
    for (rec, want) in recs.iter().zip(["job.queued", "job.cancelled"]) {
        assert_eq!(rec["verified"], json!([0]), "{rec}");
        assert_eq!(rec["body"]["type"], want);
        assert_eq!(rec["body"]["data"]["job"]["id"], job.as_str());
    }

    // Rotation with an overlap: both signatures, each secret verifies on its own.
    let (s, v) = ts
        .call(
            Method::POST,
            &format!("/v1/webhooks/{sub}/rotate-secret"),
            Some(&team),
            Some(&json!({"overlap_s": 3600})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let s2 = v["secret"].as_str().expect("secret").to_owned();
    assert_ne!(s1, s2);
    assert!(v["previous_secret_until"].is_string());
    rx.set_secrets(&[&s1, &s2]);
    let job2 = submit(&ts, &team, "second").await;
    wl.run_once().await.expect("cycle");
    let rec = rx.records().pop().expect("a record");
    assert_eq!(rec["body"]["data"]["job"]["id"], job2.as_str());
    assert_eq!(rec["signatures"], 2);
    assert_eq!(rec["verified"], json!([0, 1]), "{rec}");

    // Rotation without overlap: the old secret stops at once.
    let (_, v) = ts
        .call(
            Method::POST,
            &format!("/v1/webhooks/{sub}/rotate-secret"),
            Some(&team),
            Some(&json!({"overlap_s": 0})),
        )
        .await;
    let s3 = v["secret"].as_str().expect("secret").to_owned();
    rx.set_secrets(&[&s2, &s3]);
    submit(&ts, &team, "third").await;
    wl.run_once().await.expect("cycle");
    let rec = rx.records().pop().expect("a record");
    assert_eq!(rec["signatures"], 1);
    assert_eq!(rec["verified"], json!([1]), "{rec}");

    // The test ping, signed the same way.
    let (s, v) = ts
        .call(
            Method::POST,
            &format!("/v1/webhooks/{sub}/ping"),
            Some(&team),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["delivered"], true, "{v}");
    assert_eq!(v["status"], 204);
    let rec = rx.records().pop().expect("a record");
    assert_eq!(rec["body"]["type"], "webhook.ping");
    assert_eq!(rec["verified"], json!([1]));

    let log = log_of(&ts, &team, &sub).await;
    assert_eq!(log.len(), 5);
    for d in &log {
        assert_eq!(d["state"], "delivered", "{d}");
        assert_eq!(d["attempts"], 1);
        assert_eq!(d["last_status"], 204);
        assert!(d["latency_ms"].is_i64());
    }
    // Every request the receiver saw verified.
    assert!(rx.records().iter().all(|r| r["answered"] == 204));
    drop(rx);
    ts.stop().await;
}

async fn failures_are_retried_with_backoff_and_a_restart_loses_nothing(backend: Backend) {
    let ts = server(backend).await;
    let Some(rx) = Receiver::start(&["--fail-first", "2"]) else {
        ts.stop().await;
        return;
    };
    let team = ts.team_with_token("ml").await;
    let (sub, secret) = subscribe(&ts, &team, &rx.url(), &["job.queued"]).await;
    rx.set_secrets(&[&secret]);
    submit(&ts, &team, "retried").await;
    let clock = ManualClock::new(SystemClock.now());
    let wl = delivery_loop(&ts, Arc::new(clock.clone()), |_| {});

    let r = wl.run_once().await.expect("cycle");
    assert_eq!((r.attempted, r.failed), (1, 1));
    let d = &log_of(&ts, &team, &sub).await[0];
    assert_eq!(
        (d["state"].as_str(), d["attempts"].as_u64()),
        (Some("pending"), Some(1))
    );
    assert_eq!(d["last_status"], 500);
    let next: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(d["next_attempt_at"].clone()).expect("a time");
    let wait = next - clock.now();
    assert!(
        wait >= chrono::Duration::seconds(4) && wait <= chrono::Duration::seconds(6),
        "first retry after about 5 s: {wait}"
    );
    // Not due yet: nothing is sent.
    assert_eq!(wl.run_once().await.expect("cycle").attempted, 0);
    clock.advance(chrono::Duration::seconds(6));
    assert_eq!(wl.run_once().await.expect("cycle").failed, 1);

    // The control plane restarts in the middle of the retries.
    let db = ts.stop_keeping_data().await;
    let ts = TestServer::start_on(db).await;
    let wl = delivery_loop(&ts, Arc::new(clock.clone()), |_| {});
    clock.advance(chrono::Duration::seconds(5));
    assert_eq!(
        wl.run_once().await.expect("cycle").attempted,
        0,
        "the backoff doubled"
    );
    clock.advance(chrono::Duration::seconds(8));
    let r = wl.run_once().await.expect("cycle");
    assert_eq!(r.delivered, 1, "{r:?}");

    let recs = rx.records();
    assert_eq!(recs.len(), 3);
    assert!(
        recs.iter().all(|r| r["id"] == recs[0]["id"]),
        "one webhook-id across retries"
    );
    assert!(recs.iter().all(|r| r["verified"] == json!([0])));
    assert_eq!(recs[2]["answered"], 204);
    let d = &log_of(&ts, &team, &sub).await[0];
    assert_eq!(
        (d["state"].as_str(), d["attempts"].as_u64()),
        (Some("delivered"), Some(3))
    );
    drop(rx);
    ts.stop().await;
}

async fn a_slow_receiver_fails_the_attempt_at_the_timeout(backend: Backend) {
    let ts = server(backend).await;
    let Some(rx) = Receiver::start(&["--slow", "3"]) else {
        ts.stop().await;
        return;
    };
    let team = ts.team_with_token("ml").await;
    let (sub, secret) = subscribe(&ts, &team, &rx.url(), &["job.queued"]).await;
    rx.set_secrets(&[&secret]);
    submit(&ts, &team, "slow").await;
    let wl = delivery_loop(&ts, Arc::new(SystemClock), |s| {
        s.timeout = Duration::from_millis(300);
    });
    let r = wl.run_once().await.expect("cycle");
    assert_eq!(r.failed, 1);
    let d = &log_of(&ts, &team, &sub).await[0];
    assert_eq!(d["state"], "pending");
    assert_eq!(d["last_error"], "timed out");
    let ms = d["latency_ms"].as_i64().expect("latency");
    assert!((300..2000).contains(&ms), "{ms} ms");
    drop(rx);
    ts.stop().await;
}

/// An in-process receiver: answers 500 while `failing` and to the first `fail_first`
/// requests, else 204; records bodies.
#[derive(Clone, Default)]
struct Local {
    failing: Arc<AtomicBool>,
    fail_first: Arc<AtomicUsize>,
    /// Only requests about the job of this name count towards `fail_first`.
    fail_only: Arc<Mutex<Option<String>>>,
    bodies: Arc<Mutex<Vec<(u16, Value)>>>,
}

impl Local {
    async fn start(&self) -> String {
        let me = self.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |body: axum::body::Bytes| {
                let me = me.clone();
                async move {
                    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let targeted = me
                        .fail_only
                        .lock()
                        .await
                        .as_ref()
                        .is_none_or(|name| v["data"]["job"]["name"] == name.as_str());
                    let first = targeted
                        && me
                            .fail_first
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok();
                    let status = if first || me.failing.load(Ordering::SeqCst) {
                        AxumStatus::INTERNAL_SERVER_ERROR
                    } else {
                        AxumStatus::NO_CONTENT
                    };
                    me.bodies.lock().await.push((status.as_u16(), v));
                    status
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
        format!("http://{addr}/hook")
    }
}

async fn an_endpoint_failing_for_the_whole_period_is_disabled_and_the_team_told(backend: Backend) {
    let ts = server(backend).await;
    let team = ts.team_with_token("ml").await;
    let broken = Local::default();
    broken.failing.store(true, Ordering::SeqCst);
    let told = Local::default();
    let (sub, _) = subscribe(&ts, &team, &broken.start().await, &["job.queued"]).await;
    let (_, _) = subscribe(&ts, &team, &told.start().await, &["webhook.disabled"]).await;
    submit(&ts, &team, "unlucky").await;
    let clock = ManualClock::new(SystemClock.now());
    let wl = delivery_loop(&ts, Arc::new(clock.clone()), |s| {
        s.retry_base = Duration::from_secs(60);
        s.retry_max = Duration::from_secs(600);
        s.retry_for = Duration::from_secs(4 * 3600);
        s.disable_after = Duration::from_secs(3600);
    });
    let mut disabled = false;
    for _ in 0..30 {
        wl.run_once().await.expect("cycle");
        let (_, v) = ts
            .call(
                Method::GET,
                &format!("/v1/webhooks/{sub}"),
                Some(&team),
                None,
            )
            .await;
        if v["enabled"] == false {
            assert!(
                v["disabled_reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("HTTP 500")),
                "{v}"
            );
            disabled = true;
            break;
        }
        clock.advance(chrono::Duration::minutes(10));
    }
    assert!(disabled, "disabled after an hour of failures");
    let attempts_when_disabled = broken.bodies.lock().await.len();
    assert!(attempts_when_disabled >= 5, "{attempts_when_disabled}");
    // The team hears of it; the disabled endpoint gets nothing more.
    clock.advance(chrono::Duration::minutes(30));
    wl.run_once().await.expect("cycle");
    let heard = told.bodies.lock().await.clone();
    assert_eq!(heard.len(), 1);
    assert_eq!(heard[0].1["type"], "webhook.disabled");
    assert_eq!(heard[0].1["data"]["webhook"]["id"], sub.as_str());
    assert_eq!(broken.bodies.lock().await.len(), attempts_when_disabled);
    // Enabled again (and fixed), its waiting delivery goes out.
    broken.failing.store(false, Ordering::SeqCst);
    let (s, v) = ts
        .call(
            Method::PATCH,
            &format!("/v1/webhooks/{sub}"),
            Some(&team),
            Some(&json!({"enabled": true})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["failing_since"], Value::Null);
    assert_eq!(wl.run_once().await.expect("cycle").delivered, 1);
    let log = log_of(&ts, &team, &sub).await;
    assert_eq!(log[0]["state"], "delivered");
    ts.stop().await;
}

async fn a_jobs_events_go_out_in_order_while_other_jobs_proceed(backend: Backend) {
    let ts = server(backend).await;
    let team = ts.team_with_token("ml").await;
    let rx = Local::default();
    rx.fail_first.store(1, Ordering::SeqCst);
    *rx.fail_only.lock().await = Some("a".into());
    subscribe(
        &ts,
        &team,
        &rx.start().await,
        &["job.queued", "job.cancelled"],
    )
    .await;
    let a = submit(&ts, &team, "a").await;
    let b = submit(&ts, &team, "b").await;
    cancel(&ts, &team, &a).await;
    let clock = ManualClock::new(SystemClock.now());
    let wl = delivery_loop(&ts, Arc::new(clock.clone()), |_| {});
    for _ in 0..4 {
        wl.run_once().await.expect("cycle");
        clock.advance(chrono::Duration::seconds(10));
    }
    let seen: Vec<(u16, String, String)> = rx
        .bodies
        .lock()
        .await
        .iter()
        .map(|(s, v)| {
            (
                *s,
                v["data"]["job"]["id"].as_str().unwrap_or("").to_owned(),
                v["type"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let of = |job: &str| -> Vec<(u16, String)> {
        seen.iter()
            .filter(|s| s.1 == job)
            .map(|s| (s.0, s.2.clone()))
            .collect()
    };
    assert_eq!(
        of(&a),
        [
            (500, "job.queued".to_owned()),
            (204, "job.queued".to_owned()),
            (204, "job.cancelled".to_owned())
        ]
    );
    assert_eq!(of(&b), [(204, "job.queued".to_owned())]);
    // b went out while a's first event was still being retried.
    let pos = |job: &str, status: u16| seen.iter().position(|s| s.1 == job && s.0 == status);
    assert!(pos(&b, 204) < pos(&a, 204), "{seen:?}");
    ts.stop().await;
}

async fn a_node_notice_reaches_the_teams_with_work_on_the_node(backend: Backend) {
    use spotplane::scheduler::{Assigned, Placement};
    use spotplane::store::{NewGpu, NewNode};
    use spotplane_core::{Cloud, GpuModel, JobState, Market, Micros, MigLayout, NodeId, NodeState};

    let ts = server(backend).await;
    let team = ts.team_with_token("ml").await;
    let bystander = ts.team_with_token("cv").await;
    let rx = Local::default();
    let others = Local::default();
    subscribe(
        &ts,
        &team,
        &rx.start().await,
        &["node.notice", "job.preempted"],
    )
    .await;
    subscribe(&ts, &bystander, &others.start().await, &["node.notice"]).await;
    let now = SystemClock.now();
    let node = NodeId(uuid::Uuid::now_v7());
    let store = ts.store();
    store
        .create_node(
            NewNode {
                id: node,
                name: "n".into(),
                cloud: Cloud::Aws,
                region: "us-east-1".into(),
                zone: "use1-az1".into(),
                instance_type: "p3.2xlarge".into(),
                market: Market::Spot,
                offer_id: None,
                client_token: node.to_string(),
                hourly_price: Micros::from_dollars(1),
                on_demand_price: Micros::from_dollars(3),
                cpu_milli: 8000,
                memory_mib: 65536,
                gpus: vec![NewGpu {
                    model: GpuModel::V100_16GB,
                    memory_mib: 16384,
                    mig_enabled: false,
                    mig_layout: MigLayout::empty(),
                }],
                labels: Default::default(),
            },
            now,
        )
        .await
        .expect("node");
    store
        .transition_node(node, NodeState::Ready, None, now)
        .await
        .expect("ready");
    let job = submit(&ts, &team, "on-spot").await;
    let job_id = job.parse().expect("job id");
    store
        .admit_job(
            job_id,
            &[Placement {
                replica: 0,
                node,
                assigned: Assigned::Whole(vec![0]),
            }],
            now,
        )
        .await
        .expect("admitted");
    for to in [JobState::Starting, JobState::Running, JobState::Draining] {
        store
            .transition_job(job_id, None, None, to, None, now)
            .await
            .expect("moves");
    }
    store
        .transition_node(
            node,
            NodeState::Draining,
            Some("spot interruption notice".into()),
            now,
        )
        .await
        .expect("notice");
    let wl = delivery_loop(&ts, Arc::new(SystemClock), |_| {});
    wl.run_once().await.expect("cycle");
    let got: Vec<String> = rx
        .bodies
        .lock()
        .await
        .iter()
        .map(|(_, v)| v["type"].as_str().unwrap_or("").to_owned())
        .collect();
    // Order is promised per job, not between a job's and a node's events: compare as a set.
    let mut got = got;
    got.sort();
    assert_eq!(got, ["job.preempted", "node.notice"]);
    assert!(
        others.bodies.lock().await.is_empty(),
        "cv had no work on the node"
    );
    ts.stop().await;
}

async fn targets_and_event_types_are_validated_and_teams_see_their_own(backend: Backend) {
    let ts = TestServer::start(backend).await;
    let team = ts.team_with_token("ml").await;
    let other = ts.team_with_token("other").await;
    let cases = [
        (
            json!({"url": "http://127.0.0.1:9/x", "event_types": ["job.queued"]}),
            "url",
        ),
        (
            json!({"url": "http://localhost/x", "event_types": ["job.queued"]}),
            "url",
        ),
        (
            json!({"url": "http://169.254.169.254/latest", "event_types": ["job.queued"]}),
            "url",
        ),
        (
            json!({"url": "https://u:p@8.8.8.8/x", "event_types": ["job.queued"]}),
            "url",
        ),
        (
            json!({"url": "ftp://8.8.8.8/x", "event_types": ["job.queued"]}),
            "url",
        ),
        (
            json!({"url": "http://8.8.8.8/x", "event_types": ["job.queued", "job.exploded"]}),
            "event_types[1]",
        ),
        (
            json!({"url": "http://8.8.8.8/x", "event_types": []}),
            "event_types",
        ),
        (
            json!({"url": "http://8.8.8.8/x", "event_types": ["job.queued"], "secret": "x"}),
            "secret",
        ),
    ];
    for (body, field) in cases {
        let (s, v) = ts
            .call(Method::POST, "/v1/webhooks", Some(&team), Some(&body))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
        assert_eq!(v["field"], field, "{body}: {v}");
    }
    let (sub, secret) = subscribe(
        &ts,
        &team,
        "http://8.8.8.8/hook",
        &["job.succeeded", "node.notice"],
    )
    .await;
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .expect("base64");
    assert!(raw.len() >= 24);
    // Another team's subscription is not found; finance tokens have no business here.
    let (s, _) = ts
        .call(
            Method::GET,
            &format!("/v1/webhooks/{sub}"),
            Some(&other),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, v) = ts
        .call(Method::GET, "/v1/webhooks", Some(&other), None)
        .await;
    assert_eq!(
        (s, v["items"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(0))
    );
    let (s, v) = ts
        .call(
            Method::POST,
            "/v1/tokens",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "fin", "role": "finance"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let fin = v["token"].as_str().expect("token").to_owned();
    let (s, _) = ts.call(Method::GET, "/v1/webhooks", Some(&fin), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, v) = ts
        .call(
            Method::POST,
            "/v1/webhooks",
            Some(ADMIN_TOKEN),
            Some(&json!({"url": "http://8.8.8.8/x", "event_types": ["job.queued"]})),
        )
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("team"))
    );
    let (s, v) = ts
        .call(Method::GET, "/v1/webhooks", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(
        (s, v["items"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(1))
    );
    let (s, v) = ts
        .call(
            Method::GET,
            &format!("/v1/webhooks/{sub}/deliveries?limit=0"),
            Some(&team),
            None,
        )
        .await;
    // The paging rule of every list (docs/api.md).
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("limit"))
    );
    let (s, _) = ts
        .call(
            Method::DELETE,
            &format!("/v1/webhooks/{sub}"),
            Some(&team),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    ts.stop().await;
}

/// A receiver slower than the timeout: the attempt fails at the timeout, in virtual time (no
/// real waiting: tokio's clock is paused and jumps to the timeout).
#[tokio::test(start_paused = true)]
async fn a_receiver_slower_than_the_timeout_fails_at_the_timeout_in_virtual_time() {
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(|| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            AxumStatus::NO_CONTENT
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let settings = WebhookSettings {
        allow_private: true,
        timeout: Duration::from_secs(10),
        ..WebhookSettings::default()
    };
    let sender = Sender::new(&settings).expect("client");
    let url = format!("http://{addr}/hook");
    let started = tokio::time::Instant::now();
    let out = sender
        .send(&Message {
            url: &url,
            id: "msg_1",
            timestamp: 1,
            signature: "v1,x",
            body: b"{}",
        })
        .await;
    assert_eq!(out.error.as_deref(), Some("timed out"));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
        "{waited:?}"
    );
}

/// With private targets refused, an attempt to a loopback literal fails without connecting.
#[tokio::test]
async fn a_refused_target_is_refused_at_send_time_too() {
    let sender = Sender::new(&WebhookSettings::default()).expect("client");
    for url in ["http://127.0.0.1:9/x", "http://localhost:9/x"] {
        let out = sender
            .send(&Message {
                url,
                id: "m",
                timestamp: 1,
                signature: "v1,x",
                body: b"{}",
            })
            .await;
        let e = out.error.expect("refused");
        assert!(
            e.contains("refused") || e.contains("loopback"),
            "{url}: {e}"
        );
    }
}

/// An endpoint answering a body of up to 1 GiB, in 64 KiB chunks, as fast as it is read:
/// `/ok` with 200, `/fail` with 500. It counts the bytes it has handed to the connection, and
/// notes when the client has let the body go.
#[derive(Clone, Default)]
struct Endless {
    produced: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

/// Notes that a response body was dropped (read to its end or abandoned).
struct DropNote(Arc<AtomicUsize>);

impl Drop for DropNote {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

const ENDLESS_CHUNK: usize = 64 * 1024;
const ENDLESS_CHUNKS: usize = 16 * 1024;

impl Endless {
    async fn start(&self) -> String {
        let answer = |me: Endless, status: AxumStatus| {
            let chunk = bytes_of(vec![b'x'; ENDLESS_CHUNK]);
            let note = DropNote(me.dropped.clone());
            let body = futures::stream::iter(0..ENDLESS_CHUNKS).map(move |_| {
                let _ = &note;
                me.produced.fetch_add(ENDLESS_CHUNK, Ordering::SeqCst);
                Ok::<_, std::io::Error>(chunk.clone())
            });
            (status, axum::body::Body::from_stream(body))
        };
        let (ok, fail) = (self.clone(), self.clone());
        let app = axum::Router::new()
            .route(
                "/ok",
                axum::routing::post(move || {
                    let me = ok.clone();
                    async move { answer(me, AxumStatus::OK) }
                }),
            )
            .route(
                "/fail",
                axum::routing::post(move || {
                    let me = fail.clone();
                    async move { answer(me, AxumStatus::INTERNAL_SERVER_ERROR) }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        format!("http://{addr}")
    }

    /// Waits (up to 10 s) until `n` bodies have been let go; then what was produced.
    async fn produced_once_dropped(&self, n: usize) -> usize {
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            while self.dropped.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "the client let the endless body go");
        self.produced.load(Ordering::SeqCst)
    }
}

fn bytes_of(v: Vec<u8>) -> axum::body::Bytes {
    axum::body::Bytes::from(v)
}

/// Far less than the 1 GiB on offer; room for the kernel's socket buffers and hyper's.
const READ_AT_MOST: usize = 64 * 1024 * 1024;

/// One attempt against an endless answer reads a few KiB and lets the rest go: the sender's
/// memory does not grow with the answer, and the outcome keeps the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_is_read_only_a_few_kib() {
    use spotplane::webhooks::sender::{MAX_ERROR_EXCERPT_CHARS, MAX_RESPONSE_BYTES};
    let endless = Endless::default();
    let base = endless.start().await;
    let settings = WebhookSettings {
        allow_private: true,
        ..WebhookSettings::default()
    };
    let sender = Sender::new(&settings).expect("client");
    let send = |url: String| {
        let sender = sender.clone();
        async move {
            sender
                .send(&Message {
                    url: &url,
                    id: "msg_1",
                    timestamp: 1,
                    signature: "v1,x",
                    body: b"{}",
                })
                .await
        }
    };
    let failed = send(format!("{base}/fail")).await;
    let produced = endless.produced_once_dropped(1).await;
    assert!(
        (MAX_RESPONSE_BYTES..READ_AT_MOST).contains(&produced),
        "{produced} bytes left the endpoint of {} on offer",
        ENDLESS_CHUNK * ENDLESS_CHUNKS
    );
    assert_eq!(failed.status, Some(500));
    let error = failed.error.expect("a 500 fails");
    let excerpt = error
        .strip_prefix("HTTP 500 Internal Server Error: ")
        .expect(&error);
    assert!(excerpt.chars().all(|c| c == 'x'), "{excerpt}");
    assert_eq!(excerpt.len(), MAX_ERROR_EXCERPT_CHARS);

    let ok = send(format!("{base}/ok")).await;
    assert_eq!((ok.status, ok.error.as_deref()), (Some(200), None));
    let produced = endless.produced_once_dropped(2).await;
    assert!(produced < 2 * READ_AT_MOST, "{produced} bytes");
}

/// Through the API: a ping to an endless answer is recorded with its status and a short
/// excerpt, and the server answers at once.
async fn a_ping_to_an_endless_answer_is_recorded_with_its_status(backend: Backend) {
    use spotplane::webhooks::sender::MAX_ERROR_EXCERPT_CHARS;
    let ts = server(backend).await;
    let team = ts.team_with_token("ml").await;
    let endless = Endless::default();
    let base = endless.start().await;
    for (path, status, delivered, n) in [("/fail", 500, false, 1), ("/ok", 200, true, 2)] {
        let (sub, _) = subscribe(&ts, &team, &format!("{base}{path}"), &["job.queued"]).await;
        let (s, v) = ts
            .call(
                Method::POST,
                &format!("/v1/webhooks/{sub}/ping"),
                Some(&team),
                None,
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let produced = endless.produced_once_dropped(n).await;
        assert!(produced < n * READ_AT_MOST, "{produced} bytes");
        assert_eq!(
            (v["status"].as_u64(), v["delivered"].as_bool()),
            (Some(status), Some(delivered)),
            "{v}"
        );
        let log = log_of(&ts, &team, &sub).await;
        assert_eq!(log.len(), 1);
        let d = &log[0];
        assert_eq!(d["last_status"], status, "{d}");
        assert_eq!(d["state"], if delivered { "delivered" } else { "failed" });
        match d["last_error"].as_str() {
            Some(e) => {
                assert!(!delivered, "{d}");
                assert!(e.starts_with("HTTP 500 Internal Server Error: xxx"), "{e}");
                assert!(e.len() <= MAX_ERROR_EXCERPT_CHARS + 40, "{} bytes", e.len());
            }
            None => assert!(delivered, "{d}"),
        }
    }
    ts.stop().await;
}

/// A team pinging faster than `webhooks.pings_per_minute` is answered 429, problem+json with
/// `Retry-After`, and nothing is sent or recorded; other teams are not held up, and another
/// team's (or no) endpoint is still not found rather than limited.
async fn pings_beyond_the_teams_rate_are_refused_with_retry_after(backend: Backend) {
    let ts = TestServer::start_with(backend, |c| {
        c.webhooks.allow_private = true;
        c.webhooks.pings_per_minute = 2;
    })
    .await;
    let ml = ts.team_with_token("ml").await;
    let vision = ts.team_with_token("vision").await;
    let rx = Local::default();
    let url = rx.start().await;
    let (sub, _) = subscribe(&ts, &ml, &url, &["job.queued"]).await;
    let (other, _) = subscribe(&ts, &vision, &url, &["job.queued"]).await;
    let ping = |token: String, sub: String| {
        let ts = &ts;
        async move {
            ts.send(
                Method::POST,
                &format!("/v1/webhooks/{sub}/ping"),
                Some(&token),
                None,
                &[],
            )
            .await
        }
    };
    for _ in 0..2 {
        let (s, _, v) = ping(ml.clone(), sub.clone()).await;
        assert_eq!(
            (s, v["delivered"].as_bool()),
            (StatusCode::OK, Some(true)),
            "{v}"
        );
    }
    for token in [ml.clone(), ADMIN_TOKEN.to_owned()] {
        let (s, h, v) = ping(token, sub.clone()).await;
        assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
        assert_eq!(h["content-type"], "application/problem+json");
        assert_eq!(v["type"], "urn:spotplane:problem:too-many-requests", "{v}");
        assert!(
            v["detail"]
                .as_str()
                .is_some_and(|d| d.contains("2 times a minute")),
            "{v}"
        );
        let after: u64 = h["retry-after"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("whole seconds");
        assert!((1..=30).contains(&after), "Retry-After: {after}");
    }
    // Refused pings were neither sent nor logged.
    assert_eq!(rx.bodies.lock().await.len(), 2);
    assert_eq!(log_of(&ts, &ml, &sub).await.len(), 2);
    // Another team's endpoint is not found, not limited; that team has its own bucket.
    let (s, _, _) = ping(ml.clone(), other.clone()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, _) = ping(ml.clone(), "no-such-webhook".into()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, v) = ping(vision.clone(), other.clone()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    ts.stop().await;
}

on_both_databases!(
    a_python_receiver_verifies_every_signature_including_during_rotation,
    failures_are_retried_with_backoff_and_a_restart_loses_nothing,
    a_slow_receiver_fails_the_attempt_at_the_timeout,
    an_endpoint_failing_for_the_whole_period_is_disabled_and_the_team_told,
    a_jobs_events_go_out_in_order_while_other_jobs_proceed,
    a_node_notice_reaches_the_teams_with_work_on_the_node,
    targets_and_event_types_are_validated_and_teams_see_their_own,
    a_ping_to_an_endless_answer_is_recorded_with_its_status,
    pings_beyond_the_teams_rate_are_refused_with_retry_after,
);
