//! A GPU's desired MIG layout, set by the scheduler when it orders a re-layout and cleared
//! when the node reports the layout applied. While it differs from `mig_layout`, the GPU is
//! being re-laid and nothing is placed on it.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Gpus::Table)
                .add_column(json_binary_null(Gpus::DesiredMigLayout))
                .to_owned(),
        )
        .await
    }
}

#[derive(DeriveIden)]
enum Gpus {
    Table,
    DesiredMigLayout,
}
