//! `/v1/teams`: create, list, read and update teams (admin; finance reads; a team reads itself).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::{Deserialize, Deserializer};
use spotplane_core::TeamName;
use spotplane_core::team::{Quota, QuotaResource, validate_team_settings};
use utoipa::ToSchema;

use super::AppState;
use super::extract::{Auth, JsonBody, Listing, NoFilter, PageParams};
use super::problem::{ApiError, Problem};
use crate::model::{Page, Role, Team};
use crate::store::{NewTeam, TeamPatch};

/// A team to create.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "research", "weight": 2.0, "cohort": "ml", "quotas": {"H100-80GB": {"nominal": 8, "borrowing_limit": 8}, "mig-3g.40gb": {"nominal": 4}}}))]
pub struct CreateTeam {
    /// Lowercase letters, digits, `-`, `_`, `.`; 1–63 characters. Also the team's address.
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")]
    pub name: String,
    /// Fair-share weight, 0.001 to 1000 (default 1).
    #[serde(default = "default_weight")]
    #[schema(minimum = 0.001, maximum = 1000)]
    pub weight: f64,
    /// Cohort to lend idle quota to and borrow from; named as teams are.
    #[serde(default)]
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")]
    pub cohort: Option<String>,
    /// Quota per GPU model (`H100-80GB`) or MIG profile (`mig-3g.40gb`).
    #[serde(default)]
    #[schema(value_type = BTreeMap<String, Quota>)]
    pub quotas: BTreeMap<QuotaResource, Quota>,
}

fn default_weight() -> f64 {
    1.0
}

/// Changes to a team; absent fields stay as they are and `"cohort": null` clears the cohort.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateTeam {
    /// Fair-share weight, 0.001 to 1000.
    #[serde(default)]
    #[schema(minimum = 0.001, maximum = 1000)]
    pub weight: Option<f64>,
    /// The cohort; `null` clears it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, required = false, pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")]
    pub cohort: Option<Option<String>>,
    /// Replaces all quotas.
    #[serde(default)]
    #[schema(value_type = Option<BTreeMap<String, Quota>>)]
    pub quotas: Option<BTreeMap<QuotaResource, Quota>>,
}

/// Distinguishes a field given as `null` (`Some(None)`) from one left out (`None`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

#[utoipa::path(post, path = "/v1/teams", tag = "teams", request_body = CreateTeam,
    responses((status = 201, body = Team), (status = 409, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn create_team(
    State(state): State<AppState>,
    auth: Auth,
    body: JsonBody,
) -> Result<impl IntoResponse, ApiError> {
    auth.require(&[Role::Admin])?;
    let req: CreateTeam = body.parse()?;
    validate_team_settings(
        Some(&req.name),
        Some(req.weight),
        req.cohort.as_deref(),
        Some(&req.quotas),
    )
    .into_result()?;
    let name: TeamName = req
        .name
        .parse()
        .map_err(|e: spotplane_core::ids::ParseIdError| ApiError::field("name", e.reason))?;
    let team = state
        .store()
        .create_team(
            NewTeam {
                name,
                weight: req.weight,
                cohort: req.cohort,
                quotas: req.quotas,
            },
            state.now(),
        )
        .await?;
    let location = format!("/v1/teams/{}", team.name);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(team),
    ))
}

#[utoipa::path(get, path = "/v1/teams", tag = "teams", description = "Teams, by name.",
    params(PageParams),
    responses((status = 200, body = Page<Team>), (status = 400, body = Problem)), security(("bearer" = [])))]
pub async fn list_teams(
    State(state): State<AppState>,
    auth: Auth,
    Listing { page, .. }: Listing<NoFilter, TeamName>,
) -> Result<Json<Page<Team>>, ApiError> {
    auth.require(&[Role::Admin, Role::Finance])?;
    Ok(Json(state.store().list_teams(&page).await?))
}

#[utoipa::path(get, path = "/v1/teams/{team}", tag = "teams",
    params(("team" = String, Path, description = "Team name")),
    responses((status = 200, body = Team), (status = 404, body = Problem)), security(("bearer" = [])))]
pub async fn get_team(
    State(state): State<AppState>,
    auth: Auth,
    Path(team): Path<String>,
) -> Result<Json<Team>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Finance, Role::Team])?;
    if p.role == Role::Team && p.team.as_ref().map(|(_, n)| n.as_str()) != Some(team.as_str()) {
        return Err(ApiError::NotFound(format!("no team {team}")));
    }
    Ok(Json(state.store().get_team(&team).await?))
}

#[utoipa::path(patch, path = "/v1/teams/{team}", tag = "teams", request_body = UpdateTeam,
    params(("team" = String, Path, description = "Team name")),
    responses((status = 200, body = Team), (status = 404, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn update_team(
    State(state): State<AppState>,
    auth: Auth,
    Path(team): Path<String>,
    body: JsonBody,
) -> Result<Json<Team>, ApiError> {
    auth.require(&[Role::Admin])?;
    let req: UpdateTeam = body.parse()?;
    let cohort = req.cohort.as_ref().and_then(|c| c.as_deref());
    validate_team_settings(None, req.weight, cohort, req.quotas.as_ref()).into_result()?;
    let patch = TeamPatch {
        weight: req.weight,
        cohort: req.cohort,
        quotas: req.quotas,
    };
    Ok(Json(
        state.store().update_team(&team, patch, state.now()).await?,
    ))
}
