//! The REST API: JSON under `/v1`, bearer tokens, `problem+json` errors, an OpenAPI document
//! generated from these handlers at `/v1/openapi.json`.
//!
//! Who may do what (role × endpoint) is decided in each handler with [`extract::Auth::require`],
//! next to the code it guards; `docs/api.md` has the whole matrix and the tests walk it.

pub mod extract;
pub mod problem;

mod agent;
mod cluster;
mod finance;
mod health;
mod jobs;
pub mod logs;
mod openapi;
pub mod overview;
mod secrets;
mod teams;
mod tokens;
mod webhooks;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{delete, get, post};
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

pub use openapi::ApiDoc;
use problem::ApiError;

use crate::clock::SharedClock;
use crate::config::{FinanceSettings, ServerConfig, WebhookSettings};
use crate::metrics::{HttpLabels, Metrics};
use crate::store::{Principal, Store};
use crate::webhooks::limit::PingLimiter;
use crate::webhooks::sender::Sender;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    clock: SharedClock,
    metrics: Metrics,
    ready: AtomicBool,
    max_body_bytes: usize,
    request_timeout: Duration,
    finance: FinanceSettings,
    webhooks: WebhookSettings,
    /// The webhook HTTP client, or why it could not be built.
    sender: Result<Arc<Sender>, String>,
    /// How often each team may ping its endpoints.
    pings: PingLimiter,
    /// `object_store.url`: jobs without a checkpoint URI of their own keep theirs under
    /// `<url>/jobs/<id>`, and agents' checkpoint reports must stay under it.
    object_store_url: String,
    /// `object_store.url`, when it is a `file://` folder: the only place a job's own `file://`
    /// checkpoint URI may point. None refuses every `file://` URI a request names.
    local_objects: Option<String>,
    /// The key team secrets are sealed with; None until `with_secrets` (the secrets routes
    /// then answer 503).
    secrets: Option<crate::secrets::SecretsKey>,
    /// Replicas' output: how much is kept, how followers are woken.
    log_settings: logs::LogSettings,
    log_hub: logs::LogHub,
    /// Cancelled when the server shuts down: long answers (log followers) end.
    shutdown: CancellationToken,
    /// Parsed job specs for the scheduler snapshot `/metrics` reads at each scrape.
    spec_cache: tokio::sync::Mutex<crate::store::SpecCache>,
    /// The live page's chart samples.
    history: crate::metrics::history::History,
}

impl AppState {
    pub fn new(store: Store, clock: SharedClock, metrics: Metrics, server: &ServerConfig) -> Self {
        AppState {
            inner: Arc::new(Inner {
                store,
                clock,
                metrics,
                ready: AtomicBool::new(false),
                max_body_bytes: server.max_body_bytes,
                request_timeout: server.request_timeout,
                finance: FinanceSettings::default(),
                webhooks: WebhookSettings::default(),
                sender: Sender::new(&WebhookSettings::default())
                    .map(Arc::new)
                    .map_err(|e| e.to_string()),
                pings: PingLimiter::new(WebhookSettings::default().pings_per_minute),
                // Until `with_object_store`, no job without a URI of its own has a prefix
                // (its reports are refused).
                object_store_url: String::new(),
                local_objects: None,
                secrets: None,
                log_settings: logs::LogSettings::default(),
                log_hub: logs::LogHub::default(),
                shutdown: CancellationToken::new(),
                spec_cache: tokio::sync::Mutex::default(),
                history: crate::metrics::history::History::default(),
            }),
        }
    }

    /// The live page's chart samples.
    pub fn history(&self) -> &crate::metrics::history::History {
        &self.inner.history
    }

    /// Takes a chart sample now (what a scrape of `/metrics` would compute).
    pub async fn sample_history(&self) -> Result<(), crate::store::StoreError> {
        let (_, summary) = health::fleet_registry(self).await?;
        self.inner.history.push(self.now(), &summary);
        Ok(())
    }

