//! Helpers for end-to-end tests that start the real binaries.
//!
//! The binaries are found next to the test executable (`target/<profile>/`), where
//! `cargo test --workspace` (and `scripts/test`, which builds them first) puts them.

pub mod agents;
pub mod cluster;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The path of a workspace binary, e.g. `spotplane`.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target directory");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build --workspace --bins` (scripts/test does) first",
        path.display()
    );
    path
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_owned()
}

pub fn postgres_url() -> String {
    std::env::var("SPOTPLANE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The database a test's control plane runs on.
#[derive(Clone, Copy, Debug)]
pub enum Db {
    Sqlite,
    Postgres,
}

impl Db {
    /// The `[database]` table's lines: a SQLite file in `dir`, or a schema of its own
    /// (`spt_test_<name>_<pid>_<port>`) on the test PostgreSQL.
    pub fn config(self, dir: &Path, name: &str, port: u16) -> String {
        match self {
            Db::Sqlite => format!(
                "url = \"sqlite://{}\"",
                dir.join("spotplane.sqlite").display()
            ),
            Db::Postgres => format!(
                "url = \"{}\"\nschema = \"spt_test_{name}_{}_{port}\"",
                postgres_url(),
                std::process::id()
            ),
        }
    }
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A child process that is killed when dropped, with its output in a file for failures.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(mut cmd: Command, log: PathBuf) -> Proc {
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = cmd
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("process starts");
        Proc { child, log }
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `url` answers 200, or panics with the process's output.
    pub async fn wait_healthy(&mut self, url: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "process exited with {status} before {url} answered:\n{}",
                    self.output()
                );
            }
            if let Ok(r) = reqwest::get(url).await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{url} did not answer within 60 s:\n{}", self.output());
    }

    /// Sends SIGTERM and waits up to 30 s for the process to exit; returns whether it exited
    /// successfully.
    pub fn terminate(&mut self) -> bool {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Kills the process and waits for it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether this process runs as root (its effective uid is 0): the agents the tests start then
/// isolate replicas as a real node's agent does.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|u| u.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// A uid range (10,000 uids from the value returned) of its own for one test agent: agents
/// side by side on one machine must not share the workloads' users, as each kills what its
/// freed users left running. Apart from every other agent of this process (a counter) and of
/// other test processes (the pid).
pub fn workload_uid_base() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 100;
    1_000_000 + ((std::process::id() % 1000) * 100 + n) * 10_000
}

/// The isolation flags of an agent a test starts: a user per job, from a uid range of its own,
/// when the test runs as root (as in CI); else replicas run as the test's own user.
pub fn agent_isolation_args() -> Vec<String> {
    if is_root() {
        vec![
            "--workload-uid-base".into(),
            workload_uid_base().to_string(),
            "--workload-uid-count".into(),
            "10000".into(),
        ]
    } else {
        eprintln!("not root: replicas run with --workload-isolation none");
        vec!["--workload-isolation".into(), "none".into()]
    }
}

/// Where [`reachable_workload`] puts the example workload in `dir`.
pub fn workload_path(dir: &Path) -> PathBuf {
    dir.join("bin").join("spotplane-example-train")
}

/// Makes `dir` searchable by the workloads' users (0711, as `/var/lib` is) and puts `example`
/// where they can run it (the target folder may be under a home only root may enter); returns
/// its path there.
pub fn reachable_workload(dir: &Path, example: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let to = workload_path(dir);
    let bin = to.parent().expect("bin folder");
    std::fs::create_dir_all(bin).expect("bin");
    std::fs::set_permissions(bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    if std::fs::hard_link(example, &to).is_err() {
        std::fs::copy(example, &to).expect("copy the example workload");
    }
    to
}

/// The image the container tests run: the example workload (at [`IMAGE_WORKLOAD`]), with
/// `/bin/sh` and `/bin/sleep` for scripted workloads, built locally by [`test_image`].
pub const TEST_IMAGE: &str = "localhost/spotplane-example-train:test";
/// Where the example workload is in [`TEST_IMAGE`].
pub const IMAGE_WORKLOAD: &str = "/usr/local/bin/spotplane-example-train";
/// The ulimits containers get in the tests: in this sandbox the OCI runtime cannot raise a
/// limit, and podman's defaults would (crun fails on `setrlimit RLIMIT_NPROC`).
pub const CONTAINER_ULIMITS: [&str; 2] = ["nofile=1024:1024", "nproc=1024:1024"];
/// The OCI runtime of the tests' containers (runc accepts the lowered ulimits; crun does not).
pub const OCI_RUNTIME: &str = "runc";

/// Whether podman answers. Without it a test that needs it says so and passes, unless
/// `SPOTPLANE_TEST_REQUIRE_EMULATORS` is set (scripts/test installs podman): then it fails.
pub fn podman_or_skip() -> bool {
    let ok = Command::new("podman")
        .args(["version", "--format", "{{.Client.Version}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("SPOTPLANE_TEST_REQUIRE_EMULATORS").is_none(),
            "podman does not answer and SPOTPLANE_TEST_REQUIRE_EMULATORS is set: install it (scripts/test does)"
        );
        eprintln!("skipped: podman is not installed");
    }
    ok
}

/// The container flags of an agent a test starts: podman, with [`OCI_RUNTIME`] and
/// [`CONTAINER_ULIMITS`].
pub fn container_engine_args() -> Vec<String> {
    let mut a = vec![
        "--container-runtime".into(),
        "podman".into(),
        "--oci-runtime".into(),
        OCI_RUNTIME.into(),
    ];
    for u in CONTAINER_ULIMITS {
        a.push("--container-ulimit".into());
        a.push(u.into());
    }
    a
}

/// The files a program needs to run in an empty root: itself and the shared libraries
/// `ldd` names.
fn with_libraries(program: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().expect("ldd runs");
    let mut files = vec![program.to_owned()];
    // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)`, `/lib64/ld-linux-x86-64.so.2 (0x…)`;
    // a static program: "not a dynamic executable".
    for token in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if token.starts_with('/') {
            files.push(PathBuf::from(token));
        }
    }
    files
}

/// Held while one test process builds [`TEST_IMAGE`]: a folder, made atomically, removed when
/// dropped (or by another process once it is older than a build can take).
struct BuildLock(PathBuf);

impl BuildLock {
    fn take() -> BuildLock {
        let path = std::env::temp_dir().join("spotplane-test-image.lock");
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            match std::fs::create_dir(&path) {
                Ok(()) => return BuildLock(path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let stale = std::fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > Duration::from_secs(120));
                    if stale {
                        let _ = std::fs::remove_dir(&path);
                    }
                    assert!(
                        Instant::now() < deadline,
                        "{} held for 5 minutes",
                        path.display()
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("cannot make {}: {e}", path.display()),
            }
        }
    }
}

impl Drop for BuildLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Builds [`TEST_IMAGE`] with `podman import` of a root holding `example` (at
/// [`IMAGE_WORKLOAD`]), `/bin/sh`, `/bin/sleep` and their libraries: no registry needed.
/// Built again only when `example` changed (its size and time, kept in a label), by one test
/// process at a time.
pub fn test_image(example: &Path) -> String {
    let meta = std::fs::metadata(example).expect("the example workload is built");
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let source = format!("{}-{modified}", meta.len());
    let _lock = BuildLock::take();
    // (id, source) of the image under the tag now.
    let current = Command::new("podman")
        .args([
            "image",
            "inspect",
            "--format",
            "{{.Id}} {{index .Labels \"spotplane.test.source\"}}",
            TEST_IMAGE,
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let previous = match current.as_deref().and_then(|c| c.split_once(' ')) {
        Some((_, s)) if s == source => return TEST_IMAGE.to_owned(),
        Some((id, _)) => Some(id.to_owned()),
        None => None,
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("root");
    let place = |from: &Path, to: &Path| {
        let at = root.join(to.strip_prefix("/").expect("absolute"));
        std::fs::create_dir_all(at.parent().expect("parent")).expect("mkdir");
        std::fs::copy(from, &at).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
    };
    for (program, inside) in [
        (example.to_owned(), PathBuf::from(IMAGE_WORKLOAD)),
        (PathBuf::from("/bin/sh"), PathBuf::from("/bin/sh")),
        (PathBuf::from("/bin/sleep"), PathBuf::from("/bin/sleep")),
    ] {
        let files = with_libraries(&program);
        place(&program, &inside);
        for lib in &files[1..] {
            place(lib, lib);
        }
    }
    let tar = tmp.path().join("root.tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .expect("tar runs");
    assert!(status.success(), "tar of the image root failed");
    let out = Command::new("podman")
        .args(["import", "--change"])
        .arg(format!("LABEL spotplane.test.source={source}"))
        .arg(&tar)
        .arg(TEST_IMAGE)
        .output()
        .expect("podman import runs");
    assert!(
        out.status.success(),
        "podman import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The image of an older build, untagged now (kept while a container still uses it).
    if let Some(id) = previous {
        let _ = Command::new("podman")
            .args(["rmi", &id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    TEST_IMAGE.to_owned()
}

/// Removes every container an agent of `node` made (the tests' agents die without cleaning
/// up, as a lost machine's would; the next agent of a node would remove them).
pub fn remove_node_containers(node: &str) {
    let Ok(out) = Command::new("podman")
        .args([
            "ps",
            "--all",
            "--filter",
            &format!("label=spotplane.node={node}"),
            "--format",
            "{{.Names}}",
        ])
        .output()
    else {
        return;
    };
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    if !names.is_empty() {
        let _ = Command::new("podman")
            .args(["rm", "--force"])
            .args(&names)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Whether a container of this name exists.
pub fn container_exists(name: &str) -> bool {
    Command::new("podman")
        .args(["container", "exists", name])
        .status()
        .is_ok_and(|s| s.success())
}

/// `spotplane demo` on a free port in `dir`, its world at 3600×, once it answers `/healthz`:
/// the process, its URL and the admin token it wrote to `data/demo/admin-token`.
pub async fn live_demo(dir: &Path) -> (Proc, String, String) {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut cmd = Command::new(bin("spotplane"));
    cmd.current_dir(dir)
        .env_remove("SPOTPLANE_BOOTSTRAP_ADMIN_TOKEN")
        .env("SPOTPLANE_LOG__LEVEL", "warn")
        .args([
            "demo",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--speed",
            "3600",
        ]);
    let mut demo = Proc::spawn(cmd, dir.join("demo.log"));
    demo.wait_healthy(&format!("{url}/healthz")).await;
    let token = std::fs::read_to_string(dir.join("data/demo/admin-token"))
        .expect("the demo writes its admin token")
        .trim()
        .to_owned();
    (demo, url, token)
}
