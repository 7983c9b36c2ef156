//! A log line written at most once per interval, however often what it reports happens.

use std::time::Duration;

use tokio::time::Instant;

/// Lets a line through at most once per `every`, counting the occurrences held back in between
/// (a flood of refused requests, a Redis that keeps failing must not flood the log).
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tollgate::observe::Throttle;
///
/// static REFUSED: Throttle = Throttle::new(Duration::from_secs(1));
/// let now = Instant::now();
/// assert_eq!(REFUSED.note(now), Some(0));
/// assert_eq!(REFUSED.note(now), None);
/// assert_eq!(REFUSED.note(now + Duration::from_secs(1)), Some(1));
/// ```
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    /// When a line last went out, and how many occurrences were held back since.
    state: parking_lot::Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    pub const fn new(every: Duration) -> Self {
        Throttle {
            every,
            state: parking_lot::const_mutex((None, 0)),
        }
    }

    /// Counts one occurrence at `now`: `Some(held back since the last line)` when its line is
    /// to be written, `None` when it is held back.
    pub fn note(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock();
        let (last, held_back) = &mut *state;
        if last.is_some_and(|at| now.duration_since(at) < self.every) {
            *held_back += 1;
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(held_back))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One line a second at most, the next one counting those held back.
    #[test]
    fn a_line_a_second_at_most_with_a_count_of_the_rest() {
        let throttle = Throttle::new(Duration::from_secs(1));
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(throttle.note(at(0)), Some(0));
        for ms in [1, 10, 500, 999] {
            assert_eq!(throttle.note(at(ms)), None, "{ms} ms");
        }
        assert_eq!(throttle.note(at(1000)), Some(4));
        assert_eq!(throttle.note(at(1500)), None);
        assert_eq!(throttle.note(at(5000)), Some(1));
        assert_eq!(throttle.note(at(6000)), Some(0));
    }
}
