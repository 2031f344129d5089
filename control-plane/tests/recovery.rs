//! The recovery loop with the scheduling loop on a real store (SQLite and PostgreSQL) and a
//! manual clock, the agents played through the store's agent protocol operations (the same ones
//! `/v1/agent/...` calls): a gang starts on two nodes, checkpoints periodically, one node gets a
//! notice, the gang checkpoints and is requeued with its resume points, restarts on other nodes
//! from them (a new attempt: `job.resumed`), loses a node without notice (lost work recorded,
//! back to the periodic round), fails and backs off, and finally succeeds; a replica nobody
//! wants any more is stopped; a node whose agent goes silent is retired. An elastic gang keeps
//! its survivors through a notice and a loss while only the departing replicas are placed again.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use common::{Backend, TestDb};
use spotplane::metrics::Metrics;
use spotplane::reconcile::recovery::RecoveryLoop;
use spotplane::reconcile::scheduling::SchedulerLoop;
use spotplane::recovery::Settings;
use spotplane::store::{
    AgentCaller, NewGpu, NewJob, NewNode, NewTeam, Registration, Store, SubmitOutcome,
};
use spotplane_core::agent::{
    CheckpointManifest, CheckpointOutcome, CheckpointReport, CheckpointTrigger, Command,
    CommandKind, Heartbeat, NoticeSource, PROTOCOL_VERSION, RegisterRequest, Rendezvous,
    ReplicaPhase, ReplicaStatus, TerminationNotice,
};
use spotplane_core::job::{CheckpointSpec, JobSpec};
use spotplane_core::rendezvous::PortRange;
use spotplane_core::shape::GpuShape;
use spotplane_core::{
    CheckpointId, Cloud, GpuModel, JobId, JobState, Market, Micros, MigLayout, NodeId, NodeState,
};
use spotplane_providers::clock::{Clock, ManualClock};

/// The object store of jobs without a checkpoint URI of their own.
const OBJECTS: &str = "file:///tmp/spotplane-test-objects";

on_both_databases!(
    a_gang_survives_a_notice_a_loss_and_a_failure_and_finishes,
    an_elastic_gang_runs_on_while_its_lost_replicas_are_placed_again,
    a_gangs_starts_carry_one_rendezvous_and_a_new_one_after_a_whole_restart,
    an_elastic_gangs_replica_placed_again_joins_the_current_peers,
    a_gang_waits_to_start_until_every_peer_has_an_address,
);

/// What an agent runs: (job, replica) -> (attempt, phase, exit code).
type Replicas = BTreeMap<(JobId, u32), (u32, ReplicaPhase, Option<i32>)>;

struct World {
    store: Store,
    clock: ManualClock,
    sched: SchedulerLoop,
    recovery: RecoveryLoop,
    agents: BTreeMap<NodeId, Replicas>,
    notices: BTreeMap<NodeId, TerminationNotice>,
    /// Every start the agents were sent, in order.
    starts: Vec<Start>,
}

/// A `start` an agent carried out.
#[derive(Debug, Clone)]
struct Start {
    node: NodeId,
    job: JobId,
    replica: u32,
    attempt: u32,
    rendezvous: Option<Rendezvous>,
}

impl World {
    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    async fn node(&mut self, name: &str) -> NodeId {
        self.node_at(name, None).await
    }

    /// A node whose agent registers `address` (its hostname is `name`).
    async fn node_at(&mut self, name: &str, address: Option<&str>) -> NodeId {
        let (id, secret) = self.unregistered_node(name).await;
        self.register(id, name, secret, address).await;
        id
    }

    /// A node with no agent yet: its bootstrap token.
    async fn unregistered_node(&mut self, name: &str) -> (NodeId, String) {
        let id = NodeId(uuid::Uuid::now_v7());
        let now = self.now();
        let (_, secret) = self
            .store
            .create_node_with_bootstrap(
                NewNode {
                    id,
                    name: name.into(),
                    cloud: Cloud::Aws,
                    region: "us-east-1".into(),
                    zone: "us-east-1a".into(),
                    instance_type: "g5.xlarge".into(),
                    market: Market::Spot,
                    offer_id: None,
                    client_token: format!("ct-{name}"),
                    hourly_price: Micros::parse_usd("0.40").expect("price"),
                    on_demand_price: Micros::parse_usd("1.01").expect("price"),
                    cpu_milli: 4_000,
                    memory_mib: 16_384,
                    gpus: vec![NewGpu {
                        model: GpuModel::A10G,
                        memory_mib: 23_028,
                        mig_enabled: false,
                        mig_layout: MigLayout::empty(),
                    }],
                    labels: Default::default(),
                },
                now + Duration::hours(1),
                now,
            )
            .await
            .expect("node");
        (id, secret)
    }

