//! Webhook subscriptions and deliveries.
//!
//! Delivery state lives here, not in memory: a delivery row per (subscription, outbox event)
//! is made by the fan-out (which follows the outbox with a stored cursor), and every attempt
//! is recorded on it in one transaction with its consequences (the endpoint's failure streak,
//! disabling it, the `webhook.disabled` event). A control plane that restarts finds every
//! pending delivery where it was and carries on: at least once, never lost.
//!
//! Signing secrets are stored sealed (`crate::secrets`, bound to the subscription's id and the
//! column) in their text columns as `sealed:v1:<base64>`. Rows written before sealing hold
//! `whsec_…` in the clear: they are still read, and [`Store::seal_clear_webhook_secrets`]
//! (run at every start) seals them.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionTrait,
};
use serde_json::{Value, json};

use super::entity::{allocation, job, outbox, team, webhook_delivery, webhook_subscription};
use super::finance::get_cursor;
use super::{Store, StoreError, from_json, new_uuid, parse_col};
use crate::model::{Delivery, Page, PageRequest, Subscription};
use crate::secrets::{SecretsKey, WebhookSlot};
use crate::webhooks::EventType;
use crate::webhooks::retry::{Next, Outcome, RetryPolicy, should_disable};
use crate::webhooks::signing::Secret;

const FAN_OUT_CURSOR: &str = "webhooks.outbox";

/// A subscription to create; validated by the caller.
#[derive(Debug, Clone)]
pub struct NewSubscription {
    pub team_id: String,
    pub url: String,
    pub event_types: Vec<EventType>,
    pub description: Option<String>,
    pub secret: Secret,
}

/// Changes to a subscription; `None` leaves a field alone.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionPatch {
    pub url: Option<String>,
    pub event_types: Option<Vec<EventType>>,
    pub description: Option<Option<String>>,
    pub enabled: Option<bool>,
}

/// A delivery due now, with everything an attempt needs.
#[derive(Debug, Clone)]
pub struct DueDelivery {
    pub id: String,
    pub subscription_id: String,
    pub url: String,
    pub secret: Secret,
    /// The rotated-out secret and until when it still signs.
    pub previous: Option<(Secret, DateTime<Utc>)>,
    /// Attempts made so far.
    pub attempts: u32,
    pub event_type: EventType,
    pub outbox_id: i64,
    pub event_at: DateTime<Utc>,
    pub payload: Value,
}

impl DueDelivery {
    /// The secrets to sign with at `now`: the current one, and the previous during overlap.
    pub fn secrets(&self, now: DateTime<Utc>) -> Vec<&Secret> {
        let mut v = vec![&self.secret];
        if let Some((s, until)) = &self.previous
            && *until > now
        {
            v.push(s);
        }
        v
    }
}

fn event_types_of(row: &webhook_subscription::Model) -> Result<Vec<String>, StoreError> {
    from_json("webhook_subscriptions", &row.id, row.event_types.clone())
}

