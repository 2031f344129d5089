//! Jobs: what a team submits, and the lifecycle a job goes through.
//!
//! A job is a gang of `replicas` identical replicas, each asking for one [`GpuShape`] plus CPU
//! and memory. All replicas are placed at once or none is.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::TeamName;
use crate::limits;
use crate::money::Micros;
use crate::node::Cloud;
use crate::shape::{GpuShape, ResourceShape};
use crate::validate::FieldErrors;

/// The most replicas one gang may have (Philly's largest jobs gang over 64 GPUs; a gang of
/// shared-GPU replicas can be wider).
pub const MAX_REPLICAS: u32 = limits::REPLICAS.max as u32;
/// The most retries a job may ask for.
pub const MAX_RETRIES: u32 = 100;
pub const DEFAULT_CPU_MILLI: u32 = 1000;
pub const DEFAULT_MEMORY_MIB: u64 = 4096;
pub const DEFAULT_CHECKPOINT_INTERVAL_S: u32 = 600;
/// Environment variables spotplane sets for the workload; users may not set these prefixes.
pub const RESERVED_ENV_PREFIX: &str = "SPOTPLANE_";
/// The rendezvous names spotplane sets for every replica besides its `SPOTPLANE_*` ones, as
/// torchrun and PyTorch read them (docs/agent.md, "Gangs"); users may not set these either.
pub const RENDEZVOUS_ENV: [&str; 4] = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"];

const RENDEZVOUS_ENV_MESSAGE: &str = "is set by spotplane for every replica (its gang's rendezvous: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)";

/// Named priority classes. Numbers are allowed too; these are their values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum PriorityClass {
    /// Latency-bound inference; preempts everything below it within its team.
    Serving,
    /// Fine-tuning runs.
    FineTune,
    /// Batch work: the default.
    Batch,
}

impl PriorityClass {
    pub const fn value(self) -> i32 {
        match self {
            PriorityClass::Serving => 1000,
            PriorityClass::FineTune => 500,
            PriorityClass::Batch => 100,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            PriorityClass::Serving => "serving",
            PriorityClass::FineTune => "fine-tune",
            PriorityClass::Batch => "batch",
        }
    }
}

/// The highest numeric priority accepted.
pub const MAX_PRIORITY: i32 = 10_000;

/// A job's priority: a named class or a number from 0 to 10,000 (higher runs first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Priority {
    Class(PriorityClass),
    Value(i32),
}

impl Default for Priority {
    fn default() -> Self {
        Priority::Class(PriorityClass::Batch)
    }
}

impl Priority {
    pub const fn value(self) -> i32 {
        match self {
            Priority::Class(c) => c.value(),
            Priority::Value(v) => v,
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Priority::Class(c) => f.write_str(c.as_str()),
            Priority::Value(v) => write!(f, "{v}"),
        }
    }
}

impl Serialize for Priority {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Priority::Class(c) => c.serialize(s),
            Priority::Value(v) => s.serialize_i32(*v),
        }
    }
}

