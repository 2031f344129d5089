//! Configuration: typed, documented, validated all at once.
//!
//! Layers, later ones winning: the embedded default (`config/spotplane.toml`), the file given
//! with `--config`, `DATABASE_URL`, then `SPOTPLANE_<SECTION>__<KEY>` environment variables.
//! [`Config::validate`] reports every problem with its path, not only the first.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Serialize};
use spotplane_core::FieldErrors;
use spotplane_providers::config::ProviderConfig;
use spotplane_providers::sim::SimMarket;

/// The embedded default, the same file users read in the repository.
pub const DEFAULT_TOML: &str = include_str!("../../config/spotplane.toml");

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub database: DatabaseConfig,
    pub scheduler: SchedulerSettings,
    pub capacity: CapacityConfig,
    pub recovery: RecoveryConfig,
    pub object_store: ObjectStoreConfig,
    pub log: LogConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    pub dev: DevConfig,
    pub sim: SimSettings,
    #[serde(default)]
    pub catalog: CatalogSettings,
    #[serde(default)]
    pub webhooks: WebhookSettings,
    #[serde(default)]
    pub finance: FinanceSettings,
    /// The key team secrets are encrypted with (control-plane/src/secrets.rs).
    #[serde(default)]
    pub secrets: crate::secrets::SecretsSettings,
    /// The cloud accounts (or simulated clouds) capacity is bought from, one per cloud.
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimSettings {
    /// The recorded traces simulated clouds replay (the repository's `../shared/data`).
    pub data_dir: PathBuf,
    /// Which market simulated clouds replay: `auto` (the recorded traces of `data_dir` when
    /// that folder is there, the market shipped in the binary otherwise), `recorded` (the
    /// traces of `data_dir`, an error without them) or `shipped`.
    #[serde(default)]
    pub market: MarketChoice,
    /// Simulated seconds per real second for `spotplane serve` (1: real time). Above 1 the
    /// whole control plane runs on the accelerated clock: for trying the simulated clouds out,
    /// never for real ones.
    #[serde(default = "one")]
    pub speed: f64,
    /// A folder where the simulated clouds keep their state (and the accelerated clock its
    /// anchor), so that they outlive the control plane as real clouds do: a restarted
    /// `spotplane serve` finds its instances still running, and several replicas on one
    /// machine share one set of clouds. Unset: they live in the process's memory.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
}

/// `sim.market`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MarketChoice {
    #[default]
    Auto,
    Recorded,
    Shipped,
}

fn one() -> f64 {
    1.0
}

impl SimSettings {
    /// `data_dir` as given when it exists; a relative path that does not exist from the working
    /// directory is tried from the root of the repository checkout the binary was built in,
    /// when the working directory is inside that checkout (so `cargo run` and `cargo test`
    /// find `../shared/data` from any folder of the repository, and a copy of the binary run
    /// elsewhere does not reach back into the build machine's checkout).
    pub fn resolved_data_dir(&self) -> PathBuf {
        if self.data_dir.is_absolute() || self.data_dir.exists() {
            return self.data_dir.clone();
        }
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let inside = match (
            std::env::current_dir().and_then(std::fs::canonicalize),
            std::fs::canonicalize(&checkout),
        ) {
            (Ok(cwd), Ok(root)) => cwd.starts_with(root),
            _ => false,
        };
        let candidate = checkout.join(&self.data_dir);
        if inside && candidate.exists() {
            candidate
        } else {
            self.data_dir.clone()
        }
    }

