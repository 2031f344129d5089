//! `/v1/nodes` and `/v1/offers`: what spotplane runs on and what it could buy (admin, finance).

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use spotplane_core::NodeState;
use utoipa::IntoParams;

use super::AppState;
use super::extract::{ApiQuery, Auth, comma_list};
use super::problem::{ApiError, Problem};
use crate::model::{Node, Offer, Page, Role};

/// Filters for listing nodes.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListNodes {
    /// Comma-separated states, e.g. `ready,draining`; all when absent.
    pub state: Option<String>,
}

#[utoipa::path(get, path = "/v1/nodes", tag = "cluster", params(ListNodes),
    responses((status = 200, body = Page<Node>), (status = 422, body = Problem)), security(("bearer" = [])))]
pub async fn list_nodes(
    State(state): State<AppState>,
    auth: Auth,
    ApiQuery(q): ApiQuery<ListNodes>,
) -> Result<Json<Page<Node>>, ApiError> {
    auth.require(&[Role::Admin, Role::Finance])?;
    let mut errs = spotplane_core::FieldErrors::new();
    let states: Vec<NodeState> = comma_list(q.state.as_deref(), "state", &mut errs);
    errs.into_result()?;
    let items = state.store().list_nodes(&states).await?;
    Ok(Json(Page {
        items,
        next_cursor: None,
    }))
}

#[utoipa::path(get, path = "/v1/offers", tag = "cluster",
    responses((status = 200, body = Page<Offer>)), security(("bearer" = [])))]
pub async fn list_offers(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<Page<Offer>>, ApiError> {
    auth.require(&[Role::Admin, Role::Finance])?;
    let items = state.store().list_offers().await?;
    Ok(Json(Page {
        items,
        next_cursor: None,
    }))
}
