//! Property tests of every algorithm: against naive reference models, the contract every
//! algorithm shares (exact retry times, denials free, expiry), the known bounds, and charges
//! given back.

// Helpers outside `#[test]` functions are test code too: a broken expectation should panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod agreement;
mod bounds;
mod contract;
mod models;
mod refund;
mod reload;
mod robustness;
mod support;
