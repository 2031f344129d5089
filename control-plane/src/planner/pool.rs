//! What the planner remembers about pools: how often their nodes are taken, and which offers
//! just failed. Plain values the reconciler keeps between rounds and hands in.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use spotplane_core::Market;
use spotplane_providers::Offer;

/// Hours in an average month, for buckets stated per month.
const HOURS_PER_MONTH: f64 = 730.0;
/// How many node-hours of evidence the prior is worth.
const PRIOR_HOURS: f64 = 24.0;
/// Spot pools of clouds that publish no bucket (GCP, Azure): assume the `10-15%` bucket.
const DEFAULT_MONTHLY_RATE: f64 = 0.125;

/// A pool: one instance type in one zone on one market (the offer id).
pub fn pool_id(offer: &Offer) -> String {
    offer.id()
}

/// Observed interruptions per pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolStats {
    pools: BTreeMap<String, Observed>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Observed {
    node_hours: f64,
    interruptions: u64,
}

impl PoolStats {
    /// `hours` more node-hours seen on the pool.
    pub fn exposed(&mut self, pool: &str, hours: f64) {
        self.pools.entry(pool.to_owned()).or_default().node_hours += hours.max(0.0);
    }

    /// One node of the pool interrupted.
    pub fn interrupted(&mut self, pool: &str) {
        self.pools.entry(pool.to_owned()).or_default().interruptions += 1;
    }

    /// Interruptions per node-hour expected on the offer's pool: the observed rate with the
    /// published interruption bucket as prior, worth [`PRIOR_HOURS`] node-hours. On-demand: 0.
    pub fn rate(&self, offer: &Offer) -> f64 {
        if offer.market == Market::OnDemand {
            return 0.0;
        }
        let prior = offer
            .interruption_bucket
            .as_deref()
            .and_then(bucket_monthly_rate)
            .unwrap_or(DEFAULT_MONTHLY_RATE)
            / HOURS_PER_MONTH;
        let seen = self.pools.get(&pool_id(offer)).copied().unwrap_or_default();
        (seen.interruptions as f64 + prior * PRIOR_HOURS) / (seen.node_hours + PRIOR_HOURS)
    }
}

/// The middle of an AWS Spot Advisor interruption-frequency bucket, as a monthly rate.
pub fn bucket_monthly_rate(bucket: &str) -> Option<f64> {
    Some(match bucket.trim() {
        "<5%" => 0.025,
        "5-10%" => 0.075,
        "10-15%" => 0.125,
        "15-20%" => 0.175,
        ">20%" => 0.25,
        _ => return None,
    })
}

/// Offers set aside until a time: after a capacity error (Karpenter keeps such offerings out
/// for three minutes), a preemption, or a node that never booted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Unavailable {
    until: BTreeMap<String, DateTime<Utc>>,
}

impl Unavailable {
    /// Sets `offer_id` aside for `for_` from `now` (extending, never shortening, an earlier mark).
    pub fn mark(&mut self, offer_id: &str, now: DateTime<Utc>, for_: Duration) {
        let until = now + for_;
        let e = self.until.entry(offer_id.to_owned()).or_insert(until);
        if *e < until {
            *e = until;
        }
    }

    pub fn contains(&self, offer_id: &str, now: DateTime<Utc>) -> bool {
        self.until.get(offer_id).is_some_and(|u| now < *u)
    }

    /// Forgets marks that have run out.
    pub fn expire(&mut self, now: DateTime<Utc>) {
        self.until.retain(|_, u| now < *u);
    }

    pub fn len(&self) -> usize {
        self.until.len()
    }

    pub fn is_empty(&self) -> bool {
        self.until.is_empty()
    }
}
