//! What one replica of a job asks for.
//!
//! A replica wants GPU capacity in exactly one of three forms — whole GPUs, one MIG instance,
//! or a share of one GPU — plus CPU and memory on the same node. The JSON form is one object
//! with exactly one of `gpus`, `mig` or `gpu_milli`, and optionally `models` to restrict the
//! GPU models: `{"gpus": 2, "models": ["H100-80GB"]}`, `{"mig": "3g.40gb"}`,
//! `{"gpu_milli": 500}`. `{"gpus": 0}` is a CPU-only replica.

use serde::{Deserialize, Serialize};

use crate::gpu::GpuModel;
use crate::mig::MigProfile;
use crate::validate::FieldErrors;

/// The most whole GPUs one replica may ask for (the largest GPU nodes have 8; 16 leaves room).
pub const MAX_GPUS_PER_REPLICA: u32 = 16;
/// One whole GPU in thousandths.
pub const GPU_MILLI: u32 = 1000;

/// The GPU part of a replica's request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "ShapeWire", into = "ShapeWire")]
pub enum GpuShape {
    /// `gpus` whole GPUs on one node, of one of `models` (any model when empty).
    Whole { gpus: u32, models: Vec<GpuModel> },
    /// One MIG instance of `profile`, on one of `models` (any model offering it when empty).
    Mig {
        profile: MigProfile,
        models: Vec<GpuModel>,
    },
    /// A share of one GPU in thousandths (time-slicing/MPS); shares on a GPU sum to ≤ 1000.
    Shared {
        gpu_milli: u32,
        models: Vec<GpuModel>,
    },
}

/// The wire form: one object, exactly one of `gpus`, `mig`, `gpu_milli`. Its OpenAPI schema
/// (named `GpuShape`) is written by hand below: a `oneOf` of the three forms, so a schema-valid
/// shape is one the API accepts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShapeWire {
    /// Number of whole GPUs on one node (0 for a CPU-only replica).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// One MIG instance of this profile (e.g. `3g.40gb`, `nvidia.com/mig-1g.10gb`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigProfile>,
    /// A share of one GPU in thousandths, 1 to 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_milli: Option<u32>,
    /// Allowed GPU models; any when absent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<GpuModel>,
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for ShapeWire {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::ToSchema;
        use utoipa::openapi::schema::{
            AdditionalProperties, ArrayBuilder, ObjectBuilder, OneOfBuilder, SchemaType, Type,
        };
        // Each form is closed, holds its one field and may list `models`: an object with two
        // of the fields matches no form, as the API refuses it.
        let form = |field: &str, schema: utoipa::openapi::RefOr<_>| {
            ObjectBuilder::new()
                .schema_type(SchemaType::new(Type::Object))
                .property(field, schema)
                .required(field)
                .property(
                    "models",
                    ArrayBuilder::new()
                        .items(utoipa::openapi::Ref::from_schema_name(
                            <GpuModel as ToSchema>::name(),
                        ))
                        .unique_items(true)
                        .description(Some("Allowed GPU models; any when absent.")),
                )
                .additional_properties(Some(
                    AdditionalProperties::<utoipa::openapi::schema::Schema>::FreeForm(false),
                ))
        };
        let count = |min: u32, max: u32, what: &str| {
            ObjectBuilder::new()
                .schema_type(SchemaType::new(Type::Integer))
                .minimum(Some(min))
                .maximum(Some(max))
                .description(Some(what.to_owned()))
                .into()
        };
        OneOfBuilder::new()
            .item(form(
                "gpus",
                count(
                    0,
                    MAX_GPUS_PER_REPLICA,
                    "Number of whole GPUs on one node (0 for a CPU-only replica).",
                ),
            ))
            .item(form("mig", MigProfile::schema()))
            .item(form(
                "gpu_milli",
                count(1, GPU_MILLI, "A share of one GPU in thousandths."),
            ))
            .description(Some(
                "What each replica needs of GPUs: exactly one of `gpus`, `mig` or `gpu_milli`.",
            ))
            .examples([serde_json::json!({"mig": "3g.40gb"})])
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for ShapeWire {
    fn name() -> std::borrow::Cow<'static, str> {
        "GpuShape".into()
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use utoipa::{PartialSchema, ToSchema};
        schemas.push((
            <GpuModel as ToSchema>::name().into(),
            <GpuModel as PartialSchema>::schema(),
        ));
    }
}

impl TryFrom<ShapeWire> for GpuShape {
    type Error = String;

    fn try_from(w: ShapeWire) -> Result<Self, Self::Error> {
        match (w.gpus, w.mig, w.gpu_milli) {
            (Some(gpus), None, None) => Ok(GpuShape::Whole {
                gpus,
                models: w.models,
            }),
            (None, Some(profile), None) => Ok(GpuShape::Mig {
                profile,
                models: w.models,
            }),
            (None, None, Some(gpu_milli)) => Ok(GpuShape::Shared {
                gpu_milli,
                models: w.models,
            }),
            _ => Err("exactly one of `gpus`, `mig` or `gpu_milli` must be given".into()),
        }
    }
}

impl From<GpuShape> for ShapeWire {
    fn from(s: GpuShape) -> Self {
        match s {
            GpuShape::Whole { gpus, models } => ShapeWire {
                gpus: Some(gpus),
                mig: None,
                gpu_milli: None,
                models,
            },
            GpuShape::Mig { profile, models } => ShapeWire {
                gpus: None,
                mig: Some(profile),
                gpu_milli: None,
                models,
            },
            GpuShape::Shared { gpu_milli, models } => ShapeWire {
                gpus: None,
                mig: None,
                gpu_milli: Some(gpu_milli),
                models,
            },
        }
    }
}

