//! The node agents' side of the API (`/v1/agent/...`) and the operators' view of it.
//!
//! Agents: `register` (the node's one-time bootstrap token for its credential, or the
//! credential again after a restart), `heartbeat` (telemetry, replicas, notice, results; answered
//! with the node's pending commands), a command's `result`, and `checkpoints` (a replica's
//! checkpoint made durable, or not). A node credential acts for its own node only: a body that
//! names another node is refused (403), a job or command of another node is not found (404).
//!
//! Operators (admin): issue a node's bootstrap token, queue a command (e.g. `drain`), and read
//! what an agent reported and which commands it ran; teams read their jobs' checkpoints.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use spotplane_core::agent::{
    CheckpointOutcome, CheckpointReport, CommandKind, CommandResult, Heartbeat, HeartbeatResponse,
    PROTOCOL_VERSION, RegisterRequest, RegisterResponse,
};
use spotplane_core::{CheckpointId, Cloud, CommandId, FieldErrors, JobId, NodeId, limits};
use utoipa::ToSchema;

use super::AppState;
use super::extract::{Auth, JsonBody, Listing, NoFilter, PageParams};
use super::problem::{ApiError, Problem};
use crate::model::{Page, Role};
use crate::store::{
    AgentCaller, AgentStatus, BOOTSTRAP_PREFIX, CheckpointRecord, CommandRecord, Principal,
    Registration,
};

/// How often agents heartbeat.
pub const HEARTBEAT_INTERVAL_MS: u64 = 5_000;
/// The signal a workload gets when it should checkpoint.
pub const CHECKPOINT_SIGNAL: &str = "SIGUSR1";
/// How long a bootstrap token lives when the request does not say.
pub const DEFAULT_BOOTSTRAP_TTL_SECS: u64 = 24 * 3600;
/// Upper bounds on what one heartbeat may carry (a node has at most a few dozen GPUs, MIG
/// devices and replicas); more is a broken or hostile agent.
const MAX_MANIFEST_FILES: usize = limits::MANIFEST_FILES.max as usize;

/// How often an agent polls its cloud's metadata service (REFERENCE.md: AWS every 5 s, Azure
/// every second; GCP is answered by a held `wait_for_change` request, polled as a fallback).
fn notice_poll_ms(cloud: Cloud) -> u64 {
    match cloud {
        Cloud::Aws => 5_000,
        Cloud::Gcp | Cloud::Azure => 1_000,
    }
}

/// The routes of this module, under `/v1`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/agent/register", post(register))
        .route("/agent/heartbeat", post(heartbeat))
        .route("/agent/commands/{id}/result", post(command_result))
        .route("/agent/checkpoints", post(report_checkpoint))
        .route("/nodes/{id}/bootstrap-token", post(issue_bootstrap))
        .route(
            "/nodes/{id}/commands",
            post(queue_command).get(list_commands),
        )
        .route("/nodes/{id}/agent", get(agent_status))
        .route("/jobs/{id}/checkpoints", get(job_checkpoints))
}

fn own_node(p: &Principal) -> Result<NodeId, ApiError> {
    let node = p
        .node_id
        .ok_or_else(|| ApiError::Forbidden("this agent token is bound to no node".into()))?;
    super::trace_ids(None, Some(node), None);
    Ok(node)
}

fn check_node(own: NodeId, named: NodeId) -> Result<(), ApiError> {
    if own == named {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "node_id: this credential acts for node {own} only, not {named}"
        )))
    }
}

fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or(ApiError::Unauthenticated)?;
    let (scheme, secret) = value.split_once(' ').ok_or(ApiError::Unauthenticated)?;
    let secret = secret.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || secret.is_empty() || secret.len() > 512 {
        return Err(ApiError::Unauthenticated);
    }
    Ok(secret)
}