    async fn register(&mut self, id: NodeId, name: &str, secret: String, address: Option<&str>) {
        let reg = self
            .store
            .register_agent(
                AgentCaller::Bootstrap(secret),
                &RegisterRequest {
                    protocol_version: PROTOCOL_VERSION,
                    node_id: id,
                    agent_version: "test".into(),
                    hostname: name.into(),
                    instance_id: Some(format!("i-{name}")),
                    cpu_milli: 4_000,
                    memory_mib: 16_384,
                    gpus: vec![],
                    container_engine: None,
                    address: address.map(str::to_owned),
                },
                self.now(),
            )
            .await
            .expect("register");
        assert!(matches!(reg, Registration::Registered { .. }), "{reg:?}");
        self.agents.insert(id, BTreeMap::new());
    }

    /// One heartbeat of every agent; the commands they get are carried out at once: starts run,
    /// checkpoints become durable, stops end the replica.
    async fn heartbeats(&mut self) {
        let nodes: Vec<NodeId> = self.agents.keys().copied().collect();
        for node in nodes {
            let now = self.now();
            let replicas = self.agents[&node]
                .iter()
                .map(|((job, replica), (attempt, phase, code))| ReplicaStatus {
                    job_id: *job,
                    replica: *replica,
                    attempt: *attempt,
                    phase: *phase,
                    exit_code: *code,
                })
                .collect();
            let hb = Heartbeat {
                node_id: node,
                sent_at: now,
                gpus: vec![],
                replicas,
                notice: self.notices.get(&node).cloned(),
                results: vec![],
            };
            let cmds = match self.store.agent_heartbeat(node, &hb, now).await {
                Ok(c) => c,
                Err(e) => panic!("heartbeat of {node}: {e}"),
            };
            for c in cmds {
                self.carry_out(node, c).await;
            }
        }
    }

    async fn carry_out(&mut self, node: NodeId, c: Command) {
        let now = self.now();
        let mut result = spotplane_core::agent::CommandResult {
            command_id: c.id,
            ok: true,
            message: None,
            manifest: None,
            mig_layout: None,
        };
        match c.kind {
            CommandKind::Start {
                job_id,
                replica,
                attempt,
                rendezvous,
                ..
            } => {
                self.starts.push(Start {
                    node,
                    job: job_id,
                    replica,
                    attempt,
                    rendezvous,
                });
                self.agents
                    .entry(node)
                    .or_default()
                    .insert((job_id, replica), (attempt, ReplicaPhase::Running, None));
            }
            CommandKind::Checkpoint {
                job_id,
                replica,
                checkpoint_id,
                uri,
                ..
            } => {
                let attempt = self.agents[&node][&(job_id, replica)].0;
                self.checkpoint(
                    node,
                    job_id,
                    replica,
                    attempt,
                    checkpoint_id,
                    &uri,
                    CheckpointTrigger::Command,
                )
                .await;
            }
            CommandKind::Stop {
                job_id,
                replica,
                attempt,
                ..
            } => {
                if let Some(r) = self
                    .agents
                    .entry(node)
                    .or_default()
                    .get_mut(&(job_id, replica))
                    .filter(|r| attempt.is_none_or(|a| a == r.0))
                {
                    r.1 = ReplicaPhase::Exited;
                    r.2 = Some(143);
                }
            }
            other => {
                result.message = Some(format!("not played: {other:?}"));
            }
        }
        self.store
            .complete_agent_command(node, &result, now)
            .await
            .expect("result");
    }

    #[allow(clippy::too_many_arguments)]
    async fn checkpoint(
        &mut self,
        node: NodeId,
        job: JobId,
        replica: u32,
        attempt: u32,
        id: CheckpointId,
        uri: &str,
        trigger: CheckpointTrigger,
    ) {
        let now = self.now();
        let report = CheckpointReport {
            job_id: job,
            replica,
            attempt,
            checkpoint_id: id,
            uri: format!("{uri}/replica-{replica}/{id}/manifest.json"),
            trigger,
            outcome: CheckpointOutcome::Durable,
            manifest: Some(CheckpointManifest {
                job_id: job,
                replica,
                checkpoint_id: id,
                attempt,
                created_at: now,
                files: vec![],
                total_bytes: 0,
            }),
            message: None,
            started_at: now,
            finished_at: now,
        };
        self.store
            .record_checkpoint(node, &report, OBJECTS, now)
            .await
            .expect("checkpoint recorded");
    }

