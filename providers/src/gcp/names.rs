//! Identifiers: instance names from node ids, `requestId`s from client tokens, provider ids
//! (`zones/{zone}/instances/{name}`), tags as GCE labels, and an instance as spotplane sees it.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use google_cloud_compute_v1::model::{self, instance, scheduling};
use spotplane_core::{GpuModel, Market, NodeId};
use uuid::Uuid;

use super::{LABEL_MAX, NAME_PREFIX, NODE_ID_LABEL, REQUEST_ID_NAMESPACE};
use crate::{Instance, InstanceState};

/// The instance name of a node: `spotplane-` and the node id's 32 hex digits (a valid GCE
/// name: lowercase, starts with a letter, 42 characters).
pub fn instance_name(node: NodeId) -> String {
    format!("{NAME_PREFIX}{}", node.0.simple())
}

/// GCE's `requestId` for a client token: a UUIDv5, the same for the same token in every process.
pub fn request_id(client_token: &str) -> Uuid {
    Uuid::new_v5(&REQUEST_ID_NAMESPACE, client_token.as_bytes())
}

fn provider_id(zone: &str, name: &str) -> String {
    format!("zones/{zone}/instances/{name}")
}

pub(super) fn parse_provider_id(id: &str) -> Option<(&str, &str)> {
    let rest = id.strip_prefix("zones/")?;
    let (zone, name) = rest.split_once("/instances/")?;
    (!zone.is_empty() && !name.is_empty() && !zone.contains('/') && !name.contains('/'))
        .then_some((zone, name))
}

/// A tag key as a GCE label key: lowercase ASCII letters, digits, `_` and `-` (anything else
/// becomes `_`), starting with a letter (else prefixed `k_`), at most 63 characters.
pub fn label_key(key: &str) -> String {
    let mut k = label_chars(key);
    if !k.starts_with(|c: char| c.is_ascii_lowercase()) {
        k.insert_str(0, "k_");
    }
    k.truncate(LABEL_MAX);
    k
}

/// A tag value as a GCE label value: the characters of [`label_key`], may be empty, at most 63.
pub fn label_value(value: &str) -> String {
    let mut v = label_chars(value);
    v.truncate(LABEL_MAX);
    v
}

fn label_chars(s: &str) -> String {
    s.chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub(super) fn labels(tags: &BTreeMap<String, String>, node: NodeId) -> HashMap<String, String> {
    let mut l: HashMap<String, String> = tags
        .iter()
        .map(|(k, v)| (label_key(k), label_value(v)))
        .collect();
    l.insert(NODE_ID_LABEL.to_owned(), node.to_string());
    l
}

/// `instances.list`'s filter for instances carrying every tag, in label key order; empty for
/// no tags.
pub(super) fn label_filter(tags: &BTreeMap<String, String>) -> String {
    let labels: BTreeMap<String, String> = tags
        .iter()
        .map(|(k, v)| (label_key(k), label_value(v)))
        .collect();
    labels
        .iter()
        .map(|(k, v)| format!("(labels.{k} = \"{v}\")"))
        .collect::<Vec<_>>()
        .join(" AND ")
}

pub(super) fn is_n1(machine_type: &str) -> bool {
    machine_type.starts_with("n1-")
}

/// GCE's accelerator type for the GPUs N1 machine types take.
pub(super) fn n1_accelerator(model: GpuModel) -> Option<&'static str> {
    Some(match model {
        GpuModel::T4 => "nvidia-tesla-t4",
        GpuModel::V100_16GB => "nvidia-tesla-v100",
        GpuModel::P100 => "nvidia-tesla-p100",
        _ => return None,
    })
}

/// The last segment of a GCE resource URL (`…/zones/us-central1-a` → `us-central1-a`).
fn last_segment(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// An instance as spotplane sees it. `asked` are the tags a listing asked for: labels they
/// became are reported under the original key and value.
pub(super) fn to_instance(
    i: &model::Instance,
    zone: &str,
    asked: &BTreeMap<String, String>,
) -> Instance {
    let name = i.name.clone().unwrap_or_default();
    let zone = i
        .zone
        .as_deref()
        .map(last_segment)
        .unwrap_or(zone)
        .to_owned();
    let mut tags: BTreeMap<String, String> = i
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in asked {
        let (lk, lv) = (label_key(k), label_value(v));
        if tags.get(&lk) == Some(&lv) {
            tags.remove(&lk);
            tags.insert(k.clone(), v.clone());
        }
    }
    let node_id = i
        .labels
        .get(NODE_ID_LABEL)
        .and_then(|v| v.parse::<NodeId>().ok())
        .or_else(|| {
            name.strip_prefix(NAME_PREFIX)
                .and_then(|hex| Uuid::try_parse(hex).ok())
                .map(NodeId)
        });
    let spot = i.scheduling.as_ref().is_some_and(|s| {
        s.provisioning_model == Some(scheduling::ProvisioningModel::Spot)
            || s.preemptible == Some(true)
    });
    Instance {
        provider_id: provider_id(&zone, &name),
        node_id,
        zone,
        instance_type: i
            .machine_type
            .as_deref()
            .map(last_segment)
            .unwrap_or_default()
            .to_owned(),
        market: if spot { Market::Spot } else { Market::OnDemand },
        state: i.status.as_ref().map_or(InstanceState::Pending, state),
        launched_at: i
            .creation_timestamp
            .as_deref()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc)),
        ended_at: None,
        tags,
    }
}

fn state(s: &instance::Status) -> InstanceState {
    use instance::Status as S;
    match s {
        S::Provisioning | S::Staging | S::Pending | S::Repairing => InstanceState::Pending,
        S::Running => InstanceState::Running,
        S::Stopping | S::Suspending | S::PendingStop | S::Deprovisioning => InstanceState::Stopping,
        S::Terminated | S::Stopped | S::Suspended => InstanceState::Stopped,
        other => {
            tracing::debug!(status = ?other, "unknown GCE instance status; reading it as pending");
            InstanceState::Pending
        }
    }
}