impl<'de> Deserialize<'de> for Priority {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Priority;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "\"serving\", \"fine-tune\", \"batch\" or an integer from 0 to {MAX_PRIORITY}"
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Priority, E> {
                match v {
                    "serving" => Ok(Priority::Class(PriorityClass::Serving)),
                    "fine-tune" => Ok(Priority::Class(PriorityClass::FineTune)),
                    "batch" => Ok(Priority::Class(PriorityClass::Batch)),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Priority, E> {
                match i32::try_from(v) {
                    Ok(p) if (0..=MAX_PRIORITY).contains(&p) => Ok(Priority::Value(p)),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Signed(v), &self)),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Priority, E> {
                match i32::try_from(v) {
                    Ok(p) if p <= MAX_PRIORITY => Ok(Priority::Value(p)),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Unsigned(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Priority {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, SchemaType, Type};
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(SchemaType::new(Type::String))
                    .enum_values(Some(["serving", "fine-tune", "batch"])),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(SchemaType::new(Type::Integer))
                    .minimum(Some(0))
                    .maximum(Some(MAX_PRIORITY)),
            )
            .description(Some(
                "A priority class or a number from 0 to 10000; higher runs first.",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Priority {}

/// Where and how often a job checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Object-store prefix: `s3://bucket/prefix`, `gs://…`, `az://container/prefix` or `file:///path`.
    pub uri: String,
    /// Seconds between periodic checkpoints (30 to 86,400).
    #[serde(default = "default_interval")]
    pub interval_s: u32,
}

fn default_interval() -> u32 {
    DEFAULT_CHECKPOINT_INTERVAL_S
}

/// How far ahead a deadline may lie (ten years): further is a typo, not a plan.
pub const MAX_DEADLINE_DAYS: i64 = 3653;
/// The least compute a job may say it needs (3.6 seconds), and the most.
pub const MIN_WORK_HOURS: f64 = 0.001;
pub const MAX_WORK_HOURS: f64 = 100_000.0;

/// URI schemes the checkpoint store understands.
pub const CHECKPOINT_SCHEMES: [&str; 6] = ["s3", "gs", "az", "azure", "abfs", "file"];

fn default_replicas() -> u32 {
    1
}
fn default_cpu() -> u32 {
    DEFAULT_CPU_MILLI
}
fn default_memory() -> u64 {
    DEFAULT_MEMORY_MIB
}
fn default_true() -> bool {
    true
}

/// What a team submits. Only `name`, `shape` and `command` are required.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(example = json!({
    "name": "llama-ft", "priority": "fine-tune", "replicas": 2, "shape": {"mig": "3g.40gb"},
    "cpu_milli": 8000, "memory_mib": 32768, "command": ["python", "train.py"],
    "checkpoint": {"uri": "s3://bucket/prefix", "interval_s": 600}, "spot": true, "clouds": ["aws", "gcp"]
})))]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// A name for people; need not be unique.
    pub name: String,
    /// The owning team. Team tokens may omit it (their team is used); admin tokens must name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<TeamName>,
    #[serde(default)]
    pub priority: Priority,
    /// Gang size: all replicas are placed at once or none is.
    #[serde(default = "default_replicas")]
    pub replicas: u32,
    /// What each replica needs of GPUs.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::shape::ShapeWire))]
    pub shape: GpuShape,
    /// CPU per replica in thousandths of a core.
    #[serde(default = "default_cpu")]
    pub cpu_milli: u32,
    /// Memory per replica in MiB.
    #[serde(default = "default_memory")]
    pub memory_mib: u64,
    /// The workload's command line, handed to the node agent as is.
    pub command: Vec<String>,
    /// Container image, handed to the node agent as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The directory the command starts in, an absolute path: inside the image for a job with
    /// `image` (the image's own working directory when unset), on the node otherwise (the
    /// agent's when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(example = "/workspace"))]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Environment variables filled from the team's secrets: variable name → secret name
    /// (`{"HF_TOKEN": "hf-token"}`). Only the names are kept with the job; the values reach
    /// the replica through its node agent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, String>,
    /// The team secret holding the registry login (`username:password`) to pull `image` with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,
    /// When the job must have finished; the planner falls back to on-demand capacity to keep it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// The deadline as a span from submission (`"48h"`, `"2days 12h"`, `"90m"`), for job files
    /// that are kept and submitted again: the API turns it into `deadline` (the time it was
    /// received plus the span) and keeps only that. Not with `deadline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(example = "48h"))]
    pub deadline_in: Option<String>,
    /// Compute the job needs, in hours (0.001 to 100,000), when known. With a deadline, it lets
    /// the planner see when the slack runs out and move the job to on-demand capacity in time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_hours: Option<f64>,
    /// The most the whole gang may cost per hour, in US dollars.
    #[serde(default, with = "usd_opt", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, example = 12.5))]
    pub max_hourly_usd: Option<Micros>,
    /// Whether spot capacity may be used (default true).
    #[serde(default = "default_true")]
    pub spot: bool,
    /// Clouds the job may run on; any when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clouds: Vec<Cloud>,
    /// Regions the job may run in; any when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// How many times a run that fails (a replica exits non-zero; preemptions do not count) is
    /// retried, with exponential back-off, before the job ends `failed` (default 3, at most 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    /// An elastic gang keeps its surviving replicas running when a cloud takes some of its
    /// nodes: only the lost replicas are placed again, each resuming from its own latest
    /// checkpoint (for frameworks that re-form a group as members come and go, such as
    /// `torchrun --nnodes=MIN:MAX`). By default (false) the whole gang restarts from one
    /// checkpoint round.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub elastic: bool,
}

