//! Node agents for the simulated clouds' nodes, as the clouds would boot them: a real
//! `spotplane-agent` for every node the control plane buys, pointed at the simulator's metadata
//! service for its instance, killed when its node goes.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

/// The agents running, by node id.
pub type Agents = Arc<Mutex<HashMap<String, Child>>>;
/// The address each node's agent advertises, by node id.
pub type Addresses = Arc<Mutex<HashMap<String, String>>>;

/// Kills a node's agent (and so its workload), as the machine going away would.
pub fn kill_agent(agents: &Agents, node: &str) {
    let child = agents
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(node);
    if let Some(mut c) = child {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Starts an agent for every node the control plane buys, as the cloud would boot one with the
/// agent in its user data; kills it when the node is gone. `engine` are its container flags.
/// Each advertises an address of its own, `127.<net>.<n>` (every 127.0.0.0/8 address is this
/// machine's; `net` apart for each cluster, so gangs of tests side by side never share a master
/// address).
pub async fn launch_agents(
    admin: &'static str,
    url: String,
    dir: PathBuf,
    agents: Agents,
    engine: Vec<String>,
    addresses: Addresses,
    net: [u8; 2],
) {
    let http = reqwest::Client::new();
    let mut launched: HashSet<String> = HashSet::new();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let Ok(r) = http
            .get(format!("{url}/v1/nodes"))
            .bearer_auth(admin)
            .send()
            .await
        else {
            continue;
        };
        let Ok(v) = r.json::<Value>().await else {
            continue;
        };
        for n in v["items"].as_array().cloned().unwrap_or_default() {
            let id = n["id"].as_str().unwrap_or_default().to_owned();
            let state = n["state"].as_str().unwrap_or_default();
            if matches!(state, "terminated" | "terminating") {
                kill_agent(&agents, &id);
                continue;
            }
            let Some(instance) = n["provider_instance_id"].as_str() else {
                continue;
            };
            if launched.contains(&id) {
                continue;
            }
            let Ok(r) = http
                .post(format!("{url}/v1/nodes/{id}/bootstrap-token"))
                .bearer_auth(admin)
                .json(&json!({}))
                .send()
                .await
            else {
                continue;
            };
            let Ok(t) = r.json::<Value>().await else {
                continue;
            };
            let Some(token) = t["token"].as_str() else {
                continue;
            };
            let work = dir.join("agents").join(&id);
            std::fs::create_dir_all(&work).expect("agent dir");
            let token_file = work.join("bootstrap-token");
            std::fs::write(&token_file, token).expect("token file");
            let cloud = n["cloud"].as_str().unwrap_or("aws").to_owned();
            let name = instance.rsplit('/').next().unwrap_or(instance);
            let n = launched.len() % 254 + 1;
            let address = format!("127.{}.{}.{n}", net[0], net[1]);
            let log = std::fs::File::create(work.join("agent.log")).expect("log");
            let child = Command::new(crate::bin("spotplane-agent"))
                .args(["run", "--control-plane", &url, "--cloud", &cloud])
                .arg("--bootstrap-token-file")
                .arg(&token_file)
                .args([
                    "--metadata-url",
                    &format!("{url}/sim/metadata/{cloud}/{name}"),
                ])
                .arg("--work-dir")
                .arg(&work)
                .args(["--drain-grace", "5s"])
                .args(["--advertise-address", &address])
                .args(crate::agent_isolation_args())
                .args(&engine)
                .env("RUST_LOG", "info")
                .stdout(Stdio::from(log.try_clone().expect("log")))
                .stderr(Stdio::from(log))
                .spawn()
                .expect("agent starts");
            launched.insert(id.clone());
            addresses
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id.clone(), address);
            agents
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, child);
        }
    }
}

/// Kills every agent (and so its workload) and waits for each: what a test does at its end,
/// and on its way out when it fails (a `Child` is not killed when it is dropped).
pub fn kill_all(agents: &Agents) {
    let children: Vec<Child> = agents
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .map(|(_, c)| c)
        .collect();
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The example workload's output of every attempt of a job's replica, oldest attempt first,
/// from the agents' work folders under `dir/agents`.
pub fn replica_outputs(dir: &std::path::Path, job: &str, replica: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir.join("agents"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let base = e
            .path()
            .join("jobs")
            .join(job)
            .join(format!("replica-{replica}"));
        for a in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let name = a.file_name().to_string_lossy().into_owned();
            if let Some(n) = name.strip_prefix("attempt-").and_then(|n| n.parse().ok()) {
                out.push((
                    n,
                    std::fs::read_to_string(a.path().join("output.log")).unwrap_or_default(),
                ));
            }
        }
    }
    out.sort_by_key(|(n, _)| *n);
    out
}

/// The number after the last `prefix` (`done step=`, `resumed step=`) in an output.
pub fn step_of(output: &str, prefix: &str) -> Option<u64> {
    output
        .lines()
        .rev()
        .filter_map(|l| l.strip_prefix(prefix))
        .find_map(|r| r.split_whitespace().next()?.parse().ok())
}
