//! Jobs, their history, and the outbox events their changes publish.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionTrait,
};
use serde_json::{Value, json};
use spotplane_core::job::JobSpec;
use spotplane_core::{JobId, JobState, TeamName};

use super::entity::{allocation, job, job_event, outbox};
use super::{Store, StoreError, from_json, parse_col};
use crate::model::{Job, JobEvent, JobUtilization, Page};

/// A validated job to store.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub id: JobId,
    pub team_id: String,
    pub team: TeamName,
    pub spec: JobSpec,
    /// `Idempotency-Key` and the hash of the request it came with.
    pub idempotency: Option<(String, String)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SubmitOutcome {
    /// A new job was queued.
    Created(Job),
    /// The same request was made before with this key; this is that job.
    Replayed(Job),
    /// The key was used before with a different request.
    KeyReused { existing: JobId },
}

/// Which jobs to list.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    /// Internal team id; all teams when `None`.
    pub team_id: Option<String>,
    /// Any of these states; all when empty.
    pub states: Vec<JobState>,
    /// Only jobs older than this one (the previous page's `next_cursor`).
    pub before: Option<JobId>,
    pub limit: u64,
}

/// The team name is kept in the stored spec (team names never change), so a job reads back
/// without a join.
fn job_from_row(row: job::Model) -> Result<Job, StoreError> {
    let mut spec: JobSpec = from_json("jobs", &row.id, row.spec)?;
    let team = spec
        .team
        .take()
        .ok_or_else(|| StoreError::corrupt("jobs", &row.id, "spec has no team"))?;
    Ok(Job {
        id: parse_col("jobs", &row.id, &row.id)?,
        team,
        state: parse_col("jobs", &row.id, &row.state)?,
        state_reason: row.state_reason,
        attempt: u32::try_from(row.attempt).map_err(|e| StoreError::corrupt("jobs", &row.id, e))?,
        resume_from: match row.resume_from {
            Some(v) => from_json("jobs", &row.id, v)?,
            None => Default::default(),
        },
        lost_gpu_seconds: row.lost_gpu_seconds,
        failures: u32::try_from(row.failures).unwrap_or(0),
        not_before: row.not_before,
        utilization: None,
        created_at: row.created_at,
        updated_at: row.updated_at,
        finished_at: row.finished_at,
        spec,
    })
}

fn event_from_row(row: job_event::Model) -> Result<JobEvent, StoreError> {
    let id = row.id.to_string();
    Ok(JobEvent {
        seq: row.id,
        at: row.at,
        kind: row.kind,
        from_state: row
            .from_state
            .as_deref()
            .map(|s| parse_col("job_events", &id, s))
            .transpose()?,
        to_state: row
            .to_state
            .as_deref()
            .map(|s| parse_col("job_events", &id, s))
            .transpose()?,
        reason: row.reason,
        data: row.data,
    })
}

/// The outbox payload describing a job after a change.
pub(crate) fn job_payload(job: &Job, from: Option<JobState>) -> Value {
    json!({
        "job": {
            "id": job.id,
            "team": job.team,
            "name": job.spec.name,
            "state": job.state,
            "state_reason": job.state_reason,
            "attempt": job.attempt,
            "labels": job.spec.labels,
        },
        "from_state": from,
    })
}

/// Writes one history entry and its outbox event, inside the caller's transaction.
async fn record_job_event<C: ConnectionTrait>(
    conn: &C,
    job: &Job,
    team_id: &str,
    from: Option<JobState>,
    data: Option<Value>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let kind = format!("job.{}", job.state);
    job_event::ActiveModel {
        job_id: Set(job.id.to_string()),
        at: Set(now),
        kind: Set(kind.clone()),
        from_state: Set(from.map(|s| s.to_string())),
        to_state: Set(Some(job.state.to_string())),
        reason: Set(job.state_reason.clone()),
        data: Set(data.clone()),
        ..Default::default()
    }
    .insert(conn)
    .await?;
    outbox::ActiveModel {
        kind: Set(kind),
        subject_kind: Set("job".into()),
        subject_id: Set(job.id.to_string()),
        team_id: Set(Some(team_id.to_owned())),
        payload: Set({
            let mut p = job_payload(job, from);
            // A run starting again after its cloud took it says how long it was out.
            if let Some(s) = data.as_ref().and_then(|d| d.get("interrupted_for_seconds")) {
                p["interrupted_for_seconds"] = s.clone();
            }
            p
        }),
        created_at: Set(now),
        ..Default::default()
    }
    .insert(conn)
    .await?;
    Ok(())
}

