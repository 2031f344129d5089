//! spotplane's shared vocabulary.
//!
//! Everything the control plane, the providers and the node agent must agree on lives here:
//! ids, money, GPU models and their MIG geometry, resource shapes, the job specification and
//! lifecycles, and the agent wire protocol. This crate does no I/O and reads no clock: where a
//! rule depends on the time (a deadline must lie in the future), `now` is an argument.

pub mod agent;
pub mod gpu;
pub mod ids;
pub mod job;
pub mod limits;
pub mod mig;
pub mod money;
pub mod node;
pub mod notice;
pub mod rendezvous;
pub mod shape;
pub mod team;
pub mod validate;

pub use gpu::GpuModel;
pub use ids::{CheckpointId, CommandId, JobId, NodeId, TeamName, TokenId};
pub use job::{JobSpec, JobState, Priority, PriorityClass};
pub use mig::{MigClass, MigInstance, MigLayout, MigProfile};
pub use money::{Micros, PriceMillis};
pub use node::{Cloud, Market, NodeState};
pub use shape::{GpuShape, ResourceShape};
pub use team::{Quota, QuotaResource};
pub use validate::{FieldError, FieldErrors};
