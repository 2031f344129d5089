use std::collections::{BTreeMap, HashMap};

use spotplane_core::{Cloud, GpuModel, JobId, Market, Micros, NodeId, NodeState};

use super::*;
use crate::model::Node;
use crate::scheduler::snapshot::{
    GpuSnap, NodeSnap, Placement, QueuedJob, RunningJob, Snapshot, WaitReason,
};

fn node(cloud: Cloud, market: Market, state: NodeState, price: &str, od: &str) -> Node {
    let now = chrono::Utc::now();
    Node {
        id: NodeId::from_uuid(uuid::Uuid::now_v7()),
        name: "n".into(),
        cloud,
        region: "r1".into(),
        zone: "r1a".into(),
        instance_type: "t".into(),
        market,
        state,
        state_reason: None,
        provider_instance_id: None,
        offer_id: None,
        hourly_price: Micros::parse_usd(price).expect("price"),
        on_demand_price: Micros::parse_usd(od).expect("price"),
        cpu_milli: 8000,
        memory_mib: 32_768,
        gpus: Vec::new(),
        labels: BTreeMap::new(),
        notice_deadline: None,
        created_at: now,
        ready_at: None,
        terminated_at: None,
    }
}

fn snap_node(id: NodeId, gpus: usize) -> NodeSnap {
    NodeSnap {
        id,
        cloud: Cloud::Aws,
        region: "r1".into(),
        zone: "r1a".into(),
        market: Market::Spot,
        schedulable: true,
        cpu_milli: 8000,
        memory_mib: 32_768,
        gpu_model: Some(GpuModel::H100_80GB),
        gpus: vec![GpuSnap::Plain; gpus],
        runs_images: false,
    }
}

fn one_gpu() -> spotplane_core::ResourceShape {
    spotplane_core::ResourceShape {
        gpu: spotplane_core::GpuShape::Whole {
            gpus: 1,
            models: Vec::new(),
        },
        cpu_milli: 1000,
        memory_mib: 1024,
    }
}

fn queued(team: &str, priority: i32) -> QueuedJob {
    QueuedJob {
        id: JobId(uuid::Uuid::now_v7()),
        team: team.parse().expect("team"),
        priority,
        requeued: false,
        nominated: false,
        replicas: 1,
        shape: one_gpu(),
        clouds: Vec::new(),
        regions: Vec::new(),
        spot: true,
        image: false,
    }
}

