//! The job files in `examples/jobs` are accepted as they ship: each is submitted through the
//! `spotplane job submit -f` binary against a server on SQLite, with the team and the secrets
//! the files name made first, and through `POST /v1/jobs` with the YAML read as the CLI reads
//! it; both answer a new job, which reads back with every field the file sets.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use common::{Backend, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use spotplane_core::job::parse_deadline_in;

const TEAM: &str = "research";

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/jobs")
}

/// Every `*.yaml` in examples/jobs, sorted, with its content read as the CLI reads a `.yaml`
/// file (serde_yaml_ng into a JSON value, sent as is).
fn example_files() -> Vec<(PathBuf, Value)> {
    let dir = examples_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let raw = std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            assert!(
                raw.starts_with(b"#"),
                "{} starts with a comment saying what it is",
                p.display()
            );
            let v: Value = serde_yaml_ng::from_slice(&raw)
                .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", p.display()));
            assert!(v.is_object(), "{} holds one mapping", p.display());
            (p, v)
        })
        .collect()
}

/// Whether `got` holds everything `want` says: objects key by key (the read-back adds
/// defaults), numbers by value (YAML's `20` reads back as `20.0`), the rest exactly.
fn holds(got: &Value, want: &Value) -> bool {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| g.get(k).is_some_and(|gv| holds(gv, wv))),
        (Value::Array(g), Value::Array(w)) => {
            g.len() == w.len() && g.iter().zip(w).all(|(gv, wv)| holds(gv, wv))
        }
        (Value::Number(g), Value::Number(w)) => g.as_f64() == w.as_f64(),
        _ => got == want,
    }
}

