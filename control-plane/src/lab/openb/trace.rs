//! Reading the openb CSV files (openb-protocol.md §1).
//!
//! Columns are found by header name, so the `multigpu*` files (five columns) read like the
//! others. The files have no quoting. Every error names the file and the line.

use std::path::{Path, PathBuf};

use spotplane_core::GpuModel;

/// A problem with an input file.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("reading {path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// One GPU node of `openb_node_list_gpu_node.csv`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceNode {
    pub name: String,
    pub cpu: i64,
    pub mem: i64,
    pub gpus: u32,
    /// `None` for a node without GPUs.
    pub model: Option<GpuModel>,
}

/// One pod of an `openb_pod_list_*.csv`, as the simulator's YAML conversion sees it (§1.2):
/// CPU-only pods carry no GPU fields, `gpu_milli` is clipped to 1000.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePod {
    pub name: String,
    pub cpu: i64,
    pub mem: i64,
    pub num_gpu: u32,
    pub gpu_milli: u32,
    /// The non-empty parts of `gpu_spec` joined with `|` (part of the typical-pod key).
    pub spec: String,
    /// The models of `spec`, in its order (duplicates kept; only membership matters).
    pub models: Vec<GpuModel>,
}

impl TracePod {
    /// gpu_milli × num_gpu.
    pub fn total_milli(&self) -> i64 {
        i64::from(self.gpu_milli) * i64::from(self.num_gpu)
    }
}

/// A CSV table: the header's column names and the data rows with their 1-based line numbers.
struct Table<'a> {
    path: &'a Path,
    header: Vec<&'a str>,
    rows: Vec<(usize, Vec<&'a str>)>,
}

impl<'a> Table<'a> {
    fn parse(path: &'a Path, text: &'a str) -> Result<Self, TraceError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
            .filter(|(_, l)| !l.trim().is_empty());
        let Some((_, head)) = lines.next() else {
            return Err(TraceError::Parse {
                path: path.to_owned(),
                line: 1,
                message: "empty file: no header".into(),
            });
        };
        let header: Vec<&str> = head.split(',').map(str::trim).collect();
        let rows = lines
            .map(|(n, l)| (n, l.split(',').map(str::trim).collect()))
            .collect();
        Ok(Table { path, header, rows })
    }

    fn column(&self, name: &str) -> Result<usize, TraceError> {
        self.header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| TraceError::Parse {
                path: self.path.to_owned(),
                line: 1,
                message: format!("no column {name:?} in the header"),
            })
    }

    fn error(&self, line: usize, message: String) -> TraceError {
        TraceError::Parse {
            path: self.path.to_owned(),
            line,
            message,
        }
    }

    fn field<'r>(
        &self,
        line: usize,
        row: &'r [&'a str],
        col: usize,
        name: &str,
    ) -> Result<&'r str, TraceError> {
        row.get(col)
            .copied()
            .ok_or_else(|| self.error(line, format!("missing field {name}")))
    }

    fn int<T: std::str::FromStr>(
        &self,
        line: usize,
        row: &[&str],
        col: usize,
        name: &str,
    ) -> Result<T, TraceError>
    where
        T::Err: std::fmt::Display,
    {
        let raw = self.field(line, row, col, name)?;
        raw.parse::<T>()
            .map_err(|e| self.error(line, format!("{name} {raw:?}: {e}")))
    }
}

