//! Generic cell rate algorithm: one theoretical arrival time (TAT) per key.
//!
//! Time is scaled by `limit` (`now_scaled = now_micros * limit`); one unit of cost is emitted
//! every `period_micros` scaled units and the tolerance is `burst * period_micros`. A request of
//! cost `c` computes `new_tat = max(tat, now_scaled) + c * period_micros` and is admitted iff
//! `new_tat - now_scaled <= burst * period_micros`; the state is then `new_tat`. This is the token
//! bucket seen from the other side (tokens = `burst - (tat - now_scaled) / period_micros`), and
//! under fixed params the decisions are identical to [`crate::token_bucket`]'s: `remaining`
//! rounds down, `retry_after = ceil((new_tat - now_scaled - tolerance) / limit)` and
//! `reset_after = ceil((tat - now_scaled) / limit)` microseconds.
//!
//! A TAT written under another limit is the same instant under this one, rounded up to the next
//! `1 / limit` µs (see [`State`]): a reload keeps the time at which the key is fully recovered,
//! and a lower limit meets it with a longer emission interval. When the new tolerance is
//! smaller than the one the TAT was written under, the TAT moves earlier by the difference, so
//! that it is never further ahead than the new params can put it (1 per hour loosened to 10 per
//! minute: a key that used its hour waits 6 s, not the rest of the hour).

use crate::scaled::{div_ceil, micros, saturate};
use crate::{Decision, Params, State, Timestamp, Transition};

