//! The scheduling loop against a real store, on SQLite and PostgreSQL.

mod common;

use std::sync::Arc;

use chrono::Utc;
use common::{Backend, TestDb};
use spotplane::clock::SystemClock;
use spotplane::metrics::Metrics;
use spotplane::reconcile::scheduling::SchedulerLoop;
use spotplane::store::{NewGpu, NewJob, NewNode, NewTeam, SpecCache, Store, SubmitOutcome};
use spotplane_core::job::JobSpec;
use spotplane_core::shape::GpuShape;
use spotplane_core::{
    Cloud, GpuModel, JobId, JobState, Market, Micros, MigLayout, NodeId, NodeState,
};

on_both_databases!(
    queued_jobs_are_admitted_onto_ready_nodes_with_their_allocations,
    a_higher_priority_job_preempts_and_then_waits_without_preempting_more,
    mig_demand_orders_a_re_layout_once_and_runs_when_it_is_applied,
    a_cancelled_cycle_writes_nothing_and_the_loop_stops,
);

async fn store(db: &TestDb) -> Store {
    let s = Store::connect(&db.config.database, Metrics::new())
        .await
        .expect("connect");
    s.migrate().await.expect("migrate");
    s
}

async fn ready_node(store: &Store, n: u128, gpus: usize) -> NodeId {
    let id = NodeId(uuid::Uuid::from_u128(n));
    let now = Utc::now();
    store
        .create_node(
            NewNode {
                id,
                name: format!("node-{n}"),
                cloud: Cloud::Aws,
                region: "us-east-1".into(),
                zone: "us-east-1a".into(),
                instance_type: "p5.48xlarge".into(),
                market: Market::Spot,
                offer_id: None,
                client_token: format!("ct-{n}"),
                hourly_price: Micros::from_dollars(30),
                on_demand_price: Micros::from_dollars(98),
                cpu_milli: 192_000,
                memory_mib: 2 << 20,
                gpus: (0..gpus)
                    .map(|_| NewGpu {
                        model: GpuModel::H100_80GB,
                        memory_mib: 81_559,
                        mig_enabled: false,
                        mig_layout: MigLayout::empty(),
                    })
                    .collect(),
                labels: Default::default(),
            },
            now,
        )
        .await
        .expect("node");
    store
        .transition_node(id, NodeState::Booting, None, now)
        .await
        .expect("booting");
    store
        .transition_node(id, NodeState::Ready, None, now)
        .await
        .expect("ready");
    id
}

async fn submit(
    store: &Store,
    team_id: &str,
    name: &str,
    shape: GpuShape,
    replicas: u32,
    priority: i32,
) -> JobId {
    let mut spec = JobSpec::new(name, shape, vec!["train".into()]);
    spec.replicas = replicas;
    spec.priority = spotplane_core::Priority::Value(priority);
    let id = JobId(uuid::Uuid::now_v7());
    let new = NewJob {
        id,
        team_id: team_id.into(),
        team: "research".parse().expect("team"),
        spec,
        idempotency: None,
    };
    match store.submit_job(new, Utc::now()).await.expect("submit") {
        SubmitOutcome::Created(j) => j.id,
        other => panic!("{other:?}"),
    }
}

async fn team(store: &Store) -> String {
    let t = store
        .create_team(
            NewTeam {
                name: "research".parse().expect("name"),
                weight: 1.0,
                cohort: None,
                quotas: Default::default(),
            },
            Utc::now(),
        )
        .await
        .expect("team");
    t.id
}

fn looped(store: &Store) -> SchedulerLoop {
    let mut settings = spotplane::config::Config::embedded_default()
        .expect("config")
        .scheduler;
    settings.policy = "spotplane".into();
    SchedulerLoop::new(store.clone(), Arc::new(SystemClock), settings)
}

