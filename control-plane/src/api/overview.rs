//! `GET /v1/overview` (admin, finance): the whole cluster at a glance — nodes by cloud and
//! market with their GPUs, MIG slices and shares and who uses them, the newest jobs and events,
//! and spend against on-demand — and `GET /`, the live page that draws it.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use chrono::{DateTime, Utc};
use serde::Serialize;
use spotplane_core::NodeState;
use utoipa::ToSchema;

use super::AppState;
use super::extract::Auth;
use super::problem::{ApiError, Problem};
use crate::finance::held::{HeldSpend, held_spend};
use crate::model::{Node, Role};
use crate::store::{JobLine, PlacedReplica};

/// One event of the outbox, as the page lists it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EventLine {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// `job.draining`, `node.ready`, ...
    pub kind: String,
    pub subject_id: String,
    /// The reason or state the event carries, if any.
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Overview {
    /// The control plane's time (simulated time in the demo).
    pub now: DateTime<Utc>,
    /// Live nodes, and those that ended in the last hour.
    pub nodes: Vec<Node>,
    /// Every live replica and where it runs.
    pub replicas: Vec<PlacedReplica>,
    /// Jobs by state.
    pub job_counts: BTreeMap<String, u64>,
    /// The 60 most recently changed jobs.
    pub jobs: Vec<JobLine>,
    /// The 60 newest events.
    pub events: Vec<EventLine>,
    /// Spend by node time held, against on-demand prices of the same capacity.
    pub spend: HeldSpend,
    /// This replica's samples of the fleet over time, oldest first (the charts).
    pub history: Vec<crate::metrics::history::Sample>,
}

#[utoipa::path(get, path = "/v1/overview", tag = "cluster",
    responses((status = 200, body = Overview), (status = 403, body = Problem)), security(("bearer" = [])))]
pub async fn overview(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<Overview>, ApiError> {
    auth.require(&[Role::Admin, Role::Finance])?;
    let now = state.now();
    let store = state.store();
    let all = store.list_nodes(&NodeState::ALL).await?;
    let spend = held_spend(&all, now);
    let nodes: Vec<Node> = all
        .into_iter()
        .filter(|n| {
            !n.state.is_terminal()
                || n.terminated_at
                    .is_some_and(|t| now - t < chrono::Duration::hours(1))
        })
        .collect();
    let replicas = store.placed_replicas().await?;
    let (jobs, job_counts) = store.job_overview(60).await?;
    let events = store
        .recent_events(60)
        .await?
        .into_iter()
        .filter(|e| e.kind != "node.command_queued")
        .map(|e| EventLine {
            id: e.id,
            at: e.created_at,
            detail: e.payload["reason"]
                .as_str()
                .or_else(|| e.payload["job"]["state_reason"].as_str())
                .map(str::to_owned),
            kind: e.kind,
            subject_id: e.subject_id,
        })
        .collect();
    Ok(Json(Overview {
        now,
        nodes,
        replicas,
        job_counts,
        jobs,
        events,
        spend,
        history: state.history().samples(),
    }))
}

/// The live page. It asks for the token (or takes it from the address's `#token=` fragment,
/// which never leaves the browser) and polls `/v1/overview`.
pub async fn page() -> impl IntoResponse {
    (
        [(header::CACHE_CONTROL, "no-store")],
        Html(include_str!("page.html")),
    )
}
