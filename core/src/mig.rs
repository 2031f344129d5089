//! MIG geometry (NVIDIA Multi-Instance GPU), as data.
//!
//! A MIG-capable GPU has 7 compute slices and 8 memory slices. An instance of a class occupies
//! `memory_slices` consecutive memory slices and may start only at the class's allowed
//! memory-slice indices; instances never overlap (NVIDIA MIG User Guide, `nvidia-smi mig -lgipp`;
//! ../shared/REFERENCE.md). The same six classes exist on every modelled GPU, under names that
//! depend on the model's memory: `1g.10gb` is the single-slice class on an H100-80GB but the
//! double-memory single-slice class on an A100-40GB. So a [`MigProfile`] (what a user asks for)
//! is resolved to a [`MigClass`] (what the geometry is about) per GPU model.
//!
//! Placements are tracked as a bitmask of memory slices, so checking a layout or finding where a
//! new instance may go is a handful of bit operations.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::gpu::GpuModel;

/// Compute slices on a MIG-capable GPU.
pub const COMPUTE_SLICES: u8 = 7;
/// Memory slices on a MIG-capable GPU; placements are counted in these.
pub const MEMORY_SLICES: u8 = 8;

/// The six MIG instance classes, from the smallest to the whole GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum MigClass {
    /// One compute slice, one memory slice (`1g.10gb` on an H100).
    #[serde(rename = "1g")]
    G1,
    /// One compute slice, two memory slices (`1g.20gb` on an H100).
    #[serde(rename = "1g-double")]
    G1Double,
    /// Two compute slices, two memory slices.
    #[serde(rename = "2g")]
    G2,
    /// Three compute slices, four memory slices.
    #[serde(rename = "3g")]
    G3,
    /// Four compute slices, four memory slices.
    #[serde(rename = "4g")]
    G4,
    /// The whole GPU as one instance.
    #[serde(rename = "7g")]
    G7,
}

impl MigClass {
    pub const ALL: [MigClass; 6] = [
        MigClass::G1,
        MigClass::G1Double,
        MigClass::G2,
        MigClass::G3,
        MigClass::G4,
        MigClass::G7,
    ];

    const fn index(self) -> usize {
        match self {
            MigClass::G1 => 0,
            MigClass::G1Double => 1,
            MigClass::G2 => 2,
            MigClass::G3 => 3,
            MigClass::G4 => 4,
            MigClass::G7 => 5,
        }
    }

    pub const fn compute_slices(self) -> u8 {
        match self {
            MigClass::G1 | MigClass::G1Double => 1,
            MigClass::G2 => 2,
            MigClass::G3 => 3,
            MigClass::G4 => 4,
            MigClass::G7 => 7,
        }
    }

    pub const fn memory_slices(self) -> u8 {
        match self {
            MigClass::G1 => 1,
            MigClass::G1Double | MigClass::G2 => 2,
            MigClass::G3 | MigClass::G4 => 4,
            MigClass::G7 => 8,
        }
    }

    /// Memory-slice indices at which an instance of this class may start.
    pub const fn allowed_starts(self) -> &'static [u8] {
        match self {
            MigClass::G1 => &[0, 1, 2, 3, 4, 5, 6],
            MigClass::G1Double => &[0, 2, 4, 6],
            MigClass::G2 => &[0, 2, 4],
            MigClass::G3 => &[0, 4],
            MigClass::G4 | MigClass::G7 => &[0],
        }
    }

    pub const fn max_per_gpu(self) -> u8 {
        match self {
            MigClass::G1 => 7,
            MigClass::G1Double => 4,
            MigClass::G2 => 3,
            MigClass::G3 => 2,
            MigClass::G4 | MigClass::G7 => 1,
        }
    }

    /// The memory slices an instance of this class starting at `start` occupies.
    pub const fn mask_at(self, start: u8) -> u8 {
        let ones: u16 = (1u16 << self.memory_slices()) - 1;
        ((ones << start) & 0xff) as u8
    }

    /// Short name used in layouts and logs.
    pub const fn label(self) -> &'static str {
        match self {
            MigClass::G1 => "1g",
            MigClass::G1Double => "1g-double",
            MigClass::G2 => "2g",
            MigClass::G3 => "3g",
            MigClass::G4 => "4g",
            MigClass::G7 => "7g",
        }
    }
}

