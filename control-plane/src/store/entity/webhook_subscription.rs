use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_subscriptions")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub team_id: String,
    pub url: String,
    pub secret: String,
    pub event_types: Json,
    pub enabled: bool,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    /// The secret before the last rotation, still signed with until `previous_secret_until`.
    pub previous_secret: Option<String>,
    pub previous_secret_until: Option<DateTimeUtc>,
    /// Since when every attempt failed (cleared by a success).
    pub failing_since: Option<DateTimeUtc>,
    pub disabled_reason: Option<String>,
    pub description: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
