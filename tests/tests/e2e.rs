//! The real binaries, started as users start them.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use spotplane_tests::{Proc, bin, free_port, postgres_url, repo_root};

fn demo(dir: &Path, port: u16) -> Proc {
    let mut cmd = Command::new(bin("spotplane"));
    cmd.current_dir(dir)
        .env_remove("SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN")
        .env("SPOTPLANE_LOG__LEVEL", "warn")
        .args(["demo", "--listen", &format!("127.0.0.1:{port}")]);
    Proc::spawn(cmd, dir.join("demo.log"))
}

#[tokio::test]
async fn demo_starts_on_the_embedded_default_and_answers_healthz() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut p = demo(dir.path(), port);
    p.wait_healthy(&format!("http://127.0.0.1:{port}/healthz"))
        .await;
    let ready: Value = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .expect("readyz")
        .json()
        .await
        .expect("json");
    assert_eq!(ready["status"], "ready");
    assert!(
        dir.path().join("data/demo/spotplane.sqlite").exists(),
        "SQLite under ./data/demo"
    );
    let token = std::fs::read_to_string(dir.path().join("data/demo/admin-token"))
        .expect("admin token written");
    let out = p.output();
    assert!(
        out.contains(&format!("http://127.0.0.1:{port}")),
        "prints where it listens:\n{out}"
    );
    assert!(out.contains(token.trim()), "prints the admin token:\n{out}");
    assert!(p.terminate(), "exits cleanly on SIGTERM:\n{}", p.output());

    // A restart keeps the data and the token.
    let mut p = demo(dir.path(), port);
    p.wait_healthy(&format!("http://127.0.0.1:{port}/healthz"))
        .await;
    let teams = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/v1/teams"))
        .bearer_auth(token.trim())
        .send()
        .await
        .expect("teams");
    assert_eq!(teams.status(), 200);
}

/// The five-minute tour in README.md, run as written (`<!-- tour -->` marks it).
#[tokio::test]
async fn the_readme_tour_works_verbatim() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let start = readme
        .find("<!-- tour -->")
        .expect("README has a <!-- tour --> block");
    let rest = &readme[start..];
    let open = rest
        .find("```bash\n")
        .expect("a bash block follows the marker")
        + "```bash\n".len();
    let close = rest[open..].find("\n```").expect("the block ends");
    let script = &rest[open..open + close];

    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut p = demo(dir.path(), port);
    p.wait_healthy(&format!("http://127.0.0.1:{port}/healthz"))
        .await;
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir.path())
        .env("SPOTPLANE_URL", format!("http://127.0.0.1:{port}"))
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the tour failed:\n{stdout}\n{stderr}\n--- server ---\n{}",
        p.output()
    );
    for expected in [
        "\"name\": \"llama-ft\"",
        "\"state\": \"cancelled\"",
        "job.queued",
        "job.cancelled",
        "urn:spotplane:problem:validation",
        // The job with an image ran on a simulated node, whose output the logs step read.
        "\"image\": \"ghcr.io/acme/train:1\"",
        "[simulated]",
        "ghcr.io/acme/train:1 python train.py: attempt 1 started",
    ] {
        assert!(
            stdout.contains(expected),
            "tour output lacks {expected:?}:\n{stdout}"
        );
    }
}