    /// The market simulated clouds replay (`sim.market`): with `auto`, the recorded traces
    /// when [`Self::resolved_data_dir`] exists, the shipped market when it does not.
    pub fn market(&self) -> anyhow::Result<SimMarket> {
        let dir = self.resolved_data_dir();
        match self.market {
            MarketChoice::Shipped => Ok(SimMarket::Shipped),
            MarketChoice::Auto if dir.is_dir() => Ok(SimMarket::Recorded(dir)),
            MarketChoice::Auto => Ok(SimMarket::Shipped),
            MarketChoice::Recorded => {
                anyhow::ensure!(
                    dir.is_dir(),
                    "sim.market is \"recorded\" but sim.data_dir {} is not a folder (point \
                     sim.data_dir at the recorded traces, ../shared/data in a checkout, or set \
                     sim.market to \"auto\" or \"shipped\")",
                    dir.display()
                );
                Ok(SimMarket::Recorded(dir))
            }
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogSettings {
    /// A folder of `aws.csv`, `gcp.csv`, `azure.csv` replacing the catalogs built in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
}

/// Webhook delivery (docs/webhooks.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookSettings {
    /// Deliver webhooks from this process (only the leader delivers).
    pub enabled: bool,
    /// How often due deliveries are looked for.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// A delivery attempt that takes longer fails.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Deliveries in flight at once.
    pub concurrency: usize,
    /// The first retry waits about this long; each next one twice as long, jittered...
    #[serde(with = "humantime_serde")]
    pub retry_base: Duration,
    /// ...but never longer than this.
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
    /// A delivery still failing this long after its event is given up.
    #[serde(with = "humantime_serde")]
    pub retry_for: Duration,
    /// An endpoint that has failed every attempt for this long is disabled, and its team told.
    #[serde(with = "humantime_serde")]
    pub disable_after: Duration,
    /// How long a rotated-out secret still signs, unless the rotation says otherwise.
    #[serde(with = "humantime_serde")]
    pub rotation_overlap: Duration,
    /// Allows endpoints on private, loopback and link-local addresses (internal services).
    pub allow_private: bool,
    /// How long a gap in the outbox's ids is waited for (a transaction not yet committed)
    /// before it is skipped (a transaction rolled back).
    #[serde(with = "humantime_serde")]
    pub gap_wait: Duration,
    /// Test pings (`POST /v1/webhooks/{id}/ping`) a team may send a minute, all at once if
    /// saved up; more are answered 429.
    pub pings_per_minute: u32,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        WebhookSettings {
            enabled: true,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            concurrency: 16,
            retry_base: Duration::from_secs(5),
            retry_max: Duration::from_secs(3600),
            retry_for: Duration::from_secs(24 * 3600),
            disable_after: Duration::from_secs(24 * 3600),
            rotation_overlap: Duration::from_secs(24 * 3600),
            allow_private: false,
            gap_wait: Duration::from_secs(10),
            pings_per_minute: 5,
        }
    }
}

/// The cost ledger (docs/finance.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FinanceSettings {
    /// Run the ledger in this process (only the leader writes it).
    pub enabled: bool,
    /// How often node time is brought into the ledger.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// The ledger stops this far behind now, so changes being committed are in.
    #[serde(with = "humantime_serde")]
    pub settle: Duration,
    /// `BillingAccountId` and `BillingAccountName` of the FOCUS export.
    pub billing_account_id: String,
    pub billing_account_name: String,
}

