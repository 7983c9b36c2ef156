//! The one place `tollgate bench` reads a clock: it measures wall time, it decides nothing.

use std::time::Instant;

/// Now, on the monotonic clock.
#[allow(clippy::disallowed_methods)]
pub(crate) fn now() -> Instant {
    Instant::now()
}
