//! Packing: on which node, and on which of its GPUs, one replica should go.
//!
//! Every packing policy answers the same question through [`PackingPolicy::score`]: given one
//! node's state and one replica's request, where on that node would you put it and how good is
//! that? Scores are [`Score`] values, ordered so that *lower is better*; choosing a node is
//! taking the minimum of `(score, tiebreak)` over the feasible nodes ([`choose`]). Feasibility
//! (CPU, memory, model, GPU capacity) is checked once, by [`feasible`], not by each policy.
//!
//! This module knows plain GPUs only: whole GPUs and `gpu_milli` shares of one GPU, the setting
//! of the openb trace. MIG slices are placed by the scheduler's MIG step with the geometry of
//! `spotplane_core::mig`.

use spotplane_core::GpuModel;

/// One GPU in thousandths: 1000 is idle.
pub const GPU_MILLI: u32 = 1000;

/// A node as the packer sees it; borrowed from the scheduler's or the simulator's own state.
#[derive(Debug, Clone, Copy)]
pub struct PackNode<'a> {
    /// Milli-CPU not yet requested by replicas on the node.
    pub cpu_left: i64,
    /// Allocatable milli-CPU.
    pub cpu_cap: i64,
    /// MiB of memory not yet requested.
    pub mem_left: i64,
    /// The model of the node's GPUs (`None` on a CPU-only node).
    pub model: Option<GpuModel>,
    /// What is left of each plain GPU, in device index order (1000 = idle).
    pub gpus: &'a [u32],
    /// The run's fixed per-node priority for ties: the smaller wins.
    pub tiebreak: u32,
}

impl PackNode<'_> {
    /// Σ left over all GPUs.
    pub fn gpu_left_total(&self) -> u32 {
        self.gpus.iter().sum()
    }
}

/// One replica's request, as the packer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PackPod<'a> {
    pub cpu: i64,
    pub mem: i64,
    /// GPUs wanted: 0 for a CPU-only replica.
    pub num_gpu: u32,
    /// Per GPU, in thousandths: 1000 for whole GPUs, less for a share of one GPU.
    pub gpu_milli: u32,
    /// Allowed models; any when empty.
    pub models: &'a [GpuModel],
}

impl PackPod<'_> {
    pub fn is_share(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli > 0 && self.gpu_milli < GPU_MILLI
    }

    pub fn is_gpu(&self) -> bool {
        self.num_gpu > 0 && self.gpu_milli > 0
    }

    /// gpu_milli × num_gpu.
    pub fn total_milli(&self) -> u32 {
        self.gpu_milli * self.num_gpu
    }
}

/// Which GPUs of the node a replica gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    /// A CPU-only replica.
    None,
    /// Whole GPUs, by device index.
    Whole(Vec<u8>),
    /// A share of one GPU, by device index.
    Share(u8),
}

/// How good a placement is: lower is better. Policies fill `primary` with their main measure
/// and may use `secondary` to order ties; both are integers so comparisons are exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Score {
    pub primary: i64,
    pub secondary: i64,
}

impl Score {
    pub const fn new(primary: i64) -> Self {
        Score {
            primary,
            secondary: 0,
        }
    }
}

/// A policy's answer for one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub score: Score,
    pub devices: Devices,
}

/// What a policy may know besides the node and the pod: which decision this is, for policies
/// that draw random numbers (they must be reproducible from the seed and this sequence number).
#[derive(Debug, Clone, Copy, Default)]
pub struct ScoreCtx {
    pub seed: u64,
    /// Sequence number of the replica being placed in this run.
    pub seq: u64,
}

/// A packing policy. Implementations are pure: no I/O, no clock, no interior mutability.
pub trait PackingPolicy: Send + Sync {
    /// The name it is selected by (`random`, `best-fit`, `fgd`, `spotplane`).
    fn name(&self) -> &'static str;

    /// Where on `node` the policy would put `pod`, and how good that is. Called only for nodes
    /// [`feasible`] says can hold the pod.
    fn score(&self, node: &PackNode<'_>, pod: &PackPod<'_>, ctx: &ScoreCtx) -> Choice;

    /// Whether [`score`](Self::score) reads `ctx` (a randomized policy). When false, the
    /// answer is a function of the node's state and the pod alone, so a caller may cache it
    /// per (node version, pod shape) and recompute only the nodes that changed.
    fn uses_ctx(&self) -> bool {
        false
    }
}

