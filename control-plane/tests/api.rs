//! The REST API against a real server on SQLite and on PostgreSQL.

mod common;

use common::{ADMIN_TOKEN, Backend, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

fn job(name: &str) -> Value {
    json!({"name": name, "shape": {"gpus": 1}, "command": ["python", "train.py"]})
}

on_both_databases!(
    migrations_apply_once_and_report_nothing_pending,
    teams_are_created_listed_read_and_updated,
    team_settings_are_validated_field_by_field,
    tokens_are_shown_once_listed_without_secrets_and_revocable,
    the_last_admin_token_cannot_be_revoked,
    jobs_are_submitted_listed_read_cancelled_and_have_history,
    job_lists_filter_by_state_and_paginate,
    a_team_token_cannot_see_or_touch_another_teams_jobs,
    admins_must_name_an_existing_team_when_submitting,
    idempotent_submit_returns_the_first_job,
    concurrent_submissions_with_one_key_make_one_job,
    every_job_change_is_in_the_outbox,
    nodes_and_offers_are_listed_with_their_gpus,
);

async fn migrations_apply_once_and_report_nothing_pending(backend: Backend) {
    let srv = TestServer::start(backend).await;
    assert!(
        srv.store()
            .pending_migrations()
            .await
            .expect("status")
            .is_empty()
    );
    srv.store()
        .migrate()
        .await
        .expect("a second migrate is a no-op");
    let (s, v) = srv.call(Method::GET, "/readyz", None, None).await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("ready")));
    srv.stop().await;
}