#[tokio::test]
async fn migrate_applies_the_schema_once_on_sqlite_and_postgresql() {
    let dir = tempfile::tempdir().expect("tempdir");
    let schema = format!("spt_test_migrate_{}", std::process::id());
    let cases = [
        vec![(
            "SPOTPLANE_DATABASE__URL",
            format!("sqlite://{}/m.sqlite", dir.path().display()),
        )],
        vec![
            ("DATABASE_URL", postgres_url()),
            ("SPOTPLANE_DATABASE__SCHEMA", schema.clone()),
        ],
    ];
    for env in cases {
        for expect in ["applied m20261130_000001_initial", "the schema is current"] {
            let out = Command::new(bin("spotplane"))
                .arg("migrate")
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env("SPOTPLANE_LOG__LEVEL", "warn")
                .output()
                .expect("migrate runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{env:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(stdout.contains(expect), "{env:?}: {stdout}");
        }
    }
    let _ = Command::new("psql")
        .args([
            &postgres_url(),
            "-q",
            "-c",
            &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        ])
        .output();
}

// Issue 29 F: two `serve` processes on one SQLite data dir both led every loop.
#[tokio::test]
async fn a_second_serve_on_the_same_sqlite_database_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let serve = |port: u16, n: u32| {
        let mut cmd = Command::new(bin("spotplane"));
        cmd.current_dir(dir.path())
            .env("SPOTPLANE_SERVER__LISTEN", format!("127.0.0.1:{port}"))
            .env("SPOTPLANE_CAPACITY__CLUSTER", format!("lock-{port}"))
            .env(
                "SPOTPLANE_SIM__DATA_DIR",
                repo_root().join("../shared/data"),
            )
            .env("SPOTPLANE_LOG__LEVEL", "warn")
            .arg("serve");
        Proc::spawn(cmd, dir.path().join(format!("serve-{n}.log")))
    };
    let port = free_port();
    let mut first = serve(port, 1);
    first
        .wait_healthy(&format!("http://127.0.0.1:{port}/healthz"))
        .await;
    let mut second = serve(free_port(), 2);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Ok(Some(s)) = second.child.try_wait() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the second serve is still running:\n{}",
            second.output()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(!status.success());
    let out = second.output();
    assert!(
        out.contains("another spotplane process has the SQLite database")
            && out.contains("spotplane.sqlite"),
        "{out}"
    );
    // The first one is unharmed, and once it is gone the database can be opened again.
    assert!(first.terminate(), "{}", first.output());
    let port = free_port();
    let mut third = serve(port, 3);
    third
        .wait_healthy(&format!("http://127.0.0.1:{port}/healthz"))
        .await;
    assert!(third.terminate(), "{}", third.output());
}

#[tokio::test]
async fn an_invalid_configuration_is_refused_with_every_problem_named() {
    let out = Command::new(bin("spotplane"))
        .arg("config")
        .env("SPOTPLANE_SERVER__LISTEN", "nowhere")
        .env("SPOTPLANE_DATABASE__MAX_CONNECTIONS", "0")
        .env("SPOTPLANE_OBJECT_STORE__URL", "ftp://x")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for path in [
        "server.listen",
        "database.max_connections",
        "object_store.url",
    ] {
        assert!(stderr.contains(path), "{path} missing from:\n{stderr}");
    }
    let out = Command::new(bin("spotplane"))
        .args(["--config", "/nonexistent.toml", "config"])
        .output()
        .expect("runs");
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.toml"));
}

