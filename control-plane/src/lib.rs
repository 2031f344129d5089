//! The spotplane control plane.
//!
//! A library so the binary, the end-to-end tests and the benchmarks drive the same code.
//! `spotplane-core` holds the vocabulary; this crate holds the store, the API, the CLI and,
//! in later layers, the reconcilers around the pure scheduling, planning and recovery cores.
//! Simulations, replays and benchmark drivers are in [`lab`], which no production module
//! imports.

pub mod api;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod failpoints;
pub mod finance;
pub mod lab;
pub mod listener;
pub mod metrics;
pub mod model;
pub mod offers;
pub mod planner;
pub mod reconcile;
pub mod recovery;
pub mod scheduler;
pub mod secrets;
pub mod server;
pub mod simfront;
pub mod store;
pub mod telemetry;
pub mod webhooks;
