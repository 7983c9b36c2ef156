//! Behaviour when the store fails: failure postures and the circuit breaker.
//!
//! [`Postures`] answer for the limits the store cannot decide, each by its posture: for the
//! whole request when the store fails, or for the limits it could not decide alone
//! ([`Postures::decide_partly`]).

mod partial;
mod postures;

pub use partial::Partly;
// The breaker lives with the stores: its states are part of every store's health, and the
// Redis stores, its one user, sit below this layer. Its settings and states keep their names
// here for the callers that configure and report them.
pub use crate::store::breaker::{Breaker, BreakerConfig, BreakerState, Permit};
// A policy setting (`on_store_error`), so it lives in `policy`, below the store; named here too
// for the callers that configure the server's default posture.
pub use crate::policy::Posture;
pub use crate::store::Degraded;
pub use postures::{FailureSettings, Postures};
