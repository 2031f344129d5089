//! Replicas of jobs with an image, with the real agent loop and real podman: the workload
//! contract through the container (checkpoint on the signal through the bind-mounted folder,
//! files owned by the job's user, SIGTERM then SIGKILL, exit codes), the failures of a start
//! (a pull that fails, an image that does not exist, no engine), and the containers an earlier
//! agent left. The image is built locally ([`spotplane_tests::test_image`]): no registry.
//!
//! Without podman these tests say so and pass, unless `SPOTPLANE_TEST_REQUIRE_EMULATORS` is set.

mod stubs;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use spotplane_agent::agent::{AgentConfig, Deps, run};
use spotplane_agent::container::{self, EngineSettings, RuntimeChoice};
use spotplane_agent::mig::NvidiaSmi;
use spotplane_agent::notice::{CloudKind, ReqwestMetadata, source_for};
use spotplane_agent::telemetry::FixedTelemetry;
use spotplane_core::agent::{CheckpointOutcome, RegistryCredential, ReplicaPhase};
use spotplane_core::{CommandId, JobId, NodeId};
use spotplane_tests::{IMAGE_WORKLOAD, OCI_RUNTIME};
use stubs::{ControlPlaneStub, ImdsStub, eventually};
use tokio_util::sync::CancellationToken;

struct RunningAgent {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    node: NodeId,
    work: std::path::PathBuf,
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        self.cancel.cancel();
        spotplane_tests::remove_node_containers(&self.node.to_string());
    }
}

fn podman_settings(runtime: RuntimeChoice) -> EngineSettings {
    EngineSettings {
        runtime,
        oci_runtime: Some(OCI_RUNTIME.into()),
        ulimits: spotplane_tests::CONTAINER_ULIMITS
            .iter()
            .map(|u| u.to_string())
            .collect(),
        ..EngineSettings::default()
    }
}

async fn start_agent(
    cp: &ControlPlaneStub,
    imds_url: &str,
    dir: &Path,
    node: NodeId,
    containers: EngineSettings,
) -> RunningAgent {
    let token_file = dir.join("bootstrap-token");
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::write(
        &token_file,
        format!("spb_{}_{}\n", node.as_uuid().simple(), "s3cr3t"),
    )
    .expect("token file");
    let work = dir.join("work");
    let mut cfg = AgentConfig::new(&cp.url, &token_file, &work);
    cfg.isolation = stubs::isolation();
    cfg.workload_uid_base = spotplane_tests::workload_uid_base();
    cfg.workload_uid_count = 10_000;
    cfg.heartbeat_interval = Some(Duration::from_millis(200));
    cfg.notice_poll_interval = Some(Duration::from_millis(100));
    cfg.drain_grace = Duration::from_secs(5);
    cfg.containers = containers;
    let http = Arc::new(ReqwestMetadata::new(Duration::from_secs(2)).expect("http"));
    let deps = Deps {
        notices: source_for(CloudKind::Aws, http, imds_url, None),
        telemetry: Box::new(FixedTelemetry(Vec::new())),
        mig: Arc::new(NvidiaSmi),
        clock: Arc::new(chrono::Utc::now),
    };
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = run(cfg, deps, c).await {
            panic!("agent failed: {e}");
        }
    });
    eventually("the agent registers", || cp.registered(node).then_some(())).await;
    RunningAgent {
        cancel,
        task,
        node,
        work,
    }
}

fn new_node() -> NodeId {
    NodeId(uuid::Uuid::now_v7())
}

fn start(job: JobId, image: &str, command: &[&str], store: &str) -> Value {
    json!({"type": "start", "job_id": job, "replica": 0, "attempt": 0, "image": image,
        "command": command, "env": {"TRAIN_STEP_MS": "20", "TRAIN_WEIGHTS_BYTES": "100000"},
        "devices": [], "checkpoint_uri": store, "limits": {"cpu_milli": 500, "memory_mib": 256}})
}

fn attempt_dir(a: &RunningAgent, job: JobId) -> std::path::PathBuf {
    a.work
        .join("jobs")
        .join(job.to_string())
        .join("replica-0")
        .join("attempt-0")
}

fn output(a: &RunningAgent, job: JobId) -> String {
    std::fs::read_to_string(attempt_dir(a, job).join("output.log")).unwrap_or_default()
}

async fn result_of(cp: &ControlPlaneStub, id: CommandId) -> spotplane_core::agent::CommandResult {
    eventually("the command's result", || cp.result(id)).await
}