    /// Heartbeats, a recovery round and a scheduling cycle, `n` times, `step` apart.
    async fn rounds(&mut self, n: usize, step: Duration) {
        for _ in 0..n {
            self.heartbeats().await;
            self.recovery.run_once().await.expect("recovery");
            self.sched.run_once().await.expect("schedule");
            self.clock.advance(step);
        }
    }

    async fn job(&self, id: JobId) -> spotplane::model::Job {
        self.store.get_job(id, None).await.expect("job")
    }

    async fn nodes_of(&self, id: JobId) -> Vec<NodeId> {
        self.store
            .jobs_with_nodes()
            .await
            .expect("jobs")
            .into_iter()
            .find(|(j, _)| *j == id)
            .map(|(_, (_, n))| n)
            .unwrap_or_default()
    }
}

async fn world(backend: Backend) -> (TestDb, World, String) {
    let db = TestDb::new(backend);
    let store = Store::connect(&db.config.database, Metrics::new())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let clock = ManualClock::new("2026-12-01T00:00:00Z".parse().expect("time"));
    let shared: spotplane::clock::SharedClock = Arc::new(clock.clone());
    let mut settings = spotplane::config::Config::embedded_default()
        .expect("config")
        .scheduler;
    settings.enabled = true;
    let recovery_settings = Settings {
        backoff_base: Duration::seconds(30),
        ..Settings::default()
    };
    let w = World {
        sched: SchedulerLoop::new(store.clone(), shared.clone(), settings),
        recovery: RecoveryLoop::new(
            store.clone(),
            shared,
            None,
            recovery_settings,
            OBJECTS.into(),
        ),
        store,
        clock,
        agents: BTreeMap::new(),
        notices: BTreeMap::new(),
        starts: Vec::new(),
    };
    let team = w
        .store
        .create_team(
            NewTeam {
                name: "research".parse().expect("name"),
                weight: 1.0,
                cohort: None,
                quotas: Default::default(),
            },
            w.now(),
        )
        .await
        .expect("team");
    (db, w, team.id)
}

/// A gang of one-GPU replicas checkpointing every ten minutes.
fn gang(name: &str, replicas: u32) -> JobSpec {
    let mut spec = JobSpec::new(
        name,
        GpuShape::Whole {
            gpus: 1,
            models: vec![],
        },
        vec!["train".into()],
    );
    spec.replicas = replicas;
    spec.checkpoint = Some(CheckpointSpec {
        uri: "file:///tmp/ckpt".into(),
        interval_s: 600,
    });
    spec
}

