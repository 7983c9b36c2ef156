//! Exact integer arithmetic shared by the algorithms.
//!
//! Everything is computed in `u128`: with `limit <= MAX_LIMIT` (< 2^40), periods of at most
//! 400 days (< 2^45 microseconds) and timestamps below 2^64, every product the algorithms form
//! (`now * limit`, `limit * period`, `count * period`) stays below 2^111. Results are converted
//! back to `u64` microseconds with saturation, so a computation past the end of representable
//! time yields [`Timestamp::MAX`] or a very long duration instead of a panic. Values read from a
//! stored state can be anything, so sums involving them saturate too.
//!
//! A value read from a state written under other params is first [rescaled](rescale_up) from the
//! scale it was written in to the current one: exactly when the new value is a whole number of
//! units, otherwise rounded in the direction that gives no more quota than before.

use std::num::NonZeroU64;
use std::time::Duration;

use crate::Timestamp;

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

/// `ceil(n / d)`; `d` is a validated limit or period and never zero, but a zero divisor yields
/// `u128::MAX` ("never") rather than a panic.
pub(crate) fn div_ceil(n: u128, d: u128) -> u128 {
    if d == 0 { u128::MAX } else { n.div_ceil(d) }
}

/// `ceil(x * to / from)`, saturating: a value in units of `1 / from` (an instant scaled by
/// `from`) in units of `1 / to`, rounded up (later: never before the original).
///
/// Exact and the identity when `from == to`. `x` can be anything read from a state; `x / from`
/// is taken apart from the remainder so that no intermediate product overflows.
pub(crate) fn rescale_up(x: u128, from: NonZeroU64, to: NonZeroU64) -> u128 {
    rescale(x, from, to, div_ceil)
}

/// `floor(x * to / from)`, saturating: an amount in units of `1 / from` (tokens scaled by
/// `from`) in units of `1 / to`, rounded down (never more than the original).
///
/// Exact and the identity when `from == to`; see [`rescale_up`].
pub(crate) fn rescale_down(x: u128, from: NonZeroU64, to: NonZeroU64) -> u128 {
    rescale(x, from, to, |n, d| n / d)
}

/// `x * to / from` with the fractional part rounded by `round(n, d)` (`n / d` up or down).
fn rescale(x: u128, from: NonZeroU64, to: NonZeroU64, round: fn(u128, u128) -> u128) -> u128 {
    if from == to {
        return x;
    }
    let (from, to) = (u128::from(from.get()), u128::from(to.get()));
    // x * to / from = (x / from) * to + (x % from) * to / from; `(x % from) * to` is below
    // 2^128 because both factors are below 2^64.
    let (whole, part) = (x / from, x % from);
    whole
        .saturating_mul(to)
        .saturating_add(round(part * to, from))
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::{rescale_down, rescale_up};

    fn n(x: u64) -> NonZeroU64 {
        NonZeroU64::new(x).unwrap()
    }

    #[test]
    fn rescaling_is_exact_when_it_can_be_and_rounds_outward_otherwise() {
        // 2.5µs at limit 4 (10 units) is 250 units at limit 100, exactly.
        assert_eq!(rescale_up(10, n(4), n(100)), 250);
        assert_eq!(rescale_down(10, n(4), n(100)), 250);
        // 1µs + 1/3 at limit 3 (4 units) is 13.33.. units at limit 10.
        assert_eq!(rescale_up(4, n(3), n(10)), 14);
        assert_eq!(rescale_down(4, n(3), n(10)), 13);
        assert_eq!(rescale_up(7, n(5), n(5)), 7);
        assert_eq!(rescale_down(0, n(5), n(1)), 0);
    }

    #[test]
    fn rescaling_saturates_instead_of_overflowing() {
        let max = n(u64::MAX);
        assert_eq!(rescale_up(u128::MAX, n(1), max), u128::MAX);
        assert_eq!(rescale_down(u128::MAX, n(1), max), u128::MAX);
        // u128::MAX = (2^64 - 1) * (2^64 + 1).
        assert_eq!(rescale_up(u128::MAX, max, n(1)), (1 << 64) + 1);
        assert_eq!(rescale_up(u128::MAX - 1, max, n(1)), (1 << 64) + 1);
        assert_eq!(rescale_down(u128::MAX - 1, max, n(1)), 1 << 64);
    }
}