fn validate_register(req: &RegisterRequest) -> FieldErrors {
    let mut errs = FieldErrors::new();
    if req.protocol_version != PROTOCOL_VERSION {
        errs.push(
            "protocol_version",
            format!(
                "this control plane speaks protocol {PROTOCOL_VERSION}, not {}",
                req.protocol_version
            ),
        );
    }
    if req.agent_version.trim().is_empty() || req.agent_version.len() > 64 {
        errs.push("agent_version", "must be 1 to 64 characters");
    }
    if req.hostname.trim().is_empty() || req.hostname.len() > 253 {
        errs.push("hostname", "must be 1 to 253 characters");
    }
    if req.gpus.len() > 64 {
        errs.push("gpus", "at most 64 GPUs");
    }
    if let Some(a) = &req.address {
        // Gang peers connect to it: an IP address of the node's own, without a port.
        match a.parse::<std::net::IpAddr>() {
            Ok(ip) if ip.is_unspecified() || ip.is_multicast() => {
                errs.push("address", format!("{ip} cannot be connected to"));
            }
            Ok(_) => {}
            Err(_) => errs.push(
                "address",
                "must be an IP address without a port, such as 10.0.3.7 or fd00::7",
            ),
        }
    }
    errs
}

#[utoipa::path(post, path = "/v1/agent/register", tag = "agent", request_body = RegisterRequest,
    description = "Registers a node's agent. Authenticate with the node's bootstrap token (once: the answer carries the node credential) or, after a restart, with the node credential.",
    responses((status = 200, body = RegisterResponse), (status = 401, body = Problem, description = "Unknown, spent or expired token, or a credential of a terminated node"),
        (status = 403, body = Problem, description = "The token belongs to another node"),
        (status = 409, body = Problem, description = "The node is terminated (a bootstrap token)"), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn register(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: JsonBody,
) -> Result<Json<RegisterResponse>, ApiError> {
    let secret = bearer(&headers)?;
    let now = state.now();
    let caller = if secret.starts_with(BOOTSTRAP_PREFIX) {
        AgentCaller::Bootstrap(secret.to_owned())
    } else {
        let p = state
            .store()
            .authenticate(secret, now)
            .await?
            .ok_or(ApiError::Unauthenticated)?;
        if p.role != Role::Agent {
            return Err(ApiError::forbidden());
        }
        AgentCaller::Node(own_node(&p)?)
    };
    let req: RegisterRequest = body.parse()?;
    validate_register(&req).into_result()?;
    match state.store().register_agent(caller, &req, now).await? {
        Registration::Registered { credential } => {
            let node = state.store().get_node(req.node_id).await?;
            tracing::info!(node = %req.node_id, hostname = %req.hostname, exchanged = credential.is_some(), "agent registered");
            Ok(Json(RegisterResponse {
                node_id: req.node_id,
                credential,
                heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS,
                notice_poll_interval_ms: notice_poll_ms(node.cloud),
                checkpoint_signal: CHECKPOINT_SIGNAL.into(),
            }))
        }
        Registration::UnknownToken => Err(ApiError::Unauthenticated),
        Registration::WrongNode => Err(ApiError::Forbidden(
            "node_id: this token was issued for another node".into(),
        )),
    }
}

#[utoipa::path(post, path = "/v1/agent/heartbeat", tag = "agent", request_body = Heartbeat,
    description = "Telemetry, replicas, a termination notice and command results; answered with the commands the node should carry out. A notice with a deadline moves the node to draining.",
    responses((status = 200, body = HeartbeatResponse),
        (status = 401, body = Problem, description = "Unknown or revoked credential, or its node is terminated"), (status = 403, body = Problem),
        (status = 409, body = Problem, description = "Not registered"), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn heartbeat(
    State(state): State<AppState>,
    auth: Auth,
    body: JsonBody,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let own = own_node(auth.require(&[Role::Agent])?)?;
    let hb: Heartbeat = body.parse()?;
    check_node(own, hb.node_id)?;
    let mut errs = FieldErrors::new();
    for (field, len, limit) in [
        ("gpus", hb.gpus.len(), &limits::HEARTBEAT_GPUS),
        ("replicas", hb.replicas.len(), &limits::HEARTBEAT_REPLICAS),
        ("results", hb.results.len(), &limits::HEARTBEAT_RESULTS),
    ] {
        if len as u64 > limit.max {
            errs.push_over(field, limit, format_args!("has {len} entries"));
        }
    }
    errs.into_result()?;
    let commands = state.store().agent_heartbeat(own, &hb, state.now()).await?;
    if hb.notice.is_some() {
        // The notice recorded (the node draining), the agent not yet answered.
        crate::crash_point!("drain");
    }
    Ok(Json(HeartbeatResponse { commands }))
}

#[utoipa::path(post, path = "/v1/agent/commands/{id}/result", tag = "agent", request_body = CommandResult,
    description = "The outcome of one command of this node. Reporting it again changes nothing.",
    params(("id" = String, Path, description = "Command id")),
    responses((status = 200, body = CommandRecord), (status = 404, body = Problem, description = "No such command of this node"),
        (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn command_result(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: JsonBody,
) -> Result<Json<CommandRecord>, ApiError> {
    let own = own_node(auth.require(&[Role::Agent])?)?;
    let result: CommandResult = body.parse()?;
    if result.command_id.to_string() != id {
        return Err(ApiError::field(
            "command_id",
            format!("must be the command of the path, {id}"),
        ));
    }
    let rec = state
        .store()
        .complete_agent_command(own, &result, state.now())
        .await?;
    Ok(Json(rec))
}

/// Checks a checkpoint report: a durable one carries a manifest that matches it, whose files
/// are relative paths with SHA-256 sums adding up to its total.
pub fn validate_report(r: &CheckpointReport) -> FieldErrors {
    let mut errs = FieldErrors::new();
    if r.uri.trim().is_empty() {
        errs.push("uri", "must name where the manifest is");
    }
    if r.finished_at < r.started_at {
        errs.push("finished_at", "must not be before started_at");
    }
    match (&r.manifest, r.outcome) {
        (None, CheckpointOutcome::Durable) => {
            errs.push("manifest", "a durable checkpoint needs its manifest")
        }
        (Some(_), CheckpointOutcome::MissedDeadline | CheckpointOutcome::Failed) => errs.push(
            "manifest",
            "only a durable checkpoint has a manifest; one that is not durable does not exist",
        ),
        (Some(m), CheckpointOutcome::Durable) => {
            if m.job_id != r.job_id {
                errs.push("manifest.job_id", "must be the report's job_id");
            }
            if m.replica != r.replica {
                errs.push("manifest.replica", "must be the report's replica");
            }
            if m.checkpoint_id != r.checkpoint_id {
                errs.push(
                    "manifest.checkpoint_id",
                    "must be the report's checkpoint_id",
                );
            }
            if m.files.len() > MAX_MANIFEST_FILES {
                errs.push_over(
                    "manifest.files",
                    &limits::MANIFEST_FILES,
                    format_args!("has {} files", m.files.len()),
                );
            }
            let mut total: u64 = 0;
            for (i, f) in m.files.iter().enumerate() {
                total = total.saturating_add(f.size);
                let p = &f.path;
                if p.is_empty()
                    || p.starts_with('/')
                    || p.contains('\\')
                    || p.split('/').any(|c| c.is_empty() || c == "." || c == "..")
                {
                    errs.push(
                        format!("manifest.files[{i}].path"),
                        "must be a relative path without empty, . or .. components",
                    );
                }
                if f.sha256.len() != 64
                    || !f
                        .sha256
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    errs.push(
                        format!("manifest.files[{i}].sha256"),
                        "must be 64 lowercase hex digits",
                    );
                }
            }
            if total != m.total_bytes {
                errs.push(
                    "manifest.total_bytes",
                    format!("must be the sum of the files' sizes, {total}"),
                );
            }
        }
        (None, _) => {}
    }
    errs
}

#[utoipa::path(post, path = "/v1/agent/checkpoints", tag = "agent", request_body = CheckpointReport,
    description = "A replica's checkpoint: durable (with its manifest, written last) or not (missed its deadline, failed). The latest durable checkpoint is the replica's resume point. Idempotent.",
    responses((status = 200, body = CheckpointRecord), (status = 404, body = Problem, description = "The job is not this node's"),
        (status = 409, body = Problem, description = "The checkpoint id is durable already with another manifest"), (status = 422, body = Problem, description = "Invalid, or `uri` is not this checkpoint's manifest under the job's checkpoint prefix")),
    security(("bearer" = [])))]
pub async fn report_checkpoint(
    State(state): State<AppState>,
    auth: Auth,
    body: JsonBody,
) -> Result<Json<CheckpointRecord>, ApiError> {
    let own = own_node(auth.require(&[Role::Agent])?)?;
    let report: CheckpointReport = body.parse()?;
    super::trace_ids(Some(report.job_id), None, Some(report.attempt));
    validate_report(&report).into_result()?;
    let rec = state
        .store()
        .record_checkpoint(own, &report, state.object_store_url(), state.now())
        .await?;
    // Recorded, not yet answered: the agent must report it again and be told the same.
    crate::crash_point!("checkpoint-report");
    Ok(Json(rec))
}

fn parse_node_id(id: &str) -> Result<NodeId, ApiError> {
    let node = id
        .parse()
        .map_err(|_| ApiError::NotFound(format!("no node {id}")))?;
    super::trace_ids(None, Some(node), None);
    Ok(node)
}

/// How long a bootstrap token lives.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueBootstrap {
    /// Seconds until the token expires (default one day, at most 30 days).
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

/// A node's bootstrap token, shown this once.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BootstrapToken {
    pub node_id: NodeId,
    /// Hand it to the node's agent (`--bootstrap-token-file`); it is exchanged once.
    pub token: String,
    pub expires_at: DateTime<Utc>,
}