fn read(path: &Path) -> Result<String, TraceError> {
    std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Reads a node list (`sn,cpu_milli,memory_mib,gpu,model`).
pub fn read_nodes(path: &Path) -> Result<Vec<TraceNode>, TraceError> {
    parse_nodes(path, &read(path)?)
}

/// Parses a node list; `path` only names the source in errors.
pub fn parse_nodes(path: &Path, text: &str) -> Result<Vec<TraceNode>, TraceError> {
    let t = Table::parse(path, text)?;
    let (sn, cpu, mem, gpu, model) = (
        t.column("sn")?,
        t.column("cpu_milli")?,
        t.column("memory_mib")?,
        t.column("gpu")?,
        t.column("model")?,
    );
    let mut nodes = Vec::with_capacity(t.rows.len());
    for (line, row) in &t.rows {
        let line = *line;
        let gpus: u32 = t.int(line, row, gpu, "gpu")?;
        let label = row.get(model).copied().unwrap_or_default();
        let model = if label.is_empty() {
            if gpus > 0 {
                return Err(t.error(line, "a node with GPUs needs a model".into()));
            }
            None
        } else {
            Some(
                label
                    .parse::<GpuModel>()
                    .map_err(|e| t.error(line, e.to_string()))?,
            )
        };
        nodes.push(TraceNode {
            name: t.field(line, row, sn, "sn")?.to_owned(),
            cpu: t.int(line, row, cpu, "cpu_milli")?,
            mem: t.int(line, row, mem, "memory_mib")?,
            gpus,
            model,
        });
    }
    Ok(nodes)
}

/// Reads a pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,…]`).
pub fn read_pods(path: &Path) -> Result<Vec<TracePod>, TraceError> {
    parse_pods(path, &read(path)?)
}

/// Parses a pod list; `path` only names the source in errors.
pub fn parse_pods(path: &Path, text: &str) -> Result<Vec<TracePod>, TraceError> {
    let t = Table::parse(path, text)?;
    let (name, cpu, mem, num_gpu, gpu_milli) = (
        t.column("name")?,
        t.column("cpu_milli")?,
        t.column("memory_mib")?,
        t.column("num_gpu")?,
        t.column("gpu_milli")?,
    );
    let spec_col = t.column("gpu_spec").ok();
    let mut pods = Vec::with_capacity(t.rows.len());
    for (line, row) in &t.rows {
        let line = *line;
        let num: u32 = t.int(line, row, num_gpu, "num_gpu")?;
        let milli: u32 = t.int(line, row, gpu_milli, "gpu_milli")?;
        let (milli, spec, models) = if num == 0 {
            // A CPU-only pod carries no GPU fields at all (§1.2).
            (0, String::new(), Vec::new())
        } else {
            let raw = spec_col.and_then(|c| row.get(c).copied()).unwrap_or("");
            let parts: Vec<&str> = raw.split('|').filter(|p| !p.is_empty()).collect();
            let models = parts
                .iter()
                .map(|p| p.parse::<GpuModel>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| t.error(line, e.to_string()))?;
            (milli.min(1000), parts.join("|"), models)
        };
        pods.push(TracePod {
            name: t.field(line, row, name, "name")?.to_owned(),
            cpu: t.int(line, row, cpu, "cpu_milli")?,
            mem: t.int(line, row, mem, "memory_mib")?,
            num_gpu: num,
            gpu_milli: milli,
            spec,
            models,
        });
    }
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_only_pods_drop_their_gpu_fields_and_shares_are_clipped() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
                    p0,1000,10,0,500,T4\n\
                    p1,2000,20,1,1500,V100M16||V100M32\n";
        let pods = parse_pods(Path::new("pods.csv"), text).expect("parses");
        assert_eq!((pods[0].gpu_milli, pods[0].spec.as_str()), (0, ""));
        assert_eq!(pods[1].gpu_milli, 1000);
        assert_eq!(pods[1].spec, "V100M16|V100M32");
        assert_eq!(
            pods[1].models,
            vec![GpuModel::V100_16GB, GpuModel::V100_32GB]
        );
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,x,0\n";
        let err = parse_pods(Path::new("pods.csv"), text).expect_err("bad num_gpu");
        assert!(err.to_string().starts_with("pods.csv:2: num_gpu"), "{err}");
        let text = "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,1,Z80\n";
        let err = parse_nodes(Path::new("nodes.csv"), text).expect_err("bad model");
        assert!(
            err.to_string().starts_with("nodes.csv:2: unknown GPU"),
            "{err}"
        );
    }
}
