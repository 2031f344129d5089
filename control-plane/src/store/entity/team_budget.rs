use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "team_budgets")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub team_id: String,
    pub monthly_micros: i64,
    /// `YYYY-MM` of the last alert, and the highest threshold (percent) alerted that month.
    pub alerted_month: Option<String>,
    pub alerted_percent: i32,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
