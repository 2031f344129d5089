//! The whole cycle with the real agent loop, the example workload and a local object store:
//! start, termination notice, checkpoint, upload, report; then a second agent restores the
//! checkpoint and the workload resumes at the saved step; then a drain.
//!
//! The control plane and the AWS metadata service are stubs speaking the real protocols over
//! HTTP (the control plane's side has its own tests in control-plane/tests/agent_api.rs).

mod stubs;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use spotplane_agent::agent::{AgentConfig, Deps, run};
use spotplane_agent::mig::NvidiaSmi;
use spotplane_agent::notice::{CloudKind, ReqwestMetadata, source_for};
use spotplane_agent::telemetry::FixedTelemetry;
use spotplane_core::agent::{CheckpointOutcome, CheckpointTrigger, GpuTelemetry, ReplicaPhase};
use spotplane_core::{JobId, NodeId};
use stubs::{ControlPlaneStub, ImdsStub, eventually};
use tokio_util::sync::CancellationToken;

struct RunningAgent {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    node: NodeId,
}

async fn start_agent(cp: &ControlPlaneStub, imds_url: &str, dir: &Path) -> RunningAgent {
    start_agent_at(cp, imds_url, dir, None).await
}

/// An agent, advertising `address` to its gang peers (by default the one it reaches the
/// control plane from).
async fn start_agent_at(
    cp: &ControlPlaneStub,
    imds_url: &str,
    dir: &Path,
    address: Option<std::net::IpAddr>,
) -> RunningAgent {
    let node = NodeId(uuid::Uuid::now_v7());
    let token_file = dir.join("bootstrap-token");
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::write(
        &token_file,
        format!("spb_{}_{}\n", node.as_uuid().simple(), "s3cr3t"),
    )
    .expect("token file");
    let mut cfg = AgentConfig::new(&cp.url, &token_file, &dir.join("work"));
    cfg.isolation = stubs::isolation();
    cfg.workload_uid_base = spotplane_tests::workload_uid_base();
    cfg.workload_uid_count = 10_000;
    cfg.heartbeat_interval = Some(Duration::from_millis(200));
    cfg.notice_poll_interval = Some(Duration::from_millis(100));
    cfg.deadline_margin = Duration::from_secs(1);
    cfg.drain_grace = Duration::from_secs(5);
    cfg.advertise_address = address;
    let http = Arc::new(ReqwestMetadata::new(Duration::from_secs(2)).expect("http"));
    let deps = Deps {
        notices: source_for(CloudKind::Aws, http, imds_url, None),
        telemetry: Box::new(FixedTelemetry(vec![GpuTelemetry {
            index: 0,
            utilization_pct: Some(93),
            ..GpuTelemetry::default()
        }])),
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
    RunningAgent { cancel, task, node }
}

fn start_command(tmp: &Path, job: JobId, attempt: u32, store: &str) -> serde_json::Value {
    json!({"type": "start", "job_id": job, "replica": 0, "attempt": attempt,
        "command": [stubs::example(tmp)], "env": {"TRAIN_STEP_MS": "20", "TRAIN_WEIGHTS_BYTES": "3000000"},
        "devices": [], "checkpoint_uri": store})
}

fn log_of(dir: &Path, job: JobId, attempt: u32) -> String {
    std::fs::read_to_string(
        dir.join("work/jobs")
            .join(job.to_string())
            .join("replica-0")
            .join(format!("attempt-{attempt}"))
            .join("output.log"),
    )
    .unwrap_or_default()
}

/// The step of the last `<word> step=N` line.
fn last_step(log: &str, word: &str) -> Option<u64> {
    log.lines()
        .filter_map(|l| l.strip_prefix(&format!("{word} step=")))
        .filter_map(|s| s.split_whitespace().next()?.parse().ok())
        .next_back()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notice_checkpoint_upload_and_resume_on_another_node_at_the_saved_step() {
    let tmp = stubs::node_dir();
    let store = format!("file://{}/bucket/jobs/train", tmp.path().display());
    let cp = ControlPlaneStub::start().await;
    let imds = ImdsStub::start().await;
    let job = JobId(uuid::Uuid::now_v7());

    // Node A runs the job.
    let dir_a = tmp.path().join("a");
    let a = start_agent(&cp, &imds.url, &dir_a).await;
    eventually("node A registers", || cp.registered(a.node).then_some(())).await;
    cp.queue(a.node, start_command(tmp.path(), job, 0, &store));
    eventually("the job runs on A", || {
        (cp.replica_phase(a.node, job) == Some(ReplicaPhase::Running)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(cp.telemetry(a.node)[0].utilization_pct, Some(93));

    // The cloud takes node A back in a minute.
    let deadline = chrono::Utc::now() + chrono::Duration::seconds(60);
    imds.set_instance_action(Some(&format!(
        r#"{{"action": "terminate", "time": "{}"}}"#,
        deadline.format("%Y-%m-%dT%H:%M:%SZ")
    )));
    let report = eventually("a durable checkpoint is reported", || {
        cp.checkpoints().into_iter().find(|r| r.job_id == job)
    })
    .await;
    assert_eq!(report.outcome, CheckpointOutcome::Durable, "{report:?}");
    assert_eq!(report.trigger, CheckpointTrigger::Notice);
    let manifest = report.manifest.clone().expect("manifest");
    let paths: Vec<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["state.json", "weights.bin"]);
    assert!(report.uri.ends_with("manifest.json"), "{}", report.uri);
    let notice = eventually("the control plane hears of the notice", || {
        cp.notice(a.node)
    })
    .await;
    assert_eq!(notice.action.as_str(), "terminate");
    let saved = last_step(&log_of(&dir_a, job, 0), "checkpoint").expect("checkpoint line");
    assert!(saved > 10, "it trained a while first: {saved}");
    a.cancel.cancel();
    a.task.await.expect("agent A stops cleanly");

    // Node B picks the job up and resumes at the saved step.
    let dir_b = tmp.path().join("b");
    let b = start_agent(&cp, &imds_url_without_notice().await, &dir_b).await;
    eventually("node B registers", || cp.registered(b.node).then_some(())).await;
    let start = cp.queue(b.node, start_command(tmp.path(), job, 1, &store));
    let result = eventually("B reports the start", || cp.result(start)).await;
    assert!(result.ok, "{result:?}");
    assert!(
        result
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&manifest.checkpoint_id.to_string())),
        "{result:?}"
    );
    let resumed = eventually("the workload resumes", || {
        last_step(&log_of(&dir_b, job, 1), "resumed")
    })
    .await;
    assert_eq!(resumed, saved, "resumed at the step that was saved");

    // A drain checkpoints and stops it; its exit is reported.
    let drain = cp.queue(b.node, json!({"type": "drain", "reason": "test"}));
    let result = eventually("B reports the drain", || cp.result(drain)).await;
    assert!(result.ok, "{result:?}");
    let exit = eventually("the exit is reported", || {
        cp.replica_exit(b.node, job)
            .filter(|_| cp.replica_phase(b.node, job) == Some(ReplicaPhase::Exited))
    })
    .await;
    assert_eq!(exit, 143, "SIGTERM ends the example with 143");
    let reports: Vec<_> = cp
        .checkpoints()
        .into_iter()
        .filter(|r| r.trigger == CheckpointTrigger::Drain)
        .collect();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].outcome, CheckpointOutcome::Durable);
    let drained = last_step(&log_of(&dir_b, job, 1), "checkpoint").expect("drain checkpoint");
    assert!(drained >= saved);
    b.cancel.cancel();
    b.task.await.expect("agent B stops cleanly");
}

