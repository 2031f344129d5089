//! The first schema: teams and tokens, jobs and their history, nodes with GPUs and MIG
//! layouts, allocations, offers, checkpoints, the event outbox, webhooks and the cost ledger.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(Teams::Table)
                .col(string(Teams::Id).primary_key())
                .col(string_uniq(Teams::Name))
                .col(double(Teams::Weight))
                .col(string_null(Teams::Cohort))
                .col(json_binary(Teams::Quotas))
                .col(timestamp_with_time_zone(Teams::CreatedAt))
                .col(timestamp_with_time_zone(Teams::UpdatedAt))
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(ApiTokens::Table)
                .col(string(ApiTokens::Id).primary_key())
                .col(string(ApiTokens::Name))
                .col(string(ApiTokens::Role))
                .col(string_null(ApiTokens::TeamId))
                .col(string_null(ApiTokens::NodeId))
                .col(string_uniq(ApiTokens::SecretHash))
                .col(string(ApiTokens::Prefix))
                .col(timestamp_with_time_zone(ApiTokens::CreatedAt))
                .col(timestamp_with_time_zone_null(ApiTokens::ExpiresAt))
                .col(timestamp_with_time_zone_null(ApiTokens::RevokedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(ApiTokens::Table, ApiTokens::TeamId)
                        .to(Teams::Table, Teams::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("api_tokens_by_team")
                .table(ApiTokens::Table)
                .col(ApiTokens::TeamId)
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Jobs::Table)
                .col(string(Jobs::Id).primary_key())
                .col(string(Jobs::TeamId))
                .col(string(Jobs::Name))
                .col(string(Jobs::State))
                .col(string_null(Jobs::StateReason))
                .col(integer(Jobs::Priority))
                .col(json_binary(Jobs::Spec))
                .col(string_null(Jobs::IdempotencyKey))
                .col(string_null(Jobs::RequestHash))
                .col(integer(Jobs::Attempt).default(0))
                .col(big_integer(Jobs::Version).default(0))
                .col(timestamp_with_time_zone_null(Jobs::Deadline))
                .col(timestamp_with_time_zone(Jobs::CreatedAt))
                .col(timestamp_with_time_zone(Jobs::UpdatedAt))
                .col(timestamp_with_time_zone_null(Jobs::FinishedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(Jobs::Table, Jobs::TeamId)
                        .to(Teams::Table, Teams::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("jobs_by_team")
                .table(Jobs::Table)
                .col(Jobs::TeamId)
                .col(Jobs::Id)
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("jobs_by_state")
                .table(Jobs::Table)
                .col(Jobs::State)
                .col(Jobs::Id)
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("jobs_idempotency")
                .table(Jobs::Table)
                .col(Jobs::TeamId)
                .col(Jobs::IdempotencyKey)
                .unique()
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(JobEvents::Table)
                .col(big_integer(JobEvents::Id).auto_increment().primary_key())
                .col(string(JobEvents::JobId))
                .col(timestamp_with_time_zone(JobEvents::At))
                .col(string(JobEvents::Kind))
                .col(string_null(JobEvents::FromState))
                .col(string_null(JobEvents::ToState))
                .col(text_null(JobEvents::Reason))
                .col(json_binary_null(JobEvents::Data))
                .foreign_key(
                    ForeignKey::create()
                        .from(JobEvents::Table, JobEvents::JobId)
                        .to(Jobs::Table, Jobs::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("job_events_by_job")
                .table(JobEvents::Table)
                .col(JobEvents::JobId)
                .col(JobEvents::Id)
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Nodes::Table)
                .col(string(Nodes::Id).primary_key())
                .col(string(Nodes::Name))
                .col(string(Nodes::Cloud))
                .col(string(Nodes::Region))
                .col(string(Nodes::Zone))
                .col(string(Nodes::InstanceType))
                .col(string(Nodes::Market))
                .col(string(Nodes::State))
                .col(string_null(Nodes::StateReason))
                .col(string_null(Nodes::OfferId))
                .col(string_uniq(Nodes::ClientToken))
                .col(string_null(Nodes::ProviderInstanceId))
                .col(big_integer(Nodes::HourlyPriceMicros))
                .col(big_integer(Nodes::OnDemandPriceMicros))
                .col(big_integer(Nodes::CpuMilli))
                .col(big_integer(Nodes::MemoryMib))
                .col(json_binary(Nodes::Labels))
                .col(timestamp_with_time_zone_null(Nodes::NoticeDeadline))
                .col(timestamp_with_time_zone_null(Nodes::AgentLastSeen))
                .col(big_integer(Nodes::Version).default(0))
                .col(timestamp_with_time_zone(Nodes::CreatedAt))
                .col(timestamp_with_time_zone(Nodes::UpdatedAt))
                .col(timestamp_with_time_zone_null(Nodes::ReadyAt))
                .col(timestamp_with_time_zone_null(Nodes::TerminatedAt))
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("nodes_by_state")
                .table(Nodes::Table)
                .col(Nodes::State)
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Gpus::Table)
                .col(string(Gpus::Id).primary_key())
                .col(string(Gpus::NodeId))
                .col(integer(Gpus::Idx))
                .col(string(Gpus::Model))
                .col(string_null(Gpus::Uuid))
                .col(big_integer(Gpus::MemoryMib))
                .col(boolean(Gpus::MigEnabled))
                .col(json_binary(Gpus::MigLayout))
                .foreign_key(
                    ForeignKey::create()
                        .from(Gpus::Table, Gpus::NodeId)
                        .to(Nodes::Table, Nodes::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("gpus_by_node")
                .table(Gpus::Table)
                .col(Gpus::NodeId)
                .col(Gpus::Idx)
                .unique()
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Allocations::Table)
                .col(string(Allocations::Id).primary_key())
                .col(string(Allocations::JobId))
                .col(integer(Allocations::Replica))
                .col(integer(Allocations::Attempt))
                .col(string(Allocations::NodeId))
                .col(json_binary(Allocations::GpuIndices))
                .col(json_binary_null(Allocations::Mig))
                .col(integer(Allocations::GpuMilli))
                .col(big_integer(Allocations::CpuMilli))
                .col(big_integer(Allocations::MemoryMib))
                .col(timestamp_with_time_zone(Allocations::CreatedAt))
                .col(timestamp_with_time_zone_null(Allocations::ReleasedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(Allocations::Table, Allocations::JobId)
                        .to(Jobs::Table, Jobs::Id),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(Allocations::Table, Allocations::NodeId)
                        .to(Nodes::Table, Nodes::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("allocations_by_node")
                .table(Allocations::Table)
                .col(Allocations::NodeId)
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("allocations_by_job")
                .table(Allocations::Table)
                .col(Allocations::JobId)
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Offers::Table)
                .col(string(Offers::Id).primary_key())
                .col(string(Offers::Cloud))
                .col(string(Offers::Region))
                .col(string(Offers::Zone))
                .col(string(Offers::InstanceType))
                .col(string(Offers::Market))
                .col(string_null(Offers::GpuModel))
                .col(integer(Offers::GpuCount))
                .col(integer(Offers::Vcpus))
                .col(big_integer(Offers::MemoryMib))
                .col(big_integer(Offers::PriceMicros))
                .col(big_integer(Offers::OnDemandMicros))
                .col(double_null(Offers::PlacementScore))
                .col(string_null(Offers::InterruptionBucket))
                .col(timestamp_with_time_zone(Offers::ObservedAt))
                .col(timestamp_with_time_zone_null(Offers::UnavailableUntil))
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Checkpoints::Table)
                .col(string(Checkpoints::Id).primary_key())
                .col(string(Checkpoints::JobId))
                .col(integer(Checkpoints::Replica))
                .col(integer(Checkpoints::Attempt))
                .col(string(Checkpoints::Uri))
                .col(string(Checkpoints::State))
                .col(string(Checkpoints::Trigger))
                .col(json_binary_null(Checkpoints::Manifest))
                .col(big_integer_null(Checkpoints::TotalBytes))
                .col(timestamp_with_time_zone(Checkpoints::CreatedAt))
                .col(timestamp_with_time_zone_null(Checkpoints::CompletedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(Checkpoints::Table, Checkpoints::JobId)
                        .to(Jobs::Table, Jobs::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("checkpoints_by_job")
                .table(Checkpoints::Table)
                .col(Checkpoints::JobId)
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Outbox::Table)
                .col(big_integer(Outbox::Id).auto_increment().primary_key())
                .col(string(Outbox::Kind))
                .col(string(Outbox::SubjectKind))
                .col(string(Outbox::SubjectId))
                .col(string_null(Outbox::TeamId))
                .col(json_binary(Outbox::Payload))
                .col(timestamp_with_time_zone(Outbox::CreatedAt))
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(WebhookSubscriptions::Table)
                .col(string(WebhookSubscriptions::Id).primary_key())
                .col(string(WebhookSubscriptions::TeamId))
                .col(text(WebhookSubscriptions::Url))
                .col(string(WebhookSubscriptions::Secret))
                .col(json_binary(WebhookSubscriptions::EventTypes))
                .col(boolean(WebhookSubscriptions::Enabled))
                .col(timestamp_with_time_zone(WebhookSubscriptions::CreatedAt))
                .col(timestamp_with_time_zone(WebhookSubscriptions::UpdatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(WebhookSubscriptions::Table, WebhookSubscriptions::TeamId)
                        .to(Teams::Table, Teams::Id),
                )
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(WebhookDeliveries::Table)
                .col(string(WebhookDeliveries::Id).primary_key())
                .col(string(WebhookDeliveries::SubscriptionId))
                .col(big_integer(WebhookDeliveries::OutboxId))
                .col(string(WebhookDeliveries::State))
                .col(integer(WebhookDeliveries::Attempts))
                .col(timestamp_with_time_zone_null(
                    WebhookDeliveries::NextAttemptAt,
                ))
                .col(integer_null(WebhookDeliveries::LastStatus))
                .col(text_null(WebhookDeliveries::LastError))
                .col(timestamp_with_time_zone(WebhookDeliveries::CreatedAt))
                .col(timestamp_with_time_zone_null(
                    WebhookDeliveries::DeliveredAt,
                ))
                .foreign_key(
                    ForeignKey::create()
                        .from(WebhookDeliveries::Table, WebhookDeliveries::SubscriptionId)
                        .to(WebhookSubscriptions::Table, WebhookSubscriptions::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("webhook_deliveries_once")
                .table(WebhookDeliveries::Table)
                .col(WebhookDeliveries::SubscriptionId)
                .col(WebhookDeliveries::OutboxId)
                .unique()
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(LedgerEntries::Table)
                .col(
                    big_integer(LedgerEntries::Id)
                        .auto_increment()
                        .primary_key(),
                )
                .col(string(LedgerEntries::NodeId))
                .col(string_null(LedgerEntries::JobId))
                .col(string_null(LedgerEntries::TeamId))
                .col(string(LedgerEntries::Kind))
                .col(string(LedgerEntries::Market))
                .col(timestamp_with_time_zone(LedgerEntries::PeriodStart))
                .col(timestamp_with_time_zone(LedgerEntries::PeriodEnd))
                .col(big_integer(LedgerEntries::Millis))
                .col(integer(LedgerEntries::GpuMilli))
                .col(big_integer(LedgerEntries::PriceMicrosPerHour))
                .col(big_integer(LedgerEntries::OnDemandMicrosPerHour))
                .col(big_integer(LedgerEntries::CostMicros))
                .col(big_integer(LedgerEntries::ListCostMicros))
                .col(timestamp_with_time_zone(LedgerEntries::CreatedAt))
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("ledger_by_period")
                .table(LedgerEntries::Table)
                .col(LedgerEntries::PeriodStart)
                .to_owned(),
        )
        .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Teams {
    Table,
    Id,
    Name,
    Weight,
    Cohort,
    Quotas,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum ApiTokens {
    Table,
    Id,
    Name,
    Role,
    TeamId,
    NodeId,
    SecretHash,
    Prefix,
    CreatedAt,
    ExpiresAt,
    RevokedAt,
}

#[derive(DeriveIden)]
enum Jobs {
    Table,
    Id,
    TeamId,
    Name,
    State,
    StateReason,
    Priority,
    Spec,
    IdempotencyKey,
    RequestHash,
    Attempt,
    Version,
    Deadline,
    CreatedAt,
    UpdatedAt,
    FinishedAt,
}

#[derive(DeriveIden)]
enum JobEvents {
    Table,
    Id,
    JobId,
    At,
    Kind,
    FromState,
    ToState,
    Reason,
    Data,
}

#[derive(DeriveIden)]
enum Nodes {
    Table,
    Id,
    Name,
    Cloud,
    Region,
    Zone,
    InstanceType,
    Market,
    State,
    StateReason,
    OfferId,
    ClientToken,
    ProviderInstanceId,
    HourlyPriceMicros,
    OnDemandPriceMicros,
    CpuMilli,
    MemoryMib,
    Labels,
    NoticeDeadline,
    AgentLastSeen,
    Version,
    CreatedAt,
    UpdatedAt,
    ReadyAt,
    TerminatedAt,
}

#[derive(DeriveIden)]
enum Gpus {
    Table,
    Id,
    NodeId,
    Idx,
    Model,
    Uuid,
    MemoryMib,
    MigEnabled,
    MigLayout,
}

#[derive(DeriveIden)]
enum Allocations {
    Table,
    Id,
    JobId,
    Replica,
    Attempt,
    NodeId,
    GpuIndices,
    Mig,
    GpuMilli,
    CpuMilli,
    MemoryMib,
    CreatedAt,
    ReleasedAt,
}

#[derive(DeriveIden)]
enum Offers {
    Table,
    Id,
    Cloud,
    Region,
    Zone,
    InstanceType,
    Market,
    GpuModel,
    GpuCount,
    Vcpus,
    MemoryMib,
    PriceMicros,
    OnDemandMicros,
    PlacementScore,
    InterruptionBucket,
    ObservedAt,
    UnavailableUntil,
}

#[derive(DeriveIden)]
enum Checkpoints {
    Table,
    Id,
    JobId,
    Replica,
    Attempt,
    Uri,
    State,
    Trigger,
    Manifest,
    TotalBytes,
    CreatedAt,
    CompletedAt,
}

#[derive(DeriveIden)]
enum Outbox {
    Table,
    Id,
    Kind,
    SubjectKind,
    SubjectId,
    TeamId,
    Payload,
    CreatedAt,
}

#[derive(DeriveIden)]
enum WebhookSubscriptions {
    Table,
    Id,
    TeamId,
    Url,
    Secret,
    EventTypes,
    Enabled,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum WebhookDeliveries {
    Table,
    Id,
    SubscriptionId,
    OutboxId,
    State,
    Attempts,
    NextAttemptAt,
    LastStatus,
    LastError,
    CreatedAt,
    DeliveredAt,
}

#[derive(DeriveIden)]
enum LedgerEntries {
    Table,
    Id,
    NodeId,
    JobId,
    TeamId,
    Kind,
    Market,
    PeriodStart,
    PeriodEnd,
    Millis,
    GpuMilli,
    PriceMicrosPerHour,
    OnDemandMicrosPerHour,
    CostMicros,
    ListCostMicros,
    CreatedAt,
}
