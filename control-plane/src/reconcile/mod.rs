//! Reconcilers: loops that read the store, call a pure core, and write its decisions back.
//! Each is a [`runner::Reconciler`]; [`runner::run`] runs them in rounds, only on the replica
//! that leads the round's lock (see `store::leader`).

pub mod capacity;
pub mod ledger;
pub mod recovery;
pub mod runner;
pub mod scheduling;
pub mod webhooks;
