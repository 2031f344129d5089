//! The packing policies, all behind [`PackingPolicy`]: `random`, `best-fit`, `fgd` (the
//! published baselines of the openb experiment) and `spotplane` (ours).

use std::sync::Arc;

use super::frag::TypicalPods;
use super::packing::{
    Devices, GPU_MILLI, PackNode, PackPod, PackingPolicy, best_share, lowest_idle,
};

pub mod best_fit;
pub mod fgd;
pub mod random;
pub mod spotplane;

pub use best_fit::BestFit;
pub use fgd::Fgd;
pub use random::RandomPolicy;
pub use spotplane::Spotplane;

/// Every policy's name, in the order `all` runs them.
pub const NAMES: [&str; 4] = ["random", "best-fit", "fgd", "spotplane"];

/// The policy called `name`; `typical` is the target workload of the policies that measure
/// fragmentation. `None` for an unknown name.
pub fn by_name(name: &str, typical: Arc<TypicalPods>) -> Option<Box<dyn PackingPolicy>> {
    Some(match name {
        "random" => Box::new(RandomPolicy),
        "best-fit" => Box::new(BestFit),
        "fgd" => Box::new(Fgd::new(typical)),
        "spotplane" => Box::new(Spotplane::new(typical)),
        _ => return None,
    })
}

/// The simulator's default (`best`) device choice on a node that [`feasible`] accepted:
/// whole GPUs take the lowest-indexed idle devices, a share takes the device with the least
/// left that fits, a CPU-only pod takes none.
///
/// [`feasible`]: super::packing::feasible
pub fn best_devices(node: &PackNode<'_>, pod: &PackPod<'_>) -> Devices {
    if !pod.is_gpu() {
        Devices::None
    } else if pod.is_share() {
        Devices::Share(best_share(node.gpus, pod.gpu_milli).unwrap_or(0))
    } else if pod.gpu_milli == GPU_MILLI {
        Devices::Whole(lowest_idle(node.gpus, pod.num_gpu).unwrap_or_default())
    } else {
        Devices::Whole(greedy_devices(node.gpus, pod.num_gpu, pod.gpu_milli))
    }
}

