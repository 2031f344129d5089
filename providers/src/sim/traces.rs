//! The recorded market data the simulated clouds replay (the market shipped in the binary, for
//! a clone without it, is in [`super::market`]).
//!
//! - Spot availability and preemptions: the "Can't Be Late" traces (Wu et al., NSDI '24;
//!   `spot/cant-be-late/` in the shared data): one value per tick, 0 = a spot instance is
//!   available / kept, 1 = not available / preempted. Each simulated spot pool follows one of
//!   these traces from a seeded offset, wrapping around at its end.
//! - Spot price movement: the traces that carry `prices` (r5.16xlarge, 1.14–1.85 USD/h) give a
//!   relative price path; a pool's spot price is its catalog price times that path over its mean.
//! - GCP prices: the weekly on-demand and spot price history of GPU VMs (2022-02 to 2026-07),
//!   replayed at the simulated date.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chrono::NaiveDate;
use serde::Deserialize;
use spotplane_core::Micros;

/// One availability trace.
#[derive(Debug, Clone)]
pub struct Trace {
    pub name: String,
    /// Seconds per tick.
    pub gap_s: u32,
    /// 0 = available, 1 = not.
    pub data: Vec<u8>,
    /// Per tick: the index of the next tick (at or after it, wrapping around) whose value is
    /// 1, or `None` if the trace never says 1. Makes "when is this instance taken?" O(1).
    next_one: Vec<Option<u32>>,
    /// Spot price per tick, when the trace records it.
    pub prices: Option<Vec<f64>>,
    mean_price: f64,
}

#[derive(Deserialize)]
struct TraceFile {
    metadata: TraceMeta,
    data: Vec<u8>,
    #[serde(default)]
    prices: Option<Vec<f64>>,
}

#[derive(Deserialize)]
struct TraceMeta {
    gap_seconds: u32,
}

/// The data could not be loaded; names the file.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {message}")]
    Bad { path: String, message: String },
}

impl Trace {
    pub fn new(
        name: impl Into<String>,
        gap_s: u32,
        data: Vec<u8>,
        prices: Option<Vec<f64>>,
    ) -> Trace {
        let n = data.len();
        let mut next_one = vec![None; n];
        // Two passes backwards handle the wrap-around.
        let mut next: Option<u32> = None;
        for pass in 0..2 {
            for i in (0..n).rev() {
                if data[i] == 1 {
                    next = Some(i as u32);
                }
                if pass == 1 {
                    next_one[i] = next;
                }
            }
        }
        let mean_price = match &prices {
            Some(p) if !p.is_empty() => p.iter().sum::<f64>() / p.len() as f64,
            _ => 0.0,
        };
        Trace {
            name: name.into(),
            gap_s: gap_s.max(1),
            data,
            next_one,
            prices,
            mean_price,
        }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Whether spot is available at absolute tick `t` (wrapping).
    pub fn available(&self, t: u64) -> bool {
        self.data.is_empty() || self.data[(t % self.data.len() as u64) as usize] == 0
    }

    /// The first tick at or after `t` at which spot is taken away, if ever.
    pub fn next_unavailable(&self, t: u64) -> Option<u64> {
        if self.data.is_empty() {
            return None;
        }
        let len = self.data.len() as u64;
        let i = (t % len) as usize;
        let j = u64::from(self.next_one[i]?);
        let base = t - (t % len);
        Some(if j >= i as u64 {
            base + j
        } else {
            base + len + j
        })
    }

    /// The price at tick `t` relative to the trace's mean price (1.0 without prices).
    pub fn relative_price(&self, t: u64) -> f64 {
        match &self.prices {
            Some(p) if !p.is_empty() && self.mean_price > 0.0 => {
                p[(t % p.len() as u64) as usize] / self.mean_price
            }
            _ => 1.0,
        }
    }
}

/// One point of a GCP price series: from `date` on, these prices.
#[derive(Debug, Clone, PartialEq)]
pub struct PricePoint {
    pub date: NaiveDate,
    pub on_demand: Micros,
    pub spot: Option<Micros>,
}

/// Everything the simulated clouds replay.
#[derive(Debug, Clone, Default)]
pub struct SimTraces {
    /// Availability traces (0/1 per tick).
    pub availability: Vec<Trace>,
    /// GCP price series by (machine type, region), oldest first.
    pub gcp_prices: BTreeMap<(String, String), Vec<PricePoint>>,
    /// The shipped market's availability traces by interruption-frequency band (the catalog's
    /// label): a pool follows one of its band's traces. Empty for recorded traces, where every
    /// pool draws from all of them.
    pub bands: BTreeMap<String, Vec<usize>>,
    /// With `bands`, the band of catalog rows that carry none.
    pub default_band: Option<String>,
}

impl SimTraces {
    /// Loads the traces from the shared data folder (`../shared/data` in a checkout).
    pub fn load(data_dir: &Path) -> Result<SimTraces, TraceError> {
        let mut availability = Vec::new();
        for folder in [
            "spot/cant-be-late/availability/1-node/aws-02-15-2023",
            "spot/cant-be-late/preemption/1-node/aws-04-22-2023",
            "spot/cant-be-late/preemption/1-node/aws-04-19-2023",
        ] {
            let dir = data_dir.join(folder);
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map_err(|e| TraceError::Bad {
                    path: dir.display().to_string(),
                    message: e.to_string(),
                })?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect();
            files.sort();
            for f in files {
                let bad = |m: String| TraceError::Bad {
                    path: f.display().to_string(),
                    message: m,
                };
                let text = std::fs::read_to_string(&f).map_err(|e| bad(e.to_string()))?;
                let parsed: TraceFile =
                    serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
                if parsed.data.iter().any(|v| *v > 1) {
                    return Err(bad("values must be 0 or 1".into()));
                }
                if parsed
                    .prices
                    .as_ref()
                    .is_some_and(|p| p.len() != parsed.data.len())
                {
                    return Err(bad("prices and data differ in length".into()));
                }
                let name = format!(
                    "{folder}/{}",
                    f.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                );
                availability.push(Trace::new(
                    name,
                    parsed.metadata.gap_seconds,
                    parsed.data,
                    parsed.prices,
                ));
            }
        }
        let hist_path = data_dir.join("spot/gcp-gpu-prices/gcp_gpu_vm_price_changes.csv");
        let hist = std::fs::read_to_string(&hist_path).map_err(|e| TraceError::Bad {
            path: hist_path.display().to_string(),
            message: e.to_string(),
        })?;
        let gcp_prices = parse_gcp_history(&hist, &hist_path.display().to_string())?;
        Ok(SimTraces {
            availability,
            gcp_prices,
            bands: BTreeMap::new(),
            default_band: None,
        })
    }
}

/// Parses the GCP price history into series per (machine type, region).
pub fn parse_gcp_history(
    text: &str,
    origin: &str,
) -> Result<BTreeMap<(String, String), Vec<PricePoint>>, TraceError> {
    let mut out: BTreeMap<(String, String), Vec<PricePoint>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        // Machine types the catalog prices from elsewhere: their history is not theirs to replay
        // (A3 Mega's rows stop in 2024-08 without the GPUs' price).
        if f.len() < 10 || crate::catalog::GCP_FROM_SKYPILOT.contains(&f[2]) {
            continue;
        }
        let bad = |m: String| TraceError::Bad {
            path: format!("{origin}:{}", i + 1),
            message: m,
        };
        let date = NaiveDate::parse_from_str(f[0], "%Y-%m-%d")
            .map_err(|e| bad(format!("date {:?}: {e}", f[0])))?;
        let usd = |v: &str| -> Result<Micros, TraceError> {
            let x: f64 = v.parse().map_err(|_| bad(format!("price {v:?}")))?;
            Micros::from_usd_f64((x * 1e6).round() / 1e6).map_err(|e| bad(e.to_string()))
        };
        let point = PricePoint {
            date,
            on_demand: usd(f[8])?,
            spot: if f[9].is_empty() {
                None
            } else {
                Some(usd(f[9])?)
            },
        };
        out.entry((f[2].to_owned(), f[7].to_owned()))
            .or_default()
            .push(point);
    }
    for series in out.values_mut() {
        series.sort_by_key(|p| p.date);
    }
    Ok(out)
}

