//! Reading a Can't Be Late trace file (`shared/data/spot/cant-be-late`, see its README).
//!
//! One JSON object per file: `{"metadata": {"gap_seconds": G}, "data": [0, 1, ...]}` with
//! `0` = a spot instance is available (or kept) during that tick and `1` = not available (or
//! preempted), as the authors' simulator reads it. Some preemption files add `"prices"`, the
//! spot price in USD per hour at each tick. This is the only file of [`crate::lab::deadline`] that
//! touches the filesystem; every error names the file.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::Trace;

/// A trace file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("reading {path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a Can't Be Late trace")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Deserialize)]
struct Raw {
    metadata: Metadata,
    data: Vec<serde_json::Value>,
    #[serde(default)]
    prices: Option<Vec<f64>>,
}

#[derive(Deserialize)]
struct Metadata {
    gap_seconds: f64,
}

/// Reads and checks a trace file.
pub fn load(path: &Path) -> Result<Trace, TraceError> {
    let text = std::fs::read(path).map_err(|source| TraceError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(path, &text)
}

/// Parses a trace; `path` only names the source in errors.
pub fn parse(path: &Path, text: &[u8]) -> Result<Trace, TraceError> {
    let invalid = |message: String| TraceError::Invalid {
        path: path.to_owned(),
        message,
    };
    let raw: Raw = serde_json::from_slice(text).map_err(|source| TraceError::Json {
        path: path.to_owned(),
        source,
    })?;
    let gap = raw.metadata.gap_seconds;
    if !(gap.is_finite() && gap >= 1.0 && gap.fract() == 0.0 && gap <= f64::from(u32::MAX)) {
        return Err(invalid(format!(
            "metadata.gap_seconds is {gap}; expected a whole number of seconds ≥ 1"
        )));
    }
    if raw.data.is_empty() {
        return Err(invalid("\"data\" is empty".into()));
    }
    // Availability traces count available instances (0 or 1 for one node); the values are
    // read the authors' way: 0 = available, anything else = not available.
    let available = raw
        .data
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_f64() {
            Some(x) if x.is_finite() && x >= 0.0 => Ok(x == 0.0),
            _ => Err(invalid(format!(
                "data[{i}] is {v}; expected 0 (available) or 1 (not available)"
            ))),
        })
        .collect::<Result<Vec<bool>, _>>()?;
    if let Some(prices) = &raw.prices {
        if prices.len() != available.len() {
            return Err(invalid(format!(
                "\"prices\" has {} values for {} ticks of \"data\"",
                prices.len(),
                available.len()
            )));
        }
        if let Some((i, p)) = prices
            .iter()
            .enumerate()
            .find(|(_, p)| !(p.is_finite() && **p >= 0.0))
        {
            return Err(invalid(format!("prices[{i}] is {p}")));
        }
    }
    Ok(Trace {
        // Checked above: a whole number in 1..=u32::MAX.
        gap_seconds: gap as u32,
        available,
        spot_prices: raw.prices,
    })
}
