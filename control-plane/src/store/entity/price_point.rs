use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "price_points")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    /// The capacity pool: an offer id (`cloud/region/zone/instance_type/market`).
    pub pool: String,
    pub at: DateTimeUtc,
    pub price_micros: i64,
    pub on_demand_micros: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
