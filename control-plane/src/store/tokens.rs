//! API tokens.
//!
//! A token is 32 random bytes, shown to its owner once as `spt_<base64url>`; the store keeps
//! only its SHA-256. A slow password hash would add nothing here: the secret has 256 bits of
//! entropy, so a stolen hash cannot be reversed by guessing, and a fast hash keeps
//! authentication off the request latency budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionTrait,
};
use sha2::{Digest, Sha256};
use spotplane_core::{NodeId, NodeState, TeamName, TokenId};

use super::entity::{api_token, node, team};
use super::{Store, StoreError, new_uuid, parse_col};
use crate::model::{Page, PageRequest, Role, Token};

/// A token to create.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub name: String,
    pub role: Role,
    /// The team's internal id and name, for a `team` token.
    pub team: Option<(String, TeamName)>,
    pub node_id: Option<NodeId>,
    pub expires_at: Option<DateTime<Utc>>,
}

/// Who is calling: what an authenticated token stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    pub token_id: TokenId,
    pub role: Role,
    /// Internal id and name of the team of a `team` token.
    pub team: Option<(String, TeamName)>,
    pub node_id: Option<NodeId>,
    pub expires_at: Option<DateTime<Utc>>,
}

/// Principals of recently seen secrets, by hash, so that most requests authenticate without a
/// query. An entry lives [`TOKEN_CACHE_TTL`]; revoking a token clears this replica's cache at
/// once, and other replicas (on a shared PostgreSQL) stop accepting it within the TTL. Expiry
/// is checked on every hit. Unknown secrets are never cached.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenCache {
    entries: Arc<Mutex<HashMap<String, (Principal, Instant)>>>,
}

pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(5);
const TOKEN_CACHE_MAX: usize = 10_000;

impl TokenCache {
    fn get(&self, hash: &str, now: DateTime<Utc>) -> Option<Principal> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (p, at) = entries.get(hash)?;
        let live = at.elapsed() < TOKEN_CACHE_TTL && p.expires_at.is_none_or(|e| e > now);
        live.then(|| p.clone())
    }

    fn put(&self, hash: String, p: Principal) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= TOKEN_CACHE_MAX {
            entries.retain(|_, (_, at)| at.elapsed() < TOKEN_CACHE_TTL);
            if entries.len() >= TOKEN_CACHE_MAX {
                entries.clear();
            }
        }
        entries.insert(hash, (p, Instant::now()));
    }

    pub(super) fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

/// Prefix of every secret spotplane issues.
pub const SECRET_PREFIX: &str = "spt_";
/// Characters of the secret kept in the clear to tell tokens apart: `spt_` and four random
/// characters of an issued token.
const SHOWN_PREFIX_LEN: usize = 8;

/// SHA-256 of a secret, hex.
pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A new random secret.
pub fn generate_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!(
        "{SECRET_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// The part of a secret that is stored and shown in the clear: [`SHOWN_PREFIX_LEN`] characters,
/// and never more than a quarter of the secret, so a short secret chosen by a person (the
/// bootstrap admin token may be 16 characters) keeps at least three quarters of it unknown.
pub(super) fn shown_prefix(secret: &str) -> String {
    let shown = SHOWN_PREFIX_LEN.min(secret.chars().count() / 4);
    secret.chars().take(shown).collect()
}

async fn token_from_row<C: sea_orm::ConnectionTrait>(
    conn: &C,
    row: api_token::Model,
) -> Result<Token, StoreError> {
    let team = match &row.team_id {
        Some(tid) => {
            let t = team::Entity::find_by_id(tid.clone())
                .one(conn)
                .await?
                .ok_or_else(|| {
                    StoreError::corrupt("api_tokens", &row.id, format!("team {tid} does not exist"))
                })?;
            Some(parse_col::<TeamName>("teams", &t.id, &t.name)?)
        }
        None => None,
    };
    Ok(Token {
        id: parse_col("api_tokens", &row.id, &row.id)?,
        role: Role::parse(&row.role).ok_or_else(|| {
            StoreError::corrupt("api_tokens", &row.id, format!("role {:?}", row.role))
        })?,
        node_id: row
            .node_id
            .as_deref()
            .map(|n| parse_col("api_tokens", &row.id, n))
            .transpose()?,
        team,
        name: row.name,
        // Rows written before prefixes were shortened hold 12 characters: show what is
        // shown today, never more.
        prefix: row.prefix.chars().take(SHOWN_PREFIX_LEN).collect(),
        created_at: row.created_at,
        expires_at: row.expires_at,
        revoked_at: row.revoked_at,
    })
}

/// What bootstrapping the first admin token did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bootstrap {
    /// No admin token existed; the given one was stored.
    Created,
    /// The given token is already a live admin token.
    AlreadyPresent,
    /// Other admin tokens exist; the given one was not added.
    Skipped,
}

