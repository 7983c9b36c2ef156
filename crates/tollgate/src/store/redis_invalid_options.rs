//! What [`RedisOptions::check`](super::RedisOptions::check) refuses, one problem at a time.

use std::time::Duration;

/// Settings [`RedisOptions::check`](super::RedisOptions::check) refuses: each problem, named by
/// its field, `; `-separated.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidOptions {
    /// Every problem, in the order of the checks.
    pub problems: Vec<OptionsProblem>,
}

impl std::fmt::Display for InvalidOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for InvalidOptions {}

/// One setting [`RedisOptions::check`](super::RedisOptions::check) refuses; its text starts with
/// the field's name.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum OptionsProblem {
    /// `command_timeout` is zero.
    #[error("command_timeout is 0: every call would miss its deadline")]
    NoCommandTimeout,
    /// A duration (`field`) above [`MAX_SETTING`](super::MAX_SETTING).
    #[error("{field} ({value:?}) is more than a day: no deadline of the store's is that long")]
    OverADay {
        field: &'static str,
        value: Duration,
    },
    /// `max_in_flight` is zero.
    #[error("max_in_flight is 0: every decision would be shed")]
    NoInFlight,
    /// `breaker.consecutive_failures` is zero.
    #[error("breaker.consecutive_failures is 0: the breaker would open without a failure")]
    NoBreakerFailures,
    /// `breaker.failure_ratio` is not in (0, 1].
    #[error("breaker.failure_ratio {0} is not above 0 and at most 1")]
    FailureRatio(f64),
    /// `coalesce.in_flight` is zero.
    #[error("coalesce.in_flight is 0: no batch could be sent")]
    NoBatchesInFlight,
    /// `coalesce.window` is more than half of `command_timeout`.
    #[error(
        "coalesce.window ({window:?}) is more than half of command_timeout ({command_timeout:?}): \
         decisions would miss their deadline waiting for their batch"
    )]
    WindowOverHalf {
        window: Duration,
        command_timeout: Duration,
    },
}
