//! Team secrets: `/v1/teams/{team}/secrets` (set, list, delete) and the agents' channel to
//! their values, `GET /v1/agent/jobs/{job_id}/secrets`.
//!
//! A team token manages its own team's secrets (another team's answer 404, as the team does);
//! admin tokens manage every team's. No route returns a value except the agents' one, and that
//! only to a node holding a live allocation of the job, with `Cache-Control: no-store`. Values
//! are never logged and never quoted in a problem.

use std::collections::BTreeSet;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use spotplane_core::agent::{AgentSecrets, RegistryCredential};
use spotplane_core::job::JobSpec;
use spotplane_core::{FieldErrors, JobId, TeamName};
use utoipa::ToSchema;

use super::AppState;
use super::extract::{Auth, JsonBody, Listing, NoFilter, PageParams};
use super::problem::{ApiError, Problem};
use crate::model::{Page, Role, Secret};
use crate::secrets::{SecretName, validate_secret};
use crate::store::{Principal, SecretWrite, StoreError};

/// The routes of this module, under `/v1`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/teams/{team}/secrets", post(put_secret).get(list_secrets))
        .route("/teams/{team}/secrets/{name}", delete(delete_secret))
        .route("/agent/jobs/{job_id}/secrets", get(agent_job_secrets))
}

/// A secret to set: created, or its value replaced.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "hf-token", "value": "hf_..."}))]
pub struct PutSecret {
    /// Lowercase letters, digits, `-`, `_`, `.`; 1–63 characters.
    pub name: String,
    /// At most 64 KiB of UTF-8 without NUL. Stored encrypted; no route returns it.
    pub value: String,
}

impl std::fmt::Debug for PutSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PutSecret")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .finish()
    }
}

/// The internal id of the team `team` names, as the caller may act for it: its own team for a
/// team token (another is not found), any team for an admin.
async fn team_id(state: &AppState, p: &Principal, team: &str) -> Result<String, ApiError> {
    match (p.role, &p.team) {
        (Role::Team, Some((id, own))) if own.as_str() == team => Ok(id.clone()),
        (Role::Team, _) => Err(ApiError::NotFound(format!("no team {team}"))),
        _ => Ok(state.store().get_team(team).await?.id),
    }
}

/// A sealed secret that does not open is the server's fault (its key), said so without bytes.
fn unreadable(e: StoreError) -> ApiError {
    match e {
        StoreError::Corrupt {
            table: "team_secrets",
            id,
            reason,
        } => {
            tracing::error!(row = %id, %reason, "a team secret does not decrypt; is secrets.key_file the key it was written with?");
            ApiError::Conflict(reason)
        }
        other => other.into(),
    }
}

