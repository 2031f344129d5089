//! The OpenAPI document, generated from the handlers' annotations.

use axum::Json;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayItems, ObjectBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder, content::Content};

use super::problem::{PROBLEM_JSON, Problem};
use super::{agent, cluster, finance, jobs, logs, overview, secrets, teams, tokens, webhooks};
use crate::model::{Gpu, Job, JobEvent, JobUtilization, Node, Offer, Role, Team, Token};

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
    components(schemas(Problem, Team, Token, Role, Job, JobEvent, JobUtilization, Node, Gpu, Offer,
        overview::Overview, overview::EventLine, crate::store::PlacedReplica, crate::store::JobLine,
        crate::finance::held::HeldSpend, crate::recovery::ResumePoint,
        crate::finance::summary::Summary, crate::finance::summary::SummaryRow,
        crate::finance::summary::Figures, crate::finance::summary::GroupBy, finance::Budget,
        crate::model::Subscription, crate::model::Delivery, webhooks::CreateWebhook,
        webhooks::UpdateWebhook, webhooks::RotateSecret, webhooks::WebhookWithSecret,
        webhooks::PingResult,
        crate::model::Secret, secrets::PutSecret)),
    modifiers(&BearerAuth, &FlattenedReadModels, &ProblemResponses),
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

/// Serde's `#[serde(flatten)]` comes out of utoipa as `allOf: [$ref Inner, {own fields}]`. When
/// the inner schema is closed (`additionalProperties: false`, as a request type with
/// `deny_unknown_fields` is), no instance can satisfy both: every field of the outer type is
/// "unexpected" to the inner one. So the `Job` read model is written out as one object here: the
/// submitted spec's properties and the job's own, closed, with the fields the server always
/// sends listed as required ([`always_sent`]).
struct FlattenedReadModels;

impl Modify for FlattenedReadModels {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let Some(components) = openapi.components.as_mut() else {
            return;
        };
        let merged: Vec<(String, Schema)> = components
            .schemas
            .iter()
            .filter_map(|(name, schema)| match schema {
                RefOr::T(Schema::AllOf(all)) => {
                    merge_all_of(all, &components.schemas).map(|s| (name.clone(), s))
                }
                _ => None,
            })
            .collect();
        // Generic types (`Page<Job>`) carry the read model inline, as the same `allOf`: those
        // copies become references to the merged component.
        for (name, merged_schema) in &merged {
            let target = RefOr::Ref(Ref::from_schema_name(name.as_str()));
            let snapshot = components.schemas.clone();
            for schema in components.schemas.values_mut() {
                replace_inline_all_of(schema, merged_schema, &target, &snapshot, true);
            }
        }
        for (name, mut schema) in merged {
            if let (Schema::Object(object), Some(sent)) = (&mut schema, always_sent(&name)) {
                for &field in sent {
                    if object.properties.contains_key(field)
                        && !object.required.iter().any(|r| r == field)
                    {
                        object.required.push(field.to_owned());
                    }
                }
            }
            components.schemas.insert(name, RefOr::T(schema));
        }
    }
}

/// One object made of an `allOf` whose items are objects (inline or named components), or
/// `None` when an item is anything else. The result is closed when any part was.
fn merge_all_of(
    all: &utoipa::openapi::schema::AllOf,
    schemas: &std::collections::BTreeMap<String, RefOr<Schema>>,
) -> Option<Schema> {
    let mut out = ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::Object))
        .description(all.description.clone())
        .build();
    let mut closed = false;
    for item in &all.items {
        let part = match item {
            RefOr::T(Schema::Object(o)) => o,
            RefOr::Ref(r) => {
                let name = r.ref_location.strip_prefix("#/components/schemas/")?;
                match schemas.get(name)? {
                    RefOr::T(Schema::Object(o)) => o,
                    _ => return None,
                }
            }
            _ => return None,
        };
        for (k, v) in &part.properties {
            out.properties.insert(k.clone(), v.clone());
        }
        for r in &part.required {
            if !out.required.contains(r) {
                out.required.push(r.clone());
            }
        }
        closed |= matches!(
            part.additional_properties.as_deref(),
            Some(AdditionalProperties::FreeForm(false))
        );
        if out.description.is_none() {
            out.description.clone_from(&part.description);
        }
    }
    if closed {
        out.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
    }
    Some(Schema::Object(out))
}

