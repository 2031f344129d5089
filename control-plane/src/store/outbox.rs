//! The outbox: events written in the same transaction as the change they describe, read in
//! order by whoever publishes them (webhook delivery, the web page's live view).

use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::Serialize;
use serde_json::Value;

use super::entity::outbox;
use super::{Store, StoreError};

/// One published event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxEvent {
    /// Position in the outbox; strictly increasing in commit order per writer.
    pub id: i64,
    /// `job.queued`, `node.requested`, ...
    pub kind: String,
    pub subject_kind: String,
    pub subject_id: String,
    /// Internal id of the team the event concerns, if any.
    pub team_id: Option<String>,
    pub payload: Value,
    pub created_at: DateTime<Utc>,
}

impl From<outbox::Model> for OutboxEvent {
    fn from(r: outbox::Model) -> Self {
        OutboxEvent {
            id: r.id,
            kind: r.kind,
            subject_kind: r.subject_kind,
            subject_id: r.subject_id,
            team_id: r.team_id,
            payload: r.payload,
            created_at: r.created_at,
        }
    }
}

impl Store {
    /// Events after `after` (exclusive), oldest first, at most `limit`.
    pub async fn outbox_after(
        &self,
        after: i64,
        limit: u64,
    ) -> Result<Vec<OutboxEvent>, StoreError> {
        self.measured("outbox_after", || async {
            let rows = outbox::Entity::find()
                .filter(outbox::Column::Id.gt(after))
                .order_by_asc(outbox::Column::Id)
                .limit(limit)
                .all(&self.read)
                .await?;
            Ok(rows.into_iter().map(OutboxEvent::from).collect())
        })
        .await
    }
}
