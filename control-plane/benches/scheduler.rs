//! One scheduling cycle at scale (issue 3, benchmark 2).
//!
//! 10,000 nodes × 8 GPUs (H100s, some in MIG mode, A100-80GB and L4), queues of 1k to 100k
//! jobs of mixed shapes (whole GPUs, MIG slices, GPU shares, gangs up to 64) from 20 teams in
//! two cohorts, against an empty cluster, with the `spotplane` packing policy whose target
//! workload is the queue itself. The policy's typical shapes are computed once per snapshot,
//! outside the measured cycle, as the scheduling loop keeps them for a minute
//! (`reconcile::scheduling::TYPICAL_REFRESH`); their cost is printed with each snapshot.
//! Run: `cargo bench -p spotplane --bench scheduler`.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use chrono::{TimeZone, Utc};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

use spotplane::scheduler::policies::{Spotplane, typical_from_shapes};
use spotplane::scheduler::{
    GpuSnap, NodeSnap, QueuedJob, RunningJob, SchedulerConfig, Snapshot, TeamSnap, schedule,
};
use spotplane_core::mig::MigClass;
use spotplane_core::shape::{GpuShape, ResourceShape};
use spotplane_core::team::{Quota, QuotaResource};
use spotplane_core::{Cloud, GpuModel, JobId, Market, MigInstance, MigLayout, NodeId};

fn cluster(nodes: usize, jobs: usize, seed: u64) -> Snapshot {
    let mut rng = StdRng::seed_from_u64(seed);
    let zones = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"];
    let mig_layout = MigLayout::new(vec![
        MigInstance::new(MigClass::G3, 0),
        MigInstance::new(MigClass::G2, 4),
        MigInstance::new(MigClass::G1, 6),
    ])
    .expect("layout");
    let nodes: Vec<NodeSnap> = (0..nodes)
        .map(|i| {
            let model = match i % 10 {
                0..=5 => GpuModel::H100_80GB,
                6..=8 => GpuModel::A100_80GB,
                _ => GpuModel::L4,
            };
            let mut gpus = vec![GpuSnap::Plain; 8];
            if model == GpuModel::H100_80GB && i % 3 == 0 {
                gpus[6] = GpuSnap::Mig(mig_layout.clone());
                gpus[7] = GpuSnap::Mig(mig_layout.clone());
            }
            NodeSnap {
                id: NodeId(uuid::Uuid::from_u128(i as u128 + 1)),
                cloud: Cloud::Aws,
                region: "us-east-1".into(),
                zone: zones[i % zones.len()].into(),
                market: if i % 4 == 0 {
                    Market::OnDemand
                } else {
                    Market::Spot
                },
                schedulable: true,
                runs_images: true,
                cpu_milli: 192_000,
                memory_mib: 2 * 1024 * 1024,
                gpu_model: Some(model),
                gpus,
            }
        })
        .collect();
    let teams: Vec<TeamSnap> = (0..20)
        .map(|t| TeamSnap {
            name: format!("team-{t:02}").parse().expect("name"),
            weight: 1.0 + (t % 4) as f64,
            cohort: Some(if t < 10 { "research" } else { "product" }.into()),
            quotas: BTreeMap::from([
                (
                    QuotaResource::Gpu(GpuModel::H100_80GB),
                    Quota {
                        nominal: 2_000,
                        borrowing_limit: Some(2_000),
                        lending_limit: None,
                    },
                ),
                (
                    QuotaResource::Gpu(GpuModel::A100_80GB),
                    Quota {
                        nominal: 1_200,
                        borrowing_limit: None,
                        lending_limit: None,
                    },
                ),
                (
                    QuotaResource::Gpu(GpuModel::L4),
                    Quota {
                        nominal: 400,
                        borrowing_limit: None,
                        lending_limit: None,
                    },
                ),
            ]),
        })
        .collect();
    let profiles = ["1g.10gb", "2g.20gb", "3g.40gb"];
    let queued = (0..jobs)
        .map(|j| {
            let roll: u32 = rng.random_range(0..100);
            let (gpu, replicas) = match roll {
                0..=34 => (
                    GpuShape::Whole {
                        gpus: 1,
                        models: vec![],
                    },
                    1,
                ),
                35..=49 => (
                    GpuShape::Whole {
                        gpus: *[2u32, 4, 8].get(rng.random_range(0..3)).unwrap_or(&2),
                        models: vec![],
                    },
                    1,
                ),
                50..=69 => (
                    GpuShape::Shared {
                        gpu_milli: rng.random_range(1..20) * 50,
                        models: vec![],
                    },
                    1,
                ),
                70..=84 => (
                    GpuShape::Mig {
                        profile: profiles[rng.random_range(0..profiles.len())]
                            .parse()
                            .expect("profile"),
                        models: vec![],
                    },
                    1,
                ),
                _ => (
                    GpuShape::Whole {
                        gpus: 8,
                        models: vec![GpuModel::H100_80GB],
                    },
                    rng.random_range(2..=8u32) * 8,
                ),
            };
            QueuedJob {
                id: JobId(uuid::Uuid::from_u128(j as u128 + 1)),
                team: format!("team-{:02}", rng.random_range(0..20))
                    .parse()
                    .expect("name"),
                priority: [100, 500, 1000][rng.random_range(0..3)],
                requeued: false,
                nominated: false,
                replicas,
                shape: ResourceShape {
                    gpu,
                    cpu_milli: rng.random_range(1..=16) * 1000,
                    memory_mib: rng.random_range(1..=64) * 1024,
                },
                clouds: vec![],
                regions: vec![],
                spot: rng.random_bool(0.9),
                image: false,
            }
        })
        .collect();
    Snapshot {
        nodes,
        running: vec![],
        queued,
        teams,
    }
}

