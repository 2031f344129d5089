//! Replays a fleet on the simulated clouds: the sim's own benchmark and a smoke test of the
//! traces (`spotplane bench sim`).
//!
//! A fleet of spot nodes is kept at its size for the simulated span: each node is bought on one
//! of the cheapest spot offers (per GPU-hour) that has capacity, watched as its agent would
//! watch its metadata endpoint, and replaced the moment its notice is posted. Prices are polled
//! as the planner polls them; cost is integrated from the price in force at each step. The
//! replay drives the same `CloudProvider` calls the control plane makes, on a manual clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Duration, Utc};
use rustc_hash::FxHashMap;
use serde::Serialize;
use spotplane_core::{Market, Micros, NodeId};

use super::SimCloud;
use crate::clock::ManualClock;
use crate::{CloudProvider, Offer, ProvisionRequest};

/// What to replay.
#[derive(Debug, Clone)]
pub struct ReplaySpec {
    pub start: DateTime<Utc>,
    pub span: Duration,
    /// How often nodes are looked at (the agents' polling, coarsened).
    pub step: Duration,
    /// How often offers and prices are polled.
    pub price_refresh: Duration,
    /// Spot nodes kept running.
    pub fleet: usize,
    /// Nodes are spread over this many of the cheapest offers.
    pub spread: usize,
}

/// What happened, and how long it took.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    pub simulated_hours: f64,
    pub steps: u64,
    pub offer_polls: u64,
    pub offers_last_poll: usize,
    pub provisioned: u64,
    pub refused: BTreeMap<&'static str, u64>,
    pub notices: u64,
    /// Interruption events the clouds' event streams delivered (AWS flavour only), by kind.
    pub stream_events: BTreeMap<String, u64>,
    /// Steps at which a cloud's part of the fleet was short of its size.
    pub short_steps: u64,
    pub node_hours: f64,
    pub spot_cost: Micros,
    /// What the same node-hours cost on demand.
    pub on_demand_cost: Micros,
    pub wall_seconds: f64,
}

struct Running {
    provider_id: String,
    zone: Arc<str>,
    instance_type: Arc<str>,
    /// Spot and on-demand price per hour, as of the last poll.
    price: (Micros, Micros),
}

/// Runs the replay on `sims`, whose clock is `clock`. The fleet is split evenly between the
/// clouds, each part on its own cloud's cheapest offers, so every flavour is exercised.
pub async fn replay(
    sims: &[Arc<SimCloud>],
    clock: &ManualClock,
    spec: &ReplaySpec,
) -> ReplayReport {
    let started = Instant::now();
    clock.set(spec.start);
    let end = spec.start + spec.span;
    let n = sims.len().max(1);
    let quota: Vec<usize> = (0..n)
        .map(|i| spec.fleet / n + usize::from(i < spec.fleet % n))
        .collect();
    let mut report = ReplayReport::default();
    let mut offers: Vec<Vec<Offer>> = vec![Vec::new(); n];
    let mut running: Vec<Vec<Running>> = (0..n).map(|_| Vec::new()).collect();
    let mut next_poll = spec.start;
    let mut serial = 0u64;
    let step_ms = spec.step.num_milliseconds();
    let step_hours = step_ms as f64 / 3_600_000.0;
    let (mut spot_acc, mut on_demand_acc) = (0i128, 0i128);
    while clock_now(clock) < end {
        let now = clock_now(clock);
        let poll = now >= next_poll;
        if poll {
            report.offer_polls += 1;
            report.offers_last_poll = 0;
            next_poll = now + spec.price_refresh;
        }
        for (i, sim) in sims.iter().enumerate() {
            if poll {
                poll_offers(sim, &mut offers[i], &mut running[i]).await;
                report.offers_last_poll += offers[i].len();
            }
            watch(sim, &mut running[i], &mut report).await;
            refill(
                sim,
                &offers[i],
                &mut running[i],
                quota[i],
                spec.spread,
                &mut serial,
                &mut report,
            )
            .await;
            if running[i].len() < quota[i] {
                report.short_steps += 1;
            }
            // Cost in micro-dollar-milliseconds, exact; made dollars once at the end.
            for r in &running[i] {
                spot_acc += i128::from(r.price.0.0) * i128::from(step_ms);
                on_demand_acc += i128::from(r.price.1.0) * i128::from(step_ms);
            }
            report.node_hours += running[i].len() as f64 * step_hours;
        }
        report.steps += 1;
        clock.advance(spec.step);
    }
    let to_micros = |acc: i128| Micros(i64::try_from(acc / 3_600_000).unwrap_or(i64::MAX));
    report.spot_cost = to_micros(spot_acc);
    report.on_demand_cost = to_micros(on_demand_acc);
    report.simulated_hours = spec.span.num_seconds() as f64 / 3600.0;
    report.wall_seconds = started.elapsed().as_secs_f64();
    report
}