async fn queued_jobs_are_admitted_onto_ready_nodes_with_their_allocations(backend: Backend) {
    let db = TestDb::new(backend);
    let store = store(&db).await;
    let team_id = team(&store).await;
    let node = ready_node(&store, 1, 8).await;
    let a = submit(
        &store,
        &team_id,
        "a",
        GpuShape::Whole {
            gpus: 4,
            models: vec![],
        },
        1,
        100,
    )
    .await;
    let b = submit(
        &store,
        &team_id,
        "b",
        GpuShape::Shared {
            gpu_milli: 500,
            models: vec![],
        },
        2,
        100,
    )
    .await;
    let c = submit(
        &store,
        &team_id,
        "c",
        GpuShape::Whole {
            gpus: 8,
            models: vec![],
        },
        1,
        100,
    )
    .await;
    let mut l = looped(&store);
    let r = l.run_once().await.expect("cycle");
    assert_eq!((r.admitted, r.waiting), (2, 1), "{r:?}");
    for id in [a, b] {
        assert_eq!(
            store.get_job(id, None).await.expect("job").state,
            JobState::Admitted
        );
    }
    let waiting = store.get_job(c, None).await.expect("job");
    assert_eq!(
        (waiting.state, waiting.state_reason.as_deref()),
        (JobState::Queued, Some("waiting for capacity"))
    );
    // The allocations are in the next snapshot: nothing else fits now.
    let snap = store
        .scheduler_snapshot(&mut SpecCache::default())
        .await
        .expect("snapshot");
    let held: usize = snap.running.iter().map(|r| r.placements.len()).sum();
    assert_eq!(held, 3);
    assert!(
        snap.running
            .iter()
            .flat_map(|r| &r.placements)
            .all(|p| p.node == node)
    );
    let r = l.run_once().await.expect("cycle");
    assert_eq!(r.admitted, 0);
    let events = store.outbox_after(0, 1000).await.expect("outbox");
    assert_eq!(
        events.iter().filter(|e| e.kind == "job.admitted").count(),
        2
    );
    db.cleanup().await;
}

