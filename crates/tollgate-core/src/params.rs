use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

use crate::Algorithm;

/// Largest limit or burst accepted. Far above any real quota, and small enough that every
/// scaled computation (`limit * period_in_micros`) fits comfortably in `u128` and that the
/// value is exact in a Lua double (below 2^53).
pub const MAX_LIMIT: u64 = 1_000_000_000_000;
/// Largest limit for `sliding_window_log`, whose state holds one entry per admitted request.
pub const MAX_LOG_LIMIT: u64 = 100_000;
/// Shortest period: one millisecond.
pub const MIN_PERIOD: Duration = Duration::from_millis(1);
/// Longest period: 400 days (a `year` unit is 365 days).
pub const MAX_PERIOD: Duration = Duration::from_secs(400 * 86_400);

/// Validated parameters of one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Params {
    algorithm: Algorithm,
    limit: NonZeroU64,
    period_micros: NonZeroU64,
    burst: u64,
    /// Whether a request that does not fit whole is charged what is left instead of denied.
    up_to_limit: bool,
}

/// Why a set of parameters is impossible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamsError {
    /// The limit is zero.
    ZeroLimit,
    /// The limit is above [`MAX_LIMIT`] (or [`MAX_LOG_LIMIT`] for the sliding log).
    LimitTooLarge {
        /// The limit asked for.
        limit: u64,
        /// The largest limit this algorithm accepts.
        max: u64,
    },
    /// The period is outside [`MIN_PERIOD`]..=[`MAX_PERIOD`].
    PeriodOutOfRange(Duration),
    /// The period is not a whole number of microseconds.
    PeriodNotWholeMicros(Duration),
    /// `burst` is zero or above [`MAX_LIMIT`].
    BadBurst(u64),
    /// `burst` given for an algorithm that has no bucket.
    BurstNotSupported(Algorithm),
}

impl fmt::Display for ParamsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamsError::ZeroLimit => f.write_str("limit must be at least 1"),
            ParamsError::LimitTooLarge { limit, max } => {
                write!(f, "limit {limit} is above the maximum of {max}")
            }
            ParamsError::PeriodOutOfRange(d) => write!(
                f,
                "period {d:?} is outside the supported range 1ms..=400 days"
            ),
            ParamsError::PeriodNotWholeMicros(d) => {
                write!(f, "period {d:?} is not a whole number of microseconds")
            }
            ParamsError::BadBurst(b) => {
                write!(f, "burst {b} must be between 1 and {MAX_LIMIT}")
            }
            ParamsError::BurstNotSupported(a) => write!(
                f,
                "burst is not supported by {a}; only token_bucket, leaky_bucket and gcra have a bucket"
            ),
        }
    }
}

impl std::error::Error for ParamsError {}

impl Params {
    /// Validates and builds parameters. `burst` defaults to `limit`.
    pub fn new(
        algorithm: Algorithm,
        limit: u64,
        period: Duration,
        burst: Option<u64>,
    ) -> Result<Self, ParamsError> {
        let Some(nonzero_limit) = NonZeroU64::new(limit) else {
            return Err(ParamsError::ZeroLimit);
        };
        let max = if algorithm == Algorithm::SlidingWindowLog {
            MAX_LOG_LIMIT
        } else {
            MAX_LIMIT
        };
        if limit > max {
            return Err(ParamsError::LimitTooLarge { limit, max });
        }
        if !(MIN_PERIOD..=MAX_PERIOD).contains(&period) {
            return Err(ParamsError::PeriodOutOfRange(period));
        }
        if !period.subsec_nanos().is_multiple_of(1_000) {
            return Err(ParamsError::PeriodNotWholeMicros(period));
        }
        let burst = match burst {
            None => limit,
            Some(_) if !algorithm.uses_burst() => {
                return Err(ParamsError::BurstNotSupported(algorithm));
            }
            Some(b) if b == 0 || b > MAX_LIMIT => return Err(ParamsError::BadBurst(b)),
            Some(b) => b,
        };
        // In range by the checks above: from 1ms to 400 days in microseconds.
        let Some(period_micros) = NonZeroU64::new(period.as_micros() as u64) else {
            return Err(ParamsError::PeriodOutOfRange(period));
        };
        Ok(Params {
            algorithm,
            limit: nonzero_limit,
            period_micros,
            burst,
            up_to_limit: false,
        })
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Requests (cost units) per period.
    pub fn limit(&self) -> u64 {
        self.limit.get()
    }

    /// The limit, as a bucket state written under these params records it.
    pub(crate) fn limit_scale(&self) -> NonZeroU64 {
        self.limit
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_micros.get())
    }

