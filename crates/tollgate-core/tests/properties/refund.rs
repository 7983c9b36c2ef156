//! Giving a charge back ([`tollgate_core::refund`]): exact right after the charge, never more
//! than the charge, and for the windows and the log exact however late.

use proptest::prelude::*;
use tollgate_core::{Algorithm, Decision, Params, State, Timestamp, Transition, decide, refund};

use crate::support::{Step, any_params, config, params, run, start, steps};

/// A history, a charge `advance` µs after it, and steps after the charge.
type Charged = (Params, u64, Vec<Step>, u64, u64, Vec<Step>);

/// A [`Charged`] scenario for params drawn from `params`.
fn charged_with(params: impl Strategy<Value = Params>) -> impl Strategy<Value = Charged> {
    params.prop_flat_map(|params| {
        let period = params.period_micros();
        let capacity = params.capacity();
        (
            Just(params),
            start(),
            steps(params, 0..30),
            prop_oneof![Just(0u64), 0..=period / 4, 0..=2 * period],
            prop_oneof![3 => 1..=capacity.min(3), 1 => 1..=capacity],
            steps(params, 0..20),
        )
    })
}

fn charged() -> impl Strategy<Value = Charged> {
    charged_with(any_params())
}

/// The windows and the log.
fn windowed() -> impl Strategy<Value = Charged> {
    let algorithms = vec![
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
    ];
    charged_with(proptest::sample::select(algorithms).prop_flat_map(params))
}

/// The decisions a state gives at `now` and a little later, for costs around `cost`: what
/// "decides alike" compares.
fn decisions(params: &Params, state: &State, now: u64, cost: u64) -> Vec<Decision> {
    let mut out = Vec::new();
    for at in instants(params, now) {
        for cost in [0, 1, cost, params.capacity()] {
            out.push(decide(params, state, at, cost).0);
        }
    }
    out
}

/// `now` and a few instants after it.
fn instants(params: &Params, now: u64) -> impl Iterator<Item = Timestamp> {
    let period = params.period_micros();
    [0, 1, period / 3, period, 2 * period]
        .into_iter()
        .map(move |later| Timestamp::from_micros(now + later))
}

/// The units a state has left at each of [`instants`] (what a check of cost 0 reads).
fn left(params: &Params, state: &State, now: u64) -> Vec<u64> {
    let at = instants(params, now);
    at.map(|at| decide(params, state, at, 0).0.remaining)
        .collect()
}

fn applied(state: &State, transition: Transition) -> State {
    let mut state = state.clone();
    state.apply(transition);
    state
}

proptest! {
    #![proptest_config(config(512))]

    /// Given back at once, a charge leaves the state deciding as it did before the charge,
    /// for every algorithm.
    #[test]
    fn given_back_at_once_a_charge_is_undone(
        (params, start, history, advance, cost, _) in charged()
    ) {
        let (before, last, _) = run(&params, start, &history);
        let now = last + advance;
        let at = Timestamp::from_micros(now);
        let (decision, transition) = decide(&params, &before, at, cost);
        prop_assume!(decision.is_allowed());
        let after = applied(&before, transition);
        let back = applied(&after, refund(&params, &after, at, cost));
        prop_assert_eq!(
            decisions(&params, &back, now, cost),
            decisions(&params, &before, now, cost)
        );
    }

    /// However late, a give-back never takes anything and never gives more than the charge:
    /// each later decision has at least the quota it had, and at most `cost` more.
    #[test]
    fn a_give_back_gives_at_most_the_charge(
        (params, start, history, advance, cost, later) in charged()
    ) {
        let (before, last, _) = run(&params, start, &history);
        let charged_at = last + advance;
        let at = Timestamp::from_micros(charged_at);
        let (decision, transition) = decide(&params, &before, at, cost);
        prop_assume!(decision.is_allowed());
        let (state, now, _) = continued(&params, applied(&before, transition), charged_at, &later);
        let back = applied(&state, refund(&params, &state, at, cost));
        let kept = left(&params, &state, now);
        for (given, kept) in left(&params, &back, now).into_iter().zip(kept) {
            prop_assert!(given >= kept, "took: {given} < {kept}");
            prop_assert!(given <= kept + cost, "gave more than {cost}: {given} > {kept}");
        }
    }

    /// The windows and the log place a give-back exactly however late: the state then decides
    /// as the same admitted requests without the charge would have left it.
    #[test]
    fn the_windows_and_the_log_give_back_exactly_however_late(
        (params, start, history, advance, cost, later) in windowed()
    ) {
        let (before, last, _) = run(&params, start, &history);
        let charged_at = last + advance;
        let at = Timestamp::from_micros(charged_at);
        let (decision, transition) = decide(&params, &before, at, cost);
        prop_assume!(decision.is_allowed());
        let (state, now, admitted) =
            continued(&params, applied(&before, transition), charged_at, &later);
        let back = applied(&state, refund(&params, &state, at, cost));
        // The same admitted requests on the state before the charge.
        let mut control = before;
        for (time, cost) in admitted {
            let (decision, transition) =
                decide(&params, &control, Timestamp::from_micros(time), cost);
            prop_assert!(decision.is_allowed(), "admitted with the charge, not without");
            control.apply(transition);
        }
        prop_assert_eq!(
            decisions(&params, &back, now, cost),
            decisions(&params, &control, now, cost)
        );
    }
}

/// Runs `steps` on `state` from `now`. Returns the state, the time, and the admitted requests
/// (time, cost) that charged something.
fn continued(
    params: &Params,
    mut state: State,
    mut now: u64,
    steps: &[Step],
) -> (State, u64, Vec<(u64, u64)>) {
    let mut admitted = Vec::new();
    for step in steps {
        now += step.advance;
        let (decision, transition) = decide(params, &state, Timestamp::from_micros(now), step.cost);
        if decision.is_allowed() && transition != Transition::Keep {
            admitted.push((now, step.cost));
        }
        state.apply(transition);
    }
    (state, now, admitted)
}

/// A bucket written under other params is left alone, and so is a state of another
/// algorithm: nothing to give back into.
#[test]
fn a_state_under_other_params_or_of_another_algorithm_is_left_alone() {
    let second = std::time::Duration::from_secs(1);
    let t = Timestamp::from_micros(1_000_000_000);
    for algorithm in Algorithm::ALL {
        let params = Params::new(algorithm, 10, second, None).unwrap();
        let (_, transition) = decide(&params, &State::empty(&params), t, 3);
        let state = applied(&State::empty(&params), transition);
        if algorithm.uses_burst() {
            let halved = Params::new(algorithm, 5, second, None).unwrap();
            assert_eq!(
                refund(&halved, &state, t, 1),
                Transition::Keep,
                "{algorithm}"
            );
            let slower = Params::new(algorithm, 10, 2 * second, None).unwrap();
            assert_eq!(
                refund(&slower, &state, t, 1),
                Transition::Keep,
                "{algorithm}"
            );
        }
        for other in Algorithm::ALL.into_iter().filter(|&a| a != algorithm) {
            let other = Params::new(other, 10, second, None).unwrap();
            assert_eq!(
                refund(&other, &state, t, 1),
                Transition::Keep,
                "{algorithm}"
            );
        }
        assert_ne!(
            refund(&params, &state, t, 1),
            Transition::Keep,
            "{algorithm}"
        );
    }
}
