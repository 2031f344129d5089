//! The OpenAPI document says what the server does: the drifts schemathesis found once
//! (scripts/test-schemathesis runs it against a live server), guarded here without Python.

use serde_json::Value;
use spotplane::api::ApiDoc;
use spotplane::model::Job;
use spotplane_core::job::JobSpec;
use spotplane_core::shape::GpuShape;
use spotplane_core::{JobId, JobState, TeamName};
use utoipa::OpenApi;

const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];

fn doc() -> Value {
    serde_json::to_value(ApiDoc::openapi()).expect("the document serializes")
}

/// Every operation: (method, path, operation object).
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if let Some(op) = item.get(m) {
                out.push((m.to_owned(), path.clone(), op.clone()));
            }
        }
    }
    out
}

#[test]
fn every_error_response_is_a_problem_document() {
    let doc = doc();
    for (m, path, op) in operations(&doc) {
        for (status, response) in op["responses"].as_object().expect("responses") {
            if !(status.starts_with('4') || status.starts_with('5')) {
                continue;
            }
            let content = response["content"].as_object();
            let types: Vec<&String> = content.map(|c| c.keys().collect()).unwrap_or_default();
            assert_eq!(
                types,
                ["application/problem+json"],
                "{m} {path} {status}: content types"
            );
            assert_eq!(
                response["content"]["application/problem+json"]["schema"]["$ref"],
                "#/components/schemas/Problem",
                "{m} {path} {status}"
            );
        }
    }
}

#[test]
fn every_operation_with_a_token_documents_401_and_403_and_every_body_400_413_415_422() {
    let doc = doc();
    for (m, path, op) in operations(&doc) {
        let responses = op["responses"].as_object().expect("responses");
        let secured = op["security"].as_array().is_some_and(|s| !s.is_empty());
        assert!(secured, "{m} {path} names its security");
        for status in ["401", "403", "500"] {
            assert!(
                responses.contains_key(status),
                "{m} {path} documents {status}"
            );
        }
        assert!(
            responses["401"]["headers"]["WWW-Authenticate"].is_object(),
            "{m} {path}: 401 names WWW-Authenticate"
        );
        if op.get("requestBody").is_some() {
            for status in ["400", "413", "415", "422"] {
                assert!(
                    responses.contains_key(status),
                    "{m} {path} documents {status}"
                );
            }
        }
        let has_query = op["parameters"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["in"] == "query"));
        if has_query {
            assert!(responses.contains_key("400"), "{m} {path} documents 400");
        }
    }
}

/// The schema `schema` names with `$ref`, or itself.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"]
        .as_str()
        .and_then(|r| r.strip_prefix("#/components/schemas/"))
    {
        Some(name) => &doc["components"]["schemas"][name],
        None => schema,
    }
}

/// A job as the API answers it, with the fields that are sometimes left out set.
fn job() -> Job {
    let now = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
        .expect("time")
        .with_timezone(&chrono::Utc);
    let mut spec = JobSpec::new(
        "train",
        GpuShape::Whole {
            gpus: 1,
            models: Vec::new(),
        },
        vec!["python".into(), "train.py".into()],
    );
    let team: TeamName = "research".parse().expect("team name");
    spec.team = Some(team.clone());
    Job {
        id: JobId::new_at(1_767_322_000_000, 7),
        team,
        state: JobState::Queued,
        state_reason: None,
        attempt: 0,
        resume_from: Default::default(),
        lost_gpu_seconds: 0,
        failures: 0,
        not_before: Some(now),
        utilization: Some(spotplane::model::JobUtilization {
            sm_pct_mean: 71.5,
            memory_used_mib_mean: 30_000.0,
            memory_used_mib_max: 40_000,
            samples: 42,
        }),
        created_at: now,
        updated_at: now,
        finished_at: None,
        spec,
    }
}

#[test]
fn the_job_read_model_is_its_own_closed_schema_with_every_field_the_server_sends() {
    let doc = doc();
    let schema = &doc["components"]["schemas"]["Job"];
    assert_eq!(
        schema["type"], "object",
        "one object, not an allOf: {schema}"
    );
    assert_eq!(schema["additionalProperties"], false);
    let properties = schema["properties"].as_object().expect("properties");
    let required: Vec<&str> = schema["required"]
        .as_array()
        .expect("required")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let sent = serde_json::to_value(job()).expect("job serializes");
    let sent = sent.as_object().expect("an object");
    for key in sent.keys() {
        assert!(properties.contains_key(key), "Job documents {key}");
    }
    for key in &required {
        assert!(sent.contains_key(*key), "a job always carries {key}");
    }
    for key in [
        "id",
        "state",
        "attempt",
        "created_at",
        "team",
        "name",
        "shape",
        "command",
    ] {
        assert!(required.contains(&key), "{key} is required in {required:?}");
    }
    assert_eq!(resolve(&doc, &properties["id"])["format"], "uuid");
    assert_eq!(
        resolve(&doc, &properties["created_at"])["format"],
        "date-time"
    );
    // The submit schema stays the request's: closed, without the read model's fields.
    let spec = &doc["components"]["schemas"]["JobSpec"];
    assert_eq!(spec["additionalProperties"], false);
    assert!(spec["properties"].get("state").is_none());
    // Lists of jobs hold the read model too.
    let page = &doc["components"]["schemas"]["Page_Job"]["properties"]["items"]["items"];
    assert_eq!(page["$ref"], "#/components/schemas/Job", "{page}");
    // Job answers point at the read model.
    let ok =
        &doc["paths"]["/v1/jobs/{id}"]["get"]["responses"]["200"]["content"]["application/json"];
    assert_eq!(ok["schema"]["$ref"], "#/components/schemas/Job");
}

#[test]
fn a_shape_is_exactly_one_of_gpus_mig_or_gpu_milli() {
    let doc = doc();
    let shape = &doc["components"]["schemas"]["GpuShape"];
    let forms = shape["oneOf"].as_array().expect("oneOf");
    let fields: Vec<&str> = forms
        .iter()
        .map(|f| {
            assert_eq!(f["additionalProperties"], false, "{f}");
            f["required"][0].as_str().expect("one required field")
        })
        .collect();
    assert_eq!(fields, ["gpus", "mig", "gpu_milli"]);
    assert_eq!(forms[2]["properties"]["gpu_milli"]["minimum"], 1);
    assert_eq!(forms[2]["properties"]["gpu_milli"]["maximum"], 1000);
}

#[test]
fn finance_ranges_are_documented_as_date_times() {
    let doc = doc();
    for path in ["/v1/finance/summary", "/v1/finance/export.csv"] {
        let params = doc["paths"][path]["get"]["parameters"]
            .as_array()
            .expect("parameters");
        for name in ["from", "to"] {
            let p = params
                .iter()
                .find(|p| p["name"] == name)
                .unwrap_or_else(|| panic!("{path} has {name}"));
            assert_eq!(p["schema"]["format"], "date-time", "{path} {name}");
        }
    }
}
