use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "job_events")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub job_id: String,
    pub at: DateTimeUtc,
    pub kind: String,
    pub from_state: Option<String>,
    pub to_state: Option<String>,
    pub reason: Option<String>,
    pub data: Option<Json>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
