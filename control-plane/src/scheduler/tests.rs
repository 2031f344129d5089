//! Table-driven cases, one per rule, and property tests of the invariants.

use std::collections::HashMap;

use chrono::{DateTime, Duration, TimeZone, Utc};
use proptest::prelude::*;
use spotplane_core::mig::MigClass;
use spotplane_core::shape::{GpuShape, ResourceShape};
use spotplane_core::team::{Quota, QuotaResource};
use spotplane_core::{Cloud, GpuModel, JobId, Market, MigInstance, MigLayout, NodeId};

use super::packing::{
    Choice, Devices, PackNode, PackPod, PackingPolicy, Score, ScoreCtx, best_share, lowest_idle,
};
use super::*;

/// Tightest fit: the node with the least GPU left after placing; a test stand-in for the real
/// policies.
struct Tightest;

impl PackingPolicy for Tightest {
    fn name(&self) -> &'static str {
        "tightest"
    }
    fn score(&self, node: &PackNode<'_>, pod: &PackPod<'_>, _ctx: &ScoreCtx) -> Choice {
        let devices = if pod.is_share() {
            best_share(node.gpus, pod.gpu_milli).map_or(Devices::None, Devices::Share)
        } else if pod.is_gpu() {
            lowest_idle(node.gpus, pod.num_gpu).map_or(Devices::None, Devices::Whole)
        } else {
            Devices::None
        };
        let left = i64::from(node.gpu_left_total()) - i64::from(pod.total_milli());
        Choice {
            score: Score {
                primary: left,
                secondary: node.cpu_left - pod.cpu,
            },
            devices,
        }
    }
}

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0)
        .single()
        .expect("time")
}

fn nid(n: u128) -> NodeId {
    NodeId(uuid::Uuid::from_u128(n))
}

fn jid(n: u128) -> JobId {
    JobId(uuid::Uuid::from_u128(n))
}

fn node(n: u128, model: GpuModel, gpus: usize, zone: &str) -> NodeSnap {
    NodeSnap {
        id: nid(n),
        cloud: Cloud::Aws,
        region: "us-east-1".into(),
        zone: zone.into(),
        market: Market::Spot,
        schedulable: true,
        runs_images: true,
        cpu_milli: 96_000,
        memory_mib: 1024 * 1024,
        gpu_model: Some(model),
        gpus: vec![GpuSnap::Plain; gpus],
    }
}

fn whole(k: u32) -> GpuShape {
    GpuShape::Whole {
        gpus: k,
        models: vec![],
    }
}

fn share(m: u32) -> GpuShape {
    GpuShape::Shared {
        gpu_milli: m,
        models: vec![],
    }
}

fn mig(p: &str) -> GpuShape {
    GpuShape::Mig {
        profile: p.parse().expect("profile"),
        models: vec![],
    }
}

fn res(gpu: GpuShape) -> ResourceShape {
    ResourceShape {
        gpu,
        cpu_milli: 1000,
        memory_mib: 1024,
    }
}

fn queued(id: u128, team: &str, gpu: GpuShape, replicas: u32, priority: i32) -> QueuedJob {
    QueuedJob {
        id: jid(id),
        team: team.parse().expect("team"),
        priority,
        requeued: false,
        nominated: false,
        replicas,
        shape: res(gpu),
        clouds: vec![],
        regions: vec![],
        spot: true,
        image: false,
    }
}

fn running(
    id: u128,
    team: &str,
    gpu: GpuShape,
    priority: i32,
    placements: Vec<(u128, Assigned)>,
    hours_since_ckpt: i64,
) -> RunningJob {
    RunningJob {
        id: jid(id),
        team: team.parse().expect("team"),
        priority,
        shape: res(gpu),
        placements: placements
            .into_iter()
            .enumerate()
            .map(|(r, (n, assigned))| Placement {
                replica: r as u32,
                node: nid(n),
                assigned,
            })
            .collect(),
        draining: false,
        progress_since: now() - Duration::hours(hours_since_ckpt),
    }
}

fn team(
    name: &str,
    weight: f64,
    cohort: Option<&str>,
    quotas: &[(QuotaResource, u32, Option<u32>)],
) -> TeamSnap {
    TeamSnap {
        name: name.parse().expect("team"),
        weight,
        cohort: cohort.map(str::to_owned),
        quotas: quotas
            .iter()
            .map(|(r, n, b)| {
                (
                    *r,
                    Quota {
                        nominal: *n,
                        borrowing_limit: *b,
                        lending_limit: None,
                    },
                )
            })
            .collect(),
    }
}

fn run(snap: &Snapshot) -> Decisions {
    schedule(snap, &Tightest, &SchedulerConfig::default(), now())
}

fn admitted(d: &Decisions) -> Vec<JobId> {
    d.admissions.iter().map(|a| a.job).collect()
}

const H100: GpuModel = GpuModel::H100_80GB;

