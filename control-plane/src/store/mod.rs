//! The one door to the database.
//!
//! # What do we store?
//!
//! Everything that must survive a restart: teams and their quotas, API tokens (hashed), jobs
//! with their full event history, nodes with their GPUs and MIG layouts, allocations of GPUs to
//! job replicas, the offers last seen, checkpoints, the event outbox, webhook subscriptions and
//! deliveries, the cost ledger, the last MiBs of each replica attempt's output, and team
//! secrets (encrypted: [`crate::secrets`]). The database is the truth: a restarted control
//! plane rebuilds every in-memory view (scheduler snapshots, planner state) from these tables,
//! and keeps nothing else. The one thing it does not hold is the key that opens the secrets:
//! that is the configuration's (`secrets.key_file`).
//!
//! # How
//!
//! Every query goes through [`Store`]: it opens the transaction, retries what can be retried
//! (SQLite busy, PostgreSQL serialization failures and deadlocks) and records latency per named
//! operation. A state change of a job or node, its history entry and its outbox event are
//! written in one transaction, so an event is published if and only if the change happened.
//!
//! On SQLite all writes go through one connection (SQLite has one writer anyway; queuing in
//! the pool is cheaper than lock retries) and reads through a pool, in WAL mode with
//! `synchronous = NORMAL`: a crash of the process loses nothing committed, a power cut may lose
//! the last transactions. On PostgreSQL one pool does both.

mod agents;
mod finance;
mod jobs;
mod leader;
mod logs;
mod metrics;
mod nodes;
mod outbox;
mod overview;
mod recovery;
mod scheduling;
mod secrets;
mod submit;
mod teams;
mod tokens;
mod webhooks;

pub mod entity;

use std::future::Future;
use std::str::FromStr;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sea_orm::sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseBackend, DatabaseConnection, DbErr,
    RuntimeErr, SqlxSqliteConnector, TransactionTrait,
};
use serde_json::Value;
use spotplane_migrations::Migrator;
use spotplane_migrations::MigratorTrait;
use tracing::Instrument;

use crate::config::{DatabaseConfig, DatabaseKind};
use crate::metrics::Metrics;

pub use agents::{
    AgentCaller, AgentStatus, BOOTSTRAP_PREFIX, CHECKPOINT_COMPLETE, CheckpointRecord,
    CommandRecord, Registration,
};
pub use finance::{LivePool, TeamBudget};
pub use jobs::{JobFilter, NewJob, SubmitOutcome};
pub use leader::Leadership;
pub use logs::{LogAttemptStatus, LogRetention, LogRow, NewLogChunk};
pub use metrics::{Holder, MetricsView, NodeTelemetry};
pub use nodes::{NewGpu, NewNode, OfferCursor};
pub use outbox::OutboxEvent;
pub use overview::{JobLine, PlacedReplica};
pub(crate) use recovery::checkpoint_prefix;
pub use scheduling::SpecCache;
pub use secrets::{ResealReport, SecretWrite};
pub use teams::{NewTeam, TeamPatch};
pub use tokens::{Bootstrap, NewToken, Principal, generate_secret, hash_secret};
pub use webhooks::{DueDelivery, FanOut, NewSubscription, SubscriptionPatch};

/// What can go wrong in the store, for callers to branch on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// A request the stored state refuses, naming the field (e.g. a checkpoint outside its
    /// job's prefix).
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// A stored row could not be read back; names the table and row so it can be repaired.
    #[error("stored {table} row {id} is unreadable: {reason}")]
    Corrupt {
        table: &'static str,
        id: String,
        reason: String,
    },
    #[error("could not open the database: {0}")]
    Connect(String),
    /// A part of the store this process runs has stopped (the job writer), so the operation
    /// cannot be done here; the process is shutting down or failing.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Db(#[from] DbErr),
}