impl Store {
    /// Creates a token with a fresh secret; returns the token and the secret (shown once).
    pub async fn create_token(
        &self,
        new: NewToken,
        now: DateTime<Utc>,
    ) -> Result<(Token, String), StoreError> {
        let secret = generate_secret();
        let token = self.insert_token(&new, &secret, now).await?;
        Ok((token, secret))
    }

    async fn insert_token(
        &self,
        new: &NewToken,
        secret: &str,
        now: DateTime<Utc>,
    ) -> Result<Token, StoreError> {
        self.measured("create_token", || async {
            let row = api_token::ActiveModel {
                id: Set(new_uuid(now).to_string()),
                name: Set(new.name.clone()),
                role: Set(new.role.as_str().to_owned()),
                team_id: Set(new.team.as_ref().map(|(id, _)| id.clone())),
                node_id: Set(new.node_id.map(|n| n.to_string())),
                secret_hash: Set(hash_secret(secret)),
                prefix: Set(shown_prefix(secret)),
                created_at: Set(now),
                expires_at: Set(new.expires_at),
                revoked_at: Set(None),
            }
            .insert(&self.write)
            .await?;
            token_from_row(&self.read, row).await
        })
        .await
    }

    /// Stores `secret` as an admin token if no live admin token exists yet.
    pub async fn bootstrap_admin(
        &self,
        secret: &str,
        now: DateTime<Utc>,
    ) -> Result<Bootstrap, StoreError> {
        let live_admins = self
            .measured("count_admin_tokens", || async {
                Ok(api_token::Entity::find()
                    .filter(api_token::Column::Role.eq(Role::Admin.as_str()))
                    .filter(api_token::Column::RevokedAt.is_null())
                    .all(&self.read)
                    .await?)
            })
            .await?;
        let hash = hash_secret(secret);
        if live_admins.iter().any(|t| t.secret_hash == hash) {
            return Ok(Bootstrap::AlreadyPresent);
        }
        if !live_admins.is_empty() {
            return Ok(Bootstrap::Skipped);
        }
        let new = NewToken {
            name: "bootstrap".into(),
            role: Role::Admin,
            team: None,
            node_id: None,
            expires_at: None,
        };
        self.insert_token(&new, secret, now).await?;
        Ok(Bootstrap::Created)
    }