#[test]
fn a_large_queue_built_on_a_second_thread_gives_the_same_cycle_as_one_built_in_line() {
    // Above the threshold the queues are built on another thread; teams the snapshot does not
    // list (here `ghost`, queued and running, and `phantom`) still get their index in order of
    // first appearance, so every decision is the same as with the queues built in line.
    let nodes: Vec<NodeSnap> = (1..=40).map(|n| node(n, H100, 8, "a")).collect();
    let teams = vec![
        team("research", 1.0, None, &[]),
        team("product", 2.0, None, &[]),
    ];
    let names = ["research", "ghost", "product", "phantom"];
    let queue: Vec<QueuedJob> = (1..=5_000u128)
        .map(|i| {
            let gpu = match i % 4 {
                0 => whole(1),
                1 => whole(2),
                2 => share(300),
                _ => whole(8),
            };
            queued(i, names[(i % 4) as usize], gpu, 1, (i % 3) as i32)
        })
        .collect();
    let ghost = running(
        100_000,
        "ghost",
        whole(4),
        0,
        vec![(1, Assigned::Whole(vec![0, 1, 2, 3]))],
        1,
    );
    let snap = Snapshot {
        nodes,
        running: vec![ghost],
        queued: queue,
        teams,
    };
    assert!(snap.queued.len() >= super::cycle::PARALLEL_QUEUES);
    let cfg = SchedulerConfig::default();
    let threaded = schedule(&snap, &Tightest, &cfg, now());
    let in_line = super::cycle::schedule_with(&snap, &Tightest, &cfg, now(), false);
    assert!(!threaded.admissions.is_empty());
    assert_eq!(threaded, in_line);
}

#[test]
fn whole_gpu_jobs_get_that_many_idle_gpus_on_one_node() {
    let snap = Snapshot {
        nodes: vec![node(1, H100, 8, "a")],
        running: vec![running(
            9,
            "t",
            whole(3),
            0,
            vec![(1, Assigned::Whole(vec![0, 1, 2]))],
            1,
        )],
        queued: vec![
            queued(1, "t", whole(4), 1, 0),
            queued(2, "t", whole(2), 1, 0),
        ],
        ..Default::default()
    };
    let d = run(&snap);
    assert_eq!(admitted(&d), vec![jid(1)]);
    assert_eq!(
        d.admissions[0].placements[0].assigned,
        Assigned::Whole(vec![3, 4, 5, 6])
    );
    assert_eq!(d.unmet.len(), 1, "only one GPU is left for the 2-GPU job");
}

#[test]
fn shares_of_one_gpu_never_add_up_to_more_than_1000() {
    let snap = Snapshot {
        nodes: vec![node(1, GpuModel::T4, 1, "a")],
        queued: (0..4).map(|i| queued(i, "t", share(300), 1, 0)).collect(),
        ..Default::default()
    };
    let d = run(&snap);
    assert_eq!(d.admissions.len(), 3, "3 × 300 fit, the fourth does not");
    assert!(
        d.admissions
            .iter()
            .all(|a| a.placements[0].assigned == Assigned::Share { gpu: 0, milli: 300 })
    );
}

#[test]
fn mig_jobs_get_an_idle_instance_of_their_profile_class() {
    let mut n = node(1, H100, 1, "a");
    n.gpus[0] = GpuSnap::Mig(
        MigLayout::new(vec![
            MigInstance::new(MigClass::G3, 0),
            MigInstance::new(MigClass::G3, 4),
        ])
        .expect("layout"),
    );
    let snap = Snapshot {
        nodes: vec![n],
        running: vec![running(
            9,
            "t",
            mig("3g.40gb"),
            0,
            vec![(
                1,
                Assigned::Mig {
                    gpu: 0,
                    instance: MigInstance::new(MigClass::G3, 0),
                },
            )],
            1,
        )],
        queued: vec![
            queued(1, "t", mig("nvidia.com/mig-3g.40gb"), 1, 0),
            queued(2, "t", mig("3g.40gb"), 1, 0),
        ],
        ..Default::default()
    };
    let cfg = SchedulerConfig {
        dynamic_mig: false,
        ..Default::default()
    };
    let d = schedule(&snap, &Tightest, &cfg, now());
    assert_eq!(admitted(&d), vec![jid(1)]);
    assert_eq!(
        d.admissions[0].placements[0].assigned,
        Assigned::Mig {
            gpu: 0,
            instance: MigInstance::new(MigClass::G3, 4)
        }
    );
}

#[test]
fn a_gang_is_admitted_whole_or_not_at_all() {
    let two = Snapshot {
        nodes: vec![node(1, H100, 4, "a"), node(2, H100, 4, "a")],
        queued: vec![queued(1, "t", whole(4), 3, 0)],
        ..Default::default()
    };
    let d = run(&two);
    assert!(d.admissions.is_empty());
    assert_eq!(d.unmet[0].reason, WaitReason::NoCapacity);
    let mut three = two.clone();
    three.nodes.push(node(3, H100, 4, "a"));
    let d = run(&three);
    assert_eq!(d.admissions[0].placements.len(), 3);
}