    /// Sets the finance settings (before the state is shared).
    pub fn with_finance(mut self, finance: FinanceSettings) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.finance = finance;
        }
        self
    }

    /// Keeps `samples` chart samples (before the state is shared).
    pub fn with_history(mut self, samples: usize) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.history = crate::metrics::history::History::new(samples);
        }
        self
    }

    /// Sets the webhook settings and the client deliveries and pings are sent with.
    pub fn with_webhooks(mut self, settings: WebhookSettings, sender: Arc<Sender>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.pings = PingLimiter::new(settings.pings_per_minute);
            inner.webhooks = settings;
            inner.sender = Ok(sender);
        }
        self
    }

    /// Sets the object store jobs' checkpoints go to by default (before the state is shared);
    /// a `file://` checkpoint URI named in a job must lie under it.
    pub fn with_object_store(mut self, url: &str) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.object_store_url = url.to_owned();
            inner.local_objects = url
                .strip_prefix("file://")
                .map(|path| format!("file://{}", path.trim_end_matches('/')));
        }
        self
    }

    /// Sets the key team secrets are sealed with (before the state is shared).
    pub fn with_secrets(mut self, key: crate::secrets::SecretsKey) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.secrets = Some(key);
        }
        self
    }

    /// Sets how replicas' output is kept and followed (before the state is shared).
    pub fn with_log_settings(mut self, settings: logs::LogSettings) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.log_settings = settings;
        }
        self
    }

    /// The secrets key, or 503 where the server was built without one.
    pub fn secrets_key(&self) -> Result<&crate::secrets::SecretsKey, ApiError> {
        self.inner
            .secrets
            .as_ref()
            .ok_or_else(|| ApiError::Unavailable("this server has no secrets key".into()))
    }

    /// Ends long answers (log followers) when `token` is cancelled (before the state is
    /// shared).
    pub fn with_shutdown(mut self, token: CancellationToken) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.shutdown = token;
        }
        self
    }

    pub fn log_settings(&self) -> &logs::LogSettings {
        &self.inner.log_settings
    }

    pub fn log_hub(&self) -> &logs::LogHub {
        &self.inner.log_hub
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    pub fn object_store_url(&self) -> &str {
        &self.inner.object_store_url
    }

    /// Refuses a `file://` checkpoint URI outside the object store: a job could otherwise
    /// have its node's agent write checkpoints into, and resume from, any folder the agent can
    /// reach (`file:///etc`). Other schemes name buckets that the agent's own cloud
    /// credentials guard.
    pub fn check_checkpoint_uri(&self, uri: &str) -> Result<(), String> {
        let Some(path) = uri.strip_prefix("file://") else {
            return Ok(());
        };
        let under = self.inner.local_objects.as_deref().and_then(|root| {
            let root = root.strip_prefix("file://")?;
            let rest = path.strip_prefix(root)?.strip_prefix('/')?;
            (!root.is_empty() && !rest.split('/').any(|seg| seg == ".." || seg == "."))
                .then_some(())
        });
        match (under, &self.inner.local_objects) {
            (Some(()), _) => Ok(()),
            (None, Some(root)) => Err(format!(
                "a file:// checkpoint URI must lie under the object store, {root}/"
            )),
            (None, None) => Err(
                "file:// checkpoint URIs are not accepted: the object store is not a local folder"
                    .into(),
            ),
        }
    }

    pub fn webhook_settings(&self) -> &WebhookSettings {
        &self.inner.webhooks
    }

    pub fn webhook_sender(&self) -> Result<Arc<Sender>, String> {
        self.inner.sender.clone()
    }

    pub fn ping_limiter(&self) -> &PingLimiter {
        &self.inner.pings
    }

    pub fn clock(&self) -> SharedClock {
        self.inner.clock.clone()
    }

    pub fn finance(&self) -> &FinanceSettings {
        &self.inner.finance
    }

    pub fn max_body_bytes(&self) -> usize {
        self.inner.max_body_bytes
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }

    /// The spec cache of the scrape's scheduler snapshot.
    pub fn spec_cache(&self) -> &tokio::sync::Mutex<crate::store::SpecCache> {
        &self.inner.spec_cache
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Marks the server ready (migrations applied) for `/readyz`.
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    async fn authenticate(&self, secret: &str) -> Result<Option<Principal>, ApiError> {
        Ok(self.inner.store.authenticate(secret, self.now()).await?)
    }
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    let request_timeout = state.inner.request_timeout;
    let v1 = Router::new()
        .route("/teams", post(teams::create_team).get(teams::list_teams))
        .route(
            "/teams/{team}",
            get(teams::get_team).patch(teams::update_team),
        )
        .route(
            "/teams/{team}/tokens",
            post(tokens::create_team_token).get(tokens::list_team_tokens),
        )
        .route(
            "/tokens",
            post(tokens::create_token).get(tokens::list_tokens),
        )
        .route("/tokens/{id}", delete(tokens::revoke_token))
        .merge(secrets::routes())
        .route("/jobs", post(jobs::submit_job).get(jobs::list_jobs))
        .route("/jobs/{id}", get(jobs::get_job))
        .route("/jobs/{id}/cancel", post(jobs::cancel_job))
        .route("/jobs/{id}/events", get(jobs::job_events))
        .route("/jobs/{id}/logs", get(logs::job_logs))
        .route("/nodes", get(cluster::list_nodes))
        .route("/offers", get(cluster::list_offers))
        .route("/overview", get(overview::overview))
        .route("/webhooks", post(webhooks::create).get(webhooks::list))
        .route(
            "/webhooks/{id}",
            get(webhooks::get)
                .patch(webhooks::update)
                .delete(webhooks::delete),
        )
        .route(
            "/webhooks/{id}/rotate-secret",
            post(webhooks::rotate_secret),
        )
        .route("/webhooks/{id}/ping", post(webhooks::send_ping))
        .route("/webhooks/{id}/deliveries", get(webhooks::deliveries))
        .route("/finance/summary", get(finance::summary))
        .route("/finance/export.csv", get(finance::export_csv))
        .route(
            "/teams/{team}/budget",
            get(finance::get_budget).put(finance::put_budget),
        )
        .route("/openapi.json", get(openapi::openapi_json))
        .merge(agent::routes())
        .merge(logs::routes());
    let max_body = state.inner.max_body_bytes;
    Router::new()
        .route("/", get(overview::page))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .nest("/v1", v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            record_metrics,
        ))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            request_timeout,
        ))
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .with_state(state)
}