fn subscription_from_row(
    row: webhook_subscription::Model,
    team_name: &str,
) -> Result<Subscription, StoreError> {
    Ok(Subscription {
        team: parse_col("teams", &row.team_id, team_name)?,
        event_types: event_types_of(&row)?,
        id: row.id,
        url: row.url,
        description: row.description,
        enabled: row.enabled,
        disabled_reason: row.disabled_reason,
        failing_since: row.failing_since,
        previous_secret_until: row.previous_secret_until,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

fn delivery_from_row(r: webhook_delivery::Model) -> Delivery {
    Delivery {
        id: r.id,
        event_id: r.outbox_id,
        event_type: r.event_type,
        state: r.state,
        attempts: u32::try_from(r.attempts).unwrap_or(0),
        last_status: r.last_status.and_then(|s| u16::try_from(s).ok()),
        last_error: r.last_error,
        latency_ms: r.latency_ms,
        created_at: r.created_at,
        last_attempt_at: r.last_attempt_at,
        next_attempt_at: r.next_attempt_at,
        delivered_at: r.delivered_at,
    }
}

/// What starts a sealed signing secret in its text column; a clear one starts with `whsec_`.
pub(crate) const SEALED_PREFIX: &str = "sealed:v1:";

/// How a stored signing secret was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    /// `whsec_…` in the clear, from before secrets were sealed.
    Clear,
    /// Sealed under the current key.
    Current,
    /// Sealed under one of `secrets.previous_keys`.
    PreviousKey,
}

/// The text column's value for `secret` in `slot` of subscription `id`.
pub(crate) fn seal_secret(
    key: &SecretsKey,
    id: &str,
    slot: WebhookSlot,
    secret: &Secret,
) -> String {
    use base64::Engine;
    let sealed = key.seal_webhook(id, slot, &secret.expose());
    format!(
        "{SEALED_PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(sealed)
    )
}

/// Reads a stored signing secret, sealed or clear. An error names the row and the column,
/// never the value.
pub(crate) fn open_secret(
    key: &SecretsKey,
    id: &str,
    slot: WebhookSlot,
    stored: &str,
) -> Result<(Secret, Stored), StoreError> {
    use base64::Engine;
    let column = match slot {
        WebhookSlot::Current => "secret",
        WebhookSlot::Previous => "previous_secret",
    };
    let corrupt = |reason: String| {
        StoreError::corrupt("webhook_subscriptions", id, format!("{column}: {reason}"))
    };
    let Some(b64) = stored.strip_prefix(SEALED_PREFIX) else {
        let secret = Secret::parse(stored).map_err(|_| {
            corrupt("neither sealed (sealed:v1:…) nor a whsec_ signing secret".into())
        })?;
        return Ok((secret, Stored::Clear));
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| corrupt("the sealed value is not base64".into()))?;
    let opened = key
        .open_webhook(id, slot, &bytes)
        .map_err(|e| corrupt(e.to_string()))?;
    let secret = Secret::parse(&opened.value)
        .map_err(|_| corrupt("the sealed value is not a whsec_ signing secret".into()))?;
    let how = if opened.under_current {
        Stored::Current
    } else {
        Stored::PreviousKey
    };
    Ok((secret, how))
}

/// What a fan-out pass looked at.
#[derive(Debug, Default)]
pub struct FanOut {
    /// Outbox events passed (the cursor moved over them).
    pub seen: usize,
    /// What they tell the metrics (`crate::metrics::outbox`).
    pub signals: Vec<crate::metrics::outbox::Signal>,
}

impl Store {
    async fn team_name(&self, team_id: &str) -> Result<String, StoreError> {
        team::Entity::find_by_id(team_id.to_owned())
            .one(&self.read)
            .await?
            .map(|t| t.name)
            .ok_or_else(|| StoreError::NotFound(format!("team {team_id}")))
    }

    async fn subscription_row<C: ConnectionTrait>(
        &self,
        conn: &C,
        id: &str,
        team_id: Option<&str>,
    ) -> Result<webhook_subscription::Model, StoreError> {
        let mut q = webhook_subscription::Entity::find_by_id(id.to_owned());
        if let Some(t) = team_id {
            q = q.filter(webhook_subscription::Column::TeamId.eq(t));
        }
        q.one(conn)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("webhook {id}")))
    }

    /// Stores a new subscription, its secret sealed under `key`.
    pub async fn create_subscription(
        &self,
        key: &SecretsKey,
        new: NewSubscription,
        now: DateTime<Utc>,
    ) -> Result<Subscription, StoreError> {
        let row = self
            .measured("create_subscription", || async {
                let types: Vec<&str> = new.event_types.iter().map(|t| t.as_str()).collect();
                let id = new_uuid(now).to_string();
                let secret = seal_secret(key, &id, WebhookSlot::Current, &new.secret);
                Ok(webhook_subscription::ActiveModel {
                    id: Set(id),
                    team_id: Set(new.team_id.clone()),
                    url: Set(new.url.clone()),
                    secret: Set(secret),
                    event_types: Set(json!(types)),
                    enabled: Set(true),
                    created_at: Set(now),
                    updated_at: Set(now),
                    previous_secret: Set(None),
                    previous_secret_until: Set(None),
                    failing_since: Set(None),
                    disabled_reason: Set(None),
                    description: Set(new.description.clone()),
                }
                .insert(&self.write)
                .await?)
            })
            .await?;
        let name = self.team_name(&row.team_id).await?;
        subscription_from_row(row, &name)
    }

    /// Subscriptions, newest first; one team's when `team_id` is given.
    /// One page of the subscriptions (of one team when `team_id` is given), newest first.
    pub async fn list_subscriptions(
        &self,
        team_id: Option<&str>,
        page: &PageRequest<uuid::Uuid>,
    ) -> Result<Page<Subscription>, StoreError> {
        self.measured("list_subscriptions", || async {
            let mut q = webhook_subscription::Entity::find()
                .order_by_desc(webhook_subscription::Column::Id)
                .limit(page.rows_to_read());
            if let Some(t) = team_id {
                q = q.filter(webhook_subscription::Column::TeamId.eq(t));
            }
            if let Some(after) = page.after {
                q = q.filter(webhook_subscription::Column::Id.lt(after.to_string()));
            }
            let names = super::teams::team_names(&self.read).await?;
            let (rows, next_cursor) = page.cut(q.all(&self.read).await?, |r| r.id.clone());
            let items = rows
                .into_iter()
                .map(|r| {
                    let name = names.get(&r.team_id).cloned().unwrap_or_default();
                    subscription_from_row(r, &name)
                })
                .collect::<Result<_, _>>()?;
            Ok(Page { items, next_cursor })
        })
        .await
    }

    /// A subscription; `NotFound` also when it belongs to another team than `team_id`.
    pub async fn get_subscription(
        &self,
        id: &str,
        team_id: Option<&str>,
    ) -> Result<Subscription, StoreError> {
        let row = self
            .measured("get_subscription", || async {
                self.subscription_row(&self.read, id, team_id).await
            })
            .await?;
        let name = self.team_name(&row.team_id).await?;
        subscription_from_row(row, &name)
    }

    /// Changes a subscription. Enabling it again clears its failure streak, and its pending
    /// deliveries go out (retried from now).
    pub async fn update_subscription(
        &self,
        id: &str,
        team_id: Option<&str>,
        patch: SubscriptionPatch,
        now: DateTime<Utc>,
    ) -> Result<Subscription, StoreError> {
        self.measured("update_subscription", || async {
            let txn = self.write.begin().await?;
            let row = self.subscription_row(&txn, id, team_id).await?;
            let mut m: webhook_subscription::ActiveModel = row.clone().into();
            if let Some(u) = &patch.url {
                m.url = Set(u.clone());
            }
            if let Some(t) = &patch.event_types {
                let types: Vec<&str> = t.iter().map(|t| t.as_str()).collect();
                m.event_types = Set(json!(types));
            }
            if let Some(d) = &patch.description {
                m.description = Set(d.clone());
            }
            if let Some(e) = patch.enabled {
                m.enabled = Set(e);
                if e && !row.enabled {
                    m.failing_since = Set(None);
                    m.disabled_reason = Set(None);
                    webhook_delivery::Entity::update_many()
                        .col_expr(webhook_delivery::Column::NextAttemptAt, Expr::value(now))
                        .filter(webhook_delivery::Column::SubscriptionId.eq(id))
                        .filter(webhook_delivery::Column::State.eq("pending"))
                        .exec(&txn)
                        .await?;
                }
            }
            m.updated_at = Set(now);
            m.update(&txn).await?;
            txn.commit().await?;
            Ok(())
        })
        .await?;
        self.get_subscription(id, team_id).await
    }

    /// Deletes a subscription and its delivery log.
    pub async fn delete_subscription(
        &self,
        id: &str,
        team_id: Option<&str>,
    ) -> Result<(), StoreError> {
        self.measured("delete_subscription", || async {
            let txn = self.write.begin().await?;
            self.subscription_row(&txn, id, team_id).await?;
            webhook_delivery::Entity::delete_many()
                .filter(webhook_delivery::Column::SubscriptionId.eq(id))
                .exec(&txn)
                .await?;
            webhook_subscription::Entity::delete_by_id(id.to_owned())
                .exec(&txn)
                .await?;
            txn.commit().await?;
            Ok(())
        })
        .await
    }

    /// Replaces a subscription's secret; the old one still signs until `overlap_until`. Both
    /// are (re)sealed under `key`'s current key, each bound to its column.
    pub async fn rotate_secret(
        &self,
        key: &SecretsKey,
        id: &str,
        team_id: Option<&str>,
        secret: &Secret,
        overlap_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Subscription, StoreError> {
        self.measured("rotate_secret", || async {
            let txn = self.write.begin().await?;
            let row = self.subscription_row(&txn, id, team_id).await?;
            let (old, _) = open_secret(key, &row.id, WebhookSlot::Current, &row.secret)?;
            let mut m: webhook_subscription::ActiveModel = row.clone().into();
            m.previous_secret = Set(Some(seal_secret(key, &row.id, WebhookSlot::Previous, &old)));
            m.previous_secret_until = Set(Some(overlap_until));
            m.secret = Set(seal_secret(key, &row.id, WebhookSlot::Current, secret));
            m.updated_at = Set(now);
            m.update(&txn).await?;
            txn.commit().await?;
            Ok(())
        })
        .await?;
        self.get_subscription(id, team_id).await
    }

    /// Makes deliveries for outbox events after the fan-out cursor: each event to the enabled
    /// subscriptions of its team (node notices: of the teams with work on the node then) that
    /// asked for its type and existed when it happened. A gap in the outbox's ids (a
    /// transaction not yet committed) is waited for up to `gap_wait`, then skipped. Returns how
    /// many events were looked at.
    pub async fn webhook_fan_out(
        &self,
        now: DateTime<Utc>,
        gap_wait: chrono::Duration,
        limit: u64,
    ) -> Result<FanOut, StoreError> {
        self.measured("webhook_fan_out", || async {
            let after = get_cursor(&self.read, FAN_OUT_CURSOR).await?;
            let rows = outbox::Entity::find()
                .filter(outbox::Column::Id.gt(after))
                .order_by_asc(outbox::Column::Id)
                .limit(limit)
                .all(&self.read)
                .await?;
            if rows.is_empty() {
                return Ok(FanOut::default());
            }
            let txn = self.write.begin().await?;
            let mut position = after;
            let mut seen = 0;
            let mut signals = Vec::new();
            let subs = webhook_subscription::Entity::find().all(&txn).await?;
            for r in rows {
                if r.id != position + 1 && now - r.created_at < gap_wait {
                    break;
                }
                position = r.id;
                seen += 1;
                signals.extend(crate::metrics::outbox::signals(&r.kind, &r.payload));
                let Some(t) = EventType::of_outbox(&r.kind, &r.payload) else {
                    continue;
                };
                let teams: HashSet<String> = match (&r.team_id, t) {
                    (Some(team), _) => HashSet::from([team.clone()]),
                    (None, EventType::NodeNotice) => {
                        self.teams_on_node(&txn, &r.subject_id, r.created_at)
                            .await?
                    }
                    (None, _) => continue,
                };
                let mut rows_to_insert = Vec::new();
                for s in &subs {
                    if !teams.contains(&s.team_id) || s.created_at > r.created_at {
                        continue;
                    }
                    let wanted = if t == EventType::Ping {
                        s.id == r.subject_id
                    } else {
                        s.enabled && event_types_of(s)?.iter().any(|e| e == t.as_str())
                    };
                    if !wanted {
                        continue;
                    }
                    rows_to_insert.push(webhook_delivery::ActiveModel {
                        id: Set(new_uuid(now).to_string()),
                        subscription_id: Set(s.id.clone()),
                        outbox_id: Set(r.id),
                        state: Set("pending".into()),
                        attempts: Set(0),
                        next_attempt_at: Set(Some(now)),
                        last_status: Set(None),
                        last_error: Set(None),
                        created_at: Set(now),
                        delivered_at: Set(None),
                        event_type: Set(Some(t.as_str().to_owned())),
                        subject: Set(Some(format!("{}:{}", r.subject_kind, r.subject_id))),
                        latency_ms: Set(None),
                        last_attempt_at: Set(None),
                    });
                }
                if !rows_to_insert.is_empty() {
                    webhook_delivery::Entity::insert_many(rows_to_insert)
                        .on_conflict(
                            OnConflict::columns([
                                webhook_delivery::Column::SubscriptionId,
                                webhook_delivery::Column::OutboxId,
                            ])
                            .do_nothing()
                            .to_owned(),
                        )
                        .do_nothing()
                        .exec(&txn)
                        .await?;
                }
            }
            if position != after {
                super::finance::set_cursor_in(&txn, FAN_OUT_CURSOR, position, now).await?;
            }
            txn.commit().await?;
            Ok(FanOut { seen, signals })
        })
        .await
    }

    /// Teams with work on a node at `at`.
    async fn teams_on_node<C: ConnectionTrait>(
        &self,
        conn: &C,
        node_id: &str,
        at: DateTime<Utc>,
    ) -> Result<HashSet<String>, StoreError> {
        let jobs: Vec<(String, Option<DateTime<Utc>>)> = allocation::Entity::find()
            .filter(allocation::Column::NodeId.eq(node_id))
            .filter(allocation::Column::CreatedAt.lte(at))
            .select_only()
            .columns([allocation::Column::JobId, allocation::Column::ReleasedAt])
            .into_tuple()
            .all(conn)
            .await?;
        let live: Vec<String> = jobs
            .into_iter()
            .filter(|(_, r)| r.is_none_or(|r| r >= at))
            .map(|(j, _)| j)
            .collect();
        if live.is_empty() {
            return Ok(HashSet::new());
        }
        Ok(job::Entity::find()
            .filter(job::Column::Id.is_in(live))
            .select_only()
            .column(job::Column::TeamId)
            .into_tuple::<String>()
            .all(conn)
            .await?
            .into_iter()
            .collect())
    }

    /// Deliveries due at `now` whose endpoint is enabled and that are first in line for their
    /// subject (a job's events go out in order: a later one waits while an earlier one is
    /// pending), oldest event first, at most `limit`.
    ///
    /// A delivery whose subscription's secret does not open is left pending and logged as an
    /// error naming the row, so that one unreadable row does not hold up every other
    /// endpoint's deliveries.
    pub async fn due_deliveries(
        &self,
        key: &SecretsKey,
        now: DateTime<Utc>,
        limit: u64,
    ) -> Result<Vec<DueDelivery>, StoreError> {
        self.measured("due_deliveries", || async {
            let candidates = webhook_delivery::Entity::find()
                .filter(webhook_delivery::Column::State.eq("pending"))
                .filter(webhook_delivery::Column::NextAttemptAt.lte(now))
                .order_by_asc(webhook_delivery::Column::OutboxId)
                .limit(limit * 4)
                .all(&self.read)
                .await?;
            if candidates.is_empty() {
                return Ok(Vec::new());
            }
            let sub_ids: Vec<String> = candidates
                .iter()
                .map(|d| d.subscription_id.clone())
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            let subs: HashMap<String, webhook_subscription::Model> =
                webhook_subscription::Entity::find()
                    .filter(webhook_subscription::Column::Id.is_in(sub_ids.clone()))
                    .all(&self.read)
                    .await?
                    .into_iter()
                    .map(|s| (s.id.clone(), s))
                    .collect();
            // The first pending event per (subscription, subject).
            let max_id = candidates.iter().map(|d| d.outbox_id).max().unwrap_or(0);
            let mut first: BTreeMap<(String, Option<String>), i64> = BTreeMap::new();
            let earlier: Vec<(String, Option<String>, i64)> = webhook_delivery::Entity::find()
                .filter(webhook_delivery::Column::State.eq("pending"))
                .filter(webhook_delivery::Column::SubscriptionId.is_in(sub_ids))
                .filter(webhook_delivery::Column::OutboxId.lte(max_id))
                .select_only()
                .columns([
                    webhook_delivery::Column::SubscriptionId,
                    webhook_delivery::Column::Subject,
                    webhook_delivery::Column::OutboxId,
                ])
                .into_tuple()
                .all(&self.read)
                .await?;
            for (s, subj, o) in earlier {
                let e = first.entry((s, subj)).or_insert(o);
                *e = (*e).min(o);
            }
            let mut chosen = Vec::new();
            for d in candidates {
                let Some(s) = subs.get(&d.subscription_id) else {
                    continue;
                };
                let is_ping = d.event_type.as_deref() == Some(EventType::Ping.as_str());
                if !s.enabled && !is_ping {
                    continue;
                }
                if first.get(&(d.subscription_id.clone(), d.subject.clone())) != Some(&d.outbox_id)
                {
                    continue;
                }
                chosen.push((d, s.clone()));
                if chosen.len() as u64 >= limit {
                    break;
                }
            }
            let ids: Vec<i64> = chosen.iter().map(|(d, _)| d.outbox_id).collect();
            let events: HashMap<i64, outbox::Model> = outbox::Entity::find()
                .filter(outbox::Column::Id.is_in(ids))
                .all(&self.read)
                .await?
                .into_iter()
                .map(|e| (e.id, e))
                .collect();
            let mut out = Vec::with_capacity(chosen.len());
            for (d, s) in chosen {
                let Some(e) = events.get(&d.outbox_id) else {
                    continue;
                };
                match due_of(key, d, &s, e) {
                    Ok(due) => out.push(due),
                    Err(e) => {
                        tracing::error!(error = %e, "webhook delivery held back: its subscription's signing secret cannot be read");
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    /// Records an attempt and what follows from it, in one transaction: the delivery's state
    /// and next attempt; the endpoint's failure streak; disabling the endpoint (with a
    /// `webhook.disabled` event for its team) when it has failed for the whole period.
    /// An attempt already recorded (by another process) is not recorded twice.
    pub async fn record_attempt(
        &self,
        d: &DueDelivery,
        outcome: &Outcome,
        next: Next,
        policy: &RetryPolicy,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.measured("record_attempt", || async {
            let txn = self.write.begin().await?;
            let (state, next_at, delivered_at) = match next {
                Next::Delivered => ("delivered", None, Some(now)),
                Next::RetryAt(at) => ("pending", Some(at), None),
                Next::GiveUp => ("failed", None, None),
            };
            let res = webhook_delivery::Entity::update_many()
                .col_expr(webhook_delivery::Column::State, Expr::value(state))
                .col_expr(
                    webhook_delivery::Column::Attempts,
                    Expr::value(i32::try_from(d.attempts + 1).unwrap_or(i32::MAX)),
                )
                .col_expr(
                    webhook_delivery::Column::NextAttemptAt,
                    Expr::value(next_at),
                )
                .col_expr(
                    webhook_delivery::Column::DeliveredAt,
                    Expr::value(delivered_at),
                )
                .col_expr(
                    webhook_delivery::Column::LastStatus,
                    Expr::value(outcome.status.map(i32::from)),
                )
                .col_expr(
                    webhook_delivery::Column::LastError,
                    Expr::value(outcome.error.clone()),
                )
                .col_expr(
                    webhook_delivery::Column::LatencyMs,
                    Expr::value(Some(
                        i64::try_from(outcome.latency.as_millis()).unwrap_or(i64::MAX),
                    )),
                )
                .col_expr(
                    webhook_delivery::Column::LastAttemptAt,
                    Expr::value(Some(now)),
                )
                .filter(webhook_delivery::Column::Id.eq(d.id.clone()))
                .filter(webhook_delivery::Column::State.eq("pending"))
                .filter(
                    webhook_delivery::Column::Attempts
                        .eq(i32::try_from(d.attempts).unwrap_or(i32::MAX)),
                )
                .exec(&txn)
                .await?;
            if res.rows_affected != 1 {
                return Ok(false);
            }
            // Pings test an endpoint; they do not count towards disabling it.
            if d.event_type != EventType::Ping
                && let Some(s) = webhook_subscription::Entity::find_by_id(d.subscription_id.clone())
                    .one(&txn)
                    .await?
            {
                let mut m: webhook_subscription::ActiveModel = s.clone().into();
                if outcome.delivered() {
                    if s.failing_since.is_some() {
                        m.failing_since = Set(None);
                        m.update(&txn).await?;
                    }
                } else {
                    let since = s.failing_since.unwrap_or(now);
                    if s.failing_since.is_none() {
                        m.failing_since = Set(Some(now));
                    }
                    if s.enabled && should_disable(policy, since, now) {
                        let reason = format!(
                            "every attempt failed since {} (last: {})",
                            since.to_rfc3339(),
                            outcome.error.as_deref().unwrap_or("?")
                        );
                        m.enabled = Set(false);
                        m.disabled_reason = Set(Some(reason.clone()));
                        m.updated_at = Set(now);
                        outbox::ActiveModel {
                            kind: Set("webhook.disabled".into()),
                            subject_kind: Set("webhook".into()),
                            subject_id: Set(s.id.clone()),
                            team_id: Set(Some(s.team_id.clone())),
                            payload: Set(json!({
                                "webhook": {"id": s.id, "url": s.url},
                                "reason": reason,
                                "failing_since": since,
                            })),
                            created_at: Set(now),
                            ..Default::default()
                        }
                        .insert(&txn)
                        .await?;
                    }
                    m.update(&txn).await?;
                }
            }
            txn.commit().await?;
            Ok(true)
        })
        .await
    }

    /// Queues a ping to one endpoint (an outbox event and its delivery, in one transaction)
    /// and returns it for the caller to attempt now. It is held back from the delivery loop
    /// for an hour, so it is not sent twice; if the caller dies, the loop sends it then.
    pub async fn create_ping(
        &self,
        key: &SecretsKey,
        id: &str,
        team_id: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<DueDelivery, StoreError> {
        self.measured("create_ping", || async {
            let txn = self.write.begin().await?;
            let s = self.subscription_row(&txn, id, team_id).await?;
            let event = outbox::ActiveModel {
                kind: Set("webhook.ping".into()),
                subject_kind: Set("webhook".into()),
                subject_id: Set(s.id.clone()),
                team_id: Set(Some(s.team_id.clone())),
                payload: Set(json!({"webhook": {"id": s.id, "url": s.url}, "message": "ping from spotplane"})),
                created_at: Set(now),
                ..Default::default()
            }
            .insert(&txn)
            .await?;
            let d = webhook_delivery::ActiveModel {
                id: Set(new_uuid(now).to_string()),
                subscription_id: Set(s.id.clone()),
                outbox_id: Set(event.id),
                state: Set("pending".into()),
                attempts: Set(0),
                next_attempt_at: Set(Some(now + chrono::Duration::hours(1))),
                last_status: Set(None),
                last_error: Set(None),
                created_at: Set(now),
                delivered_at: Set(None),
                event_type: Set(Some(EventType::Ping.as_str().to_owned())),
                subject: Set(Some(format!("webhook:{}", s.id))),
                latency_ms: Set(None),
                last_attempt_at: Set(None),
            }
            .insert(&txn)
            .await?;
            txn.commit().await?;
            due_of(key, d, &s, &event)
        })
        .await
    }

    /// A subscription's delivery log, newest first.
    pub async fn list_deliveries(
        &self,
        subscription_id: &str,
        team_id: Option<&str>,
        state: Option<&str>,
        page: &PageRequest<uuid::Uuid>,
    ) -> Result<Page<Delivery>, StoreError> {
        self.measured("list_deliveries", || async {
            self.subscription_row(&self.read, subscription_id, team_id)
                .await?;
            let mut q = webhook_delivery::Entity::find()
                .filter(webhook_delivery::Column::SubscriptionId.eq(subscription_id))
                .order_by_desc(webhook_delivery::Column::Id)
                .limit(page.rows_to_read());
            if let Some(s) = state {
                q = q.filter(webhook_delivery::Column::State.eq(s));
            }
            if let Some(after) = page.after {
                q = q.filter(webhook_delivery::Column::Id.lt(after.to_string()));
            }
            let (rows, next_cursor) = page.cut(q.all(&self.read).await?, |r| r.id.clone());
            let items: Vec<Delivery> = rows.into_iter().map(delivery_from_row).collect();
            Ok(Page { items, next_cursor })
        })
        .await
    }
}

fn due_of(
    key: &SecretsKey,
    d: webhook_delivery::Model,
    s: &webhook_subscription::Model,
    e: &outbox::Model,
) -> Result<DueDelivery, StoreError> {
    let event_type = EventType::of_outbox(&e.kind, &e.payload).ok_or_else(|| {
        StoreError::corrupt("webhook_deliveries", &d.id, "its event has no webhook type")
    })?;
    let previous = match (&s.previous_secret, s.previous_secret_until) {
        (Some(p), Some(until)) => {
            Some((open_secret(key, &s.id, WebhookSlot::Previous, p)?.0, until))
        }
        _ => None,
    };
    Ok(DueDelivery {
        secret: open_secret(key, &s.id, WebhookSlot::Current, &s.secret)?.0,
        previous,
        attempts: u32::try_from(d.attempts).unwrap_or(0),
        event_type,
        outbox_id: e.id,
        event_at: e.created_at,
        payload: e.payload.clone(),
        url: s.url.clone(),
        subscription_id: d.subscription_id,
        id: d.id,
    })
}

/// Which stored signing secrets [`Store::reseal_webhook_secrets`] rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reseal {
    /// Only those in the clear (the start-up conversion).
    ClearOnly,
    /// Every one not sealed under the current key (`spotplane secrets reseal`).
    NotUnderCurrent,
}

/// A subscription row's secrets, opened, and whether they must be rewritten.
pub(crate) struct OpenedRow {
    pub id: String,
    pub secret: (Secret, Stored),
    pub previous: Option<(Secret, Stored)>,
    pub stored_secret: String,
    pub stored_previous: Option<String>,
}

impl OpenedRow {
    fn needs(&self, which: Reseal) -> bool {
        let needs = |s: Stored| match which {
            Reseal::ClearOnly => s == Stored::Clear,
            Reseal::NotUnderCurrent => s != Stored::Current,
        };
        needs(self.secret.1) || self.previous.as_ref().is_some_and(|p| needs(p.1))
    }
}

impl Store {
    /// Every subscription's secrets, opened; the rows that do not open are returned apart,
    /// each as an error naming it.
    pub(crate) async fn open_webhook_rows(
        &self,
        key: &SecretsKey,
    ) -> Result<(Vec<OpenedRow>, Vec<StoreError>), StoreError> {
        let rows = webhook_subscription::Entity::find()
            .select_only()
            .columns([
                webhook_subscription::Column::Id,
                webhook_subscription::Column::Secret,
                webhook_subscription::Column::PreviousSecret,
            ])
            .into_tuple::<(String, String, Option<String>)>()
            .all(&self.read)
            .await?;
        let mut opened = Vec::with_capacity(rows.len());
        let mut failed = Vec::new();
        for (id, secret, previous) in rows {
            let current = open_secret(key, &id, WebhookSlot::Current, &secret);
            let prev = previous
                .as_deref()
                .map(|p| open_secret(key, &id, WebhookSlot::Previous, p))
                .transpose();
            match (current, prev) {
                (Ok(c), Ok(p)) => opened.push(OpenedRow {
                    id,
                    secret: c,
                    previous: p,
                    stored_secret: secret,
                    stored_previous: previous,
                }),
                (Err(e), _) | (_, Err(e)) => failed.push(e),
            }
        }
        Ok((opened, failed))
    }

    /// Seals every subscription's secrets that `which` selects under the current key. Each
    /// row is rewritten only if it still holds what was read (a row changed meanwhile was
    /// written sealed under the current key by its writer). Returns the rows rewritten.
    pub(crate) async fn reseal_webhook_rows(
        &self,
        key: &SecretsKey,
        rows: Vec<OpenedRow>,
        which: Reseal,
    ) -> Result<usize, StoreError> {
        let mut rewritten = 0;
        for row in rows.into_iter().filter(|r| r.needs(which)) {
            let secret = seal_secret(key, &row.id, WebhookSlot::Current, &row.secret.0);
            let previous = row
                .previous
                .as_ref()
                .map(|p| seal_secret(key, &row.id, WebhookSlot::Previous, &p.0));
            let mut q = webhook_subscription::Entity::update_many()
                .col_expr(webhook_subscription::Column::Secret, Expr::value(secret))
                .col_expr(
                    webhook_subscription::Column::PreviousSecret,
                    Expr::value(previous),
                )
                .filter(webhook_subscription::Column::Id.eq(row.id.clone()))
                .filter(webhook_subscription::Column::Secret.eq(row.stored_secret.clone()));
            q = match &row.stored_previous {
                Some(p) => q.filter(webhook_subscription::Column::PreviousSecret.eq(p.clone())),
                None => q.filter(webhook_subscription::Column::PreviousSecret.is_null()),
            };
            let done = self
                .measured("reseal_webhook_secret", || async {
                    Ok(q.clone().exec(&self.write).await?)
                })
                .await?;
            rewritten += usize::try_from(done.rows_affected).unwrap_or(0);
        }
        Ok(rewritten)
    }

    /// Seals the signing secrets stored in the clear before secrets were sealed (run at every
    /// start; nothing to do after the first). A row that is neither clear nor opens is left
    /// as it is and logged, naming it: `spotplane secrets reseal` reports it too.
    pub async fn seal_clear_webhook_secrets(&self, key: &SecretsKey) -> Result<usize, StoreError> {
        let (rows, failed) = self.open_webhook_rows(key).await?;
        for e in &failed {
            tracing::error!(error = %e, "a webhook signing secret cannot be read");
        }
        let n = self
            .reseal_webhook_rows(key, rows, Reseal::ClearOnly)
            .await?;
        if n > 0 {
            tracing::info!(
                subscriptions = n,
                "sealed webhook signing secrets stored in the clear"
            );
        }
        Ok(n)
    }
}