/// Decides one request; see the [module documentation](self).
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    let limit = params.limit();
    let l = u128::from(limit);
    let p = u128::from(params.period_micros());
    let tolerance = u128::from(params.burst()) * p;
    let tat = state.gcra_tat(params).unwrap_or(0);
    let now_scaled = u128::from(now.as_micros()) * l;
    // How far the TAT is ahead of now: the bucket's missing tokens, scaled.
    let ahead = tat.saturating_sub(now_scaled);
    let remaining = |ahead: u128| saturate(tolerance.saturating_sub(ahead) / p);
    let reset_after = |ahead: u128| micros(div_ceil(ahead, l));

    if cost > params.capacity() {
        let decision = Decision::cost_exceeds_capacity(limit, remaining(ahead), reset_after(ahead));
        return (decision, Transition::Keep);
    }
    let new_ahead = ahead.saturating_add(u128::from(cost) * p);
    if new_ahead <= tolerance {
        let decision = Decision::allowed(limit, remaining(new_ahead), reset_after(new_ahead));
        let state = State::Gcra {
            tat_scaled: now_scaled + new_ahead,
            scale: params.limit_scale(),
            tolerance: params.tolerance_micros(),
        };
        return (decision, Transition::Set(state));
    }
    let retry_after = micros(div_ceil(new_ahead - tolerance, l));
    let decision = Decision::denied(limit, remaining(ahead), reset_after(ahead), retry_after);
    (decision, Transition::Keep)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Algorithm, Params, State, Timestamp, Transition, Verdict, decide};

    #[test]
    fn spaces_requests_at_the_emission_interval() {
        let params = Params::new(Algorithm::Gcra, 2, Duration::from_secs(1), None).unwrap();
        let mut state = State::empty(&params);
        let t = Timestamp::from_micros(10_000_000);
        for remaining in [1, 0] {
            let (decision, transition) = decide(&params, &state, t, 1);
            assert_eq!(
                (decision.verdict, decision.remaining),
                (Verdict::Allowed, remaining)
            );
            state.apply(transition);
        }
        let (denied, _) = decide(&params, &state, t, 1);
        assert_eq!(denied.retry_after, Some(Duration::from_millis(500)));
        assert_eq!(denied.reset_after, Duration::from_secs(1));
        assert_eq!(
            state.expires_at(&params),
            Timestamp::from_micros(11_000_000)
        );
        let (early, _) = decide(&params, &state, Timestamp::from_micros(10_499_999), 1);
        assert_eq!(early.verdict, Verdict::Denied);
        let (on_time, _) = decide(&params, &state, Timestamp::from_micros(10_500_000), 1);
        assert_eq!(on_time.verdict, Verdict::Allowed);
    }

    /// After a reload from 1000/s to 10/s the TAT is the same instant: no absurd wait.
    #[test]
    fn a_lower_limit_keeps_the_arrival_time() {
        let fast = Params::new(Algorithm::Gcra, 1_000, Duration::from_secs(1), None).unwrap();
        let slow = Params::new(Algorithm::Gcra, 10, Duration::from_secs(1), None).unwrap();
        let t = Timestamp::from_micros(1_700_000_000_000_000);
        let (mut one, mut all) = (State::empty(&fast), State::empty(&fast));
        one.apply(decide(&fast, &one, t, 1).1);
        all.apply(decide(&fast, &all, t, 1_000).1);

        // 1ms of a 1s tolerance used: 9 more now, the key fully recovered 1ms + 100ms later.
        let (allowed, transition) = decide(&slow, &one, t, 1);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 8));
        assert_eq!(allowed.reset_after, Duration::from_millis(101));
        assert_eq!(one.expires_at(&slow), one.expires_at(&fast));
        one.apply(transition);
        assert_eq!(
            one.expires_at(&slow),
            t.saturating_add(Duration::from_millis(101))
        );

        // The whole second used: one emission interval of the new limit.
        let (denied, _) = decide(&slow, &all, t, 1);
        assert_eq!(denied.retry_after, Some(Duration::from_millis(100)));
        assert_eq!(denied.reset_after, Duration::from_secs(1));
    }

    /// Loosened from 1 per hour to 10 per minute (or an hourly override lifted), a key that
    /// used its hour waits one new emission interval, as a token bucket would, not the rest
    /// of the hour: its arrival time moves earlier by the tolerance it no longer has.
    #[test]
    fn a_looser_limit_with_a_smaller_tolerance_does_not_keep_the_old_wait() {
        let hourly = Params::new(Algorithm::Gcra, 1, Duration::from_secs(3_600), None).unwrap();
        let minute = Params::new(Algorithm::Gcra, 10, Duration::from_secs(60), None).unwrap();
        let t = Timestamp::from_micros(1_700_000_000_000_000);
        let mut state = State::empty(&hourly);
        state.apply(decide(&hourly, &state, t, 1).1);
        let (before, _) = decide(&hourly, &state, t, 1);
        assert_eq!(before.retry_after, Some(Duration::from_secs(3_600)));

        let (denied, _) = decide(&minute, &state, t, 1);
        assert_eq!(denied.verdict, Verdict::Denied);
        assert_eq!(denied.retry_after, Some(Duration::from_secs(6)));
        assert_eq!(denied.reset_after, Duration::from_secs(60));
        // A denial writes nothing, and the next decision reads the same instant: time runs.
        let later = t.saturating_add(Duration::from_secs(6));
        let (allowed, _) = decide(&minute, &state, later, 1);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 0));
        let (early, _) = decide(
            &minute,
            &state,
            Timestamp::from_micros(later.as_micros() - 1),
            1,
        );
        assert_eq!(early.verdict, Verdict::Denied);

        // Back to hourly: the state written under the minute's tolerance keeps its instant.
        let mut state = State::empty(&minute);
        state.apply(decide(&minute, &state, t, 10).1);
        let (denied, _) = decide(&hourly, &state, t, 1);
        assert_eq!(denied.retry_after, Some(Duration::from_secs(60)));
    }

    /// An instant that is not a whole number of `1 / limit` µs under the new limit is rounded
    /// up to the next one: never earlier than it was.
    #[test]
    fn a_rescaled_arrival_time_rounds_up() {
        let three = Params::new(Algorithm::Gcra, 3, Duration::from_secs(1), None).unwrap();
        let seven = Params::new(Algorithm::Gcra, 7, Duration::from_secs(1), None).unwrap();
        let mut state = State::empty(&three);
        state.apply(decide(&three, &state, Timestamp::from_micros(1_000), 1).1);
        // 1000µs + 333_333.33µs, that is 1000µs + 2_333_333.33 units of 1/7µs.
        let (decision, transition) = decide(&seven, &state, Timestamp::from_micros(1_000), 0);
        assert_eq!(
            transition,
            Transition::Set(State::Gcra {
                tat_scaled: 7_000 + 2_333_334,
                scale: seven.limit_scale(),
                tolerance: seven.tolerance_micros(),
            })
        );
        assert_eq!(decision.reset_after, Duration::from_micros(333_334));
    }
}
