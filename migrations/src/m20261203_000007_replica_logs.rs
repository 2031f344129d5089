//! Replicas' output as their agents ship it: one row per chunk of an attempt's log, at its
//! byte offset in that log (unique: a chunk sent again is stored once). The control plane keeps
//! the last few MiB of each attempt (older chunks are deleted as new ones come); the whole log
//! is archived by the agent in object storage. `eof` marks the chunk after which the attempt's
//! output is over; `end_offset` is `byte_offset` plus the chunk's length, to cut old chunks by
//! position.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(ReplicaLogs::Table)
                .col(big_integer(ReplicaLogs::Id).auto_increment().primary_key())
                .col(string(ReplicaLogs::JobId))
                .col(integer(ReplicaLogs::Replica))
                .col(integer(ReplicaLogs::Attempt))
                .col(big_integer(ReplicaLogs::ByteOffset))
                .col(big_integer(ReplicaLogs::EndOffset))
                .col(blob(ReplicaLogs::Data))
                .col(boolean(ReplicaLogs::Eof).default(false))
                .col(string(ReplicaLogs::NodeId))
                .col(timestamp_with_time_zone(ReplicaLogs::ReceivedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(ReplicaLogs::Table, ReplicaLogs::JobId)
                        .to(Jobs::Table, Jobs::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("replica_logs_by_position")
                .table(ReplicaLogs::Table)
                .col(ReplicaLogs::JobId)
                .col(ReplicaLogs::Replica)
                .col(ReplicaLogs::Attempt)
                .col(ReplicaLogs::ByteOffset)
                .unique()
                .to_owned(),
        )
        .await
    }
}

#[derive(DeriveIden)]
enum ReplicaLogs {
    Table,
    Id,
    JobId,
    Replica,
    Attempt,
    ByteOffset,
    EndOffset,
    Data,
    Eof,
    NodeId,
    ReceivedAt,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Id,
}
