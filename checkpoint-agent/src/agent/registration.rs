//! Registration: with the node credential kept in the work directory (a restart), else with
//! the bootstrap token, exchanged once for the credential; and what the node reports of itself.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use spotplane_core::NodeId;
use spotplane_core::agent::{PROTOCOL_VERSION, RegisterRequest, bootstrap_token_node};
use tokio_util::sync::CancellationToken;

use super::{AgentConfig, AgentError, CREDENTIAL_FILE, write_private};
use crate::client::{ClientError, ControlPlane};
use crate::container::Engine;
use crate::notice::NoticeSource;
use crate::workload::parse_signal;

/// The node credential as kept in the work directory (mode 0600).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedCredential {
    node_id: NodeId,
    credential: String,
}

/// What this node has, for registration.
fn register_request(
    node_id: NodeId,
    instance_id: Option<String>,
    engine: Option<&Engine>,
    address: Option<std::net::IpAddr>,
) -> RegisterRequest {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let memory_mib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024);
    RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        node_id,
        agent_version: env!("CARGO_PKG_VERSION").into(),
        hostname,
        instance_id,
        cpu_milli: u32::try_from(cpus * 1000).unwrap_or(u32::MAX),
        memory_mib,
        gpus: crate::inventory::gpus(),
        container_engine: engine.map(Engine::info),
        address: address.map(|a| a.to_string()),
    }
}

/// The address to register: `--advertise-address`, else the one this node reaches the control
/// plane from; `None` (the control plane then gives peers the hostname) if neither is known.
async fn advertised_address(cfg: &AgentConfig) -> Option<std::net::IpAddr> {
    if let Some(a) = cfg.advertise_address {
        return Some(a);
    }
    match crate::gang::local_address_towards(&cfg.control_plane).await {
        Ok(a) => {
            tracing::info!(address = %a, "gang peers reach this node at the address it reaches the control plane from");
            Some(a)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell this node's address; gang peers get its hostname (set --advertise-address)");
            None
        }
    }
}

/// Registers, exchanging the bootstrap token when there is no usable credential. Retries
/// while the control plane is unreachable; gives up on a refusal.
pub(super) async fn register(
    cfg: &AgentConfig,
    notices: &dyn NoticeSource,
    engine: Option<&Engine>,
    cancel: &CancellationToken,
) -> Result<(Arc<ControlPlane>, NodeId, Duration, Duration, Signal), AgentError> {
    let bootstrap = std::fs::read_to_string(&cfg.bootstrap_token_file)
        .ok()
        .map(|t| t.trim().to_owned());
    let boot_node = bootstrap.as_deref().and_then(bootstrap_token_node);
    // A credential of another node than the bootstrap token's (a work directory reused on a
    // new node) is not ours any more.
    let saved: Option<SavedCredential> = std::fs::read(cfg.work_dir.join(CREDENTIAL_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice::<SavedCredential>(&b).ok())
        .filter(|s| boot_node.is_none_or(|n| n == s.node_id));
    let node_id = match (&saved, boot_node) {
        (Some(s), _) => s.node_id,
        (None, Some(n)) => n,
        (None, None) => return Err(AgentError::BadToken(cfg.bootstrap_token_file.clone())),
    };
    let instance_id = notices.instance_id().await;
    let req = register_request(node_id, instance_id, engine, advertised_address(cfg).await);
    let mut candidates: VecDeque<(String, bool)> = VecDeque::new();
    if let Some(s) = &saved {
        candidates.push_back((s.credential.clone(), false));
    }
    if let (Some(b), Some(n)) = (bootstrap, boot_node)
        && n == node_id
    {
        candidates.push_back((b, true));
    }
    let mut backoff = Duration::from_millis(500);
    while let Some((token, is_bootstrap)) = candidates.front().cloned() {
        let cp = Arc::new(
            ControlPlane::new(&cfg.control_plane, token, Duration::from_secs(15))
                .map_err(AgentError::Refused)?,
        );
        match cp.register(&req).await {
            Ok(resp) => {
                if let Some(cred) = resp.credential {
                    let saved = SavedCredential {
                        node_id,
                        credential: cred.clone(),
                    };
                    let body = serde_json::to_vec(&saved).unwrap_or_default();
                    write_private(&cfg.work_dir.join(CREDENTIAL_FILE), &body)?;
                    cp.set_token(cred);
                } else if is_bootstrap {
                    tracing::warn!("the bootstrap exchange returned no credential");
                }
                let signal = parse_signal(&resp.checkpoint_signal).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "unknown checkpoint signal; using SIGUSR1");
                    Signal::SIGUSR1
                });
                tracing::info!(node = %node_id, exchanged = is_bootstrap, "registered");
                return Ok((
                    cp,
                    node_id,
                    cfg.heartbeat_interval
                        .unwrap_or(Duration::from_millis(resp.heartbeat_interval_ms.max(100))),
                    cfg.notice_poll_interval
                        .unwrap_or(Duration::from_millis(resp.notice_poll_interval_ms.max(100))),
                    signal,
                ));
            }
            Err(ClientError::Unauthorized(why)) => {
                tracing::warn!(bootstrap = is_bootstrap, %why, "token refused");
                candidates.pop_front();
                if candidates.is_empty() {
                    return Err(AgentError::Refused(ClientError::Unauthorized(why)));
                }
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, retry_in = ?backoff, "registration failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = cancel.cancelled() => return Err(AgentError::Refused(e)),
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
            Err(e) => return Err(AgentError::Refused(e)),
        }
    }
    Err(AgentError::BadToken(cfg.bootstrap_token_file.clone()))
}
