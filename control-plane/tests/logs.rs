//! Replicas' output: `POST /v1/agent/logs` from the node that runs the attempt, and
//! `GET /v1/jobs/{id}/logs` (read, tail, follow), on SQLite and PostgreSQL.

mod common;

use std::time::{Duration, Instant};

use base64::Engine;
use common::{ADMIN_TOKEN, Backend, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use spotplane::scheduler::{Assigned, Placement};
use spotplane_core::{JobId, NodeId};

on_both_databases!(
    the_team_reads_what_its_jobs_node_sent_and_no_other_team_can,
    only_the_node_that_runs_an_attempt_may_send_its_output,
    bad_parameters_are_refused_naming_the_parameter,
    a_follower_sees_new_output_and_the_stream_ends_with_the_attempt,
    a_follow_ends_a_while_after_the_attempts_node_let_go,
    only_the_last_mib_of_an_attempt_are_kept,
);

/// A registered node: its id and credential.
async fn registered(srv: &TestServer, name: &str) -> (NodeId, String) {
    let node = common::stored_node(
        name,
        "p5.48xlarge",
        "35.5",
        (192_000, 2_097_152),
        common::h100(false),
    );
    let body = json!({"protocol_version": 1, "agent_version": "0.1.0",
        "hostname": "ip-10-0-0-1", "cpu_milli": 192000, "memory_mib": 2097152, "gpus": []});
    common::register_agent(srv, node, body).await
}

/// A job of `team` placed on `node` (its attempt 1, one replica); returns the job and the
/// team's token.
async fn job_on(srv: &TestServer, team: &str, node: NodeId) -> (JobId, String) {
    let token = srv.team_with_token(team).await;
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(&token),
            Some(
                &json!({"name": "train", "shape": {"gpus": 1}, "command": ["python", "train.py"],
                "checkpoint": {"uri": format!("s3://ckpt/{team}")}}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let job: JobId = v["id"].as_str().and_then(|s| s.parse().ok()).expect("id");
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
    (job, token)
}

fn chunk(job: JobId, attempt: u32, offset: u64, data: &[u8]) -> Value {
    json!({"job_id": job, "replica": 0, "attempt": attempt, "offset": offset,
        "data": base64::engine::general_purpose::STANDARD.encode(data)})
}

fn eof(job: JobId, offset: u64) -> Value {
    json!({"job_id": job, "replica": 0, "attempt": 1, "offset": offset, "data": "", "eof": true})
}

async fn ship(srv: &TestServer, cred: &str, chunks: Vec<Value>) -> (StatusCode, Value) {
    srv.call(
        Method::POST,
        "/v1/agent/logs",
        Some(cred),
        Some(&json!({ "chunks": chunks })),
    )
    .await
}

/// The answer's status and body as text.
async fn read(srv: &TestServer, path: &str, token: &str) -> (StatusCode, String) {
    let resp = srv
        .http
        .get(format!("{}{path}", srv.url))
        .bearer_auth(token)
        .send()
        .await
        .expect("sent");
    let status = resp.status();
    (status, resp.text().await.expect("body"))
}

async fn the_team_reads_what_its_jobs_node_sent_and_no_other_team_can(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (node, cred) = registered(&srv, "n1").await;
    let (job, alpha) = job_on(&srv, "alpha", node).await;
    let first = vec![chunk(job, 1, 0, b"step=1\n"), chunk(job, 1, 7, b"step=2\n")];
    let (s, v) = ship(&srv, &cred, first.clone()).await;
    assert_eq!((s, &v["chunks"]), (StatusCode::OK, &json!(2)), "{v}");
    // A retried batch (its answer was lost) changes nothing.
    let mut retried = first;
    retried.push(chunk(job, 1, 14, b"checkpoint step=2\n"));
    let (s, v) = ship(&srv, &cred, retried).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, text) = read(&srv, &format!("/v1/jobs/{job}/logs"), &alpha).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(text, "step=1\nstep=2\ncheckpoint step=2\n");
    let (_, text) = read(&srv, &format!("/v1/jobs/{job}/logs?tail=2"), &alpha).await;
    assert_eq!(text, "step=2\ncheckpoint step=2\n");
    let (_, text) = read(&srv, &format!("/v1/jobs/{job}/logs?tail=0"), &alpha).await;
    assert_eq!(text, "");
    // The same for an admin, and as SSE.
    let resp = srv
        .http
        .get(format!(
            "{}/v1/jobs/{job}/logs?replica=0&attempt=1",
            srv.url
        ))
        .bearer_auth(ADMIN_TOKEN)
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("sent");
    assert_eq!(
        resp.headers()["content-type"].to_str().ok(),
        Some("text/event-stream")
    );
    let sse = resp.text().await.expect("body");
    assert!(
        sse.starts_with("event: log\nid: 7\ndata: step=1\ndata: \n\nevent: log\nid: 14\ndata: step=2\ndata: \n\nevent: log\nid: 32\ndata: checkpoint step=2\ndata: \n\n"),
        "{sse}"
    );
    assert!(sse.ends_with("event: end\nid: 32\ndata: \n\n"), "{sse}");
    // Another team's token: the same 404 as for the job itself, whatever the parameters.
    let beta = srv.team_with_token("beta").await;
    let (s, job_404) = srv
        .call(Method::GET, &format!("/v1/jobs/{job}"), Some(&beta), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    for q in ["", "?follow=true", "?replica=7", "?tail=bogus"] {
        let (s, logs_404) = srv
            .call(
                Method::GET,
                &format!("/v1/jobs/{job}/logs{q}"),
                Some(&beta),
                None,
            )
            .await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{q}");
        assert_eq!(logs_404, job_404, "{q}");
    }
    let (s, _) = srv
        .call(Method::GET, &format!("/v1/jobs/{job}/logs"), None, None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    srv.stop().await;
}

async fn only_the_node_that_runs_an_attempt_may_send_its_output(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (node, cred) = registered(&srv, "n1").await;
    let (_, other) = registered(&srv, "n2").await;
    let (job, alpha) = job_on(&srv, "alpha", node).await;
    let (s, v) = ship(&srv, &other, vec![chunk(job, 1, 0, b"forged\n")]).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    // Its own node, but an attempt that never ran there.
    let (s, v) = ship(&srv, &cred, vec![chunk(job, 2, 0, b"forged\n")]).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    // A batch with one foreign attempt stores nothing.
    let (s, _) = ship(
        &srv,
        &cred,
        vec![chunk(job, 1, 0, b"mine\n"), chunk(job, 3, 0, b"forged\n")],
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, text) = read(&srv, &format!("/v1/jobs/{job}/logs"), &alpha).await;
    assert_eq!(text, "");
    // Team and admin tokens are not agents.
    let (s, _) = ship(&srv, &alpha, vec![chunk(job, 1, 0, b"x\n")]).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    srv.stop().await;
}

async fn bad_parameters_are_refused_naming_the_parameter(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (node, cred) = registered(&srv, "n1").await;
    let (job, alpha) = job_on(&srv, "alpha", node).await;
    for (q, field) in [
        ("replica=1", "replica"),
        ("replica=x", "replica"),
        ("attempt=0", "attempt"),
        ("follow=maybe", "follow"),
        ("tail=-3", "tail"),
        ("tail=1000000", "tail"),
        ("since=5m", "since"),
        ("replica=0&replica=0", "replica"),
    ] {
        let (s, headers, v) = srv
            .send(
                Method::GET,
                &format!("/v1/jobs/{job}/logs?{q}"),
                Some(&alpha),
                None,
                &[],
            )
            .await;
        assert_eq!(
            (s, v["field"].as_str()),
            (StatusCode::BAD_REQUEST, Some(field)),
            "{q}: {v}"
        );
        assert_eq!(
            headers["content-type"].to_str().ok(),
            Some("application/problem+json"),
            "{q}"
        );
    }
    let (s, v) = srv
        .call(Method::GET, "/v1/jobs/not-a-job/logs", Some(&alpha), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    // What the agent sends is checked too.
    for (body, field) in [
        (
            json!({"chunks": [{"job_id": job, "replica": 0, "attempt": 1, "offset": 0, "data": "not base64!"}]}),
            "chunks[0].data",
        ),
        (
            json!({"chunks": [chunk(job, 1, 0, b"x"), {"job_id": job, "replica": 0, "attempt": 1, "offset": 1, "data": "eA==", "eof": true}]}),
            "chunks[1].data",
        ),
        (
            json!({"chunks": [chunk(job, 0, 0, b"x")]}),
            "chunks[0].attempt",
        ),
        (
            json!({"chunks": [{"job_id": job, "replica": 0, "attempt": 1, "offset": -1, "data": ""}]}),
            "chunks[0].offset",
        ),
        (json!({"chunks": [], "extra": 1}), "extra"),
    ] {
        let (s, v) = srv
            .call(Method::POST, "/v1/agent/logs", Some(&cred), Some(&body))
            .await;
        assert_eq!(
            (s, v["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(field)),
            "{body}: {v}"
        );
    }
    srv.stop().await;
}

/// Reads a streamed answer piece by piece.
struct Stream {
    resp: reqwest::Response,
    text: String,
}

impl Stream {
    async fn open(srv: &TestServer, path: &str, token: &str, sse: bool) -> Stream {
        let mut req = srv
            .http
            .get(format!("{}{path}", srv.url))
            .bearer_auth(token);
        if sse {
            req = req.header("accept", "text/event-stream");
        }
        let resp = req.send().await.expect("sent");
        assert_eq!(resp.status(), StatusCode::OK);
        Stream {
            resp,
            text: String::new(),
        }
    }

    /// Waits until the text read so far holds `what`; returns how long it took.
    async fn until(&mut self, what: &str, within: Duration) -> Duration {
        let started = Instant::now();
        while !self.text.contains(what) {
            let left = within.saturating_sub(started.elapsed());
            match tokio::time::timeout(left, self.resp.chunk()).await {
                Ok(Ok(Some(b))) => self.text.push_str(&String::from_utf8_lossy(&b)),
                other => panic!("{what:?} not within {within:?} ({other:?}): {}", self.text),
            }
        }
        started.elapsed()
    }

    /// Waits for the end of the answer.
    async fn end(&mut self, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let left = within.saturating_sub(started.elapsed());
            match tokio::time::timeout(left, self.resp.chunk()).await {
                Ok(Ok(Some(b))) => self.text.push_str(&String::from_utf8_lossy(&b)),
                Ok(Ok(None)) => return started.elapsed(),
                other => panic!("no end within {within:?} ({other:?}): {}", self.text),
            }
        }
    }
}

async fn a_follower_sees_new_output_and_the_stream_ends_with_the_attempt(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (node, cred) = registered(&srv, "n1").await;
    let (job, alpha) = job_on(&srv, "alpha", node).await;
    ship(&srv, &cred, vec![chunk(job, 1, 0, b"step=1\n")]).await;
    let path = format!("/v1/jobs/{job}/logs?follow=true");
    let mut text = Stream::open(&srv, &path, &alpha, false).await;
    let mut sse = Stream::open(&srv, &path, &alpha, true).await;
    text.until("step=1\n", Duration::from_secs(5)).await;
    sse.until("data: step=1", Duration::from_secs(5)).await;
    // New output reaches both followers at once (woken, not polled).
    ship(&srv, &cred, vec![chunk(job, 1, 7, b"step=2\n")]).await;
    let took = text.until("step=2\n", Duration::from_secs(2)).await;
    assert!(took < Duration::from_millis(900), "{took:?}");
    sse.until("data: step=2", Duration::from_secs(2)).await;
    // The last chunk of the attempt ends both streams, after all that came before it.
    ship(
        &srv,
        &cred,
        vec![chunk(job, 1, 14, b"done step=2\n"), eof(job, 26)],
    )
    .await;
    text.end(Duration::from_secs(3)).await;
    assert_eq!(text.text, "step=1\nstep=2\ndone step=2\n");
    sse.end(Duration::from_secs(3)).await;
    assert!(
        sse.text.ends_with("event: end\nid: 26\ndata: \n\n"),
        "{}",
        sse.text
    );
    srv.stop().await;
}

async fn a_follow_ends_a_while_after_the_attempts_node_let_go(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (node, cred) = registered(&srv, "n1").await;
    let (job, alpha) = job_on(&srv, "alpha", node).await;
    ship(&srv, &cred, vec![chunk(job, 1, 0, b"step=1\n")]).await;
    let mut s = Stream::open(
        &srv,
        &format!("/v1/jobs/{job}/logs?follow=true"),
        &alpha,
        false,
    )
    .await;
    s.until("step=1\n", Duration::from_secs(5)).await;
    // The node goes without a last word: its allocation is released, and what it sent
    // before is still readable.
    let (st, v) = srv
        .call(
            Method::POST,
            &format!("/v1/jobs/{job}/cancel"),
            Some(&alpha),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let took = s.end(Duration::from_secs(15)).await;
    assert!(
        took >= Duration::from_secs(3),
        "waited for late output: {took:?}"
    );
    let (_, text) = read(&srv, &format!("/v1/jobs/{job}/logs"), &alpha).await;
    assert_eq!(text, "step=1\n");
    srv.stop().await;
}

async fn only_the_last_mib_of_an_attempt_are_kept(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (node, cred) = registered(&srv, "n1").await;
    let (job, alpha) = job_on(&srv, "alpha", node).await;
    // 9 MiB of numbered lines, 64 KiB a chunk, two chunks a batch.
    let line_len = 16usize;
    let chunk_len = 64 * 1024;
    let total = 9 << 20;
    let lines: Vec<u8> = (0..total / line_len)
        .flat_map(|i| format!("line {i:>10}\n").into_bytes())
        .collect();
    assert_eq!(lines.len(), total);
    for (n, pair) in lines.chunks(2 * chunk_len).enumerate() {
        let offset = (n * 2 * chunk_len) as u64;
        let chunks: Vec<Value> = pair
            .chunks(chunk_len)
            .enumerate()
            .map(|(i, c)| chunk(job, 1, offset + (i * chunk_len) as u64, c))
            .collect();
        let (s, v) = ship(&srv, &cred, chunks).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let (_, text) = read(&srv, &format!("/v1/jobs/{job}/logs"), &alpha).await;
    let (note, kept) = text.split_once("]\n").expect("a note first");
    assert!(
        note.starts_with("[spotplane: the first 1048576 bytes of this attempt's output are no longer kept here; all of it is archived under s3://ckpt/alpha/logs/replica-0/attempt-1/"),
        "{note}"
    );
    assert_eq!(kept.len(), 8 << 20);
    assert!(lines.ends_with(kept.as_bytes()));
    srv.stop().await;
}
