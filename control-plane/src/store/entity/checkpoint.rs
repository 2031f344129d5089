use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "checkpoints")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub job_id: String,
    pub replica: i32,
    pub attempt: i32,
    pub uri: String,
    pub state: String,
    pub trigger: String,
    pub manifest: Option<Json>,
    pub total_bytes: Option<i64>,
    pub created_at: DateTimeUtc,
    pub completed_at: Option<DateTimeUtc>,
    /// The node whose agent reported it.
    pub node_id: Option<String>,
    /// Why it is not durable, for one that is not.
    pub message: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
