//! Liveness, readiness and metrics: unauthenticated, for load balancers and Prometheus.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{Value, json};

use super::AppState;
use super::problem::ApiError;

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

pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics().render(),
    )
}
