use std::num::NonZeroU64;

use crate::scaled::{div_ceil, instant, rescale_down, rescale_up};
use crate::{Algorithm, Params, SlidingLog, Timestamp};

/// Stored state of one key. Which variant is used depends on the limit's algorithm.
///
/// Bucket algorithms keep time in *scaled* units, `micros * limit`, so that a drain or refill of
/// `limit` units per `period` is exact integer arithmetic (one unit per scaled microsecond per
/// token of period): a token is worth `period_micros` scaled units.
///
/// A scaled value records the `scale` it was written in, because a policy reload can change a
/// live key's limit, burst or period. Under other params the state keeps meaning the same thing:
/// GCRA's theoretical arrival time and the leaky bucket's empty instant stay the same instants,
/// the token bucket keeps its number of tokens at `updated`, capped at the new burst. A value
/// that is not a whole number of units in the new scale is rounded so that it never gives more
/// quota than before: instants round up (later), tokens round down. The windows and the log
/// store plain counts and instants, which mean the same under any limit.
///
/// One bound on those instants, as the token bucket's cap at the new burst: GCRA's and the
/// leaky bucket's states also record the tolerance they were written under
/// ([`Params::tolerance_micros`]), and when the current one is smaller the instant moves
/// earlier by the difference. Without it, loosening a limit whose period was longer (1 per hour
/// to 10 per minute), or lifting a stricter override, left a key that had used its quota denied
/// until the old instant, up to the old period, where a token bucket waits one new emission.
/// The instant is then at most the new tolerance ahead of when it was written: a key that had
/// used all its quota is as used up as the new params can make it, and recovers at their rate
/// from then on. A state written before the tolerance was recorded reads 0, which moves
/// nothing.
///
/// A state of a variant that does not match the limit's algorithm (left over after a policy
/// changed the algorithm of a key) is treated as [`State::empty`] by [`crate::decide`] and by
/// [`State::expires_at`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Count admitted in the window with index `window` (`now / period`).
    FixedWindow {
        /// Index of the window the count belongs to: `micros_since_epoch / period_micros`.
        window: u64,
        /// Cost admitted in that window.
        count: u64,
    },
    /// The cost admitted at each instant, oldest first; never more than `limit` entries.
    SlidingWindowLog {
        /// One entry per instant, with running sums (see [`SlidingLog`]).
        log: SlidingLog,
    },
    /// Counts of the window `window` and of the one before it.
    SlidingWindowCounter {
        /// Index of the current window: `micros_since_epoch / period_micros`.
        window: u64,
        /// Cost admitted in window `window`.
        current: u64,
        /// Cost admitted in window `window - 1`.
        previous: u64,
    },
    /// Tokens at time `updated`, times the period in microseconds they were written under.
    TokenBucket {
        /// Tokens in the bucket at `updated`, times `scale`.
        tokens_scaled: u128,
        /// When `tokens_scaled` was computed.
        updated: Timestamp,
        /// The period in microseconds ([`Params::period_micros`]) of the params the state was
        /// written under: a token is `scale` units of `tokens_scaled`.
        scale: NonZeroU64,
    },
    /// Theoretical arrival time, in scaled units (`micros * limit` of the limit it was written
    /// under).
    Gcra {
        /// Theoretical arrival time of the next request, in `micros * scale`.
        tat_scaled: u128,
        /// The limit ([`Params::limit`]) of the params the state was written under: a
        /// microsecond is `scale` units of `tat_scaled`.
        scale: NonZeroU64,
        /// [`Params::tolerance_micros`] of the params the state was written under.
        tolerance: u64,
    },
    /// Time at which the queue is empty, in scaled units (`micros * limit` of the limit it was
    /// written under).
    LeakyBucket {
        /// When the last admitted request has fully drained, in `micros * scale`.
        empty_at_scaled: u128,
        /// The limit ([`Params::limit`]) of the params the state was written under: a
        /// microsecond is `scale` units of `empty_at_scaled`.
        scale: NonZeroU64,
        /// [`Params::tolerance_micros`] (the queue) of the params the state was written under.
        tolerance: u64,
    },
}