impl Default for FinanceSettings {
    fn default() -> Self {
        FinanceSettings {
            enabled: true,
            interval: Duration::from_secs(60),
            settle: Duration::from_secs(60),
            billing_account_id: "spotplane".into(),
            billing_account_name: "spotplane".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address the API listens on.
    pub listen: String,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Requests taking longer are answered 503.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// A connection that has not sent a whole request head this long after it began waiting
    /// for one (an idle keep-alive connection too) is closed.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers) accepted, in bytes; larger ones get 431.
    pub max_header_bytes: usize,
}

impl ServerConfig {
    /// What the listener is given.
    pub fn listener_limits(&self) -> crate::listener::ListenerLimits {
        crate::listener::ListenerLimits {
            max_connections: self.max_connections,
            header_read_timeout: self.header_read_timeout,
            max_header_bytes: self.max_header_bytes,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `sqlite://path` or `postgres://…`.
    pub url: String,
    pub max_connections: u32,
    /// PostgreSQL schema for spotplane's tables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerSettings {
    pub enabled: bool,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Packing policy by name.
    pub policy: String,
    pub candidates: usize,
    pub preemption: bool,
    pub dynamic_mig: bool,
}

/// The capacity loop: buying and releasing nodes (`reconcile::capacity`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacityConfig {
    pub enabled: bool,
    /// The `spotplane-cluster` tag value of this control plane's instances.
    pub cluster: String,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    #[serde(with = "humantime_serde")]
    pub price_refresh: Duration,
    #[serde(with = "humantime_serde")]
    pub idle_grace: Duration,
    #[serde(with = "humantime_serde")]
    pub boot_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub orphan_grace: Duration,
    /// Drain nodes whose work fits on the rest of the fleet (`planner::consolidate`).
    pub consolidation: bool,
    /// A node's set of jobs must have stayed the same this long before they are moved.
    #[serde(with = "humantime_serde")]
    pub consolidate_after: Duration,
    /// The node boot script that installs and starts the agent (each Terraform module outputs
    /// it as `node_boot_script`); it follows the node's bootstrap token in its user data.
    #[serde(default)]
    pub node_boot_script: Option<PathBuf>,
    /// The most nodes the fleet may hold at once (booting and ready), every team together.
    pub max_nodes: u32,
    /// The most the fleet may cost per hour, every team together, in US dollars.
    pub max_hourly_usd: f64,
}

/// How the capacity loop behaves (`reconcile::capacity`), made from [`CapacityConfig`].
#[derive(Debug, Clone)]
pub struct CapacitySettings {
    /// Tag value every instance of this control plane carries (`spotplane-cluster`).
    pub cluster: String,
    pub price_refresh: chrono::Duration,
    /// How long an offer that failed for capacity or price is set aside.
    pub capacity_error_ttl: chrono::Duration,
    /// How long the offer of a node that never booted is set aside.
    pub boot_failure_ttl: chrono::Duration,
    /// An instance with the cluster tag that no node knows is terminated after this long.
    pub orphan_grace: chrono::Duration,
    /// Simulated clouds' nodes run no agent: they count as ready once running.
    pub ready_on_running: bool,
    /// The node boot script (installs and starts the agent) put after the bootstrap token in
    /// the user data of every node bought from a real cloud (docs/deploy.md).
    pub node_boot_script: Option<String>,
    pub planner: crate::planner::PlannerSettings,
    pub consolidation: crate::planner::ConsolidationSettings,
}

impl Default for CapacitySettings {
    fn default() -> Self {
        CapacitySettings {
            cluster: "spotplane".into(),
            price_refresh: chrono::Duration::minutes(5),
            capacity_error_ttl: chrono::Duration::minutes(3),
            boot_failure_ttl: chrono::Duration::minutes(10),
            orphan_grace: chrono::Duration::minutes(10),
            ready_on_running: true,
            node_boot_script: None,
            planner: crate::planner::PlannerSettings::default(),
            consolidation: crate::planner::ConsolidationSettings::default(),
        }
    }
}

impl CapacityConfig {
    /// The loop's settings.
    pub fn settings(&self) -> CapacitySettings {
        let d = |v: Duration| chrono::Duration::from_std(v).unwrap_or(chrono::Duration::MAX);
        let mut s = CapacitySettings {
            cluster: self.cluster.clone(),
            price_refresh: d(self.price_refresh),
            orphan_grace: d(self.orphan_grace),
            node_boot_script: self
                .node_boot_script
                .as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok()),
            ..Default::default()
        };
        s.planner.idle_grace = d(self.idle_grace);
        s.planner.boot_timeout = d(self.boot_timeout);
        s.consolidation.enabled = self.consolidation;
        s.consolidation.after = d(self.consolidate_after);
        s.planner.max_nodes = Some(self.max_nodes);
        s.planner.max_hourly = spotplane_core::Micros::from_usd_f64(self.max_hourly_usd).ok();
        s
    }
}

/// The recovery loop: starting replicas through their agents, notices, checkpoints, requeues
/// (`reconcile::recovery`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoveryConfig {
    pub enabled: bool,
    /// A registered agent silent this long has lost its node.
    #[serde(with = "humantime_serde")]
    pub heartbeat_timeout: Duration,
    /// Retries of a failing job (one whose replica exits non-zero), unless it sets `max_retries`.
    pub retry_limit: u32,
    /// Back-off after a job's first failure, doubled each time up to `backoff_max`.
    #[serde(with = "humantime_serde")]
    pub backoff_base: Duration,
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// The window a job preempted by the scheduler has to checkpoint.
    #[serde(with = "humantime_serde")]
    pub preempt_window: Duration,
    /// The first port a gang's rank 0 may listen on for its rendezvous (`MASTER_PORT`).
    pub rendezvous_port_base: u16,
    /// How many ports from `rendezvous_port_base` on: each run of a job gets one of them, by a
    /// hash of the job's id and the attempt (docs/agent.md, "Gangs").
    pub rendezvous_ports: u16,
}

impl RecoveryConfig {
    pub fn settings(&self) -> crate::recovery::Settings {
        let d = |v: Duration| chrono::Duration::from_std(v).unwrap_or(chrono::Duration::MAX);
        crate::recovery::Settings {
            heartbeat_timeout: d(self.heartbeat_timeout),
            default_retry_limit: self.retry_limit,
            backoff_base: d(self.backoff_base),
            backoff_max: d(self.backoff_max),
            preempt_window: d(self.preempt_window),
            rendezvous_ports: spotplane_core::rendezvous::PortRange {
                base: self.rendezvous_port_base,
                count: self.rendezvous_ports,
            },
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectStoreConfig {
    pub url: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    pub level: String,
    pub format: LogFormat,
}

/// Traces, and the live page's samples (docs/observability.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// An OTLP/HTTP collector traces are exported to, e.g. `http://otel-collector:4318`
    /// (spans go to `<endpoint>/v1/traces`). None: no export (the default).
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// How often the live page's charts take a sample of the fleet; 0s: never.
    #[serde(default = "default_history_interval", with = "humantime_serde")]
    pub history_interval: Duration,
    /// How many samples the charts keep (720 at one a minute: 12 hours).
    #[serde(default = "default_history_samples")]
    pub history_samples: usize,
}

fn default_service_name() -> String {
    "spotplane".into()
}

fn default_history_interval() -> Duration {
    Duration::from_secs(60)
}

fn default_history_samples() -> usize {
    720
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            service_name: default_service_name(),
            history_interval: default_history_interval(),
            history_samples: default_history_samples(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevConfig {
    /// Allows insecure settings; never in production.
    pub insecure: bool,
}

/// The database a URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseKind {
    /// A SQLite file (its path) or `:memory:`.
    Sqlite(PathBuf),
    Postgres,
}

impl DatabaseConfig {
    pub fn kind(&self) -> Result<DatabaseKind, String> {
        let url = self.url.trim();
        if let Some(rest) = url.strip_prefix("sqlite:") {
            let rest = rest.strip_prefix("//").unwrap_or(rest);
            let path = rest.split('?').next().unwrap_or_default();
            if path.is_empty() {
                return Err(
                    "a sqlite URL needs a file path, e.g. sqlite://data/spotplane.sqlite".into(),
                );
            }
            Ok(DatabaseKind::Sqlite(PathBuf::from(path)))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(DatabaseKind::Postgres)
        } else {
            Err("must start with sqlite:// or postgres://".into())
        }
    }
}

/// Loading failed: the files or the environment do not make a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration file {0} does not exist")]
    Missing(PathBuf),
    #[error("{0}")]
    Parse(Box<figment::Error>),
    #[error("invalid configuration: {0}")]
    Invalid(FieldErrors),
}

impl Config {
    /// Loads the layered configuration and validates it.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load_from(
            file,
            Env::prefixed("SPOTPLANE_"),
            Env::raw().only(&["DATABASE_URL"]),
        )
    }

