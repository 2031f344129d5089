//! The cloud sync and orphan sweep, the capacity loop's first step: each provider's instances
//! carrying the cluster tag, against the live nodes in the store. [`diff`] is pure: it says
//! what to do, and [`CapacityLoop::sync`] does it.
//!
//! - A simulated node whose instance runs counts as ready (it has no agent of its own:
//!   `ready_on_running`).
//! - A node whose instance is gone, or stopped, is terminated in the store; a spot node gone
//!   unasked (no notice was counted for it) is an interruption of its pool, and its offer is
//!   set aside. A node bought in the last two minutes may not be listed yet (the clouds'
//!   listings are eventually consistent) and is left alone.
//! - A node still `requested` with no instance recorded is one whose buyer stopped (a crash, a
//!   lost leadership) around its cloud call. The instance carrying the node's id in its tags is
//!   adopted: recorded on the node, which goes on booting, so the work it was bought for is not
//!   bought twice and nothing is paid for twice. With none listed after the listing lag, the
//!   cloud call never happened and the node is closed.
//! - An instance with the cluster tag that no live node knows, older than `orphan_grace`, is an
//!   orphan (a node row lost, or an instance bought twice) and is terminated.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use spotplane_core::{Market, NodeId, NodeState};
use spotplane_providers::{CloudProvider, Instance, InstanceState, tags};

use super::{CapacityLoop, CapacityReport, LIVE};
use crate::model::Node;
use crate::store::StoreError;

/// How long a new node's instance may be missing from its cloud's listing.
const LISTING_LAG: Duration = Duration::minutes(2);

/// What the sync does about one node or instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncAction {
    /// A simulated node's instance runs: the node is ready.
    Ready(NodeId),
    /// The node's instance is gone. `interrupted` is the offer of a spot pool that took it
    /// unasked (count an interruption, set the offer aside).
    Vanished {
        node: NodeId,
        interrupted: Option<String>,
    },
    /// A `requested` node's instance, found by the node id in its tags: record it.
    Adopt { node: NodeId, instance: String },
    /// A `requested` node with no instance anywhere after the listing lag: its cloud call
    /// never happened.
    NeverBought(NodeId),
    /// An instance no live node knows, past the grace: terminate it.
    Orphan(String),
}

/// How [`diff`] reads one cloud's listing.
#[derive(Debug, Clone, Copy)]
pub struct SyncRules {
    /// The cloud is simulated and its nodes count as ready once running.
    pub ready_on_running: bool,
    pub orphan_grace: Duration,
}

/// What to do to bring the store in step with one cloud's `instances`: the cloud's own nodes
/// among the live `nodes` (all clouds', for recognising orphans), in node order, then the
/// orphans in listing order. `noticed`: spot nodes whose interruption was already counted when
/// their notice came.
pub fn diff(
    cloud: spotplane_core::Cloud,
    nodes: &[Node],
    instances: &[Instance],
    noticed: &HashSet<NodeId>,
    rules: SyncRules,
    now: DateTime<Utc>,
) -> Vec<SyncAction> {
    let by_id: HashMap<&str, &Instance> = instances
        .iter()
        .map(|i| (i.provider_id.as_str(), i))
        .collect();
    let mut out = Vec::new();
    let mut adopted: HashSet<&str> = HashSet::new();
    let gone = |i: &Instance| {
        matches!(
            i.state,
            InstanceState::Terminated | InstanceState::Terminating
        )
    };
    for n in nodes.iter().filter(|n| n.cloud == cloud) {
        let Some(pid) = &n.provider_instance_id else {
            if n.state == NodeState::Requested {
                match instances
                    .iter()
                    .find(|i| i.node_id == Some(n.id) && !gone(i))
                {
                    Some(i) => {
                        adopted.insert(&i.provider_id);
                        out.push(SyncAction::Adopt {
                            node: n.id,
                            instance: i.provider_id.clone(),
                        });
                    }
                    None if now - n.created_at >= LISTING_LAG => {
                        out.push(SyncAction::NeverBought(n.id));
                    }
                    None => {}
                }
            }
            continue;
        };
        match by_id.get(pid.as_str()).map(|i| i.state) {
            Some(InstanceState::Running)
                if rules.ready_on_running
                    && matches!(n.state, NodeState::Booting | NodeState::Requested) =>
            {
                out.push(SyncAction::Ready(n.id));
            }
            None if now - n.created_at < LISTING_LAG => {}
            None
            | Some(
                InstanceState::Terminated | InstanceState::Terminating | InstanceState::Stopped,
            ) => {
                let interrupted = (n.market == Market::Spot && !noticed.contains(&n.id))
                    .then(|| n.offer_id.clone())
                    .flatten();
                out.push(SyncAction::Vanished {
                    node: n.id,
                    interrupted,
                });
            }
            _ => {}
        }
    }
    let mut known: HashSet<&str> = nodes
        .iter()
        .filter_map(|n| n.provider_instance_id.as_deref())
        .collect();
    known.extend(adopted);
    for i in instances {
        let old = i.launched_at.is_some_and(|t| now - t > rules.orphan_grace);
        if !known.contains(i.provider_id.as_str()) && !gone(i) && old {
            out.push(SyncAction::Orphan(i.provider_id.clone()));
        }
    }
    out
}