impl Store {
    /// Queues a job, or replays an earlier submission with the same idempotency key.
    ///
    /// The job goes through the group-commit writer (see `submit.rs`); only when its key turns
    /// out to be taken is the earlier job looked up.
    pub async fn submit_job(
        &self,
        new: NewJob,
        now: DateTime<Utc>,
    ) -> Result<SubmitOutcome, StoreError> {
        let started = std::time::Instant::now();
        let result = self.submits.submit(new.clone(), now).await;
        self.metrics
            .observe_store("submit_job", result.is_ok(), started.elapsed());
        match result? {
            Some(job) => Ok(SubmitOutcome::Created(job)),
            None => self
                .replay(&new)
                .await?
                .ok_or_else(|| StoreError::Conflict("idempotency key in use; retry".into())),
        }
    }

    async fn replay(&self, new: &NewJob) -> Result<Option<SubmitOutcome>, StoreError> {
        let Some((key, hash)) = &new.idempotency else {
            return Ok(None);
        };
        self.measured("find_idempotent_job", || async {
            let row = job::Entity::find()
                .filter(job::Column::TeamId.eq(new.team_id.as_str()))
                .filter(job::Column::IdempotencyKey.eq(key.as_str()))
                .one(&self.read)
                .await?;
            Ok(match row {
                None => None,
                Some(r) if r.request_hash.as_deref() == Some(hash.as_str()) => {
                    Some(SubmitOutcome::Replayed(job_from_row(r)?))
                }
                Some(r) => Some(SubmitOutcome::KeyReused {
                    existing: parse_col("jobs", &r.id, &r.id)?,
                }),
            })
        })
        .await
    }

    /// A job; `NotFound` also when it belongs to another team than `team_id`.
    pub async fn get_job(&self, id: JobId, team_id: Option<&str>) -> Result<Job, StoreError> {
        self.measured("get_job", || async {
            let row = self.job_row(&self.read, id, team_id).await?;
            let mut job = job_from_row(row)?;
            job.utilization = self
                .job_utilisation(std::slice::from_ref(&job.id))
                .await?
                .remove(&job.id);
            Ok(job)
        })
        .await
    }

    /// Each job's GPU utilisation over its run (see [`JobUtilization`]), for the jobs of `ids`
    /// that have readings: one grouped query over their allocations.
    pub async fn job_utilisation(
        &self,
        ids: &[JobId],
    ) -> Result<std::collections::HashMap<JobId, JobUtilization>, StoreError> {
        // Summed here rather than in SQL: PostgreSQL's SUM of a bigint is a numeric.
        let mut sums: std::collections::HashMap<String, (i64, i64, i64, i64)> =
            std::collections::HashMap::new();
        for chunk in ids.chunks(500) {
            let rows: Vec<(String, i64, i64, i64, i64)> = allocation::Entity::find()
                .select_only()
                .columns([
                    allocation::Column::JobId,
                    allocation::Column::UtilSamples,
                    allocation::Column::SmUtilSum,
                    allocation::Column::MemUsedMibSum,
                    allocation::Column::MemUsedMibMax,
                ])
                .filter(allocation::Column::JobId.is_in(chunk.iter().map(ToString::to_string)))
                .filter(allocation::Column::UtilSamples.gt(0))
                .into_tuple()
                .all(&self.read)
                .await?;
            for (id, samples, sm, mem, mem_max) in rows {
                let e = sums.entry(id).or_default();
                e.0 = e.0.saturating_add(samples);
                e.1 = e.1.saturating_add(sm);
                e.2 = e.2.saturating_add(mem);
                e.3 = e.3.max(mem_max);
            }
        }
        let mut out = std::collections::HashMap::new();
        for (id, (samples, sm, mem, mem_max)) in sums {
            if samples <= 0 {
                continue;
            }
            let n = samples as f64;
            out.insert(
                parse_col("allocations", &id, &id)?,
                JobUtilization {
                    sm_pct_mean: (sm as f64 / n * 10.0).round() / 10.0,
                    memory_used_mib_mean: (mem as f64 / n).round(),
                    memory_used_mib_max: u64::try_from(mem_max).unwrap_or(0),
                    samples: u64::try_from(samples).unwrap_or(0),
                },
            );
        }
        Ok(out)
    }

