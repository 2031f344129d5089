//! Reconcilers: loops that read the store, call a pure core, and write its decisions back.
//! Only the leader replica runs them (see `store::leader`).

pub mod capacity;
pub mod ledger;
pub mod recovery;
pub mod scheduling;
pub mod webhooks;
