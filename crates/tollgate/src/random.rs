//! Random numbers for identifiers (override ids, shared-hash epochs), from std's randomly keyed
//! hasher: no dependency, and different in every process and call.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

/// A random `u64`.
pub(crate) fn random_u64() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one(CALLS.fetch_add(1, Ordering::Relaxed))
}
