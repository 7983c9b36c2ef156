//! Behaviour when the store fails: failure postures and the circuit breaker.

mod breaker;
mod posture;

pub use breaker::{Breaker, BreakerConfig, BreakerState, Permit};
pub use posture::Posture;