async fn a_gang_survives_a_notice_a_loss_and_a_failure_and_finishes(backend: Backend) {
    let (db, mut w, team_id) = world(backend).await;
    let a = w.node("a").await;
    let b = w.node("b").await;

    let mut spec = gang("gang", 2);
    spec.max_retries = Some(1);
    let id = w.submit(&team_id, spec).await;

    // Placed on a and b, started on both, running.
    w.rounds(4, Duration::seconds(5)).await;
    let j = w.job(id).await;
    assert_eq!((j.state, j.attempt), (JobState::Running, 1), "{j:?}");
    let mut on = w.nodes_of(id).await;
    on.sort();
    assert_eq!(on, {
        let mut v = vec![a, b];
        v.sort();
        v
    });

    // Ten minutes on: a periodic checkpoint round of both replicas.
    w.clock.advance(Duration::seconds(600));
    w.rounds(2, Duration::seconds(5)).await;
    let periodic = w.store.job_checkpoints(id).await.expect("checkpoints");
    assert_eq!(periodic.len(), 2, "{periodic:?}");

    w.clock.advance(Duration::seconds(30));
    // Node a gets the two-minute warning; its agent checkpoints on its own, b is asked to.
    let deadline = w.now() + Duration::seconds(120);
    w.notices.insert(
        a,
        TerminationNotice {
            source: NoticeSource::AwsInstanceAction,
            action: spotplane_core::agent::NoticeAction::Terminate,
            deadline: Some(deadline),
            observed_at: w.now(),
            event_id: None,
        },
    );
    w.rounds(1, Duration::seconds(2)).await;
    assert_eq!(
        w.store.get_node(a).await.expect("node").state,
        NodeState::Draining
    );
    assert_eq!(w.job(id).await.state, JobState::Draining);
    // The same notice again, and a later one with a later deadline: nothing changes.
    let mut late = w.notices[&a].clone();
    late.deadline = Some(deadline + Duration::seconds(60));
    late.event_id = Some("late".into());
    w.notices.insert(a, late);
    w.rounds(1, Duration::seconds(2)).await;
    assert_eq!(
        w.store.get_node(a).await.expect("node").notice_deadline,
        Some(deadline)
    );
    let notice_ckpt = CheckpointId::from_uuid(uuid::Uuid::now_v7());
    let (on_a, attempt) = w.agents[&a]
        .iter()
        .find(|((j, _), _)| *j == id)
        .map(|((_, r), (attempt, _, _))| (*r, *attempt))
        .expect("a replica on a");
    w.checkpoint(
        a,
        id,
        on_a,
        attempt,
        notice_ckpt,
        "file:///tmp/ckpt",
        CheckpointTrigger::Notice,
    )
    .await;
    // Node c arrives; the gang is requeued from the drain round and placed on b and c.
    let c = w.node("c").await;
    w.rounds(6, Duration::seconds(2)).await;
    let j = w.job(id).await;
    assert_eq!(j.state, JobState::Running, "{j:?}");
    assert_eq!(j.attempt, 2);
    assert_eq!(j.lost_gpu_seconds, 0);
    assert_eq!(
        j.resume_from.get(&on_a).map(|p| p.checkpoint_id),
        Some(notice_ckpt),
        "the replica on a resumes from its notice checkpoint"
    );
    assert!(
        !w.nodes_of(id).await.contains(&a),
        "not on the draining node"
    );
    let events = w.event_kinds(id).await;
    for kind in [
        "job.queued",
        "job.admitted",
        "job.starting",
        "job.running",
        "job.draining",
        "job.checkpointed",
    ] {
        assert!(events.iter().any(|e| e == kind), "{kind} in {events:?}");
    }
    // b runs attempt 2 now (its attempt-1 replica was stopped first).
    assert!(
        w.agents[&b]
            .values()
            .any(|(attempt, phase, _)| *attempt == 2 && *phase == ReplicaPhase::Running),
        "{:?}",
        w.agents[&b]
    );

    // Node c vanishes without notice ten minutes after a periodic round: lost work is recorded
    // and the gang goes back to that round.
    w.clock.advance(Duration::seconds(600));
    w.rounds(2, Duration::seconds(5)).await;
    w.clock.advance(Duration::seconds(300));
    w.vanish(c).await;
    let d = w.node("d").await;
    w.rounds(6, Duration::seconds(2)).await;
    let j = w.job(id).await;
    assert_eq!((j.state, j.attempt), (JobState::Running, 3), "{j:?}");
    // Two replicas × ~300 s since the round (a few seconds of rounds either side).
    assert!(
        (590..=640).contains(&j.lost_gpu_seconds),
        "lost {} GPU-seconds",
        j.lost_gpu_seconds
    );

    // A replica exits 1: retried after the back-off, then, failing again, over the limit.
    w.exit(id, 0, 1).await;
    w.rounds(2, Duration::seconds(1)).await;
    let j = w.job(id).await;
    assert_eq!((j.state, j.failures), (JobState::Queued, 1), "{j:?}");
    assert!(j.not_before.is_some(), "backs off");
    w.rounds(5, Duration::seconds(2)).await;
    assert_eq!(w.job(id).await.state, JobState::Queued, "still backing off");
    w.clock.advance(Duration::seconds(30));
    w.rounds(5, Duration::seconds(2)).await;
    let j = w.job(id).await;
    assert_eq!((j.state, j.attempt), (JobState::Running, 4), "{j:?}");
    w.exit(id, 1, 1).await;
    w.rounds(2, Duration::seconds(1)).await;
    let j = w.job(id).await;
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    let reason = j.state_reason.unwrap_or_default();
    assert!(
        reason.contains("replica 1 exited with status 1"),
        "{reason}"
    );
    // Its other replica is stopped.
    w.rounds(2, Duration::seconds(1)).await;
    assert!(
        w.agents
            .values()
            .flat_map(|r| r.iter())
            .filter(|((j, _), _)| *j == id)
            .all(|(_, (_, phase, _))| *phase == ReplicaPhase::Exited),
        "{:?}",
        w.agents
    );

    // A job whose replica exits 0 succeeds.
    let mut spec = JobSpec::new(
        "short",
        GpuShape::Whole {
            gpus: 1,
            models: vec![],
        },
        vec!["true".into()],
    );
    spec.checkpoint = None;
    let short = w.submit(&team_id, spec).await;
    w.rounds(5, Duration::seconds(2)).await;
    assert_eq!(w.job(short).await.state, JobState::Running);
    w.exit(short, 0, 0).await;
    w.rounds(2, Duration::seconds(1)).await;
    assert_eq!(w.job(short).await.state, JobState::Succeeded);

    // An agent that stops heartbeating: after the timeout its node is retired.
    w.agents.remove(&d);
    w.clock.advance(Duration::seconds(61));
    w.rounds(1, Duration::seconds(1)).await;
    assert_eq!(
        w.store.get_node(d).await.expect("node").state,
        NodeState::Terminating
    );
    db.cleanup().await;
}

