//! Who may call what (every role × every endpoint), and what bad input gets back.

mod common;

use common::{ADMIN_TOKEN, Backend, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use spotplane::model::Role;
use spotplane::store::{NewGpu, NewNode, NewToken};
use spotplane_core::{Cloud, GpuModel, Market, Micros, MigLayout, NodeId};

on_both_databases!(
    every_role_gets_exactly_its_rights_on_every_endpoint,
    bad_input_gets_a_problem_naming_the_field,
);

const ADMIN: usize = 0;
const TEAM: usize = 1;
const FINANCE: usize = 2;
const AGENT: usize = 3;

struct Tokens {
    by_role: [String; 4],
}

async fn tokens(srv: &TestServer) -> Tokens {
    let team = srv.team_with_token("alpha").await;
    let (_, v) = srv
        .call(
            Method::POST,
            "/v1/tokens",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "fin", "role": "finance"})),
        )
        .await;
    let finance = v["token"].as_str().expect("finance token").to_owned();
    // An agent credential lives only while its node does: bind it to a stored node.
    let node = NodeId(uuid::Uuid::now_v7());
    srv.store()
        .create_node(
            NewNode {
                id: node,
                name: "agent-node".into(),
                cloud: Cloud::Aws,
                region: "us-east-1".into(),
                zone: "us-east-1a".into(),
                instance_type: "g5.xlarge".into(),
                market: Market::Spot,
                offer_id: None,
                client_token: "ct-agent-node".into(),
                hourly_price: Micros::parse_usd("0.4").expect("price"),
                on_demand_price: Micros::parse_usd("1.006").expect("price"),
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
        .expect("node stored");
    let (_, agent) = srv
        .store()
        .create_token(
            NewToken {
                name: "node-agent".into(),
                role: Role::Agent,
                team: None,
                node_id: Some(node),
                expires_at: None,
            },
            chrono::Utc::now(),
        )
        .await
        .expect("agent token");
    Tokens {
        by_role: [ADMIN_TOKEN.to_owned(), team, finance, agent],
    }
}

async fn new_job(srv: &TestServer) -> String {
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "j", "team": "alpha", "shape": {"gpus": 1}, "command": ["x"]})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    v["id"].as_str().expect("id").to_owned()
}

async fn new_victim_token(srv: &TestServer) -> String {
    let (_, v) = srv
        .call(
            Method::POST,
            "/v1/teams/alpha/tokens",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "victim"})),
        )
        .await;
    v["id"].as_str().expect("id").to_owned()
}

