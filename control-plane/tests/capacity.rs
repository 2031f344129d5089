//! The capacity loop on the simulated clouds and a real store (SQLite and PostgreSQL), on a
//! manual clock: demand the scheduler cannot place is bought for, booted nodes take the work,
//! idle nodes go back, orphans are swept, and a node the cloud takes is recorded as lost.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::Duration;
use common::{Backend, TestDb};
use spotplane::metrics::Metrics;
use spotplane::reconcile::capacity::{CapacityLoop, CapacitySettings};
use spotplane::reconcile::scheduling::SchedulerLoop;
use spotplane::store::{NewJob, NewTeam, Store, SubmitOutcome};
use spotplane_core::job::JobSpec;
use spotplane_core::shape::GpuShape;
use spotplane_core::{Cloud, GpuModel, JobId, JobState, NodeId, NodeState};
use spotplane_providers::clock::ManualClock;
use spotplane_providers::config::ProviderConfig;
use spotplane_providers::registry::{self, BuildContext, Providers};
use spotplane_providers::sim::SimConfig;
use spotplane_providers::{CloudProvider, ProvisionRequest, tags};

on_both_databases!(
    unmet_demand_is_bought_for_booted_and_placed_then_released_when_idle,
    orphans_are_swept_and_taken_nodes_are_recorded,
    nothing_is_bought_for_a_job_its_quota_can_never_admit,
    a_gang_past_its_team_budget_or_the_fleet_cap_buys_nothing,
    a_gang_that_cannot_be_bought_whole_is_given_back_and_set_aside,
    an_offer_without_room_is_set_aside_and_the_next_one_bought,
    quota_credentials_throttling_and_network_errors_stop_the_cloud_for_the_round,
    a_refused_request_gives_up_that_buy_only,
    consolidation_buys_the_cheaper_replacement_before_it_drains_the_node,
);

async fn store(db: &TestDb) -> Store {
    let s = Store::connect(&db.config.database, Metrics::new())
        .await
        .expect("connect");
    s.migrate().await.expect("migrate");
    s
}

async fn sims(clock: &ManualClock) -> Arc<Providers> {
    sims_with(clock, |_| {}).await
}

async fn sims_with(clock: &ManualClock, tune: impl FnOnce(&mut SimConfig)) -> Arc<Providers> {
    let mut cfg = SimConfig::new(Cloud::Gcp, 7);
    cfg.regions = vec!["us-central1".into()];
    tune(&mut cfg);
    let ctx = BuildContext {
        clock: Arc::new(clock.clone()),
        sim_market: spotplane_providers::sim::SimMarket::Recorded(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"),
        ),
        catalog_dir: None,
        observer: None,
        sim_state_dir: None,
    };
    Arc::new(
        registry::build(&[ProviderConfig::Sim(cfg)], &ctx)
            .await
            .expect("sims"),
    )
}

fn clock() -> ManualClock {
    ManualClock::new("2026-07-01T00:00:00Z".parse().expect("time"))
}

async fn team(store: &Store, clock: &ManualClock) -> String {
    store
        .create_team(
            NewTeam {
                name: "research".parse().expect("name"),
                weight: 1.0,
                cohort: None,
                quotas: Default::default(),
            },
            spotplane_providers::clock::Clock::now(clock),
        )
        .await
        .expect("team")
        .id
}

async fn submit(store: &Store, team_id: &str, clock: &ManualClock) -> JobId {
    let shape = GpuShape::Whole {
        gpus: 1,
        models: vec![GpuModel::L4],
    };
    submit_spec(
        store,
        team_id,
        clock,
        JobSpec::new("fine-tune", shape, vec!["train".into()]),
    )
    .await
}

async fn submit_spec(store: &Store, team_id: &str, clock: &ManualClock, spec: JobSpec) -> JobId {
    let id = JobId(uuid::Uuid::now_v7());
    let new = NewJob {
        id,
        team_id: team_id.into(),
        team: "research".parse().expect("team"),
        spec,
        idempotency: None,
    };
    match store
        .submit_job(new, spotplane_providers::clock::Clock::now(clock))
        .await
        .expect("submit")
    {
        SubmitOutcome::Created(j) => j.id,
        other => panic!("{other:?}"),
    }
}

