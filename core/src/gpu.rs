//! GPU models.
//!
//! The models spotplane can schedule on: the data-centre GPUs the clouds rent, plus the models
//! named in the Alibaba openb trace (`../shared/data/gpu-trace/openb`), so that the trace can be
//! replayed as it was recorded. Names are canonical (`H100-80GB`); the spellings used by clouds,
//! Kubernetes labels and the trace are accepted as aliases when parsing.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GpuModel {
    A100_40GB,
    A100_80GB,
    H100_80GB,
    H200_141GB,
    B200_180GB,
    L40S,
    L4,
    A10G,
    A10,
    T4,
    V100_16GB,
    V100_32GB,
    P100,
    RtxPro6000,
    /// Anonymised model "G2" of the openb trace.
    OpenbG2,
    /// Anonymised model "G3" of the openb trace.
    OpenbG3,
}

/// Returned for a GPU model name spotplane does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU model {0:?}; known models: {known}", known = GpuModel::ALL.iter().map(|m| m.name()).collect::<Vec<_>>().join(", "))]
pub struct UnknownGpuModel(pub String);

impl GpuModel {
    /// The product name NVML gives (`nvmlDeviceGetName`), which dcgm-exporter puts in its
    /// `modelName` label; an agent's inventory carries the real one.
    pub const fn product_name(self) -> &'static str {
        match self {
            GpuModel::A100_40GB => "NVIDIA A100-SXM4-40GB",
            GpuModel::A100_80GB => "NVIDIA A100-SXM4-80GB",
            GpuModel::H100_80GB => "NVIDIA H100 80GB HBM3",
            GpuModel::H200_141GB => "NVIDIA H200",
            GpuModel::B200_180GB => "NVIDIA B200",
            GpuModel::L40S => "NVIDIA L40S",
            GpuModel::L4 => "NVIDIA L4",
            GpuModel::A10G => "NVIDIA A10G",
            GpuModel::A10 => "NVIDIA A10",
            GpuModel::T4 => "Tesla T4",
            GpuModel::V100_16GB => "Tesla V100-SXM2-16GB",
            GpuModel::V100_32GB => "Tesla V100-SXM2-32GB",
            GpuModel::P100 => "Tesla P100-PCIE-16GB",
            GpuModel::RtxPro6000 => "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            GpuModel::OpenbG2 => "G2",
            GpuModel::OpenbG3 => "G3",
        }
    }

    /// The board's power limit in watts (its data sheet's TDP), for simulated readings.
    pub const fn power_limit_w(self) -> u32 {
        match self {
            GpuModel::A100_40GB | GpuModel::A100_80GB | GpuModel::OpenbG2 => 400,
            GpuModel::H100_80GB | GpuModel::H200_141GB => 700,
            GpuModel::B200_180GB => 1000,
            GpuModel::L40S => 350,
            GpuModel::L4 => 72,
            GpuModel::A10G | GpuModel::A10 => 150,
            GpuModel::T4 => 70,
            GpuModel::V100_16GB | GpuModel::V100_32GB => 300,
            GpuModel::P100 => 250,
            GpuModel::RtxPro6000 => 600,
            GpuModel::OpenbG3 => 300,
        }
    }

    pub const ALL: [GpuModel; 16] = [
        GpuModel::A100_40GB,
        GpuModel::A100_80GB,
        GpuModel::H100_80GB,
        GpuModel::H200_141GB,
        GpuModel::B200_180GB,
        GpuModel::L40S,
        GpuModel::L4,
        GpuModel::A10G,
        GpuModel::A10,
        GpuModel::T4,
        GpuModel::V100_16GB,
        GpuModel::V100_32GB,
        GpuModel::P100,
        GpuModel::RtxPro6000,
        GpuModel::OpenbG2,
        GpuModel::OpenbG3,
    ];

    /// The canonical name, as the API writes it.
    pub const fn name(self) -> &'static str {
        match self {
            GpuModel::A100_40GB => "A100-40GB",
            GpuModel::A100_80GB => "A100-80GB",
            GpuModel::H100_80GB => "H100-80GB",
            GpuModel::H200_141GB => "H200-141GB",
            GpuModel::B200_180GB => "B200-180GB",
            GpuModel::L40S => "L40S",
            GpuModel::L4 => "L4",
            GpuModel::A10G => "A10G",
            GpuModel::A10 => "A10",
            GpuModel::T4 => "T4",
            GpuModel::V100_16GB => "V100-16GB",
            GpuModel::V100_32GB => "V100-32GB",
            GpuModel::P100 => "P100",
            GpuModel::RtxPro6000 => "RTX-PRO-6000",
            GpuModel::OpenbG2 => "G2",
            GpuModel::OpenbG3 => "G3",
        }
    }

    /// Other spellings accepted when parsing: cloud accelerator names (GCP
    /// `nvidia-tesla-a100`), the openb trace's labels (`V100M16`) and short forms.
    const fn aliases(self) -> &'static [&'static str] {
        match self {
            GpuModel::A100_40GB => &["A100", "nvidia-tesla-a100", "A100-SXM4-40GB"],
            GpuModel::A100_80GB => &["nvidia-a100-80gb", "A100-SXM4-80GB"],
            GpuModel::H100_80GB => &[
                "H100",
                "nvidia-h100-80gb",
                "nvidia-h100-mega-80gb",
                "H100-SXM5-80GB",
            ],
            GpuModel::H200_141GB => &["H200", "nvidia-h200-141gb"],
            GpuModel::B200_180GB => &["B200", "nvidia-b200"],
            // AWS g6e and GCP's G2 successor; not the L40 (no S), a different card.
            GpuModel::L40S => &["nvidia-l40s", "L40S-48GB"],
            GpuModel::L4 => &["nvidia-l4"],
            GpuModel::A10G => &[],
            GpuModel::A10 => &[],
            GpuModel::T4 => &["nvidia-tesla-t4"],
            GpuModel::V100_16GB => &["V100", "V100M16", "nvidia-tesla-v100"],
            GpuModel::V100_32GB => &["V100M32"],
            GpuModel::P100 => &["nvidia-tesla-p100"],
            GpuModel::RtxPro6000 => &["nvidia-rtx-pro-6000", "RTX PRO 6000"],
            GpuModel::OpenbG2 => &[],
            GpuModel::OpenbG3 => &[],
        }
    }

    /// Device memory in MiB as sold (the label), or `None` where the trace anonymised the
    /// model. NVML reports a little less; the scheduler prefers NVML's figure where known.
    pub const fn memory_mib(self) -> Option<u32> {
        match self {
            GpuModel::A100_40GB => Some(40 * 1024),
            GpuModel::A100_80GB => Some(80 * 1024),
            GpuModel::H100_80GB => Some(80 * 1024),
            GpuModel::H200_141GB => Some(141 * 1024),
            GpuModel::B200_180GB => Some(180 * 1024),
            GpuModel::L40S => Some(48 * 1024),
            GpuModel::L4 => Some(24 * 1024),
            GpuModel::A10G => Some(24 * 1024),
            GpuModel::A10 => Some(24 * 1024),
            GpuModel::T4 => Some(16 * 1024),
            GpuModel::V100_16GB => Some(16 * 1024),
            GpuModel::V100_32GB => Some(32 * 1024),
            GpuModel::P100 => Some(16 * 1024),
            GpuModel::RtxPro6000 => Some(96 * 1024),
            GpuModel::OpenbG2 | GpuModel::OpenbG3 => None,
        }
    }

    /// Whether spotplane can partition this model with MIG (its geometry is in [`crate::mig`]).
    /// The RTX PRO 6000 supports MIG in hardware, but with a four-slice geometry spotplane does
    /// not model yet, so it is scheduled as whole or shared GPUs only.
    pub const fn mig_capable(self) -> bool {
        matches!(
            self,
            GpuModel::A100_40GB
                | GpuModel::A100_80GB
                | GpuModel::H100_80GB
                | GpuModel::H200_141GB
                | GpuModel::B200_180GB
        )
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for GpuModel {
    type Err = UnknownGpuModel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        GpuModel::ALL
            .into_iter()
            .find(|m| {
                m.name().eq_ignore_ascii_case(wanted)
                    || m.aliases().iter().any(|a| a.eq_ignore_ascii_case(wanted))
            })
            .ok_or_else(|| UnknownGpuModel(s.to_owned()))
    }
}

