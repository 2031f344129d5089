//! Which market the simulated clouds replay: the recorded traces of a data folder, or the
//! market shipped in the binary.
//!
//! The recorded traces (`../shared/data`, [`SimTraces::load`]) are what tests and benchmarks
//! read. A clone without them gets the shipped market ([`SimTraces::shipped`]), built only from
//! what the project may ship:
//!
//! - Prices: the built-in catalogs (`config/catalog/`), and for GCP the recorded price history
//!   from 2026-06 on (`data/market/gcp-gpu-prices/`, Apache-2.0), replayed at the simulated date.
//!   AWS and Azure spot prices hold at the catalog's level.
//! - Spot availability and preemptions: a seeded alternating process per pool, drawn from the
//!   catalog's interruption-frequency band (AWS Spot Instance Advisor: `<5%`, `5-10%`,
//!   `10-15%`, `15-20%`, `>20%` of instances interrupted in a month). A band's rate is its
//!   midpoint (25% for `>20%`), compressed [`COMPRESSION`]-fold in time so that a simulated
//!   hour shows a month's interruptions: a `>20%` pool is taken about every 4 hours, a `<5%`
//!   one about every 40, the same order as the recorded AWS traces (3 to 10 a pool-day). Each
//!   outage lasts an exponential time with mean [`MEAN_OUTAGE_S`]; an instance in the pool is
//!   preempted when it starts and nothing is sold there until it ends. Rows without a band (the
//!   GCP and Azure catalogs carry none) take [`DEFAULT_BAND`], the band of most AWS GPU rows.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::traces::{SimTraces, Trace, TraceError, parse_gcp_history};

/// Where the simulated clouds' market comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimMarket {
    /// The recorded traces in this folder (`../shared/data` in a checkout).
    Recorded(PathBuf),
    /// The market built into the binary (this module).
    Shipped,
}

impl SimMarket {
    /// One line saying what is replayed, for the demo and the logs.
    pub fn describe(&self) -> String {
        match self {
            SimMarket::Recorded(dir) => format!(
                "recorded: AWS spot availability and preemption traces (Can't Be Late) and GCP \
                 price history from {}",
                dir.display()
            ),
            SimMarket::Shipped => "shipped: built-in catalog prices, GCP price history since \
                 2026-06, interruptions drawn from the catalog's interruption-frequency bands \
                 (a month's worth per simulated hour)"
                .to_owned(),
        }
    }

    /// `recorded` or `shipped`.
    pub fn kind(&self) -> &'static str {
        match self {
            SimMarket::Recorded(_) => "recorded",
            SimMarket::Shipped => "shipped",
        }
    }
}

/// The GCP price history shipped with the project (a subset of the recorded one).
pub const GCP_PRICES: &str =
    include_str!("../../../data/market/gcp-gpu-prices/gcp_gpu_vm_price_changes.since-2026-06.csv");
const GCP_PRICES_ORIGIN: &str =
    "data/market/gcp-gpu-prices/gcp_gpu_vm_price_changes.since-2026-06.csv";

/// The interruption-frequency bands as the catalogs spell them, with the monthly share of
/// instances interrupted each stands for (the band's midpoint; 25% for the open-ended top).
pub const BANDS: [(&str, f64); 5] = [
    ("<5%", 0.025),
    ("5-10%", 0.075),
    ("10-15%", 0.125),
    ("15-20%", 0.175),
    (">20%", 0.25),
];

/// The band of catalog rows that carry none.
pub const DEFAULT_BAND: &str = ">20%";

/// Simulated time runs this many times faster for interruptions than the bands say: a
/// month's (720 hours') interruptions in an hour.
pub const COMPRESSION: f64 = 720.0;

/// Mean length of a spot outage (no capacity, instances taken).
pub const MEAN_OUTAGE_S: f64 = 1800.0;

/// Seconds per tick of the generated traces.
const TICK_S: u32 = 60;
/// Ticks per generated trace (30 days; pools wrap around, from a seeded offset).
const TICKS: usize = 30 * 24 * 60;
/// Traces per band, so that pools of one band are not taken all at once.
const VARIANTS: usize = 4;

/// SplitMix64: a small generator whose output is fixed by its seed forever (the shipped market
/// must not change with a dependency's version).
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with the given mean, in whole ticks (at least one).
    fn exp_ticks(&mut self, mean_s: f64) -> usize {
        let s = -mean_s * (1.0 - self.unit()).ln();
        ((s / f64::from(TICK_S)).round() as usize).max(1)
    }
}

