//! The Redis backends' settings, and the check that refuses settings that could never decide.

use std::time::Duration;

use super::breaker::BreakerConfig;
use super::redis_invalid_options::{InvalidOptions, OptionsProblem};

/// Connection and failure settings for the Redis backends.
#[derive(Debug, Clone, Copy)]
pub struct RedisOptions {
    /// Time allowed to open a connection.
    pub connect_timeout: Duration,
    /// Deadline of one decision's store work (every call it needs, on a cluster too), from when
    /// its calls are sent; a call past it fails unless its node is answering others meanwhile
    /// (busy, not failing: it waits on, see `store::redis::patience`).
    pub command_timeout: Duration,
    /// Decisions sent to the store at once; more wait in tollgate's queue (on one server,
    /// joining larger batches) up to `max_wait`, at most [`QUEUED_PER_IN_FLIGHT`] times as many.
    pub max_in_flight: usize,
    /// The most a decision waits for the store in all (queue, in-flight cap, a busy node):
    /// past it, the failure posture answers for load (`tollgate_store_shed_total`). Never
    /// less than `command_timeout` (a shorter one is taken as that).
    pub max_wait: Duration,
    /// The circuit breaker of each node.
    pub breaker: BreakerConfig,
    /// How concurrent decisions share script calls (single server only).
    pub coalesce: CoalesceOptions,
}

impl Default for RedisOptions {
    fn default() -> Self {
        // Envoy waits 20 ms for the whole decision by default; the store gets half of it.
        RedisOptions {
            connect_timeout: Duration::from_secs(1),
            command_timeout: Duration::from_millis(10),
            max_in_flight: 1024,
            max_wait: DEFAULT_MAX_WAIT,
            breaker: BreakerConfig::default(),
            coalesce: CoalesceOptions::default(),
        }
    }
}

/// [`RedisOptions::max_wait`] by default: a burst of thousands on one key, on two busy cores,
/// is decided by the store well inside it (see docs/burst.md).
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(5);

/// Decisions that may wait in tollgate's queue towards one store, per place under the
/// in-flight cap; more are shed for load.
pub const QUEUED_PER_IN_FLIGHT: usize = 16;

/// The longest duration [`RedisOptions::check`] accepts, and `tollgate serve` for any of its
/// settings: a day (past it, deadline arithmetic could overflow, and no deadline of a rate
/// limiter is meant to be that long).
pub const MAX_SETTING: Duration = Duration::from_secs(24 * 3600);

impl RedisOptions {
    /// Refuses settings under which every decision would go to the failure posture with a
    /// healthy Redis (nothing may be in flight, a breaker that opens on no failure, a batch
    /// window over half the deadline): each problem, named by its field.
    pub fn check(&self) -> Result<(), InvalidOptions> {
        let mut problems = Vec::new();
        if self.command_timeout.is_zero() {
            problems.push(OptionsProblem::NoCommandTimeout);
        }
        for (field, value) in [
            ("command_timeout", self.command_timeout),
            ("connect_timeout", self.connect_timeout),
            ("breaker.open_for", self.breaker.open_for),
            ("max_wait", self.max_wait),
        ] {
            if value > MAX_SETTING {
                problems.push(OptionsProblem::OverADay { field, value });
            }
        }
        if self.max_in_flight == 0 {
            problems.push(OptionsProblem::NoInFlight);
        }
        if self.breaker.consecutive_failures == 0 {
            problems.push(OptionsProblem::NoBreakerFailures);
        }
        if !(self.breaker.failure_ratio > 0.0 && self.breaker.failure_ratio <= 1.0) {
            problems.push(OptionsProblem::FailureRatio(self.breaker.failure_ratio));
        }
        if self.coalesce.in_flight == 0 {
            problems.push(OptionsProblem::NoBatchesInFlight);
        }
        if !self.coalesce.window_fits(self.command_timeout) {
            problems.push(OptionsProblem::WindowOverHalf {
                window: self.coalesce.window,
                command_timeout: self.command_timeout,
            });
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(InvalidOptions { problems })
        }
    }
}

