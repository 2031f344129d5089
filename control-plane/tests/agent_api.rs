//! The agent protocol (`/v1/agent/...`) and its operators' side, on SQLite and PostgreSQL.

mod common;

use common::{ADMIN_TOKEN, Backend, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use spotplane::model::Role;
use spotplane::scheduler::{Assigned, Placement};
use spotplane::store::{NewNode, NewToken};
use spotplane_core::{JobId, NodeId, NodeState};

on_both_databases!(
    a_bootstrap_token_is_exchanged_once_for_a_node_credential,
    a_bootstrap_token_works_once_and_not_after_it_expires,
    a_node_credential_acts_for_its_own_node_only,
    a_terminated_nodes_credential_is_refused_on_every_agent_route,
    heartbeats_hand_out_commands_until_their_result_arrives,
    a_notice_in_a_heartbeat_drains_the_node_with_its_deadline,
    checkpoint_reports_record_durable_and_missed_checkpoints,
    a_mig_layout_result_records_the_layout_the_gpu_has_now,
    bad_agent_input_gets_a_problem_naming_the_field,
    a_checkpoint_report_outside_the_jobs_prefix_is_refused,
    a_failed_start_says_why_in_the_jobs_events_and_webhooks,
    only_nodes_registered_with_a_container_engine_run_images,
);

fn new_node(name: &str) -> NewNode {
    common::stored_node(
        name,
        "p5.48xlarge",
        "35.5",
        (192_000, 2_097_152),
        common::h100(true),
    )
}

async fn node(srv: &TestServer, name: &str) -> NodeId {
    let n = new_node(name);
    let id = n.id;
    srv.store()
        .create_node(n, chrono::Utc::now())
        .await
        .expect("node stored");
    id
}

async fn bootstrap(srv: &TestServer, node: NodeId) -> String {
    let (s, v) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{node}/bootstrap-token"),
            Some(ADMIN_TOKEN),
            Some(&json!({})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v["token"].as_str().expect("token").to_owned()
}

fn register_body(node: NodeId) -> Value {
    json!({"protocol_version": 1, "node_id": node, "agent_version": "0.1.0", "hostname": "ip-10-0-0-1",
        "instance_id": "i-0abc", "cpu_milli": 192000, "memory_mib": 2097152,
        "gpus": [{"index": 0, "uuid": "GPU-5c1e", "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
                  "mig_enabled": true, "mig_devices": []}]})
}

/// A registered node: its id and credential. The node is created the way provisioning
/// creates nodes, with its bootstrap token.
async fn registered(srv: &TestServer, name: &str) -> (NodeId, String) {
    let n = new_node(name);
    let id = n.id;
    common::register_agent(srv, n, register_body(id)).await
}

fn heartbeat(node: NodeId) -> Value {
    json!({"node_id": node, "sent_at": chrono::Utc::now()})
}

async fn node_json(srv: &TestServer, id: NodeId) -> Value {
    let (_, v) = srv
        .call(Method::GET, "/v1/nodes", Some(ADMIN_TOKEN), None)
        .await;
    v["items"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["id"] == json!(id)).cloned())
        .expect("node listed")
}

/// Single use and expiry together: a token past its `expires_at` is refused like an unknown
/// one (and stays unused: a later fresh token works), a live one works once.
async fn a_bootstrap_token_works_once_and_not_after_it_expires(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let id = node(&srv, "n1").await;
    let now = chrono::Utc::now();
    let expired = srv
        .store()
        .issue_agent_bootstrap(id, now - chrono::Duration::seconds(1), now)
        .await
        .expect("issued");
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/register",
            Some(&expired),
            Some(&register_body(id)),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "expired: {v}");
    assert!(!v.to_string().contains(&expired), "{v}");

    let live = srv
        .store()
        .issue_agent_bootstrap(id, now + chrono::Duration::hours(1), now)
        .await
        .expect("issued");
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/register",
            Some(&live),
            Some(&register_body(id)),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "first use: {v}");
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/register",
            Some(&live),
            Some(&register_body(id)),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "second use: {v}");
    srv.stop().await;
}