    async fn job_row<C: ConnectionTrait>(
        &self,
        conn: &C,
        id: JobId,
        team_id: Option<&str>,
    ) -> Result<job::Model, StoreError> {
        let mut q = job::Entity::find_by_id(id.to_string());
        if let Some(t) = team_id {
            q = q.filter(job::Column::TeamId.eq(t));
        }
        q.one(conn)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("job {id}")))
    }

    /// Jobs matching `filter`, newest first.
    pub async fn list_jobs(&self, filter: &JobFilter) -> Result<Page<Job>, StoreError> {
        self.measured("list_jobs", || async {
            let mut q = job::Entity::find()
                .order_by_desc(job::Column::Id)
                .limit(filter.limit + 1);
            if let Some(t) = &filter.team_id {
                q = q.filter(job::Column::TeamId.eq(t.as_str()));
            }
            if !filter.states.is_empty() {
                q = q.filter(job::Column::State.is_in(filter.states.iter().map(|s| s.to_string())));
            }
            if let Some(before) = filter.before {
                q = q.filter(job::Column::Id.lt(before.to_string()));
            }
            let mut rows = q.all(&self.read).await?;
            let more = rows.len() as u64 > filter.limit;
            rows.truncate(filter.limit as usize);
            let mut items = rows
                .into_iter()
                .map(job_from_row)
                .collect::<Result<Vec<_>, _>>()?;
            let ids: Vec<JobId> = items.iter().map(|j| j.id).collect();
            let mut util = self.job_utilisation(&ids).await?;
            for j in &mut items {
                j.utilization = util.remove(&j.id);
            }
            let next_cursor = if more {
                items.last().map(|j| j.id.to_string())
            } else {
                None
            };
            Ok(Page { items, next_cursor })
        })
        .await
    }

    /// A job's history, oldest first, after event `after` when given.
    pub async fn job_events(
        &self,
        id: JobId,
        team_id: Option<&str>,
        after: Option<i64>,
        limit: u64,
    ) -> Result<Page<JobEvent>, StoreError> {
        self.measured("job_events", || async {
            self.job_row(&self.read, id, team_id).await?;
            let mut q = job_event::Entity::find()
                .filter(job_event::Column::JobId.eq(id.to_string()))
                .order_by_asc(job_event::Column::Id)
                .limit(limit + 1);
            if let Some(a) = after {
                q = q.filter(job_event::Column::Id.gt(a));
            }
            let mut rows = q.all(&self.read).await?;
            let more = rows.len() as u64 > limit;
            rows.truncate(limit as usize);
            let items = rows
                .into_iter()
                .map(event_from_row)
                .collect::<Result<Vec<_>, _>>()?;
            let next_cursor = if more {
                items.last().map(|e| e.seq.to_string())
            } else {
                None
            };
            Ok(Page { items, next_cursor })
        })
        .await
    }

    /// Moves a job to `to` if the lifecycle allows it from its current state, recording the
    /// change in its history and the outbox in the same transaction. `expect_from`, when
    /// given, makes the change conditional on the job still being in that state.
    pub async fn transition_job(
        &self,
        id: JobId,
        team_id: Option<&str>,
        expect_from: Option<JobState>,
        to: JobState,
        reason: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<Job, StoreError> {
        self.measured("transition_job", || async {
            let txn = self.write.begin().await?;
            let row = self.job_row(&txn, id, team_id).await?;
            let from: JobState = parse_col("jobs", &row.id, &row.state)?;
            if let Some(expected) = expect_from
                && from != expected
            {
                return Err(StoreError::Conflict(format!(
                    "job {id} is {from}, not {expected}"
                )));
            }
            if !from.can_transition_to(to) {
                return Err(StoreError::Conflict(format!(
                    "job {id} is {from} and cannot become {to}"
                )));
            }
            let job = job_event_in(&txn, row, to, reason.clone(), None, now).await?;
            txn.commit().await?;
            Ok(job)
        })
        .await
    }
}