fn loops(
    store: &Store,
    providers: &Arc<Providers>,
    clock: &ManualClock,
) -> (SchedulerLoop, CapacityLoop) {
    let settings = spotplane::config::Config::embedded_default()
        .expect("config")
        .scheduler;
    let shared: spotplane::clock::SharedClock = Arc::new(clock.clone());
    (
        SchedulerLoop::new(store.clone(), shared.clone(), settings),
        CapacityLoop::new(
            store.clone(),
            Arc::clone(providers),
            shared,
            CapacitySettings {
                cluster: "test".into(),
                ..CapacitySettings::default()
            },
        ),
    )
}

async fn live_nodes(store: &Store) -> Vec<spotplane::model::Node> {
    store
        .list_nodes(&[NodeState::Requested, NodeState::Booting, NodeState::Ready])
        .await
        .expect("nodes")
}

async fn unmet_demand_is_bought_for_booted_and_placed_then_released_when_idle(backend: Backend) {
    let db = TestDb::new(backend);
    let store = store(&db).await;
    let clock = clock();
    let providers = sims(&clock).await;
    let team_id = team(&store, &clock).await;
    let job = submit(&store, &team_id, &clock).await;
    let (mut sched, mut cap) = loops(&store, &providers, &clock);

    let r = sched.run_once().await.expect("cycle");
    assert_eq!(r.waiting, 1, "no nodes yet: {r:?}");
    let c = cap.run_once().await.expect("round");
    assert_eq!((c.demand, c.bought), (1, 1), "{c:?}");
    let nodes = live_nodes(&store).await;
    assert_eq!(nodes.len(), 1);
    let node = &nodes[0];
    assert_eq!(node.state, NodeState::Booting);
    assert!(
        node.instance_type.starts_with("g2-"),
        "an L4 machine: {}",
        node.instance_type
    );
    assert_eq!(
        node.labels.get(tags::TEAM).map(String::as_str),
        Some("research")
    );
    let pid = node.provider_instance_id.clone().expect("instance id");

    // The next round, still booting: nothing more is bought.
    let c = cap.run_once().await.expect("round");
    assert_eq!(c.bought, 0, "{c:?}");

    // Booted: ready, and the scheduler places the job on it.
    clock.advance(Duration::minutes(4));
    let c = cap.run_once().await.expect("round");
    assert_eq!(c.ready, 1, "{c:?}");
    let r = sched.run_once().await.expect("cycle");
    assert_eq!(r.admitted, 1, "{r:?}");

    // Busy: kept however long it runs.
    clock.advance(Duration::minutes(30));
    let c = cap.run_once().await.expect("round");
    assert_eq!(c.released, 0, "{c:?}");

    // Done: idle past the grace, given back, in the store and in the cloud.
    cancel(&store, job, &clock).await;
    cap.run_once().await.expect("round");
    clock.advance(Duration::minutes(6));
    let c = cap.run_once().await.expect("round");
    assert_eq!(c.released, 1, "{c:?}");
    assert!(live_nodes(&store).await.is_empty());
    let gcp = providers.sim(Cloud::Gcp).expect("sim");
    let inst = gcp.instance_by_name(&pid).expect("listed for a while");
    assert!(inst.terminated_at.is_some());
}

