//! Liveness, readiness and metrics: unauthenticated, for load balancers and Prometheus (the
//! fleet's metrics ask for an admin or finance token).

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::IntoResponse;
use serde_json::{Value, json};

use super::AppState;
use super::extract::Auth;
use super::problem::ApiError;
use crate::model::Role;

/// The process is up.
pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// The process can serve: the schema is migrated and the database answers.
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    if !state.is_ready() {
        return Err(ApiError::Unavailable(
            "starting: migrations have not finished".into(),
        ));
    }
    state.store().ping().await.map_err(|e| {
        tracing::warn!(error = %e, "readiness check: database ping failed");
        ApiError::Unavailable("the database does not answer".into())
    })?;
    Ok(Json(json!({"status": "ready"})))
}

/// `GET /metrics`. Without a token: this process's own metrics (requests, store calls, loops),
/// which name no team and no price. With an admin or finance token (Prometheus'
/// `authorization` setting): the fleet, queue and money gauges too, which carry team names and
/// spend, as `/v1/overview` does. A token that is not valid, or of another role, is refused
/// as on any route, so a misconfigured scrape fails loudly rather than quietly missing data.
pub async fn metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
    auth: Result<Auth, ApiError>,
) -> Result<impl IntoResponse, ApiError> {
    let with_fleet = if headers.contains_key(header::AUTHORIZATION) {
        auth?.require(&[Role::Admin, Role::Finance])?;
        true
    } else {
        false
    };
    // The fleet's gauges come from the store; without it the process's own metrics still
    // answer (an alert on the missing families tells the rest).
    let fleet = if with_fleet {
        fleet_registry(&state)
            .await
            .inspect_err(|e| {
                tracing::warn!(error = %e, "metrics: the fleet could not be read from the store");
            })
            .ok()
            .map(|(registry, _)| registry)
    } else {
        None
    };
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics().render_with(fleet.as_ref()),
    ))
}

/// The fleet, queue and money gauges, from what the store says now, and the figures the
/// live page charts.
pub(crate) async fn fleet_registry(
    state: &AppState,
) -> Result<
    (
        prometheus_client::registry::Registry,
        crate::metrics::fleet::FleetSummary,
    ),
    crate::store::StoreError,
> {
    let store = state.store();
    let now = state.now();
    let live: Vec<spotplane_core::NodeState> = spotplane_core::NodeState::ALL
        .into_iter()
        .filter(|s| !s.is_terminal())
        .collect();
    let nodes = store.list_nodes(&live).await?;
    let snapshot = {
        let mut cache = state.spec_cache().lock().await;
        store.scheduler_snapshot(&mut cache).await?
    };
    let reasons = store.queued_reasons().await?;
    let view = store.metrics_view().await?;
    let spent = store
        .team_spend_since(crate::finance::month_start(now))
        .await?;
    let budgets: Vec<crate::metrics::fleet::BudgetUse> = store
        .team_budgets()
        .await?
        .into_iter()
        .map(|b| crate::metrics::fleet::BudgetUse {
            used: spent.get(&b.team_id).copied().unwrap_or_default(),
            team: b.team.to_string(),
            monthly: b.monthly,
        })
        .collect();
    Ok(crate::metrics::fleet::fleet_registry(
        &crate::metrics::fleet::FleetState {
            now,
            nodes: &nodes,
            snapshot: &snapshot,
            reasons: &reasons,
            view: &view,
            budgets: &budgets,
        },
    ))
}
