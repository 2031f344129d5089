//! The provisioner: each buy of the plan is a node row (`requested`, idempotency token = the
//! node id) and one `provision` call per node, walking the buy's fallback chain on typed
//! errors ([`reaction`]): no room or a price above the bid sets the offer aside for
//! `capacity_error_ttl` and tries the next; quota, credentials, throttling and network trouble
//! stop buying on that cloud for the rest of the round; a request the cloud refuses gives up
//! that buy only. A gang whose nodes cannot all be bought is given back whole and set aside.
//! Also here: giving nodes back, and the user data a real cloud's node boots with.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use spotplane_core::{Cloud, NodeId, NodeState};
use spotplane_providers::{ProviderError, ProvisionRequest, tags};
use tracing::Instrument;

use super::{CapacityLoop, CapacityReport};
use crate::planner;
use crate::store::{NewGpu, NewNode, StoreError, new_uuid};

/// What the provisioner does after a provider refused to provision an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaction {
    /// The offer has no room now, or its price is above the bid: set it aside for
    /// `capacity_error_ttl` and try the buy's next fallback.
    NextOffer,
    /// Every call to this cloud would fail the same way this round (a quota reached, bad
    /// credentials, throttling, network trouble): buy nothing more on it until the next round.
    StopCloud,
    /// This request cannot be made (an offer that vanished, a request the cloud calls
    /// malformed): give up this buy; other buys on the cloud go on.
    GiveUp,
}

/// The provisioner's reaction to each typed provider error.
pub fn reaction(e: &ProviderError) -> Reaction {
    match e {
        ProviderError::InsufficientCapacity { .. } | ProviderError::PriceTooLow(_) => {
            Reaction::NextOffer
        }
        ProviderError::Quota(_)
        | ProviderError::Auth(_)
        | ProviderError::Throttled { .. }
        | ProviderError::Transient(_) => Reaction::StopCloud,
        ProviderError::NotFound(_) | ProviderError::InvalidRequest(_) => Reaction::GiveUp,
    }
}

/// How long a gang that could not be bought whole waits before it is tried again, doubled
/// after each failure up to [`GANG_BACKOFF_MAX`].
const GANG_BACKOFF: Duration = Duration::minutes(10);
const GANG_BACKOFF_MAX: Duration = Duration::hours(6);

/// A node's user data: a first part that writes its bootstrap token to
/// `/etc/spotplane/bootstrap-token` (root only), then the boot script (without its `#!` line),
/// which installs and starts the agent. Without a boot script the node's image is expected to
/// start the agent once the token file is there.
pub fn node_user_data(token: &str, boot_script: Option<&str>) -> String {
    let mut out = String::from(
        "#!/bin/sh\n# spotplane: this node's bootstrap token (this node only, used once)\n\
         umask 077\nmkdir -p /etc/spotplane\n",
    );
    // The token is `spb_<hex>_<base64url>`: nothing the shell would interpret in single quotes.
    out.push_str(&format!(
        "printf '%s\\n' '{}' > /etc/spotplane/bootstrap-token\n",
        token.replace('\'', "")
    ));
    if let Some(script) = boot_script {
        let body = match script.strip_prefix("#!") {
            Some(rest) => rest.split_once('\n').map_or("", |(_, b)| b),
            None => script,
        };
        out.push_str(body);
    }
    out
}

impl CapacityLoop {
    /// Makes the plan's buys, in order.
    pub(super) async fn provision(
        &mut self,
        buys: &[planner::Buy],
        now: DateTime<Utc>,
        report: &mut CapacityReport,
    ) -> Result<(), StoreError> {
        let mut stopped_clouds: Vec<Cloud> = Vec::new();
        for buy in buys {
            // A gang runs on all its nodes or not at all: nodes of a gang that cannot be
            // bought whole are given back at once rather than paid for while it waits.
            let mut bought = Vec::new();
            for _ in 0..buy.count {
                if stopped_clouds.contains(&buy.offer.cloud) {
                    break;
                }
                match self.buy_one(buy, None, now).await? {
                    Ok(node) => {
                        report.bought += 1;
                        bought.push(node);
                    }
                    Err(e) => {
                        *report.refused.entry(e.kind()).or_default() += 1;
                        if reaction(&e) == Reaction::StopCloud {
                            tracing::warn!(cloud = %buy.offer.cloud, error = %e, "no more buying on this cloud this round");
                            stopped_clouds.push(buy.offer.cloud);
                        }
                        break;
                    }
                }
            }
            if buy.count > 1 && bought.len() < buy.count as usize {
                self.give_back_partial_gang(buy, &bought, now, report)
                    .await?;
            }
        }
        Ok(())
    }

