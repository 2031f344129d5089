//! Placement: where a job's replicas go, given what is free now.
//!
//! A gang is placed whole or not at all (`Cycle::place_gang`): a single replica on the best
//! node; a gang on one node if one has room for every replica, else within one zone, each
//! replica trying first the node the one before it took; a gang that does not fit is rolled
//! back. Candidate nodes come from the state's index, best fit first, filtered by the job's
//! constraints (`Filter`), at most `candidates` per GPU model for a replica. The packing policy
//! scores them and the lowest (score, node tiebreak) wins; a deterministic policy's scores are
//! cached per (node, node version, request shape), so only nodes that changed are scored
//! again. A MIG replica takes the first candidate (the index lists the nodes with the fewest
//! idle instances first) and there the GPU with the most instances in use. Placing takes the
//! capacity in the state; a caller that only asks whether a job fits (preemption) rolls it
//! back.

use std::cmp::Reverse;

use spotplane_core::shape::GpuShape;
use spotplane_core::{Cloud, GpuModel, Market};

use super::cycle::{Cycle, Need};
use super::packing::{self, Devices, PackNode, PackPod, ScoreCtx};
use super::state::{self, Want};
use super::{Assigned, QueuedJob, frag};

/// A job's placement constraints besides its shape.
pub(super) struct Filter<'a> {
    pub(super) clouds: &'a [Cloud],
    pub(super) regions: &'a [String],
    pub(super) spot: bool,
    pub(super) zone: Option<u16>,
    /// The job runs a container image.
    pub(super) image: bool,
}

impl Filter<'_> {
    pub(super) fn admits(&self, n: &state::NodeState) -> bool {
        n.schedulable
            && (!self.image || n.runs_images)
            && (self.clouds.is_empty() || self.clouds.contains(&n.cloud))
            && (self.regions.is_empty() || self.regions.iter().any(|r| **r == *n.region))
            && (self.spot || n.market == Market::OnDemand)
            && self.zone.is_none_or(|z| z == n.zone)
    }
}

/// What the index is asked for on `model` for one replica of `shape`.
pub(super) fn want_on(shape: &GpuShape, model: GpuModel) -> Option<Want> {
    match shape {
        GpuShape::Whole { gpus: 0, .. } => Some(Want::CpuOnly),
        GpuShape::Whole { gpus, .. } => Some(Want::Whole(*gpus)),
        GpuShape::Shared { gpu_milli, .. } if *gpu_milli >= packing::GPU_MILLI => {
            Some(Want::Whole(1))
        }
        GpuShape::Shared { gpu_milli, .. } => Some(Want::Share(*gpu_milli)),
        GpuShape::Mig { profile, .. } => profile.class_on(model).map(Want::Mig),
    }
}

/// A request shape as the packing policy sees it: cpu, GPUs, milli per GPU, allowed models.
pub(super) type ScoreKey = (i64, u32, u32, frag::ModelSet);

