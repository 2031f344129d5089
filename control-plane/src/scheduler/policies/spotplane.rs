//! spotplane's packing policy: fragmentation gradient descent that also sees the CPU.
//!
//! **Idea.** FGD places a replica where it raises the node's GPU fragmentation the least,
//! fragmentation being the idle GPU the *next* replica drawn from the target workload could
//! not use ([`frag`](crate::scheduler::frag)). That one-step view misses what CPU does over
//! many steps. A node whose CPU runs out keeps its idle GPUs forever, yet as long as it still
//! has CPU for one typical replica FGD sees nothing wrong: a CPU-only replica costs (almost)
//! nothing anywhere, so it lands on GPU-dense nodes as often as on CPU-rich ones, and so do
//! CPU-hungry GPU replicas. On the openb cluster, GPU-dense nodes (8 GPUs, 96 CPUs) and
//! CPU-rich ones (2 GPUs, 104 CPUs) sit side by side; at the end of FGD's seed-42 run about
//! 100,000 milli-GPU (1.6% of the cluster) are idle on nodes with less CPU left than any GPU
//! pod of the trace asks for, while the CPU-rich nodes keep a quarter of their CPU.
//!
//! **Cost of a node state.** spotplane adds to FGD's fragmentation the GPU that CPU
//! exhaustion will strand, in a fluid estimate: if the node keeps receiving replicas in the
//! target workload's proportions, each milli-GPU comes with `R` milli-CPU, where `R` is the
//! workload's CPU per milli-GPU (`Σ freq·cpu / Σ freq·gpu` over its GPU shapes); the CPU
//! left then feeds `cpu_left / R` milli-GPU and the rest of the idle GPU is stranded:
//!
//! `cost(n) = frag(n) + max(0, idle(n) − cpu_left(n) / R)`  (both in milli-GPU).
//!
//! A placement's score is the exact increase `cost(after) − cost(before)` in micro-GPU (an
//! integer: FGD's sigmoid and truncation to 0..100 are dropped), lower is better; ties go to
//! the node tie-break key. The second term steers CPU-only and CPU-hungry replicas to nodes
//! with CPU to spare and keeps CPU on GPU-dense nodes for the GPU replicas that need it.
//!
//! Everything comes from the node's own state and the target workload (the same inputs as
//! FGD); nothing about future arrivals. Without a target workload (no history yet) the policy
//! falls back to best fit. Measured on openb (docs/benchmarks.md): 95.9% of GPU allocated at
//! 130% arrived on `default` (FGD: 95.4%), and ahead of FGD on every shared variant.

use std::sync::Arc;

use crate::scheduler::frag::{GpuBuf, TypicalPods, node_frag};
use crate::scheduler::packing::{
    Choice, Devices, PackNode, PackPod, PackingPolicy, Score, ScoreCtx,
};

use super::best_devices;
use super::best_fit::best_fit_score;
use super::fgd::after_non_share;

/// FGD plus the GPU that CPU exhaustion will strand (module doc).
#[derive(Debug, Clone)]
pub struct Spotplane {
    typical: Arc<TypicalPods>,
    /// Milli-CPU the target workload requests per milli-GPU; `None` without GPU shapes.
    cpu_per_gpu: Option<f64>,
}

impl Spotplane {
    pub fn new(typical: Arc<TypicalPods>) -> Self {
        let (mut cpu, mut gpu) = (0.0, 0.0);
        for t in typical.pods.iter().filter(|t| t.gpu_milli > 0) {
            cpu += t.freq * t.cpu as f64;
            gpu += t.freq * f64::from(t.gpu_milli * t.num_gpu);
        }
        let cpu_per_gpu = (gpu > 0.0 && cpu > 0.0).then(|| cpu / gpu);
        Spotplane {
            typical,
            cpu_per_gpu,
        }
    }

    /// The node state's cost in milli-GPU: fragmentation plus GPU stranded by lack of CPU.
    pub fn cost(&self, node: &PackNode<'_>, cpu_left: i64, gpus: &[u32]) -> f64 {
        let frag = node_frag(cpu_left, node.model, gpus, &self.typical);
        let stranded = self.cpu_per_gpu.map_or(0.0, |r| {
            let idle = f64::from(gpus.iter().sum::<u32>());
            (idle - cpu_left.max(0) as f64 / r).max(0.0)
        });
        frag + stranded
    }
}