    fn load_from(
        file: Option<&Path>,
        spotplane_env: Env,
        database_url_env: Env,
    ) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Missing(path.to_owned()));
            }
            fig = fig.merge(Toml::file(path));
        }
        fig = fig
            .merge(database_url_env.map(|_| "database.url".into()))
            // Only nested keys: SPOTPLANE_URL and SPOTPLANE_TOKEN belong to the CLI client.
            .merge(
                spotplane_env
                    .filter(|k| k.as_str().contains("__"))
                    .split("__"),
            );
        let mut config: Config = fig.extract().map_err(|e| ConfigError::Parse(Box::new(e)))?;
        config.resolve_relative_paths();
        config
            .validate()
            .into_result()
            .map_err(ConfigError::Invalid)?;
        Ok(config)
    }

    /// Makes a relative `file://` object store URL (the default `file://data/objects`)
    /// absolute against the current directory, as the SQLite path already is read: checkpoint
    /// URIs under it go to agents, which accept only absolute local paths, and must not change
    /// meaning with an agent's working directory. The secrets key file likewise.
    pub fn resolve_relative_paths(&mut self) {
        if let Some(rest) = self.object_store.url.strip_prefix("file://")
            && !rest.is_empty()
            && !rest.starts_with('/')
            && let Ok(cwd) = std::env::current_dir()
        {
            let path = cwd.join(rest.trim_start_matches("./"));
            self.object_store.url = format!("file://{}", path.display());
        }
        self.secrets.resolve_relative_paths();
    }

    /// The embedded default, with its relative object store folder made absolute (as
    /// [`Config::load`] does).
    pub fn embedded_default() -> Result<Config, ConfigError> {
        let mut c: Config = Figment::from(Toml::string(DEFAULT_TOML))
            .extract()
            .map_err(|e| ConfigError::Parse(Box::new(e)))?;
        c.resolve_relative_paths();
        Ok(c)
    }

    /// Every problem, each with its path.
    pub fn validate(&self) -> FieldErrors {
        let mut errs = FieldErrors::new();
        if self.server.listen.parse::<SocketAddr>().is_err() {
            errs.push(
                "server.listen",
                format!(
                    "{:?} is not an address such as 127.0.0.1:8080",
                    self.server.listen
                ),
            );
        }
        if let Some(e) = &self.telemetry.otlp_endpoint
            && !matches!(
                url::Url::parse(e).map(|u| u.scheme().to_owned()).as_deref(),
                Ok("http" | "https")
            )
        {
            errs.push(
                "telemetry.otlp_endpoint",
                format!(
                    "{e:?} is not an http:// or https:// address such as http://otel-collector:4318"
                ),
            );
        }
        if !(1..=100_000).contains(&self.telemetry.history_samples) {
            errs.push("telemetry.history_samples", "must be between 1 and 100000");
        }
        if !(1..=65_536).contains(&self.server.max_connections) {
            errs.push("server.max_connections", "must be between 1 and 65536");
        }
        if self.server.header_read_timeout < Duration::from_millis(100) {
            errs.push("server.header_read_timeout", "must be at least 100ms");
        }
        if !(8192..=1024 * 1024).contains(&self.server.max_header_bytes) {
            errs.push(
                "server.max_header_bytes",
                "must be between 8192 and 1048576",
            );
        }
        if !(1024..=64 * 1024 * 1024).contains(&self.server.max_body_bytes) {
            errs.push("server.max_body_bytes", "must be between 1024 and 67108864");
        }
        if self.capacity.cluster.trim().is_empty()
            || !self
                .capacity
                .cluster
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            errs.push(
                "capacity.cluster",
                "lowercase letters, digits and '-' only (it is a tag and a GCE label value)",
            );
        }
        // The capacity loop buys for what the scheduler could not place; without the
        // scheduler it would only give nodes back. Say so rather than run half a round.
        if self.capacity.enabled && !self.scheduler.enabled {
            errs.push(
                "capacity.enabled",
                "the capacity loop buys for the demand the scheduler could not place: with \
                 scheduler.enabled = false set capacity.enabled = false too, or turn the \
                 scheduler on",
            );
        }
        if self.recovery.heartbeat_timeout < Duration::from_secs(5) {
            errs.push("recovery.heartbeat_timeout", "must be at least 5s");
        }
        if self.recovery.retry_limit > spotplane_core::job::MAX_RETRIES {
            errs.push(
                "recovery.retry_limit",
                format!("must be at most {}", spotplane_core::job::MAX_RETRIES),
            );
        }
        if let Err(e) = (spotplane_core::rendezvous::PortRange {
            base: self.recovery.rendezvous_port_base,
            count: self.recovery.rendezvous_ports,
        })
        .check()
        {
            errs.push("recovery.rendezvous_ports", e);
        }
        if self.recovery.backoff_max < self.recovery.backoff_base {
            errs.push(
                "recovery.backoff_max",
                "must be at least recovery.backoff_base",
            );
        }
        if !(self.sim.speed >= 1.0 && self.sim.speed <= 100_000.0) {
            errs.push("sim.speed", "must be between 1 and 100000");
        }
        if self.sim.speed > 1.0 && self.providers.iter().any(|p| p.kind() != "sim") {
            errs.push(
                "sim.speed",
                "an accelerated clock is for simulated clouds only; remove the real providers or set 1",
            );
        }
        if let Some(p) = &self.capacity.node_boot_script
            && let Err(e) = std::fs::read_to_string(p)
        {
            errs.push(
                "capacity.node_boot_script",
                format!("cannot read {}: {e}", p.display()),
            );
        }
        if self.capacity.max_nodes == 0 {
            errs.push("capacity.max_nodes", "must be at least 1");
        }
        if !(self.capacity.max_hourly_usd.is_finite() && self.capacity.max_hourly_usd >= 0.01)
            || spotplane_core::Micros::from_usd_f64(self.capacity.max_hourly_usd).is_err()
        {
            errs.push(
                "capacity.max_hourly_usd",
                "must be a dollar amount of at least 0.01",
            );
        }
        if self.capacity.interval < Duration::from_secs(1) {
            errs.push("capacity.interval", "must be at least 1s");
        }
        if self.server.request_timeout < Duration::from_millis(100) {
            errs.push("server.request_timeout", "must be at least 100ms");
        }
        match self.database.kind() {
            Err(m) => errs.push("database.url", m),
            Ok(DatabaseKind::Sqlite(_)) if self.database.schema.is_some() => {
                errs.push("database.schema", "only PostgreSQL has schemas");
            }
            Ok(_) => {}
        }
        if self.database.max_connections == 0 || self.database.max_connections > 1000 {
            errs.push("database.max_connections", "must be between 1 and 1000");
        }
        if let Some(s) = &self.database.schema
            && (s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        {
            errs.push(
                "database.schema",
                "must be a plain identifier (letters, digits, '_')",
            );
        }
        if !crate::scheduler::policies::NAMES.contains(&self.scheduler.policy.as_str()) {
            errs.push(
                "scheduler.policy",
                format!(
                    "unknown policy {:?}; one of {}",
                    self.scheduler.policy,
                    crate::scheduler::policies::NAMES.join(", ")
                ),
            );
        }
        if self.scheduler.interval < Duration::from_millis(100) {
            errs.push("scheduler.interval", "must be at least 100ms");
        }
        if !(1..=10_000).contains(&self.scheduler.candidates) {
            errs.push("scheduler.candidates", "must be between 1 and 10000");
        }
        match self.object_store.url.split_once("://") {
            Some(("file", rest)) if !rest.starts_with('/') => errs.push(
                "object_store.url",
                "a file:// URL must name an absolute path, e.g. file:///var/lib/spotplane/objects",
            ),
            Some(("file" | "s3" | "gs" | "az" | "azure" | "abfs", rest)) if !rest.is_empty() => {}
            Some(("http", _)) if self.dev.insecure => {}
            Some(("http", _)) => errs.push(
                "object_store.url",
                "plain http:// is only allowed with dev.insecure = true",
            ),
            _ => errs.push(
                "object_store.url",
                "must be a file://, s3://, gs:// or az:// URL",
            ),
        }
        let mut clouds = Vec::new();
        for (i, p) in self.providers.iter().enumerate() {
            let at = format!("providers[{i}]");
            if clouds.contains(&p.cloud()) {
                errs.push(
                    format!("{at}.kind"),
                    format!(
                        "a second {} provider; one account per cloud is supported",
                        p.cloud()
                    ),
                );
            }
            clouds.push(p.cloud());
            p.validate(&at, &mut errs);
        }
        let w = &self.webhooks;
        for (field, d, min) in [
            ("webhooks.interval", w.interval, Duration::from_millis(10)),
            ("webhooks.timeout", w.timeout, Duration::from_millis(100)),
            (
                "webhooks.connect_timeout",
                w.connect_timeout,
                Duration::from_millis(100),
            ),
            (
                "webhooks.retry_base",
                w.retry_base,
                Duration::from_millis(100),
            ),
            (
                "finance.interval",
                self.finance.interval,
                Duration::from_millis(10),
            ),
        ] {
            if d < min {
                errs.push(
                    field,
                    format!("must be at least {}", humantime::format_duration(min)),
                );
            }
        }
        if w.retry_max < w.retry_base {
            errs.push("webhooks.retry_max", "must be at least webhooks.retry_base");
        }
        if w.retry_for < w.retry_base {
            errs.push("webhooks.retry_for", "must be at least webhooks.retry_base");
        }
        if !(1..=1024).contains(&w.concurrency) {
            errs.push("webhooks.concurrency", "must be between 1 and 1024");
        }
        if !(1..=600).contains(&w.pings_per_minute) {
            errs.push("webhooks.pings_per_minute", "must be between 1 and 600");
        }
        self.secrets.validate(&mut errs);
        if self.finance.billing_account_id.trim().is_empty() {
            errs.push("finance.billing_account_id", "must not be empty");
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log.level).is_err() {
            errs.push(
                "log.level",
                format!(
                    "{:?} is not a tracing filter such as \"info\"",
                    self.log.level
                ),
            );
        }
        errs
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, String> {
        self.server
            .listen
            .parse()
            .map_err(|_| format!("server.listen: {:?} is not an address", self.server.listen))
    }
}

