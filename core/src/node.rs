//! Clouds, markets and the node lifecycle.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A cloud provider. The simulated clouds of the demo carry the flavour of one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Cloud {
    Aws,
    Gcp,
    Azure,
}

impl Cloud {
    pub const ALL: [Cloud; 3] = [Cloud::Aws, Cloud::Gcp, Cloud::Azure];

    pub const fn as_str(self) -> &'static str {
        match self {
            Cloud::Aws => "aws",
            Cloud::Gcp => "gcp",
            Cloud::Azure => "azure",
        }
    }

    /// How long the cloud warns before it takes a spot node back (REFERENCE.md).
    pub const fn notice_window_secs(self) -> u32 {
        match self {
            Cloud::Aws => 120,
            Cloud::Gcp | Cloud::Azure => 30,
        }
    }
}

impl fmt::Display for Cloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Cloud {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Cloud::ALL
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown cloud {s:?}; expected aws, gcp or azure"))
    }
}

/// How capacity is bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Market {
    Spot,
    OnDemand,
}

impl Market {
    pub const fn as_str(self) -> &'static str {
        match self {
            Market::Spot => "spot",
            Market::OnDemand => "on-demand",
        }
    }
}

impl fmt::Display for Market {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Market {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "spot" => Ok(Market::Spot),
            "on-demand" => Ok(Market::OnDemand),
            _ => Err(format!("unknown market {s:?}; expected spot or on-demand")),
        }
    }
}

/// Node lifecycle: `requested -> booting -> ready -> draining -> terminating -> terminated`.
/// A node can fail before it is ready (`requested`/`booting -> terminating`) and a cloud can
/// take it at any time (`* -> terminated` when the instance is found gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Requested,
    Booting,
    Ready,
    Draining,
    Terminating,
    Terminated,
}

impl NodeState {
    pub const ALL: [NodeState; 6] = [
        NodeState::Requested,
        NodeState::Booting,
        NodeState::Ready,
        NodeState::Draining,
        NodeState::Terminating,
        NodeState::Terminated,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            NodeState::Requested => "requested",
            NodeState::Booting => "booting",
            NodeState::Ready => "ready",
            NodeState::Draining => "draining",
            NodeState::Terminating => "terminating",
            NodeState::Terminated => "terminated",
        }
    }

    pub const fn is_terminal(self) -> bool {
        matches!(self, NodeState::Terminated)
    }

    /// Whether the lifecycle allows going from `self` to `to`.
    pub fn can_transition_to(self, to: NodeState) -> bool {
        use NodeState::*;
        matches!(
            (self, to),
            (Requested, Booting)
                | (Requested | Booting, Ready)
                | (Requested | Booting | Ready, Draining)
                | (Requested | Booting | Ready | Draining, Terminating)
                | (
                    Requested | Booting | Ready | Draining | Terminating,
                    Terminated
                )
        )
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NodeState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        NodeState::ALL
            .into_iter()
            .find(|n| n.as_str() == s)
            .ok_or_else(|| format!("unknown node state {s:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notice_windows_match_the_clouds_documentation() {
        assert_eq!(Cloud::Aws.notice_window_secs(), 120);
        assert_eq!(Cloud::Gcp.notice_window_secs(), 30);
        assert_eq!(Cloud::Azure.notice_window_secs(), 30);
    }

    #[test]
    fn nodes_never_come_back_from_terminated() {
        for to in NodeState::ALL {
            assert!(!NodeState::Terminated.can_transition_to(to));
        }
        assert!(NodeState::Ready.can_transition_to(NodeState::Draining));
        assert!(!NodeState::Draining.can_transition_to(NodeState::Ready));
    }

    #[test]
    fn states_round_trip_through_text() {
        for s in NodeState::ALL {
            assert_eq!(s.as_str().parse(), Ok(s));
        }
        assert_eq!("on-demand".parse(), Ok(Market::OnDemand));
        assert_eq!("GCP".parse(), Ok(Cloud::Gcp));
    }
}