/// How decisions are coalesced on a single Redis server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoalesceOptions {
    /// Most decisions in one script call; 0 sends every decision as its own call (no
    /// coalescing).
    pub max_batch: usize,
    /// How long the first decision of a batch waits for others before the batch is sent.
    /// Zero sends at once whatever is queued. Tokio's timers tick in milliseconds, so a
    /// non-zero window is at least about 1 ms.
    pub window: Duration,
    /// Batches outstanding at once.
    pub in_flight: usize,
}

impl Default for CoalesceOptions {
    fn default() -> Self {
        // Measured on one Redis server, see docs/benchmarks.md.
        CoalesceOptions {
            max_batch: 64,
            window: Duration::ZERO,
            in_flight: 2,
        }
    }
}

impl CoalesceOptions {
    /// Whether decisions are coalesced at all.
    pub fn enabled(&self) -> bool {
        self.max_batch > 0
    }

    /// Whether the window leaves a decision waiting `deadline` time for its call: a window
    /// over half of it would spend the deadline waiting for company.
    pub fn window_fits(&self, deadline: Duration) -> bool {
        self.window.checked_mul(2).is_some_and(|w| w <= deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_that_would_never_decide_are_refused_by_name() {
        assert_eq!(RedisOptions::default().check(), Ok(()));
        let with = |change: &dyn Fn(&mut RedisOptions), field: &str| {
            let mut options = RedisOptions::default();
            change(&mut options);
            let why = options.check().unwrap_err().to_string();
            assert!(why.starts_with(field), "{field}: {why}");
        };
        with(&|o| o.command_timeout = Duration::ZERO, "command_timeout");
        with(&|o| o.max_in_flight = 0, "max_in_flight");
        with(
            &|o| o.breaker.consecutive_failures = 0,
            "breaker.consecutive_failures",
        );
        with(
            &|o| o.breaker.failure_ratio = f64::NAN,
            "breaker.failure_ratio",
        );
        with(&|o| o.coalesce.in_flight = 0, "coalesce.in_flight");
        with(
            &|o| o.coalesce.window = o.command_timeout / 2 + Duration::from_millis(1),
            "coalesce.window",
        );
        // Durations whose deadline arithmetic would overflow: refused, not a panic.
        with(&|o| o.coalesce.window = Duration::MAX, "coalesce.window");
        with(&|o| o.connect_timeout = Duration::MAX, "connect_timeout");
        with(
            &|o| {
                o.command_timeout = Duration::MAX;
                o.coalesce.window = Duration::ZERO;
            },
            "command_timeout",
        );
        with(&|o| o.breaker.open_for = Duration::MAX, "breaker.open_for");
        with(&|o| o.max_wait = Duration::MAX, "max_wait");
    }

    /// Each problem reads as the sentence it replaced, and several are `; `-separated.
    #[test]
    fn each_problem_reads_as_before() {
        let texts = [
            (
                OptionsProblem::OverADay {
                    field: "max_wait",
                    value: Duration::from_secs(90_000),
                },
                "max_wait (90000s) is more than a day: no deadline of the store's is that long",
            ),
            (
                OptionsProblem::FailureRatio(1.5),
                "breaker.failure_ratio 1.5 is not above 0 and at most 1",
            ),
            (
                OptionsProblem::NoBreakerFailures,
                "breaker.consecutive_failures is 0: the breaker would open without a failure",
            ),
            (
                OptionsProblem::NoBatchesInFlight,
                "coalesce.in_flight is 0: no batch could be sent",
            ),
            (
                OptionsProblem::WindowOverHalf {
                    window: Duration::from_millis(6),
                    command_timeout: Duration::from_millis(10),
                },
                "coalesce.window (6ms) is more than half of command_timeout (10ms): decisions would miss their deadline waiting for their batch",
            ),
        ];
        for (problem, text) in texts {
            assert_eq!(problem.to_string(), text);
        }
        let mut options = RedisOptions::default();
        options.coalesce.in_flight = 0;
        options.breaker.failure_ratio = 1.5;
        let refused = options.check().unwrap_err();
        assert_eq!(
            refused.problems,
            [
                OptionsProblem::FailureRatio(1.5),
                OptionsProblem::NoBatchesInFlight
            ]
        );
        assert_eq!(
            refused.to_string(),
            "breaker.failure_ratio 1.5 is not above 0 and at most 1; coalesce.in_flight is 0: no batch could be sent"
        );
    }
}