impl StoreError {
    pub(crate) fn corrupt(
        table: &'static str,
        id: impl Into<String>,
        reason: impl ToString,
    ) -> Self {
        StoreError::Corrupt {
            table,
            id: id.into(),
            reason: reason.to_string(),
        }
    }
}

/// Creates the SQLite database file readable and writable by its owner only (it holds token
/// hashes, webhook secrets and every team's jobs), and takes group and other access away from
/// an existing one and its `-wal` and `-shm` files. SQLite creates those two with the mode of
/// the database file, so they follow it.
fn owner_only(path: &std::path::Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let denied = |p: &std::path::Path, e: std::io::Error| {
            StoreError::Connect(format!("cannot restrict {} to its owner: {e}", p.display()))
        };
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| denied(path, e))?;
        let mut files = vec![path.to_path_buf()];
        for suffix in ["-wal", "-shm"] {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            files.push(name.into());
        }
        for file in files.iter().filter(|f| f.exists()) {
            let mode = std::fs::metadata(file)
                .map_err(|e| denied(file, e))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode & 0o700))
                    .map_err(|e| denied(file, e))?;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Retries for transient failures before giving up.
pub(crate) const MAX_ATTEMPTS: u32 = 4;

#[derive(Debug, Clone)]
pub struct Store {
    write: DatabaseConnection,
    read: DatabaseConnection,
    backend: DatabaseBackend,
    metrics: Metrics,
    submits: submit::SubmitQueue,
    tokens: tokens::TokenCache,
    /// SQLite only: this process's exclusive hold on the database ([`leader::SqliteLock`]).
    _sqlite_lock: Option<std::sync::Arc<leader::SqliteLock>>,
}

