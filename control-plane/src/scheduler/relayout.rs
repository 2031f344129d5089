//! Dynamic MIG re-layout: new GPU layouts so that a job that fits nowhere fits next cycle.
//!
//! For a MIG job, per model it may use: idle plain GPUs of a MIG-capable model (MIG turned
//! on) or MIG GPUs with room get instances of the job's class, keeping every instance in use
//! and the idle ones that still fit; a gang's instances come from one zone. What is left of a
//! re-laid GPU is filled with the same class, and later single-replica jobs of that class in
//! the cycle claim those spare instances instead of each re-laying a GPU of its own. For a
//! whole-GPU or shared-GPU job, idle MIG GPUs of one node are turned back into plain GPUs. A
//! re-layout is an order (`Repartition`) that the control plane carries out; the GPUs it names
//! are pending until then, so nothing else is placed on them this cycle, and the job waits
//! (`WaitingForRepartition`). What the attempt found (`Relayout`) tells the cycle how to
//! remember a failure: with less CPU and memory it might succeed (`NoRoom`), or not at all
//! (`NoGpu`).

use spotplane_core::mig::MigClass;
use spotplane_core::shape::GpuShape;
use spotplane_core::{GpuModel, MigInstance, MigLayout};

use super::cycle::{Cycle, Need};
use super::packing;
use super::placement::Filter;
use super::state::{self, Want};
use super::{QueuedJob, Repartition};

impl<'a> Cycle<'a> {
    /// Re-lays idle GPUs so the job can fit next cycle: MIG instances for MIG jobs (keeping
    /// every instance in use), whole GPUs back from idle MIG GPUs for other jobs.
    pub(super) fn repartition(
        &mut self,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
    ) -> Relayout {
        match &job.shape.gpu {
            GpuShape::Mig { profile, .. } => {
                let mut outcome = Relayout::NoGpu;
                for &model in models {
                    let Some(class) = profile.class_on(model) else {
                        continue;
                    };
                    match self.relayout_for_mig(job, need, model, class) {
                        Relayout::Ordered => return Relayout::Ordered,
                        Relayout::NoRoom => outcome = Relayout::NoRoom,
                        Relayout::NoGpu => {}
                    }
                }
                outcome
            }
            GpuShape::Whole { gpus, .. } if *gpus > 0 => {
                self.mig_off_for_whole(job, need, models, *gpus * job.replicas)
            }
            GpuShape::Shared { .. } => self.mig_off_for_whole(job, need, models, 1),
            _ => Relayout::NoGpu,
        }
    }

    /// The GPUs of `node` that could take a new `class` instance: idle plain GPUs of a MIG
    /// model (MIG turned on), or MIG GPUs, keeping the instances in use. Each with the layout
    /// to start from. A MIG GPU's room is checked before its layout is built (most GPUs a
    /// failing search visits have none).
    fn relayout_bases(&self, i: u32, model: GpuModel, class: MigClass) -> Vec<(usize, MigLayout)> {
        let n = &self.state.nodes[i as usize];
        let mut out = Vec::new();
        for g in 0..n.plain.len() {
            let base = match n.mig.get(g).and_then(Option::as_ref) {
                None if model.mig_capable()
                    && n.plain[g] == packing::GPU_MILLI
                    && !n.plain_pending[g] =>
                {
                    Some(Vec::new())
                }
                Some(m) if !m.pending && m.could_add(class) => Some(m.busy_instances().collect()),
                _ => None,
            };
            if let Some(Ok(layout)) = base.map(MigLayout::new) {
                out.push((g, layout));
            }
        }
        out
    }

