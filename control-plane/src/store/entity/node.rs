use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "nodes")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub name: String,
    pub cloud: String,
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub market: String,
    pub state: String,
    pub state_reason: Option<String>,
    pub offer_id: Option<String>,
    #[sea_orm(unique)]
    pub client_token: String,
    pub provider_instance_id: Option<String>,
    pub hourly_price_micros: i64,
    pub on_demand_price_micros: i64,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    pub labels: Json,
    pub notice_deadline: Option<DateTimeUtc>,
    pub agent_last_seen: Option<DateTimeUtc>,
    pub version: i64,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub ready_at: Option<DateTimeUtc>,
    pub terminated_at: Option<DateTimeUtc>,
    /// When the cloud says the instance was launched and ended (billing's start and end).
    pub launched_at: Option<DateTimeUtc>,
    pub ended_at: Option<DateTimeUtc>,
    /// The last listing of its cloud that showed the instance still there.
    pub cloud_seen_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
