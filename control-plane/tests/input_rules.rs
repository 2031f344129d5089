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
            let over = ["limit=501", "limit=99999999999999999999999"].contains(&query);
            assert_eq!(
                v["limit"].as_str(),
                over.then_some("page_size"),
                "{list}?{query} -> {v}"
            );
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

/// Each named limit: a request just over it is refused with a problem naming the field and
/// the limit, never a 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_a_named_limit_gets_a_problem_naming_the_limit_and_the_field() {
    use spotplane_core::limits;
    let srv = TestServer::start(Backend::Sqlite).await;
    let team = srv.team_with_token("alpha").await;
    let job = |extra: Value| {
        let mut j = json!({"name": "j", "shape": {"gpus": 1}, "command": ["x"]});
        if let (Some(o), Some(e)) = (j.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        j
    };
    let many_env: serde_json::Map<String, Value> = (0..=limits::ENV_VARS.max)
        .map(|i| (format!("V{i}"), json!("v")))
        .collect();
    let cases = [
        (
            job(json!({"replicas": limits::REPLICAS.max + 1})),
            "replicas",
            limits::REPLICAS,
        ),
        (
            job(json!({"command": vec![""; limits::COMMAND_ARGS.max as usize + 1]})),
            "command",
            limits::COMMAND_ARGS,
        ),
        (
            job(json!({"command": ["x".repeat(limits::COMMAND_BYTES.max as usize + 1)]})),
            "command",
            limits::COMMAND_BYTES,
        ),
        (job(json!({"env": many_env})), "env", limits::ENV_VARS),
        (
            job(json!({"env": {"BIG": "x".repeat(limits::ENV_VALUE_BYTES.max as usize + 1)}})),
            "env.BIG",
            limits::ENV_VALUE_BYTES,
        ),
        (
            job(json!({"name": "n".repeat(limits::NAME_CHARS.max as usize + 1)})),
            "name",
            limits::NAME_CHARS,
        ),
        (
            job(json!({"secrets": {"TOKEN": "s".repeat(limits::NAME_CHARS.max as usize + 1)}})),
            "secrets.TOKEN",
            limits::NAME_CHARS,
        ),
        (
            job(json!({"checkpoint": {
                "uri": format!("s3://b/{}", "k".repeat(limits::URI_CHARS.max as usize)),
                "interval_s": 600,
            }})),
            "checkpoint.uri",
            limits::URI_CHARS,
        ),
    ];
    for (body, field, limit) in cases {
        let (s, v) = srv
            .call(Method::POST, "/v1/jobs", Some(&team), Some(&body))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{}: {v}", limit.name);
        assert_eq!(v["limit"], limit.name, "{v}");
        let named = v["errors"].as_array().is_some_and(|e| {
            e.iter()
                .any(|e| e["field"] == field && e["limit"] == limit.name)
        });
        assert!(named, "{field} over {}: {v}", limit.name);
    }

    // Names outside jobs: a team and a token.
    for (path, body) in [
        (
            "/v1/teams",
            json!({"name": "t".repeat(limits::NAME_CHARS.max as usize + 1)}),
        ),
        (
            "/v1/teams/alpha/tokens",
            json!({"name": "t".repeat(limits::NAME_CHARS.max as usize + 1)}),
        ),
    ] {
        let (s, v) = srv
            .call(Method::POST, path, Some(ADMIN_TOKEN), Some(&body))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {v}");
        assert_eq!(
            (v["field"].as_str(), v["limit"].as_str()),
            (Some("name"), Some("name_chars")),
            "{path}: {v}"
        );
    }

    // Too deep: a clean 422 naming json_depth, however deep (no 500, no stack overflow).
    for depth in [limits::JSON_DEPTH.max as usize + 1, 100_000] {
        let body = format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
        let (s, _, v) = srv
            .raw(
                Method::POST,
                "/v1/jobs",
                Some(&team),
                Some(body.into_bytes()),
                &[("content-type", "application/json")],
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{depth}: {v}");
        assert_eq!(
            (v["field"].as_str(), v["limit"].as_str()),
            (Some("body"), Some("json_depth"))
        );
    }
    // Within the bound, depth is no problem of its own.
    let (s, v) = srv
        .call(Method::POST, "/v1/jobs", Some(&team), Some(&job(json!({}))))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    let big = vec![b' '; limits::BODY_BYTES.max as usize + 1];
    let (s, _, v) = srv
        .raw(
            Method::POST,
            "/v1/jobs",
            Some(&team),
            Some(big),
            &[("content-type", "application/json")],
        )
        .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(
        (v["field"].as_str(), v["limit"].as_str()),
        (Some("body"), Some("body_bytes"))
    );
    srv.stop().await;
}

/// This process's resident memory, from /proc.
fn vm_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A stream of requests over the limits (bodies past `body_bytes`, bodies nested far past
/// `json_depth`, jobs with too many arguments) does not make the server grow: the resident
/// memory of the process serving them (this one) after the last thousand is within 20 MiB of
/// what it was after the first thousand. docs/reliability.md "## Limits" records the figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_oversized_and_over_deep_requests_leaves_memory_flat() {
    use spotplane_core::limits;
    let srv = TestServer::start(Backend::Sqlite).await;
    let team = srv.team_with_token("alpha").await;
    let oversized = vec![b' '; limits::BODY_BYTES.max as usize + 1024];
    let deep = format!("{{\"a\":{}{}}}", "[".repeat(50_000), "]".repeat(50_000)).into_bytes();
    let wide = json!({"name": "j", "shape": {"gpus": 1},
        "command": vec!["a"; limits::COMMAND_ARGS.max as usize + 1]})
    .to_string()
    .into_bytes();
    let bodies = [
        (oversized, StatusCode::PAYLOAD_TOO_LARGE),
        (deep, StatusCode::UNPROCESSABLE_ENTITY),
        (wide, StatusCode::UNPROCESSABLE_ENTITY),
    ];
    const TOTAL: usize = 3000;
    let started = std::time::Instant::now();
    let mut after_first = 0;
    for i in 0..TOTAL {
        let (body, want) = &bodies[i % bodies.len()];
        let (s, _, _) = srv
            .raw(
                Method::POST,
                "/v1/jobs",
                Some(&team),
                Some(body.clone()),
                &[("content-type", "application/json")],
            )
            .await;
        assert_eq!(s, *want, "request {i}");
        if i + 1 == 1000 {
            after_first = vm_rss_kib();
        }
    }
    let after_last = vm_rss_kib();
    let growth_kib = after_last.saturating_sub(after_first);
    println!(
        "limits stream: {TOTAL} requests in {:.1} s; VmRSS after the first 1000 {} KiB, after the last {} KiB, growth {} KiB",
        started.elapsed().as_secs_f64(),
        after_first,
        after_last,
        growth_kib
    );
    assert!(after_first > 0, "VmRSS is readable");
    assert!(growth_kib < 20 * 1024, "grew {growth_kib} KiB");
    srv.stop().await;
}

/// docs/api.md lists every named limit with its value.
#[test]
fn docs_list_every_named_limit_with_its_value() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.md"))
        .expect("docs/api.md");
    for l in spotplane_core::limits::ALL {
        let row = format!("| `{}` | {} |", l.name, l.max);
        assert!(
            doc.contains(&row),
            "docs/api.md lacks the row starting {row}"
        );
    }
}
