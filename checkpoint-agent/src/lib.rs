//! The spotplane node agent.
//!
//! Runs on every node spotplane buys. It registers with the control plane with a per-node
//! token, reports the node's GPUs and their MIG layout, heartbeats telemetry, watches the
//! cloud's metadata service for termination notices, and checkpoints the node's jobs to object
//! storage when told. It never links the control plane; both ends share `spotplane-core`'s
//! protocol types.

pub mod inventory;
