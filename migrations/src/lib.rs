//! spotplane's database schema, as forward-only migrations.
//!
//! Each migration is a file `mYYYYMMDD_NNNNNN_what.rs`, applied in order, recorded in
//! `seaql_migrations`, and never edited once released: a change to the schema is a new
//! migration. There are no `down` migrations; to undo, write a new one that moves forward.
//! The same migrations run on SQLite (the embedded default) and PostgreSQL (production), so they
//! use only column types both support: text ids (UUIDv7 strings), 64-bit integers for
//! micro-dollars and counts, timestamps with time zone, and JSON for nested values.

pub use sea_orm_migration::MigrationStatus;
pub use sea_orm_migration::prelude::*;

mod m20261130_000001_initial;
mod m20261130_000002_gpu_desired_layout;
mod m20261130_000003_agent_protocol;
mod m20261201_000003_webhooks_and_finance;
mod m20261201_000004_recovery;
mod m20261203_000005_node_capabilities;
mod m20261203_000006_team_secrets;
mod m20261203_000007_replica_logs;
mod m20261204_000008_typed_wait_reasons;
mod m20261206_000009_cloud_times;
mod m20261207_000010_replica_utilisation;

pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261130_000001_initial::Migration),
            Box::new(m20261130_000002_gpu_desired_layout::Migration),
            Box::new(m20261130_000003_agent_protocol::Migration),
            Box::new(m20261201_000003_webhooks_and_finance::Migration),
            Box::new(m20261201_000004_recovery::Migration),
            Box::new(m20261203_000005_node_capabilities::Migration),
            Box::new(m20261203_000006_team_secrets::Migration),
            Box::new(m20261203_000007_replica_logs::Migration),
            Box::new(m20261204_000008_typed_wait_reasons::Migration),
            Box::new(m20261206_000009_cloud_times::Migration),
            Box::new(m20261207_000010_replica_utilisation::Migration),
        ]
    }
}
