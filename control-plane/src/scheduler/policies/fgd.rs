//! FGD, fragmentation gradient descent (Weng et al., USENIX ATC '23; openb-protocol.md §6.6).
//!
//! Place the pod where it increases the node's fragmentation (with respect to the target
//! workload, [`frag`](crate::scheduler::frag)) the least. The simulator squashes the
//! fragmentation change through a sigmoid and truncates it to an integer in [0, 100], so
//! changes closer than ~40 milli-GPU tie and the node tie-break key decides; that is kept
//! here, because it is what the published figures measured. A share is tried on every device
//! that fits and goes to the first with the strictly best (integer) score.

use std::sync::Arc;

use crate::scheduler::frag::{GpuBuf, TypicalPods, node_frag};
use crate::scheduler::packing::{
    Choice, Devices, GPU_MILLI, PackNode, PackPod, PackingPolicy, Score, ScoreCtx,
};

use super::{best_devices, greedy_devices};

/// FGD as published.
#[derive(Debug, Clone)]
pub struct Fgd {
    typical: Arc<TypicalPods>,
}

impl Fgd {
    pub fn new(typical: Arc<TypicalPods>) -> Self {
        Fgd { typical }
    }
}

/// `int64(sigmoid((before − after)/1000) · 100)`: higher is better.
pub fn fgd_score(before: f64, after: f64) -> i64 {
    let x = (before - after) / 1000.0;
    (1.0 / (1.0 + (-x).exp()) * 100.0) as i64
}

/// The node's state after placing a non-share pod as FGD evaluates it: devices sorted by what
/// is left (stable), the first `num_gpu` that fit each lose `gpu_milli`.
pub fn after_non_share(gpus: &[u32], pod: &PackPod<'_>) -> GpuBuf {
    let mut buf = GpuBuf::from_slice(gpus);
    if pod.is_gpu() {
        let mut order: Vec<usize> = (0..gpus.len()).collect();
        order.sort_by_key(|&d| gpus[d]);
        let after = buf.as_mut_slice();
        let mut taken = 0;
        for d in order {
            if taken == pod.num_gpu {
                break;
            }
            if after[d] >= pod.gpu_milli {
                after[d] -= pod.gpu_milli;
                taken += 1;
            }
        }
    }
    buf
}

impl PackingPolicy for Fgd {
    fn name(&self) -> &'static str {
        "fgd"
    }

    fn score(&self, node: &PackNode<'_>, pod: &PackPod<'_>, _ctx: &ScoreCtx) -> Choice {
        let t = &self.typical;
        let before = node_frag(node.cpu_left, node.model, node.gpus, t);
        let cpu_after = node.cpu_left - pod.cpu;
        if pod.is_share() {
            let mut buf = GpuBuf::from_slice(node.gpus);
            let mut best: Option<(i64, u8)> = None;
            for (d, &left) in node.gpus.iter().enumerate() {
                if left < pod.gpu_milli {
                    continue;
                }
                buf.as_mut_slice()[d] = left - pod.gpu_milli;
                let after = node_frag(cpu_after, node.model, buf.as_slice(), t);
                buf.as_mut_slice()[d] = left;
                let s = fgd_score(before, after);
                if best.is_none_or(|(b, _)| s > b) {
                    best = Some((s, d as u8));
                }
            }
            let (s, d) = best.unwrap_or((0, 0));
            return Choice {
                score: Score::new(-s),
                devices: Devices::Share(d),
            };
        }
        let after = after_non_share(node.gpus, pod);
        let s = fgd_score(
            before,
            node_frag(cpu_after, node.model, after.as_slice(), t),
        );
        let devices = if pod.is_gpu() && pod.gpu_milli != GPU_MILLI {
            Devices::Whole(greedy_devices(node.gpus, pod.num_gpu, pod.gpu_milli))
        } else {
            best_devices(node, pod)
        };
        Choice {
            score: Score::new(-s),
            devices,
        }
    }
}
