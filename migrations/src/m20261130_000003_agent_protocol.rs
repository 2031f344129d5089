//! The node agent's protocol: one-time bootstrap tokens per node, the commands queued for each
//! node's agent with their results, what each agent last reported, and who reported a
//! checkpoint (and why it was not durable).

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(AgentBootstrapTokens::Table)
                .col(string(AgentBootstrapTokens::Id).primary_key())
                .col(string(AgentBootstrapTokens::NodeId))
                .col(string_uniq(AgentBootstrapTokens::SecretHash))
                .col(timestamp_with_time_zone(AgentBootstrapTokens::CreatedAt))
                .col(timestamp_with_time_zone(AgentBootstrapTokens::ExpiresAt))
                .col(timestamp_with_time_zone_null(AgentBootstrapTokens::UsedAt))
                .col(timestamp_with_time_zone_null(
                    AgentBootstrapTokens::RevokedAt,
                ))
                .foreign_key(
                    ForeignKey::create()
                        .from(AgentBootstrapTokens::Table, AgentBootstrapTokens::NodeId)
                        .to(Nodes::Table, Nodes::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("agent_bootstrap_tokens_by_node")
                .table(AgentBootstrapTokens::Table)
                .col(AgentBootstrapTokens::NodeId)
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(AgentCommands::Table)
                .col(string(AgentCommands::Id).primary_key())
                .col(string(AgentCommands::NodeId))
                .col(string(AgentCommands::Kind))
                .col(json_binary(AgentCommands::Body))
                .col(timestamp_with_time_zone(AgentCommands::CreatedAt))
                .col(timestamp_with_time_zone_null(AgentCommands::DeliveredAt))
                .col(integer(AgentCommands::Deliveries).default(0))
                .col(timestamp_with_time_zone_null(AgentCommands::CompletedAt))
                .col(boolean_null(AgentCommands::Ok))
                .col(json_binary_null(AgentCommands::Result))
                .foreign_key(
                    ForeignKey::create()
                        .from(AgentCommands::Table, AgentCommands::NodeId)
                        .to(Nodes::Table, Nodes::Id),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("agent_commands_by_node")
                .table(AgentCommands::Table)
                .col(AgentCommands::NodeId)
                .col(AgentCommands::CompletedAt)
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(NodeAgents::Table)
                .col(string(NodeAgents::NodeId).primary_key())
                .col(integer(NodeAgents::ProtocolVersion))
                .col(string(NodeAgents::AgentVersion))
                .col(string(NodeAgents::Hostname))
                .col(string_null(NodeAgents::InstanceId))
                .col(json_binary(NodeAgents::Inventory))
                .col(timestamp_with_time_zone(NodeAgents::RegisteredAt))
                .col(timestamp_with_time_zone_null(NodeAgents::LastHeartbeatAt))
                .col(big_integer_null(NodeAgents::ClockSkewMs))
                .col(big_integer(NodeAgents::Heartbeats).default(0))
                .col(json_binary(NodeAgents::Telemetry))
                .col(json_binary(NodeAgents::Replicas))
                .col(json_binary_null(NodeAgents::Notice))
                .foreign_key(
                    ForeignKey::create()
                        .from(NodeAgents::Table, NodeAgents::NodeId)
                        .to(Nodes::Table, Nodes::Id),
                )
                .to_owned(),
        )
        .await?;

        // SQLite adds one column per ALTER TABLE.
        m.alter_table(
            Table::alter()
                .table(Checkpoints::Table)
                .add_column(string_null(Checkpoints::NodeId))
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Checkpoints::Table)
                .add_column(string_null(Checkpoints::Message))
                .to_owned(),
        )
        .await
    }
}

#[derive(DeriveIden)]
enum AgentBootstrapTokens {
    Table,
    Id,
    NodeId,
    SecretHash,
    CreatedAt,
    ExpiresAt,
    UsedAt,
    RevokedAt,
}

#[derive(DeriveIden)]
enum AgentCommands {
    Table,
    Id,
    NodeId,
    Kind,
    Body,
    CreatedAt,
    DeliveredAt,
    Deliveries,
    CompletedAt,
    Ok,
    Result,
}

#[derive(DeriveIden)]
enum NodeAgents {
    Table,
    NodeId,
    ProtocolVersion,
    AgentVersion,
    Hostname,
    InstanceId,
    Inventory,
    RegisteredAt,
    LastHeartbeatAt,
    ClockSkewMs,
    Heartbeats,
    Telemetry,
    Replicas,
    Notice,
}

#[derive(DeriveIden)]
enum Nodes {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Checkpoints {
    Table,
    NodeId,
    Message,
}
