//! What the end-to-end tests of a control plane on simulated clouds share: its configuration,
//! the example workload's jobs, and reading the API's answers about them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Value, json};

/// A `spotplane serve` configuration on two simulated clouds (AWS in us-east-1, GCP in
/// us-central1, booting in 20–40 simulated seconds), ticking every second, with a local-folder
/// object store.
#[derive(Debug, Clone)]
pub struct ServeConfig<'a> {
    /// Simulated seconds per real second.
    pub speed: u32,
    /// The capacity loop's cluster tag.
    pub cluster: &'a str,
    /// The clouds sell only one-GPU machines (a gang then spans nodes).
    pub one_gpu_nodes: bool,
    /// The seeds of the AWS and the GCP cloud.
    pub seeds: (u64, u64),
    /// The clouds keep their state in `<dir>/sim-state` and outlive the process.
    pub shared_clouds: bool,
    /// More lines of the `[capacity]` table.
    pub capacity: &'a str,
    /// More tables.
    pub extra: &'a str,
}

impl ServeConfig<'_> {
    /// The file's text, for serving on `port` from `dir` with the `[database]` lines given.
    pub fn toml(&self, dir: &Path, port: u16, database: &str) -> String {
        let (aws_types, gcp_types) = if self.one_gpu_nodes {
            (r#"["g4dn.xlarge"]"#, r#"["g2-standard-4"]"#)
        } else {
            ("[]", "[]")
        };
        let data = crate::repo_root().join("../shared/data");
        let state_dir = if self.shared_clouds {
            format!("state_dir = \"{}/sim-state\"", dir.display())
        } else {
            String::new()
        };
        let ServeConfig {
            speed,
            cluster,
            seeds: (aws_seed, gcp_seed),
            capacity,
            extra,
            ..
        } = self;
        format!(
            r#"
[server]
listen = "127.0.0.1:{port}"

[database]
{database}

[sim]
data_dir = "{data}"
speed = {speed}
{state_dir}

[scheduler]
interval = "1s"

[capacity]
interval = "1s"
cluster = "{cluster}"
{capacity}

[recovery]
heartbeat_timeout = "5m"

# Relative, as in the embedded default: it is read against serve's working directory ({dir}).
[object_store]
url = "file://objects"

{extra}

[[providers]]
kind = "sim"
flavour = "aws"
regions = ["us-east-1"]
instance_types = {aws_types}
seed = {aws_seed}
boot_seconds = [20, 40]

[[providers]]
kind = "sim"
flavour = "gcp"
regions = ["us-central1"]
instance_types = {gcp_types}
seed = {gcp_seed}
boot_seconds = [20, 40]
"#,
            data = data.display(),
            dir = dir.display(),
        )
    }
}

/// A job of team `ml` running the example workload (in `dir`, see [`crate::workload_path`]):
/// `steps` steps of 50 ms on one GPU per replica, a checkpoint every `interval_s` simulated
/// seconds into `<dir>/objects/<name>`.
pub fn example_job(dir: &Path, name: &str, replicas: u32, steps: u32, interval_s: u32) -> Value {
    json!({
        "name": name, "team": "ml", "replicas": replicas,
        "shape": {"gpus": 1},
        "command": [crate::workload_path(dir)],
        "env": {"TRAIN_STEPS": steps.to_string(), "TRAIN_STEP_MS": "50", "TRAIN_WEIGHTS_BYTES": "65536"},
        "checkpoint": {"interval_s": interval_s, "uri": format!("file://{}/objects/{name}", dir.display())},
    })
}

/// Whether a `/v1/jobs/{id}/checkpoints` answer lists a complete checkpoint.
pub fn has_complete_checkpoint(checkpoints: &Value) -> bool {
    checkpoints["items"]
        .as_array()
        .is_some_and(|items| items.iter().any(|c| c["state"] == "complete"))
}

/// The node running `job`'s first replica, from a `/v1/overview` answer.
pub fn job_node<'a>(overview: &'a Value, job: &str) -> Option<&'a Value> {
    let replica = overview["replicas"]
        .as_array()?
        .iter()
        .find(|r| r["job_id"] == job)?;
    overview["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["id"] == replica["node_id"])
}

/// The cloud and the instance (its last path segment: the name the simulator's control routes
/// take) of the node running `job`'s first replica, from a `/v1/overview` answer.
pub fn job_instance(overview: &Value, job: &str) -> Option<(String, String)> {
    let node = job_node(overview, job)?;
    let instance = node["provider_instance_id"].as_str()?;
    Some((
        node["cloud"].as_str()?.to_owned(),
        instance.rsplit('/').next().unwrap_or(instance).to_owned(),
    ))
}

/// Checks the simulated clouds' bills (`items` of `/sim/control/{cloud}/bills`) against the
/// nodes the control plane knows (a `/v1/nodes` answer): every instance is a known node's, and
/// no node has two (nothing bought twice). Returns how many instances there were.
pub fn assert_one_instance_per_node(nodes: &Value, bills: &[Value]) -> usize {
    let known: BTreeSet<&str> = nodes["items"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["id"].as_str())
        .collect();
    let mut per_node: BTreeMap<&str, u32> = BTreeMap::new();
    for b in bills {
        let node = b["node_id"].as_str().expect("every instance is a node's");
        assert!(known.contains(node), "an instance of no known node: {b}");
        *per_node.entry(node).or_default() += 1;
    }
    assert!(
        per_node.values().all(|n| *n == 1),
        "an instance bought twice: {per_node:?}"
    );
    bills.len()
}
