use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "ledger_entries")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub node_id: String,
    pub job_id: Option<String>,
    pub team_id: Option<String>,
    pub kind: String,
    pub market: String,
    pub period_start: DateTimeUtc,
    pub period_end: DateTimeUtc,
    pub millis: i64,
    pub gpu_milli: i32,
    pub price_micros_per_hour: i64,
    pub on_demand_micros_per_hour: i64,
    pub cost_micros: i64,
    pub list_cost_micros: i64,
    pub created_at: DateTimeUtc,
    pub attempt: Option<i32>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