/// What replaces a secret in printed configuration.
pub const REDACTED: &str = "<redacted>";

impl Config {
    /// The configuration as `spotplane config` prints it: every secret replaced by
    /// [`REDACTED`]. A password or token can hide in three places, and each is covered, so a
    /// field added later is safe without anyone remembering this function:
    ///
    /// - in a URL's user information (`postgres://user:password@host/db`), which keeps the user;
    /// - in a URL's query (`?password=…`, a SAS token's `sig=…`), by parameter name;
    /// - as a field whose name says it holds one (`password`, `token`, `secret`, `credential`,
    ///   a `key` that is not a public key or a key's file).
    pub fn redacted(&self) -> Result<serde_json::Value, serde_json::Error> {
        let mut v = serde_json::to_value(self)?;
        redact(&mut v);
        Ok(v)
    }
}

fn redact(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            for (k, field) in map.iter_mut() {
                // Sections (`secrets`) are walked; only their values are replaced.
                if secret_name(k) && matches!(field, Value::String(_) | Value::Number(_)) {
                    *field = Value::String(REDACTED.into());
                } else {
                    redact(field);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        Value::String(s) => {
            if let Some(clean) = redact_url(s) {
                *s = clean;
            }
        }
        _ => {}
    }
}

/// Whether a field or query parameter named `name` holds a secret.
fn secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    if n.contains("public") || n.ends_with("_file") || n.ends_with("_path") {
        return false;
    }
    [
        "password",
        "passwd",
        "token",
        "secret",
        "credential",
        "signature",
    ]
    .iter()
    .any(|w| n.contains(w))
        || n == "sig"
        || n == "key"
        || n.ends_with("_key")
        || n.ends_with("-key")
        || n.ends_with("apikey")
}