#[utoipa::path(post, path = "/v1/teams/{team}/secrets", tag = "secrets", request_body = PutSecret,
    description = "Sets a team secret: creates it (201) or replaces its value (200). The answer names it; its value is never shown again.",
    params(("team" = String, Path, description = "Team name")),
    responses((status = 201, body = Secret, description = "Created"), (status = 200, body = Secret, description = "Its value replaced"),
        (status = 404, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn put_secret(
    State(state): State<AppState>,
    auth: Auth,
    Path(team): Path<String>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let team_id = team_id(&state, p, &team).await?;
    let req: PutSecret = body.parse()?;
    validate_secret(&req.name, &req.value).into_result()?;
    let key = state.secrets_key()?;
    let written = state
        .store()
        .put_team_secret(key, &team_id, &req.name, &req.value, state.now())
        .await?;
    tracing::info!(%team, secret = %req.name, replaced = matches!(written, SecretWrite::Replaced(_)), "team secret set");
    Ok(match written {
        SecretWrite::Created(s) => (StatusCode::CREATED, Json(s)).into_response(),
        SecretWrite::Replaced(s) => (StatusCode::OK, Json(s)).into_response(),
    })
}

#[utoipa::path(get, path = "/v1/teams/{team}/secrets", tag = "secrets",
    description = "The team's secrets by name: names and times, never values.",
    params(("team" = String, Path, description = "Team name"), PageParams),
    responses((status = 200, body = Page<Secret>), (status = 400, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn list_secrets(
    State(state): State<AppState>,
    auth: Auth,
    Path(team): Path<String>,
    Listing { page, .. }: Listing<NoFilter, SecretName>,
) -> Result<Json<Page<Secret>>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let team_id = team_id(&state, p, &team).await?;
    Ok(Json(
        state.store().list_team_secrets(&team_id, &page).await?,
    ))
}

#[utoipa::path(delete, path = "/v1/teams/{team}/secrets/{name}", tag = "secrets",
    description = "Deletes a team secret. Jobs that refer to it cannot start from then on (their start fails naming it); replicas running keep the value they started with.",
    params(("team" = String, Path, description = "Team name"), ("name" = String, Path, description = "Secret name")),
    responses((status = 204, description = "Deleted"), (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn delete_secret(
    State(state): State<AppState>,
    auth: Auth,
    Path((team, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let team_id = team_id(&state, p, &team).await?;
    state.store().delete_team_secret(&team_id, &name).await?;
    tracing::info!(%team, secret = %name, "team secret deleted");
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/agent/jobs/{job_id}/secrets", tag = "agent",
    description = "The values of the team secrets a job refers to (`secrets` as environment variables, `image_pull_secret` as a registry login), for the agent of a node that holds a live allocation of the job. Answered with `Cache-Control: no-store`.",
    params(("job_id" = String, Path, description = "Job id")),
    responses((status = 200, body = AgentSecrets),
        (status = 403, body = Problem, description = "Not a node credential"),
        (status = 404, body = Problem, description = "The job has no live allocation on this node"),
        (status = 409, body = Problem, description = "A secret the job refers to is gone, cannot be decrypted, or (the pull secret) is not `username:password`; named, never quoted")),
    security(("bearer" = [])))]
pub async fn agent_job_secrets(
    State(state): State<AppState>,
    auth: Auth,
    Path(job_id): Path<String>,
) -> Result<Response, ApiError> {
    let p = auth.require(&[Role::Agent])?;
    let node = p
        .node_id
        .ok_or_else(|| ApiError::Forbidden("this agent token is bound to no node".into()))?;
    let job: JobId = job_id
        .parse()
        .map_err(|_| ApiError::NotFound(format!("no job {job_id}")))?;
    let key = state.secrets_key()?;
    let secrets = state
        .store()
        .job_secrets_for_node(key, node, job)
        .await
        .map_err(unreadable)?;
    tracing::info!(%job, %node, env = secrets.env.len(), registry = secrets.registry.is_some(), "handed a job's secrets to its node");
    Ok(([(header::CACHE_CONTROL, "no-store")], Json(secrets)).into_response())
}

/// At submit: every secret the job names must be one of its team's, and its pull secret a
/// registry login. Adds an error naming `secrets.<VAR>` or `image_pull_secret` for each that
/// is not; names that are not valid names are left to the job's own validation.
pub(super) async fn check_job_secrets(
    state: &AppState,
    team_id: &str,
    team: &TeamName,
    spec: &JobSpec,
    errs: &mut FieldErrors,
) -> Result<(), ApiError> {
    let valid = |n: &&str| n.parse::<SecretName>().is_ok();
    let names: BTreeSet<&str> = spec
        .secrets
        .values()
        .map(String::as_str)
        .chain(spec.image_pull_secret.as_deref())
        .filter(valid)
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    let missing = state.store().missing_team_secrets(team_id, &names).await?;
    let absent = |name: &str| {
        format!(
            "team {team} has no secret named {name}; create it with POST /v1/teams/{team}/secrets"
        )
    };
    for (var, name) in &spec.secrets {
        if missing.contains(name) {
            errs.push(format!("secrets.{var}"), absent(name));
        }
    }
    if let Some(name) = spec
        .image_pull_secret
        .as_deref()
        .filter(|n| names.contains(n))
    {
        if missing.contains(name) {
            errs.push("image_pull_secret", absent(name));
        } else {
            let value = state
                .store()
                .team_secret_value(state.secrets_key()?, team_id, name)
                .await
                .map_err(unreadable)?;
            if value.is_some_and(|v| RegistryCredential::parse(&v).is_none()) {
                errs.push(
                    "image_pull_secret",
                    format!(
                        "team secret {name} does not hold a registry login as username:password"
                    ),
                );
            }
        }
    }
    Ok(())
}