    fn relayout_for_mig(
        &mut self,
        job: &QueuedJob,
        need: Need,
        model: GpuModel,
        class: MigClass,
    ) -> Relayout {
        let filter = Filter {
            clouds: &job.clouds,
            regions: &job.regions,
            spot: job.spot,
            zone: None,
            image: job.image,
        };
        // A re-layout ordered earlier this cycle may already have made a spare instance of
        // this class: a single replica waits for that one rather than re-lay another GPU.
        if job.replicas == 1
            && let Some(spares) = self.spare_instances.get_mut(&(model, class))
        {
            let nodes = &self.state.nodes;
            let claimed = spares.iter().position(|&(i, _)| {
                let n = &nodes[i as usize];
                filter.admits(n) && n.cpu_free >= need.cpu && n.mem_free >= need.mem
            });
            if let Some(k) = claimed {
                spares[k].1 -= 1;
                if spares[k].1 == 0 {
                    spares.swap_remove(k);
                }
                return Relayout::Ordered;
            }
        }
        // Nodes with an idle plain GPU (MIG can be turned on) or with MIG GPUs.
        // Nodes with MIG room first; then nodes with an idle plain GPU not already listed.
        let mut nodes: Vec<u32> = self.state.mig_room_nodes(model).collect();
        if model.mig_capable() {
            let state = &self.state;
            nodes.extend(
                state
                    .candidates(model, Want::Whole(1))
                    .filter(|&i| !state.has_mig_room(i)),
            );
        }
        let mut any_gpu = false;
        // Per zone, so a gang lands in one zone.
        for zone in 0..self.state.zones.len() as u16 {
            let mut plan: Vec<(u32, u32, MigLayout, u32)> = Vec::new();
            let mut covered = 0usize;
            for &i in &nodes {
                if covered >= job.replicas as usize {
                    break;
                }
                let n = &self.state.nodes[i as usize];
                if n.zone != zone || !filter.admits(n) {
                    continue;
                }
                // Without CPU and memory for one replica nothing is added here; such a node
                // only tells "no GPU at all" from "no room now", which one GPU settled.
                if any_gpu && (n.cpu_free < need.cpu || n.mem_free < need.mem) {
                    continue;
                }
                let (mut cpu, mut mem) = (n.cpu_free, n.mem_free);
                for (g, mut layout) in self.relayout_bases(i, model, class) {
                    if layout.free_starts(class).is_empty() {
                        continue;
                    }
                    any_gpu = true;
                    let mut added = 0;
                    while covered + added < job.replicas as usize
                        && cpu >= need.cpu
                        && mem >= need.mem
                    {
                        let Some(&start) = layout.free_starts(class).first() else {
                            break;
                        };
                        if layout.add(MigInstance::new(class, start)).is_err() {
                            break;
                        }
                        added += 1;
                        cpu -= need.cpu;
                        mem -= need.mem;
                    }
                    if added == 0 {
                        continue;
                    }
                    // Keep the idle instances that still fit, so nothing is destroyed needlessly.
                    if let Some(prev) = n.mig.get(g).and_then(Option::as_ref) {
                        for inst in prev.layout.instances() {
                            if prev.busy & (1 << inst.start) == 0
                                && !layout.instances().contains(inst)
                            {
                                let _ = layout.add(*inst);
                            }
                        }
                    }
                    // Fill what is left with the same class: the next jobs asking for it this
                    // cycle wait for these instead of each re-laying a GPU of its own.
                    let mut spare = 0;
                    while let Some(&start) = layout.free_starts(class).first() {
                        if layout.add(MigInstance::new(class, start)).is_err() {
                            break;
                        }
                        spare += 1;
                    }
                    covered += added;
                    plan.push((i, g as u32, layout, spare));
                    if covered >= job.replicas as usize {
                        break;
                    }
                }
            }
            if covered >= job.replicas as usize && !plan.is_empty() {
                for (i, g, layout, spare) in plan {
                    let node = self.state.nodes[i as usize].id;
                    let unchanged = self.state.nodes[i as usize]
                        .mig
                        .get(g as usize)
                        .and_then(Option::as_ref)
                        .is_some_and(|m| m.layout == layout);
                    if unchanged {
                        continue;
                    }
                    if spare > 0 {
                        self.spare_instances
                            .entry((model, class))
                            .or_default()
                            .push((i, spare));
                    }
                    self.state.set_pending(i, g);
                    self.out.repartitions.push(Repartition {
                        node,
                        gpu: g,
                        layout: Some(layout),
                    });
                }
                return Relayout::Ordered;
            }
        }
        if any_gpu {
            Relayout::NoRoom
        } else {
            Relayout::NoGpu
        }
    }

    /// Turns idle MIG GPUs of one node back into plain GPUs so `gpus` whole GPUs fit there.
    fn mig_off_for_whole(
        &mut self,
        job: &QueuedJob,
        need: Need,
        models: &[GpuModel],
        gpus: u32,
    ) -> Relayout {
        let filter = Filter {
            clouds: &job.clouds,
            regions: &job.regions,
            spot: job.spot,
            zone: None,
            image: job.image,
        };
        let mut any_gpu = false;
        let convertible =
            |m: &Option<state::MigGpu>| m.as_ref().is_some_and(|m| m.busy == 0 && !m.pending);
        let mut chosen = None;
        'models: for &model in models {
            for i in self.state.mig_idle_nodes(model) {
                let n = &self.state.nodes[i as usize];
                if !filter.admits(n) {
                    continue;
                }
                let idle_plain =
                    n.plain.iter().filter(|&&l| l == packing::GPU_MILLI).count() as u32;
                let idle_mig = n.mig.iter().filter(|m| convertible(m)).count() as u32;
                if idle_plain >= gpus || idle_plain + idle_mig < gpus {
                    continue;
                }
                any_gpu = true;
                if n.cpu_free < need.cpu * i64::from(job.replicas)
                    || n.mem_free < need.mem * i64::from(job.replicas)
                {
                    continue;
                }
                chosen = Some((i, gpus - idle_plain));
                break 'models;
            }
        }
        let Some((i, turn)) = chosen else {
            return if any_gpu {
                Relayout::NoRoom
            } else {
                Relayout::NoGpu
            };
        };
        let n = &self.state.nodes[i as usize];
        let id = n.id;
        let gpus: Vec<u32> = (0..n.mig.len() as u32)
            .filter(|&g| convertible(&n.mig[g as usize]))
            .take(turn as usize)
            .collect();
        for g in gpus {
            self.state.set_pending(i, g);
            self.out.repartitions.push(Repartition {
                node: id,
                gpu: g,
                layout: None,
            });
        }
        Relayout::Ordered
    }
}

/// What a re-layout attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Relayout {
    Ordered,
    /// GPUs could be re-laid but CPU or memory is short.
    NoRoom,
    /// No GPU could be re-laid for this request, whatever its CPU and memory.
    NoGpu,
}
