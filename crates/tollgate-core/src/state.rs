use std::num::NonZeroU64;

use crate::scaled::{div_ceil, instant};
use crate::{Algorithm, Params, SlidingLog, Timestamp};

/// Stored state of one key. Which variant is used depends on the limit's algorithm.
///
/// Bucket algorithms keep time in *scaled* units, `micros * limit`, so that a drain or refill of
/// `limit` units per `period` is exact integer arithmetic (one unit per scaled microsecond per
/// token of period): a unit of cost is worth `period_micros` scaled units.
///
/// # When the params change
///
/// A policy reload (or an override) can change a live key's limit, burst or period. Every
/// algorithm then follows one rule: **the key keeps the units it has used, and what is left is
/// `max(0, new capacity - used)`**.
///
/// - The windows and the log store plain counts and instants, which mean the same under any
///   params: a window's count (or the log's entries in the trailing period) is what has been
///   used, and the new limit is measured against it.
/// - The buckets record when they were last written (`updated`) and the limit and period they
///   were written under. Read under other params, the units used at `updated` (the token
///   bucket's missing tokens, GCRA's and the leaky bucket's backlog) become as many units of the
///   new params, capped at the new burst and rounded up to the next `1 / period_micros` unit
///   (never more quota than before); from `updated` on they drain at the new rate. The cap also
///   applies when only the burst changed. Converting at `updated`, a fixed instant, keeps every
///   decision under the new params a function of the state alone, so a denial's `retry_after`
///   stays exact though a denial writes nothing.
///
/// The stores give a state a TTL from [`State::expires_at`] under the params it was written
/// with, and forget it then. Under new params whose rate is slower per unit (a bucket's units
/// drain more slowly, a window or log period is longer), a state can still hold units used at
/// that instant: it is forgotten with them, and the key starts afresh. This is part of the rule:
/// a state lives until the expiry it was written with.
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
    /// Tokens missing from the bucket at time `updated`, in scaled units of the params it was
    /// written under (a token is `period` units; `limit` units refill per microsecond).
    TokenBucket {
        /// Tokens used (missing from a full bucket) at `updated`, times `period`.
        used_scaled: u128,
        /// When `used_scaled` was computed.
        updated: Timestamp,
        /// The limit ([`Params::limit`]) of the params the state was written under.
        limit: NonZeroU64,
        /// The period in microseconds ([`Params::period_micros`]) of those params.
        period: NonZeroU64,
    },
    /// Theoretical arrival time, in scaled units (`micros * limit` of the limit it was written
    /// under).
    Gcra {
        /// Theoretical arrival time of the next request, in `micros * limit`.
        tat_scaled: u128,
        /// When the state was written: the instant its units used convert at.
        updated: Timestamp,
        /// The limit ([`Params::limit`]) of the params the state was written under: a
        /// microsecond is `limit` units of `tat_scaled`.
        limit: NonZeroU64,
        /// The period in microseconds of those params: a unit of cost is `period` units of
        /// `tat_scaled`.
        period: NonZeroU64,
    },
    /// Time at which the queue is empty, in scaled units (`micros * limit` of the limit it was
    /// written under).
    LeakyBucket {
        /// When the last admitted request has fully drained, in `micros * limit`.
        empty_at_scaled: u128,
        /// When the state was written: the instant its units used convert at.
        updated: Timestamp,
        /// The limit ([`Params::limit`]) of the params the state was written under.
        limit: NonZeroU64,
        /// The period in microseconds of those params.
        period: NonZeroU64,
    },
}

