//! Replicas' output, as their agents ship it.
//!
//! # What is stored
//!
//! `replica_logs`: chunks of each replica attempt's output at their byte offset in it, unique
//! by (job, replica, attempt, offset): the first chunk stored at an offset is kept, so an
//! agent's retried batch changes nothing. Only the node that runs (or ran) the attempt may add
//! to it. Per attempt, the last [`LogRetention::bytes_per_attempt`] bytes of output are kept;
//! older chunks are deleted as new ones arrive (the agent archives every byte in object
//! storage). A chunk marked `eof` ends the attempt's output.
//!
//! Nothing here is rebuilt at start-up; readers wait for new chunks by polling these rows (and
//! are woken sooner by the API's in-process hub).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Set, TransactionTrait,
};
use spotplane_core::{JobId, JobState, NodeId};

use super::entity::{allocation, job, replica_log};
use super::{Store, StoreError, parse_col};

/// How much of each attempt's output the control plane keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRetention {
    pub bytes_per_attempt: u64,
}

impl Default for LogRetention {
    fn default() -> Self {
        LogRetention {
            bytes_per_attempt: 8 << 20,
        }
    }
}

/// A chunk as it is stored, its data decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLogChunk {
    pub job_id: JobId,
    pub replica: u32,
    pub attempt: u32,
    pub offset: u64,
    pub data: Vec<u8>,
    pub eof: bool,
}

/// A stored chunk, as readers get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRow {
    pub offset: u64,
    pub data: Vec<u8>,
    pub eof: bool,
}

impl LogRow {
    pub fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

/// What decides whether an attempt's output may still grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogAttemptStatus {
    /// Whether the attempt was placed at all.
    pub placed: bool,
    /// When its allocation was released (the replica is over, or its node is gone).
    pub released_at: Option<DateTime<Utc>>,
    /// Where its output ended, when the agent said so.
    pub eof_at: Option<u64>,
    pub job_state: JobState,
}