async fn orphans_are_swept_and_taken_nodes_are_recorded(backend: Backend) {
    let db = TestDb::new(backend);
    let store = store(&db).await;
    let clock = clock();
    let providers = sims(&clock).await;
    let team_id = team(&store, &clock).await;
    submit(&store, &team_id, &clock).await;
    let (mut sched, mut cap) = loops(&store, &providers, &clock);
    let sim = providers.sim(Cloud::Gcp).expect("sim").clone();

    // An instance with the cluster tag that no node row knows (a crash between the cloud's
    // answer and the store's write, say).
    let offer = sim
        .list_offers()
        .await
        .expect("offers")
        .into_iter()
        .find(|o| o.gpu_count > 0 && o.market == spotplane_core::Market::OnDemand)
        .expect("an offer");
    let orphan_node = NodeId(uuid::Uuid::now_v7());
    let orphan = sim
        .provision(&ProvisionRequest {
            node_id: orphan_node,
            offer,
            client_token: "orphan".into(),
            tags: BTreeMap::from([(tags::CLUSTER.to_owned(), "test".to_owned())]),
            user_data: None,
        })
        .await
        .expect("provisioned");

    sched.run_once().await.expect("cycle");
    let c = cap.run_once().await.expect("round");
    assert_eq!(
        (c.bought, c.orphans),
        (1, 0),
        "young orphans are left alone: {c:?}"
    );
    clock.advance(Duration::minutes(4));
    cap.run_once().await.expect("round");
    sched.run_once().await.expect("cycle");

    clock.advance(Duration::minutes(7));
    let c = cap.run_once().await.expect("round");
    assert_eq!(c.orphans, 1, "{c:?}");
    assert!(
        sim.instances()
            .iter()
            .any(|i| i.id == orphan.provider_id && i.terminated_at.is_some())
    );

    // The cloud takes the node: after the notice it is gone, and recorded so.
    let node = live_nodes(&store).await.pop().expect("a node");
    assert!(sim.preempt_now(node.provider_instance_id.as_deref().expect("id")));
    clock.advance(Duration::minutes(1));
    let c = cap.run_once().await.expect("round");
    assert_eq!(c.vanished, 1, "{c:?}");
    let after = store.get_node(node.id).await.expect("node");
    assert_eq!(after.state, NodeState::Terminated);
    assert_eq!(
        after.state_reason.as_deref(),
        Some("the cloud took the instance")
    );
}

async fn cancel(store: &Store, job: JobId, clock: &ManualClock) {
    store
        .transition_job(
            job,
            None,
            None,
            JobState::Cancelled,
            None,
            spotplane_providers::clock::Clock::now(clock),
        )
        .await
        .expect("cancelled");
}

/// Every node ever bought, whatever its state now.
async fn all_nodes(store: &Store) -> Vec<spotplane::model::Node> {
    store.list_nodes(&NodeState::ALL).await.expect("nodes")
}

/// Scheduling cycles and capacity rounds, a minute of the clock apart; what was bought.
async fn rounds(
    sched: &mut SchedulerLoop,
    cap: &mut CapacityLoop,
    clock: &ManualClock,
    n: usize,
) -> usize {
    let mut bought = 0;
    for _ in 0..n {
        sched.run_once().await.expect("cycle");
        bought += cap.run_once().await.expect("round").bought;
        clock.advance(Duration::minutes(1));
    }
    bought
}

async fn reason(store: &Store, job: JobId) -> Option<String> {
    store.get_job(job, None).await.expect("job").state_reason
}

// Issue 29 no. 1: a team whose only quota is H100s asked for L4s; T4 and L4 nodes were bought
// and given back forever.
async fn nothing_is_bought_for_a_job_its_quota_can_never_admit(backend: Backend) {
    use spotplane_core::team::{Quota, QuotaResource};
    let db = TestDb::new(backend);
    let store = store(&db).await;
    let clock = clock();
    let providers = sims(&clock).await;
    let quotas = BTreeMap::from([(
        QuotaResource::Gpu(GpuModel::H100_80GB),
        Quota {
            nominal: 8,
            borrowing_limit: None,
            lending_limit: None,
        },
    )]);
    let team_id = store
        .create_team(
            NewTeam {
                name: "research".parse().expect("name"),
                weight: 1.0,
                cohort: None,
                quotas,
            },
            spotplane_providers::clock::Clock::now(&clock),
        )
        .await
        .expect("team")
        .id;
    let l4 = submit(&store, &team_id, &clock).await;
    let (mut sched, mut cap) = loops(&store, &providers, &clock);
    let bought = rounds(&mut sched, &mut cap, &clock, 10).await;
    assert_eq!(bought, 0);
    assert!(all_nodes(&store).await.is_empty());
    assert_eq!(
        reason(&store, l4).await.as_deref(),
        Some("waiting for quota")
    );

    // A job that may run on any model is bought H100s only.
    let any = GpuShape::Whole {
        gpus: 1,
        models: vec![],
    };
    submit_spec(
        &store,
        &team_id,
        &clock,
        JobSpec::new("any", any, vec!["train".into()]),
    )
    .await;
    let bought = rounds(&mut sched, &mut cap, &clock, 3).await;
    assert!(bought >= 1);
    for n in all_nodes(&store).await {
        assert!(
            !n.gpus.is_empty() && n.gpus.iter().all(|g| g.model == GpuModel::H100_80GB),
            "{} has {:?}",
            n.instance_type,
            n.gpus
        );
    }
    assert_eq!(
        reason(&store, l4).await.as_deref(),
        Some("waiting for quota")
    );
}