/// Checks a job's `working_dir`: an absolute path of at most 1024 characters, without control
/// characters or `..`, the same rule for the control plane and the agent.
pub fn check_working_dir(dir: &str) -> Result<(), &'static str> {
    if !dir.starts_with('/') {
        return Err("must be an absolute path (starting with '/')");
    }
    if dir.len() > 1024 || dir.chars().any(char::is_control) {
        return Err("must be at most 1024 characters without control characters");
    }
    if dir.split('/').any(|part| part == "..") {
        return Err("must not hold '..'");
    }
    Ok(())
}

/// Checks that `image` reads as an image reference (`[registry/]name[:tag][@digest]`) and as
/// nothing an engine could take for a flag: at most 512 characters, starting with a letter or
/// digit, holding only the characters references use. Says what is wrong in words that follow
/// "it".
pub fn check_image_reference(image: &str) -> Result<(), String> {
    if image.is_empty() || image.len() > 512 {
        return Err("must hold 1 to 512 characters".into());
    }
    if !image.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("must start with a letter or a digit".into());
    }
    if let Some(bad) = image
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._-/:@".contains(*c)))
    {
        return Err(format!(
            "may hold only letters, digits and '.', '_', '-', '/', ':', '@', found {bad:?}"
        ));
    }
    if image.contains("//") || image.ends_with(['/', ':', '@']) {
        return Err("must not have an empty path component, tag or digest".into());
    }
    Ok(())
}

/// Reads a `deadline_in` span: a humantime duration (`"48h"`, `"2days 12h"`, `"90m"`), more
/// than zero and at most [`MAX_DEADLINE_DAYS`]. Says what is wrong in words that follow the
/// field's name.
pub fn parse_deadline_in(span: &str) -> Result<chrono::Duration, String> {
    let shown: String = span.chars().take(64).collect();
    if span.len() > 64 {
        return Err(format!(
            "must be at most 64 characters, got {} starting {shown:?}",
            span.len()
        ));
    }
    let d = humantime::parse_duration(span.trim()).map_err(|e| {
        format!("is not a span of time like \"48h\", \"2days 12h\" or \"90m\", got {shown:?} ({e})")
    })?;
    let max = std::time::Duration::from_secs(MAX_DEADLINE_DAYS as u64 * 86_400);
    if d.is_zero() {
        return Err(format!("must be more than zero, got {shown:?}"));
    }
    if d > max {
        return Err(format!(
            "must be at most {MAX_DEADLINE_DAYS} days (ten years), got {shown:?}"
        ));
    }
    chrono::Duration::from_std(d)
        .map_err(|_| format!("must be at most {MAX_DEADLINE_DAYS} days, got {shown:?}"))
}

