//! The OpenAPI document, generated from the handlers' annotations.

use axum::Json;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::problem::Problem;
use super::{agent, cluster, finance, jobs, logs, overview, secrets, teams, tokens, webhooks};
use crate::model::{Gpu, Job, JobEvent, Node, Offer, Role, Team, Token};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "spotplane",
        description = "Runs GPU work on the cheapest capacity across AWS, GCP and Azure without losing work to preemptions. \
Authenticate with `Authorization: Bearer <token>`. Errors are `application/problem+json` naming the offending field.",
        license(name = "Apache-2.0")
    ),
    paths(
        teams::create_team, teams::list_teams, teams::get_team, teams::update_team,
        tokens::create_team_token, tokens::list_team_tokens, tokens::create_token, tokens::list_tokens, tokens::revoke_token,
        jobs::submit_job, jobs::list_jobs, jobs::get_job, jobs::cancel_job, jobs::job_events,
        cluster::list_nodes, cluster::list_offers, overview::overview,
        agent::register, agent::heartbeat, agent::command_result, agent::report_checkpoint,
        agent::issue_bootstrap, agent::queue_command, agent::list_commands, agent::agent_status, agent::job_checkpoints,
        finance::summary, finance::export_csv, finance::get_budget, finance::put_budget,
        webhooks::create, webhooks::list, webhooks::get, webhooks::update, webhooks::delete,
        webhooks::rotate_secret, webhooks::send_ping, webhooks::deliveries,
        secrets::put_secret, secrets::list_secrets, secrets::delete_secret, secrets::agent_job_secrets,
        logs::job_logs, logs::post_logs,
    ),
    components(schemas(Problem, Team, Token, Role, Job, JobEvent, Node, Gpu, Offer,
        overview::Overview, overview::EventLine, crate::store::PlacedReplica, crate::store::JobLine,
        crate::finance::held::HeldSpend, crate::recovery::ResumePoint,
        crate::finance::summary::Summary, crate::finance::summary::SummaryRow,
        crate::finance::summary::Figures, crate::finance::summary::GroupBy, finance::Budget,
        crate::model::Subscription, crate::model::Delivery, webhooks::CreateWebhook,
        webhooks::UpdateWebhook, webhooks::RotateSecret, webhooks::WebhookWithSecret,
        webhooks::PingResult,
        crate::model::Secret, secrets::PutSecret)),
    modifiers(&BearerAuth),
    tags(
        (name = "teams", description = "Teams, their fair-share weights and quotas"),
        (name = "tokens", description = "API tokens"),
        (name = "jobs", description = "Submitting and following GPU jobs"),
        (name = "cluster", description = "Nodes and the capacity on offer"),
        (name = "agent", description = "The node agents' protocol (node credentials act for their own node only) and its operators' side"),
        (name = "webhooks", description = "Endpoints that receive job, node and budget events, signed per Standard Webhooks"),
        (name = "finance", description = "The cost ledger: summaries, CSV and FOCUS exports, budgets"),
        (name = "secrets", description = "Team secrets: set and listed by name, stored encrypted, never returned; jobs refer to them by name"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