fn i32_of(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn row_of(r: replica_log::Model) -> LogRow {
    LogRow {
        offset: u64::try_from(r.byte_offset).unwrap_or(0),
        data: r.data,
        eof: r.eof,
    }
}

type AttemptKey = (JobId, u32, u32);

/// `q` narrowed to one attempt's chunks.
fn of_attempt<Q: QueryFilter>(q: Q, (job_id, replica, attempt): AttemptKey) -> Q {
    q.filter(replica_log::Column::JobId.eq(job_id.to_string()))
        .filter(replica_log::Column::Replica.eq(i32_of(replica)))
        .filter(replica_log::Column::Attempt.eq(i32_of(attempt)))
}

impl Store {
    /// Stores chunks sent by `node`'s agent. Every attempt they belong to must be one that
    /// `node` runs or ran, else nothing is stored and the answer is not found. Returns the
    /// jobs whose output grew.
    pub async fn record_logs(
        &self,
        node: NodeId,
        chunks: &[NewLogChunk],
        retention: LogRetention,
        now: DateTime<Utc>,
    ) -> Result<Vec<JobId>, StoreError> {
        let mut groups: BTreeMap<AttemptKey, Vec<&NewLogChunk>> = BTreeMap::new();
        for c in chunks {
            groups
                .entry((c.job_id, c.replica, c.attempt))
                .or_default()
                .push(c);
        }
        self.measured("record_logs", || async {
            let txn = self.write.begin().await?;
            for ((job_id, replica, attempt), group) in &groups {
                let ran_it = allocation::Entity::find()
                    .filter(allocation::Column::JobId.eq(job_id.to_string()))
                    .filter(allocation::Column::Replica.eq(i32_of(*replica)))
                    .filter(allocation::Column::Attempt.eq(i32_of(*attempt)))
                    .filter(allocation::Column::NodeId.eq(node.to_string()))
                    .one(&txn)
                    .await?
                    .is_some();
                if !ran_it {
                    return Err(StoreError::NotFound(format!(
                        "job {job_id} replica {replica} attempt {attempt} on this node"
                    )));
                }
                let rows = group.iter().map(|c| replica_log::ActiveModel {
                    job_id: Set(job_id.to_string()),
                    replica: Set(i32_of(*replica)),
                    attempt: Set(i32_of(*attempt)),
                    byte_offset: Set(i64_of(c.offset)),
                    end_offset: Set(i64_of(c.offset + c.data.len() as u64)),
                    data: Set(c.data.clone()),
                    eof: Set(c.eof),
                    node_id: Set(node.to_string()),
                    received_at: Set(now),
                    ..Default::default()
                });
                replica_log::Entity::insert_many(rows)
                    .on_conflict(
                        OnConflict::columns([
                            replica_log::Column::JobId,
                            replica_log::Column::Replica,
                            replica_log::Column::Attempt,
                            replica_log::Column::ByteOffset,
                        ])
                        .do_nothing()
                        .to_owned(),
                    )
                    .do_nothing()
                    .exec(&txn)
                    .await?;
                // Keep the last bytes of the attempt: cut what ends before them.
                let newest = group
                    .iter()
                    .map(|c| c.offset + c.data.len() as u64)
                    .max()
                    .unwrap_or(0);
                if let Some(cut) = newest.checked_sub(retention.bytes_per_attempt)
                    && cut > 0
                {
                    replica_log::Entity::delete_many()
                        .filter(replica_log::Column::JobId.eq(job_id.to_string()))
                        .filter(replica_log::Column::Replica.eq(i32_of(*replica)))
                        .filter(replica_log::Column::Attempt.eq(i32_of(*attempt)))
                        .filter(replica_log::Column::EndOffset.lte(i64_of(cut)))
                        .filter(replica_log::Column::Eof.eq(false))
                        .exec(&txn)
                        .await?;
                }
            }
            txn.commit().await?;
            Ok(())
        })
        .await?;
        let mut jobs: Vec<JobId> = groups.keys().map(|(j, _, _)| *j).collect();
        jobs.dedup();
        Ok(jobs)
    }

    /// The latest attempt of a replica that was placed or has output (`None`: none yet).
    pub async fn latest_log_attempt(
        &self,
        job_id: JobId,
        replica: u32,
    ) -> Result<Option<u32>, StoreError> {
        self.measured("latest_log_attempt", || async {
            let placed: Option<i32> = allocation::Entity::find()
                .filter(allocation::Column::JobId.eq(job_id.to_string()))
                .filter(allocation::Column::Replica.eq(i32_of(replica)))
                .select_only()
                .column(allocation::Column::Attempt)
                .order_by_desc(allocation::Column::Attempt)
                .into_tuple()
                .one(&self.read)
                .await?;
            let logged: Option<i32> = replica_log::Entity::find()
                .filter(replica_log::Column::JobId.eq(job_id.to_string()))
                .filter(replica_log::Column::Replica.eq(i32_of(replica)))
                .select_only()
                .column(replica_log::Column::Attempt)
                .order_by_desc(replica_log::Column::Attempt)
                .into_tuple()
                .one(&self.read)
                .await?;
            Ok(placed.max(logged).and_then(|a| u32::try_from(a).ok()))
        })
        .await
    }

    /// Up to `limit` chunks of an attempt's output at or after `from`, in order.
    pub async fn log_chunks(
        &self,
        (job_id, replica, attempt): AttemptKey,
        from: u64,
        limit: u64,
    ) -> Result<Vec<LogRow>, StoreError> {
        self.measured("log_chunks", || async {
            Ok(
                of_attempt(replica_log::Entity::find(), (job_id, replica, attempt))
                    .filter(replica_log::Column::ByteOffset.gte(i64_of(from)))
                    .order_by_asc(replica_log::Column::ByteOffset)
                    .limit(limit)
                    .all(&self.read)
                    .await?
                    .into_iter()
                    .map(row_of)
                    .collect(),
            )
        })
        .await
    }

    /// Up to `limit` chunks of an attempt's output that begin before `before`, newest first.
    pub async fn log_chunks_before(
        &self,
        (job_id, replica, attempt): AttemptKey,
        before: u64,
        limit: u64,
    ) -> Result<Vec<LogRow>, StoreError> {
        self.measured("log_chunks_before", || async {
            Ok(
                of_attempt(replica_log::Entity::find(), (job_id, replica, attempt))
                    .filter(replica_log::Column::ByteOffset.lt(i64_of(before)))
                    .order_by_desc(replica_log::Column::ByteOffset)
                    .limit(limit)
                    .all(&self.read)
                    .await?
                    .into_iter()
                    .map(row_of)
                    .collect(),
            )
        })
        .await
    }

    /// Whether an attempt's output may still grow.
    pub async fn log_attempt_status(
        &self,
        (job_id, replica, attempt): AttemptKey,
    ) -> Result<LogAttemptStatus, StoreError> {
        self.measured("log_attempt_status", || async {
            let job_row = job::Entity::find_by_id(job_id.to_string())
                .one(&self.read)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("job {job_id}")))?;
            let job_state: JobState = parse_col("jobs", &job_row.id, &job_row.state)?;
            let allocations = allocation::Entity::find()
                .filter(allocation::Column::JobId.eq(job_id.to_string()))
                .filter(allocation::Column::Replica.eq(i32_of(replica)))
                .filter(allocation::Column::Attempt.eq(i32_of(attempt)))
                .all(&self.read)
                .await?;
            let eof: Option<i64> = replica_log::Entity::find()
                .filter(replica_log::Column::JobId.eq(job_id.to_string()))
                .filter(replica_log::Column::Replica.eq(i32_of(replica)))
                .filter(replica_log::Column::Attempt.eq(i32_of(attempt)))
                .filter(replica_log::Column::Eof.eq(true))
                .select_only()
                .column(replica_log::Column::ByteOffset)
                .into_tuple()
                .one(&self.read)
                .await?;
            // An attempt runs on one node; were there several rows, the latest release counts
            // only once all are released.
            let released_at = if allocations.iter().all(|a| a.released_at.is_some()) {
                allocations.iter().filter_map(|a| a.released_at).max()
            } else {
                None
            };
            Ok(LogAttemptStatus {
                placed: !allocations.is_empty(),
                released_at,
                eof_at: eof.and_then(|o| u64::try_from(o).ok()),
                job_state,
            })
        })
        .await
    }
}