/// One band's availability trace: alternating available and outage stretches.
fn band_trace(band: &str, monthly: f64, variant: usize) -> Trace {
    let per_hour = monthly * COMPRESSION / 720.0;
    let mean_up_s = 3600.0 / per_hour;
    let mut seed = 0x5350_4f54_504c_414e_u64 ^ variant as u64;
    for b in band.bytes() {
        seed = seed.rotate_left(8) ^ u64::from(b);
    }
    let mut rng = SplitMix(seed);
    let mut data = Vec::with_capacity(TICKS);
    while data.len() < TICKS {
        let up = rng.exp_ticks(mean_up_s);
        data.extend(std::iter::repeat_n(0u8, up));
        let down = rng.exp_ticks(MEAN_OUTAGE_S);
        data.extend(std::iter::repeat_n(1u8, down));
    }
    data.truncate(TICKS);
    Trace::new(format!("shipped/{band}/{variant}"), TICK_S, data, None)
}

impl SimTraces {
    /// The market of `market`: the recorded traces of its folder, or the shipped one.
    pub fn for_market(market: &SimMarket) -> Result<SimTraces, TraceError> {
        match market {
            SimMarket::Recorded(dir) => SimTraces::load(dir),
            SimMarket::Shipped => SimTraces::shipped(),
        }
    }

    /// The market shipped in the binary (see the module's documentation).
    pub fn shipped() -> Result<SimTraces, TraceError> {
        let mut availability = Vec::with_capacity(BANDS.len() * VARIANTS);
        let mut bands = BTreeMap::new();
        for (band, monthly) in BANDS {
            let mut of_band = Vec::with_capacity(VARIANTS);
            for v in 0..VARIANTS {
                of_band.push(availability.len());
                availability.push(band_trace(band, monthly, v));
            }
            bands.insert(band.to_owned(), of_band);
        }
        Ok(SimTraces {
            availability,
            gcp_prices: parse_gcp_history(GCP_PRICES, GCP_PRICES_ORIGIN)?,
            bands,
            default_band: Some(DEFAULT_BAND.to_owned()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outages begun per simulated hour, and the share of time unavailable.
    fn rates(t: &Trace) -> (f64, f64) {
        let onsets = t.data.windows(2).filter(|w| w == &[0, 1]).count();
        let hours = t.len() as f64 * f64::from(t.gap_s) / 3600.0;
        let down = t.data.iter().filter(|v| **v == 1).count() as f64 / t.len() as f64;
        (onsets as f64 / hours, down)
    }

    #[test]
    fn the_shipped_market_follows_the_bands() {
        let m = SimTraces::shipped().expect("the shipped market builds");
        assert_eq!(m.availability.len(), BANDS.len() * VARIANTS);
        let mut last = 0.0;
        for (band, monthly) in BANDS {
            let idx = &m.bands[band];
            let (mut per_hour, mut down) = (0.0, 0.0);
            for i in idx {
                let (r, d) = rates(&m.availability[*i]);
                per_hour += r / idx.len() as f64;
                down += d / idx.len() as f64;
            }
            // Within 25% of the band's compressed rate, and ordered by band.
            let want = monthly * COMPRESSION / 720.0;
            assert!(
                (per_hour - want).abs() < 0.25 * want,
                "{band}: {per_hour:.4} outages an hour, want {want:.4}"
            );
            assert!(
                per_hour > last,
                "{band} is not more frequent than the band below"
            );
            last = per_hour;
            // Outages average MEAN_OUTAGE_S: the unavailable share is about rate × mean.
            let want_down = per_hour * MEAN_OUTAGE_S / 3600.0;
            assert!(
                (down - want_down).abs() < 0.3 * want_down + 0.005,
                "{band}: unavailable {down:.4}, want about {want_down:.4}"
            );
        }
        assert!(
            m.gcp_prices.len() > 100,
            "GCP series: {}",
            m.gcp_prices.len()
        );
    }

    #[test]
    fn the_shipped_market_is_the_same_every_time() {
        let a = SimTraces::shipped().expect("builds");
        let b = SimTraces::shipped().expect("builds");
        for (x, y) in a.availability.iter().zip(&b.availability) {
            assert_eq!(x.data, y.data, "{}", x.name);
        }
        assert_ne!(
            a.availability[0].data, a.availability[1].data,
            "variants of a band differ"
        );
    }

    #[test]
    fn a_market_says_what_it_is() {
        assert_eq!(SimMarket::Shipped.kind(), "shipped");
        assert!(
            SimMarket::Recorded(PathBuf::from("/x/shared/data"))
                .describe()
                .contains("/x/shared/data")
        );
    }
}