async fn a_bootstrap_token_is_exchanged_once_for_a_node_credential(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let id = node(&srv, "n1").await;
    let boot = bootstrap(&srv, id).await;
    assert!(boot.starts_with("spb_"), "{boot}");
    assert_eq!(
        spotplane_core::agent::bootstrap_token_node(&boot),
        Some(id),
        "the token names its node"
    );
    assert_eq!(node_json(&srv, id).await["state"], "requested");

    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/register",
            Some(&boot),
            Some(&register_body(id)),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let cred = v["credential"].as_str().expect("credential").to_owned();
    assert!(cred.starts_with("spt_"));
    assert_eq!(v["node_id"], json!(id));
    assert_eq!(v["heartbeat_interval_ms"], 5000);
    assert_eq!(v["notice_poll_interval_ms"], 5000, "AWS: every 5 s");
    assert_eq!(v["checkpoint_signal"], "SIGUSR1");
    let n = node_json(&srv, id).await;
    assert_eq!(
        n["state"], "ready",
        "a registered agent makes its node ready"
    );
    assert_eq!(n["provider_instance_id"], "i-0abc");

    // Once only.
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/register",
            Some(&boot),
            Some(&register_body(id)),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(v["type"], "urn:spotplane:problem:unauthenticated");

    // A restarted agent registers again with its credential, and gets no new one.
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/register",
            Some(&cred),
            Some(&register_body(id)),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v.get("credential").is_none(), "{v}");
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/heartbeat",
            Some(&cred),
            Some(&heartbeat(id)),
        )
        .await;
    assert_eq!((s, &v["commands"]), (StatusCode::OK, &json!([])), "{v}");

    // Stored hashed: the token list shows a prefix, never the secret.
    let (_, tokens) = srv
        .call(Method::GET, "/v1/tokens", Some(ADMIN_TOKEN), None)
        .await;
    let agent_token = tokens["items"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["role"] == "agent").cloned())
        .expect("the node credential is listed");
    assert_eq!(agent_token["node_id"], json!(id));
    assert!(!tokens.to_string().contains(&cred[12..]));

    // A new bootstrap (a re-imaged node) revokes the earlier credential when exchanged.
    let boot2 = bootstrap(&srv, id).await;
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/register",
            Some(&boot2),
            Some(&register_body(id)),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let cred2 = v["credential"].as_str().expect("credential").to_owned();
    let (s, _) = srv
        .call(
            Method::POST,
            "/v1/agent/heartbeat",
            Some(&cred),
            Some(&heartbeat(id)),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "the old credential is revoked");
    let (s, _) = srv
        .call(
            Method::POST,
            "/v1/agent/heartbeat",
            Some(&cred2),
            Some(&heartbeat(id)),
        )
        .await;
    assert_eq!(s, StatusCode::OK);

    // A bootstrap token issued but superseded before use no longer works.
    let stale = bootstrap(&srv, id).await;
    let _fresh = bootstrap(&srv, id).await;
    let (s, _) = srv
        .call(
            Method::POST,
            "/v1/agent/register",
            Some(&stale),
            Some(&register_body(id)),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/register",
            Some("spb_made_up_secret_000000000000000000000000"),
            Some(&register_body(id)),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    srv.stop().await;
}

async fn a_node_credential_acts_for_its_own_node_only(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (a, cred_a) = registered(&srv, "a").await;
    let (b, _cred_b) = registered(&srv, "b").await;

    // Speaking for another node.
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/heartbeat",
            Some(&cred_a),
            Some(&heartbeat(b)),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(v["detail"].as_str().is_some_and(|d| d.contains("node_id")));
    let (s, _) = srv
        .call(
            Method::POST,
            "/v1/agent/register",
            Some(&cred_a),
            Some(&register_body(b)),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let boot_a = bootstrap(&srv, a).await;
    let (s, _) = srv
        .call(
            Method::POST,
            "/v1/agent/register",
            Some(&boot_a),
            Some(&register_body(b)),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "a's bootstrap token cannot register b"
    );

    // Another node's command.
    let (_, cmd) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{b}/commands"),
            Some(ADMIN_TOKEN),
            Some(&json!({"type": "drain"})),
        )
        .await;
    let cmd_id = cmd["command"]["id"].as_str().expect("id").to_owned();
    let (s, _) = srv
        .call(
            Method::POST,
            &format!("/v1/agent/commands/{cmd_id}/result"),
            Some(&cred_a),
            Some(&json!({"command_id": cmd_id, "ok": true})),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, hb) = srv
        .call(
            Method::POST,
            "/v1/agent/heartbeat",
            Some(&cred_a),
            Some(&heartbeat(a)),
        )
        .await;
    assert_eq!(hb["commands"], json!([]), "b's commands stay b's");

    // Everything else is closed to an agent credential, and agent endpoints to other roles.
    for (m, p) in [
        (Method::GET, "/v1/nodes".to_owned()),
        (Method::GET, format!("/v1/nodes/{a}/agent")),
        (Method::POST, format!("/v1/nodes/{a}/commands")),
        (Method::GET, "/v1/teams".to_owned()),
    ] {
        let (s, _) = srv
            .call(
                m.clone(),
                &p,
                Some(&cred_a),
                Some(&json!({"type": "drain"})),
            )
            .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{m} {p}");
    }
    let team = srv.team_with_token("alpha").await;
    let (_, fin) = srv
        .call(
            Method::POST,
            "/v1/tokens",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "fin", "role": "finance"})),
        )
        .await;
    let finance = fin["token"].as_str().expect("finance token").to_owned();
    // The operators' side: admin writes; finance reads; teams and agents neither.
    for (m, p, body, expect) in [
        (
            Method::POST,
            format!("/v1/nodes/{a}/bootstrap-token"),
            json!({}),
            [StatusCode::FORBIDDEN; 3],
        ),
        (
            Method::POST,
            format!("/v1/nodes/{a}/commands"),
            json!({"type": "drain"}),
            [StatusCode::FORBIDDEN; 3],
        ),
        (
            Method::GET,
            format!("/v1/nodes/{a}/commands"),
            json!({}),
            [StatusCode::FORBIDDEN, StatusCode::OK, StatusCode::FORBIDDEN],
        ),
        (
            Method::GET,
            format!("/v1/nodes/{a}/agent"),
            json!({}),
            [StatusCode::FORBIDDEN, StatusCode::OK, StatusCode::FORBIDDEN],
        ),
    ] {
        for (token, want) in [team.as_str(), finance.as_str(), cred_a.as_str()]
            .into_iter()
            .zip(expect)
        {
            let body = (m == Method::POST).then_some(&body);
            let (s, _) = srv.call(m.clone(), &p, Some(token), body).await;
            assert_eq!(s, want, "{m} {p}");
        }
    }
    for token in [team.as_str(), ADMIN_TOKEN] {
        let (s, _) = srv
            .call(
                Method::POST,
                "/v1/agent/heartbeat",
                Some(token),
                Some(&heartbeat(a)),
            )
            .await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        let (s, _) = srv
            .call(
                Method::POST,
                "/v1/agent/register",
                Some(token),
                Some(&register_body(a)),
            )
            .await;
        assert_eq!(s, StatusCode::FORBIDDEN);
    }
    let (s, _) = srv
        .call(
            Method::POST,
            "/v1/agent/heartbeat",
            Some(&boot_a),
            Some(&heartbeat(a)),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "a bootstrap token is no credential"
    );
    let (s, _) = srv
        .call(
            Method::POST,
            "/v1/agent/heartbeat",
            None,
            Some(&heartbeat(a)),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    srv.stop().await;
}

