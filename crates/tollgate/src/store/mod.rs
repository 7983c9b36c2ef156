//! Where counters live. One async [`Store`] trait; backends are selected by [`StoreBackend`].
//!
//! This file only declares the modules and names what they hold: the contract types live in
//! files of their own ([`Charge`] in `charge.rs`, [`Store`] in `contract.rs`, [`StoreError`] in
//! `error.rs`), so that the backends can import them without importing this file back.

mod backend;
mod charge;
mod contract;
mod error;
mod memory;
pub mod redis;
mod timed;
mod url;

pub use self::redis::{
    CoalesceOptions, LATE_SLACK, MAX_SETTING, RedisOptions, RedisStore, SharedPolicy,
};
pub use backend::StoreBackend;
pub use charge::{Charge, Quotas, admitted};
pub use contract::{Decisions, INLINE_CHARGES, Mode, Store};
pub use error::{StoreError, Unsupported};
pub use memory::MemoryStore;
pub use timed::timed_store_call;
pub use url::{InvalidStoreUrl, StoreUrl, redact};