/// Several shares of less than a GPU each (absent from openb): the feasibility walk's devices,
/// in index order, a device repeated while its remainder still covers the share.
pub fn greedy_devices(gpus: &[u32], num: u32, milli: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(num as usize);
    for (d, &left) in gpus.iter().enumerate() {
        let mut l = left;
        while l >= milli && (out.len() as u32) < num {
            out.push(d as u8);
            l -= milli;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use spotplane_core::GpuModel;

    use super::*;
    use crate::scheduler::frag::{ModelSet, TypicalPod};
    use crate::scheduler::packing::{Choice, ScoreCtx, feasible};

    const MODELS: [GpuModel; 3] = [GpuModel::T4, GpuModel::OpenbG2, GpuModel::V100_32GB];

    fn typical() -> Arc<TypicalPods> {
        let shape = |cpu, gpu_milli, num_gpu, models: &[GpuModel], freq| TypicalPod {
            cpu,
            gpu_milli,
            num_gpu,
            models: ModelSet::of(models),
            freq,
        };
        Arc::new(TypicalPods {
            pods: vec![
                shape(3152, 810, 1, &[], 0.3),
                shape(11_300, 1000, 1, &[], 0.3),
                shape(8000, 470, 1, &[GpuModel::T4], 0.2),
                shape(32_000, 1000, 8, &[], 0.1),
                shape(12_500, 0, 0, &[], 0.1),
            ],
        })
    }

    /// A node: GPU count and per-device left in tens of milli, CPU and memory left, model.
    fn node_state() -> impl Strategy<Value = (Vec<u32>, i64, i64, usize)> {
        (
            prop::collection::vec(
                prop_oneof![Just(1000u32), Just(0u32), (0u32..=100).prop_map(|x| x * 10)],
                0..=8,
            ),
            0i64..=128_000,
            0i64..=1 << 20,
            0usize..MODELS.len(),
        )
    }

    /// A pod: CPU, memory, and a GPU request (none, a share, or whole GPUs), models.
    fn pod_shape() -> impl Strategy<Value = (i64, i64, u32, u32, Vec<GpuModel>)> {
        (
            1i64..=40_000,
            0i64..=1 << 18,
            prop_oneof![
                Just((0u32, 0u32)),
                (1u32..=99).prop_map(|m| (1, m * 10)),
                prop::sample::select(vec![1u32, 2, 4, 8]).prop_map(|n| (n, 1000)),
            ],
            prop::sample::subsequence(MODELS.to_vec(), 0..=2),
        )
            .prop_map(|(cpu, mem, (n, m), models)| (cpu, mem, n, m, models))
    }

    /// The devices of a choice fit the pod: each device has the milli left, whole GPUs are
    /// distinct, a CPU-only pod gets none.
    fn devices_fit(node: &PackNode<'_>, pod: &PackPod<'_>, c: &Choice) -> Result<(), String> {
        let left = |d: u8| node.gpus.get(usize::from(d)).copied();
        match &c.devices {
            Devices::None if !pod.is_gpu() => Ok(()),
            Devices::Share(d) if pod.is_share() => match left(*d) {
                Some(l) if l >= pod.gpu_milli => Ok(()),
                other => Err(format!("share on device {d} with {other:?} left")),
            },
            Devices::Whole(ds) if pod.is_gpu() && !pod.is_share() => {
                let mut seen = ds.clone();
                seen.sort_unstable();
                seen.dedup();
                if seen.len() != ds.len() || ds.len() != pod.num_gpu as usize {
                    return Err(format!("whole GPUs {ds:?} for {} GPUs", pod.num_gpu));
                }
                match ds
                    .iter()
                    .find(|d| left(**d).is_none_or(|l| l < pod.gpu_milli))
                {
                    Some(d) => Err(format!("device {d} lacks {} milli", pod.gpu_milli)),
                    None => Ok(()),
                }
            }
            other => Err(format!("devices {other:?} for {pod:?}")),
        }
    }

    proptest! {
        #[test]
        fn every_policy_picks_devices_that_fit(
            (gpus, cpu_left, mem_left, m) in node_state(),
            (cpu, mem, num_gpu, gpu_milli, models) in pod_shape(),
            seq in 0u64..1000,
        ) {
            let node = PackNode {
                cpu_left,
                cpu_cap: 128_000,
                mem_left,
                model: (!gpus.is_empty()).then_some(MODELS[m]),
                gpus: &gpus,
                tiebreak: 7,
            };
            let pod = PackPod { cpu, mem, num_gpu, gpu_milli, models: &models };
            prop_assume!(feasible(&node, &pod));
            for name in NAMES {
                let policy = by_name(name, typical()).expect("known policy");
                let c = policy.score(&node, &pod, &ScoreCtx { seed: 42, seq });
                prop_assert!(devices_fit(&node, &pod, &c).is_ok(), "{name}: {:?}", devices_fit(&node, &pod, &c));
                prop_assert_eq!(&c, &policy.score(&node, &pod, &ScoreCtx { seed: 42, seq }), "{} is not reproducible", name);
            }
        }
    }

    #[test]
    fn unknown_policy_names_are_refused() {
        assert!(by_name("tetris", typical()).is_none());
        for name in NAMES {
            assert_eq!(by_name(name, typical()).map(|p| p.name()), Some(name));
        }
    }
}

/// The target workload of the live scheduler: the request shapes of `jobs` (queued and
/// running), weighted by replicas, the most frequent first, cut at 95% of replicas as the FGD
/// paper does. MIG replicas are left out (they do not use plain GPUs). Ties are broken by the
/// shape, so the result does not depend on the order of `jobs`.
pub fn typical_from_shapes<'a>(
    jobs: impl IntoIterator<Item = (&'a spotplane_core::shape::ResourceShape, u32)>,
) -> TypicalPods {
    use spotplane_core::shape::GpuShape;

    use super::frag::{ModelSet, TypicalPod};

    let mut counts: rustc_hash::FxHashMap<(i64, u32, u32, ModelSet), u64> = Default::default();
    let mut total = 0u64;
    for (shape, replicas) in jobs {
        let (num_gpu, gpu_milli, models) = match &shape.gpu {
            GpuShape::Whole { gpus, models } => {
                (*gpus, if *gpus == 0 { 0 } else { GPU_MILLI }, models)
            }
            GpuShape::Shared { gpu_milli, models } => (1, (*gpu_milli).min(GPU_MILLI), models),
            GpuShape::Mig { .. } => continue,
        };
        let key = (
            i64::from(shape.cpu_milli),
            gpu_milli,
            num_gpu,
            ModelSet::of(models),
        );
        *counts.entry(key).or_insert(0) += u64::from(replicas);
        total += u64::from(replicas);
    }
    if total == 0 {
        return TypicalPods::default();
    }
    let mut keys: Vec<_> = counts.into_iter().collect();
    keys.sort_by(|(ka, ca), (kb, cb)| {
        (cb, kb.0, kb.1, kb.2, kb.3).cmp(&(ca, ka.0, ka.1, ka.2, ka.3))
    });
    let wanted = 0.95 * total as f64;
    let mut cum = 0.0;
    let mut taken = 0;
    while taken < keys.len() && cum < wanted {
        cum += keys[taken].1 as f64;
        taken += 1;
    }
    keys.truncate(taken);
    TypicalPods {
        pods: keys
            .into_iter()
            .map(|((cpu, gpu_milli, num_gpu, models), count)| TypicalPod {
                cpu,
                gpu_milli,
                num_gpu,
                models,
                freq: count as f64 / cum,
            })
            .collect(),
    }
}

#[cfg(test)]
mod typical_tests {
    use spotplane_core::shape::{GpuShape, ResourceShape};

    use super::*;

    #[test]
    fn the_live_target_workload_weights_shapes_by_replicas_and_skips_mig() {
        let whole = ResourceShape {
            gpu: GpuShape::Whole {
                gpus: 1,
                models: vec![],
            },
            cpu_milli: 8000,
            memory_mib: 1,
        };
        let share = ResourceShape {
            gpu: GpuShape::Shared {
                gpu_milli: 500,
                models: vec![],
            },
            cpu_milli: 2000,
            memory_mib: 1,
        };
        let mig = ResourceShape {
            gpu: GpuShape::Mig {
                profile: "1g.10gb".parse().expect("p"),
                models: vec![],
            },
            cpu_milli: 1,
            memory_mib: 1,
        };
        let t = typical_from_shapes([(&whole, 3), (&share, 1), (&mig, 50)]);
        assert_eq!(t.pods.len(), 2);
        assert_eq!((t.pods[0].gpu_milli, t.pods[0].num_gpu), (1000, 1));
        assert!((t.pods[0].freq - 0.75).abs() < 1e-12);
        assert!(typical_from_shapes([(&mig, 1)]).pods.is_empty());
    }
}
