//! The live page's charts: a ring of fleet samples kept by this replica.
//!
//! Each sample is the figures one `/metrics` scrape computes (spend, on-demand equivalent,
//! queue depth, allocation, utilisation), taken every `telemetry.history_interval` (or, in
//! `spotplane demo`, every few simulated minutes). The ring is this process's memory: a
//! replica that starts has none, and Prometheus is where history is kept for good.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::fleet::FleetSummary;

/// One point of the charts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Sample {
    pub at: DateTime<Utc>,
    pub spend_usd_per_hour: f64,
    pub on_demand_usd_per_hour: f64,
    pub queued: u64,
    /// Allocated GPUs over all GPUs of ready nodes, 0 to 1.
    pub gpu_allocation_ratio: f64,
    /// Mean SM utilisation of the devices jobs hold, percent; null without readings.
    pub sm_utilization_pct: Option<f64>,
}

/// The last `capacity` samples, oldest first.
#[derive(Debug, Clone)]
pub struct History {
    ring: Arc<Mutex<VecDeque<Sample>>>,
    capacity: usize,
}

impl Default for History {
    fn default() -> Self {
        Self::new(720)
    }
}

impl History {
    pub fn new(capacity: usize) -> Self {
        History {
            ring: Arc::default(),
            capacity: capacity.max(1),
        }
    }

    /// Adds a sample at `at`; one not later than the newest replaces nothing and is dropped
    /// (a clock that went back, or two samplers).
    pub fn push(&self, at: DateTime<Utc>, s: &FleetSummary) {
        let mut ring = match self.ring.lock() {
            Ok(r) => r,
            Err(poisoned) => poisoned.into_inner(),
        };
        if ring.back().is_some_and(|b| b.at >= at) {
            return;
        }
        if ring.len() == self.capacity {
            ring.pop_front();
        }
        ring.push_back(Sample {
            at,
            spend_usd_per_hour: round(s.spend_usd_per_hour, 4),
            on_demand_usd_per_hour: round(s.on_demand_usd_per_hour, 4),
            queued: s.queued,
            gpu_allocation_ratio: round(s.gpu_allocation_ratio, 4),
            sm_utilization_pct: s.sm_utilization_pct.map(|v| round(v, 1)),
        });
    }

    pub fn samples(&self) -> Vec<Sample> {
        match self.ring.lock() {
            Ok(r) => r.iter().copied().collect(),
            Err(poisoned) => poisoned.into_inner().iter().copied().collect(),
        }
    }
}

fn round(v: f64, places: i32) -> f64 {
    let k = 10f64.powi(places);
    (v * k).round() / k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_samples_in_order() {
        let h = History::new(3);
        let t0 = chrono::DateTime::<Utc>::UNIX_EPOCH;
        for i in 0..5 {
            h.push(
                t0 + chrono::Duration::minutes(i),
                &FleetSummary {
                    queued: u64::try_from(i).unwrap_or(0),
                    ..FleetSummary::default()
                },
            );
        }
        // A sample not after the newest is dropped.
        h.push(t0, &FleetSummary::default());
        let got: Vec<u64> = h.samples().iter().map(|s| s.queued).collect();
        assert_eq!(got, vec![2, 3, 4]);
    }
}
