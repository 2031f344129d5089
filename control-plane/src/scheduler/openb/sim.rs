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
