//! Teams: who shares the cluster, with what weight and quotas.
//!
//! The vocabulary follows Kueue's ClusterQueue: a nominal quota per resource flavour (a GPU
//! model, or a MIG profile), a cohort within which idle quota is lent, and limits on how much a
//! team may borrow and lend. Weights drive fair sharing by weighted dominant share.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::gpu::GpuModel;
use crate::mig::MigProfile;
use crate::validate::FieldErrors;

/// A resource flavour a quota is set on: whole/shared GPUs of a model (counted in GPUs), or
/// instances of a MIG profile. Written `H100-80GB` or `mig-3g.40gb` (`nvidia.com/mig-3g.40gb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuotaResource {
    Gpu(GpuModel),
    Mig(MigProfile),
}

impl fmt::Display for QuotaResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaResource::Gpu(m) => write!(f, "{m}"),
            QuotaResource::Mig(p) => write!(f, "mig-{p}"),
        }
    }
}

impl FromStr for QuotaResource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(m) = s.parse::<GpuModel>() {
            return Ok(QuotaResource::Gpu(m));
        }
        let lower = s.to_ascii_lowercase();
        if lower.starts_with("mig-") || lower.starts_with("nvidia.com/mig-") {
            return s
                .parse::<MigProfile>()
                .map(QuotaResource::Mig)
                .map_err(|e| e.to_string());
        }
        Err(format!(
            "{s:?} is neither a GPU model (e.g. H100-80GB) nor a MIG profile written mig-<profile> (e.g. mig-3g.40gb)"
        ))
    }
}

impl Serialize for QuotaResource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for QuotaResource {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A team's quota on one resource flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Guaranteed amount: GPUs for a model, instances for a MIG profile.
    pub nominal: u32,
    /// How much more than nominal the team may borrow from its cohort; unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing_limit: Option<u32>,
    /// How much of its nominal quota the team lends to its cohort; all of it when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending_limit: Option<u32>,
}

/// The most GPUs a quota may name (a sanity bound against typos, not a product limit).
pub const MAX_QUOTA: u32 = 1_000_000;

/// Bounds of a team's fair-share weight. Shares are divided by weights, so a weight such as
/// 1e-300 would turn any use into an absurd share; the floor is a thousandth.
pub const MIN_WEIGHT: f64 = 0.001;
pub const MAX_WEIGHT: f64 = 1000.0;

/// Validates a team's settings; paths are relative to the team object.
pub fn validate_team_settings(
    name: Option<&str>,
    weight: Option<f64>,
    cohort: Option<&str>,
    quotas: Option<&BTreeMap<QuotaResource, Quota>>,
) -> FieldErrors {
    let mut errs = FieldErrors::new();
    if let Some(n) = name {
        errs.check_name("name", n);
    }
    if let Some(w) = weight
        && !(MIN_WEIGHT..=MAX_WEIGHT).contains(&w)
    {
        errs.push(
            "weight",
            format!("must be between {MIN_WEIGHT} and {MAX_WEIGHT}, got {w}"),
        );
    }
    if let Some(c) = cohort {
        errs.check_name("cohort", c);
    }
    if let Some(q) = quotas {
        for (res, quota) in q {
            let path = format!("quotas.{res}");
            if quota.nominal > MAX_QUOTA {
                errs.push(
                    format!("{path}.nominal"),
                    format!("must be at most {MAX_QUOTA}"),
                );
            }
            if let Some(l) = quota.lending_limit
                && l > quota.nominal
            {
                errs.push(
                    format!("{path}.lending_limit"),
                    "cannot lend more than the nominal quota",
                );
            }
            if quota.borrowing_limit.is_some_and(|b| b > MAX_QUOTA) {
                errs.push(
                    format!("{path}.borrowing_limit"),
                    format!("must be at most {MAX_QUOTA}"),
                );
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weight_must_be_between_a_thousandth_and_a_thousand() {
        for w in [
            1e-300,
            f64::MIN_POSITIVE,
            0.0,
            -1.0,
            0.0009,
            1000.5,
            f64::NAN,
            f64::INFINITY,
        ] {
            let errs = validate_team_settings(None, Some(w), None, None);
            let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
            assert_eq!(fields, ["weight"], "{w}");
        }
        for w in [MIN_WEIGHT, 1.0, MAX_WEIGHT] {
            assert!(
                validate_team_settings(None, Some(w), None, None).is_empty(),
                "{w}"
            );
        }
    }

    #[test]
    fn quota_resources_parse_models_and_mig_profiles() {
        assert_eq!(
            "H100-80GB".parse(),
            Ok(QuotaResource::Gpu(GpuModel::H100_80GB))
        );
        let mig: QuotaResource = "nvidia.com/mig-3g.40gb".parse().expect("k8s form");
        assert_eq!(mig.to_string(), "mig-3g.40gb");
        assert!("3g.40gb".parse::<QuotaResource>().is_err());
        assert!("widgets".parse::<QuotaResource>().is_err());
    }

    #[test]
    fn team_settings_are_checked_field_by_field() {
        let mut q = BTreeMap::new();
        q.insert(
            QuotaResource::Gpu(GpuModel::T4),
            Quota {
                nominal: 4,
                borrowing_limit: None,
                lending_limit: Some(5),
            },
        );
        let errs = validate_team_settings(Some("ok"), Some(0.0), Some("Bad"), Some(&q));
        let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["weight", "cohort", "quotas.T4.lending_limit"]);
    }
}
