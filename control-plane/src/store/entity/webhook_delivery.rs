use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_deliveries")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub subscription_id: String,
    pub outbox_id: i64,
    pub state: String,
    pub attempts: i32,
    pub next_attempt_at: Option<DateTimeUtc>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub created_at: DateTimeUtc,
    pub delivered_at: Option<DateTimeUtc>,
    pub event_type: Option<String>,
    /// Deliveries with the same subject (a job) go out in outbox order.
    pub subject: Option<String>,
    pub latency_ms: Option<i64>,
    pub last_attempt_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
