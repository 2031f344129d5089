//! The control plane's container image (the repository's Dockerfile), built with podman from a
//! local context and run against PostgreSQL.
//!
//! No registry is reachable here, so the Dockerfile's `builder` and `runtime-base` stages
//! (which start from docker.io images) are replaced through its build arguments by two imported
//! images: the `spotplane` binary the tests built, and a root with its shared libraries, the
//! CA certificates and the `spotplane` user (uid 10001) that `runtime-base` makes. The
//! `runtime` stage, what users run, is built from the Dockerfile as it is.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spotplane_tests::{
    CONTAINER_ULIMITS, OCI_RUNTIME, bin, free_port, podman_or_skip, postgres_url, repo_root,
};

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("podman {args:?} does not start: {e}"))
}

fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Removes what the test made, however it ends.
struct Cleanup {
    container: String,
    images: Vec<String>,
    schema: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let quiet = |args: &[&str]| {
            let _ = Command::new("podman")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        quiet(&["rm", "--force", "--time", "0", &self.container]);
        for image in &self.images {
            quiet(&["rmi", "--force", image]);
        }
        let _ = Command::new("psql")
            .args([
                &postgres_url(),
                "-q",
                "-c",
                &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema),
            ])
            .output();
    }
}

/// `podman import` of the folder `root` as `tag`; `owned` (paths in it) belong to uid 10001.
fn import(root: &Path, owned: &[&str], tag: &str) {
    let tar = root.with_extension("tar");
    let mut base = Command::new("tar");
    base.arg("-C")
        .arg(root)
        .args(["--owner=0", "--group=0", "--numeric-owner"]);
    for path in owned {
        base.arg(format!("--exclude=./{path}"));
    }
    let status = base
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .expect("tar runs");
    assert!(status.success(), "tar of {}", root.display());
    for path in owned {
        let status = Command::new("tar")
            .arg("-C")
            .arg(root)
            .args(["--owner=10001", "--group=10001", "--numeric-owner", "-rf"])
            .arg(&tar)
            .arg(format!("./{path}"))
            .status()
            .expect("tar runs");
        assert!(status.success(), "tar -r {path}");
    }
    podman_ok(&["import", &tar.display().to_string(), tag]);
}

/// Copies `from` to the same path under `root` (or to `to`).
fn place(root: &Path, from: &Path, to: Option<&Path>) {
    let inside = to.unwrap_or(from);
    let at = root.join(inside.strip_prefix("/").expect("an absolute path"));
    std::fs::create_dir_all(at.parent().expect("a parent")).expect("mkdir");
    std::fs::copy(from, &at).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
}

