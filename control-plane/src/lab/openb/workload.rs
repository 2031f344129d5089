//! The experiment's inputs built from a trace and a seed: arrival order and tuned clones
//! (openb-protocol.md §2), node tie-break keys (§2, §5) and typical pods (§7.1).

use std::collections::HashMap;

use super::gorand::GoRand;
use super::trace::{TraceNode, TracePod};
use crate::scheduler::frag::{ModelSet, TypicalPod, TypicalPods};

/// Nodes in name order with their per-run tie-break keys, and pods in arrival order.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Nodes sorted by name.
    pub nodes: Vec<TraceNode>,
    /// `tiebreak[i]` is node i's key: the smaller wins a tie (the `%04d-` name prefix).
    pub tiebreak: Vec<u32>,
    /// Shuffled originals, then tuned clones in draw order (or originals with some removed).
    pub pods: Vec<TracePod>,
}

/// Σ GPUs × 1000 over the nodes.
pub fn gpu_capacity_milli(nodes: &[TraceNode]) -> i64 {
    nodes.iter().map(|n| i64::from(n.gpus) * 1000).sum()
}

/// Builds the workload for one tune seed, drawing from Go's generator in exactly the
/// simulator's order (§2): one discarded draw, the shuffle, the tuning draws, ten informer
/// draws, then the node permutation. `inflate` is the tune ratio (1.3 in the paper).
pub fn build(nodes: &[TraceNode], pods: &[TracePod], seed: i64, inflate: f64) -> Workload {
    let mut rng = GoRand::new(seed);
    rng.int63();

    let mut orig: Vec<TracePod> = pods.to_vec();
    orig.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    let mut arrival = orig.clone();
    rng.shuffle(&mut arrival);

    let mut total: i64 = orig.iter().map(TracePod::total_milli).sum();
    let target = inflate * gpu_capacity_milli(nodes) as f64;
    if (total as f64) < target && !orig.is_empty() {
        let mut i = 0usize;
        loop {
            let p = &orig[rng.intn(orig.len())];
            // The simulator tests the per-GPU milli, not the total: kept as published.
            if (total + i64::from(p.gpu_milli)) as f64 > target {
                break;
            }
            total += p.total_milli();
            let mut clone = p.clone();
            clone.name = format!("{}-tuned-{i}", p.name);
            arrival.push(clone);
            i += 1;
        }
    } else if (total as f64) > target {
        while (total as f64) > target && !arrival.is_empty() {
            let k = rng.intn(arrival.len());
            total -= arrival[k].total_milli();
            arrival.remove(k);
        }
    }

    // Ten reflectors each draw one Float64 for their watch timeout (calibrated, §11.1).
    for _ in 0..10 {
        rng.float64();
    }
    let mut sorted_nodes = nodes.to_vec();
    sorted_nodes.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    let tiebreak = rng
        .perm(sorted_nodes.len())
        .into_iter()
        .map(|p| p as u32)
        .collect();
    Workload {
        nodes: sorted_nodes,
        tiebreak,
        pods: arrival,
    }
}

/// One typical pod with the key it was counted under.
#[derive(Debug, Clone, PartialEq)]
pub struct TypicalShape {
    pub cpu: i64,
    pub gpu_milli: u32,
    pub num_gpu: u32,
    pub spec: String,
    pub count: u64,
    pub freq: f64,
    pub models: ModelSet,
}

/// The typical pods of a trace (§7.1): shapes keyed by (cpu, gpu_milli, num_gpu, spec), most
/// frequent first, cut at 95% of the pods, frequencies renormalized in Go's float order.
pub fn typical_shapes(pods: &[TracePod]) -> Vec<TypicalShape> {
    let mut counts: HashMap<(i64, u32, u32, &str), (u64, ModelSet)> = HashMap::new();
    for p in pods {
        counts
            .entry((p.cpu, p.gpu_milli, p.num_gpu, p.spec.as_str()))
            .or_insert((0, ModelSet::of(&p.models)))
            .0 += 1;
    }
    let mut keys: Vec<_> = counts.into_iter().collect();
    // Descending on (count, cpu, gpu_milli, num_gpu, spec).
    keys.sort_by(|(ka, (ca, _)), (kb, (cb, _))| {
        (cb, kb.0, kb.1, kb.2, kb.3.as_bytes()).cmp(&(ca, ka.0, ka.1, ka.2, ka.3.as_bytes()))
    });
    let total = pods.len() as f64;
    let expected = 95.0 * total / 100.0;
    let mut taken = 0;
    let mut cum = 0.0f64;
    while taken < keys.len() && cum < expected {
        cum += keys[taken].1.0 as f64;
        taken += 1;
    }
    let all = taken == keys.len();
    keys.truncate(taken);
    keys.into_iter()
        .map(|((cpu, gpu_milli, num_gpu, spec), (count, models))| {
            let share = count as f64 / total;
            TypicalShape {
                cpu,
                gpu_milli,
                num_gpu,
                spec: spec.to_owned(),
                count,
                freq: if all { share } else { share / (cum / total) },
                models,
            }
        })
        .collect()
}

/// [`typical_shapes`] as the fragmentation measure's target workload.
pub fn typical_pods(pods: &[TracePod]) -> TypicalPods {
    TypicalPods {
        pods: typical_shapes(pods)
            .into_iter()
            .map(|s| TypicalPod {
                cpu: s.cpu,
                gpu_milli: s.gpu_milli,
                num_gpu: s.num_gpu,
                models: s.models,
                freq: s.freq,
            })
            .collect(),
    }
}
