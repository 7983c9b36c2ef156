//! What every algorithm promises, checked on random histories.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{
    Algorithm, Params, State, Timestamp, Transition, Verdict, check, decide, decide_or_check,
};

use crate::support::{any_params, any_scenario, config, run, us};

/// A history, then one more request `advance` µs later with `cost`.
fn probe() -> impl Strategy<Value = (Params, u64, Vec<crate::support::Step>, u64, u64)> {
    any_scenario(0..40).prop_flat_map(|(params, start, history)| {
        let capacity = params.capacity();
        let period = params.period_micros();
        (
            Just(params),
            Just(start),
            Just(history),
            prop_oneof![Just(0u64), 0..=period / 4, 0..=2 * period],
            prop_oneof![4 => 1..=capacity.min(3), 2 => 0..=capacity, 1 => capacity..=capacity + 5],
        )
    })
}

proptest! {
    #![proptest_config(config(256))]

    /// A clock that reads up to one period behind the state's last write (a failover to a
    /// server whose clock lags) never admits a request the later reading would deny: no
    /// window is reopened and no bucket refilled by going back. The sliding log counts the
    /// entries of its trailing period as it is, so it is left out.
    #[test]
    fn an_earlier_reading_is_never_more_permissive(
        (params, start, history, back, cost) in probe()
    ) {
        prop_assume!(params.algorithm() != Algorithm::SlidingWindowLog);
        let (state, last, _) = run(&params, start, &history);
        let back = back.min(params.period_micros() - 1).min(last);
        let at = |t: u64| decide(&params, &state, Timestamp::from_micros(t), cost).0;
        if at(last - back).is_allowed() {
            prop_assert!(at(last).is_allowed(), "admitted {back} µs earlier, denied at {last}");
        }
    }

    /// A check answers as a request of cost 1 would, with the quota as it is: one unit more
    /// remaining than after that request, the same reset as a request that costs nothing, no
    /// delay.
    #[test]
    fn a_check_is_a_request_of_one_that_charges_nothing(
        (params, start, history, advance, _) in probe()
    ) {
        let (state, last, _) = run(&params, start, &history);
        let now = last + advance;
        let at = Timestamp::from_micros(now);
        let checked = check(&params, &state, at);
        prop_assert_eq!(decide_or_check(&params, &state, at, 0), (checked, Transition::Keep));
        let (one, _) = decide(&params, &state, at, 1);
        prop_assert_eq!(checked.verdict, one.verdict);
        if one.is_allowed() {
            prop_assert_eq!(checked.remaining, one.remaining + 1);
            // Until the state as it is behaves like an empty one.
            let expires = state.expires_at(&params).as_micros();
            prop_assert_eq!(now + us(checked.reset_after), expires.max(now));
            prop_assert_eq!(checked.delay, Duration::ZERO);
        } else {
            prop_assert_eq!(checked, one);
        }
    }

    /// Charging up to the limit: a request that fits whole is decided as always; one that
    /// does not is admitted while a unit is left, charged exactly what is left (nothing
    /// remains after it), and with nothing left it is denied as a request of 1 would be.
    #[test]
    fn charging_up_to_the_limit_charges_what_is_left(
        (params, start, history, advance, cost) in probe()
    ) {
        let (state, last, _) = run(&params, start, &history);
        let now = Timestamp::from_micros(last + advance);
        let up_to = params.charging_up_to_limit(true);
        let (up, transition) = decide(&up_to, &state, now, cost);
        let whole = decide(&params, &state, now, cost);
        let (one, _) = decide(&params, &state, now, 1);
        if whole.0.is_allowed() || cost == 0 {
            prop_assert_eq!((up, transition), whole);
        } else if !one.is_allowed() {
            prop_assert_eq!(up, one);
            prop_assert_eq!(transition, Transition::Keep);
        } else {
            prop_assert!(up.is_allowed(), "a unit is left");
            prop_assert_eq!(up.remaining, 0);
            let mut after = state.clone();
            after.apply(transition);
            let (what_was_left, its_charge) = decide(&params, &state, now, whole.0.remaining);
            prop_assert!(what_was_left.is_allowed());
            let mut expected = state.clone();
            expected.apply(its_charge);
            prop_assert_eq!(after, expected);
        }
    }

    /// Denied means: admitted at `now + retry_after`, still denied 1µs before, state untouched.
    #[test]
    fn retry_after_is_exact((params, start, history, advance, cost) in probe()) {
        let (state, last, _) = run(&params, start, &history);
        let now = last + advance;
        let (decision, transition) = decide(&params, &state, Timestamp::from_micros(now), cost);
        match decision.verdict {
            Verdict::Allowed => {
                prop_assert_eq!(decision.retry_after, None);
                prop_assert!(cost <= params.capacity());
            }
            Verdict::CostExceedsCapacity => {
                prop_assert!(cost > params.capacity());
                prop_assert_eq!(decision.retry_after, None);
                prop_assert_eq!(transition, Transition::Keep);
            }
            Verdict::Denied => {
                prop_assert!(cost <= params.capacity());
                prop_assert_eq!(transition, Transition::Keep);
                prop_assert_eq!(decision.delay, Duration::ZERO);
                let retry = us(decision.retry_after.expect("a denial says when to retry"));
                prop_assert!(retry >= 1);
                let at =
                    |t: u64| decide(&params, &state, Timestamp::from_micros(t), cost).0.verdict;
                prop_assert_eq!(at(now + retry), Verdict::Allowed, "at now + retry_after");
                prop_assert_eq!(at(now + retry - 1), Verdict::Denied, "1µs before retry_after");
            }
        }
        prop_assert_eq!(cost > params.capacity(), decision.verdict == Verdict::CostExceedsCapacity);
        prop_assert_eq!(decision.limit, params.limit());
        prop_assert!(decision.remaining <= params.capacity());
        if params.algorithm() != Algorithm::LeakyBucket {
            prop_assert_eq!(decision.delay, Duration::ZERO);
        }
    }

    /// `reset_after` is when the state after this decision expires, and from `expires_at` on the
    /// state decides exactly like an empty one (but not 1µs earlier).
    #[test]
    fn reset_after_and_expires_at_agree((params, start, history, advance, cost) in probe()) {
        let (mut state, last, _) = run(&params, start, &history);
        let now = last + advance;
        let (decision, transition) = decide(&params, &state, Timestamp::from_micros(now), cost);
        state.apply(transition);
        let expires = state.expires_at(&params).as_micros();
        prop_assert_eq!(now + us(decision.reset_after), expires.max(now));

        let empty = State::empty(&params);
        let from = expires.max(now);
        for t in [from, from + 1, from + params.period_micros()] {
            for c in [0, 1, cost] {
                let at = Timestamp::from_micros(t);
                prop_assert_eq!(decide(&params, &state, at, c), decide(&params, &empty, at, c));
            }
        }
        if expires > now {
            let before = Timestamp::from_micros(expires - 1);
            prop_assert!(decide(&params, &state, before, 0).0.reset_after > Duration::ZERO);
        }
    }

    /// A state left by another algorithm decides like an empty one and has already expired.
    #[test]
    fn foreign_state_is_empty(
        (previous, start, history) in any_scenario(0..30),
        params in any_params(),
        advance in 0..10_000u64,
        cost in 0..5u64,
    ) {
        prop_assume!(previous.algorithm() != params.algorithm());
        let (foreign, last, _) = run(&previous, start, &history);
        let at = Timestamp::from_micros(last + advance);
        let empty = State::empty(&params);
        prop_assert_eq!(foreign.expires_at(&params), Timestamp::EPOCH);
        let (decision, transition) = decide(&params, &foreign, at, cost);
        prop_assert_eq!(&(decision, transition.clone()), &decide(&params, &empty, at, cost));
        let (mut from_foreign, mut from_empty) = (foreign, empty);
        from_foreign.apply(transition.clone());
        from_empty.apply(transition);
        prop_assert_eq!(from_foreign.expires_at(&params), from_empty.expires_at(&params));
    }

    /// Denied requests consume nothing: dropping them from the history (keeping the clock as
    /// it was) leaves every other decision unchanged.
    #[test]
    fn denials_consume_nothing((params, start, history) in any_scenario(1..50)) {
        let (_, _, log) = run(&params, start, &history);
        let mut now = start;
        let mut state = State::empty(&params);
        for (step, &(time, _, expected)) in history.iter().zip(&log) {
            now += step.advance;
            prop_assert_eq!(now, time);
            if expected.is_allowed() {
                let (decision, transition) =
                    decide(&params, &state, Timestamp::from_micros(now), step.cost);
                prop_assert_eq!(decision, expected);
                state.apply(transition);
            }
        }
    }
}