/// How to change a [`State`] to charge an admitted request. Produced by [`crate::decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Nothing changes (the request was denied, or it cost nothing).
    Keep,
    /// Replace the state (every algorithm but the sliding log).
    Set(State),
    /// Sliding log: drop entries whose time is before `evict_before` (they have expired), then
    /// insert `(at, cost)` keeping the entries sorted by time.
    ///
    /// `evict_before` is `now + 1µs - period` (zero when that is negative): an entry expires when
    /// `time + period <= now`, i.e. `time < evict_before`.
    LogAppend {
        /// Entries strictly before this instant have expired.
        evict_before: Timestamp,
        /// Admission time of the new entry (the decision's `now`).
        at: Timestamp,
        /// Cost of the new entry.
        cost: u64,
    },
}

impl State {
    /// The state of a key that has never been charged: a full bucket, an empty window or log.
    pub fn empty(params: &Params) -> State {
        match params.algorithm() {
            Algorithm::FixedWindow => State::FixedWindow {
                window: 0,
                count: 0,
            },
            Algorithm::SlidingWindowLog => State::SlidingWindowLog {
                log: SlidingLog::new(),
            },
            Algorithm::SlidingWindowCounter => State::SlidingWindowCounter {
                window: 0,
                current: 0,
                previous: 0,
            },
            Algorithm::TokenBucket => State::TokenBucket {
                tokens_scaled: u128::from(params.burst()) * u128::from(params.period_micros()),
                updated: Timestamp::EPOCH,
                scale: params.period_scale(),
            },
            Algorithm::LeakyBucket => State::LeakyBucket {
                empty_at_scaled: 0,
                scale: params.limit_scale(),
                tolerance: params.tolerance_micros(),
            },
            Algorithm::Gcra => State::Gcra {
                tat_scaled: 0,
                scale: params.limit_scale(),
                tolerance: params.tolerance_micros(),
            },
        }
    }

    /// A token bucket's tokens at `updated` times `params.period_micros()`, and `updated`:
    /// rescaled from the period the state was written under, rounded down. Not capped at the
    /// burst (the caller caps after the refill). `None` for another algorithm's state.
    pub(crate) fn token_bucket(&self, params: &Params) -> Option<(u128, Timestamp)> {
        match *self {
            State::TokenBucket {
                tokens_scaled,
                updated,
                scale,
            } => Some((
                rescale_down(tokens_scaled, scale, params.period_scale()),
                updated,
            )),
            _ => None,
        }
    }

    /// GCRA's theoretical arrival time in `micros * params.limit()`: rescaled from the limit
    /// the state was written under, rounded up, and moved earlier by how much the tolerance
    /// shrank (see [`State`]). `None` for another algorithm's state.
    pub(crate) fn gcra_tat(&self, params: &Params) -> Option<u128> {
        match *self {
            State::Gcra {
                tat_scaled,
                scale,
                tolerance,
            } => Some(instant_under(tat_scaled, scale, tolerance, params)),
            _ => None,
        }
    }

    /// The leaky bucket's empty instant in `micros * params.limit()`, read as
    /// [`State::gcra_tat`] reads GCRA's. `None` for another algorithm's state.
    pub(crate) fn leaky_bucket_empty_at(&self, params: &Params) -> Option<u128> {
        match *self {
            State::LeakyBucket {
                empty_at_scaled,
                scale,
                tolerance,
            } => Some(instant_under(empty_at_scaled, scale, tolerance, params)),
            _ => None,
        }
    }

