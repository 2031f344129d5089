//! GPU fragmentation with respect to a target workload (FGD, Weng et al., USENIX ATC '23).
//!
//! A node's idle GPU capacity is a *fragment* for a kind of replica when that replica could not
//! use it there: the node lacks CPU, lacks a GPU with enough left, has the wrong model, or the
//! replica wants no GPU at all. The target workload is a list of [`TypicalPod`]s with
//! frequencies (the distribution of request shapes the cluster expects); a node's
//! fragmentation is the frequency-weighted expected amount of its idle GPU (in milli-GPU) that
//! the next replica drawn from that distribution could not use.
//!
//! The categories and the floating-point order are those of the published simulator
//! (openb-protocol.md §7.2–§7.3), so that FGD decisions, which compare truncated integer
//! scores, are reproduced bit for bit.

use spotplane_core::GpuModel;

/// A set of GPU models as a bit mask over [`GpuModel::ALL`]; the empty set allows any model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ModelSet(u32);

impl ModelSet {
    pub const ANY: ModelSet = ModelSet(0);

    pub fn of(models: &[GpuModel]) -> Self {
        ModelSet(models.iter().fold(0, |m, g| m | Self::bit(*g)))
    }

    fn bit(model: GpuModel) -> u32 {
        1 << (model as u32)
    }

    pub fn is_any(self) -> bool {
        self.0 == 0
    }

    /// Whether a node of `model` (None: no GPUs) satisfies the constraint. An empty set
    /// allows any node, including one without a model.
    pub fn allows(self, model: Option<GpuModel>) -> bool {
        self.is_any() || model.is_some_and(|m| self.0 & Self::bit(m) != 0)
    }
}

/// One request shape of the target workload, with its frequency.
#[derive(Debug, Clone, PartialEq)]
pub struct TypicalPod {
    pub cpu: i64,
    /// Per GPU, in thousandths; 0 for a CPU-only shape.
    pub gpu_milli: u32,
    pub num_gpu: u32,
    /// Allowed models (empty: any).
    pub models: ModelSet,
    /// Share of this shape in the workload (the list sums to 1).
    pub freq: f64,
}

/// The target workload: typical pods in a fixed order (the order fixes the float sums).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TypicalPods {
    pub pods: Vec<TypicalPod>,
}

/// The per-category amounts of one node, in milli-GPU, in the simulator's index order.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FragBreakdown {
    /// Lacks both CPU and a fitting GPU.
    pub q1: f64,
    /// Lacks a fitting GPU (or: GPUs too small to take the shape, on a node that fits it).
    pub q2: f64,
    /// Usable by the shape.
    pub q3: f64,
    /// Has the GPUs but lacks CPU.
    pub q4: f64,
    /// CPU-only shape, node has the CPU: its idle GPU is still a fragment for that shape.
    pub xl: f64,
    /// CPU-only shape, node lacks the CPU.
    pub xr: f64,
    /// Wrong GPU model for the shape.
    pub no_access: f64,
}

impl FragBreakdown {
    /// The fragment: every category except Q3, summed in the simulator's order.
    pub fn frag(&self) -> f64 {
        0.0 + self.q1 + self.q2 + self.q4 + self.xl + self.xr + self.no_access
    }
}

/// The categories of a node with `cpu_left` milli-CPU, GPU `model` and per-device `gpus` left
/// (openb-protocol.md §7.2, accumulated in typical-pod order as §7.3 requires).
pub fn breakdown(
    cpu_left: i64,
    model: Option<GpuModel>,
    gpus: &[u32],
    typical: &TypicalPods,
) -> FragBreakdown {
    let idle: u32 = gpus.iter().sum();
    let mut b = FragBreakdown::default();
    if idle == 0 {
        return b;
    }
    let idle_f = f64::from(idle);
    for t in &typical.pods {
        let cpu_ok = cpu_left >= t.cpu;
        if t.gpu_milli == 0 {
            if cpu_ok {
                b.xl += t.freq * idle_f;
            } else {
                b.xr += t.freq * idle_f;
            }
            continue;
        }
        if !t.models.is_any() && !t.models.allows(model) {
            b.no_access += t.freq * idle_f;
            continue;
        }
        let mut fitting = 0u32;
        let mut small = 0u32;
        for &left in gpus {
            if left >= t.gpu_milli {
                fitting += 1;
            } else {
                small += left;
            }
        }
        let gpu_ok = fitting >= t.num_gpu;
        match (gpu_ok, cpu_ok) {
            (true, true) => {
                b.q2 += t.freq * f64::from(small);
                b.q3 += t.freq * f64::from(idle - small);
            }
            (true, false) => b.q4 += t.freq * idle_f,
            (false, true) => b.q2 += t.freq * idle_f,
            (false, false) => b.q1 += t.freq * idle_f,
        }
    }
    b
}