fn policy_for(snap: &Snapshot) -> Spotplane {
    Spotplane::new(Arc::new(typical_from_shapes(
        snap.queued.iter().map(|q| (&q.shape, q.replicas)).chain(
            snap.running
                .iter()
                .map(|r| (&r.shape, r.placements.len() as u32)),
        ),
    )))
}

/// The cluster after a first cycle filled it from an empty start, with `jobs` new jobs queued.
fn steady(nodes: usize, jobs: usize) -> Snapshot {
    let now = Utc
        .with_ymd_and_hms(2026, 11, 30, 12, 0, 0)
        .single()
        .expect("time");
    let first = cluster(nodes, 100_000, 11);
    let by_id: std::collections::HashMap<JobId, &QueuedJob> =
        first.queued.iter().map(|q| (q.id, q)).collect();
    let d = schedule(
        &first,
        &policy_for(&first),
        &SchedulerConfig::default(),
        now,
    );
    let running = d
        .admissions
        .iter()
        .filter_map(|a| {
            let q = by_id.get(&a.job)?;
            Some(RunningJob {
                id: q.id,
                team: q.team.clone(),
                priority: q.priority,
                shape: q.shape.clone(),
                placements: a.placements.clone(),
                draining: false,
                progress_since: now - chrono::Duration::minutes(30),
            })
        })
        .collect();
    let mut snap = cluster(nodes, jobs, 13);
    for q in &mut snap.queued {
        q.id = JobId(uuid::Uuid::from_u128(q.id.0.as_u128() + 1_000_000));
    }
    snap.running = running;
    snap
}

fn report(label: &str, snap: &Snapshot, cfg: &SchedulerConfig) {
    let now = Utc
        .with_ymd_and_hms(2026, 11, 30, 12, 0, 0)
        .single()
        .expect("time");
    let started = Instant::now();
    let policy = policy_for(snap);
    let typical = started.elapsed();
    let started = Instant::now();
    let d = schedule(snap, &policy, cfg, now);
    let took = started.elapsed();
    let replicas: usize = d.admissions.iter().map(|a| a.placements.len()).sum();
    eprintln!(
        "{label}: {} running, {} queued: {} jobs admitted ({replicas} replicas), {} waiting, {} preemptions, one cycle {:.1} ms, {:.0} admissions/s (typical shapes, once a minute: {:.1} ms)",
        snap.running.len(),
        snap.queued.len(),
        d.admissions.len(),
        d.unmet.len(),
        d.preemptions.len(),
        took.as_secs_f64() * 1e3,
        d.admissions.len() as f64 / took.as_secs_f64(),
        typical.as_secs_f64() * 1e3
    );
}

fn cycle(c: &mut Criterion) {
    let now = Utc
        .with_ymd_and_hms(2026, 11, 30, 12, 0, 0)
        .single()
        .expect("time");
    let cfg = SchedulerConfig::default();
    for (group_name, make) in [
        (
            "cold_start_10k_nodes",
            cluster as fn(usize, usize, u64) -> Snapshot,
        ),
        ("steady_state_10k_nodes", |n, j, _| steady(n, j)),
    ] {
        let mut group = c.benchmark_group(group_name);
        group.sample_size(10);
        for jobs in [1_000usize, 10_000, 100_000] {
            let snap = make(10_000, jobs, 7);
            report(group_name, &snap, &cfg);
            let policy = policy_for(&snap);
            group.bench_with_input(BenchmarkId::from_parameter(jobs), &snap, |b, snap| {
                b.iter(|| black_box(schedule(snap, &policy, &cfg, now)))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, cycle);
criterion_main!(benches);