async fn a_higher_priority_job_preempts_and_then_waits_without_preempting_more(backend: Backend) {
    let db = TestDb::new(backend);
    let store = store(&db).await;
    let team_id = team(&store).await;
    ready_node(&store, 1, 2).await;
    let low: Vec<JobId> = [
        submit(
            &store,
            &team_id,
            "low-1",
            GpuShape::Whole {
                gpus: 1,
                models: vec![],
            },
            1,
            100,
        )
        .await,
        submit(
            &store,
            &team_id,
            "low-2",
            GpuShape::Whole {
                gpus: 1,
                models: vec![],
            },
            1,
            100,
        )
        .await,
    ]
    .to_vec();
    let mut l = looped(&store);
    assert_eq!(l.run_once().await.expect("cycle").admitted, 2);
    // The node agent starts them (its protocol arrives with the agent).
    for id in &low {
        store
            .transition_job(*id, None, None, JobState::Starting, None, Utc::now())
            .await
            .expect("starting");
        store
            .transition_job(*id, None, None, JobState::Running, None, Utc::now())
            .await
            .expect("running");
    }
    let high = submit(
        &store,
        &team_id,
        "high",
        GpuShape::Whole {
            gpus: 1,
            models: vec![],
        },
        1,
        1000,
    )
    .await;
    let r = l.run_once().await.expect("cycle");
    assert_eq!(r.preempted, 1, "{r:?}");
    let states: Vec<JobState> = futures_states(&store, &low).await;
    assert_eq!(
        states.iter().filter(|s| **s == JobState::Draining).count(),
        1
    );
    let h = store.get_job(high, None).await.expect("job");
    assert_eq!(
        h.state_reason.as_deref(),
        Some(spotplane::scheduler::WaitReason::WaitingForPreemption.text())
    );
    // Next cycle: the victim still drains; the preemptor waits for it, no second victim.
    let r = l.run_once().await.expect("cycle");
    assert_eq!(r.preempted, 0, "{r:?}");
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_victim_not_started_yet_goes_back_to_the_queue_and_frees_its_gpus() {
    let db = TestDb::new(Backend::Sqlite);
    let store = store(&db).await;
    let team_id = team(&store).await;
    ready_node(&store, 1, 1).await;
    let low = submit(
        &store,
        &team_id,
        "low",
        GpuShape::Whole {
            gpus: 1,
            models: vec![],
        },
        1,
        100,
    )
    .await;
    let mut l = looped(&store);
    assert_eq!(l.run_once().await.expect("cycle").admitted, 1);
    let high = submit(
        &store,
        &team_id,
        "high",
        GpuShape::Whole {
            gpus: 1,
            models: vec![],
        },
        1,
        1000,
    )
    .await;
    assert_eq!(l.run_once().await.expect("cycle").preempted, 1);
    let j = store.get_job(low, None).await.expect("job");
    assert_eq!(j.state, JobState::Queued);
    assert!(
        j.state_reason
            .as_deref()
            .is_some_and(|r| r.starts_with("requeued")),
        "{:?}",
        j.state_reason
    );
    // Its GPU is free: the preemptor runs next cycle and the victim waits, first among its peers.
    let r = l.run_once().await.expect("cycle");
    assert_eq!(r.admitted, 1, "{r:?}");
    assert_eq!(
        store.get_job(high, None).await.expect("job").state,
        JobState::Admitted
    );
    db.cleanup().await;
}

async fn futures_states(store: &Store, ids: &[JobId]) -> Vec<JobState> {
    let mut out = Vec::new();
    for id in ids {
        out.push(store.get_job(*id, None).await.expect("job").state);
    }
    out
}

async fn mig_demand_orders_a_re_layout_once_and_runs_when_it_is_applied(backend: Backend) {
    let db = TestDb::new(backend);
    let store = store(&db).await;
    let team_id = team(&store).await;
    let node = ready_node(&store, 1, 1).await;
    let job = submit(
        &store,
        &team_id,
        "mig",
        GpuShape::Mig {
            profile: "3g.40gb".parse().expect("p"),
            models: vec![],
        },
        2,
        100,
    )
    .await;
    let mut l = looped(&store);
    let r = l.run_once().await.expect("cycle");
    assert_eq!((r.admitted, r.relayouts), (0, 1), "{r:?}");
    let r = l.run_once().await.expect("cycle");
    assert_eq!(
        r.relayouts, 0,
        "a re-layout in flight is not ordered again: {r:?}"
    );
    let events = store.outbox_after(0, 1000).await.expect("outbox");
    let ordered = events
        .iter()
        .find(|e| e.kind == "node.mig_relayout_requested")
        .expect("event");
    let layout: MigLayout =
        serde_json::from_value(ordered.payload["layout"].clone()).expect("layout");
    // The node applies it.
    store
        .record_mig_layout(node, 0, Some(&layout))
        .await
        .expect("applied");
    let r = l.run_once().await.expect("cycle");
    assert_eq!(r.admitted, 1, "{r:?}");
    assert_eq!(
        store.get_job(job, None).await.expect("job").state,
        JobState::Admitted
    );
    db.cleanup().await;
}

#[tokio::test]
async fn only_one_replica_leads_on_postgresql() {
    let db = TestDb::new(Backend::Postgres);
    let a = store(&db).await;
    let b = Store::connect(&db.config.database, Metrics::new())
        .await
        .expect("connect");
    let lead = a
        .try_lead("scheduling")
        .await
        .expect("try")
        .expect("the first replica leads");
    assert!(
        b.try_lead("scheduling").await.expect("try").is_none(),
        "the second does not"
    );
    // Each loop has its own leader: the webhook loop is free while the scheduling loop is held,
    // by this replica as by the other.
    let webhooks = a
        .try_lead("webhooks")
        .await
        .expect("try")
        .expect("another loop's lock is free");
    drop(webhooks);
    drop(lead);
    let mut again = None;
    for _ in 0..50 {
        again = b.try_lead("scheduling").await.expect("try");
        if again.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut again = again.expect("the second leads once the first lets go");
    assert!(again.still_held().await);
    db.cleanup().await;
}

// Issue 29 no. 3: `serve` did not stop on SIGTERM while a long cycle ran.
async fn a_cancelled_cycle_writes_nothing_and_the_loop_stops(backend: Backend) {
    let db = TestDb::new(backend);
    let store = store(&db).await;
    let team_id = team(&store).await;
    ready_node(&store, 1, 8).await;
    let whole = GpuShape::Whole {
        gpus: 1,
        models: vec![],
    };
    let job = submit(&store, &team_id, "a", whole, 1, 0).await;
    let mut sched = looped(&store);
    let cancel = tokio_util::sync::CancellationToken::new();
    cancel.cancel();
    let r = sched.run_until(Utc::now(), &cancel).await.expect("cycle");
    assert_eq!(r.admitted, 0, "{r:?}");
    let j = store.get_job(job, None).await.expect("job");
    assert_eq!(j.state, JobState::Queued);
    // The loop itself returns at once once cancelled.
    let round =
        spotplane::reconcile::runner::Round::new("scheduling", std::time::Duration::from_secs(1))
            .step(looped(&store));
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        spotplane::reconcile::runner::run(
            round,
            Arc::new(store.clone()),
            Arc::new(SystemClock),
            cancel,
            None,
        ),
    )
    .await
    .expect("the loop stops when cancelled");
    // Not cancelled: the job is placed.
    let r = sched.run_once().await.expect("cycle");
    assert_eq!(r.admitted, 1, "{r:?}");
}
