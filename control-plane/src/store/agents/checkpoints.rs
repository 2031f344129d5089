//! Checkpoint reports: what the agents say they made, checked against the job's checkpoint
//! prefix, and the resume point of each replica (its latest durable checkpoint).

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionTrait,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use spotplane_core::agent::{
    CheckpointManifest, CheckpointOutcome, CheckpointReport, CheckpointTrigger, CommandKind,
};
use spotplane_core::job::JobSpec;
use spotplane_core::{CheckpointId, JobId, NodeId};
use utoipa::ToSchema;

use super::commands::command_job;
use super::{to_json, u32_col};
use crate::model::{Page, PageRequest};
use crate::store::entity::{agent_command, allocation, checkpoint, job, job_event, node, outbox};
use crate::store::{Store, StoreError, from_json, parse_col};

/// A checkpoint as the control plane knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointRecord {
    pub id: CheckpointId,
    pub job_id: JobId,
    pub replica: u32,
    pub attempt: u32,
    /// The manifest's object-store URI.
    pub uri: String,
    /// `complete` (durable: a resume point), `missed_deadline` or `failed`.
    pub state: String,
    pub trigger: CheckpointTrigger,
    pub node_id: Option<NodeId>,
    pub manifest: Option<CheckpointManifest>,
    pub total_bytes: Option<u64>,
    pub message: Option<String>,
    pub created_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
}

/// The `checkpoints.state` of a durable checkpoint (what the scheduler reads).
pub const CHECKPOINT_COMPLETE: &str = "complete";

fn checkpoint_state(o: CheckpointOutcome) -> &'static str {
    match o {
        CheckpointOutcome::Durable => CHECKPOINT_COMPLETE,
        CheckpointOutcome::MissedDeadline => "missed_deadline",
        CheckpointOutcome::Failed => "failed",
    }
}

fn trigger_text(t: CheckpointTrigger) -> &'static str {
    match t {
        CheckpointTrigger::Notice => "notice",
        CheckpointTrigger::Command => "command",
        CheckpointTrigger::Drain => "drain",
    }
}

fn parse_trigger(id: &str, s: &str) -> Result<CheckpointTrigger, StoreError> {
    from_json("checkpoints", id, Value::String(s.to_owned()))
}

fn checkpoint_from_row(row: checkpoint::Model) -> Result<CheckpointRecord, StoreError> {
    let id = row.id.clone();
    Ok(CheckpointRecord {
        id: parse_col("checkpoints", &id, &row.id)?,
        job_id: parse_col("checkpoints", &id, &row.job_id)?,
        replica: u32_col("checkpoints", &id, row.replica)?,
        attempt: u32_col("checkpoints", &id, row.attempt)?,
        uri: row.uri,
        trigger: parse_trigger(&id, &row.trigger)?,
        node_id: row
            .node_id
            .as_deref()
            .map(|n| parse_col("checkpoints", &id, n))
            .transpose()?,
        manifest: row
            .manifest
            .map(|m| from_json("checkpoints", &id, m))
            .transpose()?,
        total_bytes: row
            .total_bytes
            .map(|b| u64::try_from(b).map_err(|e| StoreError::corrupt("checkpoints", &id, e)))
            .transpose()?,
        state: row.state,
        message: row.message,
        created_at: row.created_at,
        completed_at: row.completed_at,
    })
}

