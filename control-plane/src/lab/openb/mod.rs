//! The openb packing experiment of FGD (Weng et al., "Beware of Fragmentation", USENIX ATC '23),
//! re-implemented from `shared/data/openb-protocol.md` so that its published figures can be
//! reproduced and our policies compared on the same footing.
//!
//! One experiment = one trace, one policy, one tune seed:
//! 1. [`workload::build`]: Go's generator ([`gorand`]) seeded with the seed shuffles the pods,
//!    appends random clones until the GPU request reaches 130% of capacity, and draws the
//!    per-node tie-break keys;
//! 2. [`workload::typical_pods`]: the target workload FGD measures fragmentation against;
//! 3. [`sim::simulate`]: pods arrive one by one, each goes to the feasible node with the best
//!    `(score, tie-break key)` or fails for good;
//! 4. [`report::alloc_columns`]: the GPU allocation ratio at each percentage of arrived
//!    demand, 0..130, with the published analysis scripts' rounding.
//!
//! `spotplane bench pack` is the command-line front end.

use std::fmt::Write as _;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde::ser::SerializeMap;

use crate::scheduler::frag::TypicalPods;
use crate::scheduler::policies;

pub mod gorand;
pub mod report;
pub mod sim;
pub mod trace;
pub mod workload;

pub use trace::{TraceError, TraceNode, TracePod};

/// The published per-seed column-130 figures on `default` (openb-protocol.md §10), seeds
/// 42..=51, for the policies implemented here.
pub const PUBLISHED_DEFAULT_130: [(&str, [f64; 10]); 3] = [
    (
        "random",
        [
            87.26, 88.03, 87.83, 87.36, 87.48, 87.41, 87.81, 87.07, 87.31, 87.14,
        ],
    ),
    (
        "best-fit",
        [
            93.13, 93.25, 93.09, 93.14, 93.19, 93.04, 92.95, 93.21, 92.87, 92.89,
        ],
    ),
    (
        "fgd",
        [
            95.29, 95.32, 95.44, 95.48, 95.49, 95.27, 95.37, 95.47, 95.35, 95.43,
        ],
    ),
];

/// Seeds given as `42`, `42..51` (inclusive) or `42,45,50`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedList(pub Vec<i64>);

impl FromStr for SeedList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut seeds = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let num = |x: &str| {
                x.trim()
                    .parse::<i64>()
                    .map_err(|e| format!("seed {x:?}: {e}"))
            };
            if let Some((a, b)) = part.split_once("..") {
                let (a, b) = (num(a)?, num(b.trim_start_matches('='))?);
                if b < a {
                    return Err(format!("empty seed range {part:?}"));
                }
                seeds.extend(a..=b);
            } else {
                seeds.push(num(part)?);
            }
        }
        if seeds.is_empty() {
            return Err("no seed given".into());
        }
        Ok(SeedList(seeds))
    }
}

/// Why an experiment could not run.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("unknown policy {0:?}; known: all, {known}", known = policies::NAMES.join(", "))]
    UnknownPolicy(String),
    #[error("{0} holds no nodes")]
    NoNodes(String),
    #[error("{0} holds no pods")]
    NoPods(String),
}

/// The GPU allocation ratio per arrival percentage, serialized as `{"0": …, …, "130": …}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Columns(pub Vec<Option<f64>>);

impl Serialize for Columns {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0.iter().enumerate() {
            m.serialize_entry(&k.to_string(), v)?;
        }
        m.end()
    }
}

/// One experiment's result: one line of `--json` output.
#[derive(Debug, Clone, Serialize)]
pub struct Experiment {
    pub workload: String,
    pub policy: String,
    pub seed: i64,
    pub gpu_alloc_pct: Columns,
    /// Wall time of the simulation and its report (the workload is built once per seed and
    /// shared by the policies; that takes a few milliseconds).
    pub elapsed_ms: f64,
    /// Pods no node could take.
    #[serde(skip)]
    pub failed: usize,
}

impl Experiment {
    /// The headline figure: the allocation ratio at 130% arrived.
    pub fn at_130(&self) -> Option<f64> {
        self.gpu_alloc_pct
            .0
            .get(report::LAST_COLUMN)
            .copied()
            .flatten()
    }