impl fmt::Display for MigClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Profile names per model, in the order of [`MigClass::ALL`].
const fn profile_names(model: GpuModel) -> Option<[&'static str; 6]> {
    match model {
        GpuModel::A100_40GB => Some([
            "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
        ]),
        GpuModel::A100_80GB | GpuModel::H100_80GB => Some([
            "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
        ]),
        GpuModel::H200_141GB => Some([
            "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
        ]),
        GpuModel::B200_180GB => Some([
            "1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb",
        ]),
        _ => None,
    }
}

/// The NVIDIA profile name of `class` on `model`, or `None` if the model has no MIG.
pub fn profile_name(model: GpuModel, class: MigClass) -> Option<&'static str> {
    profile_names(model).map(|names| names[class.index()])
}

/// Streaming multiprocessors of an instance, where NVIDIA documents them (A100, H100 SXM) or
/// a driver was seen to report them (H200: `nvidia-smi mig -lgip`, driver 580).
pub fn sm_count(model: GpuModel, class: MigClass) -> Option<u16> {
    let table: [u16; 6] = match model {
        GpuModel::A100_40GB | GpuModel::A100_80GB => [14, 14, 28, 42, 56, 98],
        GpuModel::H100_80GB | GpuModel::H200_141GB => [16, 26, 32, 60, 64, 132],
        _ => return None,
    };
    Some(table[class.index()])
}

/// Memory an instance really offers in MiB: NVIDIA's figures where documented (H100) or a
/// driver was seen to report them (H200), else the label. NVML's report from the node agent
/// overrides these once a node has registered.
pub fn usable_memory_mib(model: GpuModel, class: MigClass) -> Option<u32> {
    match model {
        GpuModel::H100_80GB => {
            // 9.75, 19.62, 19.62, 39.50, 39.50, 79.25 GiB
            let mib = [9_984, 20_090, 20_090, 40_448, 40_448, 81_152];
            return Some(mib[class.index()]);
        }
        GpuModel::H200_141GB => {
            // 16.00, 32.50, 32.50, 69.75, 69.75, 140.00 GiB (`nvidia-smi mig -lgip`, driver 580)
            let mib = [16_384, 33_280, 33_280, 71_424, 71_424, 143_360];
            return Some(mib[class.index()]);
        }
        _ => {}
    }
    let name = profile_name(model, class)?;
    let gb: u32 = name
        .split_once('.')?
        .1
        .trim_end_matches("gb")
        .parse()
        .ok()?;
    Some(gb * 1024)
}

/// A MIG profile as a user asks for it: `3g.40gb`. Accepts the Kubernetes device-plugin
/// spelling (`nvidia.com/mig-3g.40gb`) and the `mig-` prefix too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigProfile {
    /// Compute slices (the `3` of `3g.40gb`).
    pub compute: u8,
    /// Memory label in GB (the `40` of `3g.40gb`).
    pub memory_gb: u16,
}

/// A profile name that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseMigProfileError {
    #[error(
        "{0:?} is not a MIG profile; expected a name such as 3g.40gb or nvidia.com/mig-3g.40gb"
    )]
    Malformed(String),
    #[error("{0:?}: media-extension and graphics profiles (+me, +gfx) are not supported")]
    Extension(String),
    #[error("{0:?} is not a MIG profile of any supported GPU model")]
    Unknown(String),
}

impl MigProfile {
    /// The class this profile is on `model`, if the model offers it.
    pub fn class_on(self, model: GpuModel) -> Option<MigClass> {
        let names = profile_names(model)?;
        let wanted = self.to_string();
        MigClass::ALL
            .into_iter()
            .find(|c| names[c.index()] == wanted)
    }

    /// Every GPU model that offers this profile.
    pub fn models(self) -> Vec<GpuModel> {
        GpuModel::ALL
            .into_iter()
            .filter(|m| self.class_on(*m).is_some())
            .collect()
    }

    /// The profile of `class` on `model`.
    pub fn of(model: GpuModel, class: MigClass) -> Option<MigProfile> {
        profile_name(model, class).and_then(|n| n.parse().ok())
    }
}

impl fmt::Display for MigProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}g.{}gb", self.compute, self.memory_gb)
    }
}

