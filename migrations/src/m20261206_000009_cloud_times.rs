//! What the cloud says of a node's instance: when it was launched and when it ended. The
//! ledger bills a node from its instance's launch to its end as the cloud bills it, not from
//! the control plane's own records of them, which come later (after the cloud call, after the
//! next listing, after a restart) and would overcharge. Both are null until the cloud has said.
//! `cloud_seen_at` is the last listing that showed the instance still there: a node whose end
//! is not known yet is billed that far and no further, so that an end heard late (the control
//! plane was down, or busy) is not billed past.

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
                .table(Nodes::Table)
                .add_column(timestamp_with_time_zone_null(Nodes::LaunchedAt))
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .add_column(timestamp_with_time_zone_null(Nodes::EndedAt))
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .add_column(timestamp_with_time_zone_null(Nodes::CloudSeenAt))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .drop_column(Nodes::CloudSeenAt)
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .drop_column(Nodes::EndedAt)
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Nodes::Table)
                .drop_column(Nodes::LaunchedAt)
                .to_owned(),
        )
        .await
    }
}

#[derive(DeriveIden)]
enum Nodes {
    Table,
    LaunchedAt,
    EndedAt,
    CloudSeenAt,
}
