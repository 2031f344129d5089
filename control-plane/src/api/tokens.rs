//! `/v1/tokens` and `/v1/teams/{team}/tokens`: create (the secret is shown once), list, revoke.
//! Admin only. Agent tokens are not made here: the control plane issues one per node it buys.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use spotplane_core::FieldErrors;
use spotplane_core::TokenId;
use utoipa::ToSchema;

use super::AppState;
use super::extract::{Auth, JsonBody, Listing, NoFilter, PageParams};
use super::problem::{ApiError, Problem};
use crate::model::{Page, Role, Token};
use crate::store::NewToken;

/// A token for a team.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "ci"}))]
pub struct CreateTeamToken {
    /// What the token is for, e.g. `ci` or `alice-laptop`.
    pub name: String,
    /// When the token stops working; never when absent.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
}

/// An admin or finance token.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "finops-export", "role": "finance"}))]
pub struct CreateToken {
    pub name: String,
    /// `admin` or `finance`; team tokens are made under `/v1/teams/{team}/tokens`.
    pub role: Role,
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
}

/// A new token with its secret, which is shown this once.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedToken {
    #[serde(flatten)]
    pub info: Token,
    /// The bearer secret. Store it now: spotplane keeps only its hash.
    pub token: String,
}

fn validate_token_request(
    name: &str,
    expires_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> FieldErrors {
    let mut errs = FieldErrors::new();
    errs.check_name("name", name);
    if expires_at.is_some_and(|e| e <= now) {
        errs.push("expires_at", "must lie in the future");
    }
    errs
}

#[utoipa::path(post, path = "/v1/teams/{team}/tokens", tag = "tokens", request_body = CreateTeamToken,
    params(("team" = String, Path, description = "Team name")),
    responses((status = 201, body = CreatedToken), (status = 404, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn create_team_token(
    State(state): State<AppState>,
    auth: Auth,
    Path(team): Path<String>,
    body: JsonBody,
) -> Result<impl IntoResponse, ApiError> {
    auth.require(&[Role::Admin])?;
    let req: CreateTeamToken = body.parse()?;
    let now = state.now();
    validate_token_request(&req.name, req.expires_at, now).into_result()?;
    let team = state.store().get_team(&team).await?;
    let new = NewToken {
        name: req.name,
        role: Role::Team,
        team: Some((team.id, team.name)),
        node_id: None,
        expires_at: req.expires_at,
    };
    let (info, token) = state.store().create_token(new, now).await?;
    Ok((StatusCode::CREATED, Json(CreatedToken { info, token })))
}

#[utoipa::path(get, path = "/v1/teams/{team}/tokens", tag = "tokens",
    params(("team" = String, Path, description = "Team name"), PageParams),
    responses((status = 200, body = Page<Token>), (status = 400, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn list_team_tokens(
    State(state): State<AppState>,
    auth: Auth,
    Path(team): Path<String>,
    Listing { page, .. }: Listing<NoFilter, TokenId>,
) -> Result<Json<Page<Token>>, ApiError> {
    auth.require(&[Role::Admin])?;
    let team = state.store().get_team(&team).await?;
    Ok(Json(
        state.store().list_tokens(Some(&team.id), &page).await?,
    ))
}

#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = CreateToken,
    responses((status = 201, body = CreatedToken), (status = 422, body = Problem)), security(("bearer" = [])))]
pub async fn create_token(
    State(state): State<AppState>,
    auth: Auth,
    body: JsonBody,
) -> Result<impl IntoResponse, ApiError> {
    auth.require(&[Role::Admin])?;
    let req: CreateToken = body.parse()?;
    let now = state.now();
    let mut errs = validate_token_request(&req.name, req.expires_at, now);
    match req.role {
        Role::Admin | Role::Finance => {}
        Role::Team => errs.push(
            "role",
            "team tokens are created with POST /v1/teams/{team}/tokens",
        ),
        Role::Agent => errs.push(
            "role",
            "agent tokens are issued by the control plane for each node it provisions",
        ),
    }
    errs.into_result()?;
    let new = NewToken {
        name: req.name,
        role: req.role,
        team: None,
        node_id: None,
        expires_at: req.expires_at,
    };
    let (info, token) = state.store().create_token(new, now).await?;
    Ok((StatusCode::CREATED, Json(CreatedToken { info, token })))
}

#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", description = "Every token, newest first.",
    params(PageParams),
    responses((status = 200, body = Page<Token>), (status = 400, body = Problem)), security(("bearer" = [])))]
pub async fn list_tokens(
    State(state): State<AppState>,
    auth: Auth,
    Listing { page, .. }: Listing<NoFilter, TokenId>,
) -> Result<Json<Page<Token>>, ApiError> {
    auth.require(&[Role::Admin])?;
    Ok(Json(state.store().list_tokens(None, &page).await?))
}

#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens",
    params(("id" = String, Path, description = "Token id")),
    responses((status = 204, description = "Revoked (or already revoked)"), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "The last live admin token cannot be revoked")),
    security(("bearer" = [])))]
pub async fn revoke_token(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    auth.require(&[Role::Admin])?;
    let id = id
        .parse()
        .map_err(|_| ApiError::NotFound(format!("no token {id}")))?;
    state.store().revoke_token(id, state.now()).await?;
    Ok(StatusCode::NO_CONTENT)
}