impl World {
    /// The kinds of the job's history entries, oldest first.
    async fn event_kinds(&self, id: JobId) -> Vec<String> {
        self.store
            .job_events(id, None, None, 100)
            .await
            .expect("events")
            .items
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }

    /// Queues a job of the team `research`.
    async fn submit(&self, team_id: &str, spec: JobSpec) -> JobId {
        let id = JobId(uuid::Uuid::now_v7());
        let submitted = self
            .store
            .submit_job(
                NewJob {
                    id,
                    team_id: team_id.to_owned(),
                    team: "research".parse().expect("team"),
                    spec,
                    idempotency: None,
                },
                self.now(),
            )
            .await
            .expect("submit");
        assert!(matches!(submitted, SubmitOutcome::Created(_)));
        id
    }

    /// The node is gone without notice, its agent with it.
    async fn vanish(&mut self, node: NodeId) {
        self.store
            .transition_node(node, NodeState::Terminated, Some("gone".into()), self.now())
            .await
            .expect("terminated");
        self.agents.remove(&node);
    }

    /// The replica of the job's current attempt exits with `code`.
    async fn exit(&mut self, job: JobId, replica: u32, code: i32) {
        let attempt = self.job(job).await.attempt;
        let r = self
            .agents
            .values_mut()
            .find_map(|r| r.get_mut(&(job, replica)).filter(|r| r.0 == attempt))
            .expect("the replica runs somewhere");
        r.1 = ReplicaPhase::Exited;
        r.2 = Some(code);
    }
}