// Issue 29 B: a $100/month team's gang of 1024 big nodes bought 144 of them in 30 s.
async fn a_gang_past_its_team_budget_or_the_fleet_cap_buys_nothing(backend: Backend) {
    let db = TestDb::new(backend);
    let store = store(&db).await;
    let clock = clock();
    let providers = sims(&clock).await;
    let team_id = team(&store, &clock).await;
    store
        .set_team_budget(
            &team_id,
            Some(spotplane_core::Micros::parse_usd("100").expect("usd")),
            spotplane_providers::clock::Clock::now(&clock),
        )
        .await
        .expect("budget");
    let gang = |replicas: u32| {
        let mut spec = JobSpec::new(
            "pretrain",
            GpuShape::Whole {
                gpus: 8,
                models: vec![],
            },
            vec!["train".into()],
        );
        spec.replicas = replicas;
        spec
    };
    let big = submit_spec(&store, &team_id, &clock, gang(1024)).await;
    let (mut sched, mut cap) = loops(&store, &providers, &clock);
    assert_eq!(rounds(&mut sched, &mut cap, &clock, 3).await, 0);
    assert!(all_nodes(&store).await.is_empty());

    // Without a budget, the fleet's cap: the embedded default's is kept.
    store
        .set_team_budget(
            &team_id,
            None,
            spotplane_providers::clock::Clock::now(&clock),
        )
        .await
        .expect("no budget");
    let defaults = spotplane::config::Config::embedded_default()
        .expect("config")
        .capacity
        .settings();
    let shared: spotplane::clock::SharedClock = Arc::new(clock.clone());
    let mut capped = CapacityLoop::new(
        store.clone(),
        Arc::clone(&providers),
        shared,
        CapacitySettings {
            cluster: "test".into(),
            ..defaults
        },
    );
    assert_eq!(rounds(&mut sched, &mut capped, &clock, 3).await, 0);
    assert!(all_nodes(&store).await.is_empty());
    cancel(&store, big, &clock).await;
    // A gang within both is bought whole.
    submit_spec(&store, &team_id, &clock, gang(2)).await;
    assert_eq!(rounds(&mut sched, &mut capped, &clock, 1).await, 2);
}

async fn a_gang_that_cannot_be_bought_whole_is_given_back_and_set_aside(backend: Backend) {
    let db = TestDb::new(backend);
    let store = store(&db).await;
    let clock = clock();
    // One instance per pool: fewer nodes of any L4 machine than the gang needs.
    let providers = sims_with(&clock, |c| c.pool_capacity = 1).await;
    let team_id = team(&store, &clock).await;
    let mut spec = JobSpec::new(
        "gang",
        GpuShape::Whole {
            gpus: 1,
            models: vec![GpuModel::L4],
        },
        vec!["train".into()],
    );
    spec.replicas = 64;
    submit_spec(&store, &team_id, &clock, spec).await;
    let (mut sched, mut cap) = loops(&store, &providers, &clock);
    sched.run_once().await.expect("cycle");
    let c = cap.run_once().await.expect("round");
    assert!(
        c.bought > 0,
        "some were bought before the pools ran out: {c:?}"
    );
    assert_eq!(c.released, c.bought, "and all given back: {c:?}");
    assert!(live_nodes(&store).await.is_empty());
    // Set aside: the next rounds buy nothing for it.
    let before = all_nodes(&store).await.len();
    assert_eq!(rounds(&mut sched, &mut cap, &clock, 5).await, 0);
    assert_eq!(all_nodes(&store).await.len(), before);
}