/// The node's fragmentation in milli-GPU: [`breakdown`]`.frag()`.
pub fn node_frag(
    cpu_left: i64,
    model: Option<GpuModel>,
    gpus: &[u32],
    typical: &TypicalPods,
) -> f64 {
    breakdown(cpu_left, model, gpus, typical).frag()
}

/// A copy of a node's per-device GPU left, on the stack for up to 16 devices: the hypothetical
/// states scoring policies evaluate.
#[derive(Debug, Clone)]
pub struct GpuBuf {
    len: usize,
    inline: [u32; 16],
    spill: Vec<u32>,
}

impl GpuBuf {
    pub fn from_slice(gpus: &[u32]) -> Self {
        let mut b = GpuBuf {
            len: gpus.len(),
            inline: [0; 16],
            spill: Vec::new(),
        };
        if gpus.len() <= 16 {
            b.inline[..gpus.len()].copy_from_slice(gpus);
        } else {
            b.spill = gpus.to_vec();
        }
        b
    }

    pub fn as_slice(&self) -> &[u32] {
        if self.len <= 16 {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u32] {
        if self.len <= 16 {
            &mut self.inline[..self.len]
        } else {
            &mut self.spill
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typical() -> TypicalPods {
        TypicalPods {
            pods: vec![
                TypicalPod {
                    cpu: 4000,
                    gpu_milli: 500,
                    num_gpu: 1,
                    models: ModelSet::ANY,
                    freq: 0.5,
                },
                TypicalPod {
                    cpu: 8000,
                    gpu_milli: 1000,
                    num_gpu: 2,
                    models: ModelSet::ANY,
                    freq: 0.25,
                },
                TypicalPod {
                    cpu: 2000,
                    gpu_milli: 0,
                    num_gpu: 0,
                    models: ModelSet::ANY,
                    freq: 0.25,
                },
            ],
        }
    }

    #[test]
    fn idle_gpu_a_shape_cannot_use_is_counted_as_fragment() {
        // Devices left [1000, 300], 16 CPUs left.
        // Share of 500: fits device 0; the 300 on device 1 is too small: q2 += 0.5·300.
        // Two whole GPUs: only one is idle: q2 += 0.25·1300.
        // CPU-only: all idle is fragment (xl): 0.25·1300.
        let b = breakdown(16_000, Some(GpuModel::T4), &[1000, 300], &typical());
        assert_eq!(b.q2, 150.0 + 325.0);
        assert_eq!(b.q3, 500.0);
        assert_eq!(b.xl, 325.0);
        assert_eq!(b.frag(), 800.0);
    }

    #[test]
    fn a_node_without_cpu_left_is_all_fragment() {
        let b = breakdown(1000, Some(GpuModel::T4), &[1000, 1000], &typical());
        assert_eq!(b.q4, 0.5 * 2000.0 + 0.25 * 2000.0);
        assert_eq!(b.xr, 0.25 * 2000.0);
        assert_eq!(b.frag(), 2000.0);
    }

    #[test]
    fn model_sets_allow_listed_models_only() {
        let s = ModelSet::of(&[GpuModel::T4, GpuModel::P100]);
        assert!(s.allows(Some(GpuModel::T4)));
        assert!(!s.allows(Some(GpuModel::OpenbG2)));
        assert!(!s.allows(None));
        assert!(ModelSet::ANY.allows(None));
    }
}