/// A metadata service with nothing to say.
async fn imds_url_without_notice() -> String {
    let imds = ImdsStub::start().await;
    let url = imds.url.clone();
    std::mem::forget(imds);
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_uses_its_saved_credential_and_a_spent_bootstrap_token_is_not_needed() {
    let tmp = stubs::node_dir();
    let cp = ControlPlaneStub::start().await;
    let imds = ImdsStub::start().await;
    let dir = tmp.path().join("n");
    let a = start_agent(&cp, &imds.url, &dir).await;
    eventually("registers", || cp.registered(a.node).then_some(())).await;
    a.cancel.cancel();
    a.task.await.expect("stops");
    let cred = std::fs::read_to_string(dir.join("work/credential.json")).expect("saved");
    assert!(cred.contains("spt_"), "{cred}");
    let mode = std::fs::metadata(dir.join("work/credential.json"))
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .expect("meta");
    assert_eq!(mode, 0o600);
    assert_eq!(cp.exchanges(), 1);
    // Same work directory, the bootstrap token gone: it registers with the credential.
    std::fs::remove_file(dir.join("bootstrap-token")).expect("rm");
    std::fs::write(dir.join("bootstrap-token"), "").expect("empty");
    let mut cfg = AgentConfig::new(&cp.url, &dir.join("bootstrap-token"), &dir.join("work"));
    cfg.isolation = stubs::isolation();
    cfg.workload_uid_base = spotplane_tests::workload_uid_base();
    cfg.workload_uid_count = 10_000;
    cfg.heartbeat_interval = Some(Duration::from_millis(200));
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let http = Arc::new(ReqwestMetadata::new(Duration::from_secs(2)).expect("http"));
    let deps = Deps {
        notices: source_for(CloudKind::None, http, "", None),
        telemetry: Box::new(FixedTelemetry::default()),
        mig: Arc::new(NvidiaSmi),
        clock: Arc::new(chrono::Utc::now),
    };
    let task = tokio::spawn(async move { run(cfg, deps, c).await });
    eventually("heartbeats with the saved credential", || {
        (cp.heartbeats(a.node) > 2).then_some(())
    })
    .await;
    assert_eq!(cp.exchanges(), 1, "no second exchange");
    cancel.cancel();
    task.await.expect("join").expect("clean");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_cannot_make_the_deadline_is_reported_missed_and_the_previous_one_stays()
{
    let tmp = stubs::node_dir();
    let store = format!("file://{}/bucket/jobs/late", tmp.path().display());
    let cp = ControlPlaneStub::start().await;
    let imds = ImdsStub::start().await;
    let job = JobId(uuid::Uuid::now_v7());
    let dir = tmp.path().join("n");
    let a = start_agent(&cp, &imds.url, &dir).await;
    eventually("registers", || cp.registered(a.node).then_some(())).await;
    cp.queue(a.node, start_command(tmp.path(), job, 0, &store));
    eventually("runs", || {
        (cp.replica_phase(a.node, job) == Some(ReplicaPhase::Running)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A durable checkpoint first, by command.
    let first = spotplane_core::CheckpointId(uuid::Uuid::now_v7());
    let cmd = cp.queue(
        a.node,
        json!({"type": "checkpoint", "job_id": job, "replica": 0, "checkpoint_id": first,
            "uri": store, "deadline": null}),
    );
    let r = eventually("the command's result", || cp.result(cmd)).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(r.manifest.map(|m| m.checkpoint_id), Some(first));
    // Then a notice whose deadline is already inside the margin: nothing can be made durable.
    let deadline = chrono::Utc::now();
    imds.set_instance_action(Some(&format!(
        r#"{{"action": "terminate", "time": "{}"}}"#,
        deadline.format("%Y-%m-%dT%H:%M:%SZ")
    )));
    let late = eventually("the late checkpoint is reported", || {
        cp.checkpoints()
            .into_iter()
            .find(|r| r.trigger == CheckpointTrigger::Notice)
    })
    .await;
    assert_eq!(late.outcome, CheckpointOutcome::MissedDeadline, "{late:?}");
    assert!(late.manifest.is_none());
    assert!(late.message.is_some());
    let s = spotplane_agent::checkpoint::CheckpointStore::open(&store, &[]).expect("open");
    assert_eq!(
        s.checkpoints(0).await.expect("list"),
        [first],
        "the durable checkpoint stays the latest"
    );
    a.cancel.cancel();
    a.task.await.expect("stops");
}

/// The log of one replica's attempt on an agent.
fn replica_log(dir: &Path, job: JobId, replica: u32, attempt: u32) -> String {
    std::fs::read_to_string(
        dir.join("work/jobs")
            .join(job.to_string())
            .join(format!("replica-{replica}"))
            .join(format!("attempt-{attempt}"))
            .join("output.log"),
    )
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_node_gang_forms_from_the_rendezvous_its_starts_carry() {
    let tmp = stubs::node_dir();
    let store = format!("file://{}/bucket/jobs/gang", tmp.path().display());
    let cp = ControlPlaneStub::start().await;
    let imds = imds_url_without_notice().await;
    // Node A finds its address towards the control plane (loopback here); node B is told one
    // (any 127.0.0.0/8 address is this machine's).
    let dir_a = tmp.path().join("a");
    let dir_b = tmp.path().join("b");
    let a = start_agent_at(&cp, &imds, &dir_a, None).await;
    let b = start_agent_at(&cp, &imds, &dir_b, Some("127.0.0.2".parse().expect("ip"))).await;
    for n in [a.node, b.node] {
        eventually("both register", || cp.registered(n).then_some(())).await;
    }
    assert_eq!(cp.registered_address(a.node).as_deref(), Some("127.0.0.1"));
    assert_eq!(cp.registered_address(b.node).as_deref(), Some("127.0.0.2"));

    let job = JobId(uuid::Uuid::now_v7());
    let port = spotplane_tests::free_port();
    let peers = ["127.0.0.1", "127.0.0.2"];
    let start = |replica: u32| {
        json!({"type": "start", "job_id": job, "replica": replica, "attempt": 1,
            "command": [stubs::example(tmp.path())],
            "env": {"TRAIN_STEPS": "20", "TRAIN_STEP_MS": "20", "TRAIN_WEIGHTS_BYTES": "1000"},
            "devices": [], "checkpoint_uri": store,
            "rendezvous": {"rank": replica, "world_size": 2, "node_rank": replica,
                "peers": peers, "master_addr": peers[0], "master_port": port}})
    };
    // Rank 1 first: it keeps trying until rank 0 listens.
    cp.queue(b.node, start(1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    cp.queue(a.node, start(0));
    for (n, what) in [(a.node, "rank 0 ends"), (b.node, "rank 1 ends")] {
        let code = eventually(what, || cp.replica_exit(n, job)).await;
        assert_eq!(code, 0, "{what}");
    }
    let lead = replica_log(&dir_a, job, 0, 1);
    let other = replica_log(&dir_b, job, 1, 1);
    let line = |rank: u32| {
        format!(
            "rendezvous rank={rank} world=2 node_rank={rank} master=127.0.0.1:{port} peers=127.0.0.1,127.0.0.2"
        )
    };
    assert!(lead.contains(&line(0)), "{lead}");
    assert!(
        lead.contains("peer joined rank=1 from=127.0.0.1:"),
        "{lead}"
    );
    assert!(other.contains(&line(1)), "{other}");
    assert!(other.contains("done step=20"), "{other}");
    for agent in [a, b] {
        agent.cancel.cancel();
        agent.task.await.expect("the agent stops cleanly");
    }
}