/// The image, built once for all these tests; `None` (skip) without podman.
fn image() -> Option<String> {
    if !spotplane_tests::podman_or_skip() {
        return None;
    }
    Some(spotplane_tests::test_image(Path::new(env!(
        "CARGO_BIN_EXE_spotplane-example-train"
    ))))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_replica_checkpoints_on_the_signal_as_its_user_and_stops_with_143() {
    let Some(image) = image() else { return };
    let tmp = stubs::node_dir();
    let store = format!("file://{}/bucket/jobs/c", tmp.path().display());
    let cp = ControlPlaneStub::start().await;
    let imds = ImdsStub::start().await;
    let mut a = start_agent(
        &cp,
        &imds.url,
        &tmp.path().join("a"),
        new_node(),
        podman_settings(RuntimeChoice::Auto),
    )
    .await;
    // `auto` found podman (the docker CLI here has no daemon).
    let engine = cp
        .registration(a.node)
        .and_then(|r| r.container_engine)
        .expect("an engine at registration");
    assert_eq!(engine.kind, "podman");
    assert!(!engine.version.is_empty() && !engine.cdi, "{engine:?}");

    let job = JobId(uuid::Uuid::now_v7());
    let started = cp.queue(a.node, start(job, &image, &[IMAGE_WORKLOAD], &store));
    let r = result_of(&cp, started).await;
    let name = container::container_name(job, 0, 0);
    assert!(r.ok, "{r:?}\n{}", output(&a, job));
    assert_eq!(
        r.message.as_deref(),
        Some(format!("started container {name}").as_str())
    );
    assert!(spotplane_tests::container_exists(&name));
    eventually("it runs", || {
        (cp.replica_phase(a.node, job) == Some(ReplicaPhase::Running)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;

    // The checkpoint signal reaches the workload in its container; the marker comes back
    // through the bind mount.
    let ckpt = cp.queue(
        a.node,
        json!({"type": "checkpoint", "job_id": job, "replica": 0,
            "checkpoint_id": spotplane_core::CheckpointId(uuid::Uuid::now_v7()), "uri": store, "deadline": null}),
    );
    let r = result_of(&cp, ckpt).await;
    assert!(r.ok, "{r:?}\n{}", output(&a, job));
    let manifest = r.manifest.expect("manifest");
    let paths: Vec<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["state.json", "weights.bin"]);
    let report = eventually("the checkpoint report", || {
        cp.checkpoints().into_iter().find(|c| c.job_id == job)
    })
    .await;
    assert_eq!(report.outcome, CheckpointOutcome::Durable);
    let log = output(&a, job);
    assert!(log.contains("checkpoint step="), "{log}");
    // Written by the job's user inside the container, so owned by it on the host.
    let state =
        std::fs::metadata(attempt_dir(&a, job).join("checkpoint/state.json")).expect("state");
    if stubs::isolation() == spotplane_agent::isolation::Isolation::User {
        let uid = state.uid();
        assert!(
            (1_000_000..u32::MAX).contains(&uid) && state.gid() == uid,
            "owned by the job's user, not root: {uid}"
        );
    }

    // Stop: SIGTERM through the engine; the example ends with 143, which the engine passes on.
    let stop = cp.queue(
        a.node,
        json!({"type": "stop", "job_id": job, "replica": 0, "grace_ms": 10_000}),
    );
    let r = result_of(&cp, stop).await;
    assert_eq!(
        r.message.as_deref(),
        Some("stopped: exit code 143"),
        "{r:?}"
    );
    assert!(output(&a, job).contains("terminated step="));
    eventually("its container is removed", || {
        (!spotplane_tests::container_exists(&name)).then_some(())
    })
    .await;
    a.cancel.cancel();
    (&mut a.task).await.expect("the agent stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_ignoring_sigterm_is_killed_after_the_grace_and_exit_codes_pass_through() {
    let Some(image) = image() else { return };
    let tmp = stubs::node_dir();
    let store = format!("file://{}/bucket/jobs/k", tmp.path().display());
    let cp = ControlPlaneStub::start().await;
    let imds = ImdsStub::start().await;
    let a = start_agent(
        &cp,
        &imds.url,
        &tmp.path().join("a"),
        new_node(),
        podman_settings(RuntimeChoice::Podman),
    )
    .await;

    let stubborn = JobId(uuid::Uuid::now_v7());
    let s = cp.queue(
        a.node,
        start(
            stubborn,
            &image,
            &[
                "/bin/sh",
                "-c",
                "trap '' TERM; echo ready; while true; do sleep 0.1; done",
            ],
            &store,
        ),
    );
    let r = result_of(&cp, s).await;
    assert!(r.ok, "{r:?}");
    eventually("it runs", || {
        output(&a, stubborn).contains("ready").then_some(())
    })
    .await;
    let begun = std::time::Instant::now();
    let stop = cp.queue(
        a.node,
        json!({"type": "stop", "job_id": stubborn, "replica": 0, "grace_ms": 1500}),
    );
    let r = result_of(&cp, stop).await;
    assert_eq!(
        r.message.as_deref(),
        Some("stopped: killed by signal 9"),
        "{r:?}"
    );
    assert!(
        begun.elapsed() >= Duration::from_millis(1500),
        "after the grace"
    );

    // The workload's own exit code is the replica's.
    let seven = JobId(uuid::Uuid::now_v7());
    cp.queue(
        a.node,
        start(
            seven,
            &image,
            &["/bin/sh", "-c", "echo bye; exit 7"],
            &store,
        ),
    );
    let code = eventually("it exits", || cp.replica_exit(a.node, seven)).await;
    assert_eq!(code, 7, "{}", output(&a, seven));
    assert_eq!(output(&a, seven).trim(), "bye");
    eventually("its container is removed", || {
        (!spotplane_tests::container_exists(&container::container_name(seven, 0, 0))).then_some(())
    })
    .await;

    // The job's working directory is where its command starts inside the image.
    let wd = JobId(uuid::Uuid::now_v7());
    let mut cmd = start(wd, &image, &["/bin/sh", "-c", "pwd"], &store);
    cmd["working_dir"] = json!("/bin");
    cp.queue(a.node, cmd);
    let code = eventually("it exits", || cp.replica_exit(a.node, wd)).await;
    assert_eq!(code, 0, "{}", output(&a, wd));
    assert_eq!(output(&a, wd).trim(), "/bin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_init_a_workload_without_a_sigterm_handler_ends_on_sigterm() {
    let Some(image) = image() else { return };
    // podman's `--init` is catatonit (scripts/test installs it with podman).
    if !Path::new("/usr/libexec/podman/catatonit").exists() {
        assert!(
            std::env::var_os("SPOTPLANE_TEST_REQUIRE_EMULATORS").is_none(),
            "catatonit is missing and SPOTPLANE_TEST_REQUIRE_EMULATORS is set: apt-get install catatonit"
        );
        eprintln!("skipped: catatonit is not installed");
        return;
    }
    let tmp = stubs::node_dir();
    let store = format!("file://{}/bucket/jobs/i", tmp.path().display());
    let cp = ControlPlaneStub::start().await;
    let imds = ImdsStub::start().await;
    let a = start_agent(
        &cp,
        &imds.url,
        &tmp.path().join("a"),
        new_node(),
        EngineSettings {
            init: true,
            ..podman_settings(RuntimeChoice::Podman)
        },
    )
    .await;
    let job = JobId(uuid::Uuid::now_v7());
    let s = cp.queue(
        a.node,
        start(
            job,
            &image,
            &[
                "/bin/sh",
                "-c",
                "echo ready; while true; do sleep 0.1; done",
            ],
            &store,
        ),
    );
    assert!(result_of(&cp, s).await.ok);
    eventually("it runs", || {
        output(&a, job).contains("ready").then_some(())
    })
    .await;
    let begun = std::time::Instant::now();
    let stop = cp.queue(
        a.node,
        json!({"type": "stop", "job_id": job, "replica": 0, "grace_ms": 20_000}),
    );
    let r = result_of(&cp, stop).await;
    // Not PID 1 any more: SIGTERM's default action ends it (128 + 15), well before the grace.
    assert_eq!(
        r.message.as_deref(),
        Some("stopped: exit code 143"),
        "{r:?}"
    );
    assert!(
        begun.elapsed() < Duration::from_secs(15),
        "{:?}",
        begun.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_pull_or_a_missing_image_fails_the_start_with_the_engines_reason() {
    let Some(_image) = image() else { return };
    let tmp = stubs::node_dir();
    let store = format!("file://{}/bucket/jobs/p", tmp.path().display());
    let cp = ControlPlaneStub::start().await;
    let imds = ImdsStub::start().await;
    let a = start_agent(
        &cp,
        &imds.url,
        &tmp.path().join("a"),
        new_node(),
        podman_settings(RuntimeChoice::Podman),
    )
    .await;
    for (image, reason) in [
        // Nothing listens on port 1.
        ("localhost:1/nope:1", "connection refused"),
        // Not built here, and no registry on localhost either.
        ("localhost/spotplane-missing:1", "localhost"),
    ] {
        let job = JobId(uuid::Uuid::now_v7());
        let s = cp.queue(a.node, start(job, image, &[IMAGE_WORKLOAD], &store));
        let r = result_of(&cp, s).await;
        assert!(!r.ok, "{r:?}");
        let msg = r.message.unwrap_or_default();
        assert!(
            msg.starts_with(&format!("pulling {image}: ")) && msg.contains(reason),
            "{msg}"
        );
        assert_eq!(cp.replica_phase(a.node, job), None, "nothing runs");
        assert!(!spotplane_tests::container_exists(
            &container::container_name(job, 0, 0)
        ));
    }

    // With a registry login: an auth file only while the pull runs, and never the password
    // in the reason.
    let engine = container::detect(&podman_settings(RuntimeChoice::Podman))
        .await
        .expect("podman");
    let scratch = tempfile::tempdir().expect("tmp");
    let cred = RegistryCredential {
        username: "robot".into(),
        password: "hunter2-s3cret".into(),
    };
    let e = container::ensure_image(
        &engine,
        "localhost:1/private:1",
        Some(&cred),
        scratch.path(),
    )
    .await
    .expect_err("nothing to pull from");
    assert!(e.starts_with("pulling localhost:1/private:1: "), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
    let left: Vec<_> = std::fs::read_dir(scratch.path()).expect("ls").collect();
    assert!(left.is_empty(), "the auth file is gone: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_an_engine_registers_so_and_never_runs_an_image_on_the_host() {
    let tmp = stubs::node_dir();
    let store = format!("file://{}/bucket/jobs/n", tmp.path().display());
    let cp = ControlPlaneStub::start().await;
    let imds = ImdsStub::start().await;
    let a = start_agent(
        &cp,
        &imds.url,
        &tmp.path().join("a"),
        new_node(),
        EngineSettings {
            runtime: RuntimeChoice::None,
            ..EngineSettings::default()
        },
    )
    .await;
    assert_eq!(
        cp.registration(a.node)
            .expect("registered")
            .container_engine,
        None
    );
    let job = JobId(uuid::Uuid::now_v7());
    let s = cp.queue(
        a.node,
        start(
            job,
            "ghcr.io/acme/train:1",
            &[&stubs::example(tmp.path())],
            &store,
        ),
    );
    let r = result_of(&cp, s).await;
    assert!(!r.ok, "{r:?}");
    assert_eq!(
        r.message.as_deref(),
        Some(
            "the job's image ghcr.io/acme/train:1 cannot run: this node has no container engine (--container-runtime none)"
        )
    );
    assert_eq!(cp.replica_phase(a.node, job), None);
    assert_eq!(output(&a, job), "", "not run on the host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_an_earlier_agent_of_the_node_left_are_removed_when_it_starts() {
    let Some(image) = image() else { return };
    let node = new_node();
    let other = new_node();
    let leftover = format!("spotplane-{}-0-1", JobId(uuid::Uuid::now_v7()));
    let foreign = format!("spotplane-{}-0-1", JobId(uuid::Uuid::now_v7()));
    for (name, of) in [(&leftover, node), (&foreign, other)] {
        let out = std::process::Command::new("podman")
            .args(["create", "--name", name, "--label"])
            .arg(format!("spotplane.node={of}"))
            .args([
                "--runtime",
                OCI_RUNTIME,
                &image,
                "/bin/sh",
                "-c",
                "sleep 60",
            ])
            .output()
            .expect("podman create");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let tmp = stubs::node_dir();
    let cp = ControlPlaneStub::start().await;
    let imds = ImdsStub::start().await;
    let _a = start_agent(
        &cp,
        &imds.url,
        &tmp.path().join("a"),
        node,
        podman_settings(RuntimeChoice::Podman),
    )
    .await;
    eventually("the leftover is removed", || {
        (!spotplane_tests::container_exists(&leftover)).then_some(())
    })
    .await;
    assert!(
        spotplane_tests::container_exists(&foreign),
        "another node's container stays"
    );
    spotplane_tests::remove_node_containers(&other.to_string());
}
