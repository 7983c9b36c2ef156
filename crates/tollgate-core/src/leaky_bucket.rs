//! Leaky bucket as a shaper: a queue of `burst` units draining at `limit` units per period.
//!
//! Time is scaled by `limit` as in [`crate::gcra`]: one unit drains in `period_micros` scaled
//! units. The state is `empty_at`, when the queue runs dry, and
//! `backlog = max(0, empty_at - now_scaled)`. Cost `c` is admitted iff
//! `backlog + c * period_micros <= burst * period_micros` (GCRA's test); then
//! `empty_at = max(empty_at, now_scaled) + c * period_micros` and the request is held for
//! `delay = ceil(backlog / limit)` microseconds, until the queue ahead of it has drained, so that
//! admission plus delay follows the constant rate and is never early. `remaining` is the whole
//! units of free queue space, `floor((burst * period_micros - backlog) / period_micros)`;
//! `reset_after` (queue empty) and `retry_after` (`c` fits) are rounded up to whole microseconds.
//!
//! Under other params than `empty_at` was written with (a reload), the queue keeps the units
//! it held when written, as GCRA keeps its units used (see [`State`]): as many units of the new
//! params, capped at the new queue (`burst`), leaving at the new rate since.

use crate::scaled::{div_ceil, micros, rewound, saturate};
use crate::{Decision, Params, State, Timestamp, Transition};

/// Decides one request; see the [module documentation](self).
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    let limit = params.limit();
    let l = u128::from(limit);
    let p = u128::from(params.period_micros());
    let queue = u128::from(params.burst()) * p;
    let empty_at = state.leaky_bucket_empty_at(params).unwrap_or(0);
    let now_scaled = u128::from(now.as_micros()) * l;
    let backlog = empty_at.saturating_sub(now_scaled);
    let free_units = |backlog: u128| saturate(queue.saturating_sub(backlog) / p);
    let drained_after = |backlog: u128| micros(div_ceil(backlog, l));

    if cost > params.capacity() {
        let decision =
            Decision::cost_exceeds_capacity(limit, free_units(backlog), drained_after(backlog));
        return (decision, Transition::Keep);
    }
    let new_backlog = backlog.saturating_add(u128::from(cost) * p);
    if new_backlog <= queue {
        let mut decision =
            Decision::allowed(limit, free_units(new_backlog), drained_after(new_backlog));
        decision.delay = drained_after(backlog);
        let state = State::LeakyBucket {
            empty_at_scaled: now_scaled + new_backlog,
            updated: now,
            limit: params.limit_scale(),
            period: params.period_scale(),
        };
        return (decision, Transition::Set(state));
    }
    let retry_after = micros(div_ceil(new_backlog - queue, l));
    let decision = Decision::denied(
        limit,
        free_units(backlog),
        drained_after(backlog),
        retry_after,
    );
    (decision, Transition::Keep)
}