/// A simulated cloud whose `provision` fails as scripted (one entry per call, `None`: the
/// simulated cloud answers), recording the offer of every call.
struct Scripted {
    inner: Arc<dyn CloudProvider>,
    script:
        std::sync::Mutex<std::collections::VecDeque<Option<spotplane_providers::ProviderError>>>,
    calls: std::sync::Mutex<Vec<String>>,
}

impl Scripted {
    fn fail_next(&self, e: spotplane_providers::ProviderError) {
        self.script.lock().expect("script").push_back(Some(e));
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().expect("calls").clone()
    }
}

#[async_trait::async_trait]
impl CloudProvider for Scripted {
    fn cloud(&self) -> Cloud {
        self.inner.cloud()
    }
    async fn list_offers(
        &self,
    ) -> Result<Vec<spotplane_providers::Offer>, spotplane_providers::ProviderError> {
        self.inner.list_offers().await
    }
    async fn provision(
        &self,
        req: &ProvisionRequest,
    ) -> Result<spotplane_providers::Instance, spotplane_providers::ProviderError> {
        self.calls.lock().expect("calls").push(req.offer.id());
        let next = self.script.lock().expect("script").pop_front().flatten();
        match next {
            Some(e) => Err(e),
            None => self.inner.provision(req).await,
        }
    }
    async fn terminate(&self, id: &str) -> Result<(), spotplane_providers::ProviderError> {
        self.inner.terminate(id).await
    }
    async fn list_instances(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<spotplane_providers::Instance>, spotplane_providers::ProviderError> {
        self.inner.list_instances(tags).await
    }
    async fn drain_interruptions(
        &self,
    ) -> Result<Vec<spotplane_providers::InterruptionEvent>, spotplane_providers::ProviderError>
    {
        self.inner.drain_interruptions().await
    }
}

/// The simulated GCP behind a [`Scripted`] front.
async fn scripted(clock: &ManualClock) -> (Arc<Providers>, Arc<Scripted>) {
    let sims = sims(clock).await;
    let front = Arc::new(Scripted {
        inner: Arc::clone(&sims.all[0]),
        script: Default::default(),
        calls: Default::default(),
    });
    let providers = Providers {
        all: vec![Arc::clone(&front) as Arc<dyn CloudProvider>],
        sims: sims.sims.clone(),
    };
    (Arc::new(providers), front)
}

/// A job that takes a whole 8-GPU L4 machine: one node, one buy.
async fn submit_whole_node(store: &Store, team_id: &str, clock: &ManualClock) -> JobId {
    let shape = GpuShape::Whole {
        gpus: 8,
        models: vec![GpuModel::L4],
    };
    submit_spec(
        store,
        team_id,
        clock,
        JobSpec::new("eight", shape, vec!["train".into()]),
    )
    .await
}

async fn an_offer_without_room_is_set_aside_and_the_next_one_bought(backend: Backend) {
    let db = TestDb::new(backend);
    let store = store(&db).await;
    let clock = clock();
    let (providers, cloud) = scripted(&clock).await;
    let team_id = team(&store, &clock).await;
    submit(&store, &team_id, &clock).await;
    let (mut sched, mut cap) = loops(&store, &providers, &clock);
    cloud.fail_next(spotplane_providers::ProviderError::InsufficientCapacity {
        offer_id: "first choice".into(),
        message: "ZONE_RESOURCE_POOL_EXHAUSTED".into(),
    });
    sched.run_once().await.expect("cycle");
    let r = cap.run_once().await.expect("round");
    let calls = cloud.calls();
    assert_eq!(
        calls.len(),
        2,
        "the first offer, then its fallback: {calls:?}"
    );
    let first = calls[0].clone();
    assert_ne!(calls[1], first);
    // The fallback was bought: the buy as a whole was not refused.
    assert_eq!(r.bought, 1, "{r:?}");
    assert!(r.refused.is_empty(), "{r:?}");
    let nodes = live_nodes(&store).await;
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].offer_id.as_deref(), Some(calls[1].as_str()));
    // Within capacity_error_ttl (3 minutes by default) the first offer is not tried again...
    submit(&store, &team_id, &clock).await;
    clock.advance(Duration::minutes(2));
    sched.run_once().await.expect("cycle");
    cap.run_once().await.expect("round");
    let calls = cloud.calls();
    assert!(calls.len() > 2, "the new job is bought for: {calls:?}");
    assert!(!calls[2..].contains(&first), "set aside: {calls:?}");
    // ...and after it, it is the first choice again.
    submit(&store, &team_id, &clock).await;
    clock.advance(Duration::minutes(2));
    let before = cloud.calls().len();
    sched.run_once().await.expect("cycle");
    cap.run_once().await.expect("round");
    let calls = cloud.calls();
    assert_eq!(calls.get(before), Some(&first), "{calls:?}");
    db.cleanup().await;
}