impl FromStr for MigProfile {
    type Err = ParseMigProfileError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        let bare = lower.strip_prefix("nvidia.com/").unwrap_or(&lower);
        let bare = bare.strip_prefix("mig-").unwrap_or(bare);
        if bare.contains('+') {
            return Err(ParseMigProfileError::Extension(s.to_owned()));
        }
        let malformed = || ParseMigProfileError::Malformed(s.to_owned());
        let (g, mem) = bare.split_once('.').ok_or_else(malformed)?;
        let compute: u8 = g
            .strip_suffix('g')
            .ok_or_else(malformed)?
            .parse()
            .map_err(|_| malformed())?;
        let memory_gb: u16 = mem
            .strip_suffix("gb")
            .ok_or_else(malformed)?
            .parse()
            .map_err(|_| malformed())?;
        let profile = MigProfile { compute, memory_gb };
        if profile.models().is_empty() {
            return Err(ParseMigProfileError::Unknown(s.to_owned()));
        }
        Ok(profile)
    }
}

impl Serialize for MigProfile {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MigProfile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for MigProfile {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
        ObjectBuilder::new()
            .schema_type(SchemaType::new(Type::String))
            .pattern(Some(r"^(nvidia\.com/)?(mig-)?[1-7]g\.[0-9]+gb$"))
            .examples(["3g.40gb", "nvidia.com/mig-1g.10gb"])
            .description(Some(
                "MIG profile; the Kubernetes spelling nvidia.com/mig-<profile> is accepted.",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for MigProfile {}

/// One MIG instance on a GPU: its class and the memory slice it starts at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MigInstance {
    pub class: MigClass,
    pub start: u8,
}

impl MigInstance {
    pub const fn new(class: MigClass, start: u8) -> Self {
        Self { class, start }
    }

    pub const fn mask(self) -> u8 {
        self.class.mask_at(self.start)
    }
}

impl fmt::Display for MigInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.class, self.start)
    }
}

/// Why a set of instances is not a valid layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigLayoutError {
    #[error("a {class} instance may not start at memory slice {start}; allowed starts are {allowed:?}", allowed = .class.allowed_starts())]
    StartNotAllowed { class: MigClass, start: u8 },
    #[error("{a} overlaps {b}")]
    Overlap { a: MigInstance, b: MigInstance },
    #[error("the layout needs {needed} compute slices; a GPU has {COMPUTE_SLICES}")]
    TooMuchCompute { needed: u8 },
    #[error("at most {max} instances of class {class} fit on one GPU")]
    TooMany { class: MigClass, max: u8 },
    #[error("{model} does not support MIG")]
    NotMigCapable { model: GpuModel },
    #[error("{profile} is not a MIG profile of {model}")]
    ProfileNotOnModel {
        profile: MigProfile,
        model: GpuModel,
    },
    #[error("no layout of one GPU holds {0}")]
    DoesNotFit(String),
}

/// The MIG instances of one GPU, kept sorted by start slice. An empty layout is a GPU with MIG
/// enabled and no instance created.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "Vec<MigInstance>", into = "Vec<MigInstance>")]
pub struct MigLayout {
    instances: Vec<MigInstance>,
}

impl MigLayout {
    pub fn empty() -> Self {
        Self::default()
    }

    /// One instance spanning the whole GPU.
    pub fn full() -> Self {
        Self {
            instances: vec![MigInstance::new(MigClass::G7, 0)],
        }
    }

    /// Builds a layout, checking it (see [`validate`]).
    pub fn new(mut instances: Vec<MigInstance>) -> Result<Self, MigLayoutError> {
        validate(&instances)?;
        instances.sort_by_key(|i| (i.start, i.class));
        Ok(Self { instances })
    }

