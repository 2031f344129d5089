//! Team secrets: names in the clear, values sealed (`crate::secrets`).
//!
//! The store seals a value as it writes it and opens values only for the one reader that needs
//! them: the agent of a node holding a live allocation of a job that refers to them
//! ([`Store::job_secrets_for_node`]). Every other read (lists, the submit check) sees names and
//! times only.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Set,
    TransactionTrait,
};
use spotplane_core::agent::{AgentSecrets, RegistryCredential};
use spotplane_core::job::JobSpec;
use spotplane_core::{JobId, NodeId};

use super::entity::{allocation, job, team_secret};
use super::{Store, StoreError, from_json, is_unique_violation, new_uuid};
use crate::model::{Page, PageRequest, Secret};
use crate::secrets::{SecretName, SecretsKey};

/// What [`Store::put_team_secret`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretWrite {
    Created(Secret),
    Replaced(Secret),
}

fn secret_from_row(row: &team_secret::Model) -> Secret {
    Secret {
        name: row.name.clone(),
        created_at: row.created_at,
        updated_at: row.updated_at,
    }
}

/// A sealed row that does not open, said without its bytes.
fn unreadable(row: &team_secret::Model, e: crate::secrets::OpenError) -> StoreError {
    StoreError::corrupt(
        "team_secrets",
        &row.id,
        format!("team secret {}: {e}", row.name),
    )
}

