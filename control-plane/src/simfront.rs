//! The simulated nodes' instance metadata services, over HTTP, in the clouds' own shapes.
//!
//! A node agent on a simulated node is pointed at `{server}/sim/metadata/{cloud}/{instance}`
//! instead of `http://169.254.169.254` or `http://metadata.google.internal`, and then makes the
//! same requests it makes on a real VM (REFERENCE.md "Termination notices"):
//!
//! - AWS (IMDSv2 only): `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`,
//!   then `GET /latest/meta-data/spot/instance-action` and
//!   `/latest/meta-data/events/recommendations/rebalance` with `X-aws-ec2-metadata-token`
//!   (404 while nothing is pending, 401 without a valid token);
//! - GCP: `GET /computeMetadata/v1/instance/preempted` with `Metadata-Flavor: Google`, `TRUE` or
//!   `FALSE`, with `?wait_for_change=true` long-polling as on GCE;
//! - Azure: `GET /metadata/scheduledevents?api-version=2020-07-01` with `Metadata: true`, and
//!   `POST` of `{"StartRequests": [{"EventId": …}]}` to let an eviction start early.
//!
//! `{instance}` is the instance id (AWS), the instance name (GCP) or the VM name (Azure).
//! The metadata services are not authenticated, like the link-local services they imitate.
//!
//! Beside them, `/sim/control/...` does to a simulated cloud what a real cloud does on its own
//! (a preemption, a vanished instance, a spot capacity crunch), for tests and demos, and shows
//! what a cloud's console shows: every instance it ran and its bill
//! (`GET /sim/control/{cloud}/bills`). Those routes change or show the fleet, so they take an
//! admin token like the rest of the API.
//!
//! Both exist only when simulated clouds are configured.
//!
//! This is production, not lab code: `spotplane serve` with simulated clouds (the embedded
//! default) merges this router into the API, and real node agents on simulated nodes read
//! their notices here. So it sits beside `server` and, like every production module, imports
//! nothing from the lab.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;
use spotplane_core::{Cloud, Market};
use spotplane_providers::sim::{SimCloud, SimInstance};

use crate::api::AppState;
use crate::api::extract::Auth;
use crate::api::problem::ApiError;
use crate::model::Role;

/// The longest a GCP `wait_for_change` request is held.
const MAX_WAIT: Duration = Duration::from_secs(300);
/// How often a held request looks again.
const WAIT_STEP: Duration = Duration::from_millis(500);

#[derive(Clone)]
struct Front {
    sims: Arc<Vec<Arc<SimCloud>>>,
    /// IMDSv2 session tokens and when they expire.
    tokens: Arc<Mutex<HashMap<String, DateTime<Utc>>>>,
}

/// The routes, for merging into the server's router: the metadata services, open, and the
/// control routes, for admin tokens of `state`'s store only.
pub fn router(sims: Vec<Arc<SimCloud>>, state: AppState) -> Router {
    let control = Router::new()
        .route(
            "/sim/control/{cloud}/instances/{instance}/{action}",
            post(control_instance),
        )
        .route(
            "/sim/control/{cloud}/spot-outage",
            post(
                |State(f): State<Front>,
                 Path(c): Path<String>,
                 Query(q): Query<HashMap<String, String>>| {
                    control_market(f, c, q, "spot_outage", SimCloud::set_spot_outage)
                },
            ),
        )
        .route(
            "/sim/control/{cloud}/calm",
            post(
                |State(f): State<Front>,
                 Path(c): Path<String>,
                 Query(q): Query<HashMap<String, String>>| {
                    control_market(f, c, q, "calm", SimCloud::set_calm)
                },
            ),
        )
        .route("/sim/control/{cloud}/bills", get(control_bills))
        // A route layer: only matched routes ask for a token, so unknown paths stay 404.
        .route_layer(middleware::from_fn_with_state(state, admin_only))
        .with_state(Front {
            sims: Arc::new(sims.clone()),
            tokens: Arc::default(),
        });
    metadata_router(sims).merge(control)
}

/// The metadata services alone.
fn metadata_router(sims: Vec<Arc<SimCloud>>) -> Router {
    Router::new()
        .route("/sim/metadata/{cloud}/{instance}/{*path}", any(serve))
        .with_state(Front {
            sims: Arc::new(sims),
            tokens: Arc::default(),
        })
}