/// A cost difference in micro-GPU, as an exact integer for comparisons.
fn micro(delta: f64) -> i64 {
    (delta * 1000.0).round() as i64
}

impl PackingPolicy for Spotplane {
    fn name(&self) -> &'static str {
        "spotplane"
    }

    fn score(&self, node: &PackNode<'_>, pod: &PackPod<'_>, _ctx: &ScoreCtx) -> Choice {
        if self.typical.pods.is_empty() {
            return Choice {
                score: Score::new(-best_fit_score(node, pod)),
                devices: best_devices(node, pod),
            };
        }
        let before = self.cost(node, node.cpu_left, node.gpus);
        let cpu_after = node.cpu_left - pod.cpu;
        if pod.is_share() {
            // Every device that fits; the first with the least cost increase.
            let mut buf = GpuBuf::from_slice(node.gpus);
            let mut best: Option<(i64, u8)> = None;
            for (d, &left) in node.gpus.iter().enumerate() {
                if left < pod.gpu_milli {
                    continue;
                }
                buf.as_mut_slice()[d] = left - pod.gpu_milli;
                let inc = micro(self.cost(node, cpu_after, buf.as_slice()) - before);
                buf.as_mut_slice()[d] = left;
                if best.is_none_or(|(b, _)| inc < b) {
                    best = Some((inc, d as u8));
                }
            }
            let (inc, d) = best.unwrap_or((i64::MAX, 0));
            return Choice {
                score: Score::new(inc),
                devices: Devices::Share(d),
            };
        }
        let after = after_non_share(node.gpus, pod);
        Choice {
            score: Score::new(micro(self.cost(node, cpu_after, after.as_slice()) - before)),
            devices: best_devices(node, pod),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::frag::{ModelSet, TypicalPod};
    use spotplane_core::GpuModel;

    /// One GPU shape: 12 CPUs with a whole GPU, so R = 12 milli-CPU per milli-GPU.
    fn policy() -> Spotplane {
        Spotplane::new(Arc::new(TypicalPods {
            pods: vec![TypicalPod {
                cpu: 12_000,
                gpu_milli: 1000,
                num_gpu: 1,
                models: ModelSet::ANY,
                freq: 1.0,
            }],
        }))
    }

    fn node(cpu_left: i64, gpus: &[u32]) -> PackNode<'_> {
        PackNode {
            cpu_left,
            cpu_cap: cpu_left,
            mem_left: 1 << 30,
            model: Some(GpuModel::T4),
            gpus,
            tiebreak: 0,
        }
    }

    #[test]
    fn cpu_only_work_goes_where_cpu_is_spare() {
        let p = policy();
        let cpu_only = PackPod {
            cpu: 8000,
            mem: 1,
            num_gpu: 0,
            gpu_milli: 0,
            models: &[],
        };
        // 8 idle GPUs with 96 CPUs: exactly enough CPU for them; taking 8 CPUs strands
        // 8000/12 ≈ 667 milli-GPU. 2 idle GPUs with 104 CPUs: nothing stranded either way.
        let dense = p.score(&node(96_000, &[1000; 8]), &cpu_only, &ScoreCtx::default());
        let rich = p.score(&node(104_000, &[1000; 2]), &cpu_only, &ScoreCtx::default());
        assert_eq!(rich.score.primary, 0);
        assert_eq!(dense.score.primary, 666_667);
        assert!(rich.score < dense.score);
    }

    #[test]
    fn without_a_target_workload_it_fits_best() {
        let p = Spotplane::new(Arc::new(TypicalPods::default()));
        let pod = PackPod {
            cpu: 1000,
            mem: 1,
            num_gpu: 1,
            gpu_milli: 1000,
            models: &[],
        };
        let full = p.score(&node(8000, &[1000, 0]), &pod, &ScoreCtx::default());
        let empty = p.score(&node(8000, &[1000, 1000]), &pod, &ScoreCtx::default());
        assert!(full.score < empty.score);
        assert_eq!(full.devices, Devices::Whole(vec![0]));
    }
}
