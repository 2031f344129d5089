//! The scheduler's working copy of the cluster: free capacity per node and GPU, with indexes
//! that find candidate nodes without scanning the whole cluster.
//!
//! Nodes are bucketed per GPU model by how much of each kind of capacity they have free:
//! idle plain GPUs (for whole-GPU requests), the largest remainder of any plain GPU (for
//! shares), and idle MIG instances per class. A request looks at the buckets that can serve it,
//! smallest first (best fit), and stops after a bounded number of candidates, which the packing
//! policy then scores. Every placement updates the buckets of the one node it touched.

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use spotplane_core::mig::MigClass;
use spotplane_core::{Cloud, GpuModel, Market, MigInstance, MigLayout, NodeId};

use super::packing::GPU_MILLI;
use super::snapshot::{Assigned, GpuSnap, NodeSnap};

/// Buckets of the share index are this many milli wide.
const SHARE_BUCKET: u32 = 50;
/// Index slots per node: whole, share, idle MIG GPUs, MIG GPUs with room, then one per MIG
/// class.
const SLOTS: usize = 4 + MigClass::ALL.len();
const WHOLE: usize = 0;
const SHARE: usize = 1;
/// MIG GPUs with no instance in use (they can be turned back into plain GPUs).
const MIG_IDLE: usize = 2;
/// MIG GPUs whose instances in use leave memory slices free (a re-layout can add instances).
const MIG_ROOM: usize = 3;
const ABSENT: u32 = u32::MAX;

fn mig_slot(class: MigClass) -> usize {
    4 + MigClass::ALL.iter().position(|c| *c == class).unwrap_or(0)
}

/// One GPU in MIG mode: its instances and which of them (by start slice) are in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigGpu {
    pub layout: MigLayout,
    /// Bit `s` set: the instance starting at memory slice `s` is in use.
    pub busy: u8,
    /// A re-layout was ordered this cycle: nothing else may touch the GPU.
    pub pending: bool,
}

impl MigGpu {
    pub fn idle_of(&self, class: MigClass) -> impl Iterator<Item = MigInstance> + '_ {
        self.layout
            .instances()
            .iter()
            .copied()
            .filter(move |i| i.class == class && self.busy & (1 << i.start) == 0)
    }

    pub fn busy_instances(&self) -> impl Iterator<Item = MigInstance> + '_ {
        self.layout
            .instances()
            .iter()
            .copied()
            .filter(|i| self.busy & (1 << i.start) != 0)
    }

    /// Whether a layout keeping the instances in use could take one more `class` instance:
    /// [`MigLayout::free_starts`] of the busy instances, without building the layout.
    pub fn could_add(&self, class: MigClass) -> bool {
        let (mut used, mut compute, mut same) = (0u8, 0u8, 0u8);
        for i in self.busy_instances() {
            used |= i.mask();
            compute = compute.saturating_add(i.class.compute_slices());
            same += u8::from(i.class == class);
        }
        class.compute_slices() <= spotplane_core::mig::COMPUTE_SLICES.saturating_sub(compute)
            && same < class.max_per_gpu()
            && class
                .allowed_starts()
                .iter()
                .any(|&s| class.mask_at(s) & used == 0)
    }
}

#[derive(Debug, Clone)]
pub struct NodeState {
    pub id: NodeId,
    pub cloud: Cloud,
    /// Interned: one allocation per region, not per node.
    pub region: std::sync::Arc<str>,
    pub zone: u16,
    pub market: Market,
    pub schedulable: bool,
    /// See [`NodeSnap::runs_images`].
    pub runs_images: bool,
    pub model: Option<GpuModel>,
    pub cpu_cap: i64,
    pub cpu_free: i64,
    pub mem_free: i64,
    /// Milli left per plain GPU; 0 for GPUs in MIG mode or with a pending re-layout. Inline
    /// up to eight GPUs: building the state for every node each cycle allocates nothing.
    pub plain: SmallVec<[u32; 8]>,
    /// MIG state per GPU; `None` for plain GPUs. Empty (no allocation) on a node without a
    /// GPU in MIG mode: read it with `get`.
    pub mig: Vec<Option<MigGpu>>,
    /// Plain GPUs switched to MIG (or back) this cycle: untouchable until applied.
    pub plain_pending: SmallVec<[bool; 8]>,
    /// A per-node tie-break, so equal scores pick the same node every cycle and every run:
    /// the node's rank in id order. Node ids are time-ordered and made in the order nodes are
    /// bought, so of two tied nodes the older wins; the ids' random bits, which differ from
    /// run to run, play no part.
    pub tiebreak: u32,
    /// Bumped whenever the node's free capacity changes (for caches of scores).
    pub version: u32,
    /// (bucket, position) of this node in each index slot; `ABSENT` when not indexed.
    pos: [(u32, u32); SLOTS],
}