    /// Gives back the nodes bought for a gang that could not be bought whole, and sets the gang
    /// aside for a while (longer after each failure in a row).
    async fn give_back_partial_gang(
        &mut self,
        buy: &planner::Buy,
        bought: &[(NodeId, String, spotplane_core::Cloud)],
        now: DateTime<Utc>,
        report: &mut CapacityReport,
    ) -> Result<(), StoreError> {
        let failures = self.gang_backoff.get(&buy.job).map_or(0, |(_, n)| *n) + 1;
        let wait = GANG_BACKOFF
            .checked_mul(1 << failures.saturating_sub(1).min(10))
            .unwrap_or(GANG_BACKOFF_MAX)
            .min(GANG_BACKOFF_MAX);
        self.gang_backoff.insert(buy.job, (now + wait, failures));
        tracing::warn!(
            job = %buy.job,
            wanted = buy.count,
            got = bought.len(),
            retry_in = %wait,
            "the gang's nodes could not all be bought; giving back those that were"
        );
        let reason = format!(
            "gang of {} nodes could not be bought whole ({} were)",
            buy.count,
            bought.len()
        );
        for (node, instance, cloud) in bought {
            if self
                .release_instance(*node, *cloud, Some(instance), &reason, now)
                .await?
            {
                report.released += 1;
            }
        }
        Ok(())
    }

    /// Buys one node for `buy`, walking its fallbacks on capacity and price errors: the node,
    /// its instance and its cloud. A node bought to replace another carries that node's id in
    /// its [`tags::REPLACES`] label. The outer error is the store's; the inner one the last
    /// provider error.
    pub(super) async fn buy_one(
        &mut self,
        buy: &planner::Buy,
        replaces: Option<NodeId>,
        now: DateTime<Utc>,
    ) -> Result<Result<(NodeId, String, spotplane_core::Cloud), ProviderError>, StoreError> {
        let mut last = ProviderError::InsufficientCapacity {
            offer_id: buy.offer.id(),
            message: "no offer left".into(),
        };
        for offer in std::iter::once(&buy.offer).chain(buy.fallbacks.iter()) {
            if self.unavailable.contains(&offer.id(), now) {
                continue;
            }
            let Some((_, provider)) = self.provider_for(offer) else {
                continue;
            };
            let provider = Arc::clone(provider);
            let node_id = NodeId::from_uuid(new_uuid(now));
            let mut labels = BTreeMap::from([
                (tags::CLUSTER.to_owned(), self.settings.cluster.clone()),
                (tags::NODE_ID.to_owned(), node_id.to_string()),
                (tags::TEAM.to_owned(), buy.team.to_string()),
            ]);
            if let Some(old) = replaces {
                labels.insert(tags::REPLACES.to_owned(), old.to_string());
            }
            let node = NewNode {
                id: node_id,
                name: format!("spotplane-{}", node_id.as_uuid().simple()),
                cloud: offer.cloud,
                region: offer.region.to_string(),
                zone: offer.zone.to_string(),
                instance_type: offer.instance_type.to_string(),
                market: offer.market,
                offer_id: Some(offer.id()),
                client_token: format!("spotplane-{node_id}"),
                hourly_price: offer.price,
                on_demand_price: offer.on_demand_price,
                cpu_milli: u64::from(offer.vcpus) * 1000,
                memory_mib: offer.memory_mib,
                gpus: (0..offer.gpu_count)
                    .filter_map(|_| {
                        offer.gpu_model.map(|m| NewGpu {
                            model: m,
                            memory_mib: u64::from(m.memory_mib().unwrap_or(0)),
                            mig_enabled: false,
                            mig_layout: Default::default(),
                        })
                    })
                    .collect(),
                labels: labels.clone(),
            };
            let client_token = node.client_token.clone();
            // A real cloud's node gets its one-node bootstrap token in its user data; the
            // simulated clouds' nodes are given agents by whoever runs them.
            let user_data = if self.providers.sim(offer.cloud).is_some() {
                self.store.create_node(node, now).await?;
                None
            } else {
                let expires = now + self.settings.planner.boot_timeout + Duration::minutes(10);
                let (_, token) = self
                    .store
                    .create_node_with_bootstrap(node, expires, now)
                    .await?;
                Some(node_user_data(
                    &token,
                    self.settings.node_boot_script.as_deref(),
                ))
            };
            crate::crash_point!("provision-after-node-row");
            labels.insert("spotplane-job".into(), buy.job.to_string());
            let req = ProvisionRequest {
                node_id,
                offer: offer.clone(),
                client_token,
                tags: labels,
                user_data,
            };
            let span = tracing::info_span!(
                "buy",
                node_id = %node_id,
                offer = %offer.id(),
                job_id = %buy.job,
                replaces = tracing::field::Empty,
            );
            if let Some(old) = replaces {
                span.record("replaces", tracing::field::display(old));
            }
            match provider.provision(&req).instrument(span).await {
                Ok(inst) => {
                    crate::crash_point!("provision-after-cloud-call");
                    self.store
                        .set_node_instance(node_id, &inst.provider_id, now)
                        .await?;
                    // Billed from the instance's launch, as the cloud bills it.
                    self.store
                        .record_cloud_times(node_id, inst.launched_at, None)
                        .await?;
                    crate::crash_point!("provision-before-booting");
                    self.store
                        .transition_node(node_id, NodeState::Booting, None, now)
                        .await?;
                    return Ok(Ok((node_id, inst.provider_id, offer.cloud)));
                }
                Err(e) => {
                    self.store
                        .transition_node(
                            node_id,
                            NodeState::Terminated,
                            Some(format!("not bought: {e}")),
                            now,
                        )
                        .await?;
                    match &e {
                        ProviderError::InsufficientCapacity { .. }
                        | ProviderError::PriceTooLow(_) => {
                            tracing::info!(offer = %offer.id(), error = %e, "offer set aside; trying the next");
                            self.unavailable.mark(
                                &offer.id(),
                                now,
                                self.settings.capacity_error_ttl,
                            );
                            last = e;
                        }
                        _ => return Ok(Err(e)),
                    }
                }
            }
        }
        Ok(Err(last))
    }

