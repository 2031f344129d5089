//! Helpers for end-to-end tests that start the real binaries.
//!
//! The binaries are found next to the test executable (`target/<profile>/`), where
//! `cargo test --workspace` (and `scripts/test`, which builds them first) puts them.

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