    /// The algorithm this state belongs to.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            State::FixedWindow { .. } => Algorithm::FixedWindow,
            State::SlidingWindowLog { .. } => Algorithm::SlidingWindowLog,
            State::SlidingWindowCounter { .. } => Algorithm::SlidingWindowCounter,
            State::TokenBucket { .. } => Algorithm::TokenBucket,
            State::Gcra { .. } => Algorithm::Gcra,
            State::LeakyBucket { .. } => Algorithm::LeakyBucket,
        }
    }

    /// Applies a transition returned by [`crate::decide`] for this state.
    ///
    /// This is the only place the sliding log grows. A [`Transition::LogAppend`] applied to a
    /// state of another algorithm starts a new log; a zero-cost entry is never stored.
    pub fn apply(&mut self, transition: Transition) {
        match transition {
            Transition::Keep => {}
            Transition::Set(state) => *self = state,
            Transition::LogAppend {
                evict_before,
                at,
                cost,
            } => {
                if !matches!(self, State::SlidingWindowLog { .. }) {
                    *self = State::SlidingWindowLog {
                        log: SlidingLog::new(),
                    };
                }
                if let State::SlidingWindowLog { log } = self {
                    log.append(evict_before, at, cost);
                }
            }
        }
    }

    /// The earliest instant from which this state behaves exactly like [`State::empty`]: any
    /// decision at or after it is identical to the decision on an empty state. Stores may forget
    /// the key from then on (a Redis TTL is derived from it).
    ///
    /// [`Timestamp::EPOCH`] when the state is already equivalent to empty (including a state of
    /// another algorithm than `params`'); saturates at [`Timestamp::MAX`]. A bucket state written
    /// under other params is read as [`crate::decide`] reads it (see [`State`]): GCRA and the
    /// leaky bucket expire at the same instant under any params, a token bucket when its kept
    /// tokens have refilled to the new burst at the new rate.
    pub fn expires_at(&self, params: &Params) -> Timestamp {
        if self.algorithm() != params.algorithm() {
            return Timestamp::EPOCH;
        }
        let period = u128::from(params.period_micros());
        let limit = u128::from(params.limit());
        match self {
            State::FixedWindow { window, count } => {
                if *count == 0 {
                    Timestamp::EPOCH
                } else {
                    instant((u128::from(*window) + 1) * period)
                }
            }
            State::SlidingWindowLog { log } => log.newest().map_or(Timestamp::EPOCH, |newest| {
                instant(u128::from(newest.as_micros()) + period)
            }),
            State::SlidingWindowCounter {
                window,
                current,
                previous,
            } => {
                // `current` weighs on the next window too; `previous` only until `window` ends.
                let windows_left = if *current > 0 {
                    2
                } else if *previous > 0 {
                    1
                } else {
                    return Timestamp::EPOCH;
                };
                instant((u128::from(*window) + windows_left) * period)
            }
            // The buckets read their scaled value as `decide` does (`token_bucket`, `gcra_tat`,
            // `leaky_bucket_empty_at`).
            State::TokenBucket {
                tokens_scaled,
                updated,
                scale,
            } => {
                let tokens = rescale_down(*tokens_scaled, *scale, params.period_scale());
                let capacity = u128::from(params.burst()) * period;
                let missing = capacity.saturating_sub(tokens);
                instant(u128::from(updated.as_micros()).saturating_add(div_ceil(missing, limit)))
            }
            State::Gcra {
                tat_scaled: at,
                scale,
                tolerance,
            }
            | State::LeakyBucket {
                empty_at_scaled: at,
                scale,
                tolerance,
            } => instant(div_ceil(
                instant_under(*at, *scale, *tolerance, params),
                limit,
            )),
        }
    }
}