async fn an_elastic_gang_runs_on_while_its_lost_replicas_are_placed_again(backend: Backend) {
    let (db, mut w, team_id) = world(backend).await;
    let a = w.node("a").await;
    let b = w.node("b").await;
    let c = w.node("c").await;
    let mut spec = gang("elastic", 3);
    spec.elastic = true;
    let id = w.submit(&team_id, spec).await;
    w.rounds(4, Duration::seconds(5)).await;
    let j = w.job(id).await;
    assert_eq!((j.state, j.attempt), (JobState::Running, 1), "{j:?}");
    w.clock.advance(Duration::seconds(600));
    w.rounds(2, Duration::seconds(5)).await;
    assert_eq!(w.store.job_checkpoints(id).await.expect("ckpts").len(), 3);
    let replica_on = |w: &World, n: NodeId| {
        w.agents[&n]
            .iter()
            .find(|((j, _), (_, phase, _))| *j == id && *phase == ReplicaPhase::Running)
            .map(|((_, r), (attempt, _, _))| (*r, *attempt))
    };
    let (on_c, _) = replica_on(&w, c).expect("a replica on c");

    // Node c gets its notice: only its replica checkpoints; the others are not even asked.
    w.clock.advance(Duration::seconds(30));
    w.notices.insert(
        c,
        TerminationNotice {
            source: NoticeSource::AwsInstanceAction,
            action: spotplane_core::agent::NoticeAction::Terminate,
            deadline: Some(w.now() + Duration::seconds(120)),
            observed_at: w.now(),
            event_id: None,
        },
    );
    w.rounds(1, Duration::seconds(2)).await;
    assert_eq!(w.job(id).await.state, JobState::Running);
    assert_eq!(w.store.job_checkpoints(id).await.expect("ckpts").len(), 3);
    let window = CheckpointId::from_uuid(uuid::Uuid::now_v7());
    w.checkpoint(
        c,
        id,
        on_c,
        1,
        window,
        "file:///tmp/ckpt",
        CheckpointTrigger::Notice,
    )
    .await;
    // It leaves with that checkpoint; node d arrives and takes it, as a new attempt.
    w.rounds(1, Duration::seconds(2)).await;
    let j = w.job(id).await;
    assert_eq!(j.state, JobState::Running, "{j:?}");
    assert_eq!(j.lost_gpu_seconds, 0);
    assert_eq!(
        j.resume_from.get(&on_c).map(|p| p.checkpoint_id),
        Some(window)
    );
    let d = w.node("d").await;
    w.rounds(4, Duration::seconds(2)).await;
    let j = w.job(id).await;
    assert_eq!((j.state, j.attempt), (JobState::Running, 2), "{j:?}");
    assert_eq!(replica_on(&w, d), Some((on_c, 2)), "{:?}", w.agents[&d]);
    assert_eq!(
        w.agents[&c][&(id, on_c)].1,
        ReplicaPhase::Exited,
        "the departed replica was stopped"
    );
    for n in [a, b] {
        assert_eq!(
            replica_on(&w, n).map(|(_, attempt)| attempt),
            Some(1),
            "the survivors ran on, never restarted"
        );
    }
    let events = w.event_kinds(id).await;
    for kind in ["job.replicas_lost", "job.replicas_placed"] {
        assert!(events.iter().any(|e| e == kind), "{kind} in {events:?}");
    }
    assert!(
        !events
            .iter()
            .any(|e| e == "job.draining" || e == "job.lost"),
        "{events:?}"
    );

    // Node b vanishes without notice five minutes after a periodic round: one replica's work
    // since that round is lost, the others run on.
    w.clock.advance(Duration::seconds(600));
    w.rounds(2, Duration::seconds(5)).await;
    w.clock.advance(Duration::seconds(300));
    let (on_b, _) = replica_on(&w, b).expect("a replica on b");
    w.vanish(b).await;
    let e = w.node("e").await;
    w.rounds(4, Duration::seconds(2)).await;
    let j = w.job(id).await;
    assert_eq!((j.state, j.attempt), (JobState::Running, 3), "{j:?}");
    assert!(
        (295..=330).contains(&j.lost_gpu_seconds),
        "one replica's ~300 s lost: {}",
        j.lost_gpu_seconds
    );
    assert_eq!(replica_on(&w, e), Some((on_b, 3)));
    assert_eq!(replica_on(&w, a).map(|(_, attempt)| attempt), Some(1));

    // Every replica finishes: the job has succeeded.
    for r in w.agents.values_mut() {
        for ((job, _), (_, phase, code)) in r.iter_mut() {
            if *job == id && *phase == ReplicaPhase::Running {
                *phase = ReplicaPhase::Exited;
                *code = Some(0);
            }
        }
    }
    w.rounds(2, Duration::seconds(1)).await;
    assert_eq!(w.job(id).await.state, JobState::Succeeded);
    db.cleanup().await;
}

impl World {
    /// The starts of one attempt of the job, by replica.
    fn starts_of(&self, job: JobId, attempt: u32) -> BTreeMap<u32, Start> {
        self.starts
            .iter()
            .filter(|s| s.job == job && s.attempt == attempt)
            .map(|s| (s.replica, s.clone()))
            .collect()
    }

    /// The replica running on `node` for the job, and its attempt.
    fn running_on(&self, job: JobId, node: NodeId) -> Option<(u32, u32)> {
        self.agents
            .get(&node)?
            .iter()
            .find_map(|((j, r), (a, phase, _))| {
                (*j == job && *phase == ReplicaPhase::Running).then_some((*r, *a))
            })
    }
}