impl Store {
    /// Sets the team's secret `name` to `value` (validated by the caller), creating it or
    /// replacing its value.
    pub async fn put_team_secret(
        &self,
        key: &SecretsKey,
        team_id: &str,
        name: &str,
        value: &str,
        now: DateTime<Utc>,
    ) -> Result<SecretWrite, StoreError> {
        self.measured("put_team_secret", || async {
            let sealed = key.seal(team_id, name, value);
            let txn = self.write.begin().await?;
            let existing = team_secret::Entity::find()
                .filter(team_secret::Column::TeamId.eq(team_id))
                .filter(team_secret::Column::Name.eq(name))
                .one(&txn)
                .await?;
            let written = match existing {
                Some(row) => {
                    let mut am: team_secret::ActiveModel = row.into();
                    am.sealed = Set(sealed);
                    am.updated_at = Set(now);
                    SecretWrite::Replaced(secret_from_row(&am.update(&txn).await?))
                }
                None => {
                    let row = team_secret::ActiveModel {
                        id: Set(new_uuid(now).to_string()),
                        team_id: Set(team_id.to_owned()),
                        name: Set(name.to_owned()),
                        sealed: Set(sealed),
                        created_at: Set(now),
                        updated_at: Set(now),
                    };
                    match row.insert(&txn).await {
                        Ok(m) => SecretWrite::Created(secret_from_row(&m)),
                        Err(e) if is_unique_violation(&e) => {
                            return Err(StoreError::Conflict(format!(
                                "secret {name} was being created by another request at the same time; send it again"
                            )));
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            txn.commit().await?;
            Ok(written)
        })
        .await
    }

    /// One page of the team's secrets, by name: names and times only.
    pub async fn list_team_secrets(
        &self,
        team_id: &str,
        page: &PageRequest<SecretName>,
    ) -> Result<Page<Secret>, StoreError> {
        self.measured("list_team_secrets", || async {
            // Only the columns shown: the sealed values stay in the database.
            let mut q = team_secret::Entity::find()
                .select_only()
                .columns([
                    team_secret::Column::Name,
                    team_secret::Column::CreatedAt,
                    team_secret::Column::UpdatedAt,
                ])
                .filter(team_secret::Column::TeamId.eq(team_id))
                .order_by_asc(team_secret::Column::Name)
                .limit(page.rows_to_read());
            if let Some(after) = &page.after {
                q = q.filter(team_secret::Column::Name.gt(after.as_str()));
            }
            let rows: Vec<(String, DateTime<Utc>, DateTime<Utc>)> =
                q.into_tuple().all(&self.read).await?;
            let (rows, next_cursor) = page.cut(rows, |r| r.0.clone());
            Ok(Page {
                items: rows
                    .into_iter()
                    .map(|(name, created_at, updated_at)| Secret {
                        name,
                        created_at,
                        updated_at,
                    })
                    .collect(),
                next_cursor,
            })
        })
        .await
    }

    /// Deletes the team's secret `name`. Jobs that refer to it fail to start from now on.
    pub async fn delete_team_secret(&self, team_id: &str, name: &str) -> Result<(), StoreError> {
        self.measured("delete_team_secret", || async {
            let done = team_secret::Entity::delete_many()
                .filter(team_secret::Column::TeamId.eq(team_id))
                .filter(team_secret::Column::Name.eq(name))
                .exec(&self.write)
                .await?;
            if done.rows_affected == 0 {
                return Err(StoreError::NotFound(format!("secret {name}")));
            }
            Ok(())
        })
        .await
    }

    /// Those of `names` the team has no secret of.
    pub async fn missing_team_secrets(
        &self,
        team_id: &str,
        names: &BTreeSet<&str>,
    ) -> Result<BTreeSet<String>, StoreError> {
        if names.is_empty() {
            return Ok(BTreeSet::new());
        }
        self.measured("missing_team_secrets", || async {
            let found: Vec<String> = team_secret::Entity::find()
                .select_only()
                .column(team_secret::Column::Name)
                .filter(team_secret::Column::TeamId.eq(team_id))
                .filter(team_secret::Column::Name.is_in(names.iter().copied()))
                .into_tuple()
                .all(&self.read)
                .await?;
            Ok(names
                .iter()
                .filter(|n| !found.iter().any(|f| f == *n))
                .map(|n| (*n).to_owned())
                .collect())
        })
        .await
    }

    /// The value of the team's secret `name`, if it has one.
    pub async fn team_secret_value(
        &self,
        key: &SecretsKey,
        team_id: &str,
        name: &str,
    ) -> Result<Option<String>, StoreError> {
        self.measured("team_secret_value", || async {
            let Some(row) = team_secret::Entity::find()
                .filter(team_secret::Column::TeamId.eq(team_id))
                .filter(team_secret::Column::Name.eq(name))
                .one(&self.read)
                .await?
            else {
                return Ok(None);
            };
            key.open(team_id, name, &row.sealed)
                .map(Some)
                .map_err(|e| unreadable(&row, e))
        })
        .await
    }

    /// The values of the secrets job `job_id` refers to, for the agent of `node_id`: only while
    /// that node holds a live (unreleased) allocation of the job; otherwise the job is not
    /// found, as for any job that is not the node's. A secret deleted since the job was
    /// submitted, or a pull secret that is not `username:password`, is a conflict naming it
    /// (never its value): the replica cannot start.
    pub async fn job_secrets_for_node(
        &self,
        key: &SecretsKey,
        node_id: NodeId,
        job_id: JobId,
    ) -> Result<AgentSecrets, StoreError> {
        self.measured("job_secrets_for_node", || async {
            let not_found = || StoreError::NotFound(format!("job {job_id} on this node"));
            let live = allocation::Entity::find()
                .filter(allocation::Column::JobId.eq(job_id.to_string()))
                .filter(allocation::Column::NodeId.eq(node_id.to_string()))
                .filter(allocation::Column::ReleasedAt.is_null())
                .one(&self.read)
                .await?
                .is_some();
            if !live {
                return Err(not_found());
            }
            let row = job::Entity::find_by_id(job_id.to_string())
                .one(&self.read)
                .await?
                .ok_or_else(not_found)?;
            let spec: JobSpec = from_json("jobs", &row.id, row.spec.clone())?;
            let names: BTreeSet<&str> = spec
                .secrets
                .values()
                .map(String::as_str)
                .chain(spec.image_pull_secret.as_deref())
                .collect();
            let rows: BTreeMap<String, team_secret::Model> = if names.is_empty() {
                BTreeMap::new()
            } else {
                team_secret::Entity::find()
                    .filter(team_secret::Column::TeamId.eq(row.team_id.clone()))
                    .filter(team_secret::Column::Name.is_in(names.iter().copied()))
                    .all(&self.read)
                    .await?
                    .into_iter()
                    .map(|r| (r.name.clone(), r))
                    .collect()
            };
            let team = spec
                .team
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_else(|| row.team_id.clone());
            let mut missing: Vec<String> = spec
                .secrets
                .iter()
                .filter(|(_, name)| !rows.contains_key(*name))
                .map(|(var, name)| format!("secrets.{var} ({name})"))
                .collect();
            if let Some(name) = spec
                .image_pull_secret
                .as_ref()
                .filter(|n| !rows.contains_key(*n))
            {
                missing.push(format!("image_pull_secret ({name})"));
            }
            if !missing.is_empty() {
                return Err(StoreError::Conflict(format!(
                    "team {team} no longer has the secrets this job refers to: {}; set them again with POST /v1/teams/{team}/secrets",
                    missing.join(", ")
                )));
            }
            let open = |name: &str| -> Result<String, StoreError> {
                let r = rows.get(name).ok_or_else(not_found)?;
                key.open(&row.team_id, name, &r.sealed)
                    .map_err(|e| unreadable(r, e))
            };
            let mut env = BTreeMap::new();
            for (var, name) in &spec.secrets {
                env.insert(var.clone(), open(name)?);
            }
            let registry = match &spec.image_pull_secret {
                None => None,
                Some(name) => Some(RegistryCredential::parse(&open(name)?).ok_or_else(|| {
                    StoreError::Conflict(format!(
                        "image_pull_secret: team secret {name} does not hold a registry login as username:password"
                    ))
                })?),
            };
            Ok(AgentSecrets { env, registry })
        })
        .await
    }
}

/// What [`Store::reseal_secrets`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResealReport {
    /// Team secrets rewritten under the current key.
    pub team_secrets: usize,
    /// Webhook subscriptions whose signing secrets were rewritten under the current key.
    pub webhook_subscriptions: usize,
    /// Rows already sealed under the current key, left alone.
    pub already_current: usize,
}

impl Store {
    /// Seals every team secret and webhook signing secret under `key`'s current key, so that
    /// `secrets.previous_keys` can be removed afterwards.
    ///
    /// Every row is opened first; if any does not open (with the current key or a previous
    /// one), nothing is written and the error names each such row. Each row is then rewritten
    /// only if it still holds what was read: one changed meanwhile was sealed under the
    /// current key by its writer. Running it again does nothing.
    pub async fn reseal_secrets(&self, key: &SecretsKey) -> Result<ResealReport, StoreError> {
        let mut failed: Vec<StoreError> = Vec::new();
        let rows = team_secret::Entity::find().all(&self.read).await?;
        let mut team_todo = Vec::new();
        let mut report = ResealReport::default();
        for row in rows {
            match key.open_detailed(&row.team_id, &row.name, &row.sealed) {
                Ok(o) if o.under_current => report.already_current += 1,
                Ok(o) => team_todo.push((row, o.value)),
                Err(e) => failed.push(unreadable(&row, e)),
            }
        }
        let (hooks, hook_failed) = self.open_webhook_rows(key).await?;
        failed.extend(hook_failed);
        if let Some(first) = failed.first() {
            let (table, id) = match first {
                StoreError::Corrupt { table, id, .. } => (*table, id.clone()),
                _ => ("team_secrets", String::new()),
            };
            let all: Vec<String> = failed.iter().map(ToString::to_string).collect();
            return Err(StoreError::corrupt(
                table,
                id,
                format!(
                    "{} row(s) cannot be opened, so nothing was resealed; add the key they were sealed under to secrets.previous_keys, or delete them: {}",
                    failed.len(),
                    all.join("; ")
                ),
            ));
        }
        let total_hooks = hooks.len();
        for (row, value) in team_todo {
            let sealed = key.seal(&row.team_id, &row.name, &value);
            let done = self
                .measured("reseal_team_secret", || async {
                    Ok(team_secret::Entity::update_many()
                        .col_expr(
                            team_secret::Column::Sealed,
                            sea_orm::sea_query::Expr::value(sealed.clone()),
                        )
                        .filter(team_secret::Column::Id.eq(row.id.clone()))
                        .filter(team_secret::Column::Sealed.eq(row.sealed.clone()))
                        .exec(&self.write)
                        .await?)
                })
                .await?;
            report.team_secrets += usize::try_from(done.rows_affected).unwrap_or(0);
        }
        report.webhook_subscriptions = self
            .reseal_webhook_rows(key, hooks, super::webhooks::Reseal::NotUnderCurrent)
            .await?;
        report.already_current += total_hooks - report.webhook_subscriptions.min(total_hooks);
        Ok(report)
    }
}