#[utoipa::path(post, path = "/v1/nodes/{id}/bootstrap-token", tag = "agent", request_body = IssueBootstrap,
    description = "Issues the node's one-time bootstrap token, revoking an earlier one not yet used. The control plane does this when it creates a node; this is for nodes set up by hand.",
    params(("id" = String, Path, description = "Node id")),
    responses((status = 201, body = BootstrapToken), (status = 404, body = Problem), (status = 409, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn issue_bootstrap(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: JsonBody,
) -> Result<impl IntoResponse, ApiError> {
    auth.require(&[Role::Admin])?;
    let req: IssueBootstrap = body.parse()?;
    let node_id = parse_node_id(&id)?;
    let ttl = req.ttl_seconds.unwrap_or(DEFAULT_BOOTSTRAP_TTL_SECS);
    if ttl == 0 || ttl > 30 * 24 * 3600 {
        return Err(ApiError::field(
            "ttl_seconds",
            "must be between 1 and 2592000 (30 days)",
        ));
    }
    let now = state.now();
    let expires_at = now + chrono::Duration::seconds(i64::try_from(ttl).unwrap_or(i64::MAX));
    let token = state
        .store()
        .issue_agent_bootstrap(node_id, expires_at, now)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(BootstrapToken {
            node_id,
            token,
            expires_at,
        }),
    ))
}

