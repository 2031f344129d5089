//! Test harness: a real server on a real database, SQLite or PostgreSQL.
//!
//! PostgreSQL tests use the server named by `SPOTPLANE_TEST_POSTGRES_URL` (default: the local
//! one at 127.0.0.1:5432, database `test`), each test in a schema of its own that is dropped
//! at the end. If PostgreSQL is unreachable the tests fail, they do not skip.
#![allow(dead_code)]

use std::sync::Arc;

use reqwest::{Method, StatusCode};
use serde_json::Value;
use spotplane::clock::SystemClock;
use spotplane::config::Config;
use spotplane::server::{ServeOptions, Server};
use spotplane::store::{NewGpu, NewNode};
use spotplane_core::{Cloud, GpuModel, Market, Micros, MigLayout, NodeId};

pub const ADMIN_TOKEN: &str = "spt_test_admin_token_000000000000";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub fn postgres_url() -> String {
    std::env::var("SPOTPLANE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A database for one test; drop it with [`TestDb::cleanup`].
pub struct TestDb {
    pub backend: Backend,
    pub config: Config,
    _dir: Option<tempfile::TempDir>,
    schema: Option<String>,
}

impl TestDb {
    pub fn new(backend: Backend) -> TestDb {
        let mut config = Config::embedded_default().expect("embedded default parses");
        config.server.listen = "127.0.0.1:0".into();
        config.log.level = "warn".into();
        // API tests drive the store themselves; scheduling, recovery and capacity tests run
        // their rounds explicitly.
        config.scheduler.enabled = false;
        config.recovery.enabled = false;
        config.capacity.enabled = false;
        // Webhook and ledger tests run their loops explicitly too.
        config.webhooks.enabled = false;
        config.finance.enabled = false;
        // The secrets key: a file of the test's own, kept across a restart on the same data.
        let dir = tempfile::tempdir().expect("tempdir");
        config.secrets.key_file = dir.path().join("secrets.key");
        match backend {
            Backend::Sqlite => {
                config.database.url =
                    format!("sqlite://{}", dir.path().join("spotplane.sqlite").display());
                config.object_store.url =
                    format!("file://{}", dir.path().join("objects").display());
                TestDb {
                    backend,
                    config,
                    _dir: Some(dir),
                    schema: None,
                }
            }
            Backend::Postgres => {
                let suffix: u64 = rand_u64();
                let schema = format!("spt_test_{suffix:016x}");
                config.database.url = postgres_url();
                config.database.schema = Some(schema.clone());
                config.database.max_connections = 4;
                TestDb {
                    backend,
                    config,
                    _dir: Some(dir),
                    schema: Some(schema),
                }
            }
        }
    }

    /// Drops the PostgreSQL schema (SQLite files go with the temp dir).
    pub async fn cleanup(&self) {
        if let Some(schema) = &self.schema {
            use sea_orm::ConnectionTrait;
            if let Ok(db) = sea_orm::Database::connect(postgres_url()).await {
                let _ = db
                    .execute_unprepared(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .await;
                let _ = db.close().await;
            }
        }
    }
}

fn rand_u64() -> u64 {
    rand::random()
}

/// A running server with a bootstrap admin token and an HTTP client.
pub struct TestServer {
    pub db: TestDb,
    pub server: Server,
    pub url: String,
    pub http: reqwest::Client,
}

impl TestServer {
    pub async fn start(backend: Backend) -> TestServer {
        Self::start_with(backend, |_| {}).await
    }

    /// Starts a server on a fresh database whose configuration `tweak` has changed.
    pub async fn start_with(backend: Backend, tweak: impl FnOnce(&mut Config)) -> TestServer {
        let mut db = TestDb::new(backend);
        tweak(&mut db.config);
        Self::start_on(db).await
    }

    /// Starts a server on an existing test database (a restart, when one ran on it before).
    pub async fn start_on(db: TestDb) -> TestServer {
        let backend = db.backend;
        let server = Server::start(
            &db.config,
            Arc::new(SystemClock),
            ServeOptions {
                bootstrap_admin_token: Some(ADMIN_TOKEN.into()),
            },
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "server on {backend:?} did not start (is PostgreSQL running at {}?): {e:#}",
                postgres_url()
            )
        });
        let url = server.url();
        TestServer {
            db,
            server,
            url,
            http: reqwest::Client::new(),
        }
    }

    pub async fn stop(self) {
        self.server.shutdown().await.expect("clean shutdown");
        self.db.cleanup().await;
    }

    /// Stops the server and hands its database back, for a restart on it.
    pub async fn stop_keeping_data(self) -> TestDb {
        self.server.shutdown().await.expect("clean shutdown");
        self.db
    }

    pub fn store(&self) -> &spotplane::store::Store {
        self.server.state.store()
    }

    /// Sends a request; returns the status, the headers and the body as JSON (Null if empty
    /// or not JSON).
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut req = self.http.request(method, format!("{}{}", self.url, path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.body(b);
        }
        let resp = req.send().await.expect("request sent");
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.expect("body read");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, headers, body)
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let (status, _, v) = self.send(method, path, token, body, &[]).await;
        (status, v)
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut h: Vec<(&str, &str)> = headers.to_vec();
        if body.is_some() {
            h.push(("content-type", "application/json"));
        }
        self.raw(
            method,
            path,
            token,
            body.map(|b| serde_json::to_vec(b).expect("json")),
            &h,
        )
        .await
    }

    /// Creates a team and returns a team token for it.
    pub async fn team_with_token(&self, name: &str) -> String {
        let (s, _) = self
            .call(
                Method::POST,
                "/v1/teams",
                Some(ADMIN_TOKEN),
                Some(&serde_json::json!({"name": name})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "creating team {name}");
        let (s, v) = self
            .call(
                Method::POST,
                &format!("/v1/teams/{name}/tokens"),
                Some(ADMIN_TOKEN),
                Some(&serde_json::json!({"name": "t"})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "creating token for {name}: {v}");
        v["token"].as_str().expect("token").to_owned()
    }
}

/// Runs an async test body against both databases, as two tests named `sqlite` and `postgres`.
#[macro_export]
macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name($crate::common::Backend::Sqlite).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    super::$name($crate::common::Backend::Postgres).await
                }
            }
        )*
    };
}

