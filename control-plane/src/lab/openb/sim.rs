//! The simulation loop (openb-protocol.md §3): pods arrive one at a time, each is placed on the
//! best feasible node by the policy or dropped for good; no departures.
//!
//! Speed: a run scores ~10,800 pods against 1,213 nodes. Deterministic policies' scores depend
//! only on the node's state and the pod's shape ([`PackingPolicy::uses_ctx`]), and each event
//! changes one node, so each node's [`Choice`] is cached per pod shape with the node's version
//! and recomputed only when the node changed since. Feasibility (CPU, memory, GPUs) is
//! rechecked for every node and pod; it is cheap.

use std::collections::HashMap;

use spotplane_core::GpuModel;

use super::report::Event;
use super::workload::Workload;
use crate::scheduler::packing::{
    Choice, Devices, PackNode, PackPod, PackingPolicy, ScoreCtx, feasible,
};

/// What one run produced.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// One per pod, failed pods included.
    pub events: Vec<Event>,
    /// Where each pod went (index into the workload's nodes), in arrival order.
    pub placed: Vec<Option<usize>>,
    /// Pods no node could take, by index into the workload's arrival order.
    pub failed: Vec<usize>,
    /// GPUs in the cluster.
    pub total_gpus: i64,
    /// Each node's state after the last pod, in the workload's node order.
    pub nodes: Vec<NodeState>,
}

/// A node's resources left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub cpu_left: i64,
    pub mem_left: i64,
    /// Milli-GPU left per device.
    pub gpus: Vec<u32>,
}

/// The cluster's mutable state, flat.
struct Cluster {
    cpu_left: Vec<i64>,
    cpu_cap: Vec<i64>,
    mem_left: Vec<i64>,
    model: Vec<Option<GpuModel>>,
    /// Node i's devices are `gpus[off[i]..off[i + 1]]`.
    off: Vec<usize>,
    gpus: Vec<u32>,
    tiebreak: Vec<u32>,
    /// Bumped on every change of the node.
    version: Vec<u32>,
}

impl Cluster {
    fn view(&self, i: usize) -> PackNode<'_> {
        PackNode {
            cpu_left: self.cpu_left[i],
            cpu_cap: self.cpu_cap[i],
            mem_left: self.mem_left[i],
            model: self.model[i],
            gpus: &self.gpus[self.off[i]..self.off[i + 1]],
            tiebreak: self.tiebreak[i],
        }
    }

    /// Binds the pod to node i on `devices`; returns the milli-GPU allocated.
    fn commit(&mut self, i: usize, pod: &PackPod<'_>, devices: &Devices) -> i64 {
        self.cpu_left[i] -= pod.cpu;
        self.mem_left[i] -= pod.mem;
        self.version[i] = self.version[i].wrapping_add(1);
        let gpus = &mut self.gpus[self.off[i]..self.off[i + 1]];
        let mut take = |d: u8| {
            let left = &mut gpus[usize::from(d)];
            debug_assert!(
                *left >= pod.gpu_milli,
                "a policy chose a device that is full"
            );
            *left -= pod.gpu_milli.min(*left);
        };
        match devices {
            Devices::None => 0,
            Devices::Share(d) => {
                take(*d);
                i64::from(pod.gpu_milli)
            }
            Devices::Whole(ds) => {
                for d in ds {
                    take(*d);
                }
                i64::from(pod.gpu_milli) * ds.len() as i64
            }
        }
    }
}

