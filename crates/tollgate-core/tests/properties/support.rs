//! Strategies and drivers shared by the property tests.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use tollgate_core::{
    Algorithm, Decision, MAX_LIMIT, MAX_LOG_LIMIT, Params, State, Timestamp, decide,
};

/// Proptest configuration: `cases` cases, regressions saved next to the test source.
pub fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

/// One step of a scenario: advance the clock by `advance` µs, then send a request of `cost`.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub advance: u64,
    pub cost: u64,
}

/// Limits: mostly small (where windows fill up), sometimes huge (arithmetic range).
pub fn limit(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 1..=10u64.min(max),
        2 => 1..=1_000u64.min(max),
        1 => 1..=max,
        1 => Just(max),
    ]
}

/// Periods short enough for linear searches in the models; never a round number only.
pub fn period() -> impl Strategy<Value = Duration> {
    prop_oneof![
        3 => (1_000..=4_000u64).prop_map(Duration::from_micros),
        1 => Just(Duration::from_millis(1)),
        1 => Just(Duration::from_millis(3)),
    ]
}

/// Parameters of `algorithm` (bucket algorithms get a burst half the time).
pub fn params(algorithm: Algorithm) -> impl Strategy<Value = Params> {
    let max = if algorithm == Algorithm::SlidingWindowLog {
        MAX_LOG_LIMIT
    } else {
        MAX_LIMIT
    };
    let burst = if algorithm.uses_burst() {
        prop_oneof![Just(None), limit(MAX_LIMIT).prop_map(Some)].boxed()
    } else {
        Just(None).boxed()
    };
    (limit(max), period(), burst).prop_map(move |(limit, period, burst)| {
        Params::new(algorithm, limit, period, burst).unwrap()
    })
}

/// The parameters of a bucket algorithm with the same limit, period and burst as `params`.
pub fn same_bucket(params: &Params, algorithm: Algorithm) -> Params {
    Params::new(
        algorithm,
        params.limit(),
        params.period(),
        Some(params.burst()),
    )
    .unwrap()
}

/// Any algorithm's parameters.
pub fn any_params() -> impl Strategy<Value = Params> {
    proptest::sample::select(Algorithm::ALL.to_vec()).prop_flat_map(params)
}

/// A start time: near the epoch, or anywhere up to today's wall clock.
pub fn start() -> impl Strategy<Value = u64> {
    prop_oneof![0..=10_000u64, 0..=2_000_000_000_000_000u64]
}

/// Steps with costs mostly within capacity, sometimes zero or above it, and advances mostly
/// short (requests pile up), sometimes long (state ages out).
pub fn steps(params: Params, len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    let period = params.period_micros();
    let capacity = params.capacity();
    let small = capacity.min(3);
    let cost = prop_oneof![
        8 => 1..=small,
        2 => 1..=capacity,
        1 => Just(0u64),
        1 => capacity..=capacity.saturating_add(2),
    ];
    let advance = prop_oneof![
        3 => Just(0u64),
        6 => 0..=period / 8,
        3 => 0..=period,
        1 => 0..=3 * period,
    ];
    proptest::collection::vec(
        (advance, cost).prop_map(|(advance, cost)| Step { advance, cost }),
        len,
    )
}

/// Parameters of `algorithm` with a start time and steps for them.
pub fn scenario(
    algorithm: Algorithm,
    len: std::ops::Range<usize>,
) -> impl Strategy<Value = (Params, u64, Vec<Step>)> {
    params(algorithm).prop_flat_map(move |p| (Just(p), start(), steps(p, len.clone())))
}

/// Any algorithm's scenario.
pub fn any_scenario(
    len: std::ops::Range<usize>,
) -> impl Strategy<Value = (Params, u64, Vec<Step>)> {
    any_params().prop_flat_map(move |p| (Just(p), start(), steps(p, len.clone())))
}

/// Runs `steps` from `start` through the implementation, committing every transition.
/// Returns the final state, the final time and `(time, cost, decision)` for every step.
pub fn run(params: &Params, start: u64, steps: &[Step]) -> (State, u64, Vec<(u64, u64, Decision)>) {
    let mut state = State::empty(params);
    let mut now = start;
    let mut log = Vec::with_capacity(steps.len());
    for step in steps {
        now += step.advance;
        let (decision, transition) = decide(params, &state, Timestamp::from_micros(now), step.cost);
        state.apply(transition);
        log.push((now, step.cost, decision));
    }
    (state, now, log)
}

/// Microseconds of a duration that the tests know to be small.
pub fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap()
}
