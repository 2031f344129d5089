//! The webhook delivery loop: fan new outbox events out into deliveries, then attempt the
//! deliveries that are due, a bounded number at once, recording each attempt.
//!
//! Each attempt is signed afresh (a new `webhook-timestamp`; the same `webhook-id` and body),
//! with the previous secret too while a rotation overlaps. Only the leader delivers. Because
//! every delivery's state is in the store and an attempt is recorded only after it is made,
//! a crash between the two means the attempt is made again: at least once.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::WebhookSettings;
use crate::reconcile::runner::{ReconcileError, Reconciler, Report};
use crate::secrets::SecretsKey;
use crate::store::{DueDelivery, Store, StoreError};
use crate::webhooks::retry::{self, Next, Outcome, RetryPolicy};
use crate::webhooks::sender::{Message, Sender};
use crate::webhooks::signing::signature_header;
use crate::webhooks::{EventType, body};

/// What one cycle did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryReport {
    pub events: usize,
    pub attempted: usize,
    pub delivered: usize,
    pub failed: usize,
    /// What the events fanned out tell the metrics (notices, checkpoints, resumes).
    pub signals: Vec<crate::metrics::outbox::Signal>,
}

impl Report for DeliveryReport {
    fn is_quiet(&self) -> bool {
        self.failed == 0
    }

    fn events(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("deliveries_attempted", self.attempted as u64),
            ("deliveries_delivered", self.delivered as u64),
            ("deliveries_failed", self.failed as u64),
        ]
    }

    fn signals(&self) -> &[crate::metrics::outbox::Signal] {
        &self.signals
    }
}

pub struct WebhookLoop {
    store: Store,
    clock: SharedClock,
    sender: Arc<Sender>,
    settings: WebhookSettings,
    /// Opens the subscriptions' sealed signing secrets.
    key: SecretsKey,
}

#[async_trait]
impl Reconciler for WebhookLoop {
    fn name(&self) -> &'static str {
        "webhooks"
    }

    /// A delivery pass reads the clock as it goes, so `now` only starts it.
    async fn reconcile(
        &mut self,
        _now: DateTime<Utc>,
        _cancel: &CancellationToken,
    ) -> Result<Box<dyn Report>, ReconcileError> {
        Ok(Box::new(self.run_once().await?))
    }
}

impl WebhookLoop {
    pub fn new(
        store: Store,
        clock: SharedClock,
        sender: Arc<Sender>,
        settings: WebhookSettings,
        key: SecretsKey,
    ) -> Self {
        WebhookLoop {
            store,
            clock,
            sender,
            settings,
            key,
        }
    }

    pub fn policy(&self) -> RetryPolicy {
        policy_of(&self.settings)
    }

    /// One cycle: fan out, then attempt what is due. Each step reads the clock afresh (an
    /// attempt is signed and recorded at the time it is made).
    pub async fn run_once(&self) -> Result<DeliveryReport, StoreError> {
        let mut report = DeliveryReport::default();
        let gap = chrono::Duration::from_std(self.settings.gap_wait).unwrap_or_default();
        loop {
            let fan = self
                .store
                .webhook_fan_out(self.clock.now(), gap, 500)
                .await?;
            report.events += fan.seen;
            report.signals.extend(fan.signals);
            if fan.seen < 500 {
                break;
            }
        }
        // A delivery made may let the next event of the same job go: a few rounds per cycle.
        for _ in 0..8 {
            let due = self
                .store
                .due_deliveries(
                    &self.key,
                    self.clock.now(),
                    4 * self.settings.concurrency as u64,
                )
                .await?;
            if due.is_empty() {
                break;
            }
            let results: Vec<Result<Option<bool>, StoreError>> = futures::stream::iter(due)
                .map(|d| self.attempt(d))
                .buffer_unordered(self.settings.concurrency.max(1))
                .collect()
                .await;
            let mut delivered = 0;
            for r in results {
                match r? {
                    Some(true) => delivered += 1,
                    Some(false) => report.failed += 1,
                    None => {}
                }
                report.attempted += 1;
            }
            report.delivered += delivered;
            if delivered == 0 {
                break;
            }
        }
        Ok(report)
    }

    /// Makes one attempt and records it; `Some(delivered)` when it was recorded.
    async fn attempt(&self, d: DueDelivery) -> Result<Option<bool>, StoreError> {
        let outcome = send(&self.sender, &self.clock, &d).await;
        // Sent (perhaps received) but not recorded: the receiver must get it again.
        crate::crash_point!("webhook-delivery");
        let now = self.clock.now();
        let next = retry::next(
            &self.policy(),
            &outcome,
            d.attempts + 1,
            d.event_at,
            now,
            rand::random::<f64>(),
        );
        if !outcome.delivered() {
            tracing::debug!(delivery = %d.id, url = %d.url, error = ?outcome.error, ?next, "webhook attempt failed");
        }
        let recorded = self
            .store
            .record_attempt(&d, &outcome, next, &self.policy(), now)
            .await?;
        Ok(recorded.then_some(next == Next::Delivered))
    }
}

/// The retry policy of the settings.
pub fn policy_of(s: &WebhookSettings) -> RetryPolicy {
    RetryPolicy {
        base: s.retry_base,
        max: s.retry_max,
        retry_for: s.retry_for,
        disable_after: s.disable_after,
    }
}

/// Signs and sends one attempt of a delivery, at the clock's time.
pub async fn send(sender: &Sender, clock: &SharedClock, d: &DueDelivery) -> Outcome {
    let now = clock.now();
    let bytes = body(d.event_type, d.event_at, d.outbox_id, &d.payload);
    let timestamp = now.timestamp();
    let signature = signature_header(&d.secrets(now), &d.id, timestamp, &bytes);
    sender
        .send(&Message {
            url: &d.url,
            id: &d.id,
            timestamp,
            signature: &signature,
            body: &bytes,
        })
        .await
}

/// A ping: sent now, recorded, never retried.
pub async fn ping(
    store: &Store,
    sender: &Sender,
    clock: &SharedClock,
    settings: &WebhookSettings,
    d: &DueDelivery,
) -> Result<Outcome, StoreError> {
    debug_assert_eq!(d.event_type, EventType::Ping);
    let outcome = send(sender, clock, d).await;
    let next = if outcome.delivered() {
        Next::Delivered
    } else {
        Next::GiveUp
    };
    store
        .record_attempt(d, &outcome, next, &policy_of(settings), clock.now())
        .await?;
    Ok(outcome)
}
