//! Teams.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionTrait,
};
use spotplane_core::TeamName;
use spotplane_core::team::{Quota, QuotaResource};

use super::entity::team;
use super::{Store, StoreError, from_json, is_unique_violation, new_uuid, parse_col};
use crate::model::{Page, PageRequest, Team};

/// A team to create; validated by the caller.
#[derive(Debug, Clone)]
pub struct NewTeam {
    pub name: TeamName,
    pub weight: f64,
    pub cohort: Option<String>,
    pub quotas: BTreeMap<QuotaResource, Quota>,
}

/// Changes to a team; `None` leaves a setting alone, `Some(None)` clears the cohort.
#[derive(Debug, Clone, Default)]
pub struct TeamPatch {
    pub weight: Option<f64>,
    pub cohort: Option<Option<String>>,
    pub quotas: Option<BTreeMap<QuotaResource, Quota>>,
}

pub(crate) fn team_from_row(row: team::Model) -> Result<Team, StoreError> {
    Ok(Team {
        name: parse_col("teams", &row.id, &row.name)?,
        quotas: from_json("teams", &row.id, row.quotas)?,
        weight: row.weight,
        cohort: row.cohort,
        created_at: row.created_at,
        updated_at: row.updated_at,
        id: row.id,
    })
}

/// Every team's name, by id.
pub(crate) async fn team_names<C: ConnectionTrait>(
    conn: &C,
) -> Result<std::collections::HashMap<String, String>, StoreError> {
    Ok(team::Entity::find()
        .select_only()
        .columns([team::Column::Id, team::Column::Name])
        .into_tuple::<(String, String)>()
        .all(conn)
        .await?
        .into_iter()
        .collect())
}

impl Store {
    /// Creates a team; a taken name is a conflict.
    pub async fn create_team(&self, new: NewTeam, now: DateTime<Utc>) -> Result<Team, StoreError> {
        self.measured("create_team", || async {
            let quotas = serde_json::to_value(&new.quotas)
                .map_err(|e| StoreError::Conflict(e.to_string()))?;
            let row = team::ActiveModel {
                id: Set(new_uuid(now).to_string()),
                name: Set(new.name.to_string()),
                weight: Set(new.weight),
                cohort: Set(new.cohort.clone()),
                quotas: Set(quotas),
                created_at: Set(now),
                updated_at: Set(now),
            };
            match row.insert(&self.write).await {
                Ok(m) => team_from_row(m),
                Err(e) if is_unique_violation(&e) => Err(StoreError::Conflict(format!(
                    "a team named {} already exists",
                    new.name
                ))),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    /// One page of the teams, by name.
    pub async fn list_teams(&self, page: &PageRequest<TeamName>) -> Result<Page<Team>, StoreError> {
        self.measured("list_teams", || async {
            let mut q = team::Entity::find()
                .order_by_asc(team::Column::Name)
                .limit(page.rows_to_read());
            if let Some(after) = &page.after {
                q = q.filter(team::Column::Name.gt(after.as_str()));
            }
            let (rows, next_cursor) = page.cut(q.all(&self.read).await?, |r| r.name.clone());
            Ok(Page {
                items: rows
                    .into_iter()
                    .map(team_from_row)
                    .collect::<Result<_, _>>()?,
                next_cursor,
            })
        })
        .await
    }

    pub async fn get_team(&self, name: &str) -> Result<Team, StoreError> {
        self.measured("get_team", || async {
            let row = team::Entity::find()
                .filter(team::Column::Name.eq(name))
                .one(&self.read)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("team {name}")))?;
            team_from_row(row)
        })
        .await
    }

    pub async fn update_team(
        &self,
        name: &str,
        patch: TeamPatch,
        now: DateTime<Utc>,
    ) -> Result<Team, StoreError> {
        self.measured("update_team", || async {
            let txn = self.write.begin().await?;
            let row = team::Entity::find()
                .filter(team::Column::Name.eq(name))
                .one(&txn)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("team {name}")))?;
            let mut am: team::ActiveModel = row.into();
            if let Some(w) = patch.weight {
                am.weight = Set(w);
            }
            if let Some(c) = &patch.cohort {
                am.cohort = Set(c.clone());
            }
            if let Some(q) = &patch.quotas {
                am.quotas =
                    Set(serde_json::to_value(q).map_err(|e| StoreError::Conflict(e.to_string()))?);
            }
            am.updated_at = Set(now);
            let updated = am.update(&txn).await?;
            txn.commit().await?;
            team_from_row(updated)
        })
        .await
    }
}
