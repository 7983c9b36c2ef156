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
//! An `empty_at` written under another limit is the same instant under this one, rounded up to
//! the next `1 / limit` µs (see [`State`]): the requests already admitted still leave by then.
//! When the new queue is shorter than the one it was written under, `empty_at` moves earlier by
//! the difference, as GCRA's arrival time does: the queue is never longer than the new params
//! allow.

use crate::scaled::{div_ceil, micros, saturate};
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
            scale: params.limit_scale(),
            tolerance: params.tolerance_micros(),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Algorithm, Params, State, Timestamp, Verdict, decide};

    /// Loosened from 1 per hour to 10 per minute, a queue that held an hour's unit holds at
    /// most the new queue: the next unit fits one new drain interval later, and waits out the
    /// rest of the (new) queue.
    #[test]
    fn a_shorter_queue_does_not_keep_the_old_backlog() {
        let hourly =
            Params::new(Algorithm::LeakyBucket, 1, Duration::from_secs(3_600), None).unwrap();
        let minute =
            Params::new(Algorithm::LeakyBucket, 10, Duration::from_secs(60), None).unwrap();
        let t = Timestamp::from_micros(1_700_000_000_000_000);
        let mut state = State::empty(&hourly);
        state.apply(decide(&hourly, &state, t, 1).1);

        let (denied, _) = decide(&minute, &state, t, 1);
        assert_eq!(denied.verdict, Verdict::Denied);
        assert_eq!(denied.retry_after, Some(Duration::from_secs(6)));
        let (allowed, _) = decide(&minute, &state, t.saturating_add(Duration::from_secs(6)), 1);
        assert_eq!(allowed.verdict, Verdict::Allowed);
        assert_eq!(allowed.delay, Duration::from_secs(54));
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

    /// After a reload from 1000/s to 10/s the queue still empties when it did.
    #[test]
    fn a_lower_limit_keeps_the_instant_the_queue_empties() {
        let fast =
            Params::new(Algorithm::LeakyBucket, 1_000, Duration::from_secs(1), None).unwrap();
        let slow = Params::new(Algorithm::LeakyBucket, 10, Duration::from_secs(1), None).unwrap();
        let t = Timestamp::from_micros(1_700_000_000_000_000);
        let mut state = State::empty(&fast);
        state.apply(decide(&fast, &state, t, 500).1);
        // Half a second queued: 5 units at the new rate, 4 free after this one.
        let (allowed, transition) = decide(&slow, &state, t, 1);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 4));
        assert_eq!(allowed.delay, Duration::from_millis(500));
        assert_eq!(
            state.expires_at(&slow),
            t.saturating_add(Duration::from_millis(500))
        );
        state.apply(transition);
        assert_eq!(
            state.expires_at(&slow),
            t.saturating_add(Duration::from_millis(600))
        );
        let (denied, _) = decide(&slow, &state, t, 5);
        assert_eq!(denied.retry_after, Some(Duration::from_millis(100)));
    }
}