#[test]
fn a_gang_that_fits_on_one_node_is_kept_on_one_node() {
    let snap = Snapshot {
        nodes: vec![
            node(1, H100, 2, "a"),
            node(2, H100, 8, "a"),
            node(3, H100, 2, "a"),
        ],
        queued: vec![queued(1, "t", whole(2), 3, 0)],
        ..Default::default()
    };
    let d = run(&snap);
    let nodes: Vec<NodeId> = d.admissions[0].placements.iter().map(|p| p.node).collect();
    assert_eq!(nodes, vec![nid(2); 3]);
}

#[test]
fn a_multi_node_gang_stays_in_one_zone() {
    let snap = Snapshot {
        nodes: vec![
            node(1, H100, 8, "a"),
            node(2, H100, 8, "b"),
            node(3, H100, 8, "b"),
        ],
        queued: vec![queued(1, "t", whole(8), 2, 0)],
        ..Default::default()
    };
    let d = run(&snap);
    let nodes: Vec<NodeId> = d.admissions[0].placements.iter().map(|p| p.node).collect();
    assert_eq!(nodes.len(), 2);
    assert!(
        nodes.iter().all(|n| *n == nid(2) || *n == nid(3)),
        "zone b holds both: {nodes:?}"
    );
}

#[test]
fn a_waiting_gang_holds_no_capacity() {
    let snap = Snapshot {
        nodes: vec![node(1, H100, 8, "a")],
        queued: vec![
            queued(1, "t", whole(4), 3, 10),
            queued(2, "t", whole(8), 1, 0),
        ],
        ..Default::default()
    };
    let d = run(&snap);
    assert_eq!(
        admitted(&d),
        vec![jid(2)],
        "the big gang waits and the next job gets the node"
    );
}

#[test]
fn cpu_and_memory_limit_placement() {
    let mut small = node(1, H100, 8, "a");
    small.cpu_milli = 4000;
    let mut job = queued(1, "t", whole(1), 1, 0);
    job.shape.cpu_milli = 8000;
    let d = run(&Snapshot {
        nodes: vec![small.clone()],
        queued: vec![job.clone()],
        ..Default::default()
    });
    assert!(d.admissions.is_empty());
    job.shape.cpu_milli = 1000;
    job.shape.memory_mib = 2 * 1024 * 1024;
    let d = run(&Snapshot {
        nodes: vec![small],
        queued: vec![job],
        ..Default::default()
    });
    assert!(d.admissions.is_empty());
}

#[test]
fn teams_take_turns_by_weighted_dominant_share() {
    let mut queue = Vec::new();
    for i in 0..40 {
        queue.push(queued(i, "light", whole(1), 1, 0));
        queue.push(queued(1000 + i, "heavy", whole(1), 1, 0));
    }
    let snap = Snapshot {
        nodes: (0..2).map(|n| node(n, H100, 8, "a")).collect(),
        queued: queue,
        teams: vec![team("light", 1.0, None, &[]), team("heavy", 3.0, None, &[])],
        ..Default::default()
    };
    let d = run(&snap);
    let heavy = d
        .admissions
        .iter()
        .filter(|a| a.job.0.as_u128() >= 1000)
        .count();
    assert_eq!(
        (d.admissions.len(), heavy),
        (16, 12),
        "weights 1:3 share 16 GPUs 4:12"
    );
}

#[test]
fn within_a_team_higher_priority_goes_first_then_fifo_and_requeued_jobs_lead_their_peers() {
    let mut requeued = queued(5, "t", whole(1), 1, 100);
    requeued.requeued = true;
    let snap = Snapshot {
        nodes: vec![node(1, H100, 3, "a")],
        queued: vec![
            queued(1, "t", whole(1), 1, 100),
            queued(2, "t", whole(1), 1, 500),
            queued(3, "t", whole(1), 1, 100),
            requeued,
        ],
        ..Default::default()
    };
    let d = run(&snap);
    assert_eq!(
        admitted(&d),
        vec![jid(2), jid(5), jid(1)],
        "500 first; then at 100 the requeued job, then FIFO"
    );
}

#[test]
fn a_team_over_its_quota_waits_for_quota_not_capacity() {
    let snap = Snapshot {
        nodes: vec![node(1, H100, 8, "a")],
        queued: vec![
            queued(1, "t", whole(2), 1, 0),
            queued(2, "t", whole(2), 1, 0),
        ],
        teams: vec![team("t", 1.0, None, &[(QuotaResource::Gpu(H100), 3, None)])],
        ..Default::default()
    };
    let d = run(&snap);
    assert_eq!(admitted(&d), vec![jid(1)]);
    assert_eq!(d.unmet[0].reason, WaitReason::Quota);
}