/// Replaces, below `schema` (not `schema` itself when `top`), every inline `allOf` that merges
/// into `merged` with `target`.
fn replace_inline_all_of(
    schema: &mut RefOr<Schema>,
    merged: &Schema,
    target: &RefOr<Schema>,
    schemas: &std::collections::BTreeMap<String, RefOr<Schema>>,
    top: bool,
) {
    let RefOr::T(inner) = schema else {
        return;
    };
    if let Schema::AllOf(all) = inner
        && !top
        && merge_all_of(all, schemas).as_ref() == Some(merged)
    {
        *schema = target.clone();
        return;
    }
    let mut walk = |s: &mut RefOr<Schema>| replace_inline_all_of(s, merged, target, schemas, false);
    match inner {
        Schema::Object(o) => {
            o.properties.values_mut().for_each(&mut walk);
            if let Some(AdditionalProperties::RefOr(s)) = o.additional_properties.as_deref_mut() {
                walk(s);
            }
        }
        Schema::Array(a) => {
            if let ArrayItems::RefOrSchema(s) = &mut a.items {
                walk(s);
            }
        }
        Schema::OneOf(o) => o.items.iter_mut().for_each(&mut walk),
        Schema::AllOf(o) => o.items.iter_mut().for_each(&mut walk),
        Schema::AnyOf(o) => o.items.iter_mut().for_each(&mut walk),
        _ => {}
    }
}

/// Fields a read model always carries although its request form may leave them out: those
/// with a server-side default (`team` is filled from the token). Checked against what
/// serializing a job gives in this module's tests.
fn always_sent(schema: &str) -> Option<&'static [&'static str]> {
    match schema {
        "Job" => Some(&[
            "team",
            "priority",
            "replicas",
            "cpu_milli",
            "memory_mib",
            "spot",
            "lost_gpu_seconds",
            "failures",
        ]),
        _ => None,
    }
}

/// Makes every operation's error answers say what the server sends: each error response is
/// `application/problem+json` with the [`Problem`] schema, and the errors every operation of a
/// kind can give are listed on each (a bearer-token operation can answer 401 and 403, one with
/// a JSON body 400, 413, 415 and 422, one with query parameters 400 and 422, any 500), so the
/// annotations on the handlers need only name their own (404, 409, ...).
struct ProblemResponses;

impl Modify for ProblemResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                document_problems(op);
            }
        }
    }
}

/// The error statuses `op` can answer whatever its handler does, from its shape.
fn implied_problems(op: &Operation) -> Vec<u16> {
    let mut statuses = vec![500];
    if op.security.as_ref().is_some_and(|s| !s.is_empty()) {
        statuses.extend([401, 403]);
    }
    if op.request_body.is_some() {
        statuses.extend([400, 413, 415, 422]);
    }
    let has_query = op
        .parameters
        .iter()
        .flatten()
        .any(|p| matches!(p, RefOr::T(p) if matches!(p.parameter_in, ParameterIn::Query)));
    if has_query {
        statuses.extend([400, 422]);
    }
    statuses
}

fn problem_description(status: u16) -> &'static str {
    match status {
        400 => {
            "Malformed request: unreadable JSON, or a query parameter that is unknown, repeated or not of its type; `field` names it"
        }
        401 => "Missing, unknown, expired or revoked bearer token",
        403 => "This token's role may not do this",
        413 => "The request body is larger than the server accepts",
        415 => "The body is not JSON (`Content-Type: application/json`)",
        422 => "The request breaks a rule; `errors` lists each offending field",
        500 => "Internal error: logged, with no details in the answer",
        _ => "Error",
    }
}

fn problem_content() -> Content {
    ContentBuilder::new()
        .schema(Some(RefOr::Ref(Ref::from_schema_name("Problem"))))
        .build()
}

fn document_problems(op: &mut Operation) {
    let responses = &mut op.responses.responses;
    // Error responses written on the handlers as `body = Problem` come out as application/json.
    for (status, response) in responses.iter_mut() {
        let is_error = status.starts_with('4') || status.starts_with('5');
        if let (true, RefOr::T(response)) = (is_error, response)
            && let Some(content) = response.content.shift_remove("application/json")
        {
            response.content.insert(PROBLEM_JSON.to_owned(), content);
        }
    }
    for status in implied_problems(op) {
        let key = status.to_string();
        if op.responses.responses.contains_key(&key) {
            continue;
        }
        let response = ResponseBuilder::new()
            .description(problem_description(status))
            .content(PROBLEM_JSON, problem_content());
        op.responses
            .responses
            .insert(key, RefOr::T(response.build()));
    }
    // Every 401 carries the challenge (problem.rs).
    if let Some(RefOr::T(unauthorized)) = op.responses.responses.get_mut("401") {
        unauthorized
            .headers
            .entry("WWW-Authenticate".to_owned())
            .or_insert_with(|| {
                RefOr::T(
                    HeaderBuilder::new()
                        .schema(Some(
                            ObjectBuilder::new().schema_type(SchemaType::new(Type::String)),
                        ))
                        .description(Some("`Bearer realm=\"spotplane\"`"))
                        .build(),
                )
            });
    }
}

pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
