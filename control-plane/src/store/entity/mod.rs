//! sea-orm entities, one per table of the `migrations` crate.
//!
//! These are storage rows, not the domain: ids and enums are stored as text, money as
//! micro-dollars, nested values as JSON. The store converts rows to domain values (and rejects
//! rows it cannot read, naming the table and id) so the rest of the control plane never sees
//! them.

pub mod agent_bootstrap_token;
pub mod agent_command;
pub mod allocation;
pub mod api_token;
pub mod checkpoint;
pub mod cursor;
pub mod gpu;
pub mod job;
pub mod job_event;
pub mod ledger_entry;
pub mod ledger_progress;
pub mod node;
pub mod node_agent;
pub mod offer;
pub mod outbox;
pub mod price_point;
pub mod replica_log;
pub mod team;
pub mod team_budget;
pub mod team_secret;
pub mod webhook_delivery;
pub mod webhook_subscription;