impl Store {
    /// Opens the database the configuration names (creating a SQLite file and its folder).
    /// Does not migrate; call [`Store::migrate`].
    /// The metrics its operations are recorded in (the process's).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub async fn connect(cfg: &DatabaseConfig, metrics: Metrics) -> Result<Store, StoreError> {
        match cfg.kind().map_err(StoreError::Connect)? {
            DatabaseKind::Sqlite(path) => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        StoreError::Connect(format!("cannot create {}: {e}", dir.display()))
                    })?;
                }
                let on_disk = path.as_os_str() != ":memory:" && !cfg.url.contains("mode=memory");
                if on_disk {
                    owner_only(&path)?;
                }
                let lock = if on_disk {
                    Some(leader::SqliteLock::take(&path)?)
                } else {
                    None
                };
                let opts = SqliteConnectOptions::from_str(&cfg.url)
                    .map_err(|e| StoreError::Connect(format!("{}: {e}", cfg.url)))?
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Normal)
                    .foreign_keys(true)
                    .busy_timeout(Duration::from_secs(10));
                let write = SqlitePoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(cfg.connect_timeout.max(Duration::from_secs(30)))
                    .connect_with(opts.clone())
                    .await
                    .map_err(|e| StoreError::Connect(format!("{}: {e}", cfg.url)))?;
                let read = SqlitePoolOptions::new()
                    .max_connections(cfg.max_connections)
                    .acquire_timeout(cfg.connect_timeout.max(Duration::from_secs(30)))
                    .connect_with(opts)
                    .await
                    .map_err(|e| StoreError::Connect(format!("{}: {e}", cfg.url)))?;
                let mut store = Store::assemble(
                    SqlxSqliteConnector::from_sqlx_sqlite_pool(write),
                    SqlxSqliteConnector::from_sqlx_sqlite_pool(read),
                    DatabaseBackend::Sqlite,
                    metrics,
                );
                store._sqlite_lock = lock;
                Ok(store)
            }
            DatabaseKind::Postgres => {
                let mut opts = ConnectOptions::new(cfg.url.clone());
                opts.max_connections(cfg.max_connections)
                    .min_connections(1)
                    .connect_timeout(cfg.connect_timeout)
                    .acquire_timeout(cfg.connect_timeout.max(Duration::from_secs(30)))
                    .sqlx_logging(false);
                if let Some(schema) = &cfg.schema {
                    opts.set_schema_search_path(schema.clone());
                }
                let db = Database::connect(opts)
                    .await
                    .map_err(|e| StoreError::Connect(format!("{}: {e}", redact(&cfg.url))))?;
                if let Some(schema) = &cfg.schema {
                    db.execute_unprepared(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
                        .await?;
                }
                Ok(Store::assemble(
                    db.clone(),
                    db,
                    DatabaseBackend::Postgres,
                    metrics,
                ))
            }
        }
    }

    fn assemble(
        write: DatabaseConnection,
        read: DatabaseConnection,
        backend: DatabaseBackend,
        metrics: Metrics,
    ) -> Store {
        let submits = submit::SubmitQueue::start(write.clone(), metrics.clone());
        Store {
            write,
            read,
            backend,
            metrics,
            submits,
            tokens: tokens::TokenCache::default(),
            _sqlite_lock: None,
        }
    }

    /// Applies pending migrations. Safe to run from several replicas at once on PostgreSQL:
    /// the migrations run in one transaction holding an advisory lock, so a second replica
    /// waits, then finds nothing left to do (PostgreSQL's DDL is transactional).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let started = Instant::now();
        let result = async {
            if self.backend == DatabaseBackend::Postgres {
                let txn = self.write.begin().await?;
                txn.execute_unprepared("SELECT pg_advisory_xact_lock(7355608)")
                    .await?;
                Migrator::up(&txn, None).await?;
                txn.commit().await
            } else {
                Migrator::up(&self.write, None).await
            }
        }
        .await;
        self.metrics
            .observe_store("migrate", result.is_ok(), started.elapsed());
        Ok(result?)
    }

    /// Names of migrations not yet applied (empty when the schema is current).
    pub async fn pending_migrations(&self) -> Result<Vec<String>, StoreError> {
        use spotplane_migrations::MigrationStatus;
        let all = Migrator::get_migration_with_status(&self.read).await?;
        Ok(all
            .into_iter()
            .filter(|m| m.status() == MigrationStatus::Pending)
            .map(|m| m.name().to_owned())
            .collect())
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        self.measured("ping", || async { Ok(self.read.ping().await?) })
            .await
    }

    pub fn backend(&self) -> DatabaseBackend {
        self.backend
    }

    pub fn is_postgres(&self) -> bool {
        self.backend == DatabaseBackend::Postgres
    }

    /// Runs `op`, retrying transient database failures with a short backoff, and records its
    /// latency under `name`. `op` must be safe to run again: it opens its own transaction.
    pub(crate) async fn measured<T, F, Fut>(
        &self,
        name: &'static str,
        mut op: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let started = Instant::now();
        let mut attempt = 1;
        // A child of whatever asked (a request, an admission, an agent command): at debug
        // level, as each request makes several.
        let span = tracing::debug_span!("store", op = name);
        loop {
            match op().instrument(span.clone()).await {
                Err(StoreError::Db(e)) if attempt < MAX_ATTEMPTS && is_transient(&e) => {
                    tracing::debug!(op = name, attempt, error = %e, "retrying transient database error");
                    tokio::time::sleep(Duration::from_millis(5 << attempt)).await;
                    attempt += 1;
                }
                result => {
                    self.metrics
                        .observe_store(name, result.is_ok(), started.elapsed());
                    return result;
                }
            }
        }
    }
}

/// SQLite busy/locked and PostgreSQL serialization failures and deadlocks go away on retry.
pub(crate) fn is_transient(e: &DbErr) -> bool {
    let (DbErr::Exec(RuntimeErr::SqlxError(se))
    | DbErr::Query(RuntimeErr::SqlxError(se))
    | DbErr::Conn(RuntimeErr::SqlxError(se))) = e
    else {
        return matches!(e, DbErr::ConnectionAcquire(_));
    };
    match se {
        sea_orm::sqlx::Error::Database(d) => {
            matches!(
                d.code().as_deref(),
                Some("5" | "6" | "261" | "262" | "517" | "40001" | "40P01")
            )
        }
        sea_orm::sqlx::Error::PoolTimedOut | sea_orm::sqlx::Error::Io(_) => true,
        _ => false,
    }
}