impl<'a> Cycle<'a> {
    /// Places every replica or none; returns the node index and assignment per replica,
    /// already taken in the state.
    pub(super) fn place_gang(
        &mut self,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
    ) -> Option<Vec<(u32, Assigned)>> {
        let mut filter = Filter {
            clouds: &job.clouds,
            regions: &job.regions,
            spot: job.spot,
            zone: None,
            image: job.image,
        };
        if job.replicas == 1 {
            let one = self.place_one(&job.shape.gpu, need, models, &filter, None)?;
            return Some(vec![one]);
        }
        // One node for the whole gang, when one has room.
        if let Some(placed) = self.place_on_one_node(job, need, models, &filter) {
            return Some(placed);
        }
        // Otherwise one zone, replicas kept together where they fit.
        for zone in 0..self.state.zones.len() as u16 {
            filter.zone = Some(zone);
            let mut placed: Vec<(u32, Assigned)> = Vec::with_capacity(job.replicas as usize);
            let mut ok = true;
            for _ in 0..job.replicas {
                let sticky = placed.last().map(|(i, _)| *i);
                match self.place_one(&job.shape.gpu, need, models, &filter, sticky) {
                    Some(p) => placed.push(p),
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                return Some(placed);
            }
            self.rollback(&placed, need);
        }
        None
    }

    pub(super) fn rollback(&mut self, placed: &[(u32, Assigned)], need: Need) {
        for (i, a) in placed.iter().rev() {
            self.state.give(*i, need.cpu, need.mem, a);
        }
    }

    /// Tries the best few nodes that might hold every replica at once.
    fn place_on_one_node(
        &mut self,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
        filter: &Filter<'_>,
    ) -> Option<Vec<(u32, Assigned)>> {
        let r = job.replicas;
        let mut tried = 0;
        for &model in models {
            let Some(want) = want_on(&job.shape.gpu, model) else {
                continue;
            };
            let scaled = match want {
                Want::CpuOnly => Want::CpuOnly,
                Want::Whole(k) => Want::Whole(k * r),
                Want::Share(m) => Want::Share(m),
                Want::Mig(c) => Want::Mig(c),
            };
            let nodes: Vec<u32> = if scaled == Want::CpuOnly {
                self.state.cpu_candidates().collect()
            } else {
                self.state.candidates(model, scaled).collect()
            };
            for i in nodes {
                let n = &self.state.nodes[i as usize];
                if !filter.admits(n)
                    || n.cpu_free < need.cpu * i64::from(r)
                    || n.mem_free < need.mem * i64::from(r)
                {
                    continue;
                }
                tried += 1;
                let mut placed = Vec::with_capacity(r as usize);
                for _ in 0..r {
                    match self.assign_on(i, &job.shape.gpu, model, need) {
                        Some(a) => {
                            self.state.take(i, need.cpu, need.mem, &a);
                            placed.push((i, a));
                        }
                        None => break,
                    }
                }
                if placed.len() == r as usize {
                    return Some(placed);
                }
                self.rollback(&placed, need);
                if tried >= self.cfg.candidates {
                    return None;
                }
            }
        }
        None
    }

    /// Places one replica on the best candidate node (trying `sticky` first) and takes it.
    fn place_one(
        &mut self,
        shape: &GpuShape,
        need: Need,
        models: &[GpuModel],
        filter: &Filter<'_>,
        sticky: Option<u32>,
    ) -> Option<(u32, Assigned)> {
        if let Some(i) = sticky {
            let model = self.state.nodes[i as usize].model;
            if let Some(m) = model.filter(|m| models.contains(m)) {
                if let Some(a) = self.assign_on(i, shape, m, need) {
                    self.state.take(i, need.cpu, need.mem, &a);
                    return Some((i, a));
                }
            } else if matches!(shape, GpuShape::Whole { gpus: 0, .. })
                && self.state.fits(i, need.cpu, need.mem, &Assigned::CpuOnly)
            {
                self.state.take(i, need.cpu, need.mem, &Assigned::CpuOnly);
                return Some((i, Assigned::CpuOnly));
            }
        }
        if matches!(shape, GpuShape::Whole { gpus: 0, .. }) {
            let i = self.state.cpu_candidates().find(|&i| {
                let n = &self.state.nodes[i as usize];
                filter.admits(n) && n.cpu_free >= need.cpu && n.mem_free >= need.mem
            })?;
            self.state.take(i, need.cpu, need.mem, &Assigned::CpuOnly);
            return Some((i, Assigned::CpuOnly));
        }
        // Gather up to `candidates` feasible nodes over the allowed models, best fit first.
        let mut cands: Vec<(u32, GpuModel)> = Vec::new();
        for &model in models {
            let Some(want) = want_on(shape, model) else {
                continue;
            };
            let mut taken = 0;
            for i in self.state.candidates(model, want) {
                let n = &self.state.nodes[i as usize];
                if !filter.admits(n) || n.cpu_free < need.cpu || n.mem_free < need.mem {
                    continue;
                }
                let ok = match want {
                    Want::Whole(k) => {
                        n.plain.iter().filter(|&&l| l == packing::GPU_MILLI).count() >= k as usize
                    }
                    Want::Share(m) => n.plain.iter().any(|&l| l >= m),
                    Want::Mig(c) => n
                        .mig
                        .iter()
                        .flatten()
                        .any(|g| !g.pending && g.idle_of(c).next().is_some()),
                    Want::CpuOnly => true,
                };
                if ok {
                    cands.push((i, model));
                    taken += 1;
                    if taken >= self.cfg.candidates {
                        break;
                    }
                }
            }
        }
        if cands.is_empty() {
            return None;
        }
        let (i, assigned) = if let GpuShape::Mig { .. } = shape {
            // MIG: the index already lists nodes with the fewest idle instances first.
            let (i, m) = cands[0];
            (i, self.assign_on(i, shape, m, need)?)
        } else {
            self.seq += 1;
            let ctx = ScoreCtx {
                seed: 0,
                seq: self.seq,
            };
            let (gpus, milli) = match shape {
                GpuShape::Whole { gpus, .. } => (*gpus, packing::GPU_MILLI),
                GpuShape::Shared { gpu_milli, .. } => (1, (*gpu_milli).min(packing::GPU_MILLI)),
                GpuShape::Mig { .. } => (0, 0),
            };
            let pod = PackPod {
                cpu: need.cpu,
                mem: need.mem,
                num_gpu: gpus,
                gpu_milli: milli,
                models,
            };
            // Score each candidate; a deterministic policy's answer is cached per (node,
            // node version, request shape), so only nodes that changed are scored again.
            let cacheable = !self.policy.uses_ctx();
            let shape_key = (
                pod.cpu,
                pod.num_gpu,
                pod.gpu_milli,
                frag::ModelSet::of(models),
            );
            let mut best: Option<(usize, packing::Choice, u32)> = None;
            for (k, &(i, m)) in cands.iter().enumerate() {
                let n = &self.state.nodes[i as usize];
                let node = PackNode {
                    cpu_left: n.cpu_free,
                    cpu_cap: n.cpu_cap,
                    mem_left: n.mem_free,
                    model: Some(m),
                    gpus: &n.plain,
                    tiebreak: n.tiebreak,
                };
                if !packing::feasible(&node, &pod) {
                    continue;
                }
                let choice = match self.scores.get(&(i, shape_key)) {
                    Some((v, c)) if cacheable && *v == n.version => c.clone(),
                    _ => {
                        let c = self.policy.score(&node, &pod, &ctx);
                        if cacheable {
                            self.scores.insert((i, shape_key), (n.version, c.clone()));
                        }
                        c
                    }
                };
                let better = best
                    .as_ref()
                    .is_none_or(|(_, b, t)| (choice.score, n.tiebreak) < (b.score, *t));
                if better {
                    best = Some((k, choice, n.tiebreak));
                }
            }
            let (k, choice, _) = best?;
            let i = cands[k].0;
            let assigned = match choice.devices {
                Devices::Whole(d) => Assigned::Whole(d.into_iter().map(u32::from).collect()),
                Devices::Share(d) => Assigned::Share {
                    gpu: u32::from(d),
                    milli,
                },
                Devices::None => Assigned::CpuOnly,
            };
            (i, assigned)
        };
        if !self.state.fits(i, need.cpu, need.mem, &assigned) {
            return None;
        }
        self.state.take(i, need.cpu, need.mem, &assigned);
        Some((i, assigned))
    }

    /// Which part of node `i` one replica would get (not taken yet): best fit on that node.
    pub(super) fn assign_on(
        &self,
        i: u32,
        shape: &GpuShape,
        model: GpuModel,
        need: Need,
    ) -> Option<Assigned> {
        let n = &self.state.nodes[i as usize];
        if n.cpu_free < need.cpu || n.mem_free < need.mem {
            return None;
        }
        match want_on(shape, model)? {
            Want::CpuOnly => Some(Assigned::CpuOnly),
            Want::Whole(k) => packing::lowest_idle(&n.plain, k)
                .map(|d| Assigned::Whole(d.into_iter().map(u32::from).collect())),
            Want::Share(m) => packing::best_share(&n.plain, m).map(|g| Assigned::Share {
                gpu: u32::from(g),
                milli: m,
            }),
            Want::Mig(class) => {
                // The GPU with the most instances in use (pack), then the lowest index.
                let (gpu, inst) = n
                    .mig
                    .iter()
                    .enumerate()
                    .filter_map(|(g, m)| m.as_ref().filter(|m| !m.pending).map(|m| (g, m)))
                    .filter_map(|(g, m)| {
                        m.idle_of(class)
                            .next()
                            .map(|inst| (g, inst, m.busy.count_ones()))
                    })
                    .max_by_key(|(g, _, busy)| (*busy, Reverse(*g)))
                    .map(|(g, inst, _)| (g, inst))?;
                Some(Assigned::Mig {
                    gpu: gpu as u32,
                    instance: inst,
                })
            }
        }
    }
}
