use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "offers")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub cloud: String,
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub market: String,
    pub gpu_model: Option<String>,
    pub gpu_count: i32,
    pub vcpus: i32,
    pub memory_mib: i64,
    pub price_micros: i64,
    pub on_demand_micros: i64,
    pub placement_score: Option<f64>,
    pub interruption_bucket: Option<String>,
    pub observed_at: DateTimeUtc,
    pub unavailable_until: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