/// A one-GPU AWS spot node as provisioning stores it: `instance_type` at `hourly_usd`, with
/// `cpu_milli` and `memory_mib`, its GPU `gpu`.
pub fn stored_node(
    name: &str,
    instance_type: &str,
    hourly_usd: &str,
    (cpu_milli, memory_mib): (u64, u64),
    gpu: NewGpu,
) -> NewNode {
    NewNode {
        id: NodeId(uuid::Uuid::now_v7()),
        name: name.into(),
        cloud: Cloud::Aws,
        region: "us-east-1".into(),
        zone: "us-east-1a".into(),
        instance_type: instance_type.into(),
        market: Market::Spot,
        offer_id: None,
        client_token: format!("ct-{name}"),
        hourly_price: Micros::parse_usd(hourly_usd).expect("price"),
        on_demand_price: Micros::parse_usd("98.32").expect("price"),
        cpu_milli,
        memory_mib,
        gpus: vec![gpu],
        labels: Default::default(),
    }
}

/// An H100 (80 GB), in MIG mode with the full layout when `mig`.
pub fn h100(mig: bool) -> NewGpu {
    NewGpu {
        model: GpuModel::H100_80GB,
        memory_mib: 81_559,
        mig_enabled: mig,
        mig_layout: MigLayout::full(),
    }
}

/// An A10G, not in MIG mode.
pub fn a10g() -> NewGpu {
    NewGpu {
        model: GpuModel::A10G,
        memory_mib: 23_028,
        mig_enabled: false,
        mig_layout: MigLayout::empty(),
    }
}

/// Stores `node` with its bootstrap token, as provisioning does, and registers an agent for it
/// with `body` (its `node_id` set here): the node's id and its agent credential.
pub async fn register_agent(srv: &TestServer, node: NewNode, mut body: Value) -> (NodeId, String) {
    let now = chrono::Utc::now();
    let (n, boot) = srv
        .store()
        .create_node_with_bootstrap(node, now + chrono::Duration::hours(1), now)
        .await
        .expect("node and token");
    body["node_id"] = serde_json::json!(n.id);
    let (s, v) = srv
        .call(Method::POST, "/v1/agent/register", Some(&boot), Some(&body))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    (
        n.id,
        v["credential"].as_str().expect("credential").to_owned(),
    )
}
