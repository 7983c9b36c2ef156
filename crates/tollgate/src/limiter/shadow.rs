//! Where the limiter keeps its shadow candidate: read by every charged decision, written by
//! an admin's rare set or clear.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;

use super::candidate::Candidate;

/// The shadow candidate, if one is set, with a flag that says whether one is, so that a
/// decision without a candidate (nearly all of them) reads one atomic instead of loading the
/// empty `ArcSwapOption` (its debt list costs about 50 instructions).
#[derive(Debug, Default)]
pub(super) struct CandidateSlot {
    current: ArcSwapOption<Candidate>,
    /// Whether `current` holds a candidate, written after it under `writes`: a reader that
    /// sees `false` decides as if it came before the candidate was set, one that sees `true`
    /// loads `current`, which is then at least as new.
    set: AtomicBool,
    /// Serializes the writers, so that `set` always ends up saying what the last one stored.
    writes: Mutex<()>,
}

impl CandidateSlot {
    /// The candidate, if one is set.
    pub fn load(&self) -> Option<Arc<Candidate>> {
        if !self.is_set() {
            return None;
        }
        self.current.load_full()
    }

    /// Whether a candidate is set (one atomic load).
    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Sets (or with `None` clears) the candidate; returns the one it replaces.
    pub fn swap(&self, candidate: Option<Arc<Candidate>>) -> Option<Arc<Candidate>> {
        let _writing = self.writes.lock();
        let set = candidate.is_some();
        let previous = self.current.swap(candidate);
        self.set.store(set, Ordering::Release);
        previous
    }

    /// Clears the candidate if it is still `expected`; returns whether it was.
    pub fn clear(&self, expected: &Arc<Candidate>) -> bool {
        let _writing = self.writes.lock();
        let previous = self.current.compare_and_swap(expected, None);
        let cleared = previous
            .as_ref()
            .is_some_and(|previous| Arc::ptr_eq(previous, expected));
        if cleared {
            self.set.store(false, Ordering::Release);
        }
        cleared
    }
}