/// Whether `node` can hold `pod` at all: CPU, memory, GPU model and GPU capacity (a share
/// needs one GPU with enough left; whole GPUs need that many idle GPUs).
pub fn feasible(node: &PackNode<'_>, pod: &PackPod<'_>) -> bool {
    if node.cpu_left < pod.cpu || node.mem_left < pod.mem {
        return false;
    }
    if !pod.is_gpu() {
        return true;
    }
    let Some(model) = node.model else {
        return false;
    };
    if node.gpus.is_empty() || (!pod.models.is_empty() && !pod.models.contains(&model)) {
        return false;
    }
    if pod.num_gpu == 1 {
        node.gpus.iter().any(|&left| left >= pod.gpu_milli)
    } else {
        // Walk devices in index order, taking each as often as its remainder covers the request
        // (only shares ≤ 500 can take a device twice; multi-GPU requests are whole GPUs).
        let mut taken = 0;
        for &left in node.gpus {
            let mut l = left;
            while l >= pod.gpu_milli && taken < pod.num_gpu {
                taken += 1;
                l -= pod.gpu_milli;
            }
        }
        taken >= pod.num_gpu
    }
}

/// The lowest-indexed idle GPUs, `n` of them (the device choice for whole-GPU requests).
pub fn lowest_idle(gpus: &[u32], n: u32) -> Option<Vec<u8>> {
    let picked: Vec<u8> = gpus
        .iter()
        .enumerate()
        .filter(|(_, l)| **l == GPU_MILLI)
        .take(n as usize)
        .map(|(i, _)| i as u8)
        .collect();
    (picked.len() == n as usize).then_some(picked)
}

/// The GPU with the least left that still fits a share; ties to the lowest index.
pub fn best_share(gpus: &[u32], milli: u32) -> Option<u8> {
    gpus.iter()
        .enumerate()
        .filter(|(_, l)| **l >= milli)
        .min_by_key(|(i, l)| (**l, *i))
        .map(|(i, _)| i as u8)
}

/// Scores every feasible node and returns the index (into `nodes`) and choice of the best:
/// the minimum of `(score, tiebreak)`. `None` when no node is feasible.
pub fn choose(
    policy: &dyn PackingPolicy,
    nodes: &[PackNode<'_>],
    pod: &PackPod<'_>,
    ctx: &ScoreCtx,
) -> Option<(usize, Choice)> {
    let mut best: Option<(usize, Choice)> = None;
    for (i, n) in nodes.iter().enumerate() {
        if !feasible(n, pod) {
            continue;
        }
        let c = policy.score(n, pod, ctx);
        let better = match &best {
            None => true,
            Some((j, b)) => (c.score, n.tiebreak) < (b.score, nodes[*j].tiebreak),
        };
        if better {
            best = Some((i, c));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(gpus: &[u32], cpu_left: i64) -> PackNode<'_> {
        PackNode {
            cpu_left,
            cpu_cap: 64_000,
            mem_left: 1 << 20,
            model: Some(GpuModel::T4),
            gpus,
            tiebreak: 0,
        }
    }

    fn pod(num_gpu: u32, gpu_milli: u32) -> PackPod<'static> {
        PackPod {
            cpu: 1000,
            mem: 1024,
            num_gpu,
            gpu_milli,
            models: &[],
        }
    }

    #[test]
    fn a_share_fits_where_one_gpu_has_enough_left() {
        assert!(feasible(&node(&[300, 600], 8000), &pod(1, 500)));
        assert!(!feasible(&node(&[300, 400], 8000), &pod(1, 500)));
    }

    #[test]
    fn whole_gpus_need_that_many_idle_gpus() {
        assert!(feasible(&node(&[1000, 1000, 0, 500], 8000), &pod(2, 1000)));
        assert!(!feasible(&node(&[1000, 900, 0, 500], 8000), &pod(2, 1000)));
    }

    #[test]
    fn cpu_memory_and_model_are_checked() {
        assert!(!feasible(&node(&[1000], 500), &pod(1, 1000)));
        let mut p = pod(1, 1000);
        p.models = &[GpuModel::V100_32GB];
        assert!(!feasible(&node(&[1000], 8000), &p));
        let cpu_only = pod(0, 0);
        let n = PackNode {
            model: None,
            gpus: &[],
            ..node(&[], 8000)
        };
        assert!(feasible(&n, &cpu_only));
    }

    #[test]
    fn device_helpers_pick_lowest_idle_and_tightest_share() {
        assert_eq!(lowest_idle(&[1000, 500, 1000, 1000], 2), Some(vec![0, 2]));
        assert_eq!(lowest_idle(&[1000, 500], 2), None);
        assert_eq!(best_share(&[1000, 600, 550, 550], 500), Some(2));
        assert_eq!(best_share(&[400], 500), None);
    }
}