impl CapacityLoop {
    /// Records what a cloud's listing says of its nodes' instances — their launch and, once
    /// they have ended, their end — for the ledger to bill as the cloud does. Terminated nodes
    /// included: a released instance's end is the cloud's, a moment after the control plane's
    /// call, and the ledger settles behind by `finance.settle`, so it bills the cloud's.
    async fn record_cloud_times(&mut self, instances: &[Instance]) -> Result<(), StoreError> {
        for i in instances {
            let Some(node) = i.node_id else { continue };
            let known = self.cloud_timed.get(&node).copied();
            let ended = i.ended_at.is_some();
            if known == Some(true) || (known == Some(false) && !ended) {
                continue;
            }
            self.store
                .record_cloud_times(node, i.launched_at, i.ended_at)
                .await?;
            self.cloud_timed.insert(node, ended);
        }
        Ok(())
    }

    /// Brings the store in step with what the clouds say, and sweeps orphans. A cloud whose
    /// listing fails is not synced this round.
    pub(super) async fn sync(
        &mut self,
        now: DateTime<Utc>,
        report: &mut CapacityReport,
    ) -> Result<(), StoreError> {
        let nodes = self.store.list_nodes(&LIVE).await?;
        let by_cluster =
            BTreeMap::from([(tags::CLUSTER.to_owned(), self.settings.cluster.clone())]);
        let providers: Vec<Arc<dyn CloudProvider>> = self.providers.all.clone();
        for p in providers {
            let cloud = p.cloud();
            let instances = match p.list_instances(&by_cluster).await {
                Ok(i) => i,
                Err(e) => {
                    tracing::warn!(%cloud, error = %e, "listing instances failed; no sync this round");
                    continue;
                }
            };
            let rules = SyncRules {
                ready_on_running: self.settings.ready_on_running
                    && self.providers.sim(cloud).is_some(),
                orphan_grace: self.settings.orphan_grace,
            };
            self.record_cloud_times(&instances).await?;
            let there: Vec<NodeId> = instances
                .iter()
                .filter(|i| i.ended_at.is_none() && i.state != InstanceState::Terminated)
                .filter_map(|i| i.node_id)
                .collect();
            self.store.record_cloud_seen(&there, now).await?;
            for action in diff(cloud, &nodes, &instances, &self.noticed, rules, now) {
                match action {
                    SyncAction::Ready(node) => {
                        self.store
                            .transition_node(node, NodeState::Ready, None, now)
                            .await?;
                        report.ready += 1;
                    }
                    SyncAction::Vanished { node, interrupted } => {
                        if let Some(o) = interrupted {
                            self.pools.interrupted(&o);
                            self.unavailable
                                .mark(&o, now, self.settings.capacity_error_ttl);
                        }
                        self.store
                            .transition_node(
                                node,
                                NodeState::Terminated,
                                Some("the cloud took the instance".into()),
                                now,
                            )
                            .await?;
                        report.vanished += 1;
                    }
                    SyncAction::Adopt { node, instance } => {
                        tracing::info!(%cloud, %node, %instance, "adopted the instance of a node whose buyer stopped before recording it");
                        self.store.set_node_instance(node, &instance, now).await?;
                        self.store
                            .transition_node(node, NodeState::Booting, None, now)
                            .await?;
                        report.adopted += 1;
                    }
                    SyncAction::NeverBought(node) => {
                        tracing::info!(%cloud, %node, "closing a node whose buyer stopped before its cloud call");
                        self.store
                            .transition_node(
                                node,
                                NodeState::Terminated,
                                Some(
                                    "never bought: the control plane stopped before its cloud call"
                                        .into(),
                                ),
                                now,
                            )
                            .await?;
                    }
                    SyncAction::Orphan(instance) => match p.terminate(&instance).await {
                        Ok(()) => {
                            tracing::info!(%cloud, %instance, "orphan terminated");
                            report.orphans += 1;
                        }
                        Err(e) => {
                            tracing::warn!(%cloud, %instance, error = %e, "orphan not terminated")
                        }
                    },
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use chrono::{DateTime, Duration, Utc};
    use spotplane_core::{Cloud, Market, Micros, NodeId, NodeState};
    use spotplane_providers::{Instance, InstanceState};

    use super::{SyncAction, SyncRules, diff};
    use crate::model::Node;

    fn t0() -> DateTime<Utc> {
        "2026-12-04T12:00:00Z".parse().unwrap_or_default()
    }

    fn node(n: u128, state: NodeState, market: Market, age_min: i64) -> Node {
        Node {
            id: NodeId::from_uuid(uuid::Uuid::from_u128(n)),
            name: format!("n{n}"),
            cloud: Cloud::Gcp,
            region: "us-central1".into(),
            zone: "us-central1-a".into(),
            instance_type: "a2-highgpu-1g".into(),
            market,
            state,
            state_reason: None,
            provider_instance_id: Some(format!("i-{n}")),
            offer_id: Some(format!("offer-{n}")),
            hourly_price: Micros(1_000_000),
            on_demand_price: Micros(3_000_000),
            cpu_milli: 12_000,
            memory_mib: 85_000,
            gpus: vec![],
            labels: BTreeMap::new(),
            notice_deadline: None,
            created_at: t0() - Duration::minutes(age_min),
            ready_at: None,
            terminated_at: None,
        }
    }

    fn instance(id: &str, state: InstanceState, age_min: i64) -> Instance {
        Instance {
            provider_id: id.into(),
            node_id: None,
            zone: "us-central1-a".into(),
            instance_type: "a2-highgpu-1g".into(),
            market: Market::Spot,
            state,
            launched_at: Some(t0() - Duration::minutes(age_min)),
            ended_at: None,
            tags: BTreeMap::new(),
        }
    }

    const SIM: SyncRules = SyncRules {
        ready_on_running: true,
        orphan_grace: Duration::minutes(10),
    };
    const REAL: SyncRules = SyncRules {
        ready_on_running: false,
        orphan_grace: Duration::minutes(10),
    };

    /// (case, node, what the cloud lists for it, rules, noticed, expected)
    type Case = (
        &'static str,
        Node,
        Option<InstanceState>,
        SyncRules,
        bool,
        Vec<SyncAction>,
    );

    #[test]
    fn each_node_and_instance_gets_its_action() {
        use InstanceState::{Pending, Running, Stopped, Terminated, Terminating};
        use NodeState::{Booting, Draining, Ready, Requested};
        let id = |n: u128| NodeId::from_uuid(uuid::Uuid::from_u128(n));
        let vanished = |n: u128, interrupted: Option<&str>| SyncAction::Vanished {
            node: id(n),
            interrupted: interrupted.map(str::to_owned),
        };
        let table: Vec<Case> = vec![
            (
                "booting sim node running: ready",
                node(1, Booting, Market::Spot, 5),
                Some(Running),
                SIM,
                false,
                vec![SyncAction::Ready(id(1))],
            ),
            (
                "requested sim node running: ready",
                node(1, Requested, Market::Spot, 5),
                Some(Running),
                SIM,
                false,
                vec![SyncAction::Ready(id(1))],
            ),
            (
                "a real cloud's node waits for its agent",
                node(1, Booting, Market::Spot, 5),
                Some(Running),
                REAL,
                false,
                vec![],
            ),
            (
                "ready and running: nothing",
                node(1, Ready, Market::Spot, 5),
                Some(Running),
                SIM,
                false,
                vec![],
            ),
            (
                "pending: nothing",
                node(1, Booting, Market::Spot, 5),
                Some(Pending),
                SIM,
                false,
                vec![],
            ),
            (
                "new and not listed yet: nothing",
                node(1, Booting, Market::Spot, 1),
                None,
                SIM,
                false,
                vec![],
            ),
            (
                "spot, not listed: an interruption",
                node(1, Ready, Market::Spot, 5),
                None,
                SIM,
                false,
                vec![vanished(1, Some("offer-1"))],
            ),
            (
                "spot, terminated: an interruption",
                node(1, Ready, Market::Spot, 5),
                Some(Terminated),
                SIM,
                false,
                vec![vanished(1, Some("offer-1"))],
            ),
            (
                "spot, stopped: an interruption",
                node(1, Ready, Market::Spot, 5),
                Some(Stopped),
                REAL,
                false,
                vec![vanished(1, Some("offer-1"))],
            ),
            (
                "spot, terminating after its notice: counted then",
                node(1, Draining, Market::Spot, 5),
                Some(Terminating),
                SIM,
                true,
                vec![vanished(1, None)],
            ),
            (
                "on-demand gone: no interruption",
                node(1, Ready, Market::OnDemand, 5),
                None,
                SIM,
                false,
                vec![vanished(1, None)],
            ),
        ];
        for (case, n, listed, rules, noticed, want) in table {
            let instances: Vec<Instance> =
                listed.map(|s| instance("i-1", s, 5)).into_iter().collect();
            let noticed: HashSet<NodeId> = if noticed {
                HashSet::from([n.id])
            } else {
                HashSet::new()
            };
            let got = diff(Cloud::Gcp, &[n], &instances, &noticed, rules, t0());
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn a_requested_node_without_its_instance_recorded_adopts_it_or_is_closed() {
        let id = |n: u128| NodeId::from_uuid(uuid::Uuid::from_u128(n));
        let unrecorded = |n: u128, age_min: i64| {
            let mut node = node(n, NodeState::Requested, Market::Spot, age_min);
            node.provider_instance_id = None;
            node
        };
        let tagged = |pid: &str, n: u128, state: InstanceState| {
            let mut i = instance(pid, state, 20);
            i.node_id = Some(id(n));
            i
        };
        // (case, node, listing, expected)
        let table: Vec<(&str, Node, Vec<Instance>, Vec<SyncAction>)> = vec![
            (
                "its instance is listed with its id: adopted, and no orphan though old",
                unrecorded(1, 20),
                vec![tagged("i-9", 1, InstanceState::Running)],
                vec![SyncAction::Adopt {
                    node: id(1),
                    instance: "i-9".into(),
                }],
            ),
            (
                "another node's instance is not its own",
                unrecorded(1, 1),
                vec![tagged("i-9", 2, InstanceState::Pending)],
                vec![SyncAction::Orphan("i-9".into())],
            ),
            (
                "nothing listed yet, within the listing lag: wait",
                unrecorded(1, 1),
                vec![],
                vec![],
            ),
            (
                "nothing listed after the lag: never bought",
                unrecorded(1, 3),
                vec![],
                vec![SyncAction::NeverBought(id(1))],
            ),
            (
                "only a terminated instance: never bought (nothing to adopt)",
                unrecorded(1, 3),
                vec![tagged("i-9", 1, InstanceState::Terminated)],
                vec![SyncAction::NeverBought(id(1))],
            ),
        ];
        for (case, n, listed, want) in table {
            let got = diff(Cloud::Gcp, &[n], &listed, &HashSet::new(), REAL, t0());
            assert_eq!(got, want, "{case}");
        }
        // A booting node with no instance recorded is not this case (it cannot happen, and
        // closing it would be wrong): only `requested` nodes are adopted or closed.
        let mut booting = unrecorded(1, 30);
        booting.state = NodeState::Booting;
        assert_eq!(
            diff(Cloud::Gcp, &[booting], &[], &HashSet::new(), REAL, t0()),
            []
        );
    }

    #[test]
    fn orphans_are_old_live_instances_no_node_knows() {
        let known = node(1, NodeState::Ready, Market::Spot, 30);
        let mut other_cloud = node(2, NodeState::Ready, Market::Spot, 30);
        other_cloud.cloud = Cloud::Aws;
        other_cloud.provider_instance_id = Some("i-aws".into());
        let instances = vec![
            instance("i-1", InstanceState::Running, 30),
            instance("i-orphan", InstanceState::Running, 11),
            instance("i-young", InstanceState::Running, 9),
            instance("i-going", InstanceState::Terminating, 60),
            instance("i-gone", InstanceState::Terminated, 60),
            instance("i-stopped", InstanceState::Stopped, 60),
            // Known by a node of another cloud's listing: not an orphan.
            instance("i-aws", InstanceState::Running, 60),
        ];
        let got = diff(
            Cloud::Gcp,
            &[known, other_cloud],
            &instances,
            &HashSet::new(),
            REAL,
            t0(),
        );
        assert_eq!(
            got,
            [
                SyncAction::Orphan("i-orphan".into()),
                SyncAction::Orphan("i-stopped".into())
            ]
        );
    }
}
