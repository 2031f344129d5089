//! GPU telemetry in dcgm-exporter's form, and which job each reading belongs to.
//!
//! The agents send NVML readings named after DCGM fields in their heartbeats; the control plane
//! keeps the last of each node's. It serves them here rather than each agent serving its own
//! `/metrics`: the control plane knows which job and team hold each device (an agent knows
//! only the replicas it runs, not their teams), nodes behind NAT need no scrape path, one
//! scrape target covers the fleet whatever it buys and releases, and the labels match what
//! the scheduler decided at the same moment. The price is freshness: a reading is as old as
//! the node's last heartbeat (seconds).
//!
//! Metric names and labels are dcgm-exporter's (`gpu`, `UUID`, `device`, `modelName`,
//! `Hostname`, and `GPU_I_PROFILE` / `GPU_I_ID` on a MIG device's series), so NVIDIA's
//! dcgm-exporter dashboard reads them unchanged. Devices a job holds carry `job_id`,
//! `job_name` and `team` as well (not `job`: Prometheus sets that on every series it scrapes).
//! A shared GPU has one series per job sharing it, each with the whole GPU's readings, as
//! dcgm-exporter does for pods sharing a GPU.

use spotplane_core::GpuModel;
use spotplane_core::agent::{GpuInfo, GpuTelemetry};
use spotplane_core::mig::{MigInstance, profile_name};

/// A device a replica holds, as its allocation says.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// Whole GPUs, a share's GPU, or a MIG instance's parent GPU.
    pub gpus: Vec<u32>,
    /// The MIG instance, for a MIG slice.
    pub mig: Option<MigInstance>,
}

/// Which of `held` each telemetry row belongs to (indices into `held`), row by row.
///
/// A GPU's own row goes to the replicas holding it whole or a share of it. A MIG device's row
/// goes to the replica holding that instance: found by the device's UUID in the agent's
/// inventory (which gives the instance's placement), else by profile when the GPU has one
/// device of that profile and one replica holds an instance of it there. A row that matches
/// nobody is an idle device (or one that cannot be told apart: it keeps no job labels).
pub fn attribute(
    rows: &[GpuTelemetry],
    inventory: &[GpuInfo],
    model: Option<GpuModel>,
    held: &[Held],
) -> Vec<Vec<usize>> {
    rows.iter()
        .map(|row| {
            let Some(mig_uuid) = &row.mig_uuid else {
                return held
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| h.mig.is_none() && h.gpus.contains(&row.index))
                    .map(|(i, _)| i)
                    .collect();
            };
            let on_gpu = |i: &usize| held[*i].gpus.first() == Some(&row.index);
            let device = inventory
                .iter()
                .find(|g| g.index == row.index)
                .and_then(|g| g.mig_devices.iter().find(|d| &d.uuid == mig_uuid));
            if let Some(d) = device {
                return (0..held.len())
                    .filter(on_gpu)
                    .filter(|i| held[*i].mig.is_some_and(|m| m.start == d.start))
                    .collect();
            }
            let Some(profile) = row.mig_profile.as_deref() else {
                return Vec::new();
            };
            // By profile only when that is unambiguous both ways: one device of the profile
            // on the GPU, and one replica holding an instance of it there.
            let devices = rows
                .iter()
                .filter(|r| {
                    r.index == row.index
                        && r.mig_uuid.is_some()
                        && r.mig_profile.as_deref() == Some(profile)
                })
                .count();
            let same: Vec<usize> = (0..held.len())
                .filter(on_gpu)
                .filter(|i| {
                    held[*i].mig.is_some_and(|m| {
                        model.and_then(|md| profile_name(md, m.class)) == Some(profile)
                    })
                })
                .collect();
            if devices == 1 && same.len() == 1 {
                same
            } else {
                Vec::new()
            }
        })
        .collect()
}

/// A row's SM utilisation in percent: `DCGM_FI_DEV_GPU_UTIL`, else the profiling field
/// `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (the one a MIG device has) as a percentage.
pub fn sm_pct(row: &GpuTelemetry) -> Option<f64> {
    row.utilization_pct
        .map(f64::from)
        .or(row.gr_engine_active.map(|a| a * 100.0))
}

/// One replica's reading from one heartbeat: mean SM utilisation over its devices (percent)
/// and the memory they use (MiB), from the rows `attribute` gave it. `None` when none of its
/// rows has a utilisation reading.
pub fn replica_reading(rows: &[&GpuTelemetry]) -> Option<(f64, u64)> {
    let sm: Vec<f64> = rows.iter().filter_map(|r| sm_pct(r)).collect();
    if sm.is_empty() {
        return None;
    }
    let mem = rows.iter().filter_map(|r| r.memory_used_mib).sum();
    Some((sm.iter().sum::<f64>() / sm.len() as f64, mem))
}