async fn quota_credentials_throttling_and_network_errors_stop_the_cloud_for_the_round(
    backend: Backend,
) {
    use spotplane_providers::ProviderError;
    let stopping = [
        ProviderError::Quota("QUOTA_EXCEEDED: GPUS_ALL_REGIONS".into()),
        ProviderError::Auth("the access token expired".into()),
        ProviderError::Throttled {
            retry_after: std::time::Duration::from_secs(2),
        },
        ProviderError::Transient("502 Bad Gateway".into()),
    ];
    for e in stopping {
        let kind = e.kind();
        let db = TestDb::new(backend);
        let store = store(&db).await;
        let clock = clock();
        let (providers, cloud) = scripted(&clock).await;
        let team_id = team(&store, &clock).await;
        for _ in 0..2 {
            submit_whole_node(&store, &team_id, &clock).await;
        }
        let (mut sched, mut cap) = loops(&store, &providers, &clock);
        cloud.fail_next(e);
        sched.run_once().await.expect("cycle");
        let r = cap.run_once().await.expect("round");
        assert_eq!(
            cloud.calls().len(),
            1,
            "{kind}: one call, then no more: {r:?}"
        );
        assert_eq!(r.bought, 0, "{kind}: {r:?}");
        assert_eq!(r.refused.get(kind), Some(&1), "{kind}: {r:?}");
        // The offer is not set aside: the next round buys both nodes, the first from it.
        let first = cloud.calls()[0].clone();
        clock.advance(Duration::seconds(10));
        sched.run_once().await.expect("cycle");
        let r = cap.run_once().await.expect("round");
        assert_eq!(r.bought, 2, "{kind}: the next round goes on: {r:?}");
        assert_eq!(cloud.calls().get(1), Some(&first), "{kind}");
        db.cleanup().await;
    }
}

async fn a_refused_request_gives_up_that_buy_only(backend: Backend) {
    use spotplane_providers::ProviderError;
    let refused =
        || ProviderError::InvalidRequest("Invalid value for field 'resource.machineType'".into());
    // One job: its buy stops at the refusal, no fallback tried.
    let db = TestDb::new(backend);
    let store = store(&db).await;
    let clock = clock();
    let (providers, cloud) = scripted(&clock).await;
    let team_id = team(&store, &clock).await;
    submit_whole_node(&store, &team_id, &clock).await;
    let (mut sched, mut cap) = loops(&store, &providers, &clock);
    cloud.fail_next(refused());
    sched.run_once().await.expect("cycle");
    let r = cap.run_once().await.expect("round");
    assert_eq!(cloud.calls().len(), 1, "no fallback: {:?}", cloud.calls());
    assert_eq!(r.bought, 0, "{r:?}");
    assert_eq!(r.refused.get("invalid_request"), Some(&1), "{r:?}");
    db.cleanup().await;
    // Two jobs: the other buy on the same cloud is still made.
    let db = TestDb::new(backend);
    let store = self::store(&db).await;
    let (providers, cloud) = scripted(&clock).await;
    let team_id = team(&store, &clock).await;
    for _ in 0..2 {
        submit_whole_node(&store, &team_id, &clock).await;
    }
    let (mut sched, mut cap) = loops(&store, &providers, &clock);
    cloud.fail_next(refused());
    sched.run_once().await.expect("cycle");
    let r = cap.run_once().await.expect("round");
    assert_eq!(r.bought, 1, "{r:?} {:?}", cloud.calls());
    assert_eq!(r.refused.len(), 1, "{r:?}");
    assert_eq!(r.refused.get("invalid_request"), Some(&1), "{r:?}");
    db.cleanup().await;
}