/// Re-reads a cloud's spot offers, cheapest GPU-hour first, and re-prices its running nodes.
async fn poll_offers(sim: &SimCloud, offers: &mut Vec<Offer>, running: &mut [Running]) {
    let Ok(list) = sim.list_offers().await else {
        // Keep the last prices, as the planner does when a poll fails.
        return;
    };
    *offers = list
        .into_iter()
        .filter(|o| o.market == Market::Spot && o.gpu_count > 0)
        .collect();
    // Stable: equal prices keep the catalog's order, so a run is reproducible.
    offers.sort_by_key(|o| o.price.0 / i64::from(o.gpu_count));
    let index: FxHashMap<(&str, &str), (Micros, Micros)> = offers
        .iter()
        .map(|o| ((&*o.zone, &*o.instance_type), (o.price, o.on_demand_price)))
        .collect();
    for r in running {
        if let Some(p) = index.get(&(&*r.zone, &*r.instance_type)) {
            r.price = *p;
        }
    }
}

/// Looks at every node as its agent would; a posted notice means: give it back and replace it.
async fn watch(sim: &SimCloud, running: &mut Vec<Running>, report: &mut ReplayReport) {
    // Notices are rare: find them first, then ask whether they are ours (no set per step).
    let now = sim.now();
    let mut noticed: Vec<String> = Vec::new();
    sim.for_each_instance(|inst| {
        // Noticed and not yet given back (those stay listed for an hour after).
        if inst.notice.is_some()
            && inst.terminated_at.is_none_or(|t| t > now)
            && running.iter().any(|r| r.provider_id == inst.id)
        {
            noticed.push(inst.id.clone());
        }
    });
    if let Ok(events) = sim.drain_interruptions().await {
        for e in events {
            *report
                .stream_events
                .entry(format!("{:?}", e.kind).to_lowercase())
                .or_default() += 1;
        }
    }
    if noticed.is_empty() {
        return;
    }
    for id in &noticed {
        report.notices += 1;
        // Already being taken; giving it back now ends its billing.
        let _ = sim.terminate(id).await;
    }
    running.retain(|r| !noticed.contains(&r.provider_id));
}

/// Buys nodes up to `quota`: rotating over the `spread` cheapest offers, then down the list.
/// A node that finds no capacity anywhere waits for the next step.
async fn refill(
    sim: &SimCloud,
    offers: &[Offer],
    running: &mut Vec<Running>,
    quota: usize,
    spread: usize,
    serial: &mut u64,
    report: &mut ReplayReport,
) {
    let spread = spread.clamp(1, offers.len().max(1));
    while running.len() < quota && !offers.is_empty() {
        let rot = (*serial as usize) % spread;
        let mut placed = false;
        for k in 0..offers.len() {
            let offer = &offers[if k < spread { (rot + k) % spread } else { k }];
            *serial += 1;
            let req = ProvisionRequest {
                node_id: NodeId(uuid::Uuid::from_u64_pair(*serial, 0x5e11)),
                offer: offer.clone(),
                client_token: format!("replay-{serial}"),
                tags: BTreeMap::from([("spotplane-cluster".to_owned(), "replay".to_owned())]),
                user_data: None,
            };
            match sim.provision(&req).await {
                Ok(inst) => {
                    report.provisioned += 1;
                    running.push(Running {
                        provider_id: inst.provider_id,
                        zone: offer.zone.clone(),
                        instance_type: offer.instance_type.clone(),
                        price: (offer.price, offer.on_demand_price),
                    });
                    placed = true;
                    break;
                }
                Err(e) => *report.refused.entry(e.kind()).or_default() += 1,
            }
        }
        if !placed {
            break;
        }
    }
}

fn clock_now(clock: &ManualClock) -> DateTime<Utc> {
    crate::clock::Clock::now(clock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProviderConfig;
    use crate::registry::{self, BuildContext};
    use crate::sim::SimConfig;
    use chrono::TimeZone;
    use spotplane_core::Cloud;

    async fn sims(clock: &ManualClock) -> Vec<Arc<SimCloud>> {
        let cfgs: Vec<ProviderConfig> = Cloud::ALL
            .iter()
            .enumerate()
            .map(|(i, c)| ProviderConfig::Sim(SimConfig::new(*c, i as u64 + 1)))
            .collect();
        let ctx = BuildContext {
            clock: Arc::new(clock.clone()),
            sim_market: crate::sim::SimMarket::Recorded(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"),
            ),
            catalog_dir: None,
            observer: None,
            sim_state_dir: None,
        };
        registry::build(&cfgs, &ctx).await.expect("builds").sims
    }

    #[tokio::test]
    async fn three_days_of_real_traces_take_nodes_and_the_fleet_is_kept_whole() {
        let start = Utc
            .with_ymd_and_hms(2026, 7, 1, 0, 0, 0)
            .single()
            .expect("time");
        let clock = ManualClock::new(start);
        let sims = sims(&clock).await;
        let spec = ReplaySpec {
            start,
            span: Duration::days(3),
            step: Duration::seconds(60),
            price_refresh: Duration::minutes(5),
            fleet: 16,
            spread: 8,
        };
        let a = replay(&sims, &clock, &spec).await;
        assert!(a.notices > 0, "{a:?}");
        assert_eq!(
            a.provisioned,
            a.notices + 16,
            "every taken node was replaced: {a:?}"
        );
        assert!(
            a.stream_events.get("preemption").is_some_and(|n| *n > 0),
            "{a:?}"
        );
        assert!(a.spot_cost < a.on_demand_cost, "{a:?}");
        assert!(
            (a.node_hours - 16.0 * 72.0).abs() < 1e-6,
            "the fleet was whole throughout: {a:?}"
        );
    }
}
