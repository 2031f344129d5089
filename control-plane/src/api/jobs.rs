//! `/v1/jobs`: submit (idempotent with `Idempotency-Key`), list, read, cancel, history.
//!
//! A team token sees and touches only its own team's jobs; another team's job answers 404, the
//! same as a job that does not exist, so ids reveal nothing. Admin tokens see every team and
//! must name the team when submitting.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use spotplane_core::job::JobSpec;
use spotplane_core::{JobId, JobState};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::extract::{Auth, JsonBody, Listing, NoFilter, PageParams, comma_list};
use super::problem::{ApiError, Problem};
use crate::model::{Job, JobEvent, Page, Role};
use crate::store::{JobFilter, NewJob, Principal, SubmitOutcome, new_uuid};

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The team a request acts for: a team token's own team, or for an admin the one named.
/// Returns the internal id (None: all teams, admins only).
fn scope(p: &Principal) -> Option<&str> {
    match p.role {
        Role::Team => p.team.as_ref().map(|(id, _)| id.as_str()),
        _ => None,
    }
}

fn parse_job_id(id: &str) -> Result<JobId, ApiError> {
    let job = id
        .parse()
        .map_err(|_| ApiError::NotFound(format!("no job {id}")))?;
    super::trace_ids(Some(job), None, None);
    Ok(job)
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let bad = || ApiError::BadRequest {
        detail: "Idempotency-Key must be 1 to 255 visible ASCII characters".into(),
        field: Some("Idempotency-Key".into()),
        limit: None,
    };
    let s = v.to_str().map_err(|_| bad())?;
    if s.is_empty() || s.len() > 255 || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad());
    }
    Ok(Some(s.to_owned()))
}

#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", request_body = JobSpec,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe: the same key and body return the first job")),
    responses(
        (status = 201, body = Job, description = "Queued"),
        (status = 200, body = Job, description = "An earlier submission with the same Idempotency-Key and body"),
        (status = 400, body = Problem), (status = 413, body = Problem),
        (status = 422, body = Problem, description = "Invalid, or the Idempotency-Key was used with another body")),
    security(("bearer" = [])))]
pub async fn submit_job(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let mut spec: JobSpec = body.parse()?;
    let key = idempotency_key(&headers)?;
    let now = state.now();
    let (team_id, team) = match (&p.team, spec.team.take()) {
        (Some((id, own)), None) => (id.clone(), own.clone()),
        (Some((id, own)), Some(named)) if &named == own => (id.clone(), own.clone()),
        (Some(_), Some(named)) => {
            return Err(ApiError::Forbidden(format!(
                "this token submits for its own team only, not {named}"
            )));
        }
        (None, Some(named)) => match state.store().get_team(named.as_str()).await {
            Ok(t) => (t.id, t.name),
            Err(crate::store::StoreError::NotFound(_)) => {
                return Err(ApiError::field("team", format!("no team named {named}")));
            }
            Err(e) => return Err(e.into()),
        },
        (None, None) => {
            return Err(ApiError::field(
                "team",
                "admin tokens must name the team the job belongs to",
            ));
        }
    };
    let mut errs = spec.validate(now);
    if let Some(c) = &spec.checkpoint
        && let Err(why) = state.check_checkpoint_uri(&c.uri)
    {
        errs.push("checkpoint.uri", why);
    }
    super::secrets::check_job_secrets(&state, &team_id, &team, &spec, &mut errs).await?;
    errs.into_result()?;
    let idempotency = key.map(|k| {
        let mut canonical = spec.clone();
        canonical.team = Some(team.clone());
        let hash = hex::encode(Sha256::digest(
            serde_json::to_vec(&canonical).unwrap_or_default(),
        ));
        (k, hash)
    });
    // After the hash: a repeat of the same file (`deadline_in` as written) is the same request
    // and returns the first job, with the deadline counted from the first submission.
    spec.resolve_deadline_in(now);
    let new = NewJob {
        id: JobId(new_uuid(now)),
        team_id,
        team,
        spec,
        idempotency,
    };
    super::trace_ids(Some(new.id), None, None);
    match state.store().submit_job(new, now).await? {
        SubmitOutcome::Created(job) => {
            let location = format!("/v1/jobs/{}", job.id);
            Ok((
                StatusCode::CREATED,
                [(header::LOCATION, location)],
                Json(job),
            )
                .into_response())
        }
        SubmitOutcome::Replayed(job) => {
            let mut resp = (StatusCode::OK, Json(job)).into_response();
            resp.headers_mut().insert(
                HeaderName::from_static(IDEMPOTENT_REPLAYED),
                HeaderValue::from_static("true"),
            );
            Ok(resp)
        }
        SubmitOutcome::KeyReused { existing } => Err(ApiError::field(
            "Idempotency-Key",
            format!("this key was used for job {existing} with a different request body"),
        )),
    }
}