/// Gives back `cost` charged at `at` (see [`crate::refund`]): the instant the queue is empty
/// moves back by what the charge added, `cost * period_micros` scaled units (`cost` at most
/// the burst), never before `at`; a queue written under another limit or period is left alone.
pub fn refund(params: &Params, state: &State, at: Timestamp, cost: u64) -> Transition {
    match *state {
        State::LeakyBucket {
            empty_at_scaled,
            updated,
            limit,
            period,
        } if limit == params.limit_scale() && period == params.period_scale() => {
            match rewound(params, empty_at_scaled, at, cost) {
                Some(empty_at_scaled) => Transition::Set(State::LeakyBucket {
                    empty_at_scaled,
                    updated,
                    limit,
                    period,
                }),
                None => Transition::Keep,
            }
        }
        _ => Transition::Keep,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Algorithm, Params, State, Timestamp, Verdict, decide};

    /// Loosened from 1 per hour to 10 per minute, a queue that held an hour's unit holds one
    /// unit of the new params: 9 fit, the first of them after the one queued ahead (6 s).
    #[test]
    fn a_new_period_keeps_the_units_queued() {
        let hourly =
            Params::new(Algorithm::LeakyBucket, 1, Duration::from_secs(3_600), None).unwrap();
        let minute =
            Params::new(Algorithm::LeakyBucket, 10, Duration::from_secs(60), None).unwrap();
        let t = Timestamp::from_micros(1_700_000_000_000_000);
        let mut state = State::empty(&hourly);
        state.apply(decide(&hourly, &state, t, 1).1);

        let (allowed, _) = decide(&minute, &state, t, 9);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 0));
        assert_eq!(allowed.delay, Duration::from_secs(6));
        assert_eq!(decide(&minute, &state, t, 10).0.verdict, Verdict::Denied);
    }

    #[test]
    fn queues_requests_and_delays_them_to_the_rate() {
        let params =
            Params::new(Algorithm::LeakyBucket, 2, Duration::from_secs(1), Some(3)).unwrap();
        let mut state = State::empty(&params);
        let t = Timestamp::from_micros(10_000_000);
        for (delay_ms, remaining) in [(0, 2), (500, 1), (1_000, 0)] {
            let (decision, transition) = decide(&params, &state, t, 1);
            assert_eq!(
                (decision.verdict, decision.remaining),
                (Verdict::Allowed, remaining)
            );
            assert_eq!(decision.delay, Duration::from_millis(delay_ms));
            state.apply(transition);
        }
        let (denied, _) = decide(&params, &state, t, 1);
        assert_eq!(denied.retry_after, Some(Duration::from_millis(500)));
        assert_eq!(denied.reset_after, Duration::from_millis(1_500));
        assert_eq!(denied.delay, Duration::ZERO);
        // 200ms later 2.6 units are queued: 0.4 free, and 1 fits once 0.6 more has drained.
        let later = t.saturating_add(Duration::from_millis(200));
        let (denied, _) = decide(&params, &state, later, 1);
        assert_eq!(
            (denied.remaining, denied.retry_after),
            (0, Some(Duration::from_millis(300)))
        );
        let (allowed, _) = decide(
            &params,
            &state,
            t.saturating_add(Duration::from_millis(500)),
            1,
        );
        assert_eq!(
            (allowed.remaining, allowed.delay),
            (0, Duration::from_secs(1))
        );
    }

    /// A reload keeps the units queued: 10/s tightened to 5/s (burst 5) leaves a queue of 4
    /// room for one more (held until the 4 have left at the new rate, 800ms), a full queue of
    /// 10 no room at all; loosened to 20/s, the first has room for 16.
    #[test]
    fn a_changed_limit_keeps_the_units_queued() {
        let second = Duration::from_secs(1);
        let ten = Params::new(Algorithm::LeakyBucket, 10, second, None).unwrap();
        let five = Params::new(Algorithm::LeakyBucket, 5, second, None).unwrap();
        let twenty = Params::new(Algorithm::LeakyBucket, 20, second, None).unwrap();
        let t = Timestamp::from_micros(1_700_000_000_000_000);
        let (mut partly, mut fully) = (State::empty(&ten), State::empty(&ten));
        partly.apply(decide(&ten, &partly, t, 4).1);
        fully.apply(decide(&ten, &fully, t, 10).1);

        let (allowed, _) = decide(&five, &partly, t, 1);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 0));
        assert_eq!(allowed.delay, Duration::from_millis(800));
        assert_eq!(decide(&five, &partly, t, 2).0.verdict, Verdict::Denied);
        let (denied, _) = decide(&five, &fully, t, 1);
        assert_eq!((denied.verdict, denied.remaining), (Verdict::Denied, 0));
        assert_eq!(denied.retry_after, Some(Duration::from_millis(200)));
        let (allowed, _) = decide(&twenty, &partly, t, 1);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 15));
        assert_eq!(allowed.delay, Duration::from_millis(200));
    }
}
