use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "gpus")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub node_id: String,
    pub idx: i32,
    pub model: String,
    pub uuid: Option<String>,
    pub memory_mib: i64,
    pub mig_enabled: bool,
    pub mig_layout: Json,
    /// Set while a re-layout is in flight: the layout ordered.
    pub desired_mig_layout: Option<Json>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
