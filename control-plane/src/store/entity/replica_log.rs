use sea_orm::entity::prelude::*;

/// A chunk of a replica attempt's output (migration `m20261203_000007_replica_logs`).
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "replica_logs")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub job_id: String,
    pub replica: i32,
    pub attempt: i32,
    /// Where the chunk begins in the attempt's output.
    pub byte_offset: i64,
    /// `byte_offset` plus the chunk's length.
    pub end_offset: i64,
    pub data: Vec<u8>,
    /// The attempt's output ends with this chunk.
    pub eof: bool,
    /// The node whose agent sent it.
    pub node_id: String,
    pub received_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
