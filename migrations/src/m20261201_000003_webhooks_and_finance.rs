//! Webhook delivery and the cost ledger, on top of the tables the first migration created.
//!
//! - `webhook_subscriptions`: the previous secret and until when it is still signed with (secret
//!   rotation), since when the endpoint has failed without a success in between, and why it was
//!   disabled.
//! - `webhook_deliveries`: the delivered event's type and ordering key (its job), the latency and
//!   time of the last attempt; indexes for "what is due" and for the per-subscription log.
//! - `price_points`: the price of one capacity pool (an offer id) from a moment on, spot and
//!   on-demand, as the cloud reported it: what the ledger prices node time with.
//! - `ledger_progress`: per node, up to when its time is in the ledger.
//! - `cursors`: positions of readers that follow an append-only table (the outbox fan-out of
//!   webhooks, the ledger's scan of lost work).
//! - `team_budgets`: a team's monthly budget and the last alert sent about it.
//! - `ledger_entries.attempt`: which run of a job a line belongs to.
//!
//! SQLite alters one column per statement, hence one `alter_table` per column.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            string_null(WebhookSubscriptions::PreviousSecret),
            timestamp_with_time_zone_null(WebhookSubscriptions::PreviousSecretUntil),
            timestamp_with_time_zone_null(WebhookSubscriptions::FailingSince),
            text_null(WebhookSubscriptions::DisabledReason),
            text_null(WebhookSubscriptions::Description),
        ] {
            m.alter_table(
                Table::alter()
                    .table(WebhookSubscriptions::Table)
                    .add_column(col)
                    .to_owned(),
            )
            .await?;
        }
        m.create_index(
            Index::create()
                .name("webhook_subscriptions_by_team")
                .table(WebhookSubscriptions::Table)
                .col(WebhookSubscriptions::TeamId)
                .to_owned(),
        )
        .await?;

        for col in [
            string_null(WebhookDeliveries::EventType),
            string_null(WebhookDeliveries::Subject),
            big_integer_null(WebhookDeliveries::LatencyMs),
            timestamp_with_time_zone_null(WebhookDeliveries::LastAttemptAt),
        ] {
            m.alter_table(
                Table::alter()
                    .table(WebhookDeliveries::Table)
                    .add_column(col)
                    .to_owned(),
            )
            .await?;
        }
        m.create_index(
            Index::create()
                .name("webhook_deliveries_due")
                .table(WebhookDeliveries::Table)
                .col(WebhookDeliveries::State)
                .col(WebhookDeliveries::NextAttemptAt)
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("webhook_deliveries_by_subject")
                .table(WebhookDeliveries::Table)
                .col(WebhookDeliveries::SubscriptionId)
                .col(WebhookDeliveries::Subject)
                .col(WebhookDeliveries::OutboxId)
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("webhook_deliveries_log")
                .table(WebhookDeliveries::Table)
                .col(WebhookDeliveries::SubscriptionId)
                .col(WebhookDeliveries::Id)
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(PricePoints::Table)
                .col(big_integer(PricePoints::Id).auto_increment().primary_key())
                .col(string(PricePoints::Pool))
                .col(timestamp_with_time_zone(PricePoints::At))
                .col(big_integer(PricePoints::PriceMicros))
                .col(big_integer(PricePoints::OnDemandMicros))
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("price_points_by_pool")
                .table(PricePoints::Table)
                .col(PricePoints::Pool)
                .col(PricePoints::At)
                .unique()
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(LedgerProgress::Table)
                .col(string(LedgerProgress::NodeId).primary_key())
                .col(timestamp_with_time_zone(LedgerProgress::Until))
                .col(boolean(LedgerProgress::Closed).default(false))
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Cursors::Table)
                .col(string(Cursors::Name).primary_key())
                .col(big_integer(Cursors::Position))
                .col(timestamp_with_time_zone(Cursors::UpdatedAt))
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(TeamBudgets::Table)
                .col(string(TeamBudgets::TeamId).primary_key())
                .col(big_integer(TeamBudgets::MonthlyMicros))
                .col(string_null(TeamBudgets::AlertedMonth))
                .col(integer(TeamBudgets::AlertedPercent).default(0))
                .col(timestamp_with_time_zone(TeamBudgets::UpdatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(TeamBudgets::Table, TeamBudgets::TeamId)
                        .to(Teams::Table, Teams::Id),
                )
                .to_owned(),
        )
        .await?;

        m.alter_table(
            Table::alter()
                .table(LedgerEntries::Table)
                .add_column(integer_null(LedgerEntries::Attempt))
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("ledger_by_job")
                .table(LedgerEntries::Table)
                .col(LedgerEntries::JobId)
                .col(LedgerEntries::PeriodStart)
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("ledger_by_team")
                .table(LedgerEntries::Table)
                .col(LedgerEntries::TeamId)
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
}

#[derive(DeriveIden)]
enum WebhookSubscriptions {
    Table,
    TeamId,
    PreviousSecret,
    PreviousSecretUntil,
    FailingSince,
    DisabledReason,
    Description,
}

#[derive(DeriveIden)]
enum WebhookDeliveries {
    Table,
    Id,
    SubscriptionId,
    OutboxId,
    State,
    NextAttemptAt,
    EventType,
    Subject,
    LatencyMs,
    LastAttemptAt,
}

#[derive(DeriveIden)]
enum PricePoints {
    Table,
    Id,
    Pool,
    At,
    PriceMicros,
    OnDemandMicros,
}

#[derive(DeriveIden)]
enum LedgerProgress {
    Table,
    NodeId,
    Until,
    Closed,
}

#[derive(DeriveIden)]
enum Cursors {
    Table,
    Name,
    Position,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum TeamBudgets {
    Table,
    TeamId,
    MonthlyMicros,
    AlertedMonth,
    AlertedPercent,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum LedgerEntries {
    Table,
    JobId,
    TeamId,
    PeriodStart,
    Attempt,
}
