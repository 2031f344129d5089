use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "jobs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub team_id: String,
    pub name: String,
    pub state: String,
    pub state_reason: Option<String>,
    pub priority: i32,
    pub spec: Json,
    pub idempotency_key: Option<String>,
    pub request_hash: Option<String>,
    pub attempt: i32,
    pub version: i64,
    pub deadline: Option<DateTimeUtc>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub finished_at: Option<DateTimeUtc>,
    pub resume_from: Option<Json>,
    pub lost_gpu_seconds: i64,
    pub failures: i32,
    pub not_before: Option<DateTimeUtc>,
    pub running_since: Option<DateTimeUtc>,
    pub drain_started_at: Option<DateTimeUtc>,
    pub checkpoint_requested_at: Option<DateTimeUtc>,
    /// The scheduler's reason code while queued (`WaitReason`), for the capacity loop.
    pub wait_reason: Option<String>,
    /// Put back in the queue; cleared once the scheduler has given it a wait reason.
    pub requeued: bool,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