impl Serialize for GpuModel {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for GpuModel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for GpuModel {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
        ObjectBuilder::new()
            .schema_type(SchemaType::new(Type::String))
            .enum_values(Some(GpuModel::ALL.iter().map(|m| m.name())))
            .description(Some("GPU model; cloud and trace spellings (e.g. `nvidia-tesla-t4`, `V100M16`) are accepted on input."))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for GpuModel {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_round_trips_through_its_name() {
        for m in GpuModel::ALL {
            assert_eq!(m.name().parse::<GpuModel>(), Ok(m));
            assert_eq!(m.name().to_lowercase().parse::<GpuModel>(), Ok(m));
        }
    }

    #[test]
    fn openb_trace_labels_are_understood() {
        for label in ["G2", "T4", "P100", "V100M16", "G3", "V100M32", "A10"] {
            assert!(label.parse::<GpuModel>().is_ok(), "{label}");
        }
        assert_eq!("V100M32".parse(), Ok(GpuModel::V100_32GB));
    }

    #[test]
    fn cloud_accelerator_names_are_aliases() {
        assert_eq!("nvidia-tesla-t4".parse(), Ok(GpuModel::T4));
        assert_eq!("nvidia-a100-80gb".parse(), Ok(GpuModel::A100_80GB));
        assert!("Z9000".parse::<GpuModel>().is_err());
    }

    #[test]
    fn only_the_modelled_mig_gpus_are_mig_capable() {
        assert!(GpuModel::H100_80GB.mig_capable());
        assert!(!GpuModel::L4.mig_capable());
        assert!(!GpuModel::T4.mig_capable());
    }
}
