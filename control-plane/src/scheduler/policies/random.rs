//! Random: every feasible node equally likely (openb-protocol.md §6.1).
//!
//! The published simulator's Random cannot be reproduced bit for bit (its feasible-node order
//! comes from a parallel filter), so it is compared by its mean over seeds. Here a node's score
//! is a hash of (seed, decision number, node tie-break key): the minimum over the feasible
//! nodes is a uniform pick, and the run is reproducible from its seed. A share goes to a
//! uniformly chosen device among those with room, as the simulator's `random` GPU selection.

use crate::scheduler::packing::{
    Choice, Devices, PackNode, PackPod, PackingPolicy, Score, ScoreCtx,
};

use super::best_devices;

/// Uniformly random placement.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomPolicy;

/// splitmix64's finalizer: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn draw(ctx: &ScoreCtx, node: u32, stream: u64) -> u64 {
    let mut h = mix(ctx.seed ^ 0x9e37_79b9_7f4a_7c15);
    h = mix(h ^ ctx.seq);
    h = mix(h ^ u64::from(node));
    mix(h ^ stream)
}

impl PackingPolicy for RandomPolicy {
    fn name(&self) -> &'static str {
        "random"
    }

    fn score(&self, node: &PackNode<'_>, pod: &PackPod<'_>, ctx: &ScoreCtx) -> Choice {
        let devices = if pod.is_share() {
            let fits: Vec<u8> = node
                .gpus
                .iter()
                .enumerate()
                .filter(|(_, l)| **l >= pod.gpu_milli)
                .map(|(d, _)| d as u8)
                .collect();
            let pick = draw(ctx, node.tiebreak, 1) % fits.len().max(1) as u64;
            Devices::Share(fits.get(pick as usize).copied().unwrap_or(0))
        } else {
            best_devices(node, pod)
        };
        Choice {
            score: Score::new((draw(ctx, node.tiebreak, 0) >> 1) as i64),
            devices,
        }
    }

    fn uses_ctx(&self) -> bool {
        true
    }
}