/// The price point in force on `date` (the latest at or before it; the first one before the
/// series starts).
pub fn price_on(series: &[PricePoint], date: NaiveDate) -> Option<&PricePoint> {
    let idx = series.partition_point(|p| p.date <= date);
    if idx == 0 {
        series.first()
    } else {
        series.get(idx - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_unavailable_wraps_around_the_trace() {
        let t = Trace::new("t", 10, vec![0, 0, 1, 0, 0], None);
        assert_eq!(t.next_unavailable(0), Some(2));
        assert_eq!(t.next_unavailable(2), Some(2));
        assert_eq!(t.next_unavailable(3), Some(7));
        assert_eq!(t.next_unavailable(12), Some(12));
        assert!(t.available(8) && !t.available(7));
        assert_eq!(
            Trace::new("never", 10, vec![0, 0], None).next_unavailable(5),
            None
        );
    }

    #[test]
    fn relative_prices_average_one() {
        let t = Trace::new("p", 10, vec![0, 0], Some(vec![1.0, 3.0]));
        assert_eq!((t.relative_price(0), t.relative_price(1)), (0.5, 1.5));
    }

    #[test]
    fn gcp_prices_replay_the_change_in_force() {
        let text = "snapshot_date,commit,machine_type,gpu_model,gpu_count,vcpus,ram_gb,region,hour_ondemand_usd,hour_spot_usd\n\
                    2023-01-01,c,g2-standard-4,l4,1,4,16,us-central1,0.8,\n\
                    2024-01-01,c,g2-standard-4,l4,1,4,16,us-central1,0.7,0.22\n";
        let h = parse_gcp_history(text, "t").expect("parses");
        let s = &h[&("g2-standard-4".to_owned(), "us-central1".to_owned())];
        let d = |s: &str| NaiveDate::parse_from_str(s, "%Y-%m-%d").expect("date");
        assert_eq!(
            price_on(s, d("2023-06-01")).map(|p| p.on_demand),
            Some(Micros(800_000))
        );
        assert_eq!(
            price_on(s, d("2025-01-01")).and_then(|p| p.spot),
            Some(Micros(220_000))
        );
        assert_eq!(
            price_on(s, d("2020-01-01")).map(|p| p.on_demand),
            Some(Micros(800_000))
        );
    }

    #[test]
    fn the_shared_traces_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data");
        let t = SimTraces::load(&dir).expect("shared data loads");
        assert_eq!(t.availability.len(), 16);
        assert!(t.availability.iter().any(|a| a.prices.is_some()));
        assert!(t.gcp_prices.len() > 500);
    }
}
