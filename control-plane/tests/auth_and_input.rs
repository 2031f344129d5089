//! Who may call what (every role × every endpoint), and what bad input gets back.

mod common;

use common::{ADMIN_TOKEN, Backend, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use spotplane::model::Role;
use spotplane::scheduler::{Assigned, Placement};
use spotplane::store::{NewNode, NewToken};
use spotplane_core::{JobId, NodeId};

on_both_databases!(
    every_documented_operation_answers_each_caller_as_its_entry_says,
    routes_outside_the_openapi_document_keep_their_rules,
    bad_input_gets_a_problem_naming_the_field,
);

// ---------------------------------------------------------------------------------------------
// The authorization matrix.
//
// The operations come from the OpenAPI document (`ApiDoc::openapi()`), so a route added there
// cannot go untested: each needs an entry in `ENTRIES` (which roles may call it, what its path
// names, the body an allowed caller sends), and an entry without an operation fails too.
// For every operation the test sends:
// - no token, malformed tokens (garbage, another prefix, too long, another scheme, a bootstrap
//   token never issued), a revoked and an expired admin token: 401;
// - each role the entry does not list, with the owner's own credentials: 403;
// - team B's token and node X's credential on team A's and node Y's objects: 404 where B's role
//   may call the route (403 or 404 for X's), and in every case the same answer as on objects
//   that do not exist, so nothing tells B or X that A's or Y's objects are there;
// - each role the entry lists: an answer that is neither 401, 403 nor 404 (the fixtures are
//   real, so the refusals above are about the caller).
// Every refusal is problem+json, and no answer to an outsider carries one of A's or Y's
// identifiers that the outsider did not send itself.
// ---------------------------------------------------------------------------------------------

const ADMIN: Role = Role::Admin;
const TEAM: Role = Role::Team;
const FINANCE: Role = Role::Finance;
const AGENT: Role = Role::Agent;

/// What an operation's path (or body) names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// Nothing of one team or node (lists, creation).
    Nobody,
    /// An object of team A: its team, job, webhook, secret or token.
    Team,
    /// Node Y or an object of node Y's (its command, a job placed on it).
    Node,
}

/// The identifiers of one operation's objects: team A's and node Y's, or (a ghost) the same
/// kinds of identifiers that name nothing.
#[derive(Debug, Clone)]
struct Objects {
    team: String,
    job: String,
    webhook: String,
    secret: String,
    token: String,
    node: String,
    command: String,
    /// A fresh number, for names that must not repeat.
    n: u64,
}

impl Objects {
    /// The pairs (ghost, real) of identifiers, to read a ghost's answer as the real one's.
    fn pairs<'a>(&'a self, real: &'a Objects) -> [(&'a str, &'a str); 7] {
        [
            (&self.team, &real.team),
            (&self.job, &real.job),
            (&self.webhook, &real.webhook),
            (&self.secret, &real.secret),
            (&self.token, &real.token),
            (&self.node, &real.node),
            (&self.command, &real.command),
        ]
    }
}

struct Entry {
    /// `METHOD /path`, as the OpenAPI document has it.
    op: &'static str,
    /// The roles that may call it.
    may: &'static [Role],
    owner: Owner,
    /// The body an allowed caller sends (every caller sends the same).
    body: fn(&Objects) -> Option<Value>,
}

fn none(_: &Objects) -> Option<Value> {
    None
}

/// A checkpoint report of replica 0, attempt 1 of `o.job`, under the job's checkpoint prefix.
fn checkpoint_report(o: &Objects) -> Option<Value> {
    let at = chrono::Utc::now();
    let c = format!("00000000-0000-7000-8000-{:012}", o.n);
    let sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    Some(
        json!({"job_id": o.job, "replica": 0, "attempt": 1, "checkpoint_id": c,
        "uri": format!("s3://ckpt/{}/replica-0/{c}/manifest.json", o.team),
        "trigger": "notice", "outcome": "durable", "started_at": at, "finished_at": at,
        "manifest": {"job_id": o.job, "replica": 0, "checkpoint_id": c, "attempt": 1,
            "created_at": at, "total_bytes": 15,
            "files": [{"path": "state/step.json", "size": 15, "sha256": sha}]}}),
    )
}

fn register_body(o: &Objects) -> Value {
    json!({"protocol_version": 1, "node_id": o.node, "agent_version": "0.1.0",
        "hostname": "ip-10-0-0-1", "cpu_milli": 192000, "memory_mib": 2097152, "gpus": []})
}

