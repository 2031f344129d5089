use sea_orm::entity::prelude::*;

#[derive(Clone, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "team_secrets")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub team_id: String,
    pub name: String,
    /// Nonce, ciphertext and tag (`crate::secrets::SecretsKey::seal`); never the value.
    pub sealed: Vec<u8>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

/// Shows the row without its sealed bytes.
impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("team_secret::Model")
            .field("id", &self.id)
            .field("team_id", &self.team_id)
            .field("name", &self.name)
            .field("sealed", &format_args!("<{} bytes>", self.sealed.len()))
            .finish()
    }
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
