//! The stores: the memory store's contract and its one-charge path held equal to its general
//! one, Redis failover, and the Lua twins held equal to the Rust core on a real Redis.
//!
//! One test binary for all of them: each links the whole stack once, not once a file.

mod lua_twin;
mod memory_fast_path;
mod memory_store;
mod redis_failover;
mod strategies;
