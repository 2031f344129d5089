//! Time, injected: the clock lives in `spotplane-providers` (the simulated clouds run on it
//! too) and is re-exported here.

pub use spotplane_providers::clock::*;
