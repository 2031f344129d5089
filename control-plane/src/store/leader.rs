//! Leadership: several replicas may serve the API against one PostgreSQL, but only one runs
//! the reconcilers. The leader holds a session-level advisory lock on a connection it keeps
//! out of the pool; if the process dies or the connection breaks, PostgreSQL releases the lock
//! and another replica takes over at its next attempt. No home-made consensus.
//!
//! On SQLite there is one process by construction, so it always leads.

use sea_orm::sqlx::{PgConnection, Row};

use super::{Store, StoreError};

/// The advisory lock key of the reconcilers' leader ("spotplane" in a 64-bit integer).
const LEADER_LOCK: i64 = 0x73_70_6f_74_70_6c_61_6e;

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
    /// Tries to become the leader; `None` when another replica leads.
    pub async fn try_lead(&self) -> Result<Option<Leadership>, StoreError> {
        if !self.is_postgres() {
            return Ok(Some(Leadership { conn: None }));
        }
        let pool = self.write.get_postgres_connection_pool();
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| StoreError::Connect(e.to_string()))?;
        let row = sea_orm::sqlx::query("SELECT pg_try_advisory_lock($1)")
            .bind(LEADER_LOCK)
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