#[tokio::test]
async fn the_cli_submits_lists_shows_and_cancels_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let admin = "spt_e2e_admin_token_0123456789";
    let mut cmd = Command::new(bin("spotplane"));
    cmd.arg("serve")
        .env("SPOTPLANE_SERVER__LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "SPOTPLANE_DATABASE__URL",
            format!("sqlite://{}/s.sqlite", dir.path().display()),
        )
        .env("SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN", admin);
    let mut server = Proc::spawn(cmd, dir.path().join("serve.log"));
    server.wait_healthy(&format!("{url}/readyz")).await;

    let http = reqwest::Client::new();
    http.post(format!("{url}/v1/teams"))
        .bearer_auth(admin)
        .json(&json!({"name": "research"}))
        .send()
        .await
        .expect("team");
    let created: Value = http
        .post(format!("{url}/v1/teams/research/tokens"))
        .bearer_auth(admin)
        .json(&json!({"name": "cli"}))
        .send()
        .await
        .expect("token")
        .json()
        .await
        .expect("json");
    let token = created["token"].as_str().expect("secret").to_owned();

    let cli = |args: &[&str]| {
        let out = Command::new(bin("spotplane"))
            .args(args)
            .env("SPOTPLANE_URL", &url)
            .env("SPOTPLANE_TOKEN", &token)
            .output()
            .expect("cli runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let job_file = dir.path().join("job.yaml");
    std::fs::write(
        &job_file,
        "name: llama-ft\npriority: fine-tune\nreplicas: 2\nshape:\n  mig: nvidia.com/mig-3g.40gb\ncommand: [python, train.py]\n",
    )
    .expect("write job");
    let (ok, out, err) = cli(&["job", "submit", "-f", job_file.to_str().expect("path")]);
    assert!(ok, "{err}");
    let job: Value = serde_json::from_str(&out).expect("submit prints the job as JSON");
    let id = job["id"].as_str().expect("id").to_owned();
    assert_eq!(job["shape"]["mig"], "3g.40gb");

    let (ok, _, err) = cli(&["job", "submit", "-f", job_file.to_str().expect("path")]);
    assert!(
        ok && err.contains("already submitted"),
        "resubmitting the same file is idempotent: {err}"
    );

    let (ok, out, _) = cli(&["job", "list"]);
    assert!(
        ok && out.contains(&id) && out.contains("queued") && out.contains("mig 3g.40gb"),
        "{out}"
    );
    assert_eq!(out.lines().count(), 2, "one job, one header:\n{out}");
    let (ok, out, _) = cli(&["job", "show", &id]);
    assert!(ok && out.contains("\"llama-ft\""), "{out}");
    let (ok, out, _) = cli(&["job", "cancel", &id, "--reason", "done testing"]);
    assert!(ok && out.contains("cancelled"), "{out}");
    let (ok, out, _) = cli(&["job", "events", &id]);
    assert!(
        ok && out.contains("job.queued") && out.contains("done testing"),
        "{out}"
    );

    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"name": "x", "shape": {"gpu_milli": 5000}, "command": ["x"]}"#,
    )
    .expect("write");
    let (ok, _, err) = cli(&["job", "submit", "-f", bad.to_str().expect("path")]);
    assert!(!ok && err.contains("shape.gpu_milli"), "{err}");
    let (ok, _, err) = cli(&["job", "show", "0192d4e0-0000-7000-8000-000000000000"]);
    assert!(!ok && err.contains("404"), "{err}");
    assert!(
        server.terminate(),
        "serve exits cleanly on SIGTERM:\n{}",
        server.output()
    );
}

// Issue 22: the README's first command on a machine that has only the repository. The binary is
// copied to a folder with no `../shared` beside it and run there with an empty HOME and no
// SPOTPLANE_* settings: it must replay the market and jobs shipped in it.
#[test]
fn demo_runs_from_a_bare_folder_on_the_shipped_market() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let work = tmp.path().join("bare").join("clone");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&work).expect("work folder");
    std::fs::create_dir_all(&home).expect("home folder");
    let exe = work.join("spotplane");
    std::fs::copy(bin("spotplane"), &exe).expect("copy the binary");
    // Nothing named shared is reachable the way the default sim.data_dir reads it.
    assert!(!work.join("../shared").exists());
    assert!(!work.join("../shared/data").exists());
    let out = Command::new(&exe)
        .current_dir(&work)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("SPOTPLANE_LOG__LEVEL", "warn")
        .args(["demo", "--hours", "2", "--json"])
        .output()
        .expect("the copied binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo --hours 2 failed:\n{stdout}\n{stderr}"
    );
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON summary in:\n{stdout}\n{stderr}"));
    let s: Value = serde_json::from_str(line).expect("the summary is JSON");
    let text = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
    let num = |k: &str| s[k].as_f64().unwrap_or_else(|| panic!("{k} in {s}"));
    assert!(text("market").starts_with("shipped:"), "{s}");
    assert!(text("job_stream").starts_with("shipped:"), "{s}");
    assert!(num("jobs_submitted") > 0.0, "{s}");
    assert!(num("preemptions") > 0.0, "no preemptions in two hours: {s}");
    assert!(num("recoveries") > 0.0, "no recoveries: {s}");
    assert!(num("saving_pct") > 0.0, "no saving: {s}");
    assert!(
        num("cost_usd") > 0.0 && num("cost_usd") < num("ondemand_equivalent_usd"),
        "{s}"
    );
    // The demo's data went under the working folder, nothing under HOME.
    assert!(work.join("data/demo/day/spotplane.sqlite").exists());
    let in_home: Vec<_> = std::fs::read_dir(&home).expect("home").collect();
    assert!(in_home.is_empty(), "the demo wrote to HOME: {in_home:?}");
}