#[test]
fn a_team_borrows_idle_quota_from_its_cohort_within_its_borrowing_limit() {
    let h = QuotaResource::Gpu(H100);
    let snap = Snapshot {
        nodes: vec![node(1, H100, 8, "a")],
        queued: (0..5).map(|i| queued(i, "a", whole(1), 1, 0)).collect(),
        teams: vec![
            team("a", 1.0, Some("ml"), &[(h, 2, Some(2))]),
            team("b", 1.0, Some("ml"), &[(h, 6, None)]),
        ],
        ..Default::default()
    };
    let d = run(&snap);
    assert_eq!(d.admissions.len(), 4, "2 own + 2 borrowed");
    assert_eq!(d.unmet[0].reason, WaitReason::Quota);
}

#[test]
fn a_higher_priority_job_preempts_the_cheapest_lower_priority_job_of_its_team() {
    let snap = Snapshot {
        nodes: vec![node(1, H100, 2, "a")],
        running: vec![
            running(
                10,
                "t",
                whole(1),
                100,
                vec![(1, Assigned::Whole(vec![0]))],
                5,
            ),
            running(
                11,
                "t",
                whole(1),
                100,
                vec![(1, Assigned::Whole(vec![1]))],
                1,
            ),
        ],
        queued: vec![queued(1, "t", whole(1), 1, 1000)],
        ..Default::default()
    };
    let d = run(&snap);
    assert_eq!(
        d.preemptions,
        vec![Preemption {
            victim: jid(11),
            for_job: jid(1),
            reason: PreemptionReason::Priority
        }]
    );
    assert_eq!(d.unmet[0].reason, WaitReason::WaitingForPreemption);
    assert!(
        d.admissions.is_empty(),
        "the preemptor waits for its victim's checkpoint"
    );
}

#[test]
fn a_job_being_checkpointed_is_never_a_victim_and_its_capacity_is_waited_for() {
    let mut draining = running(
        11,
        "t",
        whole(1),
        100,
        vec![(1, Assigned::Whole(vec![1]))],
        0,
    );
    draining.draining = true;
    // The preemptor chose that victim last cycle and waits for it.
    let mut nominated = queued(1, "t", whole(1), 1, 1000);
    nominated.nominated = true;
    let snap = Snapshot {
        nodes: vec![node(1, H100, 2, "a")],
        running: vec![
            running(
                10,
                "t",
                whole(1),
                100,
                vec![(1, Assigned::Whole(vec![0]))],
                5,
            ),
            draining,
        ],
        queued: vec![nominated],
        ..Default::default()
    };
    let d = run(&snap);
    assert!(
        d.preemptions.is_empty(),
        "the draining job will free a GPU: no new victim"
    );
    assert_eq!(d.unmet[0].reason, WaitReason::WaitingForPreemption);
}

#[test]
fn only_the_victims_needed_are_preempted() {
    let snap = Snapshot {
        nodes: vec![node(1, H100, 4, "a")],
        running: (0..4)
            .map(|g| {
                running(
                    10 + g,
                    "t",
                    whole(1),
                    100,
                    vec![(1, Assigned::Whole(vec![g as u32]))],
                    g as i64,
                )
            })
            .collect(),
        queued: vec![queued(1, "t", whole(2), 1, 1000)],
        ..Default::default()
    };
    let d = run(&snap);
    let victims: Vec<JobId> = d.preemptions.iter().map(|p| p.victim).collect();
    assert_eq!(
        victims,
        vec![jid(10), jid(11)],
        "the two cheapest, and no more"
    );
}

#[test]
fn a_team_under_nominal_reclaims_capacity_borrowed_by_another_team() {
    let h = QuotaResource::Gpu(H100);
    let snap = Snapshot {
        nodes: vec![node(1, H100, 4, "a")],
        running: (0..4)
            .map(|g| {
                running(
                    10 + g,
                    "borrower",
                    whole(1),
                    100,
                    vec![(1, Assigned::Whole(vec![g as u32]))],
                    1,
                )
            })
            .collect(),
        queued: vec![queued(1, "owner", whole(2), 1, 0)],
        teams: vec![
            team("owner", 1.0, Some("ml"), &[(h, 2, None)]),
            team("borrower", 1.0, Some("ml"), &[(h, 2, None)]),
        ],
    };
    let d = run(&snap);
    assert_eq!(d.preemptions.len(), 2);
    assert!(
        d.preemptions
            .iter()
            .all(|p| p.reason == PreemptionReason::Reclaim)
    );
}

#[test]
fn no_team_preempts_another_without_reclaim() {
    let snap = Snapshot {
        nodes: vec![node(1, H100, 1, "a")],
        running: vec![running(
            10,
            "other",
            whole(1),
            0,
            vec![(1, Assigned::Whole(vec![0]))],
            1,
        )],
        queued: vec![queued(1, "t", whole(1), 1, 10_000)],
        ..Default::default()
    };
    let d = run(&snap);
    assert!(d.preemptions.is_empty());
    assert_eq!(d.unmet[0].reason, WaitReason::NoCapacity);
}