    pub fn instances(&self) -> &[MigInstance] {
        &self.instances
    }

    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }

    /// Memory slices in use, as a bitmask (bit i = slice i).
    pub fn used_mask(&self) -> u8 {
        self.instances.iter().fold(0, |m, i| m | i.mask())
    }

    pub fn used_compute(&self) -> u8 {
        self.instances
            .iter()
            .map(|i| i.class.compute_slices())
            .sum()
    }

    /// Start slices at which an instance of `class` could be added without breaking the layout.
    pub fn free_starts(&self, class: MigClass) -> Vec<u8> {
        let used = self.used_mask();
        let compute_left = COMPUTE_SLICES - self.used_compute().min(COMPUTE_SLICES);
        let count = self.instances.iter().filter(|i| i.class == class).count();
        if class.compute_slices() > compute_left || count >= class.max_per_gpu() as usize {
            return Vec::new();
        }
        class
            .allowed_starts()
            .iter()
            .copied()
            .filter(|&s| class.mask_at(s) & used == 0)
            .collect()
    }

    /// Adds an instance, checking it fits.
    pub fn add(&mut self, instance: MigInstance) -> Result<(), MigLayoutError> {
        let mut next = self.instances.clone();
        next.push(instance);
        validate(&next)?;
        next.sort_by_key(|i| (i.start, i.class));
        self.instances = next;
        Ok(())
    }

    /// Removes the instance starting at `start`; returns it if there was one.
    pub fn remove_at(&mut self, start: u8) -> Option<MigInstance> {
        let pos = self.instances.iter().position(|i| i.start == start)?;
        Some(self.instances.remove(pos))
    }

    /// The layout in mig-parted's form: profile name to count, for `model`.
    pub fn counts(&self, model: GpuModel) -> BTreeMap<String, u8> {
        let mut out = BTreeMap::new();
        for i in &self.instances {
            let name = profile_name(model, i.class)
                .map_or_else(|| i.class.label().to_owned(), str::to_owned);
            *out.entry(name).or_insert(0) += 1;
        }
        out
    }

    /// Builds a layout from mig-parted's form (`{"1g.10gb": 7}`) for `model`: finds a placement
    /// of the requested instances that obeys the geometry, or says that none exists.
    pub fn from_counts(
        model: GpuModel,
        counts: &BTreeMap<MigProfile, u8>,
    ) -> Result<Self, MigLayoutError> {
        if !model.mig_capable() {
            return Err(MigLayoutError::NotMigCapable { model });
        }
        let mut wanted: Vec<MigClass> = Vec::new();
        for (profile, &n) in counts {
            let class = profile
                .class_on(model)
                .ok_or(MigLayoutError::ProfileNotOnModel {
                    profile: *profile,
                    model,
                })?;
            if n > class.max_per_gpu() {
                return Err(MigLayoutError::TooMany {
                    class,
                    max: class.max_per_gpu(),
                });
            }
            wanted.extend(std::iter::repeat_n(class, n as usize));
        }
        // Largest first: big instances have the fewest allowed starts.
        wanted.sort_by_key(|c| std::cmp::Reverse((c.memory_slices(), c.compute_slices())));
        let mut layout = MigLayout::empty();
        if place_all(&mut layout, &wanted) {
            Ok(layout)
        } else {
            let what = counts
                .iter()
                .map(|(p, n)| format!("{n}×{p}"))
                .collect::<Vec<_>>()
                .join(" + ");
            Err(MigLayoutError::DoesNotFit(what))
        }
    }
}

/// Depth-first search over start slices; at most 7 instances and 8 slices, so it is tiny.
fn place_all(layout: &mut MigLayout, rest: &[MigClass]) -> bool {
    let Some((&class, tail)) = rest.split_first() else {
        return true;
    };
    for start in layout.free_starts(class) {
        let inst = MigInstance::new(class, start);
        if layout.add(inst).is_ok() {
            if place_all(layout, tail) {
                return true;
            }
            layout.remove_at(start);
        }
    }
    false
}

impl TryFrom<Vec<MigInstance>> for MigLayout {
    type Error = MigLayoutError;
    fn try_from(v: Vec<MigInstance>) -> Result<Self, Self::Error> {
        MigLayout::new(v)
    }
}

impl From<MigLayout> for Vec<MigInstance> {
    fn from(l: MigLayout) -> Self {
        l.instances
    }
}

impl fmt::Display for MigLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.instances.is_empty() {
            return f.write_str("(empty)");
        }
        for (n, i) in self.instances.iter().enumerate() {
            if n > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{i}")?;
        }
        Ok(())
    }
}

