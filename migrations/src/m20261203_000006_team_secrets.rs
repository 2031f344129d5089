//! Team secrets: values a team's jobs get in their environment (`JobSpec.secrets`) or pull
//! their image with (`JobSpec.image_pull_secret`), kept encrypted.
//!
//! `sealed` is the 24-byte XChaCha20-Poly1305 nonce followed by the ciphertext and its tag,
//! made with the control plane's secrets key and the row's team id and name as associated
//! data: the database alone reveals no value, and a row copied to another team or name does
//! not decrypt. One name per team.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(TeamSecrets::Table)
                .col(string(TeamSecrets::Id).primary_key())
                .col(string(TeamSecrets::TeamId))
                .col(string(TeamSecrets::Name))
                .col(blob(TeamSecrets::Sealed))
                .col(timestamp_with_time_zone(TeamSecrets::CreatedAt))
                .col(timestamp_with_time_zone(TeamSecrets::UpdatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(TeamSecrets::Table, TeamSecrets::TeamId)
                        .to(Teams::Table, Teams::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("team_secrets_by_name")
                .table(TeamSecrets::Table)
                .col(TeamSecrets::TeamId)
                .col(TeamSecrets::Name)
                .unique()
                .to_owned(),
        )
        .await
    }
}

#[derive(DeriveIden)]
enum TeamSecrets {
    Table,
    Id,
    TeamId,
    Name,
    Sealed,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Teams {
    Table,
    Id,
}
