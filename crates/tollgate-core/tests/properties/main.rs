//! Property tests of every algorithm: against naive reference models, the contract every
//! algorithm shares (exact retry times, denials free, expiry), and the known bounds.

// Helpers outside `#[test]` functions are test code too: a broken expectation should panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod agreement;
mod bounds;
mod contract;
mod models;
mod reload;
mod robustness;
mod support;