async fn every_role_gets_exactly_its_rights_on_every_endpoint(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let t = tokens(&srv).await;
    let ok = StatusCode::OK;
    let created = StatusCode::CREATED;
    let gone = StatusCode::NO_CONTENT;
    let no = StatusCode::FORBIDDEN;
    let missing = StatusCode::NOT_FOUND;

    // (method, path template, body, expected for [admin, team, finance, agent]).
    // {job} is a fresh job of team alpha, {token} a fresh token id, {n} the role's index.
    let matrix: Vec<(Method, &str, Option<Value>, [StatusCode; 4])> = vec![
        (
            Method::POST,
            "/v1/teams",
            Some(json!({"name": "new-{n}"})),
            [created, no, no, no],
        ),
        (Method::GET, "/v1/teams", None, [ok, no, ok, no]),
        (Method::GET, "/v1/teams/alpha", None, [ok, ok, ok, no]),
        (
            Method::PATCH,
            "/v1/teams/alpha",
            Some(json!({"weight": 2})),
            [ok, no, no, no],
        ),
        (
            Method::POST,
            "/v1/teams/alpha/tokens",
            Some(json!({"name": "x"})),
            [created, no, no, no],
        ),
        (
            Method::GET,
            "/v1/teams/alpha/tokens",
            None,
            [ok, no, no, no],
        ),
        (
            Method::POST,
            "/v1/tokens",
            Some(json!({"name": "x", "role": "finance"})),
            [created, no, no, no],
        ),
        (Method::GET, "/v1/tokens", None, [ok, no, no, no]),
        (
            Method::DELETE,
            "/v1/tokens/{token}",
            None,
            [gone, no, no, no],
        ),
        (
            Method::POST,
            "/v1/jobs",
            Some(json!({"name": "j", "team": "alpha", "shape": {"gpus": 1}, "command": ["x"]})),
            [created, created, no, no],
        ),
        (Method::GET, "/v1/jobs", None, [ok, ok, no, no]),
        (Method::GET, "/v1/jobs/{job}", None, [ok, ok, no, no]),
        (
            Method::POST,
            "/v1/jobs/{job}/cancel",
            None,
            [ok, ok, no, no],
        ),
        (Method::GET, "/v1/jobs/{job}/events", None, [ok, ok, no, no]),
        (Method::GET, "/v1/nodes", None, [ok, no, ok, no]),
        (Method::GET, "/v1/offers", None, [ok, no, ok, no]),
        (Method::GET, "/v1/overview", None, [ok, no, ok, no]),
        (
            Method::POST,
            "/v1/webhooks",
            Some(
                json!({"url": "http://8.8.8.8/hook", "event_types": ["job.queued"], "team": "alpha"}),
            ),
            [created, created, no, no],
        ),
        (Method::GET, "/v1/webhooks", None, [ok, ok, no, no]),
        (Method::GET, "/v1/finance/summary", None, [ok, ok, ok, no]),
        (
            Method::GET,
            "/v1/finance/export.csv",
            None,
            [ok, ok, ok, no],
        ),
        (
            Method::GET,
            "/v1/teams/alpha/budget",
            None,
            [ok, ok, ok, no],
        ),
        (
            Method::PUT,
            "/v1/teams/alpha/budget",
            Some(json!({"monthly_usd": 100.0})),
            [ok, no, no, no],
        ),
        (
            Method::POST,
            "/v1/teams/alpha/secrets",
            Some(json!({"name": "s-{n}", "value": "v"})),
            [created, created, no, no],
        ),
        (
            Method::GET,
            "/v1/teams/alpha/secrets",
            None,
            [ok, ok, no, no],
        ),
        (
            Method::DELETE,
            "/v1/teams/alpha/secrets/absent",
            None,
            [missing, missing, no, no],
        ),
        // The node holds no allocation of a fresh job: its agent is told there is none.
        (
            Method::GET,
            "/v1/agent/jobs/{job}/secrets",
            None,
            [no, no, no, missing],
        ),
        // The simulated clouds' controls (the default configuration has them). No instance
        // runs here: an admin gets past the role check to "no such instance".
        (
            Method::POST,
            "/sim/control/aws/spot-outage?on=false",
            None,
            [ok, no, no, no],
        ),
        (
            Method::POST,
            "/sim/control/gcp/instances/none/preempt",
            None,
            [missing, no, no, no],
        ),
        (
            Method::POST,
            "/sim/control/azure/instances/none/vanish",
            None,
            [missing, no, no, no],
        ),
    ];
    for (method, template, body, expected) in &matrix {
        for role in [ADMIN, TEAM, FINANCE, AGENT] {
            let path = template
                .replace("{job}", &new_job(&srv).await)
                .replace("{token}", &new_victim_token(&srv).await);
            let body = body.as_ref().map(|b| {
                serde_json::from_str::<Value>(&b.to_string().replace("{n}", &role.to_string()))
                    .expect("json")
            });
            let (s, v) = srv
                .call(method.clone(), &path, Some(&t.by_role[role]), body.as_ref())
                .await;
            assert_eq!(
                s,
                expected[role],
                "{method} {template} as {}: {v}",
                ["admin", "team", "finance", "agent"][role]
            );
            if s == no {
                assert_eq!(v["type"], "urn:spotplane:problem:forbidden");
            }
            // Anonymous and forged callers get 401 everywhere.
            for bad in [None, Some("spt_forged"), Some(&*"x".repeat(600))] {
                let (s, _, v) = srv
                    .send(method.clone(), &path, bad, body.as_ref(), &[])
                    .await;
                assert_eq!(
                    s,
                    StatusCode::UNAUTHORIZED,
                    "{method} {template} with {bad:?}: {v}"
                );
            }
        }
    }
    // A forbidden caller gets 403 even when its body is bad: the role is checked first.
    let (s, _) = srv
        .call(
            Method::POST,
            "/v1/teams",
            Some(&t.by_role[FINANCE]),
            Some(&json!({"nonsense": true})),
        )
        .await;
    assert_eq!(s, no);

    for public in ["/healthz", "/readyz", "/metrics", "/v1/openapi.json"] {
        let (s, _, _) = srv.raw(Method::GET, public, None, None, &[]).await;
        assert_eq!(s, ok, "{public} needs no token");
    }
    srv.stop().await;
}