/// Hides the password of a database URL in messages.
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// Whether an error is a unique-constraint violation.
pub(crate) fn is_unique_violation(e: &DbErr) -> bool {
    matches!(
        e.sql_err(),
        Some(sea_orm::SqlErr::UniqueConstraintViolation(_))
    )
}

/// Reads a JSON column into a type, or says which row is corrupt.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(
    table: &'static str,
    id: &str,
    v: Value,
) -> Result<T, StoreError> {
    serde_json::from_value(v).map_err(|e| StoreError::corrupt(table, id, e))
}

/// Parses a text column into a type, or says which row is corrupt.
pub(crate) fn parse_col<T: FromStr>(table: &'static str, id: &str, v: &str) -> Result<T, StoreError>
where
    T::Err: std::fmt::Display,
{
    v.parse()
        .map_err(|e: T::Err| StoreError::corrupt(table, id, format!("{v:?}: {e}")))
}

/// The last id's millisecond and its sequence number within it (see [`new_uuid`]).
static LAST_ID: std::sync::Mutex<(u64, u16)> = std::sync::Mutex::new((0, 0));

/// A fresh UUIDv7 made at `now`, the injected clock's time (never the wall clock, so a
/// simulated world's ids follow its own time). Ids made by this process increase in the order
/// they are made, as RFC 9562's method 1 has it: within one millisecond, or when the clock
/// stands still or steps back, a 12-bit sequence in `rand_a` counts up from the last id (and
/// carries into the next millisecond when it runs out); `rand_b` is random.
pub fn new_uuid(now: DateTime<Utc>) -> uuid::Uuid {
    let millis = u64::try_from(now.timestamp_millis()).unwrap_or(0);
    let (millis, seq) = {
        let mut last = LAST_ID.lock().unwrap_or_else(|e| e.into_inner());
        let next = if millis > last.0 {
            (millis, 0)
        } else if last.1 < 0x0fff {
            (last.0, last.1 + 1)
        } else {
            (last.0 + 1, 0)
        };
        *last = next;
        next
    };
    let mut random: [u8; 10] = rand::random();
    // The first two bytes land in `rand_a` (the builder overwrites the top nibble with the
    // version).
    random[0] = (seq >> 8) as u8;
    random[1] = seq as u8;
    uuid::Builder::from_unix_timestamp_millis(millis, &random).into_uuid()
}

#[cfg(test)]
mod tests {
    use chrono::{Duration, TimeZone, Utc};

    use super::new_uuid;

    #[test]
    fn ids_follow_the_given_clock_and_increase_in_the_order_they_are_made() {
        let t = Utc
            .with_ymd_and_hms(2023, 2, 15, 0, 0, 0)
            .single()
            .unwrap_or_default();
        let first = new_uuid(t + Duration::days(4000));
        // The clock stands still for more ids than a millisecond's sequence holds, then steps
        // back: every id is still larger than the one before.
        let mut last = first;
        for _ in 0..5000 {
            let id = new_uuid(t + Duration::days(4000));
            assert!(id > last, "{id} after {last}");
            assert_eq!(id.get_version_num(), 7);
            last = id;
        }
        let back = new_uuid(t);
        assert!(back > last);
        // A later time starts its own millisecond, readable from the id.
        let later = t + Duration::days(5000);
        let id = new_uuid(later);
        let (secs, _) = id
            .get_timestamp()
            .map(|ts| ts.to_unix())
            .unwrap_or_default();
        assert_eq!(i64::try_from(secs).unwrap_or_default(), later.timestamp());
    }
}