/// Moves the job in `row` to `to` inside the caller's transaction: a version-checked update
/// (a concurrent change is a conflict), its history entry and its outbox event. The caller
/// has checked that the lifecycle allows the change.
pub(crate) async fn job_event_in<C: ConnectionTrait>(
    txn: &C,
    row: job::Model,
    to: JobState,
    reason: Option<String>,
    data: Option<Value>,
    now: DateTime<Utc>,
) -> Result<Job, StoreError> {
    let from: JobState = parse_col("jobs", &row.id, &row.state)?;
    let mut upd = job::Entity::update_many()
        .col_expr(job::Column::State, Expr::value(to.to_string()))
        .col_expr(job::Column::StateReason, Expr::value(reason))
        // A move ends the wait the scheduler recorded; a move back to the queue is a requeue
        // (a new job enters the queue by submission, not by a move).
        .col_expr(job::Column::WaitReason, Expr::value(Option::<String>::None))
        .col_expr(job::Column::Requeued, Expr::value(to == JobState::Queued))
        .col_expr(job::Column::UpdatedAt, Expr::value(now))
        .col_expr(job::Column::Version, Expr::value(row.version + 1))
        .filter(job::Column::Id.eq(row.id.clone()))
        .filter(job::Column::Version.eq(row.version));
    if to.is_terminal() {
        upd = upd.col_expr(job::Column::FinishedAt, Expr::value(Some(now)));
    }
    match to {
        JobState::Running => {
            upd = upd.col_expr(job::Column::RunningSince, Expr::value(Some(now)));
        }
        JobState::Draining => {
            upd = upd.col_expr(job::Column::DrainStartedAt, Expr::value(Some(now)));
        }
        _ => {}
    }
    if upd.exec(txn).await?.rows_affected != 1 {
        return Err(StoreError::Conflict(format!(
            "job {} changed concurrently; retry",
            row.id
        )));
    }
    // A job that stops holding capacity gives its allocations back in the same transaction.
    if to == JobState::Queued || to.is_terminal() {
        allocation::Entity::update_many()
            .col_expr(allocation::Column::ReleasedAt, Expr::value(Some(now)))
            .filter(allocation::Column::JobId.eq(row.id.clone()))
            .filter(allocation::Column::ReleasedAt.is_null())
            .exec(txn)
            .await?;
    }
    let updated = job::Entity::find_by_id(row.id.clone())
        .one(txn)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("job {}", row.id)))?;
    let job = job_from_row(updated)?;
    let mut data = data;
    if to == JobState::Running
        && row.attempt > 1
        && let Some(seconds) = interrupted_for(txn, &row.id, now).await?
    {
        let d = data.get_or_insert_with(|| json!({}));
        if let Some(o) = d.as_object_mut() {
            o.insert("interrupted_for_seconds".into(), json!(seconds));
        }
    }
    record_job_event(txn, &job, &row.team_id, Some(from), data, now).await?;
    Ok(job)
}

/// How long a job starting again was interrupted by its cloud: from the notice that began its
/// last drain (`job.draining` because a node "is being taken") or the loss of its node without
/// one (`job.lost`), to `now`. `None` when its last stop was not the cloud's doing (a priority
/// preemption, a consolidation, a failure).
async fn interrupted_for<C: ConnectionTrait>(
    txn: &C,
    job_id: &str,
    now: DateTime<Utc>,
) -> Result<Option<f64>, StoreError> {
    let latest = |kind: &'static str| {
        job_event::Entity::find()
            .filter(job_event::Column::JobId.eq(job_id))
            .filter(job_event::Column::Kind.eq(kind))
            .order_by_desc(job_event::Column::Id)
            .one(txn)
    };
    // The requeue that ended the last run says what it ended from.
    let Some(requeue) = latest("job.queued").await? else {
        return Ok(None);
    };
    let stop = match requeue.from_state.as_deref() {
        // Drained (and checkpointed) for a notice.
        Some("draining" | "checkpointed") => latest("job.draining")
            .await?
            .filter(|e| crate::recovery::is_cloud_drain(e.reason.as_deref())),
        Some("lost") => latest("job.lost").await?,
        _ => None,
    };
    Ok(stop.map(|e| (now - e.at).num_milliseconds().max(0) as f64 / 1000.0))
}

/// Records something that happened to the job in `row` without moving it (`job.<what>`: a
/// history entry, with `reason`, and an outbox event), inside the caller's transaction. The
/// job's version is bumped, so a concurrent change is a conflict.
pub(crate) async fn job_note_in<C: ConnectionTrait>(
    txn: &C,
    row: job::Model,
    what: &str,
    reason: &str,
    data: Value,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let bumped = job::Entity::update_many()
        .col_expr(job::Column::UpdatedAt, Expr::value(now))
        .col_expr(job::Column::Version, Expr::value(row.version + 1))
        .filter(job::Column::Id.eq(row.id.clone()))
        .filter(job::Column::Version.eq(row.version))
        .exec(txn)
        .await?;
    if bumped.rows_affected != 1 {
        return Err(StoreError::Conflict(format!(
            "job {} changed concurrently; retry",
            row.id
        )));
    }
    let team_id = row.team_id.clone();
    let job = job_from_row(row)?;
    let kind = format!("job.{what}");
    job_event::ActiveModel {
        job_id: Set(job.id.to_string()),
        at: Set(now),
        kind: Set(kind.clone()),
        from_state: Set(Some(job.state.to_string())),
        to_state: Set(Some(job.state.to_string())),
        reason: Set(Some(reason.to_owned())),
        data: Set(Some(data.clone())),
        ..Default::default()
    }
    .insert(txn)
    .await?;
    let mut payload = job_payload(&job, Some(job.state));
    payload["reason"] = json!(reason);
    payload["detail"] = data;
    outbox::ActiveModel {
        kind: Set(kind),
        subject_kind: Set("job".into()),
        subject_id: Set(job.id.to_string()),
        team_id: Set(Some(team_id)),
        payload: Set(payload),
        created_at: Set(now),
        ..Default::default()
    }
    .insert(txn)
    .await?;
    Ok(())
}
