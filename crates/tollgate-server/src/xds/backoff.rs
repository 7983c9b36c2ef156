//! The wait before reconnecting to the management server: exponential from the initial wait
//! up to the longest, each wait a random time between half and all of its step, so that a
//! fleet of replicas does not reconnect in step after the server restarts.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Reconnection waits.
#[derive(Debug, Clone)]
pub(super) struct Backoff {
    initial: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    pub(super) fn new(initial: Duration, max: Duration) -> Self {
        let max = max.max(initial);
        Backoff {
            initial,
            max,
            step: initial,
        }
    }

    /// The next wait; the step doubles (up to the longest) for the one after.
    pub(super) fn next_wait(&mut self) -> Duration {
        let step = self.step;
        self.step = step.saturating_mul(2).min(self.max);
        let half = step / 2;
        half + half.mul_f64(unit_random())
    }

    /// After a stream that worked: the next wait starts from the initial one again.
    pub(super) fn reset(&mut self) {
        self.step = self.initial;
    }
}

/// A random number in `[0, 1)`: std's random hash keys (random per process, and changed for
/// each new `RandomState`) hashing a counter.
fn unit_random() -> f64 {
    static DRAWN: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(DRAWN.fetch_add(1, Ordering::Relaxed));
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_longest_with_jitter_and_reset() {
        let (initial, max) = (Duration::from_millis(100), Duration::from_millis(700));
        let mut backoff = Backoff::new(initial, max);
        let steps = [100, 200, 400, 700, 700];
        for step in steps {
            let step = Duration::from_millis(step);
            let wait = backoff.next_wait();
            assert!(
                wait >= step / 2 && wait <= step,
                "{wait:?} for a step of {step:?}"
            );
        }
        backoff.reset();
        assert!(backoff.next_wait() <= initial);
    }
}