    /// The principal a secret stands for, if it is a live token.
    pub async fn authenticate(
        &self,
        secret: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Principal>, StoreError> {
        let hash = hash_secret(secret);
        if let Some(p) = self.tokens.get(&hash, now) {
            return Ok(Some(p));
        }
        let found = self
            .measured("authenticate", || async {
                let Some(row) = api_token::Entity::find()
                    .filter(api_token::Column::SecretHash.eq(hash.as_str()))
                    .filter(api_token::Column::RevokedAt.is_null())
                    .filter(
                        Condition::any()
                            .add(api_token::Column::ExpiresAt.is_null())
                            .add(api_token::Column::ExpiresAt.gt(now)),
                    )
                    .one(&self.read)
                    .await?
                else {
                    return Ok(None);
                };
                let token = token_from_row(&self.read, row.clone()).await?;
                // A node's credential lives only as long as its node: once the node is
                // terminated (or has no row), the agent on it is no one. The node's
                // termination also revokes it (`transition_node`); this holds for tokens of
                // nodes terminated before that, and whatever else ends a node.
                if token.role == Role::Agent
                    && let Some(n) = token.node_id
                {
                    let state = node::Entity::find_by_id(n.to_string())
                        .one(&self.read)
                        .await?
                        .map(|r| parse_col::<NodeState>("nodes", &r.id, &r.state))
                        .transpose()?;
                    if state.is_none_or(NodeState::is_terminal) {
                        return Ok(None);
                    }
                }
                let team = match (row.team_id, token.team) {
                    (Some(id), Some(name)) => Some((id, name)),
                    _ => None,
                };
                Ok(Some(Principal {
                    token_id: token.id,
                    role: token.role,
                    team,
                    node_id: token.node_id,
                    expires_at: token.expires_at,
                }))
            })
            .await?;
        if let Some(p) = &found {
            self.tokens.put(hash, p.clone());
        }
        Ok(found)
    }

    /// Tokens, newest first; only those of `team_id` when given.
    /// One page of the tokens (of one team when `team_id` is given), newest first.
    pub async fn list_tokens(
        &self,
        team_id: Option<&str>,
        page: &PageRequest<TokenId>,
    ) -> Result<Page<Token>, StoreError> {
        self.measured("list_tokens", || async {
            let mut q = api_token::Entity::find()
                .order_by_desc(api_token::Column::Id)
                .limit(page.rows_to_read());
            if let Some(t) = team_id {
                q = q.filter(api_token::Column::TeamId.eq(t));
            }
            if let Some(after) = page.after {
                q = q.filter(api_token::Column::Id.lt(after.to_string()));
            }
            let (rows, next_cursor) = page.cut(q.all(&self.read).await?, |r| r.id.clone());
            let mut items = Vec::with_capacity(rows.len());
            for r in rows {
                items.push(token_from_row(&self.read, r).await?);
            }
            Ok(Page { items, next_cursor })
        })
        .await
    }

    /// Revokes a token. Revoking a revoked token changes nothing; revoking the last live admin
    /// token is refused, so the cluster cannot lock its administrators out.
    pub async fn revoke_token(&self, id: TokenId, now: DateTime<Utc>) -> Result<Token, StoreError> {
        self.measured("revoke_token", || async {
            let txn = self.write.begin().await?;
            let row = api_token::Entity::find_by_id(id.to_string())
                .one(&txn)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("token {id}")))?;
            if row.revoked_at.is_some() {
                txn.commit().await?;
                return token_from_row(&self.read, row).await;
            }
            if row.role == Role::Admin.as_str() {
                let live = api_token::Entity::find()
                    .filter(api_token::Column::Role.eq(Role::Admin.as_str()))
                    .filter(api_token::Column::RevokedAt.is_null())
                    .count(&txn)
                    .await?;
                if live <= 1 {
                    return Err(StoreError::Conflict(
                        "this is the last live admin token; create another before revoking it"
                            .into(),
                    ));
                }
            }
            api_token::Entity::update_many()
                .col_expr(api_token::Column::RevokedAt, Expr::value(now))
                .filter(api_token::Column::Id.eq(row.id.clone()))
                .exec(&txn)
                .await?;
            let updated = api_token::Entity::find_by_id(id.to_string())
                .one(&txn)
                .await?
                .ok_or_else(|| StoreError::NotFound(format!("token {id}")))?;
            txn.commit().await?;
            self.tokens.clear();
            token_from_row(&self.read, updated).await
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_long_random_and_prefixed() {
        let a = generate_secret();
        let b = generate_secret();
        assert_ne!(a, b);
        assert!(a.starts_with(SECRET_PREFIX));
        assert_eq!(a.len(), SECRET_PREFIX.len() + 43);
        assert_eq!(hash_secret(&a).len(), 64);
        assert_eq!(shown_prefix(&a).len(), SHOWN_PREFIX_LEN);
    }

    #[test]
    fn a_short_secret_shows_at_most_a_quarter_of_itself() {
        // The bootstrap admin token may be as short as 16 characters.
        let bootstrap = "0123456789abcdef";
        assert_eq!(shown_prefix(bootstrap), "0123");
        let long = "spt_test_admin_token_000000000000";
        assert_eq!(shown_prefix(long), "spt_test");
        for secret in [bootstrap, long, &generate_secret()] {
            let shown = shown_prefix(secret).chars().count();
            let hidden = secret.chars().count() - shown;
            assert!(hidden * 4 >= secret.chars().count() * 3, "{secret}");
        }
    }
}