/// The encoded sample lines of `registry`.
fn samples(registry: &Registry) -> Vec<String> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("encoded");
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_fleet_queue_and_money_are_counted_by_their_labels() {
    let spot = node(Cloud::Aws, Market::Spot, NodeState::Ready, "1.5", "4");
    let od = node(Cloud::Gcp, Market::OnDemand, NodeState::Booting, "2", "2");
    // Requested: no instance yet, not billed.
    let asked = node(Cloud::Gcp, Market::OnDemand, NodeState::Requested, "2", "2");
    let (q1, q2, q3) = (queued("ml", 0), queued("ml", 0), queued("vision", 10));
    let snapshot = Snapshot {
        nodes: vec![snap_node(spot.id, 4)],
        running: vec![RunningJob {
            id: JobId(uuid::Uuid::now_v7()),
            team: "ml".parse().expect("team"),
            priority: 0,
            shape: one_gpu(),
            placements: vec![
                Placement {
                    replica: 0,
                    node: spot.id,
                    assigned: Assigned::Whole(vec![0, 1]),
                },
                Placement {
                    replica: 1,
                    node: spot.id,
                    assigned: Assigned::Share { gpu: 1, milli: 500 },
                },
            ],
            draining: false,
            progress_since: chrono::Utc::now(),
        }],
        queued: vec![q1.clone(), q2.clone(), q3.clone()],
        teams: Vec::new(),
    };
    let reasons = HashMap::from([
        (q1.id, Some(WaitReason::NoCapacity)),
        (q2.id, Some(WaitReason::NoCapacity)),
        (q3.id, None),
    ]);
    let nodes = [spot, od, asked];
    let now = chrono::Utc::now();
    let view = MetricsView {
        queued_since: HashMap::from([
            (q1.id, now - chrono::Duration::seconds(90)),
            (q2.id, now - chrono::Duration::seconds(30)),
        ]),
        ..MetricsView::default()
    };
    let (registry, summary) = fleet_registry(&FleetState {
        now,
        nodes: &nodes,
        snapshot: &snapshot,
        reasons: &reasons,
        view: &view,
        budgets: &[],
    });
    let got: Vec<String> = samples(&registry)
        .into_iter()
        // The families below have their own test.
        .filter(|l| {
            !l.starts_with("spotplane_team_")
                && !l.starts_with("spotplane_webhook_")
                && !l.starts_with("spotplane_ledger_")
        })
        .collect();
    assert_eq!(
        summary,
        FleetSummary {
            spend_usd_per_hour: 3.5,
            on_demand_usd_per_hour: 6.0,
            queued: 3,
            gpu_allocation_ratio: 0.5,
            sm_utilization_pct: None,
        }
    );
    let want = [
        r#"spotplane_nodes{cloud="aws",region="r1",market="spot",state="ready"} 1"#,
        r#"spotplane_nodes{cloud="gcp",region="r1",market="on-demand",state="booting"} 1"#,
        r#"spotplane_nodes{cloud="gcp",region="r1",market="on-demand",state="requested"} 1"#,
        r#"spotplane_spend_rate_usd_per_hour{cloud="aws",market="spot"} 1.5"#,
        r#"spotplane_spend_rate_usd_per_hour{cloud="gcp",market="on-demand"} 2.0"#,
        r#"spotplane_on_demand_equivalent_usd_per_hour{cloud="aws",market="spot"} 4.0"#,
        r#"spotplane_saving_rate_usd_per_hour{cloud="aws",market="spot"} 2.5"#,
        r#"spotplane_saving_rate_usd_per_hour{cloud="gcp",market="on-demand"} 0.0"#,
        r#"spotplane_gpus{cloud="aws",model="H100-80GB",state="allocated"} 2"#,
        r#"spotplane_gpus{cloud="aws",model="H100-80GB",state="idle"} 2"#,
        "spotplane_gpu_allocation_ratio 0.5",
        r#"spotplane_queued_jobs{team="ml",priority="0",reason="no_capacity"} 2"#,
        r#"spotplane_queued_jobs{team="vision",priority="10",reason="none"} 1"#,
        // The oldest wait of each queue: q1's 90 s; q3 has no time recorded.
        r#"spotplane_queue_oldest_wait_seconds{team="ml",priority="0",reason="no_capacity"} 90.0"#,
        r#"spotplane_queue_oldest_wait_seconds{team="vision",priority="10",reason="none"} 0.0"#,
    ];
    for w in want {
        assert!(
            got.iter().any(|l| l == w),
            "{w} not among\n{}",
            got.join("\n")
        );
    }
    // Nothing but these families, and no sample per job or node.
    assert_eq!(got.len(), want.len() + 1, "{}", got.join("\n"));
}