/// Runs the workload through `policy`. `seed` reaches randomized policies via [`ScoreCtx`].
pub fn simulate(workload: &Workload, policy: &dyn PackingPolicy, seed: u64) -> RunOutcome {
    let n = workload.nodes.len();
    let mut off = Vec::with_capacity(n + 1);
    off.push(0);
    for node in &workload.nodes {
        off.push(off[off.len() - 1] + node.gpus as usize);
    }
    let mut c = Cluster {
        cpu_left: workload.nodes.iter().map(|x| x.cpu).collect(),
        cpu_cap: workload.nodes.iter().map(|x| x.cpu).collect(),
        mem_left: workload.nodes.iter().map(|x| x.mem).collect(),
        model: workload.nodes.iter().map(|x| x.model).collect(),
        gpus: vec![1000; off[n]],
        off,
        tiebreak: workload.tiebreak.clone(),
        version: vec![0; n],
    };
    let total_gpus = workload.nodes.iter().map(|x| i64::from(x.gpus)).sum();

    // Pod shapes: everything a score may read from a pod.
    let mut shape_ids: HashMap<(i64, i64, u32, u32, &[GpuModel]), usize> = HashMap::new();
    let pod_shape: Vec<usize> = workload
        .pods
        .iter()
        .map(|p| {
            let next = shape_ids.len();
            *shape_ids
                .entry((p.cpu, p.mem, p.num_gpu, p.gpu_milli, p.models.as_slice()))
                .or_insert(next)
        })
        .collect();
    let shapes = shape_ids.len();
    let cacheable = !policy.uses_ctx();
    let mut cache: Vec<Option<(u32, Choice)>> = if cacheable {
        vec![None; n * shapes]
    } else {
        Vec::new()
    };

    let mut events = Vec::with_capacity(workload.pods.len());
    let mut arrived = 0i64;
    let mut used = 0i64;
    let mut failed = Vec::new();
    let mut placed = Vec::with_capacity(workload.pods.len());
    for (seq, (p, &shape)) in workload.pods.iter().zip(&pod_shape).enumerate() {
        arrived += p.total_milli();
        let pod = PackPod {
            cpu: p.cpu,
            mem: p.mem,
            num_gpu: p.num_gpu,
            gpu_milli: p.gpu_milli,
            models: &p.models,
        };
        let ctx = ScoreCtx {
            seed,
            seq: seq as u64,
        };
        let mut best: Option<(crate::scheduler::packing::Score, u32, usize)> = None;
        for i in 0..n {
            let node = c.view(i);
            if !feasible(&node, &pod) {
                continue;
            }
            let score = if cacheable {
                let slot = &mut cache[i * shapes + shape];
                match slot {
                    Some((v, ch)) if *v == c.version[i] => ch.score,
                    _ => {
                        let ch = policy.score(&node, &pod, &ctx);
                        let s = ch.score;
                        *slot = Some((c.version[i], ch));
                        s
                    }
                }
            } else {
                policy.score(&node, &pod, &ctx).score
            };
            let key = (score, node.tiebreak, i);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
        match best {
            None => {
                failed.push(seq);
                placed.push(None);
            }
            Some((_, _, i)) => {
                let devices = match cacheable.then(|| cache[i * shapes + shape].take()) {
                    Some(Some((_, ch))) => ch.devices,
                    _ => policy.score(&c.view(i), &pod, &ctx).devices,
                };
                used += c.commit(i, &pod, &devices);
                placed.push(Some(i));
            }
        }
        events.push(Event { arrived, used });
    }
    let nodes = (0..n)
        .map(|i| NodeState {
            cpu_left: c.cpu_left[i],
            mem_left: c.mem_left[i],
            gpus: c.gpus[c.off[i]..c.off[i + 1]].to_vec(),
        })
        .collect();
    RunOutcome {
        events,
        placed,
        failed,
        total_gpus,
        nodes,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::lab::openb::trace::{TraceNode, TracePod};
    use crate::scheduler::frag::{ModelSet, TypicalPod, TypicalPods};
    use crate::scheduler::policies::{BestFit, Fgd};

    fn node(name: &str, cpu: i64, gpus: u32) -> TraceNode {
        TraceNode {
            name: name.into(),
            cpu,
            mem: 1 << 20,
            gpus,
            model: Some(GpuModel::T4),
        }
    }

    fn pod(cpu: i64, num_gpu: u32, gpu_milli: u32) -> TracePod {
        TracePod {
            name: String::new(),
            cpu,
            mem: 1024,
            num_gpu,
            gpu_milli,
            spec: String::new(),
            models: Vec::new(),
        }
    }

    /// n0: 16 CPUs, 2 GPUs, tie-break key 1; n1: 8 CPUs, 1 GPU, key 0. Pods in order:
    /// p0 (4 CPU, 0.5 GPU), p1 (4 CPU, 1 GPU), p2 (6 CPU, 0.6 GPU), p3 (2 CPU, no GPU),
    /// p4 (4 CPU, 0.5 GPU).
    fn sample() -> Workload {
        Workload {
            nodes: vec![node("n0", 16_000, 2), node("n1", 8000, 1)],
            tiebreak: vec![1, 0],
            pods: vec![
                pod(4000, 1, 500),
                pod(4000, 1, 1000),
                pod(6000, 1, 600),
                pod(2000, 0, 0),
                pod(4000, 1, 500),
            ],
        }
    }

    fn used(out: &RunOutcome) -> Vec<i64> {
        out.events.iter().map(|e| e.used).collect()
    }

    #[test]
    fn best_fit_places_the_hand_checked_sample() {
        // BestFit score = int((1 − ((cpu_left−cpu)/128000·0.5 + (gpu_left−req)/8000·0.5))·100):
        // p0: n0 → 1 − (0.046875 + 0.09375) → 85; n1 → 1 − (0.015625 + 0.03125) → 95: n1.
        // p1: n1 has no idle GPU; n0, GPU 0.  p2: n1 lacks CPU (4 left); n0, GPU 1 (400 left).
        // p3: n0 → 1 − (0.015625 + 0.025) → 95; n1 → 1 − (0.0078125 + 0.03125) → 96: n1.
        // p4: n0 has no GPU with 500 left, n1 has 2 CPUs: fails. Allocated 2100 milli.
        let out = simulate(&sample(), &BestFit, 0);
        assert_eq!(out.placed, vec![Some(1), Some(0), Some(0), Some(1), None]);
        assert_eq!(used(&out), vec![500, 1500, 2100, 2100, 2100]);
        assert_eq!(out.events[4].arrived, 2600);
        assert_eq!(out.nodes[0].gpus, vec![0, 400]);
        assert_eq!(
            (out.nodes[1].cpu_left, out.nodes[1].gpus.clone()),
            (2000, vec![500])
        );
    }

    #[test]
    fn fgd_places_the_hand_checked_sample() {
        // One typical pod, (4 CPU, 0.5 GPU), frequency 1. A node's fragmentation is its idle
        // GPU when the typical pod cannot use the node, else its GPUs with < 500 left.
        // p0: no fragmentation before or after on either node: both score int(σ(0)·100) = 50;
        //     the tie goes to n1 (key 0).  p1, p2: only n0 fits (as for BestFit).
        // p3: n0 (6 CPU, [0, 400]) has frag 400 before and after (4 CPU still fit the typical
        //     pod): 50. n1 (4 CPU, [500]) goes from 0 to 500 (2 CPU left): int(σ(−0.5)·100)
        //     = 37. So n0, keeping n1 usable, and p4 then fits on n1. Allocated 2600 milli.
        let typical = TypicalPods {
            pods: vec![TypicalPod {
                cpu: 4000,
                gpu_milli: 500,
                num_gpu: 1,
                models: ModelSet::ANY,
                freq: 1.0,
            }],
        };
        let out = simulate(&sample(), &Fgd::new(Arc::new(typical)), 0);
        assert_eq!(
            out.placed,
            vec![Some(1), Some(0), Some(0), Some(0), Some(1)]
        );
        assert_eq!(used(&out), vec![500, 1500, 2100, 2100, 2600]);
        assert!(out.failed.is_empty());
        assert_eq!(out.nodes[1].gpus, vec![0]);
    }

    /// Nodes as (CPU, GPUs); pods as (CPU, GPUs, milli per GPU).
    type Sample = (Vec<(i64, u32)>, Vec<(i64, u32, u32)>);

    fn cluster_and_pods() -> impl Strategy<Value = Sample> {
        let nodes = prop::collection::vec((1000i64..=96_000, 0u32..=8), 1..=6);
        let pods = prop::collection::vec(
            (
                1i64..=24_000,
                prop_oneof![
                    Just((0u32, 0u32)),
                    (1u32..=99).prop_map(|m| (1, m * 10)),
                    prop::sample::select(vec![1u32, 2, 4, 8]).prop_map(|n| (n, 1000)),
                ],
            )
                .prop_map(|(cpu, (n, m))| (cpu, n, m)),
            1..=60,
        );
        (nodes, pods)
    }

    proptest::proptest! {
        #[test]
        fn no_policy_over_allocates_a_node((nodes, pods) in cluster_and_pods(), seed in 0u64..100) {
            let w = Workload {
                nodes: nodes
                    .iter()
                    .enumerate()
                    .map(|(i, (cpu, g))| TraceNode {
                        model: (*g > 0).then_some(GpuModel::OpenbG2),
                        ..node(&format!("n{i}"), *cpu, *g)
                    })
                    .collect(),
                tiebreak: (0..nodes.len() as u32).rev().collect(),
                pods: pods.iter().map(|(cpu, n, m)| pod(*cpu, *n, *m)).collect(),
            };
            let typical = Arc::new(crate::lab::openb::workload::typical_pods(&w.pods));
            for name in crate::scheduler::policies::NAMES {
                let policy = crate::scheduler::policies::by_name(name, typical.clone())
                    .expect("known policy");
                let out = simulate(&w, policy.as_ref(), seed);
                let mut allocated = 0i64;
                for (st, n) in out.nodes.iter().zip(&w.nodes) {
                    prop_assert!(st.cpu_left >= 0, "{}: CPU over-allocated", name);
                    prop_assert!(st.mem_left >= 0, "{}: memory over-allocated", name);
                    prop_assert_eq!(st.gpus.len(), n.gpus as usize);
                    prop_assert!(st.gpus.iter().all(|l| *l <= 1000));
                    allocated += st.gpus.iter().map(|l| 1000 - i64::from(*l)).sum::<i64>();
                }
                // What the pods asked for is exactly what the devices lost: no device was
                // asked for more than it had.
                let asked: i64 = out
                    .placed
                    .iter()
                    .zip(&w.pods)
                    .filter(|(p, _)| p.is_some())
                    .map(|(_, p)| p.total_milli())
                    .sum();
                prop_assert_eq!(asked, allocated, "{}", name);
                prop_assert_eq!(out.events.last().map(|e| e.used), Some(allocated));
            }
        }
    }
}
