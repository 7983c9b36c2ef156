//! Exact integer arithmetic shared by the algorithms.
//!
//! Everything is computed in `u128`: with `limit <= MAX_LIMIT` (< 2^40), periods of at most
//! 400 days (< 2^45 microseconds) and timestamps below 2^64, every product the algorithms form
//! (`now * limit`, `limit * period`, `count * period`) stays below 2^111. Results are converted
//! back to `u64` microseconds with saturation, so a computation past the end of representable
//! time yields [`Timestamp::MAX`] or a very long duration instead of a panic. Values read from a
//! stored state can be anything, so sums involving them saturate too.

use std::time::Duration;

use crate::{Params, Timestamp};

/// `x` as `u64`, saturating.
pub(crate) fn saturate(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// `x` microseconds as a duration, saturating at `u64::MAX` microseconds.
pub(crate) fn micros(x: u128) -> Duration {
    Duration::from_micros(saturate(x))
}

/// `x` microseconds after the epoch, saturating at [`Timestamp::MAX`].
pub(crate) fn instant(x: u128) -> Timestamp {
    Timestamp::from_micros(saturate(x))
}

/// A GCRA or leaky bucket instant, scaled, moved back by what a charge of `cost` at `at` added
/// ([`charged`]) but never before `at`;
/// `None` when it is not past `at`, and nothing is to move.
pub(crate) fn rewound(params: &Params, scaled: u128, at: Timestamp, cost: u64) -> Option<u128> {
    let floor = u128::from(at.as_micros()) * u128::from(params.limit());
    (scaled > floor).then(|| scaled.saturating_sub(charged(params, cost)).max(floor))
}

/// What a charge of `cost` added to a bucket's or GCRA's scaled state: `cost * period_micros`
/// scaled units, `cost` at most the burst.
pub(crate) fn charged(params: &Params, cost: u64) -> u128 {
    u128::from(cost.min(params.burst())) * u128::from(params.period_micros())
}

/// `ceil(n / d)`; `d` is a validated limit or period and never zero, but a zero divisor yields
/// `u128::MAX` ("never") rather than a panic.
pub(crate) fn div_ceil(n: u128, d: u128) -> u128 {
    if d == 0 { u128::MAX } else { n.div_ceil(d) }
}