/// `s` with its password and secret query parameters redacted, when it is a URL that has any.
fn redact_url(s: &str) -> Option<String> {
    let mut url = url::Url::parse(s).ok()?;
    let mut changed = false;
    if url.password().is_some() {
        // Plain letters: `<` and `>` would be percent-encoded in a URL.
        url.set_password(Some("redacted")).ok()?;
        changed = true;
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let secret = secret_name(&k);
                changed |= secret;
                let v = if secret {
                    "redacted".into()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        if changed {
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
    }
    changed.then(|| url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    // figment's Jail API returns its large error type; nothing to box here.
    #[allow(clippy::result_large_err)]
    fn load_with(vars: &[(&str, &str)], file: Option<&Path>) -> Result<Config, ConfigError> {
        // figment::Jail sets variables in a sandbox; here the providers are given explicitly
        // so tests stay independent of the process environment.
        let mut result = None;
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            for (k, v) in vars {
                jail.set_env(k, v);
            }
            result = Some(Config::load_from(
                file,
                Env::prefixed("SPOTPLANE_"),
                Env::raw().only(&["DATABASE_URL"]),
            ));
            Ok(())
        });
        result.unwrap_or_else(|| Err(ConfigError::Missing(PathBuf::new())))
    }

    #[test]
    fn printed_configuration_shows_no_password_token_or_key() {
        use base64::Engine as _;
        let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let c = load_with(
            &[
                (
                    "DATABASE_URL",
                    "postgres://spot:hunter2@db.internal:5432/spot?sslmode=require&password=pw-in-query",
                ),
                ("SPOTPLANE_SECRETS__KEY", &key),
            ],
            None,
        )
        .expect("loads");
        let printed = serde_json::to_string(&c.redacted().expect("serializes")).expect("text");
        for secret in ["hunter2", "pw-in-query", key.as_str()] {
            assert!(!printed.contains(secret), "{secret} printed: {printed}");
        }
        // What is not secret is still there to read.
        for kept in [
            "postgres://spot:redacted@db.internal:5432/spot?sslmode=require&password=redacted",
            "data/secrets.key",
        ] {
            assert!(printed.contains(kept), "{kept} missing: {printed}");
        }
        // A signed URL (an Azure SAS) keeps all but its signature.
        assert_eq!(
            redact_url("https://acct.blob.core.windows.net/c?sv=2022-11-02&sig=abc%2Bdef")
                .as_deref(),
            Some("https://acct.blob.core.windows.net/c?sv=2022-11-02&sig=redacted")
        );
        assert_eq!(redact_url("s3://bucket/prefix"), None);
    }

    #[test]
    fn secret_field_names() {
        for (name, secret) in [
            ("password", true),
            ("client_secret", true),
            ("bootstrap_token", true),
            ("key", true),
            ("aws_secret_access_key", true),
            ("sig", true),
            ("ssh_public_key", false),
            ("key_file", false),
            ("url", false),
            ("max_connections", false),
        ] {
            assert_eq!(secret_name(name), secret, "{name}");
        }
    }

    #[test]
    fn the_cloud_accounts_example_is_valid_and_replaces_the_simulated_clouds() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/examples/clouds.toml");
        let c = load_with(&[], Some(&path)).expect("the example loads and validates");
        let kinds: Vec<&str> = c.providers.iter().map(|p| p.kind()).collect();
        assert_eq!(kinds, ["aws", "gcp", "azure"]);
    }

    #[test]
    fn the_embedded_default_is_valid() {
        let c = Config::embedded_default().expect("parses");
        assert_eq!(c.validate(), FieldErrors::new());
        assert_eq!(
            c.database.kind(),
            Ok(DatabaseKind::Sqlite(PathBuf::from("data/spotplane.sqlite")))
        );
    }

    // Issue 29 D: `file://data/objects` gave agents `file://data/objects/jobs/<id>`, which they
    // refuse as not a local path.
    #[test]
    fn a_relative_object_store_folder_is_made_absolute_and_an_unresolved_one_is_refused() {
        // (figment's jail runs in a folder of its own: the URLs are absolute, under it.)
        let c = load_with(&[], None).expect("the default loads");
        let url = &c.object_store.url;
        assert!(
            url.starts_with("file:///") && url.ends_with("/data/objects"),
            "{url}"
        );
        let c =
            load_with(&[("SPOTPLANE_OBJECT_STORE__URL", "file://./ckpt")], None).expect("loads");
        let url = &c.object_store.url;
        assert!(
            url.starts_with("file:///") && url.ends_with("/ckpt") && !url.contains("/./"),
            "{url}"
        );

        let mut c = Config::embedded_default().expect("parses");
        c.object_store.url = "file://data/objects".into();
        let fields: Vec<_> = c.validate().iter().map(|e| e.field.clone()).collect();
        assert_eq!(fields, ["object_store.url"]);
    }

    #[test]
    fn the_secrets_key_is_a_file_under_the_working_directory_or_given_in_the_environment() {
        let c = load_with(&[], None).expect("the default loads");
        assert!(
            c.secrets.key_file.is_absolute() && c.secrets.key_file.ends_with("data/secrets.key"),
            "{:?}",
            c.secrets.key_file
        );
        assert_eq!(c.secrets.key, None);
        use base64::Engine;
        let key = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
        let c = load_with(&[("SPOTPLANE_SECRETS__KEY", &key)], None).expect("loads");
        assert_eq!(
            c.secrets.key.as_ref().map(|k| k.expose()),
            Some(key.as_str())
        );
        assert!(crate::secrets::SecretsKey::load(&c.secrets).is_ok());
        let err = load_with(&[("SPOTPLANE_SECRETS__KEY", "c2hvcnQ=")], None).expect_err("short");
        let ConfigError::Invalid(errs) = err else {
            panic!("expected validation errors, got {err}");
        };
        let fields: Vec<_> = errs.iter().map(|e| e.field.clone()).collect();
        assert_eq!(fields, ["secrets.key"]);
    }

    #[test]
    fn the_rendezvous_ports_are_checked() {
        let c = Config::embedded_default().expect("parses");
        let ports = c.recovery.settings().rendezvous_ports;
        assert_eq!((ports.base, ports.count), (29_500, 2_000));
        for (base, count) in [(29_500, 0), (80, 100), (65_000, 1_000)] {
            let mut c = Config::embedded_default().expect("parses");
            c.recovery.rendezvous_port_base = base;
            c.recovery.rendezvous_ports = count;
            let fields: Vec<_> = c.validate().iter().map(|e| e.field.clone()).collect();
            assert_eq!(fields, ["recovery.rendezvous_ports"], "{base} + {count}");
        }
    }

    #[test]
    fn the_fleet_caps_are_set_by_default_and_checked() {
        let c = Config::embedded_default().expect("parses");
        let s = c.capacity.settings();
        assert_eq!(s.planner.max_nodes, Some(50));
        assert_eq!(
            s.planner.max_hourly,
            Some(spotplane_core::Micros(500_000_000))
        );
        let mut c = c;
        c.capacity.max_nodes = 0;
        c.capacity.max_hourly_usd = f64::NAN;
        let fields: Vec<_> = c.validate().iter().map(|e| e.field.clone()).collect();
        assert_eq!(fields, ["capacity.max_nodes", "capacity.max_hourly_usd"]);
    }

    #[test]
    fn each_step_of_the_round_is_switched_alone_and_capacity_needs_the_scheduler() {
        let base = Config::embedded_default().expect("default");
        // (scheduler, recovery, capacity) -> the fields refused
        type Case = ((bool, bool, bool), &'static [&'static str]);
        let table: [Case; 6] = [
            ((true, true, true), &[]),
            ((true, false, true), &[]),
            ((true, true, false), &[]),
            ((false, true, false), &[]),
            ((false, false, false), &[]),
            ((false, true, true), &["capacity.enabled"]),
        ];
        for ((scheduler, recovery, capacity), want) in table {
            let mut c = base.clone();
            c.scheduler.enabled = scheduler;
            c.recovery.enabled = recovery;
            c.capacity.enabled = capacity;
            let fields: Vec<_> = c.validate().iter().map(|e| e.field.clone()).collect();
            assert_eq!(fields, want, "{scheduler} {recovery} {capacity}");
        }
    }

    #[test]
    fn environment_overrides_nested_keys_and_ignores_client_variables() {
        let c = load_with(
            &[
                ("SPOTPLANE_SERVER__LISTEN", "0.0.0.0:9000"),
                ("SPOTPLANE_URL", "http://x"),
                ("SPOTPLANE_TOKEN", "t"),
                ("DATABASE_URL", "postgres://u@h/db"),
            ],
            None,
        )
        .expect("loads");
        assert_eq!(c.server.listen, "0.0.0.0:9000");
        assert_eq!(c.database.kind(), Ok(DatabaseKind::Postgres));
    }

    #[test]
    fn spotplane_database_url_wins_over_database_url() {
        let c = load_with(
            &[
                ("DATABASE_URL", "postgres://a@h/db"),
                ("SPOTPLANE_DATABASE__URL", "sqlite://x.db"),
            ],
            None,
        )
        .expect("loads");
        assert_eq!(c.database.url, "sqlite://x.db");
    }

    #[test]
    fn validation_reports_every_problem_with_its_path() {
        let mut c = Config::embedded_default().expect("parses");
        c.server.listen = "nowhere".into();
        c.database.url = "mysql://x".into();
        c.database.max_connections = 0;
        c.object_store.url = "http://minio:9000/bucket".into();
        c.log.level = "[[[".into();
        let fields: Vec<_> = c.validate().iter().map(|e| e.field.clone()).collect();
        assert_eq!(
            fields,
            [
                "server.listen",
                "database.url",
                "database.max_connections",
                "object_store.url",
                "log.level"
            ]
        );
    }

    #[test]
    fn unknown_keys_and_bad_durations_are_errors_naming_the_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[server]\nlisten = \"127.0.0.1:1\"\nlisten_port = 3\n",
        )
        .expect("write");
        let err = load_with(&[], Some(&path)).expect_err("unknown key");
        assert!(err.to_string().contains("listen_port"), "{err}");

        std::fs::write(&path, "[server]\nrequest_timeout = \"soon\"\n").expect("write");
        let err = load_with(&[], Some(&path)).expect_err("bad duration");
        assert!(err.to_string().contains("request_timeout"), "{err}");

        let err = load_with(&[], Some(&dir.path().join("absent.toml"))).expect_err("missing file");
        assert!(matches!(err, ConfigError::Missing(_)));
    }

    #[test]
    fn providers_come_from_the_default_and_a_file_replaces_the_list() {
        let c = Config::embedded_default().expect("parses");
        let clouds: Vec<_> = c.providers.iter().map(|p| p.cloud().to_string()).collect();
        assert_eq!(clouds, ["aws", "gcp", "azure"]);

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[[providers]]\nkind = \"sim\"\nflavour = \"gcp\"\n\n[[providers]]\nkind = \"sim\"\nflavour = \"gcp\"\nerror_rate = 2.0\n",
        )
        .expect("write");
        let err = load_with(&[], Some(&path)).expect_err("two gcp providers");
        let ConfigError::Invalid(errs) = err else {
            panic!("expected validation errors, got {err}");
        };
        let fields: Vec<_> = errs.iter().map(|e| e.field.clone()).collect();
        assert_eq!(fields, ["providers[1].kind", "providers[1].error_rate"]);
    }

    #[test]
    fn the_market_is_recorded_when_the_folder_is_there_and_shipped_otherwise() {
        let dir = tempfile::tempdir().expect("dir");
        let mut sim = Config::embedded_default().expect("default").sim;
        assert_eq!(sim.market, MarketChoice::Auto);
        sim.data_dir = dir.path().to_path_buf();
        assert_eq!(
            sim.market().expect("market"),
            SimMarket::Recorded(dir.path().to_path_buf())
        );
        sim.market = MarketChoice::Shipped;
        assert_eq!(sim.market().expect("market"), SimMarket::Shipped);
        sim.data_dir = dir.path().join("no-such-folder");
        sim.market = MarketChoice::Auto;
        assert_eq!(sim.market().expect("market"), SimMarket::Shipped);
        sim.market = MarketChoice::Recorded;
        let err = sim.market().expect_err("recorded needs the folder");
        assert!(err.to_string().contains("no-such-folder"), "{err}");
    }

    #[test]
    fn sim_market_is_read_from_the_environment_and_checked() {
        let c = load_with(&[("SPOTPLANE_SIM__MARKET", "shipped")], None).expect("loads");
        assert_eq!(c.sim.market, MarketChoice::Shipped);
        assert!(load_with(&[("SPOTPLANE_SIM__MARKET", "replayed")], None).is_err());
    }
}