/// Buckets of node indexes; `set` moves a node between buckets in O(1).
#[derive(Debug, Clone, Default)]
struct BucketIndex {
    buckets: Vec<Vec<u32>>,
}

/// The working copy.
#[derive(Debug, Clone)]
pub struct State {
    pub nodes: Vec<NodeState>,
    pub by_id: FxHashMap<NodeId, u32>,
    pub zones: Vec<String>,
    /// Per (model, slot), at `model as usize * SLOTS + slot` (dense: every queued job reads
    /// them).
    indexes: Vec<Option<BucketIndex>>,
    /// Nodes that can take CPU-only replicas, in index order.
    cpu_nodes: Vec<u32>,
    /// Whether [`State::index`] has run; before, changes skip the indexes.
    indexed: bool,
}

/// A request for one replica, resolved to what the indexes understand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Want {
    CpuOnly,
    Whole(u32),
    Share(u32),
    Mig(MigClass),
}

impl State {
    pub fn new(snap_nodes: &[NodeSnap]) -> State {
        let mut zones: Vec<String> = Vec::new();
        let mut regions: Vec<std::sync::Arc<str>> = Vec::new();
        let mut nodes = Vec::with_capacity(snap_nodes.len());
        let mut by_id = FxHashMap::with_capacity_and_hasher(snap_nodes.len(), Default::default());
        let mut in_id_order: Vec<u32> = (0..snap_nodes.len() as u32).collect();
        in_id_order.sort_unstable_by_key(|&i| snap_nodes[i as usize].id);
        let mut rank = vec![0u32; snap_nodes.len()];
        for (r, &i) in in_id_order.iter().enumerate() {
            rank[i as usize] = r as u32;
        }
        for (i, n) in snap_nodes.iter().enumerate() {
            let zone = match zones.iter().position(|z| *z == n.zone) {
                Some(z) => z as u16,
                None => {
                    zones.push(n.zone.clone());
                    (zones.len() - 1) as u16
                }
            };
            let plain = n
                .gpus
                .iter()
                .map(|g| if *g == GpuSnap::Plain { GPU_MILLI } else { 0 })
                .collect();
            let mig = if n.gpus.iter().any(|g| matches!(g, GpuSnap::Mig(_))) {
                n.gpus
                    .iter()
                    .map(|g| match g {
                        GpuSnap::Plain | GpuSnap::Relayout => None,
                        GpuSnap::Mig(l) => Some(MigGpu {
                            layout: l.clone(),
                            busy: 0,
                            pending: false,
                        }),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let tiebreak = rank[i];
            by_id.insert(n.id, i as u32);
            nodes.push(NodeState {
                id: n.id,
                cloud: n.cloud,
                region: match regions.iter().find(|r| ***r == *n.region) {
                    Some(r) => std::sync::Arc::clone(r),
                    None => {
                        let r: std::sync::Arc<str> = n.region.as_str().into();
                        regions.push(std::sync::Arc::clone(&r));
                        r
                    }
                },
                zone,
                market: n.market,
                schedulable: n.schedulable,
                runs_images: n.runs_images,
                model: n.gpu_model,
                cpu_cap: n.cpu_milli as i64,
                cpu_free: n.cpu_milli as i64,
                mem_free: n.memory_mib as i64,
                plain,
                mig,
                plain_pending: n.gpus.iter().map(|g| *g == GpuSnap::Relayout).collect(),
                tiebreak,
                version: 0,
                pos: [(ABSENT, ABSENT); SLOTS],
            });
        }
        State {
            nodes,
            by_id,
            zones,
            indexes: vec![None; GpuModel::ALL.len() * SLOTS],
            cpu_nodes: Vec::new(),
            indexed: false,
        }
    }

    /// Builds the indexes; call after the running placements have been applied.
    pub fn index(&mut self) {
        self.cpu_nodes = (0..self.nodes.len() as u32)
            .filter(|&i| self.nodes[i as usize].schedulable)
            .collect();
        self.indexed = true;
        for i in 0..self.nodes.len() as u32 {
            self.reindex(i);
        }
    }

    fn keys(node: &NodeState) -> [Option<usize>; SLOTS] {
        let mut keys = [None; SLOTS];
        if !node.schedulable || node.model.is_none() {
            return keys;
        }
        let idle = node.plain.iter().filter(|&&l| l == GPU_MILLI).count();
        keys[WHOLE] = Some(idle);
        let max_left = node.plain.iter().copied().max().unwrap_or(0);
        keys[SHARE] = Some((max_left / SHARE_BUCKET) as usize);
        let live = || node.mig.iter().flatten().filter(|g| !g.pending);
        keys[MIG_IDLE] = Some(live().filter(|g| g.busy == 0).count());
        keys[MIG_ROOM] = Some(
            live()
                .filter(|g| {
                    g.busy_instances()
                        .map(|i| u32::from(i.class.memory_slices()))
                        .sum::<u32>()
                        < 8
                })
                .count(),
        );
        for class in MigClass::ALL {
            let n = node
                .mig
                .iter()
                .flatten()
                .filter(|g| !g.pending)
                .map(|g| g.idle_of(class).count())
                .sum::<usize>();
            keys[mig_slot(class)] = Some(n);
        }
        keys
    }

    /// Moves node `i` to the buckets its current free capacity belongs in.
    pub fn reindex(&mut self, i: u32) {
        self.nodes[i as usize].version = self.nodes[i as usize].version.wrapping_add(1);
        if !self.indexed {
            return;
        }
        let node = &self.nodes[i as usize];
        let Some(model) = node.model else { return };
        let keys = Self::keys(node);
        for (slot, key) in keys.iter().enumerate() {
            let (old_bucket, old_pos) = self.nodes[i as usize].pos[slot];
            let new_bucket = key.map_or(ABSENT, |k| k as u32);
            if old_bucket == new_bucket {
                continue;
            }
            let index = self.indexes[model as usize * SLOTS + slot].get_or_insert_default();
            if old_bucket != ABSENT {
                let bucket = &mut index.buckets[old_bucket as usize];
                bucket.swap_remove(old_pos as usize);
                if let Some(&moved) = bucket.get(old_pos as usize) {
                    self.nodes[moved as usize].pos[slot] = (old_bucket, old_pos);
                }
            }
            let mut new_pos = ABSENT;
            if new_bucket != ABSENT {
                let b = new_bucket as usize;
                if index.buckets.len() <= b {
                    index.buckets.resize_with(b + 1, Vec::new);
                }
                index.buckets[b].push(i);
                new_pos = (index.buckets[b].len() - 1) as u32;
            }
            self.nodes[i as usize].pos[slot] = (new_bucket, new_pos);
        }
    }

    /// Candidate nodes for `want` on `model`, best fit first: nodes with the least of the
    /// needed capacity that still might serve. The caller filters and stops when it has enough.
    pub fn candidates(&self, model: GpuModel, want: Want) -> impl Iterator<Item = u32> + '_ {
        let (slot, from) = match want {
            Want::CpuOnly => (usize::MAX, 0),
            Want::Whole(k) => (WHOLE, k as usize),
            Want::Share(m) => (SHARE, (m / SHARE_BUCKET) as usize),
            Want::Mig(c) => (mig_slot(c), 1),
        };
        self.bucket_index(model, slot)
            .into_iter()
            .flat_map(move |idx| idx.buckets.iter().skip(from).flatten().copied())
    }

    /// Whether any node of `model` has the GPU capacity `want` asks for (ignoring CPU, memory
    /// and constraints): a constant-time check before any scan.
    pub fn has_any(&self, model: GpuModel, want: Want) -> bool {
        let (slot, from) = match want {
            Want::CpuOnly => return !self.cpu_nodes.is_empty(),
            Want::Whole(k) => (WHOLE, k as usize),
            Want::Share(m) => (SHARE, (m / SHARE_BUCKET) as usize),
            Want::Mig(c) => (mig_slot(c), 1),
        };
        self.bucket_index(model, slot)
            .is_some_and(|idx| idx.buckets.iter().skip(from).any(|b| !b.is_empty()))
    }

    /// An upper bound on how many replicas wanting `want` the GPUs of `model` could take
    /// (ignoring CPU, memory and constraints), in O(buckets): lets a gang that cannot fit
    /// fail without a scan.
    pub fn slots(&self, model: GpuModel, want: Want) -> u64 {
        let (slot, from) = match want {
            Want::CpuOnly => return u64::MAX,
            Want::Whole(0) => return u64::MAX,
            Want::Whole(k) => (WHOLE, k as usize),
            Want::Share(m) => (SHARE, (m / SHARE_BUCKET) as usize),
            Want::Mig(c) => (mig_slot(c), 1),
        };
        let Some(idx) = self.bucket_index(model, slot) else {
            return 0;
        };
        let mut total = 0u64;
        for (b, nodes) in idx.buckets.iter().enumerate().skip(from) {
            let per_node = match want {
                Want::Whole(k) => (b / k as usize) as u64,
                Want::Mig(_) => b as u64,
                // A node's GPUs could each hold several shares: no useful bound.
                _ => u64::MAX / 1024,
            };
            total = total.saturating_add(per_node.saturating_mul(nodes.len() as u64));
        }
        total
    }

    /// Nodes of `model` with MIG GPUs that have no instance in use, fewest first.
    pub fn mig_idle_nodes(&self, model: GpuModel) -> impl Iterator<Item = u32> + '_ {
        self.slot_from(model, MIG_IDLE, 1)
    }

    /// Nodes of `model` with MIG GPUs a re-layout could add instances to, fewest first.
    pub fn mig_room_nodes(&self, model: GpuModel) -> impl Iterator<Item = u32> + '_ {
        self.slot_from(model, MIG_ROOM, 1)
    }