/// A GCRA or leaky bucket instant `at`, scaled by `scale` and written under a tolerance of
/// `tolerance` µs, read under `params`: rescaled to `micros * params.limit()` (rounded up), then
/// moved earlier by however much `params`' tolerance is smaller (rounded down: never further).
fn instant_under(at: u128, scale: NonZeroU64, tolerance: u64, params: &Params) -> u128 {
    let l = u128::from(params.limit());
    let current = u128::from(params.burst()) * u128::from(params.period_micros());
    let shrunk = (u128::from(tolerance) * l).saturating_sub(current);
    rescale_up(at, scale, params.limit_scale()).saturating_sub(shrunk)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn params(algorithm: Algorithm) -> Params {
        Params::new(algorithm, 4, Duration::from_millis(10), None).unwrap()
    }

    fn t(micros: u64) -> Timestamp {
        Timestamp::from_micros(micros)
    }

    fn scale(x: u64) -> NonZeroU64 {
        NonZeroU64::new(x).unwrap()
    }

    #[test]
    fn empty_states_have_expired() {
        for algorithm in Algorithm::ALL {
            let params = params(algorithm);
            let empty = State::empty(&params);
            assert_eq!(empty.algorithm(), algorithm);
            assert_eq!(empty.expires_at(&params), Timestamp::EPOCH, "{algorithm}");
        }
    }

    #[test]
    fn log_append_evicts_expired_entries_and_keeps_order() {
        let mut log = State::SlidingWindowLog {
            log: SlidingLog::from_entries([(t(100), 1), (t(200), 1), (t(300), 1)]),
        };
        log.apply(Transition::LogAppend {
            evict_before: t(200),
            at: t(250),
            cost: 2,
        });
        log.apply(Transition::LogAppend {
            evict_before: t(0),
            at: t(400),
            cost: 0,
        });
        let expected = SlidingLog::from_entries([(t(200), 1), (t(250), 2), (t(300), 1)]);
        assert_eq!(log, State::SlidingWindowLog { log: expected });
        assert_eq!(
            log.expires_at(&params(Algorithm::SlidingWindowLog)),
            t(10_300)
        );
    }

    #[test]
    fn log_append_replaces_a_foreign_state() {
        let mut state = State::Gcra {
            tat_scaled: 7,
            scale: NonZeroU64::MIN,
            tolerance: 0,
        };
        state.apply(Transition::LogAppend {
            evict_before: t(0),
            at: t(5),
            cost: 1,
        });
        assert_eq!(
            state,
            State::SlidingWindowLog {
                log: SlidingLog::from_entries([(t(5), 1)])
            }
        );
    }

    #[test]
    fn expiry_of_each_algorithm() {
        let fixed = State::FixedWindow {
            window: 3,
            count: 1,
        };
        assert_eq!(fixed.expires_at(&params(Algorithm::FixedWindow)), t(40_000));
        let counter = |current, previous| State::SlidingWindowCounter {
            window: 3,
            current,
            previous,
        };
        let swc = params(Algorithm::SlidingWindowCounter);
        assert_eq!(counter(1, 0).expires_at(&swc), t(50_000));
        assert_eq!(counter(0, 1).expires_at(&swc), t(40_000));
        assert_eq!(counter(0, 0).expires_at(&swc), Timestamp::EPOCH);
        // 4 per 10ms: 10_000 scaled units per token, 4 scaled units per microsecond.
        let bucket = State::TokenBucket {
            tokens_scaled: 30_000,
            updated: t(1_000),
            scale: scale(10_000),
        };
        assert_eq!(bucket.expires_at(&params(Algorithm::TokenBucket)), t(3_500));
        let gcra = State::Gcra {
            tat_scaled: 4_001,
            scale: scale(4),
            tolerance: 10_000,
        };
        assert_eq!(gcra.expires_at(&params(Algorithm::Gcra)), t(1_001));
        let leaky = State::LeakyBucket {
            empty_at_scaled: 4_000,
            scale: scale(4),
            tolerance: 10_000,
        };
        assert_eq!(leaky.expires_at(&params(Algorithm::LeakyBucket)), t(1_000));
        assert_eq!(leaky.expires_at(&params(Algorithm::Gcra)), Timestamp::EPOCH);
        // Written under a tolerance of 1 s where it is 10 ms now: 990 ms earlier (here, at
        // the epoch at once); a state without a recorded tolerance keeps its instant.
        let written_looser = |tolerance| State::Gcra {
            tat_scaled: 4 * 2_000_000,
            scale: scale(4),
            tolerance,
        };
        let gcra = params(Algorithm::Gcra);
        assert_eq!(gcra.tolerance_micros(), 10_000);
        assert_eq!(written_looser(0).expires_at(&gcra), t(2_000_000));
        assert_eq!(written_looser(10_000).expires_at(&gcra), t(2_000_000));
        assert_eq!(written_looser(1_000_000).expires_at(&gcra), t(1_010_000));
        assert_eq!(
            written_looser(5_000_000).expires_at(&gcra),
            Timestamp::EPOCH
        );
    }
}
