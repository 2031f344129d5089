//! The embedded scheduler: a pure function from a snapshot to decisions.

pub mod frag;
pub mod openb;
pub mod packing;
pub mod policies;
