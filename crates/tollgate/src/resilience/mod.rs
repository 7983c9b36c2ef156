//! Behaviour when the store fails: failure postures and the circuit breaker.
//!
//! [`Postures`] answer for the limits the store cannot decide, each by its posture: for the
//! whole request when the store fails, or for the limits it could not decide alone
//! ([`Postures::decide_partly`]).

mod breaker;
mod partial;
mod posture;
mod postures;

pub use breaker::{Breaker, BreakerConfig, BreakerState, Permit};
pub use partial::Partly;
pub use posture::Posture;
pub use postures::{Degraded, FailureSettings, Postures};