async fn teams_are_created_listed_read_and_updated(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let body = json!({"name": "research", "weight": 2.0, "cohort": "ml",
        "quotas": {"H100-80GB": {"nominal": 8, "borrowing_limit": 4}, "nvidia.com/mig-3g.40gb": {"nominal": 2}}});
    let (s, h, v) = srv
        .send(
            Method::POST,
            "/v1/teams",
            Some(ADMIN_TOKEN),
            Some(&body),
            &[],
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(
        h.get("location").and_then(|l| l.to_str().ok()),
        Some("/v1/teams/research")
    );
    assert_eq!(
        v["quotas"]["mig-3g.40gb"]["nominal"], 2,
        "MIG quota keys are normalised: {v}"
    );
    assert!(v.get("id").is_none(), "internal ids stay internal");

    let (s, v) = srv
        .call(Method::POST, "/v1/teams", Some(ADMIN_TOKEN), Some(&body))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");

    let (s, v) = srv
        .call(Method::GET, "/v1/teams", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["items"].as_array().map(Vec::len), Some(1));

    let patch = json!({"weight": 3.5, "cohort": null, "quotas": {"A100-80GB": {"nominal": 1}}});
    let (s, v) = srv
        .call(
            Method::PATCH,
            "/v1/teams/research",
            Some(ADMIN_TOKEN),
            Some(&patch),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["weight"], 3.5);
    assert_eq!(v["cohort"], Value::Null);
    assert_eq!(v["quotas"], json!({"A100-80GB": {"nominal": 1}}));

    let (s, v) = srv
        .call(
            Method::PATCH,
            "/v1/teams/research",
            Some(ADMIN_TOKEN),
            Some(&json!({"cohort": "x"})),
        )
        .await;
    assert_eq!(
        (s, v["weight"].as_f64(), v["cohort"].as_str()),
        (StatusCode::OK, Some(3.5), Some("x"))
    );

    let (s, _) = srv
        .call(Method::GET, "/v1/teams/nope", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = srv
        .call(
            Method::PATCH,
            "/v1/teams/nope",
            Some(ADMIN_TOKEN),
            Some(&json!({"weight": 1})),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    srv.stop().await;
}

async fn team_settings_are_validated_field_by_field(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let cases = [
        (json!({"name": "Bad Name"}), "name"),
        (json!({"name": "a", "weight": 0}), "weight"),
        (json!({"name": "a", "weight": "heavy"}), "weight"),
        (json!({"name": "a", "cohort": "UPPER"}), "cohort"),
        (
            json!({"name": "a", "quotas": {"Z9000": {"nominal": 1}}}),
            "quotas.Z9000",
        ),
        (
            json!({"name": "a", "quotas": {"T4": {"nominal": 1, "lending_limit": 2}}}),
            "quotas.T4.lending_limit",
        ),
        (
            json!({"name": "a", "quotas": {"T4": {"nominal": -1}}}),
            "quotas.T4.nominal",
        ),
        (json!({"name": "a", "colour": "red"}), "colour"),
        (json!({}), "name"),
    ];
    for (body, field) in cases {
        let (s, v) = srv
            .call(Method::POST, "/v1/teams", Some(ADMIN_TOKEN), Some(&body))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body} -> {v}");
        assert_eq!(v["field"].as_str(), Some(field), "{body} -> {v}");
        assert_eq!(v["type"], "urn:spotplane:problem:validation");
    }
    srv.stop().await;
}

async fn tokens_are_shown_once_listed_without_secrets_and_revocable(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let team_token = srv.team_with_token("research").await;
    assert!(team_token.starts_with("spt_"));
    let (s, _) = srv
        .call(Method::GET, "/v1/jobs", Some(&team_token), None)
        .await;
    assert_eq!(s, StatusCode::OK);

    let (s, v) = srv
        .call(
            Method::GET,
            "/v1/teams/research/tokens",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let listed = &v["items"][0];
    assert!(
        listed.get("token").is_none(),
        "secrets are never listed: {listed}"
    );
    assert_eq!(listed["role"], "team");
    assert_eq!(listed["team"], "research");
    assert!(team_token.starts_with(listed["prefix"].as_str().expect("prefix")));
    let id = listed["id"].as_str().expect("id").to_owned();

    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/tokens",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "fin", "role": "finance"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let finance = v["token"].as_str().expect("secret").to_owned();
    let (s, _) = srv
        .call(Method::GET, "/v1/teams", Some(&finance), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = srv
        .call(Method::GET, "/v1/tokens", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(
        (s, v["items"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(3))
    );

    for (role, why) in [
        ("team", "teams/{team}/tokens"),
        ("agent", "issued by the control plane"),
    ] {
        let (s, v) = srv
            .call(
                Method::POST,
                "/v1/tokens",
                Some(ADMIN_TOKEN),
                Some(&json!({"name": "x", "role": role})),
            )
            .await;
        assert_eq!(
            (s, v["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("role")),
            "{v}"
        );
        assert!(
            v["detail"].as_str().unwrap_or_default().contains(why),
            "{v}"
        );
    }
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/teams/research/tokens",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "old", "expires_at": "2001-01-01T00:00:00Z"})),
        )
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("expires_at"))
    );

    let (s, _) = srv
        .call(
            Method::DELETE,
            &format!("/v1/tokens/{id}"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = srv
        .call(
            Method::DELETE,
            &format!("/v1/tokens/{id}"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "revoking twice is fine");
    let (s, v) = srv
        .call(Method::GET, "/v1/jobs", Some(&team_token), None)
        .await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "a revoked token stops working: {v}"
    );
    let (s, _) = srv
        .call(
            Method::DELETE,
            "/v1/tokens/0192d4e0-0000-7000-8000-000000000000",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    srv.stop().await;
}

async fn the_last_admin_token_cannot_be_revoked(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (_, v) = srv
        .call(Method::GET, "/v1/tokens", Some(ADMIN_TOKEN), None)
        .await;
    let id = v["items"][0]["id"]
        .as_str()
        .expect("bootstrap token listed")
        .to_owned();
    let (s, v) = srv
        .call(
            Method::DELETE,
            &format!("/v1/tokens/{id}"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/tokens",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "second", "role": "admin"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let second = v["token"].as_str().expect("secret").to_owned();
    let (s, _) = srv
        .call(
            Method::DELETE,
            &format!("/v1/tokens/{id}"),
            Some(&second),
            None,
        )
        .await;
    assert_eq!(
        s,
        StatusCode::NO_CONTENT,
        "with a second admin the first may go"
    );
    let (s, _) = srv
        .call(Method::GET, "/v1/tokens", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    srv.stop().await;
}

async fn jobs_are_submitted_listed_read_cancelled_and_have_history(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let token = srv.team_with_token("research").await;
    let spec = json!({"name": "llama-ft", "priority": "fine-tune", "replicas": 2, "shape": {"mig": "3g.40gb"},
        "cpu_milli": 8000, "memory_mib": 32768, "command": ["python", "train.py"], "image": "ghcr.io/acme/train:1",
        "env": {"EPOCHS": "3"}, "checkpoint": {"uri": "s3://bucket/prefix", "interval_s": 600},
        "deadline": "2030-12-01T00:00:00Z", "max_hourly_usd": 12.5, "spot": true, "clouds": ["aws", "gcp"],
        "regions": ["us-east-1"], "labels": {"project": "llama"}});
    let (s, h, v) = srv
        .send(Method::POST, "/v1/jobs", Some(&token), Some(&spec), &[])
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    assert_eq!(
        h.get("location").and_then(|l| l.to_str().ok()),
        Some(format!("/v1/jobs/{id}").as_str())
    );
    assert_eq!(v["state"], "queued");
    assert_eq!(v["team"], "research");
    for (k, want) in spec.as_object().expect("object") {
        assert_eq!(&v[k], want, "field {k} round-trips");
    }

    let (s, got) = srv
        .call(Method::GET, &format!("/v1/jobs/{id}"), Some(&token), None)
        .await;
    assert_eq!((s, &got), (StatusCode::OK, &v));

    let (s, list) = srv.call(Method::GET, "/v1/jobs", Some(&token), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list["items"][0]["id"], id.as_str());

    let (s, v) = srv
        .call(
            Method::POST,
            &format!("/v1/jobs/{id}/cancel"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(
        (s, v["state"].as_str()),
        (StatusCode::OK, Some("cancelled")),
        "{v}"
    );
    assert!(v["finished_at"].is_string());
    let (s, v) = srv
        .call(
            Method::POST,
            &format!("/v1/jobs/{id}/cancel"),
            Some(&token),
            Some(&json!({"reason": "again"})),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::CONFLICT,
        "a finished job cannot be cancelled: {v}"
    );

    let (s, ev) = srv
        .call(
            Method::GET,
            &format!("/v1/jobs/{id}/events"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let kinds: Vec<_> = ev["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["job.queued", "job.cancelled"]);
    assert_eq!(ev["items"][1]["from_state"], "queued");
    assert_eq!(ev["items"][1]["to_state"], "cancelled");

    let (s, _) = srv
        .call(
            Method::GET,
            "/v1/jobs/0192d4e0-0000-7000-8000-000000000000",
            Some(&token),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = srv
        .call(Method::GET, "/v1/jobs/not-an-id", Some(&token), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    srv.stop().await;
}

async fn job_lists_filter_by_state_and_paginate(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let token = srv.team_with_token("research").await;
    let mut ids = Vec::new();
    for i in 0..7 {
        let (s, v) = srv
            .call(
                Method::POST,
                "/v1/jobs",
                Some(&token),
                Some(&job(&format!("j{i}"))),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED);
        ids.push(v["id"].as_str().expect("id").to_owned());
    }
    for id in &ids[..2] {
        let (s, _) = srv
            .call(
                Method::POST,
                &format!("/v1/jobs/{id}/cancel"),
                Some(&token),
                None,
            )
            .await;
        assert_eq!(s, StatusCode::OK);
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/jobs?limit=3&cursor={c}"),
            None => "/v1/jobs?limit=3".to_owned(),
        };
        let (s, page) = srv.call(Method::GET, &path, Some(&token), None).await;
        assert_eq!(s, StatusCode::OK, "{page}");
        seen.extend(
            page["items"]
                .as_array()
                .expect("items")
                .iter()
                .map(|j| j["id"].as_str().unwrap_or("").to_owned()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let mut newest_first = ids.clone();
    newest_first.sort();
    newest_first.reverse();
    assert_eq!(seen, newest_first, "every job once, newest first");

    let (_, page) = srv
        .call(Method::GET, "/v1/jobs?state=cancelled", Some(&token), None)
        .await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(2));
    let (_, page) = srv
        .call(
            Method::GET,
            "/v1/jobs?state=queued,cancelled",
            Some(&token),
            None,
        )
        .await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(7));

    // A bad filter value is 422; bad paging is 400, as on every list.
    for (q, status, field) in [
        ("state=sleeping", StatusCode::UNPROCESSABLE_ENTITY, "state"),
        ("limit=0", StatusCode::BAD_REQUEST, "limit"),
        ("limit=501", StatusCode::BAD_REQUEST, "limit"),
        ("cursor=zzz", StatusCode::BAD_REQUEST, "cursor"),
    ] {
        let (s, v) = srv
            .call(Method::GET, &format!("/v1/jobs?{q}"), Some(&token), None)
            .await;
        assert_eq!((s, v["field"].as_str()), (status, Some(field)), "{q}: {v}");
    }
    for (q, field) in [("limit=many", "limit"), ("colour=red", "query.colour")] {
        let (s, v) = srv
            .call(Method::GET, &format!("/v1/jobs?{q}"), Some(&token), None)
            .await;
        assert_eq!(
            (s, v["field"].as_str()),
            (StatusCode::BAD_REQUEST, Some(field)),
            "{q}: {v}"
        );
    }
    srv.stop().await;
}

async fn a_team_token_cannot_see_or_touch_another_teams_jobs(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let alice = srv.team_with_token("alice").await;
    let bob = srv.team_with_token("bob").await;
    let (_, v) = srv
        .call(Method::POST, "/v1/jobs", Some(&alice), Some(&job("secret")))
        .await;
    let id = v["id"].as_str().expect("id").to_owned();
    for (method, path) in [
        (Method::GET, format!("/v1/jobs/{id}")),
        (Method::POST, format!("/v1/jobs/{id}/cancel")),
        (Method::GET, format!("/v1/jobs/{id}/events")),
        (Method::GET, "/v1/teams/alice".to_owned()),
    ] {
        let (s, v) = srv.call(method.clone(), &path, Some(&bob), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{method} {path}: {v}");
    }
    let (_, page) = srv.call(Method::GET, "/v1/jobs", Some(&bob), None).await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(0));
    let (_, page) = srv
        .call(Method::GET, "/v1/jobs?team=alice", Some(&bob), None)
        .await;
    assert_eq!(
        page["items"].as_array().map(Vec::len),
        Some(0),
        "a team filter cannot widen a team token's view"
    );
    let mut other = job("sneaky");
    other["team"] = json!("alice");
    let (s, _) = srv
        .call(Method::POST, "/v1/jobs", Some(&bob), Some(&other))
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, v) = srv
        .call(Method::GET, &format!("/v1/jobs/{id}"), Some(&alice), None)
        .await;
    assert_eq!((s, v["state"].as_str()), (StatusCode::OK, Some("queued")));
    let (s, _) = srv
        .call(Method::GET, "/v1/teams/bob", Some(&bob), None)
        .await;
    assert_eq!(s, StatusCode::OK, "a team reads itself");
    srv.stop().await;
}

async fn admins_must_name_an_existing_team_when_submitting(backend: Backend) {
    let srv = TestServer::start(backend).await;
    srv.team_with_token("research").await;
    let (s, v) = srv
        .call(Method::POST, "/v1/jobs", Some(ADMIN_TOKEN), Some(&job("a")))
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("team"))
    );
    let mut named = job("a");
    named["team"] = json!("nobody");
    let (s, v) = srv
        .call(Method::POST, "/v1/jobs", Some(ADMIN_TOKEN), Some(&named))
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("team"))
    );
    named["team"] = json!("research");
    let (s, v) = srv
        .call(Method::POST, "/v1/jobs", Some(ADMIN_TOKEN), Some(&named))
        .await;
    assert_eq!(
        (s, v["team"].as_str()),
        (StatusCode::CREATED, Some("research"))
    );
    let (_, page) = srv
        .call(
            Method::GET,
            "/v1/jobs?team=research",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1));
    let (s, _) = srv
        .call(Method::GET, "/v1/jobs?team=nobody", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    srv.stop().await;
}

async fn idempotent_submit_returns_the_first_job(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let token = srv.team_with_token("research").await;
    let key = [("idempotency-key", "run-42")];
    let (s1, h1, first) = srv
        .send(
            Method::POST,
            "/v1/jobs",
            Some(&token),
            Some(&job("a")),
            &key,
        )
        .await;
    assert_eq!(s1, StatusCode::CREATED);
    assert!(h1.get("idempotent-replayed").is_none());
    // Same content, different whitespace and field order: the same request.
    let reordered =
        br#"{ "command": ["python", "train.py"],   "shape": {"gpus": 1}, "name": "a" }"#.to_vec();
    let (s2, h2, again) = srv
        .raw(
            Method::POST,
            "/v1/jobs",
            Some(&token),
            Some(reordered),
            &[("content-type", "application/json"), key[0]],
        )
        .await;
    assert_eq!(s2, StatusCode::OK);
    assert_eq!(
        h2.get("idempotent-replayed").and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(again["id"], first["id"]);

    let (s3, _, v) = srv
        .send(
            Method::POST,
            "/v1/jobs",
            Some(&token),
            Some(&job("b")),
            &key,
        )
        .await;
    assert_eq!(
        (s3, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("Idempotency-Key")),
        "{v}"
    );

    // Keys are per team: another team may use the same key.
    let other = srv.team_with_token("other").await;
    let (s4, _, v4) = srv
        .send(
            Method::POST,
            "/v1/jobs",
            Some(&other),
            Some(&job("a")),
            &key,
        )
        .await;
    assert_eq!(s4, StatusCode::CREATED);
    assert_ne!(v4["id"], first["id"]);

    for bad in ["", &"k".repeat(256), "has space"] {
        let (s, _, v) = srv
            .send(
                Method::POST,
                "/v1/jobs",
                Some(&token),
                Some(&job("a")),
                &[("idempotency-key", bad)],
            )
            .await;
        assert_eq!(
            (s, v["field"].as_str()),
            (StatusCode::BAD_REQUEST, Some("Idempotency-Key")),
            "{bad:?}"
        );
    }
    let (_, page) = srv.call(Method::GET, "/v1/jobs", Some(&token), None).await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1));
    srv.stop().await;
}

async fn concurrent_submissions_with_one_key_make_one_job(backend: Backend) {
    let srv = std::sync::Arc::new(TestServer::start(backend).await);
    let token = srv.team_with_token("research").await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let srv = srv.clone();
        let token = token.clone();
        tasks.push(tokio::spawn(async move {
            let (s, _, v) = srv
                .send(
                    Method::POST,
                    "/v1/jobs",
                    Some(&token),
                    Some(&job("same")),
                    &[("idempotency-key", "race")],
                )
                .await;
            (s, v["id"].as_str().unwrap_or_default().to_owned())
        }));
    }
    let mut ids = std::collections::BTreeSet::new();
    let mut created = 0;
    for t in tasks {
        let (s, id) = t.await.expect("task");
        assert!(s == StatusCode::CREATED || s == StatusCode::OK, "{s}");
        created += usize::from(s == StatusCode::CREATED);
        ids.insert(id);
    }
    assert_eq!((created, ids.len()), (1, 1));
    let srv = std::sync::Arc::into_inner(srv).expect("sole owner");
    srv.stop().await;
}

async fn every_job_change_is_in_the_outbox(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let token = srv.team_with_token("research").await;
    let (_, v) = srv
        .call(Method::POST, "/v1/jobs", Some(&token), Some(&job("a")))
        .await;
    let id = v["id"].as_str().expect("id").to_owned();
    srv.call(
        Method::POST,
        &format!("/v1/jobs/{id}/cancel"),
        Some(&token),
        None,
    )
    .await;
    let events = srv.store().outbox_after(0, 100).await.expect("outbox");
    let kinds: Vec<_> = events
        .iter()
        .filter(|e| e.subject_id == id)
        .map(|e| e.kind.as_str())
        .collect();
    assert_eq!(kinds, ["job.queued", "job.cancelled"]);
    let last = events.last().expect("event");
    assert_eq!(last.payload["job"]["state"], "cancelled");
    assert_eq!(last.payload["from_state"], "queued");
    assert!(events.windows(2).all(|w| w[0].id < w[1].id));
    srv.stop().await;
}

async fn nodes_and_offers_are_listed_with_their_gpus(backend: Backend) {
    use spotplane::store::{NewGpu, NewNode};
    use spotplane_core::{Cloud, GpuModel, Market, Micros, MigLayout, NodeId};
    use spotplane_providers::Offer;
    let srv = TestServer::start(backend).await;
    let now = chrono::Utc::now();
    let id = NodeId(uuid::Uuid::now_v7());
    let gpus = (0..2)
        .map(|i| NewGpu {
            model: GpuModel::H100_80GB,
            memory_mib: 81_559,
            mig_enabled: i == 0,
            mig_layout: if i == 0 {
                MigLayout::full()
            } else {
                MigLayout::empty()
            },
        })
        .collect();
    srv.store()
        .create_node(
            NewNode {
                id,
                name: "sim-aws-1".into(),
                cloud: Cloud::Aws,
                region: "us-east-1".into(),
                zone: "us-east-1a".into(),
                instance_type: "p5.48xlarge".into(),
                market: Market::Spot,
                offer_id: None,
                client_token: "ct-1".into(),
                hourly_price: Micros::parse_usd("35.5").expect("price"),
                on_demand_price: Micros::parse_usd("98.32").expect("price"),
                cpu_milli: 192_000,
                memory_mib: 2_097_152,
                gpus,
                labels: Default::default(),
            },
            now,
        )
        .await
        .expect("node stored");
    srv.store()
        .upsert_offers(
            &[Offer {
                cloud: Cloud::Aws,
                region: "us-east-1".into(),
                zone: "use1-az1".into(),
                instance_type: "g5.xlarge".into(),
                market: Market::Spot,
                gpu_model: Some(GpuModel::A10G),
                gpu_count: 1,
                vcpus: 4,
                memory_mib: 16_384,
                price: Micros::parse_usd("0.4121").expect("price"),
                on_demand_price: Micros::parse_usd("1.006").expect("price"),
                placement_score: Some(3.0),
                interruption_bucket: Some("<5%".into()),
                price_source: spotplane_providers::PriceSource::Catalog,
                on_demand_source: spotplane_providers::PriceSource::Catalog,
            }],
            now,
        )
        .await
        .expect("offers stored");
    let (s, v) = srv
        .call(Method::GET, "/v1/nodes", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let node = &v["items"][0];
    assert_eq!(node["state"], "requested");
    assert_eq!(node["hourly_price_usd"], 35.5);
    assert_eq!(node["gpus"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        node["gpus"][0]["mig_layout"],
        json!([{"class": "7g", "start": 0}])
    );
    let (_, v) = srv
        .call(
            Method::GET,
            "/v1/nodes?state=ready",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(v["items"].as_array().map(Vec::len), Some(0));
    let (s, v) = srv
        .call(
            Method::GET,
            "/v1/nodes?state=melted",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("state"))
    );
    let (s, v) = srv
        .call(Method::GET, "/v1/offers", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["items"][0]["price_usd"], 0.4121);
    assert_eq!(v["items"][0]["gpu_model"], "A10G");
    let events = srv.store().outbox_after(0, 10).await.expect("outbox");
    assert!(
        events
            .iter()
            .any(|e| e.kind == "node.requested" && e.subject_id == id.to_string())
    );
    srv.stop().await;
}
