//! Group commit for job submissions.
//!
//! Submissions are the API's hottest write. Rather than one transaction per job (five round
//! trips to the database and, on PostgreSQL, one WAL flush each), concurrent submissions are
//! queued to one writer task that commits whatever is waiting as one transaction: one
//! multi-row insert each into `jobs`, `job_events` and `outbox`. Nothing waits on purpose:
//! a lone submission commits at once, and under load batches form by themselves while the
//! previous commit is in flight. Each job and its events are still written atomically.
//!
//! If a batch hits a unique violation (an `Idempotency-Key` already taken, possibly by another
//! job in the same batch) the batch is rolled back and its jobs are written one by one, so only
//! the job whose key is taken is refused.

use chrono::{DateTime, Utc};
use sea_orm::{ActiveValue::Set, DatabaseConnection, EntityTrait, TransactionTrait};
use tokio::sync::{mpsc, oneshot};

use super::entity::{job, job_event, outbox};
use super::jobs::{NewJob, job_payload};
use super::{MAX_ATTEMPTS, StoreError, is_transient, is_unique_violation};
use crate::metrics::Metrics;
use crate::model::Job;
use spotplane_core::JobState;

/// Most jobs committed in one transaction.
const MAX_BATCH: usize = 256;

/// `Ok(None)`: the job's idempotency key is taken.
type Reply = oneshot::Sender<Result<Option<Job>, StoreError>>;

struct Pending {
    new: NewJob,
    now: DateTime<Utc>,
    reply: Reply,
}

/// The sending side, held by every clone of the store.
#[derive(Debug, Clone)]
pub(crate) struct SubmitQueue {
    tx: mpsc::Sender<Pending>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("job", &self.new.id)
            .finish()
    }
}

impl SubmitQueue {
    /// Starts the writer task; it ends when the last store clone is dropped.
    pub(crate) fn start(write: DatabaseConnection, metrics: Metrics) -> SubmitQueue {
        let (tx, rx) = mpsc::channel(4 * MAX_BATCH);
        tokio::spawn(writer(write, metrics, rx));
        SubmitQueue { tx }
    }

    /// Queues a job and waits for its commit.
    pub(crate) async fn submit(
        &self,
        new: NewJob,
        now: DateTime<Utc>,
    ) -> Result<Option<Job>, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Pending { new, now, reply })
            .await
            .map_err(|_| StoreError::Unavailable("the job writer has stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the job writer has stopped".into()))?
    }
}

async fn writer(db: DatabaseConnection, metrics: Metrics, mut rx: mpsc::Receiver<Pending>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let started = std::time::Instant::now();
        let outcome = commit_with_retry(&db, &batch).await;
        metrics.observe_store("submit_job_batch", outcome.is_ok(), started.elapsed());
        match outcome {
            Ok(()) => {
                for p in batch.drain(..) {
                    let _ = p.reply.send(Ok(Some(queued_job(&p.new, p.now))));
                }
            }
            Err(e) if is_unique_violation(&e) => {
                for p in batch.drain(..) {
                    let one = std::slice::from_ref(&p);
                    let result = match commit_with_retry(&db, one).await {
                        Ok(()) => Ok(Some(queued_job(&p.new, p.now))),
                        Err(e) if is_unique_violation(&e) && p.new.idempotency.is_some() => {
                            Ok(None)
                        }
                        Err(e) => Err(StoreError::Db(e)),
                    };
                    let _ = p.reply.send(result);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, jobs = batch.len(), "committing submitted jobs failed");
                for p in batch.drain(..) {
                    let _ = p
                        .reply
                        .send(Err(StoreError::Db(sea_orm::DbErr::Custom(format!(
                            "committing the batch: {e}"
                        )))));
                }
            }
        }
    }
}

async fn commit_with_retry(
    db: &DatabaseConnection,
    batch: &[Pending],
) -> Result<(), sea_orm::DbErr> {
    let mut attempt = 1;
    loop {
        match commit(db, batch).await {
            Err(e) if attempt < MAX_ATTEMPTS && is_transient(&e) => {
                tokio::time::sleep(std::time::Duration::from_millis(5 << attempt)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

async fn commit(db: &DatabaseConnection, batch: &[Pending]) -> Result<(), sea_orm::DbErr> {
    let mut jobs = Vec::with_capacity(batch.len());
    let mut events = Vec::with_capacity(batch.len());
    let mut outbox_rows = Vec::with_capacity(batch.len());
    for p in batch {
        let (j, e, o) = rows(&p.new, p.now)?;
        jobs.push(j);
        events.push(e);
        outbox_rows.push(o);
    }
    let txn = db.begin().await?;
    job::Entity::insert_many(jobs)
        .exec_without_returning(&txn)
        .await?;
    job_event::Entity::insert_many(events)
        .exec_without_returning(&txn)
        .await?;
    outbox::Entity::insert_many(outbox_rows)
        .exec_without_returning(&txn)
        .await?;
    txn.commit().await
}

/// The job as it reads back right after it was queued.
fn queued_job(new: &NewJob, now: DateTime<Utc>) -> Job {
    Job {
        id: new.id,
        team: new.team.clone(),
        state: JobState::Queued,
        state_reason: None,
        attempt: 0,
        resume_from: Default::default(),
        lost_gpu_seconds: 0,
        failures: 0,
        not_before: None,
        utilization: None,
        created_at: now,
        updated_at: now,
        finished_at: None,
        spec: new.spec.clone(),
    }
}

fn rows(
    new: &NewJob,
    now: DateTime<Utc>,
) -> Result<
    (
        job::ActiveModel,
        job_event::ActiveModel,
        outbox::ActiveModel,
    ),
    sea_orm::DbErr,
> {
    let mut spec = new.spec.clone();
    spec.team = Some(new.team.clone());
    let spec_json = serde_json::to_value(&spec).map_err(|e| sea_orm::DbErr::Json(e.to_string()))?;
    let id = new.id.to_string();
    let job_row = job::ActiveModel {
        id: Set(id.clone()),
        team_id: Set(new.team_id.clone()),
        name: Set(spec.name.clone()),
        state: Set(JobState::Queued.to_string()),
        state_reason: Set(None),
        priority: Set(spec.priority.value()),
        spec: Set(spec_json),
        idempotency_key: Set(new.idempotency.as_ref().map(|(k, _)| k.clone())),
        request_hash: Set(new.idempotency.as_ref().map(|(_, h)| h.clone())),
        attempt: Set(0),
        version: Set(0),
        deadline: Set(spec.deadline),
        created_at: Set(now),
        updated_at: Set(now),
        finished_at: Set(None),
        resume_from: Set(None),
        lost_gpu_seconds: Set(0),
        failures: Set(0),
        not_before: Set(None),
        running_since: Set(None),
        drain_started_at: Set(None),
        checkpoint_requested_at: Set(None),
        wait_reason: Set(None),
        requeued: Set(false),
    };
    let kind = format!("job.{}", JobState::Queued);
    let event = job_event::ActiveModel {
        job_id: Set(id.clone()),
        at: Set(now),
        kind: Set(kind.clone()),
        from_state: Set(None),
        to_state: Set(Some(JobState::Queued.to_string())),
        reason: Set(None),
        data: Set(None),
        ..Default::default()
    };
    let outbox_row = outbox::ActiveModel {
        kind: Set(kind),
        subject_kind: Set("job".into()),
        subject_id: Set(id),
        team_id: Set(Some(new.team_id.clone())),
        payload: Set(job_payload(&queued_job(new, now), None)),
        created_at: Set(now),
        ..Default::default()
    };
    Ok((job_row, event, outbox_row))
}
