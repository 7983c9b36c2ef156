//! Where time comes from. Decisions never read a clock directly: they take a [`Clock`], so tests
//! can drive time by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate_core::Timestamp;

/// A source of [`Timestamp`]s (microseconds since the Unix epoch).
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;

    /// The time at `instant`, a reading of the monotonic clock the caller has just taken (to
    /// time what it is about to do): one clock read where `now` would be a second. The
    /// default ignores it and returns [`Clock::now`].
    fn now_at(&self, instant: Instant) -> Timestamp {
        let _ = instant;
        self.now()
    }
}

/// Shared handle to a clock.
pub type SharedClock = Arc<dyn Clock>;

/// The real clock: wall time read once at start, then advanced by the monotonic clock, so a
/// wall-clock step (NTP, an operator) never moves decisions backwards.
#[derive(Debug)]
pub struct SystemClock {
    wall_at_start: Timestamp,
    start: Instant,
}

impl SystemClock {
    /// Anchors the monotonic clock to the current wall time.
    #[allow(clippy::disallowed_methods)] // the one place that reads real time
    pub fn new() -> Self {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        SystemClock {
            wall_at_start: Timestamp::from_micros(u64::try_from(wall.as_micros()).unwrap_or(0)),
            start: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        self.wall_at_start.saturating_add(self.start.elapsed())
    }

    fn now_at(&self, instant: Instant) -> Timestamp {
        self.wall_at_start
            .saturating_add(instant.saturating_duration_since(self.start))
    }
}

/// A clock that moves only when told to; for tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock stopped at `at`.
    pub fn new(at: Timestamp) -> Self {
        ManualClock(AtomicU64::new(at.as_micros()))
    }

    /// A clock stopped just after the second minute boundary ahead of the wall clock, for
    /// tests on Redis, which expires keys in real time at instants derived from this clock: a
    /// window that began at the wall time could end, in real time, while the test still counts
    /// on its key. From a minute boundary at least a minute ahead, a window of any period that
    /// divides a minute (or an hour) ends more than a minute of real time from now.
    pub fn ahead_of_wall_clock() -> Self {
        const MINUTE_US: u64 = 60_000_000;
        let now = SystemClock::new().now().as_micros();
        ManualClock::new(Timestamp::from_micros(
            (now / MINUTE_US + 2) * MINUTE_US + 1_000,
        ))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let micros = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.0.fetch_add(micros, Ordering::SeqCst);
    }

    /// Sets the clock to `at`.
    pub fn set(&self, at: Timestamp) {
        self.0.store(at.as_micros(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_micros(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::disallowed_methods)] // the instants the clock is asked about
    fn the_system_clock_at_an_instant_is_its_time_then() {
        let clock = SystemClock::new();
        let before = clock.now();
        let instant = Instant::now();
        let after = clock.now();
        let at = clock.now_at(instant);
        assert!(
            before <= at && at <= after,
            "{before:?} <= {at:?} <= {after:?}"
        );
        // An instant a second later is a second later on the clock, to the microsecond.
        let later = clock.now_at(instant + Duration::from_secs(1));
        assert_eq!(later.as_micros() - at.as_micros(), 1_000_000);
        // One from before the clock was made is its start, never earlier.
        if let Some(earlier) = clock.start.checked_sub(Duration::from_secs(5)) {
            assert_eq!(clock.now_at(earlier), clock.wall_at_start);
        }
    }

    #[test]
    fn a_manual_clock_ignores_the_instant() {
        let clock = ManualClock::new(Timestamp::from_micros(42));
        #[allow(clippy::disallowed_methods)]
        let instant = Instant::now() + Duration::from_secs(60);
        assert_eq!(clock.now_at(instant), Timestamp::from_micros(42));
    }
}
