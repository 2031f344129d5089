//! A gang's rendezvous: who each replica is in its gang and where its peers are, worked out
//! from where the replicas are placed and how the nodes' agents registered. The control plane
//! does this for every `start` it queues; the agent hands the result to the workload
//! (docs/agent.md, "Gangs: rank, world size and peers").
//!
//! The rules:
//! - rank = the replica's index; world size = the job's replicas;
//! - peers = the address of each replica's node, in rank order (one entry per replica, so two
//!   replicas on one node repeat its address);
//! - node rank = the index of the replica's node among the gang's distinct nodes, numbered in
//!   rank order of their first replica (rank 0's node is node 0);
//! - a node's address is what its agent registered (`--advertise-address`, or the address it
//!   reaches the control plane from), else its hostname; a node whose agent has not registered
//!   yet has none, and the gang waits to start, unless the whole gang sits on that one node,
//!   where the loopback address reaches every peer;
//! - master = rank 0's node address, and the port is [`PortRange::port`] of the job and of rank
//!   0's attempt: the same for every replica of one run, unchanged when an elastic gang places
//!   lost replicas again (rank 0 ran on), new when the whole gang restarts (a new attempt).

use std::collections::BTreeMap;

use crate::agent::Rendezvous;
use crate::ids::{JobId, NodeId};

/// Where rank 0 of a gang listens for its rendezvous: a port in `base .. base + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub base: u16,
    pub count: u16,
}

impl Default for PortRange {
    /// 29500 (PyTorch's customary `MASTER_PORT`) and the 2000 ports after it, below Linux's
    /// ephemeral range (32768 and up) so an outgoing connection never holds one.
    fn default() -> Self {
        PortRange {
            base: 29_500,
            count: 2_000,
        }
    }
}

impl PortRange {
    /// Why the range is unusable, if it is: it must hold at least one port, all of them
    /// unprivileged (1024 and up) and at most 65535.
    pub fn check(&self) -> Result<(), String> {
        if self.count == 0 {
            return Err("must hold at least one port".into());
        }
        if self.base < 1024 {
            return Err(format!(
                "starts at {}, a privileged port; use 1024 or more",
                self.base
            ));
        }
        if u32::from(self.base) + u32::from(self.count) - 1 > u32::from(u16::MAX) {
            return Err(format!(
                "{} ports from {} go past 65535",
                self.count, self.base
            ));
        }
        Ok(())
    }

    /// The port of one run of a job: `base + FNV-1a(job id, run) mod count`. Stable (across
    /// processes, versions and platforms) so every replica of the run gets the same one, and
    /// spread so that two gangs whose rank 0 shares a node rarely meet (two gangs: 1 in
    /// `count`), and a run that follows another on the same node (its old rank 0 may still be
    /// stopping) almost always gets another port.
    pub fn port(&self, job: JobId, run: u32) -> u16 {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut h = OFFSET;
        for b in job.as_uuid().as_bytes().iter().chain(&run.to_le_bytes()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(PRIME);
        }
        let count = u64::from(self.count.max(1));
        // h % count < count <= 65536 - base, so the sum fits.
        self.base
            .saturating_add(u16::try_from(h % count).unwrap_or(0))
    }
}

/// How a node's agent registered, as far as its address goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentAddress {
    /// The private address it registered (`RegisterRequest::address`).
    pub address: Option<String>,
    pub hostname: String,
}

/// One replica of the gang's current run, where it is placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub replica: u32,
    /// The attempt its allocation belongs to (replicas of an elastic gang placed again have a
    /// later one than the survivors).
    pub attempt: u32,
    pub node: NodeId,
    /// `None` while the node's agent has not registered.
    pub agent: Option<AgentAddress>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RendezvousError {
    #[error("the gang has no replicas")]
    Empty,
    #[error("replica {replica} is not in a gang of {world_size}")]
    OutOfRange { replica: u32, world_size: u32 },
    #[error("replica {0} is placed twice")]
    Duplicate(u32),
    #[error("replica {0} is not placed")]
    Missing(u32),
    /// Wait: the node's agent will register, and until it does none of its replicas can start.
    #[error(
        "node {node} (replica {replica}) has no registered agent yet, so its address is not known"
    )]
    Unregistered { replica: u32, node: NodeId },
}

/// A gang that can form: what its replicas' rendezvous are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gang {
    /// The node rank of each replica, in rank order.
    pub node_ranks: Vec<u32>,
    /// The address of each replica's node, in rank order.
    pub peers: Vec<String>,
    pub master_port: u16,
}