#[test]
fn teams_backlogs_mig_and_gpu_telemetry_with_the_jobs_holding_each_device() {
    use spotplane_core::agent::GpuTelemetry;
    use spotplane_core::mig::{MigClass, MigInstance, MigLayout};
    use spotplane_core::{Quota, QuotaResource};

    use crate::metrics::dcgm::Held;
    use crate::scheduler::snapshot::TeamSnap;
    use crate::store::{Holder, NodeTelemetry};

    let n = node(Cloud::Aws, Market::Spot, NodeState::Ready, "1", "3");
    let mut sn = snap_node(n.id, 2);
    let layout = MigLayout::new(vec![
        MigInstance::new(MigClass::G3, 0),
        MigInstance::new(MigClass::G3, 4),
    ])
    .expect("layout");
    sn.gpus[1] = GpuSnap::Mig(layout);
    let now = chrono::Utc::now();
    let job = JobId(uuid::Uuid::now_v7());
    let mig_job = JobId(uuid::Uuid::now_v7());
    let snapshot = Snapshot {
        nodes: vec![sn],
        running: vec![
            RunningJob {
                id: job,
                team: "ml".parse().expect("team"),
                priority: 0,
                shape: one_gpu(),
                placements: vec![Placement {
                    replica: 0,
                    node: n.id,
                    assigned: Assigned::Whole(vec![0]),
                }],
                draining: false,
                progress_since: now,
            },
            RunningJob {
                id: mig_job,
                team: "vision".parse().expect("team"),
                priority: 0,
                shape: spotplane_core::ResourceShape {
                    gpu: spotplane_core::GpuShape::Mig {
                        profile: "3g.40gb".parse().expect("profile"),
                        models: Vec::new(),
                    },
                    ..one_gpu()
                },
                placements: vec![Placement {
                    replica: 0,
                    node: n.id,
                    assigned: Assigned::Mig {
                        gpu: 1,
                        instance: MigInstance::new(MigClass::G3, 4),
                    },
                }],
                draining: false,
                progress_since: now,
            },
        ],
        queued: Vec::new(),
        teams: vec![TeamSnap {
            name: "ml".parse().expect("team"),
            weight: 1.0,
            cohort: Some("research".into()),
            quotas: BTreeMap::from([(
                QuotaResource::Gpu(GpuModel::H100_80GB),
                Quota {
                    nominal: 0,
                    borrowing_limit: None,
                    lending_limit: None,
                },
            )]),
        }],
    };
    let view = MetricsView {
        lost_gpu_seconds: HashMap::from([("ml".into(), 7200), ("vision".into(), 0)]),
        webhooks_pending: 3,
        oldest_pending_delivery: Some(now - chrono::Duration::seconds(42)),
        ledger_until: Some(now - chrono::Duration::seconds(600)),
        telemetry: vec![NodeTelemetry {
            node_id: n.id.to_string(),
            hostname: "ip-10-0-0-7".into(),
            model: Some(GpuModel::H100_80GB),
            inventory: Vec::new(),
            rows: vec![
                GpuTelemetry {
                    index: 0,
                    uuid: Some("GPU-a".into()),
                    utilization_pct: Some(80),
                    memory_used_mib: Some(60_000),
                    memory_total_mib: Some(81_559),
                    ..GpuTelemetry::default()
                },
                GpuTelemetry {
                    index: 1,
                    uuid: Some("GPU-b".into()),
                    mig_uuid: Some("MIG-x".into()),
                    mig_profile: Some("3g.40gb".into()),
                    gpu_instance_id: Some(2),
                    gr_engine_active: Some(0.4),
                    ..GpuTelemetry::default()
                },
            ],
            holders: vec![
                Holder {
                    job_id: job.to_string(),
                    job_name: "train".into(),
                    team: "ml".into(),
                    held: Held {
                        gpus: vec![0],
                        mig: None,
                    },
                },
                Holder {
                    job_id: mig_job.to_string(),
                    job_name: "infer".into(),
                    team: "vision".into(),
                    held: Held {
                        gpus: vec![1],
                        mig: Some(MigInstance::new(MigClass::G3, 4)),
                    },
                },
            ],
        }],
        ..MetricsView::default()
    };
    let budgets = [BudgetUse {
        team: "ml".into(),
        monthly: Micros::parse_usd("1000").expect("usd"),
        used: Micros::parse_usd("250").expect("usd"),
    }];
    let (registry, summary) = fleet_registry(&FleetState {
        now,
        nodes: std::slice::from_ref(&n),
        snapshot: &snapshot,
        reasons: &HashMap::new(),
        view: &view,
        budgets: &budgets,
    });
    let got = samples(&registry);
    let want = [
        r#"spotplane_mig_instances{cloud="aws",model="H100-80GB",profile="3g.40gb",state="allocated"} 1"#,
        r#"spotplane_mig_instances{cloud="aws",model="H100-80GB",profile="3g.40gb",state="idle"} 1"#,
        // One of two H100s' capacity (2000 milli-GPUs) is ml's: its dominant share 0.5.
        r#"spotplane_team_dominant_share{team="ml"} 0.5"#,
        r#"spotplane_team_quota_nominal{team="ml",flavour="H100-80GB"} 0.0"#,
        r#"spotplane_team_quota_used{team="ml",flavour="H100-80GB"} 1.0"#,
        r#"spotplane_team_quota_borrowed{team="ml",flavour="H100-80GB"} 1.0"#,
        r#"spotplane_team_budget_usd{team="ml"} 1000.0"#,
        r#"spotplane_team_budget_used_usd{team="ml"} 250.0"#,
        r#"spotplane_team_budget_used_ratio{team="ml"} 0.25"#,
        r#"spotplane_lost_gpu_seconds_total{team="ml"} 7200"#,
        r#"spotplane_lost_gpu_seconds_total{team="vision"} 0"#,
        "spotplane_webhook_deliveries_pending 3",
        "spotplane_webhook_delivery_lag_seconds 42.0",
        "spotplane_ledger_lag_seconds 600.0",
        // dcgm-exporter's names and labels, with the job holding each device.
        &format!(
            r#"DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="ip-10-0-0-7",job_id="{job}",job_name="train",team="ml"}} 80.0"#
        ),
        &format!(
            r#"DCGM_FI_DEV_FB_FREE{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="ip-10-0-0-7",job_id="{job}",job_name="train",team="ml"}} 21559.0"#
        ),
        &format!(
            r#"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="ip-10-0-0-7",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",job_id="{mig_job}",job_name="infer",team="vision"}} 0.4"#
        ),
    ];
    for w in want {
        assert!(
            got.iter().any(|l| l == w),
            "{w} not among\n{}",
            got.join("\n")
        );
    }
    // The mean SM utilisation of held devices: (80 + 40) / 2.
    assert_eq!(summary.sm_utilization_pct, Some(60.0));
}