impl GpuShape {
    pub fn models(&self) -> &[GpuModel] {
        match self {
            GpuShape::Whole { models, .. }
            | GpuShape::Mig { models, .. }
            | GpuShape::Shared { models, .. } => models,
        }
    }

    /// Whether a GPU of `model` could serve this shape at all (ignoring what is free).
    pub fn allows_model(&self, model: GpuModel) -> bool {
        let listed = self.models().is_empty() || self.models().contains(&model);
        match self {
            GpuShape::Mig { profile, .. } => listed && profile.class_on(model).is_some(),
            _ => listed,
        }
    }

    /// GPU demand in thousandths of a GPU, for quota accounting: a MIG instance counts as its
    /// compute slices out of seven.
    pub fn gpu_milli(&self) -> u32 {
        match self {
            GpuShape::Whole { gpus, .. } => gpus * GPU_MILLI,
            GpuShape::Mig { profile, .. } => (u32::from(profile.compute) * GPU_MILLI).div_ceil(7),
            GpuShape::Shared { gpu_milli, .. } => *gpu_milli,
        }
    }

    /// Checks ranges and that the listed models can serve the shape.
    pub fn validate(&self) -> FieldErrors {
        let mut errs = FieldErrors::new();
        match self {
            GpuShape::Whole { gpus, .. } => {
                if *gpus > MAX_GPUS_PER_REPLICA {
                    errs.push(
                        "gpus",
                        format!("must be between 0 and {MAX_GPUS_PER_REPLICA}, got {gpus}"),
                    );
                }
            }
            GpuShape::Mig { profile, models } => {
                for (i, m) in models.iter().enumerate() {
                    if profile.class_on(*m).is_none() {
                        errs.push(
                            format!("models[{i}]"),
                            format!("{m} has no MIG profile {profile}"),
                        );
                    }
                }
            }
            GpuShape::Shared { gpu_milli, .. } => {
                if *gpu_milli == 0 || *gpu_milli > GPU_MILLI {
                    errs.push(
                        "gpu_milli",
                        format!("must be between 1 and {GPU_MILLI}, got {gpu_milli}"),
                    );
                }
            }
        }
        let mut seen = Vec::new();
        for (i, m) in self.models().iter().enumerate() {
            if seen.contains(m) {
                errs.push(format!("models[{i}]"), format!("{m} is listed twice"));
            }
            seen.push(*m);
        }
        errs
    }
}

/// Everything one replica needs on one node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ResourceShape {
    pub gpu: GpuShape,
    pub cpu_milli: u32,
    pub memory_mib: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<GpuShape, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn the_three_documented_forms_parse() {
        assert_eq!(
            parse(r#"{"gpus": 2, "models": ["H100-80GB"]}"#),
            Ok(GpuShape::Whole {
                gpus: 2,
                models: vec![GpuModel::H100_80GB]
            })
        );
        assert!(matches!(
            parse(r#"{"mig": "nvidia.com/mig-3g.40gb"}"#),
            Ok(GpuShape::Mig { .. })
        ));
        assert_eq!(
            parse(r#"{"gpu_milli": 500}"#),
            Ok(GpuShape::Shared {
                gpu_milli: 500,
                models: vec![]
            })
        );
    }

    #[test]
    fn zero_or_two_forms_are_rejected_with_a_reason() {
        let e = parse(r#"{"gpus": 1, "gpu_milli": 5}"#).expect_err("two forms");
        assert!(e.contains("exactly one"), "{e}");
        assert!(parse("{}").is_err());
        assert!(parse(r#"{"gpus": 1, "colour": "red"}"#).is_err());
    }

    #[test]
    fn serialization_is_the_wire_form() {
        let s = GpuShape::Shared {
            gpu_milli: 250,
            models: vec![],
        };
        assert_eq!(
            serde_json::to_string(&s).expect("ser"),
            r#"{"gpu_milli":250}"#
        );
    }

    #[test]
    fn validation_names_the_field() {
        let bad = GpuShape::Shared {
            gpu_milli: 1001,
            models: vec![],
        };
        assert_eq!(
            bad.validate().iter().next().map(|e| e.field.as_str()),
            Some("gpu_milli")
        );
        let bad = GpuShape::Mig {
            profile: "3g.40gb".parse().expect("p"),
            models: vec![GpuModel::A100_40GB],
        };
        assert_eq!(
            bad.validate().iter().next().map(|e| e.field.as_str()),
            Some("models[0]")
        );
        let bad = GpuShape::Whole {
            gpus: 17,
            models: vec![],
        };
        assert!(!bad.validate().is_empty());
    }

    #[test]
    fn mig_shapes_only_allow_models_that_offer_the_profile() {
        let s = GpuShape::Mig {
            profile: "3g.40gb".parse().expect("p"),
            models: vec![],
        };
        assert!(s.allows_model(GpuModel::H100_80GB));
        assert!(s.allows_model(GpuModel::A100_80GB));
        assert!(!s.allows_model(GpuModel::A100_40GB));
        assert!(!s.allows_model(GpuModel::L4));
    }

    #[test]
    fn quota_accounting_counts_mig_as_compute_sevenths() {
        let s = GpuShape::Mig {
            profile: "7g.80gb".parse().expect("p"),
            models: vec![],
        };
        assert_eq!(s.gpu_milli(), 1000);
        let s = GpuShape::Mig {
            profile: "1g.10gb".parse().expect("p"),
            models: vec![],
        };
        assert_eq!(s.gpu_milli(), 143);
    }
}