impl Gang {
    /// The rendezvous of one replica; `None` if it is not in the gang.
    pub fn rendezvous(&self, rank: u32) -> Option<Rendezvous> {
        let node_rank = *self.node_ranks.get(usize::try_from(rank).ok()?)?;
        Some(Rendezvous {
            rank,
            world_size: u32::try_from(self.peers.len()).unwrap_or(u32::MAX),
            node_rank,
            peers: self.peers.clone(),
            master_addr: self.peers.first().cloned().unwrap_or_default(),
            master_port: self.master_port,
        })
    }

    /// Every replica's rendezvous, in rank order.
    pub fn all(&self) -> Vec<Rendezvous> {
        (0..u32::try_from(self.peers.len()).unwrap_or(0))
            .filter_map(|r| self.rendezvous(r))
            .collect()
    }
}

/// The gang of `world_size` replicas made of `members` (every replica placed, once), or why it
/// cannot form. See the module's rules.
pub fn gang(
    job: JobId,
    world_size: u32,
    members: &[Member],
    ports: PortRange,
) -> Result<Gang, RendezvousError> {
    if world_size == 0 {
        return Err(RendezvousError::Empty);
    }
    let mut by_rank: BTreeMap<u32, &Member> = BTreeMap::new();
    for m in members {
        if m.replica >= world_size {
            return Err(RendezvousError::OutOfRange {
                replica: m.replica,
                world_size,
            });
        }
        if by_rank.insert(m.replica, m).is_some() {
            return Err(RendezvousError::Duplicate(m.replica));
        }
    }
    if let Some(missing) = (0..world_size).find(|r| !by_rank.contains_key(r)) {
        return Err(RendezvousError::Missing(missing));
    }
    // Every rank is present, so the map holds 0..world_size in order.
    let ranked: Vec<&Member> = by_rank.into_values().collect();
    let mut node_ranks: Vec<NodeId> = Vec::new();
    let mut node_rank_of = Vec::with_capacity(ranked.len());
    for m in &ranked {
        let i = match node_ranks.iter().position(|n| *n == m.node) {
            Some(i) => i,
            None => {
                node_ranks.push(m.node);
                node_ranks.len() - 1
            }
        };
        node_rank_of.push(u32::try_from(i).unwrap_or(u32::MAX));
    }
    let one_node = node_ranks.len() == 1;
    let peers = ranked
        .iter()
        .map(|m| match &m.agent {
            Some(a) => Ok(a
                .address
                .clone()
                .filter(|s| !s.trim().is_empty())
                .unwrap_or_else(|| a.hostname.clone())),
            None if one_node => Ok("127.0.0.1".to_owned()),
            None => Err(RendezvousError::Unregistered {
                replica: m.replica,
                node: m.node,
            }),
        })
        .collect::<Result<Vec<String>, _>>()?;
    Ok(Gang {
        node_ranks: node_rank_of,
        peers,
        master_port: ports.port(job, ranked[0].attempt),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn job() -> JobId {
        JobId::new_at(1_800_000_000_000, 42)
    }

    fn node(n: u64) -> NodeId {
        NodeId::new_at(1_800_000_000_000, u128::from(n) << 32)
    }

    fn registered(address: Option<&str>, hostname: &str) -> Option<AgentAddress> {
        Some(AgentAddress {
            address: address.map(str::to_owned),
            hostname: hostname.to_owned(),
        })
    }

    fn member(replica: u32, attempt: u32, n: u64, agent: Option<AgentAddress>) -> Member {
        Member {
            replica,
            attempt,
            node: node(n),
            agent,
        }
    }

    fn at(n: u64) -> Option<AgentAddress> {
        registered(Some(&format!("10.0.0.{n}")), &format!("host-{n}"))
    }

    /// (rank, node rank) of each replica, and the peers, of a gang that forms.
    fn formed(world: u32, members: &[Member]) -> (Vec<(u32, u32)>, Vec<String>) {
        let g = gang(job(), world, members, PortRange::default())
            .expect("forms")
            .all();
        (
            g.iter().map(|r| (r.rank, r.node_rank)).collect(),
            g[0].peers.clone(),
        )
    }

    #[test]
    fn gangs_are_numbered_in_rank_order_with_their_nodes_addresses() {
        let s = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        // (what, world size, members, (rank, node rank) of each, peers)
        type Case = (&'static str, u32, Vec<Member>, Vec<(u32, u32)>, Vec<String>);
        let cases: Vec<Case> = vec![
            (
                "one replica",
                1,
                vec![member(0, 1, 1, at(1))],
                vec![(0, 0)],
                s(&["10.0.0.1"]),
            ),
            (
                "two nodes, listed out of order",
                2,
                vec![member(1, 1, 2, at(2)), member(0, 1, 1, at(1))],
                vec![(0, 0), (1, 1)],
                s(&["10.0.0.1", "10.0.0.2"]),
            ),
            (
                "four replicas on two nodes, interleaved",
                4,
                vec![
                    member(0, 1, 7, at(7)),
                    member(1, 1, 3, at(3)),
                    member(2, 1, 7, at(7)),
                    member(3, 1, 3, at(3)),
                ],
                vec![(0, 0), (1, 1), (2, 0), (3, 1)],
                s(&["10.0.0.7", "10.0.0.3", "10.0.0.7", "10.0.0.3"]),
            ),
            (
                "nodes numbered by their first replica, not by id",
                3,
                vec![
                    member(0, 1, 9, at(9)),
                    member(1, 1, 9, at(9)),
                    member(2, 1, 1, at(1)),
                ],
                vec![(0, 0), (1, 0), (2, 1)],
                s(&["10.0.0.9", "10.0.0.9", "10.0.0.1"]),
            ),
            (
                "an agent that gave no address: its hostname",
                2,
                vec![
                    member(0, 1, 1, registered(None, "gpu-a.internal")),
                    member(1, 1, 2, registered(Some("  "), "gpu-b.internal")),
                ],
                vec![(0, 0), (1, 1)],
                s(&["gpu-a.internal", "gpu-b.internal"]),
            ),
            (
                "a gang on one node whose agent has not registered: loopback",
                2,
                vec![member(0, 1, 1, None), member(1, 1, 1, None)],
                vec![(0, 0), (1, 0)],
                s(&["127.0.0.1", "127.0.0.1"]),
            ),
            (
                "an IPv6 address as given",
                2,
                vec![
                    member(0, 1, 1, registered(Some("fd00::1"), "a")),
                    member(1, 1, 2, registered(Some("fd00::2"), "b")),
                ],
                vec![(0, 0), (1, 1)],
                s(&["fd00::1", "fd00::2"]),
            ),
        ];
        for (what, world, members, ranks, peers) in cases {
            assert_eq!(formed(world, &members), (ranks, peers), "{what}");
            let g = gang(job(), world, &members, PortRange::default())
                .expect("forms")
                .all();
            for r in &g {
                assert_eq!(r.world_size, world, "{what}");
                assert_eq!(r.master_addr, r.peers[0], "{what}");
                assert_eq!(r.master_port, g[0].master_port, "{what}");
            }
        }
    }

    #[test]
    fn a_gang_that_cannot_form_says_why() {
        let cases: Vec<(&str, u32, Vec<Member>, RendezvousError)> = vec![
            ("no replicas", 0, vec![], RendezvousError::Empty),
            (
                "a replica missing",
                3,
                vec![member(0, 1, 1, at(1)), member(2, 1, 2, at(2))],
                RendezvousError::Missing(1),
            ),
            (
                "a replica twice",
                2,
                vec![
                    member(0, 1, 1, at(1)),
                    member(1, 1, 2, at(2)),
                    member(1, 2, 3, at(3)),
                ],
                RendezvousError::Duplicate(1),
            ),
            (
                "a replica beyond the gang",
                2,
                vec![member(0, 1, 1, at(1)), member(2, 1, 2, at(2))],
                RendezvousError::OutOfRange {
                    replica: 2,
                    world_size: 2,
                },
            ),
            (
                "a peer on another node without a registered agent",
                2,
                vec![member(0, 1, 1, at(1)), member(1, 1, 2, None)],
                RendezvousError::Unregistered {
                    replica: 1,
                    node: node(2),
                },
            ),
        ];
        for (what, world, members, err) in cases {
            assert_eq!(
                gang(job(), world, &members, PortRange::default()),
                Err(err),
                "{what}"
            );
        }
    }

    #[test]
    fn the_port_follows_rank_zeros_attempt() {
        let ports = PortRange::default();
        let first = [
            member(0, 1, 1, at(1)),
            member(1, 1, 2, at(2)),
            member(2, 1, 3, at(3)),
        ];
        let port = |members: &[Member]| gang(job(), 3, members, ports).expect("forms").master_port;
        let run1 = port(&first);
        assert_eq!(run1, ports.port(job(), 1));
        let g = gang(job(), 3, &first, ports).expect("forms");
        assert_eq!(g.rendezvous(1), Some(g.all()[1].clone()));
        assert_eq!(g.rendezvous(3), None, "no rank 3 in a gang of three");
        // Elastic: replica 2 placed again on node 4 (attempt 2), rank 0 ran on: same port, the
        // new node among the peers.
        let mut refilled = first.clone();
        refilled[2] = member(2, 2, 4, at(4));
        let g = gang(job(), 3, &refilled, ports).expect("forms").all();
        assert_eq!(g[2].master_port, run1);
        assert_eq!(g[2].peers, ["10.0.0.1", "10.0.0.2", "10.0.0.4"]);
        assert_eq!((g[0].rank, g[1].rank), (0, 1), "the survivors' ranks");
        // Rank 0 itself placed again: a new master and a new port.
        let mut new_master = first.clone();
        new_master[0] = member(0, 2, 5, at(5));
        let g = gang(job(), 3, &new_master, ports).expect("forms").all();
        assert_eq!(g[1].master_addr, "10.0.0.5");
        assert_eq!(g[1].master_port, ports.port(job(), 2));
        // The whole gang restarted on new nodes: new addresses, the new attempt's port.
        let restarted = [
            member(0, 2, 6, at(6)),
            member(1, 2, 7, at(7)),
            member(2, 2, 8, at(8)),
        ];
        let g = gang(job(), 3, &restarted, ports).expect("forms").all();
        assert_eq!(g[0].peers, ["10.0.0.6", "10.0.0.7", "10.0.0.8"]);
        assert_eq!(g[0].master_port, ports.port(job(), 2));
        assert_ne!(
            ports.port(job(), 1),
            ports.port(job(), 2),
            "this job's two runs differ"
        );
    }

    #[test]
    fn ports_are_stable_and_spread() {
        let ports = PortRange::default();
        // Pinned: the port must not change between versions (a rolling upgrade of the control
        // plane mid-run would split a gang).
        assert_eq!(
            (ports.port(job(), 1), ports.port(job(), 2)),
            (30_750, 30_829)
        );
        let pinned = PortRange {
            base: 40_000,
            count: 1,
        };
        assert_eq!(pinned.port(job(), 7), 40_000);
        let distinct: BTreeSet<u16> = (0..200u64)
            .map(|n| ports.port(JobId::new_at(1_800_000_000_000, u128::from(n) << 32), 1))
            .collect();
        assert!(distinct.len() > 180, "{} of 200", distinct.len());
    }

    #[test]
    fn port_ranges_are_checked() {
        assert!(PortRange::default().check().is_ok());
        let bad = [
            PortRange {
                base: 29_500,
                count: 0,
            },
            PortRange {
                base: 80,
                count: 10,
            },
            PortRange {
                base: 65_000,
                count: 600,
            },
        ];
        for r in bad {
            assert!(r.check().is_err(), "{r:?}");
        }
        assert!(
            PortRange {
                base: 65_535,
                count: 1
            }
            .check()
            .is_ok()
        );
    }

    proptest! {
        #[test]
        fn every_gang_that_forms_is_consistent(
            placement in prop::collection::vec((0u64..6, 1u32..4), 1..24),
            base in 1024u16..60_000,
            count in 1u16..4000,
        ) {
            let ports = PortRange { base, count: count.min(65_535 - base + 1) };
            let world = u32::try_from(placement.len()).unwrap_or(0);
            // Listed backwards, so order of the input does not matter.
            let members: Vec<Member> = placement
                .iter()
                .enumerate()
                .rev()
                .map(|(r, (n, attempt))| member(u32::try_from(r).unwrap_or(0), *attempt, *n, at(*n)))
                .collect();
            let g = gang(job(), world, &members, ports).expect("forms").all();
            prop_assert_eq!(g.len(), placement.len());
            let mut highest: Option<u32> = None;
            let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
            for (i, r) in g.iter().enumerate() {
                let (n, _) = placement[i];
                prop_assert_eq!(r.rank as usize, i);
                prop_assert_eq!(r.world_size, world);
                prop_assert_eq!(&r.peers, &g[0].peers);
                prop_assert_eq!(r.peers.len(), placement.len());
                prop_assert_eq!(&r.peers[i], &format!("10.0.0.{n}"));
                prop_assert_eq!(&r.master_addr, &r.peers[0]);
                prop_assert_eq!(r.master_port, ports.port(job(), placement[0].1));
                prop_assert!(r.master_port >= base && u32::from(r.master_port) < u32::from(base) + u32::from(ports.count));
                // Node ranks: one per node, handed out 0, 1, 2… in rank order.
                match seen.get(&n) {
                    Some(nr) => prop_assert_eq!(r.node_rank, *nr),
                    None => {
                        prop_assert_eq!(r.node_rank, highest.map_or(0, |h| h + 1));
                        seen.insert(n, r.node_rank);
                        highest = Some(r.node_rank);
                    }
                }
            }
            let node_ranks: BTreeSet<u32> = g.iter().map(|r| r.node_rank).collect();
            prop_assert_eq!(node_ranks, (0..u32::try_from(seen.len()).unwrap_or(0)).collect::<BTreeSet<_>>());
        }
    }
}