    /// The last column with events, and its figure (130 unless the demand stopped short).
    pub fn last_column(&self) -> Option<(usize, f64)> {
        self.gpu_alloc_pct
            .0
            .iter()
            .enumerate()
            .rev()
            .find_map(|(k, v)| v.map(|x| (k, x)))
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct PackSpec {
    /// The name printed as `workload` (e.g. `default`).
    pub workload: String,
    pub nodes: Vec<TraceNode>,
    pub pods: Vec<TracePod>,
    /// Policy names, or `all`.
    pub policies: Vec<String>,
    pub seeds: Vec<i64>,
    /// The tune ratio: the GPU request as a multiple of capacity (1.3).
    pub inflate: f64,
}

/// The workload name of a pod list: `openb_pod_list_default.csv` → `default`.
pub fn workload_name(pods: &Path) -> String {
    let stem = pods
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    stem.strip_prefix("openb_pod_list_")
        .map(str::to_owned)
        .unwrap_or(stem)
}

/// Reads the two CSV files into a [`PackSpec`].
pub fn load(
    nodes: &Path,
    pods: &Path,
    policies: &[String],
    seeds: &[i64],
    inflate: f64,
) -> Result<PackSpec, PackError> {
    let node_list = trace::read_nodes(nodes)?;
    if node_list.is_empty() {
        return Err(PackError::NoNodes(nodes.display().to_string()));
    }
    let pod_list = trace::read_pods(pods)?;
    if pod_list.is_empty() {
        return Err(PackError::NoPods(pods.display().to_string()));
    }
    Ok(PackSpec {
        workload: workload_name(pods),
        nodes: node_list,
        pods: pod_list,
        policies: policies.to_vec(),
        seeds: seeds.to_vec(),
        inflate,
    })
}

/// Runs every (seed, policy) pair, calling `emit` as each finishes. Each seed's workload is
/// built once and run by every policy: the same arrival sequence for all.
pub fn run(spec: &PackSpec, mut emit: impl FnMut(Experiment)) -> Result<(), PackError> {
    let names: Vec<&str> = if spec.policies.iter().any(|p| p == "all") {
        policies::NAMES.to_vec()
    } else {
        spec.policies.iter().map(String::as_str).collect()
    };
    let typical: Arc<TypicalPods> = Arc::new(workload::typical_pods(&spec.pods));
    let mut chosen = Vec::new();
    for name in names {
        let policy = policies::by_name(name, typical.clone())
            .ok_or_else(|| PackError::UnknownPolicy(name.to_owned()))?;
        chosen.push(policy);
    }
    for &seed in &spec.seeds {
        let w = workload::build(&spec.nodes, &spec.pods, seed, spec.inflate);
        for policy in &chosen {
            let started = Instant::now();
            let out = sim::simulate(&w, policy.as_ref(), seed as u64);
            let columns = report::alloc_columns(&out.events, out.total_gpus);
            let elapsed = started.elapsed().as_secs_f64() * 1000.0;
            emit(Experiment {
                workload: spec.workload.clone(),
                policy: policy.name().to_owned(),
                seed,
                gpu_alloc_pct: Columns(columns),
                elapsed_ms: (elapsed * 10.0).round() / 10.0,
                failed: out.failed.len(),
            });
        }
    }
    Ok(())
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x:.2}"))
}

/// One experiment for people: the headline and the 131 columns, ten to a line.
pub fn format_experiment(e: &Experiment) -> String {
    let (k, v) = e
        .last_column()
        .map_or((report::LAST_COLUMN, None), |(k, v)| (k, Some(v)));
    let mut s = format!(
        "{} {} seed {}: {}% of GPU allocated at {k}% arrived ({} pods failed, {:.1} ms)\n",
        e.workload,
        e.policy,
        e.seed,
        cell(v),
        e.failed,
        e.elapsed_ms
    );
    for (row, chunk) in e.gpu_alloc_pct.0.chunks(10).enumerate() {
        let _ = write!(s, "  {:>3}%:", row * 10);
        for v in chunk {
            let _ = write!(s, " {:>6}", cell(*v));
        }
        s.push('\n');
    }
    s
}

/// Column 130 by policy and seed, with the mean over seeds.
pub fn format_summary(results: &[Experiment]) -> String {
    let mut seeds: Vec<i64> = results.iter().map(|e| e.seed).collect();
    seeds.sort_unstable();
    seeds.dedup();
    let mut names: Vec<&str> = Vec::new();
    for e in results {
        if !names.contains(&e.policy.as_str()) {
            names.push(&e.policy);
        }
    }
    let mut s = format!("{:<10}", "policy");
    for seed in &seeds {
        let _ = write!(s, " {seed:>6}");
    }
    s.push_str("    mean\n");
    for name in names {
        let _ = write!(s, "{name:<10}");
        let mut vals = Vec::new();
        for seed in &seeds {
            let v = results
                .iter()
                .find(|e| e.policy == name && e.seed == *seed)
                .and_then(Experiment::at_130);
            if let Some(x) = v {
                vals.push(x);
            }
            let _ = write!(s, " {:>6}", cell(v));
        }
        let mean = (!vals.is_empty()).then(|| vals.iter().sum::<f64>() / vals.len() as f64);
        let _ = writeln!(
            s,
            " {:>7}",
            mean.map_or_else(|| "-".into(), |m| format!("{m:.3}"))
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_as_single_ranges_and_lists() {
        assert_eq!("42".parse(), Ok(SeedList(vec![42])));
        assert_eq!("42..44".parse(), Ok(SeedList(vec![42, 43, 44])));
        assert_eq!("42..=43,50".parse(), Ok(SeedList(vec![42, 43, 50])));
        assert!("44..42".parse::<SeedList>().is_err());
        assert!("x".parse::<SeedList>().is_err());
    }

    #[test]
    fn the_workload_is_named_after_the_pod_list() {
        assert_eq!(
            workload_name(Path::new("/d/openb_pod_list_gpushare40.csv")),
            "gpushare40"
        );
        assert_eq!(workload_name(Path::new("mine.csv")), "mine");
    }

    #[test]
    fn json_lines_list_the_columns_in_order() {
        let e = Experiment {
            workload: "default".into(),
            policy: "fgd".into(),
            seed: 42,
            gpu_alloc_pct: Columns(vec![Some(0.0), None, Some(95.29)]),
            elapsed_ms: 12.5,
            failed: 0,
        };
        let line = serde_json::to_string(&e).expect("serializes");
        assert_eq!(
            line,
            r#"{"workload":"default","policy":"fgd","seed":42,"gpu_alloc_pct":{"0":0.0,"1":null,"2":95.29},"elapsed_ms":12.5}"#
        );
    }
}
