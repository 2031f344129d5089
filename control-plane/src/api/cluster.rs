//! `/v1/nodes` and `/v1/offers`: what spotplane runs on and what it could buy (admin, finance).

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use spotplane_core::{NodeId, NodeState};
use utoipa::IntoParams;

use super::AppState;
use super::extract::{Auth, Listing, NoFilter, PageParams, comma_list};
use super::problem::{ApiError, Problem};
use crate::model::{Node, Offer, Page, Role};
use crate::store::OfferCursor;

/// Filters for listing nodes.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListNodes {
    /// Comma-separated states, e.g. `ready,draining`; all when absent.
    pub state: Option<String>,
}

#[utoipa::path(get, path = "/v1/nodes", tag = "cluster", description = "Nodes, newest first.",
    params(ListNodes, PageParams),
    responses((status = 200, body = Page<Node>), (status = 400, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn list_nodes(
    State(state): State<AppState>,
    auth: Auth,
    Listing { filter: q, page }: Listing<ListNodes, NodeId>,
) -> Result<Json<Page<Node>>, ApiError> {
    auth.require(&[Role::Admin, Role::Finance])?;
    let mut errs = spotplane_core::FieldErrors::new();
    let states: Vec<NodeState> = comma_list(q.state.as_deref(), "state", &mut errs);
    errs.into_result()?;
    Ok(Json(state.store().list_nodes_page(&states, &page).await?))
}

#[utoipa::path(get, path = "/v1/offers", tag = "cluster", description = "Offers, cheapest first.",
    params(PageParams),
    responses((status = 200, body = Page<Offer>), (status = 400, body = Problem)), security(("bearer" = [])))]
pub async fn list_offers(
    State(state): State<AppState>,
    auth: Auth,
    Listing { page, .. }: Listing<NoFilter, OfferCursor>,
) -> Result<Json<Page<Offer>>, ApiError> {
    auth.require(&[Role::Admin, Role::Finance])?;
    Ok(Json(state.store().list_offers(&page).await?))
}