async fn agent_status(srv: &TestServer, id: NodeId) -> Value {
    let (s, v) = srv
        .call(
            Method::GET,
            &format!("/v1/nodes/{id}/agent"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

async fn a_terminated_nodes_credential_is_refused_on_every_agent_route(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (n, cred) = registered(&srv, "gone").await;
    let job = job_on(&srv, n).await;
    let (s, cmd) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{n}/commands"),
            Some(ADMIN_TOKEN),
            Some(&json!({"type": "drain"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{cmd}");
    let cmd_id = cmd["command"]["id"].as_str().expect("id").to_owned();
    // A heartbeat while the node lives (which also puts the credential in the auth cache).
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/heartbeat",
            Some(&cred),
            Some(&heartbeat(n)),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let before = agent_status(&srv, n).await;
    assert!(before["last_heartbeat_at"].is_string(), "{before}");

    srv.store()
        .transition_node(
            n,
            NodeState::Terminated,
            Some("the instance is gone".into()),
            chrono::Utc::now(),
        )
        .await
        .expect("terminated");

    let checkpoint = uuid::Uuid::now_v7().to_string();
    let routes: [(String, Value); 4] = [
        ("/v1/agent/heartbeat".into(), heartbeat(n)),
        ("/v1/agent/register".into(), register_body(n)),
        (
            format!("/v1/agent/commands/{cmd_id}/result"),
            json!({"command_id": cmd_id, "ok": true}),
        ),
        (
            "/v1/agent/checkpoints".into(),
            report(json!(job), &checkpoint, "missed_deadline", &"0".repeat(64)),
        ),
    ];
    for (path, body) in &routes {
        let (s, v) = srv.call(Method::POST, path, Some(&cred), Some(body)).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{path}: {v}");
        assert_eq!(v["type"], "urn:spotplane:problem:unauthenticated", "{path}");
    }
    let after = agent_status(&srv, n).await;
    assert_eq!(
        (&after["last_heartbeat_at"], &after["heartbeats"]),
        (&before["last_heartbeat_at"], &before["heartbeats"]),
        "a refused heartbeat records nothing"
    );
    // The credential is listed as revoked with its node.
    let (_, tokens) = srv
        .call(Method::GET, "/v1/tokens", Some(ADMIN_TOKEN), None)
        .await;
    let listed = tokens["items"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["node_id"] == json!(n)).cloned())
        .expect("the node credential is listed");
    assert!(listed["revoked_at"].is_string(), "{listed}");

    // A credential bound to a terminated node is no one even when nothing revoked it (one
    // issued before terminations revoked credentials).
    let (_, stale) = srv
        .store()
        .create_token(
            NewToken {
                name: "agent gone".into(),
                role: Role::Agent,
                team: None,
                node_id: Some(n),
                expires_at: None,
            },
            chrono::Utc::now(),
        )
        .await
        .expect("token");
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/heartbeat",
            Some(&stale),
            Some(&heartbeat(n)),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(
        agent_status(&srv, n).await["heartbeats"],
        before["heartbeats"]
    );
    srv.stop().await;
}

async fn heartbeats_hand_out_commands_until_their_result_arrives(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (id, cred) = registered(&srv, "n").await;
    let (s, cmd) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{id}/commands"),
            Some(ADMIN_TOKEN),
            Some(&json!({"type": "drain", "reason": "retiring the node"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{cmd}");
    let cmd_id = cmd["command"]["id"].clone();
    let (s, stop) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{id}/commands"),
            Some(ADMIN_TOKEN),
            Some(
                &json!({"type": "stop", "job_id": JobId(uuid::Uuid::now_v7()), "replica": 0, "grace_ms": 1000}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{stop}");

    for round in 1..=2 {
        let (s, v) = srv
            .call(
                Method::POST,
                "/v1/agent/heartbeat",
                Some(&cred),
                Some(&heartbeat(id)),
            )
            .await;
        assert_eq!(s, StatusCode::OK);
        let cmds = v["commands"].as_array().expect("commands");
        assert_eq!(cmds.len(), 2, "round {round}: {v}");
        assert_eq!(cmds[0]["id"], cmd_id);
        assert_eq!(cmds[0]["type"], "drain");
        assert_eq!(cmds[0]["reason"], "retiring the node");
        assert_eq!(cmds[1]["type"], "stop");
    }

    // A result on its own path ...
    let result = json!({"command_id": cmd_id, "ok": true, "message": "2 replicas checkpointed"});
    for _ in 0..2 {
        let (s, v) = srv
            .call(
                Method::POST,
                &format!(
                    "/v1/agent/commands/{}/result",
                    cmd_id.as_str().unwrap_or_default()
                ),
                Some(&cred),
                Some(&result),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["result"]["message"], "2 replicas checkpointed");
        assert_eq!(v["deliveries"], 2);
    }
    // ... or inside a heartbeat.
    let mut hb = heartbeat(id);
    hb["results"] =
        json!([{"command_id": stop["command"]["id"], "ok": false, "message": "no such replica"}]);
    let (_, v) = srv
        .call(Method::POST, "/v1/agent/heartbeat", Some(&cred), Some(&hb))
        .await;
    assert_eq!(v["commands"], json!([]), "{v}");

    let (s, v) = srv
        .call(
            Method::GET,
            &format!("/v1/nodes/{id}/commands"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let items = v["items"].as_array().expect("items");
    assert_eq!(items.len(), 2);
    assert!(items.iter().all(|c| !c["completed_at"].is_null()), "{v}");
    assert_eq!(items[0]["result"]["ok"], false, "newest first: {v}");

    let (s, _) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{}/commands", NodeId(uuid::Uuid::now_v7())),
            Some(ADMIN_TOKEN),
            Some(&json!({"type": "drain"})),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    srv.stop().await;
}

async fn a_notice_in_a_heartbeat_drains_the_node_with_its_deadline(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (id, cred) = registered(&srv, "n").await;
    let telemetry = json!([{"index": 0, "uuid": "GPU-5c1e", "DCGM_FI_DEV_GPU_UTIL": 97, "DCGM_FI_DEV_FB_USED": 70000,
        "DCGM_FI_DEV_FB_TOTAL": 81559, "DCGM_FI_DEV_POWER_USAGE": 612.5, "DCGM_FI_DEV_GPU_TEMP": 61}]);

    // A rebalance recommendation is recorded, nothing more.
    let mut hb = heartbeat(id);
    hb["gpus"] = telemetry.clone();
    hb["notice"] = json!({"source": "aws-rebalance", "action": "rebalance", "deadline": null,
        "observed_at": chrono::Utc::now()});
    let (s, v) = srv
        .call(Method::POST, "/v1/agent/heartbeat", Some(&cred), Some(&hb))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(node_json(&srv, id).await["state"], "ready");

    let deadline = "2031-01-01T00:02:00Z";
    hb["notice"] = json!({"source": "aws-instance-action", "action": "terminate", "deadline": deadline,
        "observed_at": chrono::Utc::now()});
    let (s, _) = srv
        .call(Method::POST, "/v1/agent/heartbeat", Some(&cred), Some(&hb))
        .await;
    assert_eq!(s, StatusCode::OK);
    let n = node_json(&srv, id).await;
    assert_eq!(n["state"], "draining");
    assert_eq!(n["notice_deadline"], "2031-01-01T00:02:00Z");
    assert!(
        n["state_reason"]
            .as_str()
            .is_some_and(|r| r.contains("termination notice")),
        "{n}"
    );
    // The same notice again changes nothing.
    let (s, _) = srv
        .call(Method::POST, "/v1/agent/heartbeat", Some(&cred), Some(&hb))
        .await;
    assert_eq!(s, StatusCode::OK);

    let (s, v) = srv
        .call(
            Method::GET,
            &format!("/v1/nodes/{id}/agent"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["telemetry"][0]["DCGM_FI_DEV_GPU_UTIL"], 97);
    assert_eq!(v["telemetry"][0]["DCGM_FI_DEV_POWER_USAGE"], 612.5);
    assert_eq!(v["notice"]["action"], "terminate");
    assert_eq!(v["heartbeats"], 3);
    assert_eq!(v["hostname"], "ip-10-0-0-1");
    assert_eq!(v["gpus"][0]["uuid"], "GPU-5c1e");

    let kinds: Vec<String> = srv
        .store()
        .outbox_after(0, 1000)
        .await
        .expect("outbox")
        .into_iter()
        .filter(|e| e.subject_id == id.to_string())
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            "node.requested",
            "node.ready",
            "node.notice",
            "node.draining"
        ],
        "one event per notice: the rebalance warning, then the move to draining"
    );
    srv.stop().await;
}

/// A job of team alpha admitted onto `node` (attempt 0, one replica), its checkpoints under
/// `s3://ckpt/alpha`.
async fn job_on(srv: &TestServer, node: NodeId) -> JobId {
    srv.team_with_token("alpha").await;
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "train", "team": "alpha", "shape": {"gpus": 1}, "command": ["python", "train.py"],
                "checkpoint": {"uri": "s3://ckpt/alpha"}})),
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
    job
}

fn report(job: Value, checkpoint: &str, outcome: &str, sha: &str) -> Value {
    let durable = outcome == "durable";
    let at = chrono::Utc::now();
    // The first admission is attempt 1.
    json!({"job_id": job, "replica": 0, "attempt": 1, "checkpoint_id": checkpoint,
        "uri": format!("s3://ckpt/alpha/replica-0/{checkpoint}/manifest.json"),
        "trigger": "notice", "outcome": outcome, "started_at": at, "finished_at": at,
        "message": if durable { Value::Null } else { json!("upload of 10 GiB could not finish before the deadline") },
        "manifest": if durable { json!({"job_id": job, "replica": 0, "checkpoint_id": checkpoint, "attempt": 1,
            "created_at": at, "total_bytes": 15,
            "files": [{"path": "state/step.json", "size": 15, "sha256": sha}]}) } else { Value::Null }})
}

/// A node may report checkpoints of its jobs, but only where the job's go: a durable
/// checkpoint elsewhere would be the job's next resume point, in anyone's storage.
async fn a_checkpoint_report_outside_the_jobs_prefix_is_refused(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (id, cred) = registered(&srv, "n").await;
    let job = job_on(&srv, id).await;
    let sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    let c = uuid::Uuid::now_v7().to_string();
    let other = uuid::Uuid::now_v7().to_string();
    for uri in [
        format!("s3://team-b/loot/replica-0/{c}/manifest.json"),
        format!("s3://ckpt/alpha-b/replica-0/{c}/manifest.json"),
        format!("s3://ckpt/alpha/../beta/replica-0/{c}/manifest.json"),
        format!("s3://ckpt/alpha/%2e%2e/beta/replica-0/{c}/manifest.json"),
        format!("gs://ckpt/alpha/replica-0/{c}/manifest.json"),
        format!("s3://ckpt/alpha/replica-1/{c}/manifest.json"),
        format!("s3://ckpt/alpha/replica-0/{other}/manifest.json"),
        format!("s3://ckpt/alpha/replica-0/{c}/evil/manifest.json"),
        "not a url".to_owned(),
    ] {
        let mut body = report(json!(job), &c, "durable", sha);
        body["uri"] = json!(uri);
        let (s, v) = srv
            .call(
                Method::POST,
                "/v1/agent/checkpoints",
                Some(&cred),
                Some(&body),
            )
            .await;
        assert_eq!(
            (s, v["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("uri")),
            "{uri}: {v}"
        );
        assert!(
            v["errors"][0]["message"]
                .as_str()
                .is_some_and(|m| m.contains("s3://ckpt/alpha/replica-0/")),
            "{v}"
        );
    }
    assert!(
        srv.store()
            .latest_durable_checkpoint(job, 0)
            .await
            .expect("query")
            .is_none(),
        "nothing became a resume point"
    );
    // Where the job's checkpoints go, it is recorded.
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/checkpoints",
            Some(&cred),
            Some(&report(json!(job), &c, "durable", sha)),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    srv.stop().await;
}

async fn checkpoint_reports_record_durable_and_missed_checkpoints(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (id, cred) = registered(&srv, "n").await;
    let (_other, cred_other) = registered(&srv, "other").await;
    let job = job_on(&srv, id).await;
    let j = json!(job);
    let c1 = uuid::Uuid::now_v7().to_string();
    let sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    let body = report(j.clone(), &c1, "durable", sha);
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/checkpoints",
            Some(&cred),
            Some(&body),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "complete");
    assert_eq!(v["total_bytes"], 15);
    assert_eq!(v["node_id"], json!(id));
    // Again: the same record.
    let (s, again) = srv
        .call(
            Method::POST,
            "/v1/agent/checkpoints",
            Some(&cred),
            Some(&body),
        )
        .await;
    assert_eq!((s, &again), (StatusCode::OK, &v));
    // The same id with other content: refused, the durable one stays.
    let other = report(j.clone(), &c1, "durable", &"0".repeat(64));
    let (s, _) = srv
        .call(
            Method::POST,
            "/v1/agent/checkpoints",
            Some(&cred),
            Some(&other),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);

    // One that missed its deadline is recorded, and is no resume point.
    let c2 = uuid::Uuid::now_v7().to_string();
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/checkpoints",
            Some(&cred),
            Some(&report(j.clone(), &c2, "missed_deadline", sha)),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "missed_deadline");
    let latest = srv
        .store()
        .latest_durable_checkpoint(job, 0)
        .await
        .expect("query")
        .expect("a resume point");
    assert_eq!(latest.id.to_string(), c1);

    let (s, v) = srv
        .call(
            Method::GET,
            &format!("/v1/jobs/{job}/checkpoints"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let states: Vec<&str> = v["items"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["state"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(states, ["missed_deadline", "complete"]);
    let other_team = srv.team_with_token("beta").await;
    let (s, _) = srv
        .call(
            Method::GET,
            &format!("/v1/jobs/{job}/checkpoints"),
            Some(&other_team),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "another team's job");

    let (_, events) = srv
        .call(
            Method::GET,
            &format!("/v1/jobs/{job}/events"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    let kinds: Vec<&str> = events["items"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["type"].as_str()).collect())
        .unwrap_or_default();
    assert!(kinds.contains(&"job.checkpointed"), "{events}");
    assert!(
        kinds.contains(&"job.checkpoint_missed_deadline"),
        "{events}"
    );

    // A node that does not run the job cannot report for it.
    let c3 = uuid::Uuid::now_v7().to_string();
    let (s, _) = srv
        .call(
            Method::POST,
            "/v1/agent/checkpoints",
            Some(&cred_other),
            Some(&report(j.clone(), &c3, "durable", sha)),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Unless it was told to checkpoint it.
    srv.call(
        Method::POST,
        &format!("/v1/nodes/{_other}/commands"),
        Some(ADMIN_TOKEN),
        Some(
            &json!({"type": "checkpoint", "job_id": job, "replica": 0, "checkpoint_id": c3,
            "uri": "s3://ckpt/jobs", "deadline": null}),
        ),
    )
    .await;
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/agent/checkpoints",
            Some(&cred_other),
            Some(&report(j.clone(), &c3, "durable", sha)),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");

    // A checkpoint command's result with its manifest records the checkpoint too (when the
    // report itself was lost), at the place the agent's layout puts the manifest.
    let c4 = uuid::Uuid::now_v7().to_string();
    let (_, cmd) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{id}/commands"),
            Some(ADMIN_TOKEN),
            Some(
                &json!({"type": "checkpoint", "job_id": job, "replica": 0, "checkpoint_id": c4,
                "uri": "s3://ckpt/jobs/x/", "deadline": null}),
            ),
        )
        .await;
    let manifest = report(j, &c4, "durable", sha)["manifest"].clone();
    let mut hb = heartbeat(id);
    hb["results"] = json!([{"command_id": cmd["command"]["id"], "ok": true, "manifest": manifest}]);
    let (s, _) = srv
        .call(Method::POST, "/v1/agent/heartbeat", Some(&cred), Some(&hb))
        .await;
    assert_eq!(s, StatusCode::OK);
    let latest = srv
        .store()
        .latest_durable_checkpoint(job, 0)
        .await
        .expect("query")
        .expect("a resume point");
    assert_eq!(latest.id.to_string(), c4);
    assert_eq!(
        latest.uri,
        format!("s3://ckpt/jobs/x/replica-0/{c4}/manifest.json")
    );
    srv.stop().await;
}

async fn a_mig_layout_result_records_the_layout_the_gpu_has_now(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (id, cred) = registered(&srv, "n").await;
    let layout = json!([{"class": "3g", "start": 0}, {"class": "3g", "start": 4}]);
    let (s, cmd) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{id}/commands"),
            Some(ADMIN_TOKEN),
            Some(&json!({"type": "apply_mig_layout", "gpu_index": 0, "layout": layout})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{cmd}");
    let mut hb = heartbeat(id);
    hb["results"] = json!([{"command_id": cmd["command"]["id"], "ok": true,
        "mig_layout": {"gpu_index": 0, "layout": layout}}]);
    let (s, _) = srv
        .call(Method::POST, "/v1/agent/heartbeat", Some(&cred), Some(&hb))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(node_json(&srv, id).await["gpus"][0]["mig_layout"], layout);
    srv.stop().await;
}

async fn bad_agent_input_gets_a_problem_naming_the_field(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (id, cred) = registered(&srv, "n").await;
    let mut body = register_body(id);
    body["protocol_version"] = json!(99);
    let (s, v) = srv
        .call(Method::POST, "/v1/agent/register", Some(&cred), Some(&body))
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("protocol_version")),
        "{v}"
    );
    // The address gang peers connect to: an IP address, no port, not a wildcard.
    for bad in [
        "ip-10-0-0-1",
        "10.0.0.1:29500",
        "0.0.0.0",
        "::",
        "239.1.1.1",
        "",
    ] {
        let mut body = register_body(id);
        body["address"] = json!(bad);
        let (s, v) = srv
            .call(Method::POST, "/v1/agent/register", Some(&cred), Some(&body))
            .await;
        assert_eq!(
            (s, v["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("address")),
            "{bad:?}: {v}"
        );
    }
    let mut body = register_body(id);
    body["address"] = json!("10.0.0.1");
    let (s, v) = srv
        .call(Method::POST, "/v1/agent/register", Some(&cred), Some(&body))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, status) = srv
        .call(
            Method::GET,
            &format!("/v1/nodes/{id}/agent"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(status["address"], "10.0.0.1", "{status}");

    let mut hb = heartbeat(id);
    hb["telemetry"] = json!([]);
    let (s, v) = srv
        .call(Method::POST, "/v1/agent/heartbeat", Some(&cred), Some(&hb))
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("telemetry")),
        "{v}"
    );

    // The protocol's own bounds, each named (docs/api.md "Named limits").
    use spotplane_core::limits;
    let job = JobId(uuid::Uuid::now_v7());
    let over = |l: &limits::Limit| 0..=l.max;
    let mut hb = heartbeat(id);
    hb["gpus"] = over(&limits::HEARTBEAT_GPUS)
        .map(|i| json!({"index": i}))
        .collect();
    hb["replicas"] = over(&limits::HEARTBEAT_REPLICAS)
        .map(|i| json!({"job_id": job, "replica": i, "attempt": 1, "phase": "running"}))
        .collect();
    hb["results"] = over(&limits::HEARTBEAT_RESULTS)
        .map(|_| json!({"command_id": uuid::Uuid::now_v7(), "ok": true}))
        .collect();
    let batch = |chunks: Vec<Value>| json!({ "chunks": chunks });
    let chunk = |i: u64, bytes: usize| {
        use base64::Engine;
        json!({"job_id": job, "replica": 0, "attempt": 1, "offset": i,
            "data": base64::engine::general_purpose::STANDARD.encode(vec![b'x'; bytes])})
    };
    for (path, body, want) in [
        (
            "/v1/agent/heartbeat",
            hb,
            vec![
                ("gpus", "heartbeat_gpus"),
                ("replicas", "heartbeat_replicas"),
                ("results", "heartbeat_results"),
            ],
        ),
        (
            "/v1/agent/logs",
            batch(over(&limits::LOG_CHUNKS).map(|i| chunk(i, 1)).collect()),
            vec![("chunks", "log_chunks")],
        ),
        (
            "/v1/agent/logs",
            batch(vec![chunk(0, limits::LOG_CHUNK_BYTES.max as usize + 1)]),
            vec![("chunks[0].data", "log_chunk_bytes")],
        ),
    ] {
        let (s, v) = srv.call(Method::POST, path, Some(&cred), Some(&body)).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {v}");
        let got: Vec<(&str, &str)> = v["errors"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| Some((e["field"].as_str()?, e["limit"].as_str()?)))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(got, want, "{path}: {v}");
    }

    let mut hb = heartbeat(id);
    hb["notice"] = json!({"source": "aws-instance-action", "action": "terminate", "deadline": "soon",
        "observed_at": chrono::Utc::now()});
    let (s, v) = srv
        .call(Method::POST, "/v1/agent/heartbeat", Some(&cred), Some(&hb))
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("notice.deadline")),
        "{v}"
    );

    let cmd = uuid::Uuid::now_v7();
    let (s, v) = srv
        .call(
            Method::POST,
            &format!("/v1/agent/commands/{cmd}/result"),
            Some(&cred),
            Some(&json!({"command_id": uuid::Uuid::now_v7(), "ok": true})),
        )
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("command_id")),
        "{v}"
    );

    let job = JobId(uuid::Uuid::now_v7());
    let c = uuid::Uuid::now_v7().to_string();
    let mut r = report(json!(job), &c, "durable", "e3b0");
    r["manifest"]["total_bytes"] = json!(16);
    let (s, v) = srv
        .call(Method::POST, "/v1/agent/checkpoints", Some(&cred), Some(&r))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let fields: Vec<&str> = v["errors"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["field"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(fields, ["manifest.files[0].sha256", "manifest.total_bytes"]);

    let (s, v) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{id}/commands"),
            Some(ADMIN_TOKEN),
            Some(&json!({"type": "reboot"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (s, v) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{id}/bootstrap-token"),
            Some(ADMIN_TOKEN),
            Some(&json!({"ttl_seconds": 0})),
        )
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("ttl_seconds")),
        "{v}"
    );

    // The OpenAPI document describes the protocol.
    let (_, doc) = srv.call(Method::GET, "/v1/openapi.json", None, None).await;
    for p in [
        "/v1/agent/register",
        "/v1/agent/heartbeat",
        "/v1/agent/commands/{id}/result",
        "/v1/agent/checkpoints",
        "/v1/nodes/{id}/bootstrap-token",
        "/v1/nodes/{id}/commands",
        "/v1/nodes/{id}/agent",
        "/v1/jobs/{id}/checkpoints",
    ] {
        assert!(doc["paths"].get(p).is_some(), "{p} documented");
    }
    for s in [
        "Heartbeat",
        "CommandKind",
        "CheckpointReport",
        "GpuTelemetry",
    ] {
        assert!(
            doc["components"]["schemas"].get(s).is_some(),
            "{s} documented"
        );
    }
    srv.stop().await;
}

/// Issue 21: an image that will not pull fails the replica with the agent's reason, in the
/// job's events and in the outbox the webhooks are sent from; the run counts as a failure.
async fn a_failed_start_says_why_in_the_jobs_events_and_webhooks(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (id, cred) = registered(&srv, "n").await;
    let job = job_on(&srv, id).await;
    let now = chrono::Utc::now();
    srv.store()
        .start_replica(
            job,
            id,
            0,
            1,
            vec!["0".into()],
            None,
            "s3://ckpt",
            spotplane_core::rendezvous::PortRange::default(),
            now,
        )
        .await
        .expect("start queued");
    let (_, v) = srv
        .call(
            Method::POST,
            "/v1/agent/heartbeat",
            Some(&cred),
            Some(&heartbeat(id)),
        )
        .await;
    let start = v["commands"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "start"))
        .cloned()
        .expect("a start command");
    let why = "pulling localhost:1/nope:1: connection refused";
    let mut hb = heartbeat(id);
    hb["results"] = json!([{"command_id": start["id"], "ok": false, "message": why}]);
    // Sent twice (a retried heartbeat): one event.
    for _ in 0..2 {
        let (s, v) = srv
            .call(Method::POST, "/v1/agent/heartbeat", Some(&cred), Some(&hb))
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }

    let (s, events) = srv
        .call(
            Method::GET,
            &format!("/v1/jobs/{job}/events"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{events}");
    let failed: Vec<&Value> = events["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|e| e["type"] == "job.start_failed")
        .collect();
    assert_eq!(failed.len(), 1, "{events}");
    let reason = failed[0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("replica 0 could not start") && reason.contains(why),
        "{reason}"
    );
    assert_eq!(failed[0]["data"]["error"], why, "{events}");

    let outbox: Vec<_> = srv
        .store()
        .outbox_after(0, 1000)
        .await
        .expect("outbox")
        .into_iter()
        .filter(|e| e.kind == "job.start_failed")
        .collect();
    assert_eq!(outbox.len(), 1);
    assert_eq!(
        spotplane::webhooks::EventType::of_outbox(&outbox[0].kind, &outbox[0].payload),
        Some(spotplane::webhooks::EventType::JobStartFailed)
    );
    assert!(
        outbox[0].payload["reason"]
            .as_str()
            .is_some_and(|r| r.contains(why)),
        "{:?}",
        outbox[0].payload
    );
    srv.stop().await;
}

/// The scheduler's view of a node says whether its agent runs images: only when it registered
/// with a container engine.
async fn only_nodes_registered_with_a_container_engine_run_images(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (bare, _) = registered(&srv, "bare").await;
    let node = new_node("engine");
    let mut body = register_body(node.id);
    body["container_engine"] = json!({"kind": "podman", "version": "4.3.1", "cdi": false});
    body["address"] = json!("10.0.0.7");
    let (engine, _) = common::register_agent(&srv, node, body).await;
    let snap = srv
        .store()
        .scheduler_snapshot(&mut spotplane::store::SpecCache::default())
        .await
        .expect("snapshot");
    let runs = |id: NodeId| {
        snap.nodes
            .iter()
            .find(|x| x.id == id)
            .map(|x| x.runs_images)
    };
    assert_eq!(runs(bare), Some(false));
    assert_eq!(runs(engine), Some(true));
    srv.stop().await;
}