/// Every start of `starts` (one per replica of a gang of `world`) carries the same peers,
/// master and port, its own rank, the address of its node at its rank, and node ranks
/// numbered in rank order; returns the peers.
fn assert_one_rendezvous(
    starts: &BTreeMap<u32, Start>,
    world: u32,
    addresses: &BTreeMap<NodeId, &str>,
    port: u16,
) -> Vec<String> {
    assert_eq!(
        starts.keys().copied().collect::<Vec<_>>(),
        (0..world).collect::<Vec<_>>(),
        "{starts:?}"
    );
    let peers: Vec<String> = (0..world)
        .map(|r| addresses[&starts[&r].node].to_owned())
        .collect();
    let mut node_ranks: Vec<NodeId> = Vec::new();
    for (r, s) in starts {
        let rv = s
            .rendezvous
            .clone()
            .expect("every start carries a rendezvous");
        let node_rank = match node_ranks.iter().position(|n| *n == s.node) {
            Some(i) => i,
            None => {
                node_ranks.push(s.node);
                node_ranks.len() - 1
            }
        };
        assert_eq!(
            rv,
            Rendezvous {
                rank: *r,
                world_size: world,
                node_rank: u32::try_from(node_rank).expect("small"),
                peers: peers.clone(),
                master_addr: peers[0].clone(),
                master_port: port,
            },
            "replica {r}"
        );
    }
    peers
}

async fn a_gangs_starts_carry_one_rendezvous_and_a_new_one_after_a_whole_restart(backend: Backend) {
    let (db, mut w, team_id) = world(backend).await;
    let a = w.node_at("a", Some("10.0.0.1")).await;
    let b = w.node_at("b", Some("10.0.0.2")).await;
    // An agent that gave no address: its peers get its hostname.
    let c = w.node_at("c.internal", None).await;
    let mut addresses: BTreeMap<NodeId, &str> =
        [(a, "10.0.0.1"), (b, "10.0.0.2"), (c, "c.internal")].into();
    let id = w.submit(&team_id, gang("gang", 3)).await;
    w.rounds(4, Duration::seconds(5)).await;
    let j = w.job(id).await;
    assert_eq!((j.state, j.attempt), (JobState::Running, 1), "{j:?}");
    let ports = PortRange::default();
    let first = w.starts_of(id, 1);
    let peers = assert_one_rendezvous(&first, 3, &addresses, ports.port(id, 1));
    let mut sorted = peers.clone();
    sorted.sort();
    assert_eq!(sorted, ["10.0.0.1", "10.0.0.2", "c.internal"]);

    // Replica 1's node vanishes; the whole gang restarts on the others and a new node: the
    // new attempt's starts name the new node and use the new attempt's port.
    w.clock.advance(Duration::seconds(60));
    let gone = first[&1].node;
    w.vanish(gone).await;
    let d = w.node_at("d", Some("fd00::4")).await;
    addresses.insert(d, "fd00::4");
    w.rounds(6, Duration::seconds(2)).await;
    let j = w.job(id).await;
    assert_eq!((j.state, j.attempt), (JobState::Running, 2), "{j:?}");
    let second = w.starts_of(id, 2);
    let peers = assert_one_rendezvous(&second, 3, &addresses, ports.port(id, 2));
    assert!(peers.iter().any(|p| p == "fd00::4"), "{peers:?}");
    assert!(
        !peers.contains(&addresses[&gone].to_owned()),
        "the lost node is no peer: {peers:?}"
    );
    assert_ne!(ports.port(id, 1), ports.port(id, 2));
    db.cleanup().await;
}