/// Writes one checkpoint report: the row, a history entry of the job and its outbox event.
/// Idempotent: the same report again changes nothing; a durable checkpoint is never replaced.
/// With `default_root` (an agent's report), its URI must be under the job's checkpoint
/// prefix; without, the caller built the URI from a command the control plane issued.
pub(super) async fn record_checkpoint_in<C: ConnectionTrait>(
    txn: &C,
    node_id: NodeId,
    report: &CheckpointReport,
    default_root: Option<&str>,
    now: DateTime<Utc>,
) -> Result<CheckpointRecord, StoreError> {
    let job_row = job::Entity::find_by_id(report.job_id.to_string())
        .one(txn)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("job {} on this node", report.job_id)))?;
    // A node acts for its own jobs only: it must have run this attempt, or been told to
    // checkpoint the job. Anything else answers as a job that does not exist.
    let attempt = i32::try_from(report.attempt).unwrap_or(i32::MAX);
    let ran_it = allocation::Entity::find()
        .filter(allocation::Column::JobId.eq(job_row.id.clone()))
        .filter(allocation::Column::NodeId.eq(node_id.to_string()))
        .filter(allocation::Column::Attempt.eq(attempt))
        .one(txn)
        .await?
        .is_some();
    let told_to = ran_it
        || agent_command::Entity::find()
            .filter(agent_command::Column::NodeId.eq(node_id.to_string()))
            .all(txn)
            .await?
            .into_iter()
            .filter_map(|c| serde_json::from_value::<CommandKind>(c.body).ok())
            .any(|k| command_job(&k) == Some(report.job_id));
    if !told_to {
        return Err(StoreError::NotFound(format!(
            "job {} on this node",
            report.job_id
        )));
    }
    // A checkpoint is where the job's own go, or a node could point the job's next attempt
    // at anyone's storage.
    if let Some(root) = default_root {
        let spec: JobSpec = from_json("jobs", &job_row.id, job_row.spec.clone())?;
        let prefix = crate::store::recovery::checkpoint_prefix(&spec, report.job_id, root);
        if !is_checkpoint_of(&report.uri, &prefix, report.replica, report.checkpoint_id) {
            return Err(StoreError::Invalid {
                field: "uri".into(),
                message: format!(
                    "must be the manifest of this checkpoint under the job's checkpoint prefix, {}/replica-{}/{}/manifest.json",
                    prefix.trim_end_matches('/'),
                    report.replica,
                    report.checkpoint_id
                ),
            });
        }
    }
    let state = checkpoint_state(report.outcome);
    let manifest = report.manifest.as_ref().map(to_json).transpose()?;
    let total = report
        .manifest
        .as_ref()
        .map(|m| i64::try_from(m.total_bytes).unwrap_or(i64::MAX));
    let id = report.checkpoint_id.to_string();
    if let Some(existing) = checkpoint::Entity::find_by_id(id.clone()).one(txn).await? {
        if existing.job_id != job_row.id || existing.replica != report.replica as i32 {
            return Err(StoreError::Conflict(format!(
                "checkpoint {id} belongs to another job or replica"
            )));
        }
        if existing.state == CHECKPOINT_COMPLETE {
            if state == CHECKPOINT_COMPLETE && existing.manifest == manifest {
                return checkpoint_from_row(existing);
            }
            return Err(StoreError::Conflict(format!(
                "checkpoint {id} is already durable with another manifest"
            )));
        }
        if existing.state == state && existing.message == report.message {
            return checkpoint_from_row(existing);
        }
        checkpoint::Entity::delete_by_id(id.clone())
            .exec(txn)
            .await?;
    }
    let row = checkpoint::ActiveModel {
        id: Set(id.clone()),
        job_id: Set(job_row.id.clone()),
        replica: Set(i32::try_from(report.replica).unwrap_or(i32::MAX)),
        attempt: Set(attempt),
        uri: Set(report.uri.clone()),
        state: Set(state.to_owned()),
        trigger: Set(trigger_text(report.trigger).to_owned()),
        manifest: Set(manifest),
        total_bytes: Set(total),
        created_at: Set(report.started_at),
        completed_at: Set((state == CHECKPOINT_COMPLETE).then_some(report.finished_at)),
        node_id: Set(Some(node_id.to_string())),
        message: Set(report.message.clone()),
    }
    .insert(txn)
    .await?;
    let kind = match report.outcome {
        CheckpointOutcome::Durable => "job.checkpointed",
        CheckpointOutcome::MissedDeadline => "job.checkpoint_missed_deadline",
        CheckpointOutcome::Failed => "job.checkpoint_failed",
    };
    let seconds =
        |from: DateTime<Utc>| (report.finished_at - from).num_milliseconds().max(0) as f64 / 1000.0;
    // From the cloud's notice to durable: the agent starts a `notice` checkpoint as it sees
    // the notice; a `drain` one starts when spotplane drains the job, which it does at a
    // notice the cloud's event stream gave.
    let since_notice = match (report.outcome, report.trigger) {
        (CheckpointOutcome::Durable, CheckpointTrigger::Notice) => Some(seconds(report.started_at)),
        (CheckpointOutcome::Durable, CheckpointTrigger::Drain) => job_row
            .drain_started_at
            .filter(|_| crate::recovery::is_cloud_drain(job_row.state_reason.as_deref()))
            .map(seconds),
        _ => None,
    };
    let mut data = json!({"checkpoint_id": report.checkpoint_id, "replica": report.replica,
        "attempt": report.attempt, "uri": report.uri, "node_id": node_id,
        "trigger": report.trigger, "total_bytes": total,
        "seconds": seconds(report.started_at)});
    if let Some(s) = since_notice {
        data["since_notice_seconds"] = json!(s);
    }
    job_event::ActiveModel {
        job_id: Set(job_row.id.clone()),
        at: Set(now),
        kind: Set(kind.into()),
        from_state: Set(None),
        to_state: Set(None),
        reason: Set(report.message.clone()),
        data: Set(Some(data.clone())),
        ..Default::default()
    }
    .insert(txn)
    .await?;
    outbox::ActiveModel {
        kind: Set(kind.into()),
        subject_kind: Set("job".into()),
        subject_id: Set(job_row.id.clone()),
        team_id: Set(Some(job_row.team_id.clone())),
        payload: Set(
            json!({"job": {"id": job_row.id, "state": job_row.state, "attempt": job_row.attempt},
            "checkpoint": data}),
        ),
        created_at: Set(now),
        ..Default::default()
    }
    .insert(txn)
    .await?;
    checkpoint_from_row(row)
}