/// The shared libraries `ldd` names for `program`.
fn libraries(program: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().expect("ldd runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|t| t.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

async fn wait_healthy(url: &str, container: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(r) = reqwest::get(url).await
            && r.status().is_success()
        {
            return;
        }
        let running = podman(&["inspect", "--format", "{{.State.Running}}", container]);
        let logs = || String::from_utf8_lossy(&podman(&["logs", container]).stderr).into_owned();
        assert!(
            String::from_utf8_lossy(&running.stdout).trim() == "true",
            "the container stopped before {url} answered:\n{}",
            logs()
        );
        assert!(
            Instant::now() < deadline,
            "{url} did not answer within 90 s:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn the_image_serves_healthz_and_the_tour_against_postgresql() {
    if !podman_or_skip() {
        return;
    }
    let id = std::process::id();
    let base = format!("localhost/spotplane-image-test-base:{id}");
    let binary = format!("localhost/spotplane-image-test-binary:{id}");
    let image = format!("localhost/spotplane-image-test:{id}");
    let container = format!("spotplane-image-test-{id}");
    let schema = format!("spt_test_image_{id}");
    let _cleanup = Cleanup {
        container: container.clone(),
        images: vec![image.clone(), binary.clone(), base.clone()],
        schema: schema.clone(),
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let spotplane = bin("spotplane");

    // What `runtime-base` makes: the libraries, CA certificates, the user and its folders.
    let root = tmp.path().join("base");
    for lib in libraries(&spotplane) {
        place(&root, &lib, None);
    }
    let ca = Path::new("/etc/ssl/certs/ca-certificates.crt");
    assert!(
        ca.exists(),
        "{} is missing (apt-get install ca-certificates)",
        ca.display()
    );
    place(&root, ca, None);
    std::fs::create_dir_all(root.join("etc")).expect("mkdir etc");
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/usr/sbin/nologin\n\
         spotplane:x:10001:10001::/var/lib/spotplane:/usr/sbin/nologin\n",
    )
    .expect("passwd");
    std::fs::write(root.join("etc/group"), "root:x:0:\nspotplane:x:10001:\n").expect("group");
    for dir in ["var/lib/spotplane", "etc/spotplane", "tmp"] {
        std::fs::create_dir_all(root.join(dir)).expect("mkdir");
    }
    std::fs::set_permissions(
        root.join("tmp"),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .expect("chmod tmp");
    import(&root, &["var/lib/spotplane", "etc/spotplane"], &base);

    // What `builder` leaves: /usr/local/bin/spotplane.
    let out = tmp.path().join("binary");
    place(
        &out,
        &spotplane,
        Some(Path::new("/usr/local/bin/spotplane")),
    );
    import(&out, &[], &binary);

    // The Dockerfile's runtime stage, from an empty local context.
    let context = tmp.path().join("context");
    std::fs::create_dir(&context).expect("mkdir context");
    let dockerfile = repo_root().join("Dockerfile");
    let build = podman(&[
        "build",
        "--format",
        "docker",
        "--pull=never",
        "--target",
        "runtime",
        "--build-arg",
        &format!("BINARY_STAGE={binary}"),
        "--build-arg",
        &format!("RUNTIME_BASE={base}"),
        "-f",
        &dockerfile.display().to_string(),
        "-t",
        &image,
        &context.display().to_string(),
    ]);
    assert!(
        build.status.success(),
        "podman build of the Dockerfile's runtime stage:\n{}{}",
        String::from_utf8_lossy(&build.stdout),
        String::from_utf8_lossy(&build.stderr)
    );

    // What the Dockerfile promises users (and the Terraform modules rely on).
    let config: Value = serde_json::from_str(&podman_ok(&[
        "image",
        "inspect",
        "--format",
        "{{json .Config}}",
        &image,
    ]))
    .expect("image config");
    assert_eq!(config["User"], "10001:10001", "a non-root user: {config}");
    assert_eq!(config["Entrypoint"], json!(["/usr/local/bin/spotplane"]));
    assert_eq!(config["Cmd"], json!(["serve"]));
    assert!(
        config["ExposedPorts"].get("8080/tcp").is_some(),
        "EXPOSE 8080: {config}"
    );
    let health: Value = serde_json::from_str(&podman_ok(&[
        "image",
        "inspect",
        "--format",
        "{{json .HealthCheck}}",
        &image,
    ]))
    .expect("healthcheck");
    assert_eq!(
        health["Test"],
        json!(["CMD", "/usr/local/bin/spotplane", "healthcheck"]),
        "HEALTHCHECK: {health}"
    );

    // Run it as the Terraform modules do: `serve --config /etc/spotplane/spotplane.toml` on a
    // read-only root, the database URL and the first admin token from the environment.
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let admin = format!("image-test-admin-{id}-{port}-0123456789abcdef");
    let config_dir = tmp.path().join("config");
    std::fs::create_dir(&config_dir).expect("mkdir config");
    std::fs::write(
        config_dir.join("spotplane.toml"),
        "# No clouds: the test asks the API only.\nproviders = []\n\n[log]\nformat = \"json\"\n",
    )
    .expect("config file");
    let mut run = vec![
        "run".to_owned(),
        "--detach".into(),
        "--name".into(),
        container.clone(),
        "--runtime".into(),
        OCI_RUNTIME.into(),
        "--network".into(),
        "host".into(),
        // The AWS module's task has a read-only root filesystem (and no tmpfs on /tmp).
        "--read-only".into(),
        "--read-only-tmpfs=false".into(),
        "--volume".into(),
        format!("{}:/etc/spotplane:ro", config_dir.display()),
    ];
    for u in CONTAINER_ULIMITS {
        run.extend(["--ulimit".into(), u.into()]);
    }
    for (k, v) in [
        ("DATABASE_URL", postgres_url()),
        ("SPOTPLANE_DATABASE__SCHEMA", schema.clone()),
        ("SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN", admin.clone()),
        // 32 bytes in base64, as the modules' secrets key (the default key file cannot be
        // written on a read-only root).
        (
            "SPOTPLANE_SECRETS__KEY",
            "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=".into(),
        ),
        ("SPOTPLANE_SERVER__LISTEN", format!("127.0.0.1:{port}")),
        ("SPOTPLANE_HEALTHCHECK_URL", format!("{url}/healthz")),
    ] {
        run.extend(["--env".into(), format!("{k}={v}")]);
    }
    run.extend([
        image.clone(),
        "serve".into(),
        "--config".into(),
        "/etc/spotplane/spotplane.toml".into(),
    ]);
    let args: Vec<&str> = run.iter().map(String::as_str).collect();
    podman_ok(&args);

    wait_healthy(&format!("{url}/healthz"), &container).await;
    let http = reqwest::Client::new();
    let ready = http
        .get(format!("{url}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200, "ready on PostgreSQL");
    // The image's own HEALTHCHECK, run inside the container.
    let check = podman(&["healthcheck", "run", &container]);
    assert!(
        check.status.success(),
        "podman healthcheck run: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    // The server runs as the image's user, not root.
    let top = podman_ok(&["top", &container, "user"]);
    assert_eq!(
        top.lines().nth(1).map(str::trim),
        Some("spotplane"),
        "podman top: {top}"
    );

    // The README tour's first steps: a team, its token, a job, the job read back.
    let team = http
        .post(format!("{url}/v1/teams"))
        .bearer_auth(&admin)
        .json(&json!({"name": "research", "weight": 2,
            "quotas": {"H100-80GB": {"nominal": 8}, "mig-3g.40gb": {"nominal": 4}}}))
        .send()
        .await
        .expect("create a team");
    assert_eq!(
        team.status(),
        201,
        "{}",
        team.text().await.unwrap_or_default()
    );
    let token: Value = http
        .post(format!("{url}/v1/teams/research/tokens"))
        .bearer_auth(&admin)
        .json(&json!({"name": "alice"}))
        .send()
        .await
        .expect("create a token")
        .json()
        .await
        .expect("token json");
    let token = token["token"]
        .as_str()
        .expect("the token's secret")
        .to_owned();
    let submitted = http
        .post(format!("{url}/v1/jobs"))
        .bearer_auth(&token)
        .header("Idempotency-Key", "llama-ft-1")
        .json(
            &json!({"name": "llama-ft", "priority": "fine-tune", "replicas": 2,
            "shape": {"mig": "3g.40gb"}, "command": ["python", "train.py"],
            "checkpoint": {"uri": "s3://my-bucket/llama-ft", "interval_s": 600}}),
        )
        .send()
        .await
        .expect("submit a job");
    assert_eq!(submitted.status(), 201);
    let job: Value = submitted.json().await.expect("job json");
    let job_id = job["id"].as_str().expect("job id");
    let read: Value = http
        .get(format!("{url}/v1/jobs/{job_id}"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("read the job")
        .json()
        .await
        .expect("job json");
    assert_eq!(read["name"], "llama-ft");
    assert_eq!(read["shape"], json!({"mig": "3g.40gb"}));
    let list: Value = http
        .get(format!("{url}/v1/jobs"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("list jobs")
        .json()
        .await
        .expect("list json");
    assert!(
        list["items"]
            .as_array()
            .is_some_and(|items| items.iter().any(|j| j["id"] == job_id)),
        "the job is listed: {list}"
    );

    // SIGTERM (podman stop) ends it cleanly.
    podman_ok(&["stop", "--time", "30", &container]);
    let code = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &container]);
    assert_eq!(
        code,
        "0",
        "exit status after SIGTERM:\n{}",
        String::from_utf8_lossy(&podman(&["logs", &container]).stderr)
    );
}

/// `spotplane healthcheck`, the image's HEALTHCHECK: 0 on a 200, otherwise an error that names
/// the URL and what it got.
#[tokio::test]
async fn healthcheck_passes_on_a_serving_server_and_fails_naming_the_url_otherwise() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("spotplane.toml"), "providers = []\n").expect("config");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut serve = Command::new(bin("spotplane"));
    serve
        .current_dir(dir.path())
        .args(["serve", "--config", "spotplane.toml"])
        .env_remove("DATABASE_URL")
        .env("SPOTPLANE_SERVER__LISTEN", format!("127.0.0.1:{port}"))
        .env("SPOTPLANE_LOG__LEVEL", "warn");
    let mut p = spotplane_tests::Proc::spawn(serve, dir.path().join("serve.log"));
    p.wait_healthy(&format!("{url}/healthz")).await;

    let check = |url: String| {
        Command::new(bin("spotplane"))
            .args(["healthcheck", "--timeout", "5s"])
            .env("SPOTPLANE_HEALTHCHECK_URL", &url)
            .output()
            .expect("spotplane healthcheck runs")
    };
    let ok = check(format!("{url}/healthz"));
    assert!(
        ok.status.success(),
        "healthcheck of a serving server: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let missing = check(format!("{url}/no-such-page"));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success(), "a 404 is not healthy");
    assert!(
        stderr.contains(&format!("{url}/no-such-page answered 404")),
        "{stderr}"
    );
    assert!(p.terminate(), "serve exits on SIGTERM:\n{}", p.output());
    let down = check(format!("{url}/healthz"));
    let stderr = String::from_utf8_lossy(&down.stderr);
    assert!(!down.status.success(), "nothing listens: not healthy");
    assert!(
        stderr.contains(&format!("{url}/healthz does not answer")),
        "{stderr}"
    );
}