/// One entry per operation of the OpenAPI document. A new operation needs one here.
const ENTRIES: &[Entry] = &[
    Entry {
        op: "POST /v1/teams",
        may: &[ADMIN],
        owner: Owner::Nobody,
        body: |o| Some(json!({"name": format!("made-{}", o.n)})),
    },
    Entry {
        op: "GET /v1/teams",
        may: &[ADMIN, FINANCE],
        owner: Owner::Nobody,
        body: none,
    },
    Entry {
        op: "GET /v1/teams/{team}",
        may: &[ADMIN, FINANCE, TEAM],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "PATCH /v1/teams/{team}",
        may: &[ADMIN],
        owner: Owner::Team,
        body: |_| Some(json!({"weight": 2})),
    },
    Entry {
        op: "POST /v1/teams/{team}/tokens",
        may: &[ADMIN],
        owner: Owner::Team,
        body: |o| Some(json!({"name": format!("made-{}", o.n)})),
    },
    Entry {
        op: "GET /v1/teams/{team}/tokens",
        may: &[ADMIN],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "POST /v1/tokens",
        may: &[ADMIN],
        owner: Owner::Nobody,
        body: |_| Some(json!({"name": "made", "role": "finance"})),
    },
    Entry {
        op: "GET /v1/tokens",
        may: &[ADMIN],
        owner: Owner::Nobody,
        body: none,
    },
    Entry {
        op: "DELETE /v1/tokens/{id}",
        may: &[ADMIN],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "POST /v1/jobs",
        may: &[ADMIN, TEAM],
        owner: Owner::Nobody,
        body: |o| {
            Some(json!({"name": "made", "team": o.team, "shape": {"gpus": 1}, "command": ["x"]}))
        },
    },
    Entry {
        op: "GET /v1/jobs",
        may: &[ADMIN, TEAM],
        owner: Owner::Nobody,
        body: none,
    },
    Entry {
        op: "GET /v1/jobs/{id}",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "POST /v1/jobs/{id}/cancel",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "GET /v1/jobs/{id}/events",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "GET /v1/jobs/{id}/checkpoints",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "GET /v1/jobs/{id}/logs",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "GET /v1/nodes",
        may: &[ADMIN, FINANCE],
        owner: Owner::Nobody,
        body: none,
    },
    Entry {
        op: "GET /v1/offers",
        may: &[ADMIN, FINANCE],
        owner: Owner::Nobody,
        body: none,
    },
    Entry {
        op: "GET /v1/overview",
        may: &[ADMIN, FINANCE],
        owner: Owner::Nobody,
        body: none,
    },
    Entry {
        op: "POST /v1/nodes/{id}/bootstrap-token",
        may: &[ADMIN],
        owner: Owner::Node,
        body: |_| Some(json!({})),
    },
    Entry {
        op: "POST /v1/nodes/{id}/commands",
        may: &[ADMIN],
        owner: Owner::Node,
        body: |_| Some(json!({"type": "drain"})),
    },
    Entry {
        op: "GET /v1/nodes/{id}/commands",
        may: &[ADMIN, FINANCE],
        owner: Owner::Node,
        body: none,
    },
    Entry {
        op: "GET /v1/nodes/{id}/agent",
        may: &[ADMIN, FINANCE],
        owner: Owner::Node,
        body: none,
    },
    Entry {
        op: "POST /v1/agent/register",
        may: &[AGENT],
        owner: Owner::Node,
        body: |o| Some(register_body(o)),
    },
    Entry {
        op: "POST /v1/agent/heartbeat",
        may: &[AGENT],
        owner: Owner::Node,
        body: |o| Some(json!({"node_id": o.node, "sent_at": chrono::Utc::now()})),
    },
    Entry {
        op: "POST /v1/agent/commands/{id}/result",
        may: &[AGENT],
        owner: Owner::Node,
        body: |o| Some(json!({"command_id": o.command, "ok": true})),
    },
    Entry {
        op: "POST /v1/agent/checkpoints",
        may: &[AGENT],
        owner: Owner::Node,
        body: checkpoint_report,
    },
    Entry {
        op: "GET /v1/agent/jobs/{job_id}/secrets",
        may: &[AGENT],
        owner: Owner::Node,
        body: none,
    },
    Entry {
        op: "POST /v1/agent/logs",
        may: &[AGENT],
        owner: Owner::Node,
        body: |o| {
            Some(
                json!({"chunks": [{"job_id": o.job, "replica": 0, "attempt": 1,
                "offset": 0, "data": "eA=="}]}),
            )
        },
    },
    Entry {
        op: "POST /v1/webhooks",
        may: &[ADMIN, TEAM],
        owner: Owner::Nobody,
        body: |o| {
            Some(json!({"url": format!("http://127.0.0.1:9/{}-made", o.team),
                "event_types": ["job.queued"], "team": o.team}))
        },
    },
    Entry {
        op: "GET /v1/webhooks",
        may: &[ADMIN, TEAM],
        owner: Owner::Nobody,
        body: none,
    },
    Entry {
        op: "GET /v1/webhooks/{id}",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "PATCH /v1/webhooks/{id}",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: |_| Some(json!({"description": "changed"})),
    },
    Entry {
        op: "DELETE /v1/webhooks/{id}",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "POST /v1/webhooks/{id}/rotate-secret",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: |_| Some(json!({"overlap_s": 0})),
    },
    Entry {
        op: "POST /v1/webhooks/{id}/ping",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "GET /v1/webhooks/{id}/deliveries",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "GET /v1/finance/summary",
        may: &[ADMIN, FINANCE, TEAM],
        owner: Owner::Nobody,
        body: none,
    },
    Entry {
        op: "GET /v1/finance/export.csv",
        may: &[ADMIN, FINANCE, TEAM],
        owner: Owner::Nobody,
        body: none,
    },
    Entry {
        op: "GET /v1/teams/{team}/budget",
        may: &[ADMIN, FINANCE, TEAM],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "PUT /v1/teams/{team}/budget",
        may: &[ADMIN],
        owner: Owner::Team,
        body: |_| Some(json!({"monthly_usd": 100.0})),
    },
    Entry {
        op: "POST /v1/teams/{team}/secrets",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: |o| Some(json!({"name": format!("made-{}", o.n), "value": "v"})),
    },
    Entry {
        op: "GET /v1/teams/{team}/secrets",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: none,
    },
    Entry {
        op: "DELETE /v1/teams/{team}/secrets/{name}",
        may: &[ADMIN, TEAM],
        owner: Owner::Team,
        body: none,
    },
];