/// Each request's span: its method and route (the pattern, never the path or query), and the
/// job, node and attempt it turns out to concern (see [`trace_ids`]).
fn request_span<B>(req: &axum::http::Request<B>) -> tracing::Span {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("", MatchedPath::as_str);
    tracing::info_span!(
        "request",
        method = %req.method(),
        route,
        job_id = tracing::field::Empty,
        node_id = tracing::field::Empty,
        attempt = tracing::field::Empty,
    )
}

/// Records on the request's span the job, node and attempt it concerns, once a handler knows
/// them, so the request's span and the store calls under it can be found by job or node.
pub(crate) fn trace_ids(
    job: Option<spotplane_core::JobId>,
    node: Option<spotplane_core::NodeId>,
    attempt: Option<u32>,
) {
    let span = tracing::Span::current();
    if let Some(j) = job {
        span.record("job_id", tracing::field::display(j));
    }
    if let Some(n) = node {
        span.record("node_id", tracing::field::display(n));
    }
    if let Some(a) = attempt {
        span.record("attempt", a);
    }
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such endpoint; see /v1/openapi.json".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

async fn record_metrics(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = req.method().to_string();
    let resp = next.run(req).await;
    state
        .metrics()
        .http_requests
        .get_or_create(&HttpLabels {
            method,
            route,
            status: resp.status().as_u16(),
        })
        .observe(started.elapsed().as_secs_f64());
    resp
}
