//! Team secrets on SQLite and PostgreSQL: set, replaced, listed and deleted through the API
//! without their values ever coming back; scoped to their team; checked when a job refers to
//! them; sealed in the database (no plaintext, and a wrong key, an altered row or a row moved
//! to another team or name does not open); and handed out only to the agent of a node that
//! holds the job.

mod common;

use common::{ADMIN_TOKEN, Backend, TestDb, TestServer};
use reqwest::{Method, StatusCode};
use sea_orm::{ActiveModelTrait, ConnectOptions, EntityTrait, Set};
use serde_json::{Value, json};
use spotplane::metrics::Metrics;
use spotplane::scheduler::{Assigned, Placement};
use spotplane::secrets::{KeyText, SecretsKey};
use spotplane::store::entity::{team_secret, webhook_subscription};
use spotplane::store::{NewSubscription, NewTeam, SecretWrite, Store, StoreError};
use spotplane::webhooks::EventType;
use spotplane::webhooks::signing::{Secret, signature_header};
use spotplane_core::{JobId, NodeId};

on_both_databases!(
    team_secrets_are_set_listed_and_deleted_and_their_values_never_come_back,
    a_team_sees_and_touches_only_its_own_secrets,
    bad_secrets_get_a_problem_naming_the_field_and_never_quoting_the_value,
    a_job_must_name_secrets_its_team_has,
    stored_secrets_hold_no_plaintext_and_open_only_with_their_key_team_and_name,
    only_the_node_holding_the_job_gets_its_secrets,
    a_clear_webhook_secret_from_before_sealing_still_signs_and_is_sealed_at_start,
    after_a_key_rotation_everything_opens_and_reseal_moves_it_to_the_new_key,
);

fn secrets_path(team: &str) -> String {
    format!("/v1/teams/{team}/secrets")
}

async fn put(
    srv: &TestServer,
    token: &str,
    team: &str,
    name: &str,
    value: &str,
) -> (StatusCode, Value) {
    srv.call(
        Method::POST,
        &secrets_path(team),
        Some(token),
        Some(&json!({"name": name, "value": value})),
    )
    .await
}

/// A value no test could come upon by chance.
fn value(what: &str) -> String {
    format!("{what}-{}", uuid::Uuid::now_v7().simple())
}