/// Checks that the job `job` (as read back) is what the file `want` describes, submitted
/// between `before` and `after`.
fn check_read_back(
    name: &str,
    job: &Value,
    want: &Value,
    before: DateTime<Utc>,
    after: DateTime<Utc>,
) {
    assert_eq!(job["team"], TEAM, "{name}: {job}");
    assert_eq!(job["state"], "queued", "{name}: {job}");
    let mut want = want.clone();
    let fields = want.as_object_mut().expect("a mapping");
    if let Some(span) = fields.remove("deadline_in") {
        let span = span.as_str().expect("deadline_in is a string");
        let d = parse_deadline_in(span).unwrap_or_else(|e| panic!("{name}: deadline_in {e}"));
        let deadline: DateTime<Utc> = job["deadline"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{name}: deadline_in reads back as a deadline: {job}"));
        assert!(
            before + d <= deadline && deadline <= after + d,
            "{name}: deadline {deadline} is {span} from submission ({before} to {after})"
        );
        assert!(
            job.get("deadline_in").is_none(),
            "{name}: only the deadline is kept: {job}"
        );
    }
    for (k, v) in fields.iter() {
        assert!(
            job.get(k).is_some_and(|got| holds(got, v)),
            "{name}: {k} is {v} in the file but reads back as {}",
            job.get(k).unwrap_or(&Value::Null)
        );
    }
}

/// A kind of job the examples promise, and how to tell a file is one.
type Kind<'a> = (&'a str, &'a dyn Fn(&Value) -> bool);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_job_is_accepted_and_reads_back_with_its_fields() {
    let files = example_files();

    // The five kinds the examples promise, each in some file.
    let shape = |v: &Value, k: &str| v["shape"].get(k).cloned().unwrap_or(Value::Null);
    let kinds: [Kind; 5] = [
        (
            "a single-GPU fine-tune with an image, a checkpoint and secrets",
            &|v| {
                shape(v, "gpus") == json!(1)
                    && v.get("replicas").is_none_or(|r| r == 1)
                    && v["image"].is_string()
                    && v["checkpoint"]["uri"].is_string()
                    && v["secrets"].as_object().is_some_and(|s| !s.is_empty())
            },
        ),
        ("a MIG inference job", &|v| shape(v, "mig").is_string()),
        ("a shared-GPU job", &|v| shape(v, "gpu_milli").is_number()),
        (
            "a two-node gang of 8 GPUs each with an image and a checkpoint",
            &|v| {
                v["replicas"] == 2
                    && shape(v, "gpus") == 8
                    && v["image"].is_string()
                    && v["checkpoint"]["uri"].is_string()
            },
        ),
        ("a deadline batch job", &|v| {
            (v["deadline"].is_string() || v["deadline_in"].is_string())
                && v["work_hours"].is_number()
        }),
    ];
    for (kind, is) in kinds {
        assert!(files.iter().any(|(_, v)| is(v)), "examples/jobs has {kind}");
    }

    let srv = TestServer::start(Backend::Sqlite).await;
    let token = srv.team_with_token(TEAM).await;

    // The team secrets the files name.
    let mut secrets = BTreeSet::new();
    for (_, v) in &files {
        if let Some(s) = v["secrets"].as_object() {
            secrets.extend(
                s.values()
                    .map(|n| n.as_str().expect("a secret name").to_owned()),
            );
        }
        if let Some(n) = v["image_pull_secret"].as_str() {
            secrets.insert(n.to_owned());
        }
    }
    assert!(secrets.contains("hf-token"), "{secrets:?}");
    for name in &secrets {
        let (s, v) = srv
            .call(
                Method::POST,
                &format!("/v1/teams/{TEAM}/secrets"),
                Some(&token),
                Some(&json!({"name": name, "value": format!("value-of-{name}")})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "secret {name}: {v}");
    }

    let cli = |args: Vec<String>| {
        let url = srv.url.clone();
        let token = token.clone();
        async move {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_spotplane"))
                .args(&args)
                .env("SPOTPLANE_URL", url)
                .env("SPOTPLANE_TOKEN", token)
                .env_remove("SPOTPLANE_CONFIG")
                .output()
                .await
                .expect("the spotplane binary runs");
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };

    let mut ids = BTreeSet::new();
    for (path, want) in &files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("file name");
        let file = path.to_str().expect("a UTF-8 path").to_owned();

        // Through the CLI binary, as the README shows it.
        let before = Utc::now();
        let (ok, out, err) = cli(vec![
            "job".into(),
            "submit".into(),
            "-f".into(),
            file.clone(),
        ])
        .await;
        let after = Utc::now();
        assert!(ok, "{name}: spotplane job submit failed: {err}");
        assert!(
            !err.contains("already submitted"),
            "{name}: a new job (201), not a replay: {err}"
        );
        let printed: Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{name}: {e}: {out}"));
        let id = printed["id"].as_str().expect("the job's id").to_owned();
        let (s, job) = srv
            .call(Method::GET, &format!("/v1/jobs/{id}"), Some(&token), None)
            .await;
        assert_eq!(s, StatusCode::OK, "{name}: {job}");
        check_read_back(name, &job, want, before, after);
        assert!(ids.insert(id.clone()), "{name}: a job of its own");

        // The same file again is the same request: the first job, its deadline unchanged.
        let (ok, out, err) = cli(vec!["job".into(), "submit".into(), "-f".into(), file]).await;
        assert!(ok && err.contains("already submitted"), "{name}: {err}");
        let again: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(again["id"], json!(id), "{name}");
        assert_eq!(again["deadline"], job["deadline"], "{name}");

        // Through the API with the YAML read as the CLI reads it: 201, the same fields.
        let before = Utc::now();
        let (s, created) = srv
            .call(Method::POST, "/v1/jobs", Some(&token), Some(want))
            .await;
        let after = Utc::now();
        assert_eq!(s, StatusCode::CREATED, "{name}: {created}");
        let id = created["id"].as_str().expect("the job's id").to_owned();
        let (s, job) = srv
            .call(Method::GET, &format!("/v1/jobs/{id}"), Some(&token), None)
            .await;
        assert_eq!(s, StatusCode::OK, "{name}: {job}");
        check_read_back(name, &job, want, before, after);
        assert!(ids.insert(id), "{name}: a second job of its own");
    }

    let (s, list) = srv
        .call(Method::GET, "/v1/jobs?limit=500", Some(&token), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let listed: BTreeSet<String> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|j| j["id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(listed, ids, "two jobs per file, no more");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_deadline_in_is_refused_naming_the_field() {
    let srv = TestServer::start(Backend::Sqlite).await;
    let token = srv.team_with_token(TEAM).await;
    let base = json!({"name": "j", "shape": {"gpus": 1}, "command": ["x"]});
    let tomorrow = (Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    for (extra, why) in [
        (json!({"deadline_in": "soon"}), "is not a span of time"),
        (json!({"deadline_in": "0s"}), "more than zero"),
        (json!({"deadline_in": "3654days"}), "at most 3653 days"),
        (json!({"deadline_in": 48}), "invalid type"),
        (
            json!({"deadline_in": "48h", "deadline": tomorrow}),
            "set one of deadline and deadline_in",
        ),
    ] {
        let mut body = base.clone();
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let (s, v) = srv
            .call(Method::POST, "/v1/jobs", Some(&token), Some(&body))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body} -> {v}");
        assert_eq!(v["field"], "deadline_in", "{body} -> {v}");
        assert!(v.to_string().contains(why), "{body} -> {v}");
    }
    srv.stop().await;
}

#[test]
fn the_job_files_the_readme_names_exist() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let named: BTreeSet<&str> = readme
        .match_indices("examples/jobs/")
        .map(|(at, _)| {
            let rest = &readme[at..];
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '`' || c == ')')
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    assert!(
        named.iter().any(|p| p.ends_with(".yaml")),
        "the README's CLI block submits one of examples/jobs: {named:?}"
    );
    for path in named {
        assert!(
            root.join(path).is_file(),
            "README names {path}, which is missing"
        );
    }
    assert!(
        !readme.contains("-f job.yaml"),
        "the README submits a file that exists"
    );
}
