//! The limiter over its stores: decisions, hot keys, faults and postures, policy sync.
//!
//! One test binary for all of them: each links the whole stack once, not once a file.

mod faults;
mod fleet_commands;
mod hot_keys;
mod limiter;
mod policy_sync;
mod quota_mode;