/// Whether `instances` form a valid layout of one GPU: every instance starts at an allowed
/// slice, none overlap, at most `max_per_gpu` of a class, and no more than 7 compute slices.
pub fn validate(instances: &[MigInstance]) -> Result<(), MigLayoutError> {
    let mut used: u8 = 0;
    let mut compute: u8 = 0;
    let mut counts = [0u8; 6];
    for (n, inst) in instances.iter().enumerate() {
        if !inst.class.allowed_starts().contains(&inst.start) {
            return Err(MigLayoutError::StartNotAllowed {
                class: inst.class,
                start: inst.start,
            });
        }
        let mask = inst.mask();
        if used & mask != 0 {
            let b = instances[..n]
                .iter()
                .copied()
                .find(|o| o.mask() & mask != 0)
                .unwrap_or(*inst);
            return Err(MigLayoutError::Overlap { a: b, b: *inst });
        }
        used |= mask;
        compute += inst.class.compute_slices();
        counts[inst.class.index()] += 1;
        if counts[inst.class.index()] > inst.class.max_per_gpu() {
            return Err(MigLayoutError::TooMany {
                class: inst.class,
                max: inst.class.max_per_gpu(),
            });
        }
    }
    if compute > COMPUTE_SLICES {
        return Err(MigLayoutError::TooMuchCompute { needed: compute });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use MigClass::*;
    use proptest::prelude::*;

    fn inst(class: MigClass, start: u8) -> MigInstance {
        MigInstance::new(class, start)
    }

    #[test]
    fn documented_layouts_are_valid() {
        let cases: &[&[MigInstance]] = &[
            &[inst(G4, 0), inst(G3, 4)],
            &[inst(G3, 0), inst(G3, 4)],
            &[inst(G7, 0)],
            &[
                inst(G1, 0),
                inst(G1, 1),
                inst(G1, 2),
                inst(G1, 3),
                inst(G1, 4),
                inst(G1, 5),
                inst(G1, 6),
            ],
            &[inst(G2, 0), inst(G2, 2), inst(G2, 4), inst(G1, 6)],
            &[
                inst(G1Double, 0),
                inst(G1Double, 2),
                inst(G1Double, 4),
                inst(G1Double, 6),
            ],
            &[inst(G2, 0), inst(G1, 2), inst(G1, 3), inst(G3, 4)],
            &[inst(G4, 0), inst(G2, 4), inst(G1, 6)],
        ];
        for layout in cases {
            assert_eq!(validate(layout), Ok(()), "{layout:?}");
        }
    }

    #[test]
    fn invalid_layouts_say_why() {
        assert!(matches!(
            validate(&[inst(G3, 2)]),
            Err(MigLayoutError::StartNotAllowed {
                class: G3,
                start: 2
            })
        ));
        assert!(matches!(
            validate(&[inst(G4, 0), inst(G3, 0)]),
            Err(MigLayoutError::StartNotAllowed { .. }) | Err(MigLayoutError::Overlap { .. })
        ));
        assert!(matches!(
            validate(&[inst(G3, 4), inst(G1, 5)]),
            Err(MigLayoutError::Overlap { .. })
        ));
        assert!(matches!(
            validate(&[inst(G1, 7)]),
            Err(MigLayoutError::StartNotAllowed { .. })
        ));
        assert!(matches!(
            validate(&[inst(G7, 0), inst(G1, 0)]),
            Err(MigLayoutError::Overlap { .. })
        ));
    }

    #[test]
    fn a_1g_fits_in_slot_3_only_beside_a_3g_at_4_when_free() {
        let mut l = MigLayout::new(vec![inst(G3, 4)]).expect("valid");
        assert_eq!(l.free_starts(G1), vec![0, 1, 2, 3]);
        l.add(inst(G4, 0)).expect("4g at 0 beside 3g at 4");
        assert!(l.free_starts(G1).is_empty());
    }

    #[test]
    fn free_starts_respect_existing_instances() {
        let l = MigLayout::new(vec![inst(G2, 2)]).expect("valid");
        assert_eq!(l.free_starts(G3), vec![4]);
        assert_eq!(l.free_starts(G2), vec![0, 4]);
        assert_eq!(l.free_starts(G1Double), vec![0, 4, 6]);
        assert!(l.free_starts(G7).is_empty());
        assert!(l.free_starts(G4).is_empty());
    }

    #[test]
    fn profiles_resolve_to_classes_per_model() {
        let p: MigProfile = "1g.10gb".parse().expect("parses");
        assert_eq!(p.class_on(GpuModel::A100_40GB), Some(G1Double));
        assert_eq!(p.class_on(GpuModel::H100_80GB), Some(G1));
        assert_eq!(p.class_on(GpuModel::H200_141GB), None);
        assert_eq!(
            p.models(),
            vec![
                GpuModel::A100_40GB,
                GpuModel::A100_80GB,
                GpuModel::H100_80GB
            ]
        );
    }

    #[test]
    fn kubernetes_spellings_are_accepted() {
        let a: MigProfile = "nvidia.com/mig-3g.40gb".parse().expect("k8s form");
        let b: MigProfile = "mig-3g.40gb".parse().expect("prefix form");
        let c: MigProfile = "3G.40GB".parse().expect("upper case");
        assert_eq!(a, b);
        assert_eq!(b, c);
        assert_eq!(a.to_string(), "3g.40gb");
        assert!(matches!(
            "3g.41gb".parse::<MigProfile>(),
            Err(ParseMigProfileError::Unknown(_))
        ));
        assert!(matches!(
            "1g.10gb+me".parse::<MigProfile>(),
            Err(ParseMigProfileError::Extension(_))
        ));
        assert!(matches!(
            "three".parse::<MigProfile>(),
            Err(ParseMigProfileError::Malformed(_))
        ));
    }

    #[test]
    fn every_documented_profile_name_parses_back_to_its_class() {
        for model in GpuModel::ALL.into_iter().filter(|m| m.mig_capable()) {
            for class in MigClass::ALL {
                let p = MigProfile::of(model, class).expect("named");
                assert_eq!(p.class_on(model), Some(class), "{model} {class}");
            }
        }
    }

    #[test]
    fn mig_parted_counts_become_a_valid_layout() {
        let mut counts = BTreeMap::new();
        counts.insert("1g.10gb".parse().expect("p"), 7);
        let l = MigLayout::from_counts(GpuModel::H100_80GB, &counts).expect("7 x 1g fits");
        assert_eq!(l.instances().len(), 7);

        let mut counts = BTreeMap::new();
        counts.insert("3g.40gb".parse().expect("p"), 1);
        counts.insert("2g.20gb".parse().expect("p"), 1);
        counts.insert("1g.10gb".parse().expect("p"), 2);
        let l = MigLayout::from_counts(GpuModel::A100_80GB, &counts).expect("3+2+1+1 fits");
        assert_eq!(l.used_compute(), 7);
        assert_eq!(l.counts(GpuModel::A100_80GB).get("1g.10gb"), Some(&2));

        let mut counts = BTreeMap::new();
        counts.insert("4g.40gb".parse().expect("p"), 1);
        counts.insert("3g.40gb".parse().expect("p"), 1);
        counts.insert("1g.10gb".parse().expect("p"), 1);
        assert!(matches!(
            MigLayout::from_counts(GpuModel::H100_80GB, &counts),
            Err(MigLayoutError::DoesNotFit(_))
        ));
        assert!(matches!(
            MigLayout::from_counts(GpuModel::T4, &BTreeMap::new()),
            Err(MigLayoutError::NotMigCapable { .. })
        ));
    }

    #[test]
    fn layouts_serialize_as_instance_lists_and_are_checked_on_the_way_in() {
        let l = MigLayout::new(vec![inst(G3, 4), inst(G4, 0)]).expect("valid");
        let json = serde_json::to_string(&l).expect("serializes");
        assert_eq!(
            json,
            r#"[{"class":"4g","start":0},{"class":"3g","start":4}]"#
        );
        let back: MigLayout = serde_json::from_str(&json).expect("parses");
        assert_eq!(back, l);
        assert!(serde_json::from_str::<MigLayout>(r#"[{"class":"3g","start":2}]"#).is_err());
    }

    fn arb_instance() -> impl Strategy<Value = MigInstance> {
        (0usize..6, 0u8..8).prop_map(|(c, s)| MigInstance::new(MigClass::ALL[c], s))
    }

    proptest! {
        /// Any layout `validate` accepts fits the hardware: within 8 memory slices, no slice
        /// used twice, at most 7 compute slices.
        #[test]
        fn accepted_layouts_fit_the_hardware(v in prop::collection::vec(arb_instance(), 0..8)) {
            if validate(&v).is_ok() {
                let total_mem: u32 = v.iter().map(|i| i.class.memory_slices() as u32).sum();
                let mask = v.iter().fold(0u8, |m, i| m | i.mask());
                prop_assert_eq!(mask.count_ones(), total_mem);
                prop_assert!(v.iter().all(|i| i.start + i.class.memory_slices() <= MEMORY_SLICES));
                prop_assert!(v.iter().map(|i| i.class.compute_slices()).sum::<u8>() <= COMPUTE_SLICES);
            }
        }

        /// `free_starts` is exact: adding at a start it lists succeeds, at any other start fails.
        #[test]
        fn free_starts_agree_with_validate(v in prop::collection::vec(arb_instance(), 0..6), c in 0usize..6) {
            if let Ok(layout) = MigLayout::new(v) {
                let class = MigClass::ALL[c];
                let free = layout.free_starts(class);
                for start in 0..MEMORY_SLICES {
                    let mut l = layout.clone();
                    let ok = l.add(MigInstance::new(class, start)).is_ok();
                    prop_assert_eq!(ok, free.contains(&start), "class {} start {}", class, start);
                }
            }
        }
    }
}
