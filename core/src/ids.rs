//! Identifiers.
//!
//! Entity ids are UUIDv7 (time-ordered, so "newest first" is "largest id first" and ids make
//! good pagination cursors). Each kind has its own type so a node id can never be passed where a
//! job id is expected. Teams are addressed by their name, which users choose.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::validate::check_name;

/// Returned when a string is not a valid id or name; says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind}: {reason}")]
pub struct ParseIdError {
    pub kind: &'static str,
    pub reason: String,
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(value_type = String, format = Uuid))]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A new id whose leading bits are the given Unix time in milliseconds, so ids made
            /// later sort after ids made earlier. The caller supplies the time (core reads no clock).
            pub fn new_at(unix_millis: u64, random: u128) -> Self {
                Self(uuid::Builder::from_unix_timestamp_millis(unix_millis, &random.to_le_bytes()[..10].try_into().unwrap_or([0; 10])).into_uuid())
            }

            pub fn from_uuid(u: Uuid) -> Self {
                Self(u)
            }

            pub fn as_uuid(&self) -> &Uuid {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self).map_err(|e| ParseIdError {
                    kind: $kind,
                    reason: e.to_string(),
                })
            }
        }
    };
}

uuid_id!(
    /// A job (a gang of replicas).
    JobId,
    "job id"
);
uuid_id!(
    /// A node: one cloud instance, from request to termination.
    NodeId,
    "node id"
);
uuid_id!(
    /// An API token (the id, never the secret).
    TokenId,
    "token id"
);
uuid_id!(
    /// A checkpoint of a job.
    CheckpointId,
    "checkpoint id"
);
uuid_id!(
    /// A command sent to a node agent.
    CommandId,
    "command id"
);

/// A team's name, which is also how the API addresses it (`/v1/teams/{team}`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(value_type = String, example = "research"))]
#[serde(transparent)]
pub struct TeamName(String);

impl TeamName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for TeamName {
    type Err = ParseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        check_name(s).map_err(|reason| ParseIdError {
            kind: "team name",
            reason,
        })?;
        Ok(Self(s.to_owned()))
    }
}

impl<'de> Deserialize<'de> for TeamName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for TeamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for TeamName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_made_later_sort_after_ids_made_earlier() {
        let a = JobId::new_at(1_000, u128::MAX);
        let b = JobId::new_at(1_001, 0);
        assert!(a < b);
        assert_eq!(a.0.get_version_num(), 7);
    }

    #[test]
    fn ids_round_trip_through_their_text_form() {
        let id = NodeId::new_at(1_700_000_000_000, 42);
        let parsed: NodeId = id.to_string().parse().expect("parses");
        assert_eq!(parsed, id);
        assert!("not-a-uuid".parse::<NodeId>().is_err());
    }

    #[test]
    fn team_names_are_validated_when_parsed_and_deserialized() {
        assert!("research".parse::<TeamName>().is_ok());
        assert!("Research".parse::<TeamName>().is_err());
        assert!(serde_json::from_str::<TeamName>("\"has space\"").is_err());
    }
}