/// Lets only admin tokens through (401 without a live token, 403 with another role), before
/// anything of the request is read.
async fn admin_only(auth: Auth, req: Request, next: Next) -> Result<Response, ApiError> {
    auth.require(&[Role::Admin])?;
    Ok(next.run(req).await)
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

/// The simulated cloud of a flavour named in a control path.
fn sim_of(front: &Front, cloud: &str) -> Result<Arc<SimCloud>, ApiError> {
    cloud
        .parse::<Cloud>()
        .ok()
        .and_then(|c| front.sims.iter().find(|s| s.config().flavour == c))
        .cloned()
        .ok_or_else(|| ApiError::NotFound(format!("no simulated cloud {cloud:?}")))
}

/// `POST /sim/control/{cloud}/instances/{instance}/preempt` (the cloud's notice, then the end
/// of the window) or `.../vanish` (gone at once, no notice): what a cloud does to a spot node,
/// on demand, for tests and demos. Only simulated clouds have it.
async fn control_instance(
    State(front): State<Front>,
    Path((cloud, instance, action)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let sim = sim_of(&front, &cloud)?;
    let inst = sim
        .instance_by_name(&instance)
        .ok_or_else(|| ApiError::NotFound(format!("no instance {instance:?} in {cloud}")))?;
    let done = match action.as_str() {
        "preempt" => sim.preempt_now(&inst.id),
        "vanish" => sim.terminate_without_notice(&inst.id),
        _ => {
            return Err(ApiError::NotFound(format!(
                "no action {action:?}; actions: preempt, vanish"
            )));
        }
    };
    if !done {
        return Err(ApiError::Conflict(format!(
            "instance {} has a notice already or is gone",
            inst.id
        )));
    }
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({"action": action, "instance": inst.id})),
    )
        .into_response())
}

/// `GET /sim/control/{cloud}/bills`: every instance the cloud ran (gone ones included), with
/// the node it was bought for and what it charged from launch to its end (or now), to the
/// micro-dollar: what a test holds the ledger and the fleet against.
async fn control_bills(
    State(front): State<Front>,
    Path(cloud): Path<String>,
) -> Result<Response, ApiError> {
    let sim = sim_of(&front, &cloud)?;
    Ok(axum::Json(json!({"cloud": cloud, "at": sim.now(), "items": sim.bills()})).into_response())
}

/// The `on=true|false` of a control route (true when absent).
fn switch(query: &HashMap<String, String>) -> Result<bool, ApiError> {
    match query.get("on").map(String::as_str) {
        Some("true") | None => Ok(true),
        Some("false") => Ok(false),
        Some(_) => Err(ApiError::field("query.on", "must be true or false")),
    }
}

/// `POST /sim/control/{cloud}/spot-outage?on=true|false`: a cloud-wide spot capacity crunch.
/// `POST /sim/control/{cloud}/calm?on=true|false`: a calm market, whatever the traces say:
/// spot is always there and nothing bought is taken back (the crunch still wins while on).
async fn control_market(
    front: Front,
    cloud: String,
    query: HashMap<String, String>,
    condition: &'static str,
    set: fn(&SimCloud, bool),
) -> Result<Response, ApiError> {
    let sim = sim_of(&front, &cloud)?;
    let on = switch(&query)?;
    set(&sim, on);
    Ok(axum::Json(json!({"cloud": cloud, condition: on})).into_response())
}