#[cfg(test)]
mod tests {
    use spotplane_core::agent::MigDeviceInfo;
    use spotplane_core::mig::MigClass;

    use super::*;

    fn gpu_row(index: u32, util: u8) -> GpuTelemetry {
        GpuTelemetry {
            index,
            utilization_pct: Some(util),
            memory_used_mib: Some(1000),
            ..GpuTelemetry::default()
        }
    }

    fn mig_row(index: u32, uuid: &str, profile: &str) -> GpuTelemetry {
        GpuTelemetry {
            index,
            mig_uuid: Some(uuid.into()),
            mig_profile: Some(profile.into()),
            gr_engine_active: Some(0.5),
            memory_used_mib: Some(500),
            ..GpuTelemetry::default()
        }
    }

    fn mig(class: MigClass, start: u8) -> Option<MigInstance> {
        Some(MigInstance::new(class, start))
    }

    #[test]
    fn rows_go_to_the_replicas_holding_their_devices() {
        let held = vec![
            Held {
                gpus: vec![0, 1],
                mig: None,
            },
            Held {
                gpus: vec![2],
                mig: None,
            },
            Held {
                gpus: vec![2],
                mig: None,
            },
            Held {
                gpus: vec![3],
                mig: mig(MigClass::G1, 0),
            },
            Held {
                gpus: vec![3],
                mig: mig(MigClass::G3, 4),
            },
        ];
        let inventory = vec![GpuInfo {
            index: 3,
            uuid: "GPU-3".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_mib: 81_559,
            mig_enabled: true,
            mig_devices: vec![MigDeviceInfo {
                uuid: "MIG-a".into(),
                profile: "3g.40gb".into(),
                start: 4,
                memory_mib: 40_000,
            }],
        }];
        let rows = vec![
            gpu_row(0, 90),
            gpu_row(1, 80),
            gpu_row(2, 50),
            gpu_row(4, 0),
            // Found in the inventory by UUID: the instance at start 4.
            mig_row(3, "MIG-a", "3g.40gb"),
            // Not in the inventory: by profile, the one 1g.10gb instance on GPU 3.
            mig_row(3, "MIG-b", "1g.10gb"),
            // A profile nobody holds there.
            mig_row(3, "MIG-c", "2g.20gb"),
        ];
        let got = attribute(&rows, &inventory, Some(GpuModel::H100_80GB), &held);
        assert_eq!(
            got,
            vec![
                vec![0],
                vec![0],
                vec![1, 2], // a shared GPU: each sharer
                vec![],     // idle
                vec![4],
                vec![3],
                vec![],
            ]
        );
    }

    #[test]
    fn a_profile_held_twice_on_a_gpu_without_inventory_is_not_guessed() {
        let held = vec![
            Held {
                gpus: vec![0],
                mig: mig(MigClass::G1, 0),
            },
            Held {
                gpus: vec![0],
                mig: mig(MigClass::G1, 1),
            },
        ];
        let rows = vec![mig_row(0, "MIG-x", "1g.10gb")];
        let got = attribute(&rows, &[], Some(GpuModel::H100_80GB), &held);
        assert_eq!(got, vec![Vec::<usize>::new()]);
        // One replica holds one of GPU 0's two 1g.10gb devices: which, cannot be told either.
        let held = vec![Held {
            gpus: vec![0],
            mig: mig(MigClass::G1, 0),
        }];
        let rows = vec![
            mig_row(0, "MIG-x", "1g.10gb"),
            mig_row(0, "MIG-y", "1g.10gb"),
        ];
        let got = attribute(&rows, &[], Some(GpuModel::H100_80GB), &held);
        assert_eq!(got, vec![Vec::<usize>::new(), Vec::new()]);
    }

    #[test]
    fn a_replica_reads_its_devices_mean_utilisation_and_total_memory() {
        let a = gpu_row(0, 90);
        let b = gpu_row(1, 70);
        assert_eq!(replica_reading(&[&a, &b]), Some((80.0, 2000)));
        let m = mig_row(0, "MIG-x", "1g.10gb");
        assert_eq!(replica_reading(&[&m]), Some((50.0, 500)));
        let blank = GpuTelemetry::default();
        assert_eq!(replica_reading(&[&blank]), None);
        assert_eq!(replica_reading(&[]), None);
    }
}