/// Consolidation's replace move, in Karpenter's order: a job put on on-demand during a spot
/// crunch is not moved while no spot can be bought (a refused call, the node and its work
/// untouched); once spot is back the replacement is bought first, the on-demand node is kept
/// until it is ready, then drained, and the replacement is not taken for idle meanwhile.
async fn consolidation_buys_the_cheaper_replacement_before_it_drains_the_node(backend: Backend) {
    use spotplane_core::job::CheckpointSpec;
    let db = TestDb::new(backend);
    let store = store(&db).await;
    let clock = clock();
    let providers = sims(&clock).await;
    let gcp = Arc::clone(providers.sim(Cloud::Gcp).expect("sim"));
    gcp.set_spot_outage(true);
    let team_id = team(&store, &clock).await;
    let mut spec = JobSpec::new(
        "fine-tune",
        GpuShape::Whole {
            gpus: 1,
            models: vec![GpuModel::L4],
        },
        vec!["train".into()],
    );
    spec.checkpoint = Some(CheckpointSpec {
        uri: "s3://ckpt/fine-tune".into(),
        interval_s: 600,
    });
    let job = submit_spec(&store, &team_id, &clock, spec).await;
    let (mut sched, mut cap) = loops(&store, &providers, &clock);

    // No spot anywhere: the job's node is on-demand.
    for _ in 0..10 {
        sched.run_once().await.expect("cycle");
        cap.run_once().await.expect("round");
        if !live_nodes(&store).await.is_empty() {
            break;
        }
        clock.advance(Duration::seconds(30));
    }
    let nodes = live_nodes(&store).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let old = nodes[0].clone();
    assert_eq!(old.market, spotplane_core::Market::OnDemand, "{old:?}");
    clock.advance(Duration::minutes(4));
    cap.run_once().await.expect("round");
    let r = sched.run_once().await.expect("cycle");
    assert_eq!(r.admitted, 1, "{r:?}");

    // Steady past consolidate_after, the crunch still on: the replacement is refused, and
    // nothing else changes.
    for _ in 0..4 {
        clock.advance(Duration::minutes(6));
        let c = cap.run_once().await.expect("round");
        assert_eq!((c.bought, c.consolidated), (0, 0), "{c:?}");
    }
    let nodes = live_nodes(&store).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0].state, NodeState::Ready);
    let j = store.get_job(job, None).await.expect("job");
    assert_eq!(j.attempt, 1, "never requeued: {j:?}");

    // Spot is back: the replacement is bought, the old node keeps its work until it is ready.
    gcp.set_spot_outage(false);
    let mut replacement = None;
    for _ in 0..12 {
        clock.advance(Duration::minutes(1));
        let c = cap.run_once().await.expect("round");
        assert_eq!(c.consolidated, 0, "{c:?}");
        if let Some(n) = live_nodes(&store)
            .await
            .into_iter()
            .find(|n| n.id != old.id)
        {
            replacement = Some(n);
            break;
        }
    }
    let new = replacement.expect("a replacement bought once spot is back");
    assert_eq!(new.market, spotplane_core::Market::Spot, "{new:?}");
    assert!(new.hourly_price < old.hourly_price, "{new:?}");
    assert_eq!(
        new.labels.get(tags::REPLACES),
        Some(&old.id.to_string()),
        "{new:?}"
    );
    assert_eq!(
        store.get_node(old.id).await.expect("old").state,
        NodeState::Ready
    );

    // Ready: the old node is drained, once; the empty replacement is kept for its work.
    clock.advance(Duration::minutes(4));
    let c = cap.run_once().await.expect("round");
    assert_eq!(c.consolidated, 1, "{c:?}");
    assert_eq!(
        store.get_node(old.id).await.expect("old").state,
        NodeState::Draining
    );
    for _ in 0..3 {
        clock.advance(Duration::minutes(3));
        let c = cap.run_once().await.expect("round");
        assert_eq!((c.consolidated, c.released), (0, 0), "{c:?}");
    }
    assert_eq!(
        store.get_node(new.id).await.expect("new").state,
        NodeState::Ready
    );
}
