use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "node_agents")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub node_id: String,
    pub protocol_version: i32,
    pub agent_version: String,
    pub hostname: String,
    pub instance_id: Option<String>,
    pub inventory: Json,
    pub registered_at: DateTimeUtc,
    pub last_heartbeat_at: Option<DateTimeUtc>,
    pub clock_skew_ms: Option<i64>,
    pub heartbeats: i64,
    pub telemetry: Json,
    pub replicas: Json,
    pub notice: Option<Json>,
    pub container_engine: Option<Json>,
    pub address: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