/// Filters for listing jobs.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListJobs {
    /// Comma-separated states, e.g. `queued,running`.
    pub state: Option<String>,
    /// Only this team's jobs (admin tokens; team tokens always see their own).
    pub team: Option<String>,
}

#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(ListJobs, PageParams),
    responses((status = 200, body = Page<Job>), (status = 400, body = Problem), (status = 422, body = Problem),
        (status = 404, body = Problem, description = "No team named `team`")),
    security(("bearer" = [])))]
pub async fn list_jobs(
    State(state): State<AppState>,
    auth: Auth,
    Listing { filter: q, page }: Listing<ListJobs, JobId>,
) -> Result<Json<Page<Job>>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let mut errs = spotplane_core::FieldErrors::new();
    let states: Vec<JobState> = comma_list(q.state.as_deref(), "state", &mut errs);
    errs.into_result()?;
    let team_id = match (scope(p), q.team) {
        (Some(own), _) => Some(own.to_owned()),
        (None, Some(name)) => Some(state.store().get_team(&name).await?.id),
        (None, None) => None,
    };
    let filter = JobFilter {
        team_id,
        states,
        before: page.after,
        limit: page.limit,
    };
    Ok(Json(state.store().list_jobs(&filter).await?))
}

#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "Job id")),
    responses((status = 200, body = Job), (status = 404, body = Problem)), security(("bearer" = [])))]
pub async fn get_job(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Job>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let id = parse_job_id(&id)?;
    Ok(Json(state.store().get_job(id, scope(p)).await?))
}

/// Why a job is cancelled (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelJob {
    #[serde(default)]
    pub reason: Option<String>,
}

#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs",
    params(("id" = String, Path, description = "Job id")), request_body(content = Option<CancelJob>),
    responses((status = 200, body = Job), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "The job has already finished")),
    security(("bearer" = [])))]
pub async fn cancel_job(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<Job>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let id = parse_job_id(&id)?;
    let req: CancelJob = if body.iter().all(u8::is_ascii_whitespace) {
        CancelJob::default()
    } else {
        let is_json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if !is_json {
            return Err(ApiError::UnsupportedMediaType);
        }
        super::extract::parse_json(&body)?
    };
    if req.reason.as_ref().is_some_and(|r| r.len() > 1024) {
        return Err(ApiError::field("reason", "must be at most 1024 characters"));
    }
    let reason = req
        .reason
        .unwrap_or_else(|| format!("cancelled by {} token {}", p.role.as_str(), p.token_id));
    let job = state
        .store()
        .transition_job(
            id,
            scope(p),
            None,
            JobState::Cancelled,
            Some(reason),
            state.now(),
        )
        .await?;
    Ok(Json(job))
}

#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs",
    description = "The job's history, oldest first.",
    params(("id" = String, Path, description = "Job id"), PageParams),
    responses((status = 200, body = Page<JobEvent>), (status = 400, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn job_events(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    Listing { page, .. }: Listing<NoFilter, EventSeq>,
) -> Result<Json<Page<JobEvent>>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let id = parse_job_id(&id)?;
    let after = page.after.map(|EventSeq(seq)| seq);
    Ok(Json(
        state
            .store()
            .job_events(id, scope(p), after, page.limit)
            .await?,
    ))
}

/// The cursor of a job's history: the `seq` of the last event read, a positive number.
#[derive(Debug, Clone, Copy)]
pub struct EventSeq(i64);

impl std::str::FromStr for EventSeq {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.parse::<i64>() {
            Ok(seq) if seq > 0 => Ok(EventSeq(seq)),
            _ => Err(()),
        }
    }
}
