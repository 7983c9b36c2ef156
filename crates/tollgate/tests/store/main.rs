//! The stores: the memory store's contract and its one-charge path held equal to its general
//! one, Redis failover, how batches reach Redis's decision code (`FCALL`, `EVALSHA`), the Lua
//! twins held equal to the Rust core on a real Redis, and the two stores' leases (reservations
//! and give-backs) held equal to each other.
//!
//! One test binary for all of them: each links the whole stack once, not once a file.

// The Redis files need the Redis stores (the `redis` feature, on by default).
#[cfg(feature = "redis")]
mod grants_twin;
#[cfg(feature = "redis")]
mod lua_twin;
mod memory_fast_path;
mod memory_store;
#[cfg(feature = "redis")]
mod redis_failover;
#[cfg(feature = "redis")]
mod redis_library;
#[cfg(feature = "redis")]
mod redis_plan;
#[cfg(feature = "redis")]
mod redis_support;
mod strategies;