/// Whether `uri` names checkpoint `id`'s manifest of `replica` under `prefix`
/// (`<prefix>/replica-<r>/<id>/manifest.json`). Compared as URLs, segment by decoded segment,
/// so neither spelling (`%2e%2e`, doubled slashes) nor dot segments lead out of the prefix.
pub(crate) fn is_checkpoint_of(uri: &str, prefix: &str, replica: u32, id: CheckpointId) -> bool {
    fn parts(u: &str) -> Option<(String, String, Vec<String>)> {
        let url = url::Url::parse(u).ok()?;
        let segs = url
            .path_segments()
            .map(|s| {
                s.filter(|p| !p.is_empty())
                    .map(percent_decode)
                    .collect::<Option<Vec<_>>>()
            })
            .unwrap_or(Some(Vec::new()))?;
        Some((
            url.scheme().to_owned(),
            url.host_str().unwrap_or_default().to_owned(),
            segs,
        ))
    }
    fn percent_decode(p: &str) -> Option<String> {
        let bytes = p.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                let hex = p.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).ok()
    }
    let (Some((scheme, host, segs)), Some((p_scheme, p_host, p_segs))) =
        (parts(uri), parts(prefix))
    else {
        return false;
    };
    let tail = [
        format!("replica-{replica}"),
        id.to_string(),
        "manifest.json".to_owned(),
    ];
    scheme == p_scheme
        && host == p_host
        && segs.len() == p_segs.len() + tail.len()
        && segs[..p_segs.len()] == p_segs[..]
        && segs[p_segs.len()..] == tail[..]
}

impl Store {
    /// Records a checkpoint report of this node (see [`CheckpointReport`]); a job the node
    /// neither ran (this attempt) nor was told to checkpoint is not found.
    /// Its `uri` must be the checkpoint's manifest under the job's checkpoint prefix (its own
    /// `checkpoint.uri`, else `<default_root>/jobs/<id>`), or it is refused as invalid.
    pub async fn record_checkpoint(
        &self,
        node_id: NodeId,
        report: &CheckpointReport,
        default_root: &str,
        now: DateTime<Utc>,
    ) -> Result<CheckpointRecord, StoreError> {
        self.measured("record_checkpoint", || async {
            let txn = self.write.begin().await?;
            let rec = record_checkpoint_in(&txn, node_id, report, Some(default_root), now).await?;
            txn.commit().await?;
            Ok(rec)
        })
        .await
    }

