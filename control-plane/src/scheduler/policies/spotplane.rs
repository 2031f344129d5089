//! spotplane's packing policy (work in progress: exact FGD for now).

use std::sync::Arc;

use crate::scheduler::frag::{GpuBuf, TypicalPods, node_frag};
use crate::scheduler::packing::{
    Choice, Devices, PackNode, PackPod, PackingPolicy, Score, ScoreCtx,
};

use super::best_devices;
use super::fgd::after_non_share;

/// spotplane's policy.
#[derive(Debug, Clone)]
pub struct Spotplane {
    typical: Arc<TypicalPods>,
}

impl Spotplane {
    pub fn new(typical: Arc<TypicalPods>) -> Self {
        Spotplane { typical }
    }
}

/// Fragmentation in micro-GPU, as an exact integer for comparisons.
fn micro(x: f64) -> i64 {
    (x * 1000.0).round() as i64
}

impl PackingPolicy for Spotplane {
    fn name(&self) -> &'static str {
        "spotplane"
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
                let inc = micro(after - before);
                if best.is_none_or(|(b, _)| inc < b) {
                    best = Some((inc, d as u8));
                }
            }
            let (inc, d) = best.unwrap_or((0, 0));
            return Choice {
                score: Score {
                    primary: inc,
                    secondary: i64::from(node.gpu_left_total()),
                },
                devices: Devices::Share(d),
            };
        }
        let after = after_non_share(node.gpus, pod);
        let inc = micro(node_frag(cpu_after, node.model, after.as_slice(), t) - before);
        Choice {
            score: Score {
                primary: inc,
                secondary: i64::from(node.gpu_left_total()),
            },
            devices: best_devices(node, pod),
        }
    }
}
