//! `/v1/webhooks`: a team's endpoints, their secrets, their delivery logs, and test pings.
//!
//! A team token manages its own team's subscriptions (another team's answer 404); admin tokens
//! manage all and name the team when creating. The secret is shown when a subscription is
//! created and when it is rotated, never otherwise.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::Duration;
use serde::{Deserialize, Serialize};
use spotplane_core::FieldErrors;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::AppState;
use super::extract::{Auth, JsonBody, Listing, PageParams};
use super::problem::{ApiError, Problem};
use crate::model::{Delivery, Page, Role, Subscription};
use crate::reconcile::webhooks::ping;
use crate::store::{NewSubscription, Principal, SubscriptionPatch};
use crate::webhooks::signing::Secret;
use crate::webhooks::{EventType, target};

const MAX_OVERLAP_S: u64 = 7 * 24 * 3600;

fn scope(p: &Principal) -> Option<&str> {
    match p.role {
        Role::Team => p.team.as_ref().map(|(id, _)| id.as_str()),
        _ => None,
    }
}

/// A new subscription.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWebhook {
    /// `http` or `https`, no credentials; private, loopback and link-local addresses are
    /// refused unless the server allows them (`webhooks.allow_private`).
    pub url: String,
    /// Event types to deliver: `job.queued`, `job.admitted`, `job.running`, `job.preempted`,
    /// `job.checkpointed`, `job.resumed`, `job.succeeded`, `job.failed`, `job.cancelled`,
    /// `node.notice`, `budget.alert`, `webhook.disabled`.
    pub event_types: Vec<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// The team (admin tokens; team tokens subscribe for their own team).
    #[serde(default)]
    pub team: Option<String>,
}

/// Changes to a subscription; absent fields stay as they are.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateWebhook {
    pub url: Option<String>,
    pub event_types: Option<Vec<String>>,
    pub description: Option<String>,
    /// `true` re-enables a disabled endpoint: its waiting deliveries go out again.
    pub enabled: Option<bool>,
}

/// A secret rotation.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    /// Seconds the old secret still signs, both signatures sent meanwhile (default
    /// `webhooks.rotation_overlap`; at most 7 days; 0 ends the old secret now).
    pub overlap_s: Option<u64>,
}

/// A subscription with its secret: shown when created or rotated only.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookWithSecret {
    #[serde(flatten)]
    pub subscription: Subscription,
    /// `whsec_` and base64: verify `webhook-signature` with it (Standard Webhooks).
    pub secret: String,
}

/// What a test ping did.
#[derive(Debug, Serialize, ToSchema)]
pub struct PingResult {
    pub delivery_id: String,
    pub delivered: bool,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub latency_ms: i64,
}

/// Paging through a delivery log.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListDeliveries {
    /// `pending`, `delivered` or `failed`.
    pub state: Option<String>,
}

/// Lists of subscriptions.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListWebhooks {
    /// Only this team's (admin tokens).
    pub team: Option<String>,
}

fn event_types(v: &[String], errs: &mut FieldErrors) -> Vec<EventType> {
    if v.is_empty() {
        errs.push("event_types", "name at least one event type");
    }
    let mut out: Vec<EventType> = Vec::new();
    for (i, s) in v.iter().enumerate() {
        match s.parse::<EventType>() {
            Ok(EventType::Ping) => errs.push(
                format!("event_types[{i}]"),
                "pings are sent to the endpoint pinged only; not a subscription",
            ),
            Ok(t) if out.contains(&t) => errs.push(format!("event_types[{i}]"), "repeated"),
            Ok(t) => out.push(t),
            Err(m) => errs.push(format!("event_types[{i}]"), m),
        }
    }
    out
}

fn description(d: Option<&String>, errs: &mut FieldErrors) {
    if d.is_some_and(|d| d.chars().count() > 256) {
        errs.push("description", "must be at most 256 characters");
    }
}