async fn an_elastic_gangs_replica_placed_again_joins_the_current_peers(backend: Backend) {
    let (db, mut w, team_id) = world(backend).await;
    let mut addresses: BTreeMap<NodeId, &str> = BTreeMap::new();
    for (name, ip) in [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3")] {
        let n = w.node_at(name, Some(ip)).await;
        addresses.insert(n, ip);
    }
    let mut spec = gang("elastic", 3);
    spec.elastic = true;
    let id = w.submit(&team_id, spec).await;
    w.rounds(4, Duration::seconds(5)).await;
    assert_eq!(w.job(id).await.state, JobState::Running);
    let ports = PortRange::default();
    let first = w.starts_of(id, 1);
    assert_one_rendezvous(&first, 3, &addresses, ports.port(id, 1));

    // Replica 2's node vanishes: it alone is placed again, on d, as attempt 2. It gets the
    // current peers (d's address at rank 2) and the master and port the survivors use.
    w.clock.advance(Duration::seconds(60));
    w.vanish(first[&2].node).await;
    let d = w.node_at("d", Some("10.0.0.4")).await;
    addresses.insert(d, "10.0.0.4");
    w.rounds(4, Duration::seconds(2)).await;
    let j = w.job(id).await;
    assert_eq!((j.state, j.attempt), (JobState::Running, 2), "{j:?}");
    let again = w.starts_of(id, 2);
    assert_eq!(again.keys().copied().collect::<Vec<_>>(), [2]);
    let rv = again[&2].rendezvous.clone().expect("a rendezvous");
    let survivors = first[&0].rendezvous.clone().expect("a rendezvous");
    assert_eq!(rv.rank, 2);
    assert_eq!(
        rv.peers,
        [
            addresses[&first[&0].node],
            addresses[&first[&1].node],
            "10.0.0.4"
        ]
    );
    assert_eq!(rv.node_rank, 2);
    assert_eq!(
        (&rv.master_addr, rv.master_port),
        (&survivors.master_addr, survivors.master_port),
        "it joins the master the survivors formed with"
    );
    for r in [0, 1] {
        assert_eq!(
            w.running_on(id, first[&r].node),
            Some((r, 1)),
            "replica {r} ran on with its rank"
        );
    }

    // Now rank 0's node vanishes: replica 0 placed again on e is the new master, on the port
    // of its attempt.
    w.clock.advance(Duration::seconds(60));
    w.vanish(first[&0].node).await;
    let e = w.node_at("e", Some("10.0.0.5")).await;
    addresses.insert(e, "10.0.0.5");
    w.rounds(4, Duration::seconds(2)).await;
    let j = w.job(id).await;
    assert_eq!((j.state, j.attempt), (JobState::Running, 3), "{j:?}");
    let third = w.starts_of(id, 3);
    let rv = third[&0].rendezvous.clone().expect("a rendezvous");
    assert_eq!(
        rv.peers,
        ["10.0.0.5", addresses[&first[&1].node], "10.0.0.4"]
    );
    assert_eq!(
        (
            rv.rank,
            rv.node_rank,
            rv.master_addr.as_str(),
            rv.master_port
        ),
        (0, 0, "10.0.0.5", ports.port(id, 3))
    );
    db.cleanup().await;
}

async fn a_gang_waits_to_start_until_every_peer_has_an_address(backend: Backend) {
    let (db, mut w, team_id) = world(backend).await;
    let a = w.node_at("a", Some("10.0.0.1")).await;
    // Node x is up (as a simulated cloud's running instance is) but its agent has not
    // registered: nobody knows its address yet.
    let (x, secret) = w.unregistered_node("x").await;
    w.store
        .transition_node(x, NodeState::Ready, None, w.now())
        .await
        .expect("ready");
    let id = w.submit(&team_id, gang("gang", 2)).await;
    w.rounds(3, Duration::seconds(2)).await;
    let j = w.job(id).await;
    assert_eq!(j.state, JobState::Starting, "{j:?}");
    let mut on = w.nodes_of(id).await;
    on.sort();
    let mut both = vec![a, x];
    both.sort();
    assert_eq!(on, both, "placed on both");
    assert!(
        w.starts_of(id, 1).is_empty(),
        "no replica started: {:?}",
        w.starts
    );
    // Its agent registers: the gang starts, with x's address.
    w.register(x, "x", secret, Some("10.0.0.9")).await;
    w.rounds(3, Duration::seconds(2)).await;
    let j = w.job(id).await;
    assert_eq!(j.state, JobState::Running, "{j:?}");
    let addresses: BTreeMap<NodeId, &str> = [(a, "10.0.0.1"), (x, "10.0.0.9")].into();
    assert_one_rendezvous(
        &w.starts_of(id, 1),
        2,
        &addresses,
        PortRange::default().port(id, 1),
    );

    // A gang on one node whose agent has not registered yet starts at once, on loopback.
    let (y, _) = w.unregistered_node("y").await;
    w.store
        .transition_node(y, NodeState::Ready, None, w.now())
        .await
        .expect("ready");
    let mut spec = gang("alone", 1);
    spec.checkpoint = None;
    let alone = w.submit(&team_id, spec).await;
    w.rounds(2, Duration::seconds(2)).await;
    assert_eq!(w.nodes_of(alone).await, [y]);
    let cmds = w
        .store
        .agent_commands(y, &spotplane::model::PageRequest::first(100))
        .await
        .expect("commands");
    let rv = cmds
        .items
        .iter()
        .find_map(|c| match &c.command.kind {
            CommandKind::Start { rendezvous, .. } => rendezvous.clone(),
            _ => None,
        })
        .expect("its start is queued for the agent to come");
    assert_eq!(
        (rv.peers, rv.master_addr),
        (vec!["127.0.0.1".to_owned()], "127.0.0.1".to_owned())
    );
    db.cleanup().await;
}
