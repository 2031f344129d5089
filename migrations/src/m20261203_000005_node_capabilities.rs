//! What a registering agent says of its node beyond its GPUs: the container engine it runs
//! images with (none: no job naming an `image` is placed there) and its private address, which
//! the replicas of a gang are told to find each other at. And why a replica could not start (its
//! image would not pull, its node has no engine), which the job's failure then says.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        // SQLite takes one column per ALTER TABLE.
        m.alter_table(
            Table::alter()
                .table(NodeAgents::Table)
                .add_column(json_binary_null(NodeAgents::ContainerEngine))
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(NodeAgents::Table)
                .add_column(string_null(NodeAgents::Address))
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Allocations::Table)
                .add_column(text_null(Allocations::StartError))
                .to_owned(),
        )
        .await
    }
}

#[derive(DeriveIden)]
enum NodeAgents {
    Table,
    ContainerEngine,
    Address,
}

#[derive(DeriveIden)]
enum Allocations {
    Table,
    StartError,
}