async fn check_url(state: &AppState, url: &str, errs: &mut FieldErrors) -> String {
    match target::check(url, state.webhook_settings().allow_private).await {
        Ok(u) => u.to_string(),
        Err(m) => {
            errs.push("url", m);
            String::new()
        }
    }
}

#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks", request_body = CreateWebhook,
    responses((status = 201, body = WebhookWithSecret), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    auth: Auth,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let req: CreateWebhook = body.parse()?;
    let mut errs = FieldErrors::new();
    let types = event_types(&req.event_types, &mut errs);
    description(req.description.as_ref(), &mut errs);
    let url = check_url(&state, &req.url, &mut errs).await;
    let team_id = match (&p.team, &req.team) {
        (Some((id, _)), None) => Some(id.clone()),
        (Some((id, own)), Some(named)) if own.as_str() == named => Some(id.clone()),
        (Some(_), Some(named)) => {
            return Err(ApiError::Forbidden(format!(
                "this token subscribes for its own team only, not {named}"
            )));
        }
        (None, Some(named)) => match state.store().get_team(named).await {
            Ok(t) => Some(t.id),
            Err(crate::store::StoreError::NotFound(_)) => {
                errs.push("team", format!("no team named {named}"));
                None
            }
            Err(e) => return Err(e.into()),
        },
        (None, None) => {
            errs.push(
                "team",
                "admin tokens must name the team the webhook belongs to",
            );
            None
        }
    };
    errs.into_result()?;
    let Some(team_id) = team_id else {
        return Err(ApiError::field("team", "no team"));
    };
    let secret = Secret::generate();
    let sub = state
        .store()
        .create_subscription(
            state.secrets_key()?,
            NewSubscription {
                team_id,
                url,
                event_types: types,
                description: req.description,
                secret: secret.clone(),
            },
            state.now(),
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(WebhookWithSecret {
            subscription: sub,
            secret: secret.expose(),
        }),
    )
        .into_response())
}

#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks", description = "Subscriptions, newest first.",
    params(ListWebhooks, PageParams),
    responses((status = 200, body = Page<Subscription>), (status = 400, body = Problem),
        (status = 404, body = Problem, description = "No team named `team`")), security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    auth: Auth,
    Listing { filter: q, page }: Listing<ListWebhooks, Uuid>,
) -> Result<Json<Page<Subscription>>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let team_id = match (scope(p), q.team) {
        (Some(own), _) => Some(own.to_owned()),
        (None, Some(name)) => Some(state.store().get_team(&name).await?.id),
        (None, None) => None,
    };
    Ok(Json(
        state
            .store()
            .list_subscriptions(team_id.as_deref(), &page)
            .await?,
    ))
}

#[utoipa::path(get, path = "/v1/webhooks/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "Subscription id")),
    responses((status = 200, body = Subscription), (status = 404, body = Problem)), security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Subscription>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    Ok(Json(state.store().get_subscription(&id, scope(p)).await?))
}