async fn bad_input_gets_a_problem_naming_the_field(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let token = srv.team_with_token("alpha").await;
    let base = json!({"name": "j", "shape": {"gpus": 1}, "command": ["x"]});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let without = |k: &str| {
        let mut b = base.clone();
        b.as_object_mut().expect("object").remove(k);
        b
    };
    let unprocessable: Vec<(Value, &str)> = vec![
        (without("name"), "name"),
        (without("shape"), "shape"),
        (without("command"), "command"),
        (with("name", json!(7)), "name"),
        (with("name", json!("Has Spaces")), "name"),
        (with("replicas", json!(0)), "replicas"),
        (with("replicas", json!(1025)), "replicas"),
        (with("replicas", json!("2")), "replicas"),
        (with("priority", json!("urgent")), "priority"),
        (with("priority", json!(-5)), "priority"),
        (with("shape", json!({"gpus": 17})), "shape.gpus"),
        (with("shape", json!({"gpu_milli": 0})), "shape.gpu_milli"),
        (with("shape", json!({"gpu_milli": 1001})), "shape.gpu_milli"),
        (
            with("shape", json!({"mig": "3g.40gb", "models": ["T4"]})),
            "shape.models[0]",
        ),
        (with("shape", json!({"mig": "banana"})), "shape.mig"),
        (
            with("shape", json!({"gpus": 1, "models": ["Z9000"]})),
            "shape.models[0]",
        ),
        (with("shape", json!({})), "shape"),
        (with("command", json!([])), "command"),
        (with("command", json!("python train.py")), "command"),
        (with("cpu_milli", json!(-1)), "cpu_milli"),
        (with("memory_mib", json!(1e30)), "memory_mib"),
        (
            with("env", json!({"SPOTPLANE_RESUME_DIR": "/x"})),
            "env.SPOTPLANE_RESUME_DIR",
        ),
        (with("env", json!({"1BAD": "x"})), "env.1BAD"),
        (
            with("checkpoint", json!({"uri": "ftp://x/y"})),
            "checkpoint.uri",
        ),
        (
            with("checkpoint", json!({"uri": "s3://b/p", "interval_s": 1})),
            "checkpoint.interval_s",
        ),
        (with("deadline", json!("2001-01-01T00:00:00Z")), "deadline"),
        (with("deadline", json!("tomorrow")), "deadline"),
        (with("max_hourly_usd", json!(-1)), "max_hourly_usd"),
        (with("max_hourly_usd", json!(0.0000001)), "max_hourly_usd"),
        (with("clouds", json!(["oracle"])), "clouds[0]"),
        (with("clouds", json!(["aws", "aws"])), "clouds[1]"),
        (with("regions", json!(["US East"])), "regions[0]"),
        (with("spot", json!("yes")), "spot"),
        (with("labels", json!({"k": 1})), "labels.k"),
        (with("surprise", json!(true)), "surprise"),
    ];
    for (body, field) in unprocessable {
        let (s, h, v) = srv
            .send(Method::POST, "/v1/jobs", Some(&token), Some(&body), &[])
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body} -> {v}");
        assert_eq!(v["field"].as_str(), Some(field), "{body} -> {v}");
        assert_eq!(
            h.get("content-type").and_then(|c| c.to_str().ok()),
            Some("application/problem+json")
        );
        assert!(v["errors"].as_array().is_some_and(|e| !e.is_empty()));
    }

    // All broken rules at once, not only the first.
    let (_, v) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(&token),
            Some(&json!({"name": "x", "replicas": 0, "shape": {"gpu_milli": 0}, "command": []})),
        )
        .await;
    let fields: Vec<_> = v["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| e["field"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(fields, ["replicas", "shape.gpu_milli", "command"]);

    let malformed = srv
        .raw(
            Method::POST,
            "/v1/jobs",
            Some(&token),
            Some(b"{\"name\": ".to_vec()),
            &[("content-type", "application/json")],
        )
        .await;
    assert_eq!(malformed.0, StatusCode::BAD_REQUEST, "{}", malformed.2);
    let not_json = srv
        .raw(
            Method::POST,
            "/v1/jobs",
            Some(&token),
            Some(b"name=x".to_vec()),
            &[("content-type", "application/x-www-form-urlencoded")],
        )
        .await;
    assert_eq!(not_json.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let no_type = srv
        .raw(
            Method::POST,
            "/v1/jobs",
            Some(&token),
            Some(base.to_string().into_bytes()),
            &[],
        )
        .await;
    assert_eq!(no_type.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let mut huge = base.clone();
    huge["env"] = json!({"BIG": "x".repeat(300 * 1024)});
    let (s, _, v) = srv
        .send(Method::POST, "/v1/jobs", Some(&token), Some(&huge), &[])
        .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(v["type"], "urn:spotplane:problem:payload-too-large");

    let (s, h, _) = srv.raw(Method::GET, "/v1/jobs", None, None, &[]).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(h.get("www-authenticate").is_some());
    for header in [
        "Basic YWxhZGRpbjpvcGVuc2VzYW1l",
        "Bearer",
        "Bearer ",
        "token abc",
    ] {
        let (s, _, _) = srv
            .raw(
                Method::GET,
                "/v1/jobs",
                None,
                None,
                &[("authorization", header)],
            )
            .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{header}");
    }
    let (_, v) = srv
        .call(Method::POST, "/v1/teams/alpha/tokens", Some(ADMIN_TOKEN), Some(&json!({"name": "soon", "expires_at": (chrono::Utc::now() + chrono::Duration::milliseconds(300)).to_rfc3339()})))
        .await;
    let expiring = v["token"].as_str().expect("token").to_owned();
    let (s, _) = srv
        .call(Method::GET, "/v1/jobs", Some(&expiring), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let (s, _) = srv
        .call(Method::GET, "/v1/jobs", Some(&expiring), None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "expired tokens stop working");

    let (s, h, v) = srv
        .raw(Method::GET, "/v2/nothing", Some(&token), None, &[])
        .await;
    assert_eq!(
        (s, v["status"].as_u64()),
        (StatusCode::NOT_FOUND, Some(404))
    );
    assert_eq!(
        h.get("content-type").and_then(|c| c.to_str().ok()),
        Some("application/problem+json")
    );
    let (s, _, v) = srv
        .raw(Method::PUT, "/v1/jobs", Some(&token), None, &[])
        .await;
    assert_eq!(
        (s, v["status"].as_u64()),
        (StatusCode::METHOD_NOT_ALLOWED, Some(405))
    );
    srv.stop().await;
}

#[tokio::test]
async fn the_openapi_document_describes_every_route() {
    let srv = TestServer::start(Backend::Sqlite).await;
    let (s, doc) = srv.call(Method::GET, "/v1/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let paths = doc["paths"].as_object().expect("paths");
    let expected = [
        ("/v1/teams", vec!["post", "get"]),
        ("/v1/teams/{team}", vec!["get", "patch"]),
        ("/v1/teams/{team}/tokens", vec!["post", "get"]),
        ("/v1/tokens", vec!["post", "get"]),
        ("/v1/tokens/{id}", vec!["delete"]),
        ("/v1/jobs", vec!["post", "get"]),
        ("/v1/jobs/{id}", vec!["get"]),
        ("/v1/jobs/{id}/cancel", vec!["post"]),
        ("/v1/jobs/{id}/events", vec!["get"]),
        ("/v1/nodes", vec!["get"]),
        ("/v1/offers", vec!["get"]),
        ("/v1/overview", vec!["get"]),
        ("/v1/webhooks", vec!["post", "get"]),
        ("/v1/webhooks/{id}", vec!["get", "patch", "delete"]),
        ("/v1/webhooks/{id}/rotate-secret", vec!["post"]),
        ("/v1/webhooks/{id}/ping", vec!["post"]),
        ("/v1/webhooks/{id}/deliveries", vec!["get"]),
        ("/v1/finance/summary", vec!["get"]),
        ("/v1/finance/export.csv", vec!["get"]),
        ("/v1/teams/{team}/budget", vec!["get", "put"]),
        ("/v1/jobs/{id}/checkpoints", vec!["get"]),
        ("/v1/nodes/{id}/bootstrap-token", vec!["post"]),
        ("/v1/nodes/{id}/commands", vec!["post", "get"]),
        ("/v1/nodes/{id}/agent", vec!["get"]),
        ("/v1/agent/register", vec!["post"]),
        ("/v1/agent/heartbeat", vec!["post"]),
        ("/v1/agent/commands/{id}/result", vec!["post"]),
        ("/v1/agent/checkpoints", vec!["post"]),
        ("/v1/teams/{team}/secrets", vec!["post", "get"]),
        ("/v1/teams/{team}/secrets/{name}", vec!["delete"]),
        ("/v1/agent/jobs/{job_id}/secrets", vec!["get"]),
        ("/v1/jobs/{id}/logs", vec!["get"]),
        ("/v1/agent/logs", vec!["post"]),
    ];
    let documented = expected.len();
    for (path, methods) in expected {
        for m in methods {
            assert!(
                paths.get(path).and_then(|p| p.get(m)).is_some(),
                "{m} {path} is documented"
            );
        }
    }
    assert_eq!(
        paths.len(),
        documented,
        "no undocumented extras: {:?}",
        paths.keys().collect::<Vec<_>>()
    );
    assert!(doc["components"]["schemas"]["JobSpec"].is_object());
    let log_params: Vec<&str> = doc["paths"]["/v1/jobs/{id}/logs"]["get"]["parameters"]
        .as_array()
        .map(|ps| ps.iter().filter_map(|p| p["name"].as_str()).collect())
        .unwrap_or_default();
    for p in ["id", "replica", "attempt", "follow", "tail"] {
        assert!(log_params.contains(&p), "{p} in {log_params:?}");
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    srv.stop().await;
}

#[tokio::test]
async fn metrics_record_store_operations_and_requests() {
    let srv = TestServer::start(Backend::Sqlite).await;
    srv.call(Method::GET, "/v1/teams", Some(ADMIN_TOKEN), None)
        .await;
    let resp = reqwest::get(format!("{}/metrics", srv.url))
        .await
        .expect("metrics");
    let text = resp.text().await.expect("text");
    assert!(
        text.contains("spotplane_store_operation_seconds_count{op=\"list_teams\",outcome=\"ok\"}"),
        "{text}"
    );
    assert!(text.contains("route=\"/v1/teams\""), "{text}");
    srv.stop().await;
}