/// Every `METHOD /path` of the OpenAPI document, read from its JSON form (so the test does not
/// depend on how utoipa models a path item).
fn documented_operations() -> Vec<String> {
    use utoipa::OpenApi;
    let doc = serde_json::to_value(spotplane::api::ApiDoc::openapi()).expect("document as JSON");
    let paths = doc["paths"].as_object().expect("the document has paths");
    let mut ops = Vec::new();
    for (path, item) in paths {
        for method in [
            "get", "put", "post", "delete", "options", "head", "patch", "trace",
        ] {
            if item.get(method).is_some() {
                ops.push(format!("{} {path}", method.to_ascii_uppercase()));
            }
        }
    }
    ops
}

#[test]
fn every_documented_operation_has_exactly_one_matrix_entry_and_every_entry_an_operation() {
    let documented = documented_operations();
    let missing: Vec<&String> = documented
        .iter()
        .filter(|op| !ENTRIES.iter().any(|e| e.op == op.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "these operations of the OpenAPI document have no entry in ENTRIES of \
         control-plane/tests/auth_and_input.rs; add one saying which roles may call each and \
         what its path names: {missing:?}"
    );
    let stale: Vec<&str> = ENTRIES
        .iter()
        .map(|e| e.op)
        .filter(|op| !documented.iter().any(|d| d == op))
        .collect();
    assert!(
        stale.is_empty(),
        "these entries of ENTRIES name no operation of the OpenAPI document; remove or fix them: {stale:?}"
    );
    for (i, e) in ENTRIES.iter().enumerate() {
        assert!(
            !ENTRIES[..i].iter().any(|o| o.op == e.op),
            "{} has two entries",
            e.op
        );
        assert!(!e.may.is_empty(), "{}: no role may call it?", e.op);
    }
}

/// The path of `template` with its parameters naming `o`'s objects.
fn fill(template: &str, o: &Objects) -> String {
    let mut out = String::new();
    let mut previous = "";
    for segment in template.split('/').skip(1) {
        out.push('/');
        let value = match (previous, segment) {
            (_, "{team}") => &o.team,
            (_, "{name}") => &o.secret,
            (_, "{job_id}") | ("jobs", "{id}") => &o.job,
            ("webhooks", "{id}") => &o.webhook,
            ("tokens", "{id}") => &o.token,
            ("nodes", "{id}") => &o.node,
            ("commands", "{id}") => &o.command,
            (_, p) if p.starts_with('{') => panic!(
                "{template}: add the object that {p} after {previous}/ names to fill() in \
                 control-plane/tests/auth_and_input.rs"
            ),
            (_, literal) => literal,
        };
        out.push_str(value);
        previous = segment;
    }
    out
}

/// How a request authenticates.
#[derive(Debug, Clone, Copy)]
enum Cred<'a> {
    Nothing,
    Bearer(&'a str),
    /// A whole `Authorization` header.
    Header(&'a str),
}

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    content_type: String,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    /// A refusal is problem+json whose `status` is the answer's.
    fn assert_problem(&self, what: &str) {
        assert_eq!(
            self.content_type, "application/problem+json",
            "{what}: {} {}",
            self.status, self.text
        );
        let v = self.json();
        assert_eq!(
            v["status"].as_u64(),
            Some(u64::from(self.status.as_u16())),
            "{what}: {}",
            self.text
        );
        assert!(
            v["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("urn:spotplane:problem:")),
            "{what}: {}",
            self.text
        );
    }
}

async fn send(
    srv: &TestServer,
    method: &Method,
    path: &str,
    cred: Cred<'_>,
    body: Option<&Value>,
) -> Answer {
    let mut req = srv
        .http
        .request(method.clone(), format!("{}{}", srv.url, path));
    match cred {
        Cred::Nothing => {}
        Cred::Bearer(t) => req = req.bearer_auth(t),
        Cred::Header(h) => req = req.header("authorization", h),
    }
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|c| c.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = resp.text().await.expect("body read");
    Answer {
        status,
        content_type,
        text,
    }
}

/// The callers: each role's own (team A's token, node Y's credential), and the outsiders.
struct Callers {
    admin: String,
    team_a: String,
    team_b: String,
    finance: String,
    agent_y: String,
    agent_x: String,
    /// Tokens that must get 401 everywhere: (what it is, how it is sent).
    bad: Vec<(&'static str, String, bool)>,
    node_y: String,
    /// Identifiers of team A and node Y that every operation's objects share.
    fixed_secrets: Vec<String>,
}

impl Callers {
    fn own(&self, role: Role) -> &str {
        match role {
            Role::Admin => &self.admin,
            Role::Team => &self.team_a,
            Role::Finance => &self.finance,
            Role::Agent => &self.agent_y,
        }
    }
}

fn node(name: &str) -> NewNode {
    common::stored_node(
        name,
        "p5.48xlarge",
        "35.5",
        (192_000, 2_097_152),
        common::h100(false),
    )
}

async fn callers(srv: &TestServer) -> Callers {
    let team_a = srv.team_with_token("alpha").await;
    let team_b = srv.team_with_token("beta").await;
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/tokens",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "fin", "role": "finance"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let finance = v["token"].as_str().expect("finance token").to_owned();
    let body = json!({"protocol_version": 1, "agent_version": "0.1.0",
        "hostname": "ip-10-0-0-1", "cpu_milli": 192000, "memory_mib": 2097152, "gpus": []});
    let (node_y, agent_y) = common::register_agent(srv, node("yonder-node"), body.clone()).await;
    let (_, agent_x) = common::register_agent(srv, node("xenial-node"), body).await;

    // An admin token, revoked; another that expired a minute ago.
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/tokens",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "revoked", "role": "admin"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let revoked = v["token"].as_str().expect("token").to_owned();
    let (s, v) = srv
        .call(
            Method::DELETE,
            &format!("/v1/tokens/{}", v["id"].as_str().expect("id")),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let now = chrono::Utc::now();
    let (_, expired) = srv
        .store()
        .create_token(
            NewToken {
                name: "expired".into(),
                role: Role::Admin,
                team: None,
                node_id: None,
                expires_at: Some(now - chrono::Duration::minutes(1)),
            },
            now - chrono::Duration::hours(1),
        )
        .await
        .expect("expired token");
    let other_prefix = format!("xyz_{}", ADMIN_TOKEN.trim_start_matches("spt_"));
    let bad = vec![
        ("no token", String::new(), false),
        ("garbage", "not a token at all".to_owned(), false),
        ("another prefix", other_prefix, false),
        ("a forged token", "spt_forged".to_owned(), false),
        ("too long a token", "x".repeat(600), false),
        (
            "a bootstrap token never issued",
            "spb_never_issued_000000000000000000000000000".to_owned(),
            false,
        ),
        ("a revoked admin token", revoked, false),
        ("an expired admin token", expired, false),
        ("another scheme", format!("Basic {ADMIN_TOKEN}"), true),
        ("a bearer without a token", "Bearer ".to_owned(), true),
    ];
    let fixed_secrets = vec![
        "alpha".to_owned(),
        node_y.to_string(),
        "yonder-node".to_owned(),
    ];
    Callers {
        admin: ADMIN_TOKEN.to_owned(),
        team_a,
        team_b,
        finance,
        agent_y,
        agent_x,
        bad,
        node_y: node_y.to_string(),
        fixed_secrets,
    }
}

/// Fresh objects of team A and node Y: a job placed on node Y, a webhook, a secret, a token
/// and a command of node Y's.
async fn real_objects(srv: &TestServer, c: &Callers, n: u64) -> Objects {
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": format!("alpha-train-{n}"), "team": "alpha",
                "shape": {"gpus": 1}, "command": ["x"], "checkpoint": {"uri": "s3://ckpt/alpha"}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let job: JobId = v["id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    let node_y: NodeId = c.node_y.parse().expect("node id");
    srv.store()
        .admit_job(
            job,
            &[Placement {
                replica: 0,
                node: node_y,
                assigned: Assigned::Whole(vec![0]),
            }],
            chrono::Utc::now(),
        )
        .await
        .expect("admitted");
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/webhooks",
            Some(ADMIN_TOKEN),
            Some(&json!({"url": format!("http://127.0.0.1:9/alpha-hook-{n}"),
                "event_types": ["job.queued"], "team": "alpha"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let webhook = v["id"].as_str().expect("webhook id").to_owned();
    let secret = format!("alpha-secret-{n}");
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/teams/alpha/secrets",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": secret, "value": "v"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = srv
        .call(
            Method::POST,
            "/v1/teams/alpha/tokens",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": format!("alpha-token-{n}")})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let token = v["id"].as_str().expect("token id").to_owned();
    let (s, v) = srv
        .call(
            Method::POST,
            &format!("/v1/nodes/{node_y}/commands"),
            Some(ADMIN_TOKEN),
            Some(&json!({"type": "drain"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let command = v["command"]["id"].as_str().expect("command id").to_owned();
    Objects {
        team: "alpha".into(),
        job: job.to_string(),
        webhook,
        secret,
        token,
        node: c.node_y.clone(),
        command,
        n,
    }
}

/// Identifiers of the same kinds that name nothing.
fn ghost_objects(n: u64) -> Objects {
    let id = || uuid::Uuid::now_v7().to_string();
    Objects {
        team: format!("ghost-{n}"),
        job: JobId(uuid::Uuid::now_v7()).to_string(),
        webhook: id(),
        secret: format!("ghost-secret-{n}"),
        token: id(),
        node: NodeId(uuid::Uuid::now_v7()).to_string(),
        command: id(),
        n,
    }
}

/// An outsider's answer about `real` objects must be the answer about objects that do not
/// exist (`ghost`), read with the ghost's identifiers put back; and it must carry none of
/// `secrets` that the request did not carry itself.
fn assert_reveals_nothing(
    what: &str,
    (real_req, real): (&str, &Answer),
    ghost: &Answer,
    (ghost_objs, real_objs): (&Objects, &Objects),
    secrets: &[String],
) {
    for s in secrets {
        assert!(
            !real.text.contains(s.as_str()) || real_req.contains(s.as_str()),
            "{what}: the answer names {s}, which the caller did not send: {}",
            real.text
        );
    }
    if real.status.is_success() {
        return;
    }
    real.assert_problem(what);
    let mut ghost_text = ghost.text.clone();
    for (g, r) in ghost_objs.pairs(real_objs) {
        ghost_text = ghost_text.replace(g, r);
    }
    assert_eq!(
        (real.status, real.text.as_str()),
        (ghost.status, ghost_text.as_str()),
        "{what}: the answer about another's objects differs from the one about objects that \
         do not exist, so it tells that they exist"
    );
}

async fn every_documented_operation_answers_each_caller_as_its_entry_says(backend: Backend) {
    // The webhooks point at a closed local port: pings fail at once instead of leaving.
    let srv = TestServer::start_with(backend, |c| c.webhooks.allow_private = true).await;
    let c = callers(&srv).await;
    let mut n = 0u64;
    let mut documented = documented_operations();
    documented.sort();
    for op in &documented {
        let entry = ENTRIES
            .iter()
            .find(|e| e.op == op.as_str())
            .unwrap_or_else(|| panic!("{op} has no entry in ENTRIES; add one"));
        let (method, template) = op.split_once(' ').expect("METHOD /path");
        let method: Method = method.parse().expect("method");
        n += 1;
        let objs = real_objects(&srv, &c, n).await;
        let path = fill(template, &objs);
        let body = (entry.body)(&objs);
        let request_text = format!("{path} {}", body.clone().unwrap_or_default());
        let mut secrets = c.fixed_secrets.clone();
        secrets.extend([
            objs.job.clone(),
            objs.webhook.clone(),
            objs.secret.clone(),
            objs.token.clone(),
            objs.command.clone(),
            format!("alpha-train-{n}"),
            format!("alpha-token-{n}"),
        ]);

        // 1. No token, malformed, revoked and expired tokens.
        for (what, token, whole_header) in &c.bad {
            let cred = match (token.is_empty(), whole_header) {
                (true, _) => Cred::Nothing,
                (false, true) => Cred::Header(token),
                (false, false) => Cred::Bearer(token),
            };
            let a = send(&srv, &method, &path, cred, body.as_ref()).await;
            let what = format!("{op} with {what}");
            assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{what}: {}", a.text);
            a.assert_problem(&what);
        }

        // 2. Each role the entry does not list, with its own credentials.
        for role in Role::ALL.into_iter().filter(|r| !entry.may.contains(r)) {
            let a = send(
                &srv,
                &method,
                &path,
                Cred::Bearer(c.own(role)),
                body.as_ref(),
            )
            .await;
            let what = format!("{op} as {}", role.as_str());
            assert_eq!(a.status, StatusCode::FORBIDDEN, "{what}: {}", a.text);
            a.assert_problem(&what);
            assert_eq!(
                a.json()["type"],
                "urn:spotplane:problem:forbidden",
                "{what}"
            );
        }

        // 3. Team B and node X, on A's and Y's objects and on objects that do not exist.
        let ghost = ghost_objects(n);
        let ghost_path = fill(template, &ghost);
        let ghost_body = (entry.body)(&ghost);
        for (who, role, token) in [
            ("team beta", TEAM, c.team_b.as_str()),
            ("node X's agent", AGENT, c.agent_x.as_str()),
        ] {
            let what = format!("{op} as {who}");
            let real = send(&srv, &method, &path, Cred::Bearer(token), body.as_ref()).await;
            let nothing = send(
                &srv,
                &method,
                &ghost_path,
                Cred::Bearer(token),
                ghost_body.as_ref(),
            )
            .await;
            let allowed = entry.may.contains(&role);
            match (allowed, entry.owner, role) {
                (false, _, _) => {
                    assert_eq!(real.status, StatusCode::FORBIDDEN, "{what}: {}", real.text)
                }
                (true, Owner::Team, TEAM) => {
                    assert_eq!(real.status, StatusCode::NOT_FOUND, "{what}: {}", real.text)
                }
                (true, Owner::Node, AGENT) => assert!(
                    [StatusCode::FORBIDDEN, StatusCode::NOT_FOUND].contains(&real.status),
                    "{what}: {} {}",
                    real.status,
                    real.text
                ),
                _ => {}
            }
            assert_reveals_nothing(
                &what,
                (&request_text, &real),
                &nothing,
                (&ghost, &objs),
                &secrets,
            );
        }

        // 4. Each role the entry lists gets past authorization. What a call changes or
        // removes, the next role's call gets anew.
        for (i, role) in entry.may.iter().enumerate() {
            let objs = if i == 0 {
                objs.clone()
            } else {
                n += 1;
                real_objects(&srv, &c, n).await
            };
            let path = fill(template, &objs);
            let a = send(
                &srv,
                &method,
                &path,
                Cred::Bearer(c.own(*role)),
                (entry.body)(&objs).as_ref(),
            )
            .await;
            assert!(
                !matches!(
                    a.status,
                    StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND
                ) && !a.status.is_server_error(),
                "{op} as {} (its own objects): {} {}",
                role.as_str(),
                a.status,
                a.text
            );
        }
    }
    srv.stop().await;
}

/// The routes the OpenAPI document does not describe: the simulated clouds' controls (admin
/// only) and the public ones.
async fn routes_outside_the_openapi_document_keep_their_rules(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let c = callers(&srv).await;
    // No instance runs here: an admin gets past the role check to "no such instance".
    for (path, admin_gets) in [
        ("/sim/control/aws/spot-outage?on=false", StatusCode::OK),
        ("/sim/control/gcp/calm?on=false", StatusCode::OK),
        (
            "/sim/control/gcp/instances/none/preempt",
            StatusCode::NOT_FOUND,
        ),
        (
            "/sim/control/azure/instances/none/vanish",
            StatusCode::NOT_FOUND,
        ),
    ] {
        for role in Role::ALL {
            let a = send(&srv, &Method::POST, path, Cred::Bearer(c.own(role)), None).await;
            let expected = if role == ADMIN {
                admin_gets
            } else {
                StatusCode::FORBIDDEN
            };
            assert_eq!(
                a.status,
                expected,
                "POST {path} as {}: {}",
                role.as_str(),
                a.text
            );
        }
        for (what, token, whole_header) in &c.bad {
            let cred = match (token.is_empty(), whole_header) {
                (true, _) => Cred::Nothing,
                (false, true) => Cred::Header(token),
                (false, false) => Cred::Bearer(token),
            };
            let a = send(&srv, &Method::POST, path, cred, None).await;
            assert_eq!(
                a.status,
                StatusCode::UNAUTHORIZED,
                "POST {path} with {what}"
            );
            a.assert_problem(path);
        }
    }
    // A forbidden caller gets 403 even when its body is bad: the role is checked first.
    let a = send(
        &srv,
        &Method::POST,
        "/v1/teams",
        Cred::Bearer(&c.finance),
        Some(&json!({"nonsense": true})),
    )
    .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.text);
    for public in ["/healthz", "/readyz", "/metrics", "/v1/openapi.json"] {
        let (s, _, _) = srv.raw(Method::GET, public, None, None, &[]).await;
        assert_eq!(s, StatusCode::OK, "{public} needs no token");
    }
    srv.stop().await;
}

async fn bad_input_gets_a_problem_naming_the_field(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let token = srv.team_with_token("alpha").await;
    let base = json!({"name": "j", "shape": {"gpus": 1}, "command": ["x"]});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let without = |k: &str| {
        let mut b = base.clone();
        b.as_object_mut().expect("object").remove(k);
        b
    };
    let unprocessable: Vec<(Value, &str)> = vec![
        (without("name"), "name"),
        (without("shape"), "shape"),
        (without("command"), "command"),
        (with("name", json!(7)), "name"),
        (with("name", json!("Has Spaces")), "name"),
        (with("replicas", json!(0)), "replicas"),
        (with("replicas", json!(1025)), "replicas"),
        (with("replicas", json!("2")), "replicas"),
        (with("priority", json!("urgent")), "priority"),
        (with("priority", json!(-5)), "priority"),
        (with("shape", json!({"gpus": 17})), "shape.gpus"),
        (with("shape", json!({"gpu_milli": 0})), "shape.gpu_milli"),
        (with("shape", json!({"gpu_milli": 1001})), "shape.gpu_milli"),
        (
            with("shape", json!({"mig": "3g.40gb", "models": ["T4"]})),
            "shape.models[0]",
        ),
        (with("shape", json!({"mig": "banana"})), "shape.mig"),
        (
            with("shape", json!({"gpus": 1, "models": ["Z9000"]})),
            "shape.models[0]",
        ),
        (with("shape", json!({})), "shape"),
        (with("command", json!([])), "command"),
        (with("command", json!("python train.py")), "command"),
        (with("cpu_milli", json!(-1)), "cpu_milli"),
        (with("memory_mib", json!(1e30)), "memory_mib"),
        (
            with("env", json!({"SPOTPLANE_RESUME_DIR": "/x"})),
            "env.SPOTPLANE_RESUME_DIR",
        ),
        (with("env", json!({"1BAD": "x"})), "env.1BAD"),
        (
            with("checkpoint", json!({"uri": "ftp://x/y"})),
            "checkpoint.uri",
        ),
        (
            with("checkpoint", json!({"uri": "s3://b/p", "interval_s": 1})),
            "checkpoint.interval_s",
        ),
        (with("deadline", json!("2001-01-01T00:00:00Z")), "deadline"),
        (with("deadline", json!("tomorrow")), "deadline"),
        (with("max_hourly_usd", json!(-1)), "max_hourly_usd"),
        (with("max_hourly_usd", json!(0.0000001)), "max_hourly_usd"),
        (with("clouds", json!(["oracle"])), "clouds[0]"),
        (with("clouds", json!(["aws", "aws"])), "clouds[1]"),
        (with("regions", json!(["US East"])), "regions[0]"),
        (with("spot", json!("yes")), "spot"),
        (with("labels", json!({"k": 1})), "labels.k"),
        (with("surprise", json!(true)), "surprise"),
    ];
    for (body, field) in unprocessable {
        let (s, h, v) = srv
            .send(Method::POST, "/v1/jobs", Some(&token), Some(&body), &[])
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body} -> {v}");
        assert_eq!(v["field"].as_str(), Some(field), "{body} -> {v}");
        assert_eq!(
            h.get("content-type").and_then(|c| c.to_str().ok()),
            Some("application/problem+json")
        );
        assert!(v["errors"].as_array().is_some_and(|e| !e.is_empty()));
    }

    // All broken rules at once, not only the first.
    let (_, v) = srv
        .call(
            Method::POST,
            "/v1/jobs",
            Some(&token),
            Some(&json!({"name": "x", "replicas": 0, "shape": {"gpu_milli": 0}, "command": []})),
        )
        .await;
    let fields: Vec<_> = v["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| e["field"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(fields, ["replicas", "shape.gpu_milli", "command"]);

    let malformed = srv
        .raw(
            Method::POST,
            "/v1/jobs",
            Some(&token),
            Some(b"{\"name\": ".to_vec()),
            &[("content-type", "application/json")],
        )
        .await;
    assert_eq!(malformed.0, StatusCode::BAD_REQUEST, "{}", malformed.2);
    let not_json = srv
        .raw(
            Method::POST,
            "/v1/jobs",
            Some(&token),
            Some(b"name=x".to_vec()),
            &[("content-type", "application/x-www-form-urlencoded")],
        )
        .await;
    assert_eq!(not_json.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let no_type = srv
        .raw(
            Method::POST,
            "/v1/jobs",
            Some(&token),
            Some(base.to_string().into_bytes()),
            &[],
        )
        .await;
    assert_eq!(no_type.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let mut huge = base.clone();
    huge["env"] = json!({"BIG": "x".repeat(300 * 1024)});
    let (s, _, v) = srv
        .send(Method::POST, "/v1/jobs", Some(&token), Some(&huge), &[])
        .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(v["type"], "urn:spotplane:problem:payload-too-large");

    let (s, h, _) = srv.raw(Method::GET, "/v1/jobs", None, None, &[]).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(h.get("www-authenticate").is_some());
    for header in [
        "Basic YWxhZGRpbjpvcGVuc2VzYW1l",
        "Bearer",
        "Bearer ",
        "token abc",
    ] {
        let (s, _, _) = srv
            .raw(
                Method::GET,
                "/v1/jobs",
                None,
                None,
                &[("authorization", header)],
            )
            .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{header}");
    }
    let (_, v) = srv
        .call(Method::POST, "/v1/teams/alpha/tokens", Some(ADMIN_TOKEN), Some(&json!({"name": "soon", "expires_at": (chrono::Utc::now() + chrono::Duration::milliseconds(300)).to_rfc3339()})))
        .await;
    let expiring = v["token"].as_str().expect("token").to_owned();
    let (s, _) = srv
        .call(Method::GET, "/v1/jobs", Some(&expiring), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let (s, _) = srv
        .call(Method::GET, "/v1/jobs", Some(&expiring), None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "expired tokens stop working");

    let (s, h, v) = srv
        .raw(Method::GET, "/v2/nothing", Some(&token), None, &[])
        .await;
    assert_eq!(
        (s, v["status"].as_u64()),
        (StatusCode::NOT_FOUND, Some(404))
    );
    assert_eq!(
        h.get("content-type").and_then(|c| c.to_str().ok()),
        Some("application/problem+json")
    );
    let (s, _, v) = srv
        .raw(Method::PUT, "/v1/jobs", Some(&token), None, &[])
        .await;
    assert_eq!(
        (s, v["status"].as_u64()),
        (StatusCode::METHOD_NOT_ALLOWED, Some(405))
    );
    srv.stop().await;
}

#[tokio::test]
async fn the_openapi_document_describes_every_route() {
    let srv = TestServer::start(Backend::Sqlite).await;
    let (s, doc) = srv.call(Method::GET, "/v1/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let paths = doc["paths"].as_object().expect("paths");
    let expected = [
        ("/v1/teams", vec!["post", "get"]),
        ("/v1/teams/{team}", vec!["get", "patch"]),
        ("/v1/teams/{team}/tokens", vec!["post", "get"]),
        ("/v1/tokens", vec!["post", "get"]),
        ("/v1/tokens/{id}", vec!["delete"]),
        ("/v1/jobs", vec!["post", "get"]),
        ("/v1/jobs/{id}", vec!["get"]),
        ("/v1/jobs/{id}/cancel", vec!["post"]),
        ("/v1/jobs/{id}/events", vec!["get"]),
        ("/v1/nodes", vec!["get"]),
        ("/v1/offers", vec!["get"]),
        ("/v1/overview", vec!["get"]),
        ("/v1/webhooks", vec!["post", "get"]),
        ("/v1/webhooks/{id}", vec!["get", "patch", "delete"]),
        ("/v1/webhooks/{id}/rotate-secret", vec!["post"]),
        ("/v1/webhooks/{id}/ping", vec!["post"]),
        ("/v1/webhooks/{id}/deliveries", vec!["get"]),
        ("/v1/finance/summary", vec!["get"]),
        ("/v1/finance/export.csv", vec!["get"]),
        ("/v1/teams/{team}/budget", vec!["get", "put"]),
        ("/v1/jobs/{id}/checkpoints", vec!["get"]),
        ("/v1/nodes/{id}/bootstrap-token", vec!["post"]),
        ("/v1/nodes/{id}/commands", vec!["post", "get"]),
        ("/v1/nodes/{id}/agent", vec!["get"]),
        ("/v1/agent/register", vec!["post"]),
        ("/v1/agent/heartbeat", vec!["post"]),
        ("/v1/agent/commands/{id}/result", vec!["post"]),
        ("/v1/agent/checkpoints", vec!["post"]),
        ("/v1/teams/{team}/secrets", vec!["post", "get"]),
        ("/v1/teams/{team}/secrets/{name}", vec!["delete"]),
        ("/v1/agent/jobs/{job_id}/secrets", vec!["get"]),
        ("/v1/jobs/{id}/logs", vec!["get"]),
        ("/v1/agent/logs", vec!["post"]),
    ];
    let documented = expected.len();
    for (path, methods) in expected {
        for m in methods {
            assert!(
                paths.get(path).and_then(|p| p.get(m)).is_some(),
                "{m} {path} is documented"
            );
        }
    }
    assert_eq!(
        paths.len(),
        documented,
        "no undocumented extras: {:?}",
        paths.keys().collect::<Vec<_>>()
    );
    assert!(doc["components"]["schemas"]["JobSpec"].is_object());
    let log_params: Vec<&str> = doc["paths"]["/v1/jobs/{id}/logs"]["get"]["parameters"]
        .as_array()
        .map(|ps| ps.iter().filter_map(|p| p["name"].as_str()).collect())
        .unwrap_or_default();
    for p in ["id", "replica", "attempt", "follow", "tail"] {
        assert!(log_params.contains(&p), "{p} in {log_params:?}");
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    srv.stop().await;
}

#[tokio::test]
async fn metrics_record_store_operations_and_requests() {
    let srv = TestServer::start(Backend::Sqlite).await;
    srv.call(Method::GET, "/v1/teams", Some(ADMIN_TOKEN), None)
        .await;
    let resp = reqwest::get(format!("{}/metrics", srv.url))
        .await
        .expect("metrics");
    let text = resp.text().await.expect("text");
    assert!(
        text.contains("spotplane_store_operation_seconds_count{op=\"list_teams\",outcome=\"ok\"}"),
        "{text}"
    );
    assert!(text.contains("route=\"/v1/teams\""), "{text}");
    // The fleet's gauges, read from the store at the scrape, after the process's own, in one
    // exposition (one `# EOF`, at its end).
    srv.store()
        .create_node(
            common::stored_node(
                "n1",
                "p5.48xlarge",
                "35.5",
                (192_000, 2_097_152),
                common::h100(false),
            ),
            chrono::Utc::now(),
        )
        .await
        .expect("node");
    // Without a token: the process's own metrics, no team, no price.
    let public = reqwest::get(format!("{}/metrics", srv.url))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(!public.contains("spotplane_nodes"), "{public}");
    assert!(public.ends_with("# EOF\n"), "{public}");
    // A team's token is refused, as on any admin route; the admin's gets the fleet.
    let team = srv.team_with_token("alpha").await;
    let (s, _, _) = srv
        .raw(Method::GET, "/metrics", Some(&team), None, &[])
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _, _) = srv
        .raw(Method::GET, "/metrics", Some("not-a-token"), None, &[])
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let text = srv
        .http
        .get(format!("{}/metrics", srv.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        text.contains(
            "spotplane_nodes{cloud=\"aws\",region=\"us-east-1\",market=\"spot\",state=\"requested\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("spotplane_gpu_allocation_ratio 0.0"),
        "{text}"
    );
    assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    srv.stop().await;
}
