//! One paging rule on every list, and the input holes of issue 29 closed: each answer is a
//! `problem+json` naming the field.

mod common;

use common::{ADMIN_TOKEN, Backend, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Every list endpoint, with the ids it needs made first.
async fn lists(srv: &TestServer, team: &str) -> Vec<String> {
    let (s, job) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(team),
            Some(&json!({"name": "j", "shape": {"gpus": 1}, "command": ["x"]})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{job}");
    let job = job["id"].as_str().expect("job id").to_owned();
    let (s, hook) = srv
        .call(
            Method::POST,
            "/v1/webhooks",
            Some(team),
            Some(&json!({"url": "http://127.0.0.1:9/hook", "event_types": ["job.succeeded"]})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{hook}");
    let hook = hook["id"].as_str().expect("webhook id").to_owned();
    let node = uuid::Uuid::now_v7();
    vec![
        "/v1/jobs".into(),
        format!("/v1/jobs/{job}/events"),
        format!("/v1/jobs/{job}/checkpoints"),
        "/v1/webhooks".into(),
        format!("/v1/webhooks/{hook}/deliveries"),
        "/v1/nodes".into(),
        format!("/v1/nodes/{node}/commands"),
        "/v1/offers".into(),
        "/v1/teams".into(),
        "/v1/tokens".into(),
        "/v1/teams/alpha/tokens".into(),
    ]
}

async fn every_list_refuses_a_bad_cursor_or_limit_with_400_naming_it(backend: Backend) {
    // A loopback webhook target, never called.
    let srv = TestServer::start_with(backend, |c| c.webhooks.allow_private = true).await;
    let team = srv.team_with_token("alpha").await;
    for list in lists(&srv, &team).await {
        // The node of /commands does not exist: paging is judged before the lookup.
        for (query, field) in [
            // `garbage` is a fine team name, so a fine cursor of /v1/teams.
            (
                "cursor=garbage",
                if list == "/v1/teams" { "" } else { "cursor" },
            ),
            ("cursor=NOT%20a%20cursor%21", "cursor"),
            ("cursor=", "cursor"),
            ("cursor=a&cursor=b", "cursor"),
            ("limit=0", "limit"),
            ("limit=-1", "limit"),
            ("limit=501", "limit"),
            ("limit=ten", "limit"),
            ("limit=99999999999999999999999", "limit"),
            ("limit=1&limit=2", "limit"),
        ] {
            let sep = if list.contains('?') { '&' } else { '?' };
            let (s, h, v) = srv
                .raw(
                    Method::GET,
                    &format!("{list}{sep}{query}"),
                    Some(ADMIN_TOKEN),
                    None,
                    &[],
                )
                .await;
            if field.is_empty() {
                assert_eq!(s, StatusCode::OK, "{list}?{query} -> {v}");
                continue;
            }
            assert_eq!(s, StatusCode::BAD_REQUEST, "{list}?{query} -> {v}");
            assert_eq!(v["field"].as_str(), Some(field), "{list}?{query} -> {v}");
            assert_eq!(
                h.get("content-type").and_then(|c| c.to_str().ok()),
                Some("application/problem+json"),
                "{list}?{query}"
            );
        }
    }
    srv.stop().await;
}

async fn every_list_pages_through_all_its_items_once(backend: Backend) {
    let srv = TestServer::start(backend).await;
    for name in ["alpha", "bravo", "charlie", "delta", "echo"] {
        srv.team_with_token(name).await;
    }
    // Teams (by name) and tokens (newest first) have five or more items now.
    for (list, key) in [("/v1/teams", "name"), ("/v1/tokens", "id")] {
        let mut seen: Vec<String> = Vec::new();
        let mut cursor: Option<String> = None;
        let mut pages = 0;
        loop {
            let path = match &cursor {
                Some(c) => format!("{list}?limit=2&cursor={c}"),
                None => format!("{list}?limit=2"),
            };
            let (s, v) = srv.call(Method::GET, &path, Some(ADMIN_TOKEN), None).await;
            assert_eq!(s, StatusCode::OK, "{path} -> {v}");
            let items = v["items"].as_array().expect("items");
            assert!(items.len() <= 2, "{path} -> {v}");
            seen.extend(
                items
                    .iter()
                    .map(|i| i[key].as_str().expect("key").to_owned()),
            );
            pages += 1;
            match v["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
            assert!(pages < 20, "{list} never ends");
        }
        let (_, all) = srv
            .call(
                Method::GET,
                &format!("{list}?limit=500"),
                Some(ADMIN_TOKEN),
                None,
            )
            .await;
        let all: Vec<String> = all["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| i[key].as_str().expect("key").to_owned())
            .collect();
        assert!(all.len() >= 5, "{list}: {all:?}");
        assert_eq!(
            seen, all,
            "{list}: pages of two give every item once, in order"
        );
    }
    srv.stop().await;
}

async fn bodies_with_holes_are_refused_naming_the_field(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let team = srv.team_with_token("alpha").await;
    let base = json!({"name": "j", "shape": {"gpus": 1}, "command": ["x"]});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    for (body, field) in [
        (with("command", json!(["python", "a\u{0}b"])), "command[1]"),
        (with("env", json!({"K": "v\u{0}"})), "env.K"),
        (with("deadline", json!("2099-01-01T00:00:00Z")), "deadline"),
        (with("work_hours", json!(1e-300)), "work_hours"),
        (
            with(
                "checkpoint",
                json!({"uri": "file:///etc", "interval_s": 600}),
            ),
            "checkpoint.uri",
        ),
    ] {
        let (s, v) = srv
            .call(Method::POST, "/v1/jobs", Some(&team), Some(&body))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body} -> {v}");
        assert_eq!(v["field"].as_str(), Some(field), "{body} -> {v}");
    }

    // One JSON object and nothing after it.
    let (s, _, v) = srv
        .raw(
            Method::POST,
            "/v1/jobs",
            Some(&team),
            Some(format!("{base}xyz").into_bytes()),
            &[("content-type", "application/json")],
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["type"], "urn:spotplane:problem:bad-request");
    let (s, _, v) = srv
        .raw(
            Method::POST,
            "/v1/jobs",
            Some(&team),
            Some(format!("{base} \n").into_bytes()),
            &[("content-type", "application/json")],
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "trailing whitespace is fine: {v}");

    let (s, v) = srv
        .call(
            Method::PATCH,
            "/v1/teams/alpha",
            Some(ADMIN_TOKEN),
            Some(&json!({"weight": 1e-300})),
        )
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("weight")),
        "{v}"
    );

    // A budget that would be stored as $0 is refused; a stored one reads back as stored.
    let (s, v) = srv
        .call(
            Method::PUT,
            "/v1/teams/alpha/budget",
            Some(ADMIN_TOKEN),
            Some(&json!({"monthly_usd": 1e-9})),
        )
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("monthly_usd")),
        "{v}"
    );
    let (s, v) = srv
        .call(
            Method::PUT,
            "/v1/teams/alpha/budget",
            Some(ADMIN_TOKEN),
            Some(&json!({"monthly_usd": 0.000001})),
        )
        .await;
    assert_eq!(
        (s, v["monthly_usd"].as_f64()),
        (StatusCode::OK, Some(0.000001)),
        "{v}"
    );

    // A big bad request gets a small answer: 20 errors listed, the rest counted.
    let env: serde_json::Map<String, Value> =
        (0..5000).map(|i| (format!("{i}BAD"), json!("x"))).collect();
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(&team),
            Some(&with("env", Value::Object(env))),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(v["errors"].as_array().map(Vec::len), Some(20), "{v}");
    // 5000 bad names and one "at most 256 variables".
    assert_eq!(v["errors_omitted"].as_u64(), Some(4981));
    let length = serde_json::to_vec(&v).expect("json").len();
    assert!(length < 16 * 1024, "{length} bytes");
    srv.stop().await;
}

async fn a_caller_without_the_role_gets_403_whatever_body_it_sent(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let team = srv.team_with_token("alpha").await;
    for (method, path) in [
        (Method::POST, "/v1/teams"),
        (Method::POST, "/v1/tokens"),
        (Method::POST, "/v1/teams/alpha/tokens"),
        (Method::PATCH, "/v1/teams/alpha"),
        (Method::PUT, "/v1/teams/alpha/budget"),
    ] {
        for (body, headers) in [
            (None, vec![]),
            (
                Some(b"name=x".to_vec()),
                vec![("content-type", "text/plain")],
            ),
            (
                Some(vec![b'x'; 300 * 1024]),
                vec![("content-type", "application/json")],
            ),
        ] {
            let (s, _, v) = srv
                .raw(method.clone(), path, Some(&team), body, &headers)
                .await;
            assert_eq!(
                s,
                StatusCode::FORBIDDEN,
                "{method} {path} {headers:?} -> {v}"
            );
        }
    }
    // The admin still hears what is wrong with the body.
    let (s, _, _) = srv
        .raw(Method::POST, "/v1/teams", Some(ADMIN_TOKEN), None, &[])
        .await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    srv.stop().await;
}

on_both_databases!(
    every_list_refuses_a_bad_cursor_or_limit_with_400_naming_it,
    every_list_pages_through_all_its_items_once,
    bodies_with_holes_are_refused_naming_the_field,
    a_caller_without_the_role_gets_403_whatever_body_it_sent,
);

#[cfg(unix)]
#[tokio::test]
async fn the_sqlite_database_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let srv = TestServer::start(Backend::Sqlite).await;
    // A write, so the -wal and -shm files exist.
    srv.team_with_token("alpha").await;
    let url = srv.db.config.database.url.clone();
    let path = url
        .strip_prefix("sqlite://")
        .expect("a sqlite URL")
        .to_owned();
    let mut checked = 0;
    for suffix in ["", "-wal", "-shm"] {
        let file = format!("{path}{suffix}");
        if let Ok(meta) = std::fs::metadata(&file) {
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{file}");
            checked += 1;
        }
    }
    assert!(checked >= 2, "the database and its WAL exist");
    srv.stop().await;
}

#[cfg(unix)]
#[tokio::test]
async fn an_existing_world_readable_database_is_made_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let db = common::TestDb::new(Backend::Sqlite);
    let path = db
        .config
        .database
        .url
        .strip_prefix("sqlite://")
        .expect("a sqlite URL")
        .to_owned();
    std::fs::write(&path, b"").expect("an empty database file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let srv = TestServer::start_on(db).await;
    let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    srv.stop().await;
}
