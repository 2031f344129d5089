//! Recovery: what the control plane needs to run a job's replicas through their agents and to
//! bring a job back after a preemption or a failure.
//!
//! - `jobs.resume_from`: per replica, the durable checkpoint the next attempt restores
//!   (`{"0": {"checkpoint_id": …, "uri": …, "completed_at": …}}`), set when the job is requeued.
//! - `jobs.lost_gpu_seconds`: GPU-seconds of work lost over the job's life (GPU time since the
//!   resume point of runs that ended without a durable checkpoint).
//! - `jobs.failures`, `jobs.not_before`: failures other than preemption, and the end of the
//!   back-off before the job may be placed again.
//! - `jobs.running_since`, `jobs.drain_started_at`, `jobs.checkpoint_requested_at`: when the
//!   current attempt began running, when its drain began, when a checkpoint was last asked for.
//! - `allocations.phase`, `exit_code`, `phase_at`: the replica as its agent last reported it;
//!   `allocations.started_at`: when the start command was queued for it.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite's ALTER TABLE adds one column at a time.
        for col in [
            json_binary_null(Jobs::ResumeFrom),
            big_integer(Jobs::LostGpuSeconds).default(0).to_owned(),
            integer(Jobs::Failures).default(0).to_owned(),
            timestamp_with_time_zone_null(Jobs::NotBefore),
            timestamp_with_time_zone_null(Jobs::RunningSince),
            timestamp_with_time_zone_null(Jobs::DrainStartedAt),
            timestamp_with_time_zone_null(Jobs::CheckpointRequestedAt),
        ] {
            m.alter_table(Table::alter().table(Jobs::Table).add_column(col).to_owned())
                .await?;
        }
        for col in [
            string_null(Allocations::Phase),
            integer_null(Allocations::ExitCode),
            timestamp_with_time_zone_null(Allocations::PhaseAt),
            timestamp_with_time_zone_null(Allocations::StartedAt),
        ] {
            m.alter_table(
                Table::alter()
                    .table(Allocations::Table)
                    .add_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    ResumeFrom,
    LostGpuSeconds,
    Failures,
    NotBefore,
    RunningSince,
    DrainStartedAt,
    CheckpointRequestedAt,
}

#[derive(DeriveIden)]
enum Allocations {
    Table,
    Phase,
    ExitCode,
    PhaseAt,
    StartedAt,
}