/// Runs the binary copied into a bare folder (no `../shared`, empty HOME, no SPOTPLANE_*
/// settings but `env`), as a user's clone would.
fn bare_run(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let work = tmp.path().join("clone");
    std::fs::create_dir_all(&work).expect("work folder");
    let exe = work.join("spotplane");
    std::fs::copy(bin("spotplane"), &exe).expect("copy the binary");
    let mut cmd = Command::new(&exe);
    cmd.current_dir(&work)
        .env_clear()
        .env("HOME", tmp.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("SPOTPLANE_LOG__LEVEL", "warn")
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the copied binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// Issue 28: today's GPUs on all three clouds in the embedded default.
#[test]
fn offers_list_h100s_on_all_three_clouds_in_the_embedded_default() {
    let (ok, stdout, stderr) = bare_run(
        &["offers", "--gpu", "H100-80GB", "--limit", "0", "--json"],
        &[],
    );
    assert!(ok, "offers failed:\n{stdout}\n{stderr}");
    let offers: Vec<Value> = serde_json::from_str(&stdout).expect("a JSON list of offers");
    for cloud in ["aws", "gcp", "azure"] {
        let types: Vec<&str> = offers
            .iter()
            .filter(|o| o["cloud"] == cloud)
            .filter_map(|o| o["instance_type"].as_str())
            .collect();
        assert!(!types.is_empty(), "no H100 offer on {cloud}: {stdout}");
        assert!(
            offers
                .iter()
                .filter(|o| o["cloud"] == cloud)
                .all(|o| o["gpu_model"] == "H100-80GB"),
            "{cloud}: only H100s"
        );
    }
    let has = |t: &str| offers.iter().any(|o| o["instance_type"] == t);
    assert!(has("p5.48xlarge"), "AWS P5: {stdout}");
    assert!(has("a3-highgpu-8g"), "GCP A3: {stdout}");
    assert!(
        has("Standard_ND96isr_H100_v5"),
        "Azure ND H100 v5: {stdout}"
    );
    // And the rest of today's families are in the catalog.
    for (gpu, t) in [
        ("H200-141GB", "p5en.48xlarge"),
        ("B200-180GB", "p6-b200.48xlarge"),
        ("L40S", "g6e.xlarge"),
        ("L4", "g6.xlarge"),
        ("H200-141GB", "a3-ultragpu-8g"),
        ("H200-141GB", "Standard_ND96isr_H200_v5"),
    ] {
        let (ok, stdout, stderr) = bare_run(&["offers", "--gpu", gpu, "--limit", "0"], &[]);
        assert!(ok, "{stderr}");
        assert!(
            stdout.contains(t),
            "{t} not offered for --gpu {gpu}:\n{stdout}"
        );
    }
}

// Issue 28: `spotplane config` prints no password, token or key.
#[test]
fn config_prints_no_secret() {
    let key = "c3BvdHBsYW5lLXRlc3Qta2V5LTMyLWJ5dGVzLWxvbmc=";
    let (ok, stdout, stderr) = bare_run(
        &["config"],
        &[
            (
                "DATABASE_URL",
                "postgres://spot:hunter2@db.internal:5432/spot",
            ),
            ("SPOTPLANE_SECRETS__KEY", key),
        ],
    );
    assert!(ok, "config failed:\n{stdout}\n{stderr}");
    assert!(
        !stdout.contains("hunter2") && !stdout.contains(key),
        "{stdout}"
    );
    assert!(
        stdout.contains("postgres://spot:redacted@db.internal:5432/spot"),
        "{stdout}"
    );
}