    /// Whether node `i` is listed by [`State::mig_room_nodes`].
    pub fn has_mig_room(&self, i: u32) -> bool {
        let (bucket, _) = self.nodes[i as usize].pos[MIG_ROOM];
        bucket != ABSENT && bucket >= 1
    }

    fn slot_from(
        &self,
        model: GpuModel,
        slot: usize,
        from: usize,
    ) -> impl Iterator<Item = u32> + '_ {
        self.bucket_index(model, slot)
            .into_iter()
            .flat_map(move |idx| idx.buckets.iter().skip(from).flatten().copied())
    }

    /// Schedulable nodes, for CPU-only replicas.
    pub fn cpu_candidates(&self) -> impl Iterator<Item = u32> + '_ {
        self.cpu_nodes.iter().copied()
    }

    /// Models that have indexed nodes.
    pub fn models(&self) -> Vec<GpuModel> {
        let mut m: Vec<GpuModel> = GpuModel::ALL
            .into_iter()
            .filter(|m| (0..SLOTS).any(|slot| self.bucket_index(*m, slot).is_some()))
            .collect();
        m.sort();
        m
    }

    /// The index of (model, slot), if any node was ever put in it; `None` for a slot out of
    /// range (CPU-only requests have none).
    fn bucket_index(&self, model: GpuModel, slot: usize) -> Option<&BucketIndex> {
        if slot >= SLOTS {
            return None;
        }
        self.indexes
            .get(model as usize * SLOTS + slot)
            .and_then(Option::as_ref)
    }

    /// Whether `assigned` is free on node `i` for a replica of `cpu`/`mem`.
    pub fn fits(&self, i: u32, cpu: i64, mem: i64, assigned: &Assigned) -> bool {
        let n = &self.nodes[i as usize];
        if n.cpu_free < cpu || n.mem_free < mem {
            return false;
        }
        match assigned {
            Assigned::CpuOnly => true,
            Assigned::Whole(gpus) => gpus
                .iter()
                .all(|&g| n.plain.get(g as usize) == Some(&GPU_MILLI)),
            Assigned::Share { gpu, milli } => {
                n.plain.get(*gpu as usize).is_some_and(|l| l >= milli)
            }
            Assigned::Mig { gpu, instance } => n
                .mig
                .get(*gpu as usize)
                .and_then(Option::as_ref)
                .is_some_and(|g| !g.pending && g.idle_of(instance.class).any(|x| x == *instance)),
        }
    }

    /// Takes `assigned` on node `i`. The caller has checked [`State::fits`] (running
    /// placements from the store are applied even if they overcommit, so the state matches
    /// reality; they then show as no free capacity).
    pub fn take(&mut self, i: u32, cpu: i64, mem: i64, assigned: &Assigned) {
        let n = &mut self.nodes[i as usize];
        n.cpu_free -= cpu;
        n.mem_free -= mem;
        match assigned {
            Assigned::CpuOnly => {}
            Assigned::Whole(gpus) => {
                for &g in gpus {
                    if let Some(l) = n.plain.get_mut(g as usize) {
                        *l = 0;
                    }
                }
            }
            Assigned::Share { gpu, milli } => {
                if let Some(l) = n.plain.get_mut(*gpu as usize) {
                    *l = l.saturating_sub(*milli);
                }
            }
            Assigned::Mig { gpu, instance } => {
                if let Some(Some(g)) = n.mig.get_mut(*gpu as usize) {
                    g.busy |= 1 << instance.start;
                }
            }
        }
        self.reindex(i);
    }

    /// Gives back what [`State::take`] took.
    pub fn give(&mut self, i: u32, cpu: i64, mem: i64, assigned: &Assigned) {
        let n = &mut self.nodes[i as usize];
        n.cpu_free += cpu;
        n.mem_free += mem;
        match assigned {
            Assigned::CpuOnly => {}
            Assigned::Whole(gpus) => {
                for &g in gpus {
                    if let Some(l) = n.plain.get_mut(g as usize) {
                        *l = GPU_MILLI;
                    }
                }
            }
            Assigned::Share { gpu, milli } => {
                if let Some(l) = n.plain.get_mut(*gpu as usize) {
                    *l = (*l + milli).min(GPU_MILLI);
                }
            }
            Assigned::Mig { gpu, instance } => {
                if let Some(Some(g)) = n.mig.get_mut(*gpu as usize) {
                    g.busy &= !(1 << instance.start);
                }
            }
        }
        self.reindex(i);
    }

    /// Marks a GPU as being re-laid out: no placement may use it this cycle.
    pub fn set_pending(&mut self, i: u32, gpu: u32) {
        let n = &mut self.nodes[i as usize];
        let g = gpu as usize;
        if let Some(Some(m)) = n.mig.get_mut(g) {
            m.pending = true;
        }
        if let Some(p) = n.plain_pending.get_mut(g) {
            *p = true;
        }
        if let Some(l) = n.plain.get_mut(g) {
            *l = 0;
        }
        self.reindex(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(id: u128, gpus: usize) -> NodeSnap {
        NodeSnap {
            id: NodeId(uuid::Uuid::from_u128(id)),
            cloud: Cloud::Aws,
            region: "us-east-1".into(),
            zone: "use1-az1".into(),
            market: Market::Spot,
            schedulable: true,
            runs_images: true,
            cpu_milli: 64_000,
            memory_mib: 512 * 1024,
            gpu_model: Some(GpuModel::H100_80GB),
            gpus: vec![GpuSnap::Plain; gpus],
        }
    }

    #[test]
    fn candidates_come_smallest_sufficient_bucket_first() {
        let mut s = State::new(&[snap(1, 8), snap(2, 2), snap(3, 4)]);
        s.index();
        let order: Vec<u32> = s.candidates(GpuModel::H100_80GB, Want::Whole(2)).collect();
        assert_eq!(order, vec![1, 2, 0]);
        s.take(1, 1000, 1024, &Assigned::Whole(vec![0, 1]));
        let order: Vec<u32> = s.candidates(GpuModel::H100_80GB, Want::Whole(2)).collect();
        assert_eq!(
            order,
            vec![2, 0],
            "the full node drops out of the 2-GPU buckets"
        );
        s.give(1, 1000, 1024, &Assigned::Whole(vec![0, 1]));
        assert_eq!(s.candidates(GpuModel::H100_80GB, Want::Whole(2)).count(), 3);
    }

    #[test]
    fn shares_and_mig_instances_are_indexed() {
        let mut n = snap(1, 2);
        n.gpus[1] = GpuSnap::Mig(MigLayout::full());
        let mut s = State::new(&[n]);
        s.index();
        assert_eq!(
            s.candidates(GpuModel::H100_80GB, Want::Mig(MigClass::G7))
                .count(),
            1
        );
        assert_eq!(
            s.candidates(GpuModel::H100_80GB, Want::Whole(2)).count(),
            0,
            "a MIG GPU is not a plain GPU"
        );
        s.take(0, 0, 0, &Assigned::Share { gpu: 0, milli: 700 });
        assert_eq!(
            s.candidates(GpuModel::H100_80GB, Want::Share(400)).count(),
            0
        );
        assert_eq!(
            s.candidates(GpuModel::H100_80GB, Want::Share(300)).count(),
            1
        );
        s.take(
            0,
            0,
            0,
            &Assigned::Mig {
                gpu: 1,
                instance: MigInstance::new(MigClass::G7, 0),
            },
        );
        assert_eq!(
            s.candidates(GpuModel::H100_80GB, Want::Mig(MigClass::G7))
                .count(),
            0
        );
    }
}
