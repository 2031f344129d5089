//! The packing policies, all behind [`PackingPolicy`]: `random`, `best-fit`, `fgd` (the
//! published baselines of the openb experiment) and `spotplane` (ours).

use std::sync::Arc;

use super::frag::TypicalPods;
use super::packing::{
    Devices, GPU_MILLI, PackNode, PackPod, PackingPolicy, best_share, lowest_idle,
};

pub mod best_fit;
pub mod fgd;
pub mod random;
pub mod spotplane;

pub use best_fit::BestFit;
pub use fgd::Fgd;
pub use random::RandomPolicy;
pub use spotplane::Spotplane;

/// Every policy's name, in the order `all` runs them.
pub const NAMES: [&str; 4] = ["random", "best-fit", "fgd", "spotplane"];

/// The policy called `name`; `typical` is the target workload of the policies that measure
/// fragmentation. `None` for an unknown name.
pub fn by_name(name: &str, typical: Arc<TypicalPods>) -> Option<Box<dyn PackingPolicy>> {
    Some(match name {
        "random" => Box::new(RandomPolicy),
        "best-fit" => Box::new(BestFit),
        "fgd" => Box::new(Fgd::new(typical)),
        "spotplane" => Box::new(Spotplane::new(typical)),
        _ => return None,
    })
}

/// The simulator's default (`best`) device choice on a node that [`feasible`] accepted:
/// whole GPUs take the lowest-indexed idle devices, a share takes the device with the least
/// left that fits, a CPU-only pod takes none.
///
/// [`feasible`]: super::packing::feasible
pub fn best_devices(node: &PackNode<'_>, pod: &PackPod<'_>) -> Devices {
    if !pod.is_gpu() {
        Devices::None
    } else if pod.is_share() {
        Devices::Share(best_share(node.gpus, pod.gpu_milli).unwrap_or(0))
    } else if pod.gpu_milli == GPU_MILLI {
        Devices::Whole(lowest_idle(node.gpus, pod.num_gpu).unwrap_or_default())
    } else {
        Devices::Whole(greedy_devices(node.gpus, pod.num_gpu, pod.gpu_milli))
    }
}

/// Several shares of less than a GPU each (absent from openb): the feasibility walk's devices,
/// in index order, a device repeated while its remainder still covers the share.
pub fn greedy_devices(gpus: &[u32], num: u32, milli: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(num as usize);
    for (d, &left) in gpus.iter().enumerate() {
        let mut l = left;
        while l >= milli && (out.len() as u32) < num {
            out.push(d as u8);
            l -= milli;
        }
    }
    out
}
