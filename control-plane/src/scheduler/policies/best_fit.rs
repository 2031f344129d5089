//! BestFit (openb-protocol.md §6.5): the node left with the least CPU and GPU after the
//! placement, both normalized (by 128 CPUs and 8 GPUs) and weighted equally, the score
//! truncated to an integer in [0, 100] as the simulator does (ties then go to the node
//! tie-break key).

use crate::scheduler::packing::{Choice, PackNode, PackPod, PackingPolicy, Score, ScoreCtx};

use super::best_devices;

/// The CPU and GPU normalizers of the simulator (MaxSpecCPU, MaxSpecGPU).
pub const MAX_SPEC_CPU: f64 = 128_000.0;
pub const MAX_SPEC_GPU: f64 = 8_000.0;

/// Tightest fit on CPU and GPU.
#[derive(Debug, Clone, Copy, Default)]
pub struct BestFit;

/// The simulator's integer score (higher is better), float operations in its order.
pub fn best_fit_score(node: &PackNode<'_>, pod: &PackPod<'_>) -> i64 {
    let gpu_left = i64::from(node.gpu_left_total());
    let req = i64::from(pod.total_milli());
    let mut s = 0.0;
    s += (node.cpu_left - pod.cpu) as f64 / MAX_SPEC_CPU * 0.5;
    s += (gpu_left - req) as f64 / MAX_SPEC_GPU * 0.5;
    ((1.0 - s) * 100.0) as i64
}

impl PackingPolicy for BestFit {
    fn name(&self) -> &'static str {
        "best-fit"
    }

    fn score(&self, node: &PackNode<'_>, pod: &PackPod<'_>, _ctx: &ScoreCtx) -> Choice {
        Choice {
            score: Score::new(-best_fit_score(node, pod)),
            devices: best_devices(node, pod),
        }
    }
}
