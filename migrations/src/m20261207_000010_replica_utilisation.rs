//! What each replica's GPUs did while it ran, summed from its node's heartbeats: how many
//! readings, the sum of their SM utilisation (percent) and of the GPU memory used (MiB), and
//! the most memory used. A job's mean utilisation over its run is the sums over its
//! allocations divided by the readings; sums, not a running mean, so each heartbeat is one
//! increment.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        // SQLite takes one column per ALTER TABLE.
        for col in [
            Allocations::UtilSamples,
            Allocations::SmUtilSum,
            Allocations::MemUsedMibSum,
            Allocations::MemUsedMibMax,
        ] {
            m.alter_table(
                Table::alter()
                    .table(Allocations::Table)
                    .add_column(big_integer(col).default(0))
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            Allocations::MemUsedMibMax,
            Allocations::MemUsedMibSum,
            Allocations::SmUtilSum,
            Allocations::UtilSamples,
        ] {
            m.alter_table(
                Table::alter()
                    .table(Allocations::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum Allocations {
    Table,
    UtilSamples,
    SmUtilSum,
    MemUsedMibSum,
    MemUsedMibMax,
}
