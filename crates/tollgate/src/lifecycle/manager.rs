//! Who manages the policy from outside, if anyone, and whether it has sent one yet: the state
//! behind [`Lifecycle::managed`](super::Lifecycle::managed), kept apart from the life cycle so
//! that `managed.rs` and `mod.rs` do not import each other.

use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;

/// Who manages the policy, and whether it has sent one yet.
#[derive(Debug, Default)]
pub(super) struct Manager {
    pub(super) by: OnceLock<&'static str>,
    pub(super) applied: AtomicBool,
}