async fn serve(
    State(front): State<Front>,
    Path((cloud, instance, path)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(cloud) = cloud.parse::<Cloud>() else {
        return text(StatusCode::NOT_FOUND, "no such cloud");
    };
    let Some(sim) = front.sims.iter().find(|s| s.config().flavour == cloud) else {
        return text(StatusCode::NOT_FOUND, "no simulated cloud of this flavour");
    };
    let Some(inst) = sim.instance_by_name(&instance) else {
        return text(StatusCode::NOT_FOUND, "no such instance");
    };
    if inst.terminated_at.is_some_and(|t| t <= sim.now()) {
        // The VM is gone; its metadata service with it.
        return text(StatusCode::SERVICE_UNAVAILABLE, "instance terminated");
    }
    match cloud {
        Cloud::Aws => aws(&front, sim, &inst, &method, &path, &headers),
        Cloud::Gcp => gcp(sim, &instance, &method, &path, &query, &headers).await,
        Cloud::Azure => azure(sim, &inst, &method, &path, &query, &headers, &body),
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn aws(
    front: &Front,
    sim: &SimCloud,
    inst: &SimInstance,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Response {
    let now = sim.now();
    if path == "latest/api/token" {
        if method != Method::PUT {
            return text(StatusCode::METHOD_NOT_ALLOWED, "");
        }
        let ttl = headers
            .get("x-aws-ec2-metadata-token-ttl-seconds")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i64>().ok());
        let Some(ttl) = ttl.filter(|t| (1..=21_600).contains(t)) else {
            return text(StatusCode::BAD_REQUEST, "");
        };
        let token = format!("AQAEA{}", uuid::Uuid::new_v4().simple());
        let mut tokens = front.tokens.lock().unwrap_or_else(|p| p.into_inner());
        tokens.retain(|_, exp| *exp > now);
        tokens.insert(token.clone(), now + chrono::Duration::seconds(ttl));
        let mut resp = text(StatusCode::OK, token);
        if let Ok(v) = HeaderValue::from_str(&ttl.to_string()) {
            resp.headers_mut()
                .insert("x-aws-ec2-metadata-token-ttl-seconds", v);
        }
        return resp;
    }
    if method != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "");
    }
    let valid = headers
        .get("x-aws-ec2-metadata-token")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| {
            let tokens = front.tokens.lock().unwrap_or_else(|p| p.into_inner());
            tokens.get(t).is_some_and(|exp| *exp > now)
        });
    if !valid {
        return text(StatusCode::UNAUTHORIZED, "");
    }
    let notice = sim.notice(&inst.id);
    match path {
        "latest/meta-data/spot/instance-action" => match notice {
            Some(n) => json_response(json!({"action": "terminate", "time": rfc3339(n.deadline)})),
            None => text(StatusCode::NOT_FOUND, not_found_html()),
        },
        // The simulation recommends rebalancing when it posts the interruption notice.
        "latest/meta-data/events/recommendations/rebalance" => match notice {
            Some(n) => json_response(json!({"noticeTime": rfc3339(n.posted_at)})),
            None => text(StatusCode::NOT_FOUND, not_found_html()),
        },
        "latest/meta-data/instance-id" => text(StatusCode::OK, inst.id.clone()),
        "latest/meta-data/instance-type" => text(StatusCode::OK, inst.instance_type.to_string()),
        "latest/meta-data/placement/availability-zone-id" => {
            text(StatusCode::OK, inst.zone.to_string())
        }
        "latest/meta-data/instance-life-cycle" => text(
            StatusCode::OK,
            if inst.market == Market::Spot {
                "spot"
            } else {
                "on-demand"
            },
        ),
        _ => text(StatusCode::NOT_FOUND, not_found_html()),
    }
}

/// IMDS answers unknown paths with a small HTML page.
fn not_found_html() -> &'static str {
    "<?xml version=\"1.0\" encoding=\"iso-8859-1\"?>\n<html><head><title>404 - Not Found</title></head><body><h1>404 - Not Found</h1></body></html>\n"
}

fn json_response(v: serde_json::Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

async fn gcp(
    sim: &SimCloud,
    name: &str,
    method: &Method,
    path: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Response {
    let flavour_ok = headers
        .get("metadata-flavor")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("google"));
    if !flavour_ok {
        return text(
            StatusCode::FORBIDDEN,
            "Missing Metadata-Flavor:Google header.",
        );
    }
    if method != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "");
    }
    let value = |sim: &SimCloud| -> Option<String> {
        let inst = sim.instance_by_name(name)?;
        Some(match path {
            "computeMetadata/v1/instance/preempted" => if sim.notice(&inst.id).is_some() {
                "TRUE"
            } else {
                "FALSE"
            }
            .to_owned(),
            "computeMetadata/v1/instance/name" => inst.id.clone(),
            "computeMetadata/v1/instance/zone" => {
                format!("projects/{PROJECT_NUMBER}/zones/{}", inst.zone)
            }
            "computeMetadata/v1/instance/machine-type" => {
                format!(
                    "projects/{PROJECT_NUMBER}/machineTypes/{}",
                    inst.instance_type
                )
            }
            "computeMetadata/v1/instance/scheduling/provisioning-model" => {
                if inst.market == Market::Spot {
                    "SPOT"
                } else {
                    "STANDARD"
                }
                .to_owned()
            }
            _ => return None,
        })
    };
    let Some(mut current) = value(sim) else {
        return text(StatusCode::NOT_FOUND, "");
    };
    if query.get("wait_for_change").map(String::as_str) == Some("true") {
        // Hold the request until the value differs from the caller's (by ETag, else from now).
        let seen = query
            .get("last_etag")
            .cloned()
            .unwrap_or_else(|| etag(&current));
        let limit = query
            .get("timeout_sec")
            .and_then(|t| t.parse::<u64>().ok())
            .map_or(MAX_WAIT, |s| Duration::from_secs(s).min(MAX_WAIT));
        let started = tokio::time::Instant::now();
        while etag(&current) == seen && started.elapsed() < limit {
            tokio::time::sleep(WAIT_STEP).await;
            match value(sim) {
                Some(v) => current = v,
                // Deleted while we waited.
                None => return text(StatusCode::SERVICE_UNAVAILABLE, "instance terminated"),
            }
        }
    }
    let mut resp = text(StatusCode::OK, current.clone());
    let h = resp.headers_mut();
    h.insert("metadata-flavor", HeaderValue::from_static("Google"));
    if let Ok(v) = HeaderValue::from_str(&etag(&current)) {
        h.insert(header::ETAG, v);
    }
    resp
}