#[test]
fn an_idle_plain_gpu_is_re_laid_for_waiting_mig_demand() {
    let snap = Snapshot {
        nodes: vec![node(1, H100, 1, "a")],
        queued: vec![queued(1, "t", mig("3g.40gb"), 2, 0)],
        ..Default::default()
    };
    let d = run(&snap);
    assert_eq!(d.repartitions.len(), 1);
    let layout = d.repartitions[0].layout.clone().expect("MIG on");
    assert_eq!(
        layout
            .instances()
            .iter()
            .filter(|i| i.class == MigClass::G3)
            .count(),
        2
    );
    assert_eq!(d.unmet[0].reason, WaitReason::WaitingForRepartition);
}

#[test]
fn a_re_laid_gpu_is_filled_with_the_class_so_the_next_jobs_wait_for_it_too() {
    let snap = Snapshot {
        nodes: vec![node(1, H100, 2, "a")],
        queued: (1..=3)
            .map(|k| queued(k, "t", mig("1g.10gb"), 1, 0))
            .collect(),
        ..Default::default()
    };
    let d = run(&snap);
    assert_eq!(d.repartitions.len(), 1, "one GPU serves all three");
    let layout = d.repartitions[0].layout.clone().expect("MIG on");
    assert_eq!(
        layout.instances().len(),
        7,
        "an H100 holds seven 1g instances"
    );
    assert!(layout.instances().iter().all(|i| i.class == MigClass::G1));
    assert_eq!(d.unmet.len(), 3);
    assert!(
        d.unmet
            .iter()
            .all(|u| u.reason == WaitReason::WaitingForRepartition)
    );
}

#[test]
fn instances_in_use_are_never_destroyed_by_a_re_layout() {
    let busy = MigInstance::new(MigClass::G4, 0);
    let mut n = node(1, H100, 1, "a");
    n.gpus[0] = GpuSnap::Mig(
        MigLayout::new(vec![
            busy,
            MigInstance::new(MigClass::G1, 4),
            MigInstance::new(MigClass::G1, 5),
        ])
        .expect("layout"),
    );
    let snap = Snapshot {
        nodes: vec![n],
        running: vec![running(
            9,
            "t",
            mig("4g.40gb"),
            0,
            vec![(
                1,
                Assigned::Mig {
                    gpu: 0,
                    instance: busy,
                },
            )],
            1,
        )],
        queued: vec![queued(1, "t", mig("3g.40gb"), 1, 0)],
        ..Default::default()
    };
    let d = run(&snap);
    let layout = d.repartitions[0].layout.clone().expect("layout");
    assert!(layout.instances().contains(&busy));
    assert!(
        layout
            .instances()
            .contains(&MigInstance::new(MigClass::G3, 4))
    );
}

#[test]
fn idle_mig_gpus_go_back_to_whole_gpus_when_whole_gpu_demand_waits() {
    let mut n = node(1, H100, 2, "a");
    n.gpus[1] = GpuSnap::Mig(MigLayout::full());
    let snap = Snapshot {
        nodes: vec![n],
        queued: vec![queued(1, "t", whole(2), 1, 0)],
        ..Default::default()
    };
    let d = run(&snap);
    assert_eq!(
        d.repartitions,
        vec![Repartition {
            node: nid(1),
            gpu: 1,
            layout: None
        }]
    );
}

#[test]
fn jobs_go_only_to_the_clouds_regions_and_markets_they_allow() {
    let mut gcp = node(2, H100, 8, "b");
    gcp.cloud = Cloud::Gcp;
    gcp.market = Market::OnDemand;
    let mut job = queued(1, "t", whole(1), 1, 0);
    job.clouds = vec![Cloud::Gcp];
    let mut on_demand = queued(2, "t", whole(1), 1, 0);
    on_demand.spot = false;
    let mut region = queued(3, "t", whole(1), 1, 0);
    region.regions = vec!["eu-west-4".into()];
    let snap = Snapshot {
        nodes: vec![node(1, H100, 8, "a"), gcp],
        queued: vec![job, on_demand, region],
        ..Default::default()
    };
    let d = run(&snap);
    for a in &d.admissions {
        assert_eq!(a.placements[0].node, nid(2), "{:?}", a.job);
    }
    assert_eq!(d.admissions.len(), 2);
    assert_eq!(d.unmet[0].job, jid(3));
}

#[test]
fn unschedulable_nodes_get_nothing() {
    let mut n = node(1, H100, 8, "a");
    n.schedulable = false;
    let d = run(&Snapshot {
        nodes: vec![n],
        queued: vec![queued(1, "t", whole(1), 1, 0)],
        ..Default::default()
    });
    assert!(d.admissions.is_empty());
    assert_eq!(d.unmet[0].reason, WaitReason::NoCapacity);
}

