//! Why a queued job waits, as data rather than English: `wait_reason` holds the scheduler's
//! reason code (`no_capacity`, `quota`, `waiting_for_preemption`, `waiting_for_repartition`),
//! which the capacity loop reads to know what to buy for, and `requeued` marks a job put back
//! in the queue (it goes ahead of its priority peers until the scheduler has looked at it).
//! `state_reason` stays the sentence people read.
//!
//! Rows of a running system are carried over from their sentences once, here.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The sentences the scheduler wrote before this migration, and their codes.
const CARRIED: [(&str, &str); 4] = [
    ("waiting for capacity", "no_capacity"),
    ("waiting for quota", "quota"),
    (
        "waiting for preempted jobs to checkpoint",
        "waiting_for_preemption",
    ),
    ("waiting for a MIG re-layout", "waiting_for_repartition"),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        // SQLite takes one column per ALTER TABLE.
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .add_column(string_null(Jobs::WaitReason))
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Jobs::Table)
                .add_column(boolean(Jobs::Requeued).default(false))
                .to_owned(),
        )
        .await?;
        for (sentence, code) in CARRIED {
            m.exec_stmt(
                Query::update()
                    .table(Jobs::Table)
                    .value(Jobs::WaitReason, code)
                    .and_where(Expr::col(Jobs::State).eq("queued"))
                    .and_where(Expr::col(Jobs::StateReason).eq(sentence))
                    .to_owned(),
            )
            .await?;
        }
        m.exec_stmt(
            Query::update()
                .table(Jobs::Table)
                .value(Jobs::Requeued, true)
                .and_where(Expr::col(Jobs::State).eq("queued"))
                .and_where(Expr::col(Jobs::StateReason).like("requeued%"))
                .to_owned(),
        )
        .await
    }
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    State,
    StateReason,
    WaitReason,
    Requeued,
}
