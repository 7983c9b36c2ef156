//! Nothing panics or overflows, whatever the state, the clock or the cost: states may come
//! from an older policy (another limit, burst or algorithm) or from a store, and the clock may
//! be anywhere in `u64` microseconds.

use std::num::NonZeroU64;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{
    Algorithm, MAX_LIMIT, MAX_LOG_LIMIT, MAX_PERIOD, MIN_PERIOD, Params, SlidingLog, State,
    Timestamp, Transition, Verdict, decide,
};

use crate::support::config;

fn extreme_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1u64),
        Just(u64::MAX),
        0..=1_000u64,
        u64::MAX - 1_000_000..=u64::MAX,
        any::<u64>(),
    ]
}

fn extreme_u128() -> impl Strategy<Value = u128> {
    prop_oneof![
        Just(0u128),
        Just(u128::MAX),
        any::<u128>(),
        extreme_u64().prop_map(u128::from)
    ]
}

/// The scale of a bucket state: any limit or period, or anything else.
fn extreme_scale() -> impl Strategy<Value = NonZeroU64> {
    prop_oneof![
        1..=MAX_LIMIT,
        MIN_PERIOD.as_micros() as u64..=MAX_PERIOD.as_micros() as u64,
        extreme_u64(),
    ]
    .prop_map(|scale| NonZeroU64::new(scale).unwrap_or(NonZeroU64::MIN))
}

fn extreme_params() -> impl Strategy<Value = Params> {
    let algorithm = proptest::sample::select(Algorithm::ALL.to_vec());
    let period = prop_oneof![
        Just(MIN_PERIOD),
        Just(MAX_PERIOD),
        (1_000..=MAX_PERIOD.as_secs() * 1_000_000).prop_map(Duration::from_micros),
    ];
    (
        algorithm,
        prop_oneof![Just(1u64), Just(MAX_LIMIT), 1..=MAX_LIMIT],
        period,
        any::<bool>(),
    )
        .prop_map(|(algorithm, limit, period, burst)| {
            let limit = if algorithm == Algorithm::SlidingWindowLog {
                limit.min(MAX_LOG_LIMIT)
            } else {
                limit
            };
            let burst = (burst && algorithm.uses_burst()).then_some(MAX_LIMIT);
            Params::new(algorithm, limit, period, burst).unwrap()
        })
}

/// An arbitrary state of `algorithm`: any counts, times, scaled values and scales.
fn state_of(algorithm: Algorithm) -> BoxedStrategy<State> {
    match algorithm {
        Algorithm::FixedWindow => (extreme_u64(), extreme_u64())
            .prop_map(|(window, count)| State::FixedWindow { window, count })
            .boxed(),
        Algorithm::SlidingWindowLog => {
            let entry = (
                extreme_u64().prop_map(Timestamp::from_micros),
                extreme_u64(),
            );
            proptest::collection::vec(entry, 0..8)
                .prop_map(|entries| State::SlidingWindowLog {
                    log: SlidingLog::from_entries(entries),
                })
                .boxed()
        }
        Algorithm::SlidingWindowCounter => (extreme_u64(), extreme_u64(), extreme_u64())
            .prop_map(|(window, current, previous)| State::SlidingWindowCounter {
                window,
                current,
                previous,
            })
            .boxed(),
        Algorithm::TokenBucket => (
            extreme_u128(),
            extreme_u64(),
            extreme_scale(),
            extreme_scale(),
        )
            .prop_map(|(used_scaled, updated, limit, period)| State::TokenBucket {
                used_scaled,
                updated: Timestamp::from_micros(updated),
                limit,
                period,
            })
            .boxed(),
        Algorithm::Gcra => (
            extreme_u128(),
            extreme_u64(),
            extreme_scale(),
            extreme_scale(),
        )
            .prop_map(|(tat_scaled, updated, limit, period)| State::Gcra {
                tat_scaled,
                updated: Timestamp::from_micros(updated),
                limit,
                period,
            })
            .boxed(),
        Algorithm::LeakyBucket => (
            extreme_u128(),
            extreme_u64(),
            extreme_scale(),
            extreme_scale(),
        )
            .prop_map(
                |(empty_at_scaled, updated, limit, period)| State::LeakyBucket {
                    empty_at_scaled,
                    updated: Timestamp::from_micros(updated),
                    limit,
                    period,
                },
            )
            .boxed(),
    }
}

/// Parameters with a state of their own algorithm mostly, of any algorithm sometimes.
fn params_and_state() -> impl Strategy<Value = (Params, State)> {
    extreme_params().prop_flat_map(|params| {
        let foreign = proptest::sample::select(Algorithm::ALL.to_vec()).prop_flat_map(state_of);
        (
            Just(params),
            prop_oneof![3 => state_of(params.algorithm()), 1 => foreign],
        )
    })
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn never_panics(
        (params, state) in params_and_state(),
        now in extreme_u64(),
        cost in extreme_u64(),
    ) {
        let now = Timestamp::from_micros(now);
        let (decision, transition) = decide(&params, &state, now, cost);
        prop_assert_eq!(decision.limit, params.limit());
        prop_assert_eq!(decision.retry_after.is_some(), decision.verdict == Verdict::Denied);
        prop_assert_eq!(cost > params.capacity(), decision.verdict == Verdict::CostExceedsCapacity);
        if !decision.is_allowed() {
            prop_assert_eq!(&transition, &Transition::Keep);
        }
        let mut state = state;
        let _ = state.expires_at(&params);
        state.apply(transition);
        let _ = state.expires_at(&params);
        let _ = decide(&params, &state, now, cost);
    }
}