    /// A job's checkpoints, newest first.
    /// One page of a job's checkpoints, newest first.
    pub async fn job_checkpoints_page(
        &self,
        job_id: JobId,
        page: &PageRequest<CheckpointId>,
    ) -> Result<Page<CheckpointRecord>, StoreError> {
        self.measured("job_checkpoints_page", || async {
            let mut q = checkpoint::Entity::find()
                .filter(checkpoint::Column::JobId.eq(job_id.to_string()))
                .order_by_desc(checkpoint::Column::Id)
                .limit(page.rows_to_read());
            if let Some(after) = page.after {
                q = q.filter(checkpoint::Column::Id.lt(after.to_string()));
            }
            let (rows, next_cursor) = page.cut(q.all(&self.read).await?, |r| r.id.clone());
            Ok(Page {
                items: rows
                    .into_iter()
                    .map(checkpoint_from_row)
                    .collect::<Result<_, _>>()?,
                next_cursor,
            })
        })
        .await
    }

    pub async fn job_checkpoints(
        &self,
        job_id: JobId,
    ) -> Result<Vec<CheckpointRecord>, StoreError> {
        self.measured("job_checkpoints", || async {
            checkpoint::Entity::find()
                .filter(checkpoint::Column::JobId.eq(job_id.to_string()))
                .order_by_desc(checkpoint::Column::Id)
                .all(&self.read)
                .await?
                .into_iter()
                .map(checkpoint_from_row)
                .collect()
        })
        .await
    }

    /// The resume point of one replica: its latest durable checkpoint, if it has one.
    pub async fn latest_durable_checkpoint(
        &self,
        job_id: JobId,
        replica: u32,
    ) -> Result<Option<CheckpointRecord>, StoreError> {
        self.measured("latest_durable_checkpoint", || async {
            checkpoint::Entity::find()
                .filter(checkpoint::Column::JobId.eq(job_id.to_string()))
                .filter(checkpoint::Column::Replica.eq(i32::try_from(replica).unwrap_or(i32::MAX)))
                .filter(checkpoint::Column::State.eq(CHECKPOINT_COMPLETE))
                .order_by_desc(checkpoint::Column::CompletedAt)
                .order_by_desc(checkpoint::Column::Id)
                .one(&self.read)
                .await?
                .map(checkpoint_from_row)
                .transpose()
        })
        .await
    }

    /// Where the job's checkpoint is, for the planner's deadline model: the region of the
    /// node that wrote replica 0's latest durable checkpoint, and that checkpoint's bytes.
    /// `None` before its first durable checkpoint.
    pub async fn checkpoint_location(
        &self,
        job_id: JobId,
    ) -> Result<Option<(String, Option<u64>)>, StoreError> {
        let Some(cp) = self.latest_durable_checkpoint(job_id, 0).await? else {
            return Ok(None);
        };
        self.measured("checkpoint_location", || async {
            let Some(alloc) = allocation::Entity::find()
                .filter(allocation::Column::JobId.eq(job_id.to_string()))
                .filter(allocation::Column::Replica.eq(0))
                .filter(
                    allocation::Column::Attempt.eq(i32::try_from(cp.attempt).unwrap_or(i32::MAX)),
                )
                .order_by_desc(allocation::Column::CreatedAt)
                .one(&self.read)
                .await?
            else {
                return Ok(None);
            };
            let region = node::Entity::find_by_id(alloc.node_id)
                .one(&self.read)
                .await?
                .map(|n| n.region);
            Ok(region.map(|r| (r, cp.total_bytes)))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_the_jobs_only_as_its_manifest_under_the_jobs_prefix() {
        let id = CheckpointId(uuid::Uuid::now_v7());
        let ok = |uri: &str, prefix: &str| is_checkpoint_of(uri, prefix, 0, id);
        let a = "file:///tmp/.tmpx/bucket/team-a";
        assert!(ok(&format!("{a}/replica-0/{id}/manifest.json"), a));
        assert!(ok(
            &format!("{a}/replica-0/{id}/manifest.json"),
            &format!("{a}/")
        ));
        assert!(ok(
            &format!("s3://b/p/replica-0/{id}/manifest.json"),
            "s3://b/p"
        ));
        for bad in [
            format!("file:///tmp/.tmpx/bucket/team-b/replica-0/{id}/manifest.json"),
            format!("{a}/../team-b/replica-0/{id}/manifest.json"),
            format!("{a}/replica-1/{id}/manifest.json"),
            format!("s3://tmp/.tmpx/bucket/team-a/replica-0/{id}/manifest.json"),
            "garbage".to_owned(),
        ] {
            assert!(!ok(&bad, a), "{bad}");
        }
    }
}
