//! The limiter over its stores: decisions, hot keys, faults and postures, policy sync.
//!
//! One test binary for all of them: each links the whole stack once, not once a file.

// The Redis files need the Redis stores (the `redis` feature, on by default); `quota_mode`
// gates its Redis half itself.
#[cfg(feature = "redis")]
mod faults;
#[cfg(feature = "redis")]
mod fleet_commands;
#[cfg(feature = "redis")]
mod hot_keys;
mod limiter;
#[cfg(feature = "redis")]
mod policy_sync;
mod quota_mode;