/// Letters, digits and `_`, not starting with a digit.
fn valid_env_name(k: &str) -> bool {
    !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `max_hourly_usd` is written in dollars on the wire and held as micro-dollars.
mod usd_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::money::Micros;

    pub fn serialize<S: Serializer>(v: &Option<Micros>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(m) => s.serialize_f64(m.as_usd_f64()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Micros>, D::Error> {
        let v = Option::<f64>::deserialize(d)?;
        v.map(|usd| Micros::from_usd_f64(usd).map_err(serde::de::Error::custom))
            .transpose()
    }
}

impl JobSpec {
    /// A spec with only the required fields set and every default applied.
    pub fn new(name: impl Into<String>, shape: GpuShape, command: Vec<String>) -> Self {
        JobSpec {
            name: name.into(),
            team: None,
            priority: Priority::default(),
            replicas: 1,
            shape,
            cpu_milli: DEFAULT_CPU_MILLI,
            memory_mib: DEFAULT_MEMORY_MIB,
            command,
            image: None,
            working_dir: None,
            env: BTreeMap::new(),
            secrets: BTreeMap::new(),
            image_pull_secret: None,
            checkpoint: None,
            deadline: None,
            deadline_in: None,
            work_hours: None,
            max_hourly_usd: None,
            spot: true,
            clouds: Vec::new(),
            regions: Vec::new(),
            labels: BTreeMap::new(),
            max_retries: None,
            elastic: false,
        }
    }

    /// Turns `deadline_in` into `deadline`, counted from `now` (the time the submission is
    /// received), and clears it. Leaves the spec as it is when `deadline_in` is unset or does
    /// not parse ([`JobSpec::validate`] reports that).
    pub fn resolve_deadline_in(&mut self, now: DateTime<Utc>) {
        if self.deadline.is_some() {
            return;
        }
        let Some(span) = self
            .deadline_in
            .as_deref()
            .and_then(|s| parse_deadline_in(s).ok())
        else {
            return;
        };
        if let Some(at) = now.checked_add_signed(span) {
            self.deadline = Some(at);
            self.deadline_in = None;
        }
    }

    /// What each replica needs.
    pub fn replica_shape(&self) -> ResourceShape {
        ResourceShape {
            gpu: self.shape.clone(),
            cpu_milli: self.cpu_milli,
            memory_mib: self.memory_mib,
        }
    }

    /// Checks every rule that the types alone do not, reporting all failures with their paths.
    /// `now` is needed because a deadline must lie in the future.
    pub fn validate(&self, now: DateTime<Utc>) -> FieldErrors {
        let mut errs = FieldErrors::new();
        errs.check_name("name", &self.name);
        if let Some(r) = self.max_retries
            && r > MAX_RETRIES
        {
            errs.push(
                "max_retries",
                format!("must be at most {MAX_RETRIES}, got {r}"),
            );
        }
        if self.replicas == 0 {
            errs.push("replicas", "must be at least 1, got 0");
        } else if self.replicas > MAX_REPLICAS {
            errs.push_over(
                "replicas",
                &limits::REPLICAS,
                format_args!("has {}", self.replicas),
            );
        }
        errs.extend_nested("shape", self.shape.validate());
        if self.cpu_milli > 1_024_000 {
            errs.push(
                "cpu_milli",
                format!(
                    "must be at most 1024000 (1024 cores), got {}",
                    self.cpu_milli
                ),
            );
        }
        if self.memory_mib > 16 * 1024 * 1024 {
            errs.push(
                "memory_mib",
                format!("must be at most 16777216 (16 TiB), got {}", self.memory_mib),
            );
        }
        if self.command.is_empty() {
            errs.push("command", "must hold at least the program to run");
        } else if self.command[0].trim().is_empty() {
            errs.push("command[0]", "the program must not be empty");
        }
        // A NUL cannot be passed to exec(2): an argument holding one would be cut short there.
        for (i, arg) in self.command.iter().enumerate() {
            if arg.contains('\0') {
                errs.push(format!("command[{i}]"), "must not contain a NUL character");
            }
        }
        if self.command.len() as u64 > limits::COMMAND_ARGS.max {
            errs.push_over(
                "command",
                &limits::COMMAND_ARGS,
                format_args!("has {} arguments", self.command.len()),
            );
        }
        let arg_bytes: usize = self.command.iter().map(String::len).sum();
        if arg_bytes as u64 > limits::COMMAND_BYTES.max {
            errs.push_over(
                "command",
                &limits::COMMAND_BYTES,
                format_args!("has {arg_bytes} bytes"),
            );
        }
        if let Some(image) = &self.image
            && let Err(m) = check_image_reference(image)
        {
            errs.push("image", format!("is not an image reference: it {m}"));
        }
        if let Some(dir) = &self.working_dir
            && let Err(m) = check_working_dir(dir)
        {
            errs.push("working_dir", m);
        }
        for (k, v) in &self.env {
            if !valid_env_name(k) {
                errs.push(format!("env.{k}"), "environment variable names hold letters, digits and '_' and do not start with a digit");
            } else if k.starts_with(RESERVED_ENV_PREFIX) {
                errs.push(
                    format!("env.{k}"),
                    format!("names starting with {RESERVED_ENV_PREFIX} are set by spotplane"),
                );
            } else if RENDEZVOUS_ENV.contains(&k.as_str()) {
                errs.push(format!("env.{k}"), RENDEZVOUS_ENV_MESSAGE);
            }
            if v.len() as u64 > limits::ENV_VALUE_BYTES.max {
                errs.push_over(
                    format!("env.{k}"),
                    &limits::ENV_VALUE_BYTES,
                    format_args!("has {} bytes", v.len()),
                );
            }
            if v.contains('\0') {
                errs.push(
                    format!("env.{k}"),
                    "values must not contain a NUL character",
                );
            }
        }
        if self.env.len() as u64 > limits::ENV_VARS.max {
            errs.push_over(
                "env",
                &limits::ENV_VARS,
                format_args!("has {} variables", self.env.len()),
            );
        }
        for (k, name) in &self.secrets {
            if !valid_env_name(k) {
                errs.push(format!("secrets.{k}"), "environment variable names hold letters, digits and '_' and do not start with a digit");
            } else if k.starts_with(RESERVED_ENV_PREFIX) {
                errs.push(
                    format!("secrets.{k}"),
                    format!("names starting with {RESERVED_ENV_PREFIX} are set by spotplane"),
                );
            } else if RENDEZVOUS_ENV.contains(&k.as_str()) {
                errs.push(format!("secrets.{k}"), RENDEZVOUS_ENV_MESSAGE);
            } else if self.env.contains_key(k) {
                errs.push(
                    format!("secrets.{k}"),
                    "is also set in env; set it in one place",
                );
            }
            errs.check_name(&format!("secrets.{k}"), name);
        }
        if self.secrets.len() as u64 > limits::SECRET_REFS.max {
            errs.push_over(
                "secrets",
                &limits::SECRET_REFS,
                format_args!("has {} secrets", self.secrets.len()),
            );
        }
        if let Some(name) = &self.image_pull_secret {
            if self.image.is_none() {
                errs.push(
                    "image_pull_secret",
                    "is only used to pull an image; set image too",
                );
            }
            errs.check_name("image_pull_secret", name);
        }
        if let Some(c) = &self.checkpoint {
            let uri_chars = c.uri.chars().count();
            match c.uri.split_once("://") {
                _ if uri_chars as u64 > limits::URI_CHARS.max => errs.push_over(
                    "checkpoint.uri",
                    &limits::URI_CHARS,
                    format_args!("has {uri_chars} characters"),
                ),
                _ if c.uri.chars().any(char::is_control) => {
                    errs.push("checkpoint.uri", "must not hold control characters")
                }
                Some((scheme, rest))
                    if CHECKPOINT_SCHEMES.contains(&scheme)
                        && !rest.trim_matches('/').is_empty() => {}
                _ => errs.push(
                    "checkpoint.uri",
                    format!(
                        "must be an object-store URI with a bucket or path, one of {}:// schemes",
                        CHECKPOINT_SCHEMES.join("://, ")
                    ),
                ),
            }
            if !(30..=86_400).contains(&c.interval_s) {
                errs.push(
                    "checkpoint.interval_s",
                    format!("must be between 30 and 86400 seconds, got {}", c.interval_s),
                );
            }
        }
        if let Some(d) = self.deadline {
            if d <= now {
                errs.push(
                    "deadline",
                    format!("must lie in the future, got {}", d.to_rfc3339()),
                );
            } else if now
                .checked_add_signed(chrono::Duration::days(MAX_DEADLINE_DAYS))
                .is_none_or(|horizon| d > horizon)
            {
                errs.push(
                    "deadline",
                    format!(
                        "must lie within {MAX_DEADLINE_DAYS} days (ten years), got {}",
                        d.to_rfc3339()
                    ),
                );
            }
        }
        if let Some(span) = &self.deadline_in {
            if self.deadline.is_some() {
                errs.push(
                    "deadline_in",
                    "is another way to give deadline; set one of deadline and deadline_in",
                );
            } else if let Err(m) = parse_deadline_in(span) {
                errs.push("deadline_in", m);
            }
        }
        if let Some(w) = self.work_hours
            && !(MIN_WORK_HOURS..=MAX_WORK_HOURS).contains(&w)
        {
            errs.push(
                "work_hours",
                format!("must be between {MIN_WORK_HOURS} and {MAX_WORK_HOURS}, got {w}"),
            );
        }
        if let Some(p) = self.max_hourly_usd
            && (p.0 <= 0 || p > Micros::from_dollars(100_000))
        {
            errs.push("max_hourly_usd", "must be more than 0 and at most 100000");
        }
        let mut seen = Vec::new();
        for (i, c) in self.clouds.iter().enumerate() {
            if seen.contains(c) {
                errs.push(format!("clouds[{i}]"), format!("{c} is listed twice"));
            }
            seen.push(*c);
        }
        for (i, r) in self.regions.iter().enumerate() {
            let ok = !r.is_empty()
                && r.len() <= 64
                && r.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !ok {
                errs.push(
                    format!("regions[{i}]"),
                    "a region is written in lowercase letters, digits and '-', e.g. us-east-1",
                );
            }
        }
        for (k, v) in &self.labels {
            if k.is_empty()
                || k.len() > 63
                || !k
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
            {
                errs.push(
                    format!("labels.{k}"),
                    "label keys hold 1 to 63 letters, digits, '-', '_', '.' and '/'",
                );
            }
            if v.len() > 256 {
                errs.push(
                    format!("labels.{k}"),
                    "label values must be at most 256 characters",
                );
            }
        }
        if self.labels.len() > 64 {
            errs.push("labels", "at most 64 labels");
        }
        errs
    }
}

/// Job lifecycle. The happy path is `queued -> admitted -> starting -> running -> succeeded`;
/// on a preemption notice `running -> draining -> checkpointed -> queued`; when a node vanishes
/// without warning `running -> lost -> queued`; after a failure with retries left
/// `running -> queued`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Admitted,
    Starting,
    Running,
    Draining,
    Checkpointed,
    Lost,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 10] = [
        JobState::Queued,
        JobState::Admitted,
        JobState::Starting,
        JobState::Running,
        JobState::Draining,
        JobState::Checkpointed,
        JobState::Lost,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Admitted => "admitted",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Draining => "draining",
            JobState::Checkpointed => "checkpointed",
            JobState::Lost => "lost",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// Whether the lifecycle allows going from `self` to `to`. Any live state may be cancelled
    /// or fail; an admitted or starting job whose node goes away goes back to the queue.
    pub fn can_transition_to(self, to: JobState) -> bool {
        use JobState::*;
        if self.is_terminal() {
            return false;
        }
        matches!(
            (self, to),
            (Queued, Admitted)
                | (Admitted, Starting)
                | (Admitted | Starting, Queued)
                | (Running, Queued)
                | (Starting, Running)
                | (Running, Succeeded)
                | (Running | Starting, Draining)
                | (Draining, Checkpointed)
                | (Checkpointed, Queued)
                | (Running | Starting | Draining, Lost)
                | (Lost, Queued)
                | (_, Failed)
                | (_, Cancelled)
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|j| j.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown job state {s:?}; expected one of {}",
                    JobState::ALL.map(|j| j.as_str()).join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0)
            .single()
            .expect("valid time")
    }

    #[test]
    fn the_documented_example_parses_and_validates() {
        let json = r#"{"name": "llama-ft", "priority": "fine-tune", "replicas": 2, "shape": {"mig": "3g.40gb"},
            "cpu_milli": 8000, "memory_mib": 32768, "command": ["python", "train.py"], "image": "ghcr.io/x/y:1",
            "env": {}, "checkpoint": {"uri": "s3://bucket/prefix", "interval_s": 600},
            "deadline": "2026-12-01T00:00:00Z", "max_hourly_usd": 12.5, "spot": true,
            "clouds": ["aws", "gcp"], "labels": {}}"#;
        let spec: JobSpec = serde_json::from_str(json).expect("parses");
        assert_eq!(spec.validate(now()), FieldErrors::new());
        assert_eq!(spec.priority.value(), 500);
        assert_eq!(spec.max_hourly_usd, Some(Micros(12_500_000)));
    }

    #[test]
    fn deadline_in_becomes_a_deadline_counted_from_submission() {
        let mut spec: JobSpec = serde_json::from_str(
            r#"{"name": "a", "shape": {"gpus": 1}, "command": ["x"], "deadline_in": "2days 12h"}"#,
        )
        .expect("parses");
        assert_eq!(spec.validate(now()), FieldErrors::new());
        spec.resolve_deadline_in(now());
        assert_eq!(spec.deadline, Some(now() + chrono::Duration::hours(60)));
        assert_eq!(spec.deadline_in, None, "only the absolute deadline is kept");
        assert_eq!(spec.validate(now()), FieldErrors::new());
        let json = serde_json::to_value(&spec).expect("serializes");
        assert!(json.get("deadline_in").is_none(), "{json}");

        for span in ["48h", "90m", "1d", "3653days"] {
            assert_eq!(parse_deadline_in(span).map(|_| ()), Ok(()), "{span}");
        }
    }

    #[test]
    fn bad_deadline_in_is_named_and_left_unresolved() {
        let cases: [(&str, &str); 6] = [
            ("soon", "is not a span of time"),
            ("-5h", "is not a span of time"),
            ("48", "is not a span of time"),
            ("0s", "more than zero"),
            ("3654days", "at most 3653 days"),
            (
                "1h 1h 1h 1h 1h 1h 1h 1h 1h 1h 1h 1h 1h 1h 1h 1h 1h 1h 1h 1h 1h 1h",
                "at most 64 characters",
            ),
        ];
        for (span, why) in cases {
            let mut spec = JobSpec::new(
                "a",
                GpuShape::Whole {
                    gpus: 1,
                    models: Vec::new(),
                },
                vec!["x".into()],
            );
            spec.deadline_in = Some(span.into());
            let errs = spec.validate(now());
            let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
            assert_eq!(fields, ["deadline_in"], "{span}");
            assert!(format!("{errs:?}").contains(why), "{span}: {errs:?}");
            spec.resolve_deadline_in(now());
            assert_eq!(
                (spec.deadline, spec.deadline_in.as_deref()),
                (None, Some(span))
            );
        }
        let mut both = JobSpec::new(
            "a",
            GpuShape::Whole {
                gpus: 1,
                models: Vec::new(),
            },
            vec!["x".into()],
        );
        both.deadline = Some(now() + chrono::Duration::days(1));
        both.deadline_in = Some("48h".into());
        let errs = both.validate(now());
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["deadline_in"]);
        assert!(
            format!("{errs:?}").contains("set one of deadline and deadline_in"),
            "{errs:?}"
        );
    }

    #[test]
    fn only_name_shape_and_command_are_required() {
        let spec: JobSpec =
            serde_json::from_str(r#"{"name": "a", "shape": {"gpus": 1}, "command": ["x"]}"#)
                .expect("parses");
        assert_eq!(spec.replicas, 1);
        assert!(spec.spot);
        assert_eq!(spec.priority, Priority::Class(PriorityClass::Batch));
        assert!(spec.validate(now()).is_empty());
        for missing in [
            r#"{"shape": {"gpus": 1}, "command": ["x"]}"#,
            r#"{"name": "a", "command": ["x"]}"#,
            r#"{"name": "a", "shape": {"gpus": 1}}"#,
        ] {
            assert!(
                serde_json::from_str::<JobSpec>(missing).is_err(),
                "{missing}"
            );
        }
    }

    #[test]
    fn unknown_fields_and_bad_priorities_are_rejected() {
        assert!(
            serde_json::from_str::<JobSpec>(
                r#"{"name": "a", "shape": {"gpus": 1}, "command": ["x"], "gpu": 1}"#
            )
            .is_err()
        );
        assert!(
            serde_json::from_str::<JobSpec>(
                r#"{"name": "a", "shape": {"gpus": 1}, "command": ["x"], "priority": "urgent"}"#
            )
            .is_err()
        );
        assert!(
            serde_json::from_str::<JobSpec>(
                r#"{"name": "a", "shape": {"gpus": 1}, "command": ["x"], "priority": 10001}"#
            )
            .is_err()
        );
        let p: JobSpec = serde_json::from_str(
            r#"{"name": "a", "shape": {"gpus": 1}, "command": ["x"], "priority": 42}"#,
        )
        .expect("number");
        assert_eq!(p.priority, Priority::Value(42));
    }

    #[test]
    fn validation_reports_every_problem_with_its_path() {
        let mut spec = JobSpec::new(
            "Bad Name",
            GpuShape::Shared {
                gpu_milli: 0,
                models: vec![],
            },
            vec![],
        );
        spec.replicas = 0;
        spec.deadline = Some(now());
        spec.env
            .insert("SPOTPLANE_CHECKPOINT_DIR".into(), "/x".into());
        spec.checkpoint = Some(CheckpointSpec {
            uri: "ftp://x".into(),
            interval_s: 5,
        });
        spec.regions.push("US East".into());
        let errs = spec.validate(now());
        let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "name",
                "replicas",
                "shape.gpu_milli",
                "command",
                "env.SPOTPLANE_CHECKPOINT_DIR",
                "checkpoint.uri",
                "checkpoint.interval_s",
                "deadline",
                "regions[0]"
            ]
        );
    }

    #[test]
    fn the_rendezvous_names_are_spotplanes_to_set() {
        let base = JobSpec::new(
            "a",
            GpuShape::Whole {
                gpus: 1,
                models: vec![],
            },
            vec!["x".into()],
        );
        for name in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
            let mut spec = base.clone();
            spec.env.insert(name.into(), "0".into());
            let errs = spec.validate(now()).into_vec();
            assert_eq!(errs.len(), 1, "{name}: {errs:?}");
            assert_eq!(errs[0].field, format!("env.{name}"));
            assert!(errs[0].message.contains("set by spotplane"), "{errs:?}");
            let mut spec = base.clone();
            spec.secrets.insert(name.into(), "some-secret".into());
            let fields: Vec<String> = spec
                .validate(now())
                .iter()
                .map(|e| e.field.clone())
                .collect();
            assert_eq!(fields, [format!("secrets.{name}")]);
        }
        // Names torchrun sets for its own workers, and look-alikes, are the job's to use.
        let mut spec = base.clone();
        for name in [
            "LOCAL_RANK",
            "NODE_RANK",
            "NNODES",
            "RANKS",
            "MASTER_ADDRESS",
        ] {
            spec.env.insert(name.into(), "1".into());
        }
        assert!(spec.validate(now()).is_empty());
    }

    #[test]
    fn nul_bytes_far_deadlines_and_tiny_work_are_refused() {
        let fields_of = |spec: &JobSpec| -> Vec<String> {
            spec.validate(now())
                .iter()
                .map(|e| e.field.clone())
                .collect()
        };
        let base = JobSpec::new(
            "a",
            GpuShape::Whole {
                gpus: 1,
                models: vec![],
            },
            vec!["x".into()],
        );
        assert_eq!(fields_of(&base), Vec::<String>::new());

        let mut spec = base.clone();
        spec.command = vec!["python".into(), "a\0b".into()];
        spec.env.insert("K".into(), "v\0".into());
        spec.image = Some("ghcr.io/x\0:1".into());
        spec.checkpoint = Some(CheckpointSpec {
            uri: "s3://b/p\0".into(),
            interval_s: 600,
        });
        assert_eq!(
            fields_of(&spec),
            ["command[1]", "image", "env.K", "checkpoint.uri"]
        );

        for (image, ok) in [
            ("ghcr.io/acme/train:1", true),
            ("localhost:5000/x/y@sha256:0123abcd", true),
            ("ubuntu", true),
            ("--privileged", false),
            ("-v/:/host", false),
            ("ghcr.io//x", false),
            ("ghcr.io/x:", false),
            ("ghcr.io/x y:1", false),
            ("", false),
        ] {
            let mut spec = base.clone();
            spec.image = Some(image.into());
            let want: &[&str] = if ok { &[] } else { &["image"] };
            assert_eq!(fields_of(&spec), want, "{image:?}");
        }

        for (dir, ok) in [
            ("/workspace", true),
            ("/", true),
            ("/home/ml/run 1", true),
            ("workspace", false),
            ("", false),
            ("/a/../etc", false),
            ("/a\nb", false),
        ] {
            let mut spec = base.clone();
            spec.working_dir = Some(dir.into());
            let want: &[&str] = if ok { &[] } else { &["working_dir"] };
            assert_eq!(fields_of(&spec), want, "{dir:?}");
        }
        let mut spec = base.clone();
        spec.working_dir = Some(format!("/{}", "a".repeat(1024)));
        assert_eq!(fields_of(&spec), ["working_dir"]);

        for year in [10000, 2040] {
            let mut spec = base.clone();
            spec.deadline = Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0).single();
            assert!(spec.deadline.is_some());
            assert_eq!(fields_of(&spec), ["deadline"], "{year}");
        }
        let mut spec = base.clone();
        spec.deadline = Some(now() + chrono::Duration::days(MAX_DEADLINE_DAYS - 1));
        assert_eq!(fields_of(&spec), Vec::<String>::new());

        for w in [
            1e-300,
            0.0,
            -1.0,
            f64::MIN_POSITIVE,
            0.0009,
            f64::NAN,
            100_001.0,
        ] {
            let mut spec = base.clone();
            spec.work_hours = Some(w);
            assert_eq!(fields_of(&spec), ["work_hours"], "{w}");
        }
        let mut spec = base.clone();
        spec.work_hours = Some(MIN_WORK_HOURS);
        assert_eq!(fields_of(&spec), Vec::<String>::new());
    }

    #[test]
    fn money_beyond_micro_precision_is_rejected_at_parse_time() {
        let r = serde_json::from_str::<JobSpec>(
            r#"{"name": "a", "shape": {"gpus": 1}, "command": ["x"], "max_hourly_usd": 0.0000001}"#,
        );
        assert!(r.is_err());
    }

    #[test]
    fn terminal_states_are_final_and_preemption_returns_to_the_queue() {
        for s in JobState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in JobState::ALL {
                assert!(!s.can_transition_to(to), "{s} -> {to}");
            }
        }
        let path = [
            JobState::Running,
            JobState::Draining,
            JobState::Checkpointed,
            JobState::Queued,
        ];
        assert!(path.windows(2).all(|w| w[0].can_transition_to(w[1])));
        let lost = [JobState::Running, JobState::Lost, JobState::Queued];
        assert!(lost.windows(2).all(|w| w[0].can_transition_to(w[1])));
        assert!(!JobState::Queued.can_transition_to(JobState::Running));
    }
}
