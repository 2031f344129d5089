//! One vocabulary for a cloud taking a node back, shared by the agent (which hears notices on
//! the node) and the control plane (which hears the clouds' event streams): what the cloud
//! said ([`NoticeAction`]), what it means ([`InterruptionKind`]), and the one rule of when a
//! notice drains the node ([`InterruptionKind::drains`], [`TerminationNotice::drain_deadline`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What an interruption means for the node, whoever heard it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InterruptionKind {
    /// The instance will be reclaimed (AWS Spot Interruption Warning, GCP preemption, Azure Preempt).
    Preemption,
    /// The cloud advises moving off (AWS Rebalance Recommendation); no deadline.
    Rebalance,
    /// Scheduled maintenance (AWS Health scheduledChange).
    Maintenance,
    /// The instance is stopping or gone already.
    Stopped,
}

impl InterruptionKind {
    /// Whether a notice of this kind, given with a deadline, drains the node: its replicas
    /// checkpoint before the deadline and move. A rebalance is advice and drains nothing; a
    /// stopped instance has nothing left to drain.
    pub fn drains(self) -> bool {
        matches!(
            self,
            InterruptionKind::Preemption | InterruptionKind::Maintenance
        )
    }
}

/// The action a notice announced, as the cloud named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum NoticeAction {
    /// AWS instance-action `terminate`.
    Terminate,
    /// AWS instance-action `stop`.
    Stop,
    /// AWS instance-action `hibernate`.
    Hibernate,
    /// GCP `preempted`, Azure Scheduled Events `Preempt`, a simulated cloud.
    Preempt,
    /// AWS rebalance recommendation: a warning without a deadline.
    Rebalance,
}

impl NoticeAction {
    /// The action's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeAction::Terminate => "terminate",
            NoticeAction::Stop => "stop",
            NoticeAction::Hibernate => "hibernate",
            NoticeAction::Preempt => "preempt",
            NoticeAction::Rebalance => "rebalance",
        }
    }

    /// AWS instance-action's `action` field (`terminate`, `stop`, `hibernate`).
    pub fn from_aws_instance_action(action: &str) -> Option<NoticeAction> {
        match action {
            "terminate" => Some(NoticeAction::Terminate),
            "stop" => Some(NoticeAction::Stop),
            "hibernate" => Some(NoticeAction::Hibernate),
            _ => None,
        }
    }

    /// What the action means for the node: every one but a rebalance takes it (a spot
    /// instance that is stopped or hibernated is interrupted like one that is terminated).
    pub fn kind(self) -> InterruptionKind {
        match self {
            NoticeAction::Rebalance => InterruptionKind::Rebalance,
            NoticeAction::Terminate
            | NoticeAction::Stop
            | NoticeAction::Hibernate
            | NoticeAction::Preempt => InterruptionKind::Preemption,
        }
    }
}

impl std::fmt::Display for NoticeAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a termination notice came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum NoticeSource {
    /// AWS IMDS `spot/instance-action`.
    AwsInstanceAction,
    /// AWS IMDS `events/recommendations/rebalance` (a warning with no deadline).
    AwsRebalance,
    /// AWS EventBridge via SQS (the control plane's own stream).
    AwsEventBridge,
    /// GCP metadata `instance/preempted`.
    GcpPreempted,
    /// Azure Scheduled Events `Preempt`.
    AzureScheduledEvent,
    /// A simulated cloud.
    Simulated,
}

/// A cloud's announcement that it is taking the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TerminationNotice {
    pub source: NoticeSource,
    /// What the cloud said it will do.
    pub action: NoticeAction,
    /// When the node will be taken; `None` for a warning without a deadline.
    pub deadline: Option<DateTime<Utc>>,
    pub observed_at: DateTime<Utc>,
    /// The cloud's own id for the event (Azure `EventId`), to acknowledge it.
    #[serde(default)]
    pub event_id: Option<String>,
}

impl TerminationNotice {
    /// The deadline the node drains by, when this notice drains it (the rule of
    /// [`InterruptionKind::drains`]).
    pub fn drain_deadline(&self) -> Option<DateTime<Utc>> {
        self.deadline.filter(|_| self.action.kind().drains())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_notices_that_take_the_node_and_have_a_deadline_drain() {
        let at = DateTime::from_timestamp(1_700_000_000, 0).expect("time");
        let notice = |action, deadline| TerminationNotice {
            source: NoticeSource::Simulated,
            action,
            deadline,
            observed_at: at,
            event_id: None,
        };
        let soon = Some(at + chrono::Duration::seconds(120));
        for (action, deadline, drains) in [
            (NoticeAction::Terminate, soon, soon),
            (NoticeAction::Stop, soon, soon),
            (NoticeAction::Hibernate, soon, soon),
            (NoticeAction::Preempt, soon, soon),
            (NoticeAction::Rebalance, soon, None),
            (NoticeAction::Preempt, None, None),
        ] {
            assert_eq!(
                notice(action, deadline).drain_deadline(),
                drains,
                "{action} {deadline:?}"
            );
        }
        assert!(InterruptionKind::Maintenance.drains());
        assert!(!InterruptionKind::Stopped.drains());
    }

    #[test]
    fn actions_keep_their_wire_names() {
        for a in [
            NoticeAction::Terminate,
            NoticeAction::Stop,
            NoticeAction::Hibernate,
            NoticeAction::Preempt,
            NoticeAction::Rebalance,
        ] {
            let wire = serde_json::to_value(a).expect("json");
            assert_eq!(wire, serde_json::json!(a.as_str()));
            assert_eq!(serde_json::from_value::<NoticeAction>(wire).ok(), Some(a));
        }
        assert!(serde_json::from_value::<NoticeAction>(serde_json::json!("explode")).is_err());
        assert_eq!(
            NoticeAction::from_aws_instance_action("stop"),
            Some(NoticeAction::Stop)
        );
        assert_eq!(NoticeAction::from_aws_instance_action("reboot"), None);
    }
}
