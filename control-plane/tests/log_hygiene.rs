//! No token, secret or bootstrap credential reaches a log line.
//!
//! One flow at the most verbose level (`trace`, every crate, `log` records included), with every
//! line the process writes captured in a buffer: a server with a bootstrap admin token and a
//! configured secrets key, a team and its token, a webhook created and its secret rotated, a
//! ping signed with both, a team secret set (and a bad one refused), a node's bootstrap token
//! exchanged and then replayed, a job referring to the secret submitted, requests with wrong
//! and right tokens. Then the captured text is searched for each secret value the flow made.
//!
//! The subscriber is the process's global one, so this file holds this one test: nothing else
//! in the binary may install another.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use base64::Engine;
use common::{ADMIN_TOKEN, Backend, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::json;
use spotplane::secrets::KeyText;

/// Every line logged, as written.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        self.0
            .lock()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_made_in_a_full_flow_appears_in_any_log_line_at_trace_level() {
    let captured = Captured::default();
    let sink = captured.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .try_init()
        .expect("the only subscriber in this process");

    let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>());
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.secrets.key = Some(KeyText::new(key.clone()));
        c.webhooks.allow_private = true;
        c.webhooks.enabled = true;
        c.webhooks.interval = std::time::Duration::from_millis(100);
    })
    .await;
    let mut secrets: Vec<(&str, String)> = vec![
        ("bootstrap admin token", ADMIN_TOKEN.to_owned()),
        ("secrets key", key.clone()),
    ];

    let team = srv.team_with_token("alpha").await;
    secrets.push(("team token", team.clone()));

    // A webhook to a port where nothing listens: deliveries and the ping are signed and fail.
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/webhooks",
            Some(&team),
            Some(&json!({"url": "http://127.0.0.1:9/hook", "event_types": ["job.queued"]})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let hook = v["id"].as_str().expect("id").to_owned();
    secrets.push((
        "webhook secret",
        v["secret"].as_str().expect("secret").to_owned(),
    ));
    let (s, v) = srv
        .call(
            Method::POST,
            &format!("/v1/webhooks/{hook}/rotate-secret"),
            Some(&team),
            Some(&json!({"overlap_s": 3600})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    secrets.push((
        "rotated webhook secret",
        v["secret"].as_str().expect("secret").to_owned(),
    ));
    let (s, v) = srv
        .call(
            Method::POST,
            &format!("/v1/webhooks/{hook}/ping"),
            Some(&team),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");

    // A team secret, and one refused for its name: the value is echoed nowhere.
    let value = format!("hf_{}", uuid::Uuid::now_v7().simple());
    for (name, want) in [
        ("hf-token", StatusCode::CREATED),
        ("Bad Name", StatusCode::UNPROCESSABLE_ENTITY),
    ] {
        let (s, v) = srv
            .call(
                Method::POST,
                "/v1/teams/alpha/secrets",
                Some(&team),
                Some(&json!({"name": name, "value": value})),
            )
            .await;
        assert_eq!(s, want, "{v}");
    }
    secrets.push(("team secret value", value));

    // A node's bootstrap token exchanged for its credential, then presented again.
    let now = chrono::Utc::now();
    let (node, boot) = srv
        .store()
        .create_node_with_bootstrap(
            common::stored_node("n1", "g5.xlarge", "0.4", (4_000, 16_384), common::a10g()),
            now + chrono::Duration::hours(1),
            now,
        )
        .await
        .expect("node and bootstrap token");
    let body = json!({"protocol_version": 1, "agent_version": "0.1.0", "node_id": node.id,
        "hostname": "n1", "cpu_milli": 4000, "memory_mib": 16384});
    let (s, v) = srv
        .call(Method::POST, "/v1/agent/register", Some(&boot), Some(&body))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let credential = v["credential"].as_str().expect("credential").to_owned();
    let (s, _) = srv
        .call(Method::POST, "/v1/agent/register", Some(&boot), Some(&body))
        .await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "a bootstrap token is spent once exchanged"
    );
    secrets.push(("agent bootstrap token", boot));
    secrets.push(("node credential", credential.clone()));
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/register",
            Some(&credential),
            Some(&body),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");

    // A job referring to the secret, and tokens in the wrong places.
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(&team),
            Some(
                &json!({"name": "train", "shape": {"gpus": 1}, "command": ["train"],
                "secrets": {"HF_TOKEN": "hf-token"}}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let wrong = format!("{team}x");
    let (s, _) = srv.call(Method::GET, "/v1/jobs", Some(&wrong), None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = srv
        .call(
            Method::POST,
            "/v1/teams",
            Some(&team),
            Some(&json!({"name": "beta"})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // Let the delivery loop sign and attempt the job's event.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    srv.stop().await;

    let text = captured.text();
    assert!(
        text.contains("spotplane API listening") && text.contains("TRACE"),
        "the capture holds the server's lines at every level"
    );
    let mut leaks = Vec::new();
    for (what, secret) in &secrets {
        // The whole value, and its distinctive part (a webhook secret's base64 after whsec_).
        let tail = secret.rsplit('_').next().unwrap_or(secret);
        for needle in [secret.as_str(), tail] {
            if needle.len() >= 16 && text.contains(needle) {
                let line = text
                    .lines()
                    .find(|l| l.contains(needle))
                    .unwrap_or_default();
                leaks.push(format!("{what}: {line}"));
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "{} bytes of log captured; secrets in it:\n{}",
        text.len(),
        leaks.join("\n")
    );
}