    /// Terminates a node's instance and records it; whether it was given back.
    pub(super) async fn release(
        &self,
        node: &crate::model::Node,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.release_instance(
            node.id,
            node.cloud,
            node.provider_instance_id.as_deref(),
            reason,
            now,
        )
        .await
    }

    pub(super) async fn release_instance(
        &self,
        node: NodeId,
        cloud: spotplane_core::Cloud,
        instance: Option<&str>,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let provider = self.providers.all.iter().find(|p| p.cloud() == cloud);
        if let (Some(p), Some(id)) = (provider, instance)
            && let Err(e) = p.terminate(id).await
        {
            tracing::warn!(node = %node, error = %e, "terminate failed; trying again next round");
            return Ok(false);
        }
        crate::crash_point!("release");
        self.store
            .transition_node(node, NodeState::Terminated, Some(reason.to_owned()), now)
            .await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use spotplane_providers::ProviderError;

    use super::{Reaction, node_user_data, reaction};

    #[test]
    fn each_provider_error_has_its_reaction() {
        let capacity = ProviderError::InsufficientCapacity {
            offer_id: "gcp/us-central1-a/a2-highgpu-1g/spot".into(),
            message: "ZONE_RESOURCE_POOL_EXHAUSTED".into(),
        };
        let table = [
            (capacity, Reaction::NextOffer),
            (
                ProviderError::PriceTooLow("SpotMaxPriceTooLow".into()),
                Reaction::NextOffer,
            ),
            (
                ProviderError::Quota("QUOTA_EXCEEDED".into()),
                Reaction::StopCloud,
            ),
            (
                ProviderError::Auth("expired token".into()),
                Reaction::StopCloud,
            ),
            (
                ProviderError::Throttled {
                    retry_after: Duration::from_secs(2),
                },
                Reaction::StopCloud,
            ),
            (ProviderError::Transient("502".into()), Reaction::StopCloud),
            (ProviderError::NotFound("image".into()), Reaction::GiveUp),
            (
                ProviderError::InvalidRequest("bad zone".into()),
                Reaction::GiveUp,
            ),
        ];
        for (e, want) in table {
            assert_eq!(reaction(&e), want, "{e}");
        }
    }

    #[test]
    fn user_data_writes_the_token_then_runs_the_boot_script() {
        let token = "spb_0123456789abcdef0123456789abcdef_AbC-dE_f";
        let ud = node_user_data(
            token,
            Some("#!/bin/bash\nset -eu\nsystemctl start spotplane-agent\n"),
        );
        assert!(ud.starts_with("#!/bin/sh\n"), "{ud}");
        assert!(
            ud.contains(&format!(
                "printf '%s\\n' '{token}' > /etc/spotplane/bootstrap-token\n"
            )),
            "{ud}"
        );
        assert!(ud.contains("umask 077"), "root-only token file: {ud}");
        assert!(
            ud.ends_with("set -eu\nsystemctl start spotplane-agent\n"),
            "{ud}"
        );
        assert_eq!(ud.matches("#!").count(), 1, "one interpreter line: {ud}");
        // Without a boot script, only the token part: the image starts the agent.
        assert!(!node_user_data(token, None).contains("systemctl"));
    }
}
