//! Where counters live. One async [`Store`] trait; backends are selected by [`StoreBackend`].
//!
//! This file only declares the modules and names what they hold: the contract types live in
//! files of their own ([`Charge`] in `charge.rs`, [`Store`] in `contract.rs`, [`StoreError`] in
//! `error.rs`), so that the backends can import them without importing this file back.
//!
//! The Redis stores ([`redis`]) come with the `redis` feature, on by default. Their settings
//! ([`RedisOptions`]) and the circuit breaker's states are in every build: the same types are
//! taken and reported with and without it.

mod backend;
// Its Redis half (the permits a call holds, logged) has no user without the Redis stores.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) mod breaker;
mod capacity;
mod charge;
mod contract;
mod error;
mod memory;
#[cfg(feature = "redis")]
pub mod redis;
mod redis_invalid_options;
mod redis_options;
mod timed;
mod url;

#[cfg(feature = "redis")]
pub use self::redis::{LATE_SLACK, RedisStore, SharedPolicy};
pub use backend::StoreBackend;
pub use capacity::{
    answer_never_fits, cost_exceeds_capacity, exceeds_with_earlier, never_admitted,
};
pub use charge::{Charge, Quotas, admitted, has_budgets};
pub(crate) use contract::health_of_inner;
pub use contract::{
    Answered, Call, Decisions, Degraded, Granting, Grants, INLINE_CHARGES, Mode, Store,
};
pub use error::{
    Failure, Invalid, RedisCall, RedisFailure, Refusal, ShedReason, StoreError, Timeout,
    Unsupported,
};
pub use memory::MemoryStore;
pub use redis_invalid_options::{InvalidOptions, OptionsProblem};
pub use redis_options::{
    CoalesceOptions, DEFAULT_MAX_WAIT, MAX_SETTING, QUEUED_PER_IN_FLIGHT, RedisOptions,
};
pub use timed::{Timed, timed_store_call};
pub use url::{InvalidStoreUrl, StoreUrl, redact};
