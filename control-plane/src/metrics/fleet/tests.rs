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
    let got = samples(&fleet_registry(&FleetState {
        nodes: &nodes,
        snapshot: &snapshot,
        reasons: &reasons,
    }));
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
