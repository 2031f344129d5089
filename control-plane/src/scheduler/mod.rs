//! The embedded scheduler: a pure function from a snapshot to decisions.

pub mod packing;