/// How to change a [`State`] to charge an admitted request, or to give a charge back.
/// Produced by [`crate::decide`] and [`crate::refund`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Nothing changes (the request was denied, or it cost nothing; nothing to give back).
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
    /// Sliding log: take up to `cost` back from the entry at `at` (a charge given back, see
    /// [`crate::refund`]); an entry left with no cost goes.
    LogTakeBack {
        /// The instant of the charge given back.
        at: Timestamp,
        /// The cost given back.
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
                used_scaled: 0,
                updated: Timestamp::EPOCH,
                limit: params.limit_scale(),
                period: params.period_scale(),
            },
            Algorithm::LeakyBucket => State::LeakyBucket {
                empty_at_scaled: 0,
                updated: Timestamp::EPOCH,
                limit: params.limit_scale(),
                period: params.period_scale(),
            },
            Algorithm::Gcra => State::Gcra {
                tat_scaled: 0,
                updated: Timestamp::EPOCH,
                limit: params.limit_scale(),
                period: params.period_scale(),
            },
        }
    }

    /// A token bucket's tokens used at `updated`, in scaled units of `params` (a token is
    /// `params.period_micros()`), converted (see [`State`]), and `updated`. `None` for another
    /// algorithm's state.
    pub(crate) fn token_bucket(&self, params: &Params) -> Option<(u128, Timestamp)> {
        match *self {
            State::TokenBucket {
                used_scaled,
                updated,
                period,
                ..
            } => Some((used_under(used_scaled, period, params), updated)),
            _ => None,
        }
    }

    /// GCRA's theoretical arrival time in `micros * params.limit()`, converted (see [`State`]).
    /// `None` for another algorithm's state.
    pub(crate) fn gcra_tat(&self, params: &Params) -> Option<u128> {
        match *self {
            State::Gcra {
                tat_scaled,
                updated,
                limit,
                period,
            } => Some(instant_under(tat_scaled, updated, limit, period, params)),
            _ => None,
        }
    }

    /// The leaky bucket's empty instant in `micros * params.limit()`, read as
    /// [`State::gcra_tat`] reads GCRA's. `None` for another algorithm's state.
    pub(crate) fn leaky_bucket_empty_at(&self, params: &Params) -> Option<u128> {
        match *self {
            State::LeakyBucket {
                empty_at_scaled,
                updated,
                limit,
                period,
            } => Some(instant_under(
                empty_at_scaled,
                updated,
                limit,
                period,
                params,
            )),
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

    /// Heap bytes this state owns beyond its own size: a sliding log's entries (their
    /// capacity), nothing for the other algorithms. Constant time, for stores that account
    /// for their memory.
    pub fn heap_bytes(&self) -> usize {
        match self {
            State::SlidingWindowLog { log } => log.heap_bytes(),
            _ => 0,
        }
    }

    /// Applies a transition returned by [`crate::decide`] or [`crate::refund`] for this state.
    ///
    /// This is the only place the sliding log grows. A [`Transition::LogAppend`] applied to a
    /// state of another algorithm starts a new log; a zero-cost entry is never stored. A
    /// [`Transition::LogTakeBack`] changes nothing but a log.
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
            Transition::LogTakeBack { at, cost } => {
                if let State::SlidingWindowLog { log } = self {
                    log.take_back(at, cost);
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
    /// under other params is read as [`crate::decide`] reads it (see [`State`]): its units used,
    /// converted, drained at `params`' rate.
    pub fn expires_at(&self, params: &Params) -> Timestamp {
        if self.algorithm() != params.algorithm() {
            return Timestamp::EPOCH;
        }
        let period = u128::from(params.period_micros());
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
            // The buckets read their state as `decide` does.
            State::TokenBucket {
                used_scaled,
                updated,
                period: written,
                ..
            } => {
                let used = used_under(*used_scaled, *written, params);
                let limit = u128::from(params.limit());
                instant(u128::from(updated.as_micros()).saturating_add(div_ceil(used, limit)))
            }
            State::Gcra {
                tat_scaled: at,
                updated,
                limit,
                period: written,
            }
            | State::LeakyBucket {
                empty_at_scaled: at,
                updated,
                limit,
                period: written,
            } => instant(div_ceil(
                instant_under(*at, *updated, *limit, *written, params),
                u128::from(params.limit()),
            )),
        }
    }
}

/// A GCRA or leaky bucket instant `at`, scaled by `limit` and written at `updated` under
/// `limit` per `period` µs, as an instant scaled by `params.limit()`: its backlog at `updated`
/// (the units used then) converted (see [`used_under`]) and added to `updated`. The identity
/// under the same limit and period when the backlog fits the burst.
fn instant_under(
    at: u128,
    updated: Timestamp,
    limit: NonZeroU64,
    period: NonZeroU64,
    params: &Params,
) -> u128 {
    let from = u128::from(updated.as_micros());
    let ahead = at.saturating_sub(from * u128::from(limit.get()));
    let used = used_under(ahead, period, params);
    if limit == params.limit_scale() && period == params.period_scale() && used == ahead {
        return at;
    }
    from * u128::from(params.limit()) + used
}

/// Units used, `used` scaled units of a period of `period` µs (a unit is `period` of them), as
/// scaled units of `params` (a unit is `params.period_micros()`), capped at its burst: rounded up
/// to the next scaled unit, so never more quota than before; exact (and the identity) when the
/// period is the same.
fn used_under(used: u128, period: NonZeroU64, params: &Params) -> u128 {
    let p = u128::from(params.period_micros());
    let capacity = u128::from(params.burst()) * p;
    if period == params.period_scale() {
        return used.min(capacity);
    }
    let from = u128::from(period.get());
    let units = used / from;
    if units >= u128::from(params.burst()) {
        return capacity;
    }
    // Below the burst: every product stays below 2^128 (units < 2^40, periods < 2^45).
    (units * p + div_ceil((used % from) * p, from)).min(capacity)
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
            updated: t(0),
            limit: NonZeroU64::MIN,
            period: NonZeroU64::MIN,
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
            used_scaled: 10_000,
            updated: t(1_000),
            limit: scale(4),
            period: scale(10_000),
        };
        assert_eq!(bucket.expires_at(&params(Algorithm::TokenBucket)), t(3_500));
        let gcra = State::Gcra {
            tat_scaled: 4_001,
            updated: t(1_000),
            limit: scale(4),
            period: scale(10_000),
        };
        assert_eq!(gcra.expires_at(&params(Algorithm::Gcra)), t(1_001));
        let leaky = State::LeakyBucket {
            empty_at_scaled: 4_000,
            updated: t(1_000),
            limit: scale(4),
            period: scale(10_000),
        };
        assert_eq!(leaky.expires_at(&params(Algorithm::LeakyBucket)), t(1_000));
        assert_eq!(leaky.expires_at(&params(Algorithm::Gcra)), Timestamp::EPOCH);
    }

    /// A bucket read under other params expires when its units used, converted at the instant
    /// it was written, have drained at the new rate.
    #[test]
    fn a_bucket_under_other_params_expires_at_the_new_rate() {
        // One unit used at 1ms, written under 4 per 10ms (a unit is 2.5ms).
        let bucket = State::TokenBucket {
            used_scaled: 10_000,
            updated: t(1_000),
            limit: scale(4),
            period: scale(10_000),
        };
        let gcra = State::Gcra {
            tat_scaled: 4 * 1_000 + 10_000,
            updated: t(1_000),
            limit: scale(4),
            period: scale(10_000),
        };
        for (limit, period, expires) in [(4, 10, 3_500), (1, 10, 11_000), (1, 1, 2_000)] {
            let period = Duration::from_millis(period);
            let tb = Params::new(Algorithm::TokenBucket, limit, period, None).unwrap();
            assert_eq!(bucket.expires_at(&tb), t(expires));
            let g = Params::new(Algorithm::Gcra, limit, period, None).unwrap();
            assert_eq!(gcra.expires_at(&g), t(expires));
        }
    }

    /// Units used convert through the period: exact for the same period, rounded up to the next
    /// scaled unit otherwise, and capped at the new burst.
    #[test]
    fn units_used_convert_through_the_period_and_are_capped() {
        let second = Params::new(Algorithm::Gcra, 10, Duration::from_secs(1), Some(5)).unwrap();
        // 3.5 units of a 2 s period (7_000_000 scaled units): 3.5 units of a 1 s period.
        assert_eq!(used_under(7_000_000, scale(2_000_000), &second), 3_500_000);
        // 1 scaled unit of a 3 µs period is a third of a unit: 333_334 of a 1 s period.
        assert_eq!(used_under(1, scale(3), &second), 333_334);
        // The same period: the same number, capped at the burst (5 units).
        assert_eq!(used_under(4_000_000, scale(1_000_000), &second), 4_000_000);
        assert_eq!(used_under(9_000_000, scale(1_000_000), &second), 5_000_000);
        assert_eq!(used_under(u128::MAX, scale(7), &second), 5_000_000);
    }
}
