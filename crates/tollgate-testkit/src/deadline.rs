//! Wall-clock deadlines for waiting on real processes and sockets.

use std::time::{Duration, Instant};

/// A point in real time after which a wait gives up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    start: Instant,
    end: Instant,
}

impl Deadline {
    /// A deadline `timeout` from now.
    pub(crate) fn after(timeout: Duration) -> Self {
        let start = now();
        Self {
            start,
            end: start + timeout,
        }
    }

    /// Whether the deadline has passed.
    pub(crate) fn expired(&self) -> bool {
        now() >= self.end
    }

    /// Time left before the deadline (zero once it has passed).
    pub(crate) fn remaining(&self) -> Duration {
        self.end.saturating_duration_since(now())
    }

    /// Time since the deadline was set.
    pub(crate) fn elapsed(&self) -> Duration {
        now().saturating_duration_since(self.start)
    }
}

// The workspace bans `Instant::now` so the limiter's clock stays injectable; this kit waits on real
// processes, which only the real clock measures, so it reads it here and nowhere else.
#[allow(clippy::disallowed_methods)]
fn now() -> Instant {
    Instant::now()
}