#[test]
fn image_jobs_go_only_to_nodes_that_run_images() {
    let mut bare = node(1, H100, 8, "a");
    bare.runs_images = false;
    let engine = node(2, H100, 8, "a");
    let mut image = queued(1, "t", whole(1), 1, 0);
    image.image = true;
    let host = queued(2, "t", whole(1), 1, 0);

    // Only the node without an engine: the host job runs there, the image job waits.
    let d = run(&Snapshot {
        nodes: vec![bare.clone()],
        queued: vec![image.clone(), host.clone()],
        ..Default::default()
    });
    assert_eq!(d.admissions.len(), 1);
    assert_eq!(d.admissions[0].job, jid(2));
    assert_eq!(d.unmet.len(), 1);
    assert_eq!(d.unmet[0].job, jid(1));
    assert_eq!(d.unmet[0].reason, WaitReason::NoCapacity);

    // With a node that runs images as well, the image job goes there, whatever the order.
    for nodes in [vec![bare.clone(), engine.clone()], vec![engine, bare]] {
        let d = run(&Snapshot {
            nodes,
            queued: vec![image.clone(), host.clone()],
            ..Default::default()
        });
        assert_eq!(d.admissions.len(), 2, "{d:?}");
        let placed = d
            .admissions
            .iter()
            .find(|a| a.job == jid(1))
            .expect("image job placed");
        assert!(
            placed.placements.iter().all(|p| p.node == nid(2)),
            "{placed:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Invariants.

fn arb_shape() -> impl Strategy<Value = GpuShape> {
    prop_oneof![
        (0u32..=4).prop_map(whole),
        (1u32..=1000).prop_map(share),
        prop::sample::select(vec![
            "1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.20gb"
        ])
        .prop_map(mig),
    ]
}

fn arb_node(i: u128) -> impl Strategy<Value = NodeSnap> {
    (
        1usize..=8,
        prop::sample::select(vec!["a", "b"]),
        prop::bool::weighted(0.3),
        4u64..=96,
    )
        .prop_map(move |(g, zone, with_mig, cpus)| {
            let mut n = node(i, H100, g, zone);
            n.cpu_milli = cpus * 1000;
            n.memory_mib = cpus * 8 * 1024;
            if with_mig {
                n.gpus[0] = GpuSnap::Mig(
                    MigLayout::new(vec![
                        MigInstance::new(MigClass::G3, 0),
                        MigInstance::new(MigClass::G2, 4),
                        MigInstance::new(MigClass::G1, 6),
                    ])
                    .expect("layout"),
                );
            }
            n
        })
}

fn arb_job(i: u128) -> impl Strategy<Value = QueuedJob> {
    (
        arb_shape(),
        1u32..=4,
        0i32..3,
        prop::sample::select(vec!["x", "y", "z"]),
        500u32..=16_000,
    )
        .prop_map(move |(shape, replicas, prio, t, cpu)| {
            let mut j = queued(i, t, shape, replicas, prio * 100);
            j.shape.cpu_milli = cpu;
            j
        })
}

fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
    let nodes =
        (1usize..6).prop_flat_map(|n| (0..n).map(|i| arb_node(i as u128 + 1)).collect::<Vec<_>>());
    let jobs =
        (1usize..25).prop_flat_map(|n| (0..n).map(|i| arb_job(i as u128 + 1)).collect::<Vec<_>>());
    let quotas = (0u32..10, prop::option::of(0u32..4));
    (nodes, jobs, quotas).prop_map(|(nodes, queued, (nominal, borrow))| Snapshot {
        nodes,
        running: vec![],
        queued,
        teams: vec![
            team(
                "x",
                1.0,
                Some("c"),
                &[(QuotaResource::Gpu(H100), nominal, borrow)],
            ),
            team("y", 2.0, Some("c"), &[(QuotaResource::Gpu(H100), 4, None)]),
        ],
    })
}

/// Admits a first cycle's decisions as running jobs (some draining), for a second cycle.
fn as_running(snap: &Snapshot, d: &Decisions) -> Vec<RunningJob> {
    d.admissions
        .iter()
        .enumerate()
        .map(|(k, a)| {
            let q = snap.queued.iter().find(|q| q.id == a.job).expect("queued");
            RunningJob {
                id: q.id,
                team: q.team.clone(),
                priority: q.priority - 50,
                shape: q.shape.clone(),
                placements: a.placements.clone(),
                draining: k % 5 == 0,
                progress_since: now() - Duration::minutes(k as i64),
            }
        })
        .collect()
}

/// Checks what must hold of any cycle's outcome.
fn check(snap: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    let by_id: HashMap<NodeId, &NodeSnap> = snap.nodes.iter().map(|n| (n.id, n)).collect();
    let mut cpu: HashMap<NodeId, i64> = HashMap::new();
    let mut mem: HashMap<NodeId, i64> = HashMap::new();
    let mut milli: HashMap<(NodeId, u32), u32> = HashMap::new();
    let mut whole_used: HashMap<(NodeId, u32), u32> = HashMap::new();
    let mut mig_used: HashMap<(NodeId, u32, u8), u32> = HashMap::new();
    let relaid: HashMap<(NodeId, u32), Option<MigLayout>> = d
        .repartitions
        .iter()
        .map(|r| ((r.node, r.gpu), r.layout.clone()))
        .collect();
    let mut take = |shape: &ResourceShape, p: &Placement, new: bool| -> Result<(), TestCaseError> {
        *cpu.entry(p.node).or_insert(0) += i64::from(shape.cpu_milli);
        *mem.entry(p.node).or_insert(0) += shape.memory_mib as i64;
        let node = by_id[&p.node];
        match &p.assigned {
            Assigned::CpuOnly => {}
            Assigned::Whole(gs) => {
                for g in gs {
                    prop_assert!(matches!(node.gpus[*g as usize], GpuSnap::Plain));
                    *whole_used.entry((p.node, *g)).or_insert(0) += 1;
                }
            }
            Assigned::Share { gpu, milli: m } => {
                prop_assert!(matches!(node.gpus[*gpu as usize], GpuSnap::Plain));
                *milli.entry((p.node, *gpu)).or_insert(0) += m;
            }
            Assigned::Mig { gpu, instance } => {
                let GpuSnap::Mig(layout) = &node.gpus[*gpu as usize] else {
                    return Err(TestCaseError::fail("MIG placement on a plain GPU"));
                };
                prop_assert!(layout.instances().contains(instance), "instance exists");
                *mig_used.entry((p.node, *gpu, instance.start)).or_insert(0) += 1;
                if let (true, Some(layout)) = (new, relaid.get(&(p.node, *gpu))) {
                    let kept = layout
                        .as_ref()
                        .is_some_and(|l| l.instances().contains(instance));
                    prop_assert!(kept, "a re-layout keeps the instance just given out");
                }
            }
        }
        Ok(())
    };
    for r in &snap.running {
        for p in &r.placements {
            take(&r.shape, p, false)?;
        }
    }
    for a in &d.admissions {
        let q = snap
            .queued
            .iter()
            .find(|q| q.id == a.job)
            .expect("admitted job was queued");
        prop_assert_eq!(
            a.placements.len() as u32,
            q.replicas,
            "a gang is all or nothing"
        );
        let zones: Vec<&str> = a
            .placements
            .iter()
            .map(|p| by_id[&p.node].zone.as_str())
            .collect();
        prop_assert!(
            zones.windows(2).all(|w| w[0] == w[1]),
            "a gang stays in one zone"
        );
        for p in &a.placements {
            prop_assert!(by_id[&p.node].schedulable);
            take(&q.shape, p, true)?;
        }
    }
    for n in &snap.nodes {
        prop_assert!(
            cpu.get(&n.id).copied().unwrap_or(0) <= n.cpu_milli as i64,
            "CPU over-allocated"
        );
        prop_assert!(
            mem.get(&n.id).copied().unwrap_or(0) <= n.memory_mib as i64,
            "memory over-allocated"
        );
    }
    for ((n, g), m) in &milli {
        prop_assert!(*m <= 1000, "shares of a GPU exceed 1000");
        prop_assert!(
            !whole_used.contains_key(&(*n, *g)),
            "a whole GPU is also shared"
        );
    }
    prop_assert!(
        whole_used.values().all(|&c| c == 1),
        "a whole GPU given twice"
    );
    prop_assert!(
        mig_used.values().all(|&c| c == 1),
        "a MIG instance given twice"
    );
    // Re-layouts keep instances in use and are valid geometry.
    for r in &d.repartitions {
        if let GpuSnap::Mig(old) = &by_id[&r.node].gpus[r.gpu as usize] {
            for inst in old.instances() {
                if mig_used.contains_key(&(r.node, r.gpu, inst.start)) {
                    let kept = r
                        .layout
                        .as_ref()
                        .is_some_and(|l| l.instances().contains(inst));
                    prop_assert!(kept, "an instance in use was destroyed");
                }
            }
        }
    }
    // Preemptions: same team only when the victim has lower priority; never a draining job.
    for p in &d.preemptions {
        let v = snap
            .running
            .iter()
            .find(|r| r.id == p.victim)
            .expect("victim runs");
        let j = snap
            .queued
            .iter()
            .find(|q| q.id == p.for_job)
            .expect("preemptor queued");
        prop_assert!(!v.draining, "a draining job was chosen as a victim");
        match p.reason {
            PreemptionReason::Priority => {
                prop_assert_eq!(&v.team, &j.team);
                prop_assert!(v.priority < j.priority);
            }
            PreemptionReason::Reclaim => prop_assert_ne!(&v.team, &j.team),
        }
    }
    // A team never borrows more than the rest of its cohort has to lend (with nothing running
    // before the cycle, that is the others' nominal quotas).
    if snap.running.is_empty() {
        let h = QuotaResource::Gpu(H100);
        let nominal = |t: &TeamSnap| t.quotas.get(&h).map_or(0, |q| u64::from(q.nominal) * 1000);
        for t in snap
            .teams
            .iter()
            .filter(|t| t.cohort.is_some() && t.quotas.contains_key(&h))
        {
            let used: u64 = d
                .admissions
                .iter()
                .filter_map(|a| {
                    snap.queued
                        .iter()
                        .find(|q| q.id == a.job && q.team == t.name)
                        .map(|q| (a, q))
                })
                .map(|(a, q)| a.placements.len() as u64 * u64::from(q.shape.gpu.gpu_milli()))
                .sum();
            let others: u64 = snap
                .teams
                .iter()
                .filter(|o| o.name != t.name && o.cohort == t.cohort)
                .map(nominal)
                .sum();
            let borrowed = used.saturating_sub(nominal(t));
            prop_assert!(
                borrowed <= others,
                "team {} borrows {borrowed} of the {others} its cohort has",
                t.name
            );
        }
    }
    // Usage within nominal + borrowing limit for teams with a limit.
    for t in &snap.teams {
        for (res, q) in &t.quotas {
            let (QuotaResource::Gpu(_), Some(limit)) = (res, q.borrowing_limit) else {
                continue;
            };
            let used: u64 = snap
                .running
                .iter()
                .filter(|r| r.team == t.name)
                .map(|r| r.placements.len() as u64 * u64::from(r.shape.gpu.gpu_milli()))
                .chain(d.admissions.iter().map(|a| {
                    let q = snap.queued.iter().find(|q| q.id == a.job).expect("queued");
                    if q.team == t.name {
                        a.placements.len() as u64 * u64::from(q.shape.gpu.gpu_milli())
                    } else {
                        0
                    }
                }))
                .sum();
            let before: u64 = snap
                .running
                .iter()
                .filter(|r| r.team == t.name)
                .map(|r| r.placements.len() as u64 * u64::from(r.shape.gpu.gpu_milli()))
                .sum();
            let cap = u64::from(q.nominal + limit) * 1000;
            prop_assert!(
                used <= cap.max(before),
                "team {} uses {used} > {cap}",
                t.name
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn no_cycle_breaks_an_invariant(snap in arb_snapshot()) {
        let first = run(&snap);
        check(&snap, &first)?;
        // A second cycle on top of the first one's admissions, with new higher-priority work.
        let mut second = snap.clone();
        second.running = as_running(&snap, &first);
        second.queued = snap.queued.iter().map(|q| {
            let mut q = q.clone();
            q.id = JobId(uuid::Uuid::from_u128(q.id.0.as_u128() + 10_000));
            q.priority += 100;
            q
        }).collect();
        let d = run(&second);
        check(&second, &d)?;
    }

    #[test]
    fn the_same_snapshot_gives_the_same_decisions(snap in arb_snapshot()) {
        prop_assert_eq!(run(&snap), run(&snap));
    }
}

#[test]
fn unknown_nodes_in_placements_are_ignored() {
    let snap = Snapshot {
        nodes: vec![node(1, H100, 1, "a")],
        running: vec![running(
            9,
            "t",
            whole(1),
            0,
            vec![(77, Assigned::Whole(vec![0]))],
            1,
        )],
        queued: vec![queued(1, "t", whole(1), 1, 0)],
        teams: vec![],
    };
    assert_eq!(admitted(&run(&snap)), vec![jid(1)]);
}

#[test]
fn a_team_at_its_quota_makes_room_by_preempting_its_own_lower_priority_work() {
    let snap = Snapshot {
        nodes: vec![node(1, H100, 8, "a")],
        running: (0..2)
            .map(|g| {
                running(
                    10 + g,
                    "t",
                    whole(1),
                    100,
                    vec![(1, Assigned::Whole(vec![g as u32]))],
                    1,
                )
            })
            .collect(),
        queued: vec![queued(1, "t", whole(1), 1, 1000)],
        teams: vec![team("t", 1.0, None, &[(QuotaResource::Gpu(H100), 2, None)])],
    };
    let d = run(&snap);
    assert_eq!(d.preemptions.len(), 1, "{d:?}");
    assert_eq!(d.preemptions[0].reason, PreemptionReason::Priority);
    assert_eq!(d.unmet[0].reason, WaitReason::WaitingForPreemption);
}

#[test]
fn a_stopped_cycle_decides_nothing_more() {
    let snap = Snapshot {
        nodes: vec![node(1, H100, 8, "a")],
        queued: vec![queued(1, "t", whole(1), 1, 0)],
        ..Default::default()
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let cfg = SchedulerConfig {
        stop: Some(stop.clone()),
        ..SchedulerConfig::default()
    };
    assert!(
        schedule(&snap, &Tightest, &cfg, now())
            .admissions
            .is_empty()
    );
    stop.store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        admitted(&schedule(&snap, &Tightest, &cfg, now())),
        vec![jid(1)]
    );
}