fn validate_command(kind: &CommandKind) -> FieldErrors {
    let mut errs = FieldErrors::new();
    match kind {
        CommandKind::Start {
            command,
            checkpoint_uri,
            ..
        } => {
            if command.is_empty() {
                errs.push("command", "must not be empty");
            }
            if checkpoint_uri.trim().is_empty() {
                errs.push("checkpoint_uri", "must not be empty");
            }
        }
        CommandKind::Checkpoint { uri, .. } => {
            if uri.trim().is_empty() {
                errs.push("uri", "must not be empty");
            }
        }
        CommandKind::Stop { .. }
        | CommandKind::ApplyMigLayout { .. }
        | CommandKind::Drain { .. } => {}
    }
    errs
}

#[utoipa::path(post, path = "/v1/nodes/{id}/commands", tag = "agent", request_body = CommandKind,
    description = "Queues a command for the node's agent (e.g. `{\"type\": \"drain\"}`); it goes out with the next heartbeat.",
    params(("id" = String, Path, description = "Node id")),
    responses((status = 201, body = CommandRecord), (status = 404, body = Problem), (status = 409, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn queue_command(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: JsonBody,
) -> Result<impl IntoResponse, ApiError> {
    auth.require(&[Role::Admin])?;
    let kind: CommandKind = body.parse()?;
    let node_id = parse_node_id(&id)?;
    validate_command(&kind).into_result()?;
    let rec = state
        .store()
        .enqueue_agent_command(node_id, kind, state.now())
        .await?;
    Ok((StatusCode::CREATED, Json(rec)))
}

#[utoipa::path(get, path = "/v1/nodes/{id}/commands", tag = "agent",
    description = "The commands sent to the node's agent, newest first.",
    params(("id" = String, Path, description = "Node id"), PageParams),
    responses((status = 200, body = Page<CommandRecord>), (status = 400, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn list_commands(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    Listing { page, .. }: Listing<NoFilter, CommandId>,
) -> Result<Json<Page<CommandRecord>>, ApiError> {
    auth.require(&[Role::Admin, Role::Finance])?;
    let node_id = parse_node_id(&id)?;
    state.store().get_node(node_id).await?;
    Ok(Json(state.store().agent_commands(node_id, &page).await?))
}

#[utoipa::path(get, path = "/v1/nodes/{id}/agent", tag = "agent",
    description = "What the node's agent last reported: inventory, telemetry (DCGM field names), replicas, notice.",
    params(("id" = String, Path, description = "Node id")),
    responses((status = 200, body = AgentStatus), (status = 404, body = Problem, description = "No such node, or its agent has not registered")),
    security(("bearer" = [])))]
pub async fn agent_status(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<AgentStatus>, ApiError> {
    auth.require(&[Role::Admin, Role::Finance])?;
    let node_id = parse_node_id(&id)?;
    Ok(Json(state.store().agent_status(node_id).await?))
}

#[utoipa::path(get, path = "/v1/jobs/{id}/checkpoints", tag = "jobs",
    description = "The job's checkpoints, newest first; the latest `complete` one of a replica is its resume point.",
    params(("id" = String, Path, description = "Job id"), PageParams),
    responses((status = 200, body = Page<CheckpointRecord>), (status = 400, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn job_checkpoints(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    Listing { page, .. }: Listing<NoFilter, CheckpointId>,
) -> Result<Json<Page<CheckpointRecord>>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Team])?;
    let job_id: JobId = id
        .parse()
        .map_err(|_| ApiError::NotFound(format!("no job {id}")))?;
    let team = match p.role {
        Role::Team => p.team.as_ref().map(|(id, _)| id.as_str()),
        _ => None,
    };
    state.store().get_job(job_id, team).await?;
    Ok(Json(
        state.store().job_checkpoints_page(job_id, &page).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spotplane_core::agent::{CheckpointManifest, CheckpointTrigger, ManifestFile};
    use spotplane_core::{CheckpointId, JobId};

    fn report() -> CheckpointReport {
        let job_id = JobId::new_at(1, 1);
        let checkpoint_id = CheckpointId::new_at(2, 2);
        let at = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap_or_default();
        CheckpointReport {
            job_id,
            replica: 0,
            attempt: 1,
            checkpoint_id,
            uri: "s3://b/j/manifest.json".into(),
            trigger: CheckpointTrigger::Notice,
            outcome: CheckpointOutcome::Durable,
            manifest: Some(CheckpointManifest {
                job_id,
                replica: 0,
                checkpoint_id,
                attempt: 1,
                created_at: at,
                files: vec![ManifestFile {
                    path: "model/step.bin".into(),
                    size: 10,
                    sha256: "a".repeat(64),
                }],
                total_bytes: 10,
            }),
            message: None,
            started_at: at,
            finished_at: at,
        }
    }

    fn fields(e: FieldErrors) -> Vec<String> {
        e.into_vec().into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn a_consistent_durable_report_passes() {
        assert!(validate_report(&report()).is_empty());
    }

    #[test]
    fn reports_that_do_not_add_up_name_the_field() {
        let mut r = report();
        if let Some(m) = r.manifest.as_mut() {
            m.total_bytes = 11;
            m.files[0].path = "../etc/passwd".into();
            m.files[0].sha256 = "XYZ".into();
            m.replica = 3;
        }
        assert_eq!(
            fields(validate_report(&r)),
            [
                "manifest.replica",
                "manifest.files[0].path",
                "manifest.files[0].sha256",
                "manifest.total_bytes"
            ]
        );
        let mut r = report();
        r.manifest = None;
        assert_eq!(fields(validate_report(&r)), ["manifest"]);
        let mut r = report();
        r.outcome = CheckpointOutcome::MissedDeadline;
        assert_eq!(fields(validate_report(&r)), ["manifest"]);
    }
}
