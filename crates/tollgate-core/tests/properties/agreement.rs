//! The implementation against the naive models, decision for decision.

use proptest::prelude::*;
use tollgate_core::{Algorithm, Decision, Params, State, Timestamp, Transition, decide};

use crate::models::{
    FixedWindowModel, LeakyQueueModel, Model, SlidingCounterModel, SlidingLogModel,
    TokenBucketModel,
};
use crate::support::{Step, config, same_bucket, scenario};

/// Runs the implementation and `model` side by side and requires identical decisions.
fn agree(params: &Params, start: u64, steps: &[Step], model: &mut dyn Model) {
    let mut state = State::empty(params);
    let mut now = start;
    for (i, step) in steps.iter().enumerate() {
        now += step.advance;
        let (decision, transition) = decide(params, &state, Timestamp::from_micros(now), step.cost);
        let expected: Decision = model.decide(now, step.cost);
        assert_eq!(
            decision, expected,
            "step {i} at {now} with cost {}",
            step.cost
        );
        let changed = transition != Transition::Keep;
        state.apply(transition);
        if let State::SlidingWindowLog { log } = &state {
            assert!(
                log.len() as u64 <= params.limit(),
                "log grew past the limit"
            );
            if changed {
                let period = params.period_micros();
                assert!(
                    log.iter().all(|(at, _)| at.as_micros() + period > now),
                    "an expired entry survived an append"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn fixed_window_matches_model(
        (params, start, steps) in scenario(Algorithm::FixedWindow, 1..60),
    ) {
        agree(&params, start, &steps, &mut FixedWindowModel::new(params));
    }

    #[test]
    fn sliding_window_log_matches_model(
        (params, start, steps) in scenario(Algorithm::SlidingWindowLog, 1..60),
    ) {
        agree(&params, start, &steps, &mut SlidingLogModel::new(params));
    }

    #[test]
    fn sliding_window_counter_matches_model(
        (params, start, steps) in scenario(Algorithm::SlidingWindowCounter, 1..60),
    ) {
        agree(&params, start, &steps, &mut SlidingCounterModel::new(params));
    }

    #[test]
    fn token_bucket_matches_model(
        (params, start, steps) in scenario(Algorithm::TokenBucket, 1..60),
    ) {
        agree(&params, start, &steps, &mut TokenBucketModel::new(params));
    }

    #[test]
    fn gcra_matches_token_bucket_model(
        (params, start, steps) in scenario(Algorithm::Gcra, 1..60),
    ) {
        agree(&params, start, &steps, &mut TokenBucketModel::new(params));
    }

    #[test]
    fn leaky_bucket_matches_queue_model(
        (params, start, steps) in scenario(Algorithm::LeakyBucket, 1..60),
    ) {
        agree(&params, start, &steps, &mut LeakyQueueModel::new(params));
    }

    /// The two meters are the same contract: identical decisions for any sequence.
    #[test]
    fn gcra_and_token_bucket_decide_identically(
        (params, start, steps) in scenario(Algorithm::Gcra, 1..80),
    ) {
        let bucket = same_bucket(&params, Algorithm::TokenBucket);
        let (mut gcra, mut tokens) = (State::empty(&params), State::empty(&bucket));
        let mut now = start;
        for step in &steps {
            now += step.advance;
            let at = Timestamp::from_micros(now);
            let (a, ta) = decide(&params, &gcra, at, step.cost);
            let (b, tb) = decide(&bucket, &tokens, at, step.cost);
            prop_assert_eq!(a, b);
            gcra.apply(ta);
            tokens.apply(tb);
        }
    }

    /// The shaper admits exactly like GCRA; it only adds a delay.
    #[test]
    fn leaky_bucket_admits_like_gcra(
        (params, start, steps) in scenario(Algorithm::LeakyBucket, 1..80),
    ) {
        let meter = same_bucket(&params, Algorithm::Gcra);
        let (mut queue, mut gcra) = (State::empty(&params), State::empty(&meter));
        let mut now = start;
        for step in &steps {
            now += step.advance;
            let at = Timestamp::from_micros(now);
            let (mut a, ta) = decide(&params, &queue, at, step.cost);
            let (b, tb) = decide(&meter, &gcra, at, step.cost);
            a.delay = b.delay;
            prop_assert_eq!(a, b);
            queue.apply(ta);
            gcra.apply(tb);
        }
    }
}