/// A made-up project number for the simulated GCP project.
const PROJECT_NUMBER: &str = "123456789012";

fn etag(value: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(value.as_bytes())[..8])
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct StartRequests {
    start_requests: Vec<StartRequest>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct StartRequest {
    event_id: String,
}

fn azure(
    sim: &SimCloud,
    inst: &SimInstance,
    method: &Method,
    path: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Response {
    let azure_error = |status: StatusCode, msg: &str| {
        (
            status,
            [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
            json!({"error": msg}).to_string(),
        )
            .into_response()
    };
    let header_ok = headers
        .get("metadata")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if !header_ok {
        return azure_error(
            StatusCode::BAD_REQUEST,
            "Bad request. Required metadata header not specified",
        );
    }
    if !query.contains_key("api-version") {
        return azure_error(
            StatusCode::BAD_REQUEST,
            "Bad request. api-version was not specified in the request",
        );
    }
    let name = inst.id.rsplit('/').next().unwrap_or(&inst.id).to_owned();
    match (method.clone(), path) {
        (Method::GET, "metadata/scheduledevents") => {
            let now = sim.now();
            let doc = match sim.notice(&inst.id) {
                None => json!({"DocumentIncarnation": 0, "Events": []}),
                Some(n) => {
                    let started = n.deadline <= now || inst.terminated_at.is_some_and(|t| t <= now);
                    json!({
                        "DocumentIncarnation": if started { 2 } else { 1 },
                        "Events": [{
                            "EventId": n.event_id,
                            "EventStatus": if started { "Started" } else { "Scheduled" },
                            "EventType": "Preempt",
                            "ResourceType": "VirtualMachine",
                            "Resources": [name],
                            "NotBefore": n.deadline.format("%a, %d %b %Y %H:%M:%S GMT").to_string(),
                            "Description": "The Spot virtual machine is being evicted.",
                            "EventSource": "Platform",
                            "DurationInSeconds": -1,
                        }]
                    })
                }
            };
            json_response(doc)
        }
        (Method::POST, "metadata/scheduledevents") => {
            let Ok(req) = serde_json::from_slice::<StartRequests>(body) else {
                return azure_error(
                    StatusCode::BAD_REQUEST,
                    "Bad request. The body must be {\"StartRequests\": [{\"EventId\": \"...\"}]}",
                );
            };
            for r in req.start_requests {
                sim.acknowledge(&r.event_id);
            }
            text(StatusCode::OK, "")
        }
        (Method::GET, "metadata/instance/compute") | (Method::GET, "metadata/instance") => {
            let location = inst.zone.rsplit_once('-').map_or(&*inst.zone, |(l, _)| l);
            let zone = inst.zone.rsplit_once('-').map_or("", |(_, z)| z);
            let compute = json!({
                "name": name,
                "location": location,
                "zone": zone,
                "vmSize": inst.instance_type,
                "priority": if inst.market == Market::Spot { "Spot" } else { "Regular" },
                "resourceId": inst.id,
            });
            if path == "metadata/instance" {
                json_response(json!({ "compute": compute }))
            } else {
                json_response(compute)
            }
        }
        _ => azure_error(StatusCode::NOT_FOUND, "Not found"),
    }
}

#[cfg(test)]
mod tests;