    /// The period in microseconds.
    pub fn period_micros(&self) -> u64 {
        self.period_micros.get()
    }

    /// The period in microseconds, as a bucket state written under these params records it.
    pub(crate) fn period_scale(&self) -> NonZeroU64 {
        self.period_micros
    }

    /// Bucket capacity for bucket algorithms; equal to `limit` for the others.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// GCRA's tolerance (the leaky bucket's queue), `burst * period / limit`, in whole
    /// microseconds rounded down and at most 2^52 (the store scripts' numbers are doubles): how
    /// far ahead of now a key's instant can be once a request has been admitted.
    pub fn tolerance_micros(&self) -> u64 {
        let tolerance = u128::from(self.burst) * u128::from(self.period_micros.get())
            / u128::from(self.limit.get());
        u64::try_from(tolerance.min(1 << 52)).unwrap_or(1 << 52)
    }

    /// These params, charging up to the limit (or not): a request whose whole cost does not
    /// fit is then admitted while any unit is left and charged what is left, for costs known
    /// only once the work is done (tokens a response used). Only [`crate::decide`] (and so
    /// [`crate::decide_or_check`]) reads this; each algorithm's own `decide` charges whole.
    pub fn charging_up_to_limit(self, up_to_limit: bool) -> Self {
        Params {
            up_to_limit,
            ..self
        }
    }

    /// Whether a request that does not fit whole is charged what is left instead of denied.
    pub fn charges_up_to_limit(&self) -> bool {
        self.up_to_limit
    }

    /// The largest cost a single request can ever be admitted with whole (charging up to the
    /// limit admits a larger one for what is left).
    pub fn capacity(&self) -> u64 {
        if self.algorithm.uses_burst() {
            self.burst
        } else {
            self.limit.get()
        }
    }

    /// These params with `limit` per `period` instead: the same algorithm and way of charging,
    /// and for an algorithm with a burst, one in the same proportion to the new limit (at least
    /// 1), so the capacity scales with the limit. For a runtime override's limit, or a
    /// replica's share of one.
    pub fn rescaled(&self, limit: u64, period: Duration) -> Result<Params, ParamsError> {
        let burst = self.algorithm.uses_burst().then(|| {
            let burst = u128::from(self.burst) * u128::from(limit) / u128::from(self.limit.get());
            u64::try_from(burst).unwrap_or(u64::MAX).max(1)
        });
        Params::new(self.algorithm, limit, period, burst)
            .map(|params| params.charging_up_to_limit(self.up_to_limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescaling_keeps_the_burst_in_proportion_and_the_way_of_charging() {
        let second = Duration::from_secs(1);
        let bucket = Params::new(Algorithm::TokenBucket, 7, second, Some(20))
            .unwrap_or_else(|e| panic!("{e}"))
            .charging_up_to_limit(true);
        let half = bucket.rescaled(3, second).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((half.limit(), half.burst()), (3, 8));
        assert!(half.charges_up_to_limit());
        let tiny = bucket.rescaled(1, second).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(tiny.burst(), 2);
        let window =
            Params::new(Algorithm::FixedWindow, 10, second, None).unwrap_or_else(|e| panic!("{e}"));
        let longer = window
            .rescaled(4, second * 60)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((longer.limit(), longer.period()), (4, second * 60));
        assert!(bucket.rescaled(0, second).is_err());
    }
}
