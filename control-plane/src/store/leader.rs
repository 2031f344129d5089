//! Leadership: several replicas may serve the API against one PostgreSQL, but only one runs
//! the reconcilers. The leader holds a session-level advisory lock on a connection it keeps
//! out of the pool; if the process dies or the connection breaks, PostgreSQL releases the lock
//! and another replica takes over at its next attempt. No home-made consensus.
//!
//! On SQLite there is one process, so it always leads. That is enforced, not assumed: the
//! process that opens a SQLite database holds an exclusive lock on `<database>.lock` beside it
//! ([`SqliteLock`]) for as long as it has the store open, and a second process on the same file
//! is refused with a clear error. The kernel releases the lock when the process ends, however
//! it ends.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use sea_orm::sqlx::{PgConnection, Row};

use super::{Store, StoreError};

/// An exclusive lock on a SQLite database for this process (several stores of one process on
/// one file, as the CLI's commands and the tests open, share it).
#[derive(Debug)]
pub struct SqliteLock {
    _file: std::fs::File,
}

/// The locks this process holds, by lock file.
static HELD: Mutex<BTreeMap<PathBuf, Weak<SqliteLock>>> = Mutex::new(BTreeMap::new());

impl SqliteLock {
    /// Takes the lock of the database at `db` (its folder exists), or says which file another
    /// process holds.
    pub fn take(db: &Path) -> Result<Arc<SqliteLock>, StoreError> {
        let mut name = db.file_name().unwrap_or_default().to_owned();
        name.push(".lock");
        let dir = db.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = match dir {
            Some(d) => d.canonicalize(),
            None => std::env::current_dir(),
        }
        .map_err(|e| StoreError::Connect(format!("cannot resolve {}: {e}", db.display())))?;
        let path = dir.join(name);
        let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(lock) = held.get(&path).and_then(Weak::upgrade) {
            return Ok(lock);
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| StoreError::Connect(format!("cannot open {}: {e}", path.display())))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Connect(format!(
                    "another spotplane process has the SQLite database {} open (it holds {}); \
                     SQLite serves one process: stop the other one, or run several replicas \
                     on PostgreSQL",
                    db.display(),
                    path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StoreError::Connect(format!(
                    "cannot lock {}: {e}",
                    path.display()
                )));
            }
        }
        let lock = Arc::new(SqliteLock { _file: file });
        held.retain(|_, w| w.strong_count() > 0);
        held.insert(path, Arc::downgrade(&lock));
        Ok(lock)
    }
}

/// The advisory lock of a loop's leader: one per loop (the scheduling, webhook and ledger loops
/// each need one runner, not the same one) and per schema (control planes on different schemas
/// of one database are different clusters, and advisory locks are database-wide).
const LEADER_LOCK: &str = "SELECT pg_try_advisory_lock(hashtextextended('spotplane leader ' || $1 || ' ' || current_schema(), 0))";

/// Held while this replica leads; dropping it gives leadership up.
pub struct Leadership {
    conn: Option<PgConnection>,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("postgres", &self.conn.is_some())
            .finish()
    }
}

impl Leadership {
    /// Whether the lock is still held: the connection answers. A replica that loses its
    /// connection stops acting as leader at once.
    pub async fn still_held(&mut self) -> bool {
        match &mut self.conn {
            None => true,
            Some(c) => sea_orm::sqlx::query("SELECT 1")
                .execute(&mut *c)
                .await
                .is_ok(),
        }
    }
}

impl Store {
    /// Tries to become the leader of the loop `role`; `None` when another replica leads it.
    pub async fn try_lead(&self, role: &str) -> Result<Option<Leadership>, StoreError> {
        if !self.is_postgres() {
            return Ok(Some(Leadership { conn: None }));
        }
        let pool = self.write.get_postgres_connection_pool();
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| StoreError::Connect(e.to_string()))?;
        let row = sea_orm::sqlx::query(LEADER_LOCK)
            .bind(role)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| StoreError::Connect(e.to_string()))?;
        let locked: bool = row
            .try_get(0)
            .map_err(|e| StoreError::Connect(e.to_string()))?;
        if !locked {
            return Ok(None);
        }
        // Keep the connection out of the pool for as long as we lead.
        Ok(Some(Leadership {
            conn: Some(conn.detach()),
        }))
    }
}
