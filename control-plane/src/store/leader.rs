//! Leadership: several replicas may serve the API against one PostgreSQL, but only one runs
//! the reconcilers. The leader holds a session-level advisory lock on a connection it keeps
//! out of the pool; if the process dies or the connection breaks, PostgreSQL releases the lock
//! and another replica takes over at its next attempt. No home-made consensus.
//!
//! On SQLite there is one process by construction, so it always leads.

use sea_orm::sqlx::{PgConnection, Row};

use super::{Store, StoreError};

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