async fn team_secrets_are_set_listed_and_deleted_and_their_values_never_come_back(
    backend: Backend,
) {
    let srv = TestServer::start(backend).await;
    let alpha = srv.team_with_token("alpha").await;
    let (v1, v2, v3) = (value("hf"), value("hf-rotated"), value("wandb"));

    let (s, created) = put(&srv, &alpha, "alpha", "hf-token", &v1).await;
    assert_eq!(s, StatusCode::CREATED, "{created}");
    let keys: Vec<&str> = created
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    assert_eq!(keys, ["created_at", "name", "updated_at"], "{created}");
    assert_eq!(created["name"], "hf-token");

    let (s, replaced) = put(&srv, &alpha, "alpha", "hf-token", &v2).await;
    assert_eq!(s, StatusCode::OK, "replaced: {replaced}");
    assert_eq!(replaced["created_at"], created["created_at"]);
    assert!(
        replaced["updated_at"].as_str() >= created["updated_at"].as_str(),
        "{replaced}"
    );
    let (s, v) = put(&srv, ADMIN_TOKEN, "alpha", "wandb", &v3).await;
    assert_eq!(s, StatusCode::CREATED, "an admin sets any team's: {v}");

    let (s, list) = srv
        .call(Method::GET, &secrets_path("alpha"), Some(&alpha), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let names: Vec<&str> = list["items"]
        .as_array()
        .map(|a| a.iter().filter_map(|i| i["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, ["hf-token", "wandb"]);
    let (_, first) = srv
        .call(
            Method::GET,
            &format!("{}?limit=1", secrets_path("alpha")),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(first["items"][0]["name"], "hf-token");
    let cursor = first["next_cursor"].as_str().expect("a next page");
    let (_, second) = srv
        .call(
            Method::GET,
            &format!("{}?limit=1&cursor={cursor}", secrets_path("alpha")),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(second["items"][0]["name"], "wandb");
    assert!(second["next_cursor"].is_null(), "{second}");
    let (s, v) = srv
        .call(
            Method::GET,
            &format!("{}?cursor=Not%20A%20Name", secrets_path("alpha")),
            Some(&alpha),
            None,
        )
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("cursor")),
        "{v}"
    );

    let (s, _) = srv
        .call(
            Method::DELETE,
            &format!("{}/hf-token", secrets_path("alpha")),
            Some(&alpha),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v) = srv
        .call(
            Method::DELETE,
            &format!("{}/hf-token", secrets_path("alpha")),
            Some(&alpha),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "deleted once: {v}");
    let (_, list) = srv
        .call(Method::GET, &secrets_path("alpha"), Some(&alpha), None)
        .await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1), "{list}");

    // No answer of any of these routes held a value, nor does the OpenAPI document list one.
    let seen = [created, replaced, list, first, second].map(|v| v.to_string());
    for text in &seen {
        for secret in [&v1, &v2, &v3] {
            assert!(!text.contains(secret.as_str()), "{text}");
        }
    }
    let (_, doc) = srv.call(Method::GET, "/v1/openapi.json", None, None).await;
    for p in [
        "/v1/teams/{team}/secrets",
        "/v1/teams/{team}/secrets/{name}",
        "/v1/agent/jobs/{job_id}/secrets",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} is documented");
    }
    srv.stop().await;
}

async fn a_team_sees_and_touches_only_its_own_secrets(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let alpha = srv.team_with_token("alpha").await;
    let beta = srv.team_with_token("beta").await;
    let v = value("alpha-only");
    assert_eq!(
        put(&srv, &alpha, "alpha", "key", &v).await.0,
        StatusCode::CREATED
    );

    // Beta's token: alpha is a team it cannot see.
    let (s, b) = put(&srv, &beta, "alpha", "key", "overwritten").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
    for (method, path) in [
        (Method::GET, secrets_path("alpha")),
        (Method::DELETE, format!("{}/key", secrets_path("alpha"))),
    ] {
        let (s, b) = srv.call(method.clone(), &path, Some(&beta), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{method} {path}: {b}");
    }
    // Beta's own list is empty; alpha's secret is still there, unchanged in name and time.
    let (_, own) = srv
        .call(Method::GET, &secrets_path("beta"), Some(&beta), None)
        .await;
    assert_eq!(own["items"], json!([]));
    let (_, list) = srv
        .call(Method::GET, &secrets_path("alpha"), Some(&alpha), None)
        .await;
    assert_eq!(list["items"][0]["name"], "key");
    assert_eq!(
        list["items"][0]["created_at"],
        list["items"][0]["updated_at"]
    );

    // No team at all, and roles without a team's business here.
    let (s, _) = put(&srv, ADMIN_TOKEN, "nobody", "key", "v").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, tok) = srv
        .call(
            Method::POST,
            "/v1/tokens",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "books", "role": "finance"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{tok}");
    let finance = tok["token"].as_str().expect("token");
    let (s, _) = srv
        .call(Method::GET, &secrets_path("alpha"), Some(finance), None)
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = srv
        .call(Method::GET, &secrets_path("alpha"), None, None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    srv.stop().await;
}

async fn bad_secrets_get_a_problem_naming_the_field_and_never_quoting_the_value(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let alpha = srv.team_with_token("alpha").await;
    let long = format!("{}{}", value("long"), "z".repeat(64 * 1024));
    let cases = [
        (json!({"name": "Not A Name", "value": "v"}), "name"),
        (json!({"name": "ok", "value": long}), "value"),
        (
            json!({"name": "ok", "value": "before\u{0}after-nul"}),
            "value",
        ),
        (json!({"name": "ok", "value": ""}), "value"),
        (json!({"name": "ok"}), "value"),
        (json!({"value": "v"}), "name"),
        (json!({"name": "ok", "value": 5}), "value"),
        (json!({"name": "ok", "value": "v", "vaule": "v"}), "vaule"),
    ];
    for (body, field) in cases {
        let (s, _, v) = srv
            .send(
                Method::POST,
                &secrets_path("alpha"),
                Some(&alpha),
                Some(&body),
                &[],
            )
            .await;
        assert_eq!(
            (s, v["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(field)),
            "{v}"
        );
        if let Some(text) = body["value"].as_str().filter(|t| t.len() > 1) {
            let problem = v.to_string();
            assert!(!problem.contains(&text[..text.len().min(40)]), "{problem}");
            assert!(!problem.contains("after-nul"), "{problem}");
        }
    }
    let (_, list) = srv
        .call(Method::GET, &secrets_path("alpha"), Some(&alpha), None)
        .await;
    assert_eq!(list["items"], json!([]), "nothing was stored");
    srv.stop().await;
}

async fn a_job_must_name_secrets_its_team_has(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let alpha = srv.team_with_token("alpha").await;
    let beta = srv.team_with_token("beta").await;
    let token = value("hf");
    assert_eq!(
        put(&srv, &alpha, "alpha", "hf-token", &token).await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        put(&srv, &alpha, "alpha", "registry", "robot:pa:ss")
            .await
            .0,
        StatusCode::CREATED
    );
    assert_eq!(
        put(&srv, &alpha, "alpha", "not-a-login", "no-colon-here")
            .await
            .0,
        StatusCode::CREATED
    );
    assert_eq!(
        put(&srv, &beta, "beta", "beta-only", "b").await.0,
        StatusCode::CREATED
    );
    let job = |extra: Value| {
        let mut j = json!({"name": "train", "shape": {"gpus": 1}, "command": ["train"]});
        if let (Some(o), Some(e)) = (j.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        j
    };
    let cases = [
        (json!({"secrets": {"HF_TOKEN": "hf-token"}}), None),
        (
            json!({"image": "ghcr.io/acme/train:1", "image_pull_secret": "registry", "secrets": {"HF_TOKEN": "hf-token"}}),
            None,
        ),
        (
            json!({"secrets": {"HF_TOKEN": "gone"}}),
            Some("secrets.HF_TOKEN"),
        ),
        (json!({"secrets": {"B": "beta-only"}}), Some("secrets.B")),
        (
            json!({"image": "ghcr.io/acme/train:1", "image_pull_secret": "absent"}),
            Some("image_pull_secret"),
        ),
        (
            json!({"image": "ghcr.io/acme/train:1", "image_pull_secret": "not-a-login"}),
            Some("image_pull_secret"),
        ),
    ];
    let mut accepted = Vec::new();
    for (extra, field) in cases {
        let (s, v) = srv
            .call(
                Method::POST,
                "/v1/jobs",
                Some(&alpha),
                Some(&job(extra.clone())),
            )
            .await;
        match field {
            None => {
                assert_eq!(s, StatusCode::CREATED, "{extra}: {v}");
                accepted.push(v);
            }
            Some(f) => {
                assert_eq!(
                    (s, v["field"].as_str()),
                    (StatusCode::UNPROCESSABLE_ENTITY, Some(f)),
                    "{extra}: {v}"
                );
                assert!(!v.to_string().contains("no-colon-here"), "{v}");
            }
        }
    }
    // Two missing at once: both named.
    let (_, v) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(&alpha),
            Some(&job(json!({"secrets": {"A": "gone-a", "B": "gone-b"}}))),
        )
        .await;
    let fields: Vec<&str> = v["errors"]
        .as_array()
        .map(|e| e.iter().filter_map(|e| e["field"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(fields, ["secrets.A", "secrets.B"], "{v}");

    // The job keeps the names only.
    let id = accepted[1]["id"].as_str().expect("id");
    let (_, read) = srv
        .call(Method::GET, &format!("/v1/jobs/{id}"), Some(&alpha), None)
        .await;
    assert_eq!(read["secrets"], json!({"HF_TOKEN": "hf-token"}), "{read}");
    assert_eq!(read["image_pull_secret"], "registry");
    for v in accepted.iter().chain([&read]) {
        let text = v.to_string();
        assert!(!text.contains(&token) && !text.contains("pa:ss"), "{text}");
    }
    srv.stop().await;
}

/// A second connection to the test's database, to read and alter rows behind the store.
async fn raw(db: &TestDb) -> sea_orm::DatabaseConnection {
    let mut opts = ConnectOptions::new(db.config.database.url.clone());
    if let Some(schema) = &db.config.database.schema {
        opts.set_schema_search_path(schema.clone());
    }
    sea_orm::Database::connect(opts).await.expect("connects")
}

async fn stored_secrets_hold_no_plaintext_and_open_only_with_their_key_team_and_name(
    backend: Backend,
) {
    let db = TestDb::new(backend);
    let store = Store::connect(&db.config.database, Metrics::new())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let now = chrono::Utc::now();
    let mut teams = Vec::new();
    for name in ["alpha", "beta"] {
        let t = store
            .create_team(
                NewTeam {
                    name: name.parse().expect("name"),
                    weight: 1.0,
                    cohort: None,
                    quotas: Default::default(),
                },
                now,
            )
            .await
            .expect("team");
        teams.push(t.id);
    }
    let (alpha, beta) = (&teams[0], &teams[1]);
    let key = SecretsKey::generate();
    let plain = value("plaintext");
    let w = store
        .put_team_secret(&key, alpha, "hf-token", &plain, now)
        .await
        .expect("stored");
    assert!(matches!(w, SecretWrite::Created(_)), "{w:?}");
    assert_eq!(
        store
            .team_secret_value(&key, alpha, "hf-token")
            .await
            .expect("read")
            .as_deref(),
        Some(plain.as_str())
    );

    // The row holds neither the value nor any long run of it.
    let conn = raw(&db).await;
    let rows = team_secret::Entity::find().all(&conn).await.expect("rows");
    assert_eq!(rows.len(), 1);
    let row = rows[0].clone();
    let sealed = &row.sealed;
    assert!(
        sealed.len() >= plain.len() + 24 + 16,
        "nonce, ciphertext and tag"
    );
    for window in plain.as_bytes().windows(8) {
        assert!(
            !sealed.windows(8).any(|w| w == window),
            "no 8 bytes of the value in the row"
        );
    }

    // Another key does not open it.
    let err = store
        .team_secret_value(&SecretsKey::generate(), alpha, "hf-token")
        .await
        .expect_err("wrong key");
    assert!(
        matches!(
            err,
            StoreError::Corrupt {
                table: "team_secrets",
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.to_string().contains(&plain), "{err}");

    // One byte altered: it does not open.
    let mut tampered = row.sealed.clone();
    if let Some(last) = tampered.last_mut() {
        *last ^= 0x80;
    }
    let mut am: team_secret::ActiveModel = row.clone().into();
    am.sealed = Set(tampered);
    am.update(&conn).await.expect("altered");
    let err = store
        .team_secret_value(&key, alpha, "hf-token")
        .await
        .expect_err("tampered");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");

    // The intact bytes copied to another name and to another team: neither opens.
    for (team, name) in [(alpha, "copy"), (beta, "hf-token")] {
        team_secret::ActiveModel {
            id: Set(uuid::Uuid::now_v7().to_string()),
            team_id: Set(team.clone()),
            name: Set(name.into()),
            sealed: Set(row.sealed.clone()),
            created_at: Set(now),
            updated_at: Set(now),
        }
        .insert(&conn)
        .await
        .expect("copied");
        let err = store
            .team_secret_value(&key, team, name)
            .await
            .expect_err("moved");
        assert!(
            matches!(err, StoreError::Corrupt { .. }),
            "{team}/{name}: {err}"
        );
    }

    // Replacing writes a fresh seal that opens again.
    let w = store
        .put_team_secret(&key, alpha, "hf-token", &plain, now)
        .await
        .expect("replaced");
    assert!(matches!(w, SecretWrite::Replaced(_)), "{w:?}");
    assert_eq!(
        store
            .team_secret_value(&key, alpha, "hf-token")
            .await
            .expect("read")
            .as_deref(),
        Some(plain.as_str())
    );
    let _ = conn.close().await;
    db.cleanup().await;
}

/// A registered node: its id and credential.
async fn registered(srv: &TestServer, name: &str) -> (NodeId, String) {
    let node = common::stored_node(name, "g5.xlarge", "0.4", (4_000, 16_384), common::a10g());
    let body = json!({"protocol_version": 1, "agent_version": "0.1.0",
        "hostname": name, "cpu_milli": 4000, "memory_mib": 16384});
    common::register_agent(srv, node, body).await
}

async fn only_the_node_holding_the_job_gets_its_secrets(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let alpha = srv.team_with_token("alpha").await;
    let (hf, password) = (value("hf"), value("pw"));
    assert_eq!(
        put(&srv, &alpha, "alpha", "hf-token", &hf).await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        put(
            &srv,
            &alpha,
            "alpha",
            "registry",
            &format!("robot:{password}")
        )
        .await
        .0,
        StatusCode::CREATED
    );
    let (holder, holder_cred) = registered(&srv, "holder").await;
    let (_, other_cred) = registered(&srv, "other").await;
    let (s, j) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(&alpha),
            Some(
                &json!({"name": "train", "shape": {"gpus": 1}, "command": ["train"],
                "image": "ghcr.io/acme/train:1", "image_pull_secret": "registry",
                "secrets": {"HF_TOKEN": "hf-token"}}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{j}");
    let job: JobId = j["id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    let path = format!("/v1/agent/jobs/{job}/secrets");

    // Queued, no allocation anywhere: nobody gets anything.
    let (s, v) = srv.call(Method::GET, &path, Some(&holder_cred), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");

    srv.store()
        .admit_job(
            job,
            &[Placement {
                replica: 0,
                node: holder,
                assigned: Assigned::Whole(vec![0]),
            }],
            chrono::Utc::now(),
        )
        .await
        .expect("admitted");
    let (s, headers, v) = srv
        .send(Method::GET, &path, Some(&holder_cred), None, &[])
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        headers.get("cache-control").and_then(|h| h.to_str().ok()),
        Some("no-store")
    );
    assert_eq!(
        v,
        json!({"env": {"HF_TOKEN": hf}, "registry": {"username": "robot", "password": password}})
    );

    // Another node, a team, an admin, a job that does not exist: refused.
    let refused = [
        (other_cred.as_str(), path.clone(), StatusCode::NOT_FOUND),
        (alpha.as_str(), path.clone(), StatusCode::FORBIDDEN),
        (ADMIN_TOKEN, path.clone(), StatusCode::FORBIDDEN),
        (
            holder_cred.as_str(),
            format!("/v1/agent/jobs/{}/secrets", JobId::new_at(1, 1)),
            StatusCode::NOT_FOUND,
        ),
        (
            holder_cred.as_str(),
            "/v1/agent/jobs/not-a-job/secrets".into(),
            StatusCode::NOT_FOUND,
        ),
    ];
    for (token, p, want) in refused {
        let (s, v) = srv.call(Method::GET, &p, Some(token), None).await;
        assert_eq!(s, want, "{p}: {v}");
        assert!(!v.to_string().contains(&hf), "{v}");
    }

    // The secret deleted since: the holder is told which, not what it held.
    let (s, _) = srv
        .call(
            Method::DELETE,
            &format!("{}/hf-token", secrets_path("alpha")),
            Some(&alpha),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v) = srv.call(Method::GET, &path, Some(&holder_cred), None).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let detail = v["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("secrets.HF_TOKEN (hf-token)") && !detail.contains(&hf),
        "{v}"
    );

    // A pull secret that is not a login.
    assert_eq!(
        put(&srv, &alpha, "alpha", "hf-token", &hf).await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        put(&srv, &alpha, "alpha", "registry", "no-colon").await.0,
        StatusCode::OK
    );
    let (s, v) = srv.call(Method::GET, &path, Some(&holder_cred), None).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let detail = v["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with("image_pull_secret") && !detail.contains("no-colon"),
        "{v}"
    );

    // Cancelled, its allocation given back: the holder no longer gets anything.
    let (s, c) = srv
        .call(
            Method::POST,
            &format!("/v1/jobs/{job}/cancel"),
            Some(&alpha),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(c["state"], "cancelled", "{c}");
    let (s, v) = srv.call(Method::GET, &path, Some(&holder_cred), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    srv.stop().await;
}

/// The key file outlives the server: after a restart on the same data the secret still opens.
/// A key file that is not a key stops the start, naming the file, before anything is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_key_and_a_corrupt_key_file_is_refused_by_path() {
    let srv = TestServer::start(Backend::Sqlite).await;
    let alpha = srv.team_with_token("alpha").await;
    let token = value("kept");
    assert_eq!(
        put(&srv, &alpha, "alpha", "registry", &format!("u:{token}"))
            .await
            .0,
        StatusCode::CREATED
    );
    let key_file = srv.db.config.secrets.key_file.clone();
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&key_file)
            .expect("created at start")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let db = srv.stop_keeping_data().await;
    let srv = TestServer::start_on(db).await;
    let team = srv.store().get_team("alpha").await.expect("team");
    let value_now = srv
        .store()
        .team_secret_value(
            srv.server.state.secrets_key().expect("key"),
            &team.id,
            "registry",
        )
        .await
        .expect("opens after the restart");
    assert_eq!(value_now, Some(format!("u:{token}")));
    let db = srv.stop_keeping_data().await;

    std::fs::write(&key_file, b"garbage").expect("write");
    let err = match spotplane::server::Server::start(
        &db.config,
        std::sync::Arc::new(spotplane::clock::SystemClock),
        spotplane::server::ServeOptions::default(),
    )
    .await
    {
        Ok(_) => panic!("started with a corrupt key file"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains(&key_file.display().to_string()) && err.contains("7 bytes, not 32"),
        "{err}"
    );
    db.cleanup().await;
}

/// A webhook subscription of `team_id`, stored with `secret` under `key`.
async fn stored_webhook(store: &Store, key: &SecretsKey, team_id: &str, secret: &Secret) -> String {
    store
        .create_subscription(
            key,
            NewSubscription {
                team_id: team_id.to_owned(),
                url: "https://hooks.example.com/spotplane".into(),
                event_types: vec![EventType::JobQueued],
                description: None,
                secret: secret.clone(),
            },
            chrono::Utc::now(),
        )
        .await
        .expect("subscribed")
        .id
}

/// The signature header a ping of `id` goes out with now, and the one `expected` would make.
async fn ping_signature(
    store: &Store,
    key: &SecretsKey,
    id: &str,
    expected: &[&Secret],
) -> (String, String) {
    let now = chrono::Utc::now();
    let d = store
        .create_ping(key, id, None, now)
        .await
        .expect("the secrets open");
    (
        signature_header(&d.secrets(now), "msg_1", 1_700_000_000, b"{}"),
        signature_header(expected, "msg_1", 1_700_000_000, b"{}"),
    )
}

/// A row written by a control plane from before sealing holds `whsec_...` in the clear; after
/// an upgrade it still signs with the same secrets, and the start seals both columns.
async fn a_clear_webhook_secret_from_before_sealing_still_signs_and_is_sealed_at_start(
    backend: Backend,
) {
    let srv = TestServer::start(backend).await;
    srv.team_with_token("alpha").await;
    let team = srv.store().get_team("alpha").await.expect("team");
    let key = srv.server.state.secrets_key().expect("key").clone();
    let (old, current) = (Secret::generate(), Secret::generate());
    let id = stored_webhook(srv.store(), &key, &team.id, &current).await;
    let conn = raw(&srv.db).await;
    let row = webhook_subscription::Entity::find_by_id(id.clone())
        .one(&conn)
        .await
        .expect("read")
        .expect("row");
    assert!(row.secret.starts_with("sealed:v1:"), "{}", row.secret);
    assert!(!row.secret.contains(&current.expose()[6..]));

    // As the previous version wrote it: both in the clear.
    let mut am: webhook_subscription::ActiveModel = row.into();
    am.secret = Set(current.expose());
    am.previous_secret = Set(Some(old.expose()));
    am.previous_secret_until = Set(Some(chrono::Utc::now() + chrono::Duration::hours(1)));
    am.update(&conn).await.expect("made clear");
    let _ = conn.close().await;

    let srv = TestServer::start_on(srv.stop_keeping_data().await).await;
    let conn = raw(&srv.db).await;
    let row = webhook_subscription::Entity::find_by_id(id.clone())
        .one(&conn)
        .await
        .expect("read")
        .expect("row kept");
    let previous = row.previous_secret.clone().unwrap_or_default();
    for (column, text, secret) in [
        ("secret", &row.secret, &current),
        ("previous_secret", &previous, &old),
    ] {
        assert!(
            text.starts_with("sealed:v1:"),
            "{column} sealed at start: {text}"
        );
        assert!(
            !text.contains(&secret.expose()[6..]),
            "{column} holds no clear secret"
        );
    }
    let key = srv.server.state.secrets_key().expect("key").clone();
    let (got, want) = ping_signature(srv.store(), &key, &id, &[&current, &old]).await;
    assert_eq!(
        got, want,
        "signed with the same two secrets as before the upgrade"
    );
    // A second start has nothing left to seal.
    assert_eq!(
        srv.store()
            .seal_clear_webhook_secrets(&key)
            .await
            .expect("nothing to do"),
        0
    );
    let _ = conn.close().await;
    srv.stop().await;
}

/// Runs `spotplane secrets reseal` on `config`'s database with `key` current and `previous`
/// keys given in a configuration file; returns whether it succeeded and what it printed.
async fn reseal_command(
    config: &spotplane::config::Config,
    key: &str,
    previous: &[&str],
) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let schema = config
        .database
        .schema
        .as_ref()
        .map(|s| format!("schema = \"{s}\"\n"))
        .unwrap_or_default();
    let previous: Vec<String> = previous.iter().map(|k| format!("\"{k}\"")).collect();
    let file = dir.path().join("spotplane.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{}\"\n{schema}\n[secrets]\nkey = \"{key}\"\nprevious_keys = [{}]\n",
            config.database.url,
            previous.join(", ")
        ),
    )
    .expect("config written");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_spotplane"))
            .arg("--config")
            .arg(&file)
            .args(["secrets", "reseal"])
            .current_dir(dir.path())
            .env_remove("DATABASE_URL")
            .output()
            .expect("spotplane runs")
    })
    .await
    .expect("joined");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Key A seals a team secret and a rotated webhook's two secrets; with B current and A
/// previous everything opens and signs; `spotplane secrets reseal` moves every row to B, after
/// which B alone opens them; a row under a key configured nowhere makes reseal fail naming it,
/// writing nothing.
async fn after_a_key_rotation_everything_opens_and_reseal_moves_it_to_the_new_key(
    backend: Backend,
) {
    use base64::Engine;
    let b64 = |k: [u8; 32]| base64::engine::general_purpose::STANDARD.encode(k);
    let (raw_a, raw_b): ([u8; 32], [u8; 32]) = (rand::random(), rand::random());
    let mut db = TestDb::new(backend);
    db.config.secrets.key = Some(KeyText::new(b64(raw_a)));
    let key_a = SecretsKey::load(&db.config.secrets).expect("key A");
    let store = Store::connect(&db.config.database, Metrics::new())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let now = chrono::Utc::now();
    let team = store
        .create_team(
            NewTeam {
                name: "alpha".parse().expect("name"),
                weight: 1.0,
                cohort: None,
                quotas: Default::default(),
            },
            now,
        )
        .await
        .expect("team")
        .id;
    let plain = value("hf");
    store
        .put_team_secret(&key_a, &team, "hf-token", &plain, now)
        .await
        .expect("stored");
    let (s1, s2) = (Secret::generate(), Secret::generate());
    let hook = stored_webhook(&store, &key_a, &team, &s1).await;
    store
        .rotate_secret(
            &key_a,
            &hook,
            None,
            &s2,
            now + chrono::Duration::hours(1),
            now,
        )
        .await
        .expect("rotated");

    // Rotated: B seals, A still opens.
    db.config.secrets.key = Some(KeyText::new(b64(raw_b)));
    db.config.secrets.previous_keys = vec![KeyText::new(b64(raw_a))];
    let rotated = SecretsKey::load(&db.config.secrets).expect("B with A previous");
    assert_eq!(
        store
            .team_secret_value(&rotated, &team, "hf-token")
            .await
            .expect("opens with a previous key"),
        Some(plain.clone())
    );
    let (got, want) = ping_signature(&store, &rotated, &hook, &[&s2, &s1]).await;
    assert_eq!(got, want);
    let key_b = SecretsKey::from_bytes(&raw_b);
    let err = store
        .team_secret_value(&key_b, &team, "hf-token")
        .await
        .expect_err("B alone does not open A's rows yet");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");

    // The operator's command, as docs/deploy.md says to run it, with the rotated config (on
    // SQLite, with no other process on the database: the store is closed meanwhile).
    drop(store);
    let (ok, out) = reseal_command(&db.config, &b64(raw_b), &[&b64(raw_a)]).await;
    let store = Store::connect(&db.config.database, Metrics::new())
        .await
        .expect("connect");
    assert!(ok, "{out}");
    assert!(
        out.contains(
            "resealed 1 team secrets and the signing secrets of 1 webhook subscriptions under the current key; 0 rows already were"
        ),
        "{out}"
    );
    let again = store.reseal_secrets(&rotated).await.expect("again");
    assert_eq!(
        (
            again.team_secrets,
            again.webhook_subscriptions,
            again.already_current
        ),
        (0, 0, 2),
        "{again:?}"
    );

    // A removed: B alone opens and signs.
    assert_eq!(
        store
            .team_secret_value(&key_b, &team, "hf-token")
            .await
            .expect("opens with B alone"),
        Some(plain.clone())
    );
    let (got, want) = ping_signature(&store, &key_b, &hook, &[&s2, &s1]).await;
    assert_eq!(got, want);

    // Rows under a key configured nowhere: reseal names each, and writes nothing.
    let stray = SecretsKey::generate();
    store
        .put_team_secret(&stray, &team, "stray", "v", now)
        .await
        .expect("stored");
    let stray_hook = stored_webhook(&store, &stray, &team, &Secret::generate()).await;
    let conn = raw(&db).await;
    let before = team_secret::Entity::find().all(&conn).await.expect("rows");
    let err = store
        .reseal_secrets(&key_b)
        .await
        .expect_err("unknown key refused");
    let text = err.to_string();
    let stray_row = before
        .iter()
        .find(|r| r.name == "stray")
        .map(|r| r.id.clone())
        .unwrap_or_default();
    assert!(
        text.contains(&stray_row) && text.contains(&stray_hook) && text.contains("2 row(s)"),
        "{text}"
    );
    assert!(text.contains("team secret stray"), "{text}");
    // The command fails the same way, naming the rows, and writes nothing either.
    drop(store);
    let (ok, out) = reseal_command(&db.config, &b64(raw_b), &[]).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains(&stray_row) && out.contains(&stray_hook),
        "{out}"
    );
    let after = team_secret::Entity::find().all(&conn).await.expect("rows");
    assert_eq!(before, after, "nothing written");
    let _ = conn.close().await;
    db.cleanup().await;
}
