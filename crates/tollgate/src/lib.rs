//! tollgate: rate-limit decisions from a policy file, over a pluggable store.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate::clock::SystemClock;
//! use tollgate::limiter::{CheckRequest, Limiter, RequestDescriptor};
//! use tollgate::policy::Policy;
//! use tollgate::store::{MemoryStore, StoreBackend};
//!
//! # tokio_test_block(async {
//! let policy = Policy::from_yaml("inline.yaml", "
//! domain: api
//! descriptors:
//!   - key: user
//!     rate_limit: {unit: minute, requests_per_unit: 1}
//! ").unwrap();
//! let store = StoreBackend::Memory(MemoryStore::new(Arc::new(SystemClock::new())));
//! let limiter = Limiter::new(policy, store);
//! let alice = || {
//!     let d = RequestDescriptor::new(vec![("user".into(), "alice".into())], 1, None).unwrap();
//!     CheckRequest::new("api".into(), vec![d]).unwrap()
//! };
//! assert!(limiter.check(&alice()).await.unwrap().allowed());
//! assert!(!limiter.check(&alice()).await.unwrap().allowed());
//! # });
//! # fn tokio_test_block(f: impl std::future::Future<Output = ()>) {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```
//!
//! # Features
//!
//! | feature | default | brings |
//! |---|---|---|
//! | `redis` | on | the Redis and Redis Cluster stores (`store::RedisStore`, `StoreBackend::Redis`, `redis://` URLs), the policy sync (`lifecycle::sync`); redis-rs |
//!
//! Without `redis` (`tollgate = { version = "0.1", default-features = false }`) only the
//! memory store is built, and a Redis URL is refused with
//! [`InvalidStoreUrl::RedisNotBuilt`](store::InvalidStoreUrl::RedisNotBuilt). The settings
//! (`RedisOptions`) are in both builds, so code written for one compiles in the other.

pub mod background;
pub mod clock;
mod fnv;
mod leases;
pub mod lifecycle;
pub mod limiter;
pub mod metrics;
pub mod observe;
pub mod policy;

mod random;
pub mod resilience;
pub mod service;
pub mod store;

/// The Redis policy sync, under its earlier path.
#[cfg(feature = "redis")]
pub use lifecycle::sync as policy_sync;

pub use tollgate_core as core;