#[utoipa::path(patch, path = "/v1/webhooks/{id}", tag = "webhooks", request_body = UpdateWebhook,
    params(("id" = String, Path, description = "Subscription id")),
    responses((status = 200, body = Subscription), (status = 404, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn update(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: JsonBody,
) -> Result<Json<Subscription>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let req: UpdateWebhook = body.parse()?;
    // Exists and is the caller's, before anything is checked against the network.
    state.store().get_subscription(&id, scope(p)).await?;
    let mut errs = FieldErrors::new();
    let types = req.event_types.as_ref().map(|t| event_types(t, &mut errs));
    description(req.description.as_ref(), &mut errs);
    let url = match &req.url {
        Some(u) => Some(check_url(&state, u, &mut errs).await),
        None => None,
    };
    errs.into_result()?;
    let patch = SubscriptionPatch {
        url,
        event_types: types,
        description: req.description.map(Some),
        enabled: req.enabled,
    };
    Ok(Json(
        state
            .store()
            .update_subscription(&id, scope(p), patch, state.now())
            .await?,
    ))
}

#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "Subscription id")),
    responses((status = 204, description = "Deleted with its delivery log"), (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    state.store().delete_subscription(&id, scope(p)).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/webhooks/{id}/rotate-secret", tag = "webhooks",
    request_body(content = Option<RotateSecret>),
    params(("id" = String, Path, description = "Subscription id")),
    responses((status = 200, body = WebhookWithSecret), (status = 404, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn rotate_secret(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<WebhookWithSecret>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let req: RotateSecret = if body.iter().all(u8::is_ascii_whitespace) {
        RotateSecret::default()
    } else {
        super::extract::parse_json(&body)?
    };
    let overlap = req
        .overlap_s
        .unwrap_or(state.webhook_settings().rotation_overlap.as_secs());
    if overlap > MAX_OVERLAP_S {
        return Err(ApiError::field(
            "overlap_s",
            format!("must be at most {MAX_OVERLAP_S} (7 days)"),
        ));
    }
    let now = state.now();
    let secret = Secret::generate();
    let sub = state
        .store()
        .rotate_secret(
            state.secrets_key()?,
            &id,
            scope(p),
            &secret,
            now + Duration::seconds(i64::try_from(overlap).unwrap_or(0)),
            now,
        )
        .await?;
    Ok(Json(WebhookWithSecret {
        subscription: sub,
        secret: secret.expose(),
    }))
}

#[utoipa::path(post, path = "/v1/webhooks/{id}/ping", tag = "webhooks",
    params(("id" = String, Path, description = "Subscription id")),
    responses((status = 200, body = PingResult, description = "Sent now, signed like every delivery; the result is in the delivery log too"),
        (status = 404, body = Problem),
        (status = 429, body = Problem, description = "Over the team's `webhooks.pings_per_minute`; `Retry-After` says when to try again")),
    security(("bearer" = [])))]
pub async fn send_ping(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<PingResult>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    // Another team's endpoint is not found before it is counted; the limit is the endpoint's
    // team's, whoever pings (so the endpoint is not flooded through an admin token either).
    let sub = state.store().get_subscription(&id, scope(p)).await?;
    if let Err(wait) = state
        .ping_limiter()
        .take(sub.team.as_str(), tokio::time::Instant::now())
    {
        return Err(ApiError::TooManyRequests {
            detail: format!(
                "team {} may ping its webhooks {} times a minute; try again in {} s",
                sub.team,
                state.webhook_settings().pings_per_minute,
                wait.as_secs_f64().ceil()
            ),
            retry_after: wait,
        });
    }
    let d = state
        .store()
        .create_ping(state.secrets_key()?, &id, scope(p), state.now())
        .await?;
    let sender = state.webhook_sender().map_err(ApiError::Unavailable)?;
    let clock = state.clock();
    let outcome = ping(state.store(), &sender, &clock, state.webhook_settings(), &d).await?;
    Ok(Json(PingResult {
        delivery_id: d.id,
        delivered: outcome.delivered(),
        status: outcome.status,
        error: outcome.error,
        latency_ms: i64::try_from(outcome.latency.as_millis()).unwrap_or(i64::MAX),
    }))
}

#[utoipa::path(get, path = "/v1/webhooks/{id}/deliveries", tag = "webhooks",
    params(("id" = String, Path, description = "Subscription id"), ListDeliveries, PageParams),
    responses((status = 200, body = Page<Delivery>), (status = 400, body = Problem), (status = 404, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn deliveries(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    Listing { filter: q, page }: Listing<ListDeliveries, Uuid>,
) -> Result<Json<Page<Delivery>>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let mut errs = FieldErrors::new();
    if let Some(s) = q.state.as_deref()
        && !matches!(s, "pending" | "delivered" | "failed")
    {
        errs.push(
            "state",
            format!("{s:?} is not pending, delivered or failed"),
        );
    }
    errs.into_result()?;
    Ok(Json(
        state
            .store()
            .list_deliveries(&id, scope(p), q.state.as_deref(), &page)
            .await?,
    ))
}
