//! The guarantees each algorithm is known for, checked on the admitted traffic.

use proptest::prelude::*;
use tollgate_core::{Algorithm, Params, Timestamp, Verdict, decide};

use crate::support::{config, run, same_bucket, scenario, us};

/// `(time, cost)` of every admitted request.
fn admitted(params: &Params, start: u64, steps: &[crate::support::Step]) -> Vec<(u64, u64)> {
    let (_, _, log) = run(params, start, steps);
    log.into_iter()
        .filter(|(_, _, d)| d.is_allowed())
        .map(|(t, c, _)| (t, c))
        .collect()
}

/// Cost admitted at times in `from..to`.
fn admitted_in(events: &[(u64, u64)], from: u64, to: u64) -> u64 {
    events
        .iter()
        .filter(|&&(t, _)| from <= t && t < to)
        .map(|&(_, c)| c)
        .sum()
}

proptest! {
    #![proptest_config(config(128))]

    /// At most `limit` per aligned window, at most `2 * limit` in any span of one period.
    #[test]
    fn fixed_window_admits_at_most_twice_the_limit_per_period(
        (params, start, steps) in scenario(Algorithm::FixedWindow, 1..80),
    ) {
        let events = admitted(&params, start, &steps);
        let (limit, period) = (params.limit(), params.period_micros());
        for &(t, _) in &events {
            let window_start = t / period * period;
            prop_assert!(admitted_in(&events, window_start, window_start + period) <= limit);
            prop_assert!(admitted_in(&events, t, t + period) <= 2 * limit);
        }
    }

    /// At most `limit` in any trailing period `(t - period, t]`.
    #[test]
    fn sliding_window_log_admits_at_most_the_limit_per_trailing_period(
        (params, start, steps) in scenario(Algorithm::SlidingWindowLog, 1..80),
    ) {
        let events = admitted(&params, start, &steps);
        let (limit, period) = (params.limit(), params.period_micros());
        for &(t, _) in &events {
            prop_assert!(admitted_in(&events, (t + 1).saturating_sub(period), t + 1) <= limit);
        }
    }

    /// The estimate is never below the current count: at most `limit` per aligned window.
    #[test]
    fn sliding_window_counter_admits_at_most_the_limit_per_window(
        (params, start, steps) in scenario(Algorithm::SlidingWindowCounter, 1..80),
    ) {
        let events = admitted(&params, start, &steps);
        let (limit, period) = (params.limit(), params.period_micros());
        for &(t, _) in &events {
            let window_start = t / period * period;
            prop_assert!(admitted_in(&events, window_start, window_start + period) <= limit);
        }
    }

    /// Over any closed interval `[a, b]`, at most `burst + limit * (b - a) / period`.
    #[test]
    fn buckets_admit_at_most_burst_plus_rate(
        algorithm in proptest::sample::select(
            vec![Algorithm::TokenBucket, Algorithm::Gcra, Algorithm::LeakyBucket],
        ),
        (gcra, start, steps) in scenario(Algorithm::Gcra, 1..80),
    ) {
        let params = same_bucket(&gcra, algorithm);
        let events = admitted(&params, start, &steps);
        let p = u128::from(params.period_micros());
        for (i, &(a, _)) in events.iter().enumerate() {
            let mut total = 0u128;
            for &(b, cost) in &events[i..] {
                total += u128::from(cost);
                let allowance =
                    u128::from(params.burst()) * p + u128::from(params.limit()) * u128::from(b - a);
                prop_assert!(total * p <= allowance, "{} admitted in [{a}, {b}]", total);
            }
        }
    }

    /// GCRA admits exactly at the retry time it promises, and not 1µs earlier, however long the
    /// client keeps retrying.
    #[test]
    fn gcra_admits_exactly_at_promised_retry(
        (params, start, steps) in scenario(Algorithm::Gcra, 1..30),
        rounds in 1..20usize,
    ) {
        let (mut state, mut now, _) = run(&params, start, &steps);
        let cost = params.burst().min(steps.first().map_or(1, |s| s.cost.max(1)));
        for _ in 0..rounds {
            let (decision, transition) = decide(&params, &state, Timestamp::from_micros(now), cost);
            match decision.retry_after {
                None => {
                    prop_assert_eq!(decision.verdict, Verdict::Allowed);
                    state.apply(transition);
                }
                Some(retry) => {
                    let retry = us(retry);
                    let early = Timestamp::from_micros(now + retry - 1);
                    let (too_early, _) = decide(&params, &state, early, cost);
                    prop_assert_eq!(too_early.verdict, Verdict::Denied);
                    now += retry;
                    let (on_time, transition) =
                        decide(&params, &state, Timestamp::from_micros(now), cost);
                    prop_assert_eq!(on_time.verdict, Verdict::Allowed);
                    state.apply(transition);
                }
            }
        }
    }

    /// The shaper's output (admission time plus delay) never runs ahead of the constant rate:
    /// between two outputs, no more than the rate allows has left, up to the 1µs rounding.
    /// And nothing waits while the queue ahead of it is empty.
    #[test]
    fn leaky_bucket_output_keeps_the_rate(
        (params, start, steps) in scenario(Algorithm::LeakyBucket, 1..80),
    ) {
        let (_, _, log) = run(&params, start, &steps);
        let out: Vec<(u64, u64)> = log
            .iter()
            .filter(|(_, _, d)| d.is_allowed())
            .map(|&(t, c, d)| (t + us(d.delay), c))
            .collect();
        let (l, p) = (u128::from(params.limit()), u128::from(params.period_micros()));
        for i in 0..out.len() {
            let mut drained = 0u128;
            for j in i + 1..out.len() {
                drained += u128::from(out[j - 1].1) * p;
                prop_assert!(out[j].0 >= out[j - 1].0, "outputs leave in order");
                prop_assert!(
                    u128::from(out[j].0 - out[i].0) * l + l > drained,
                    "outputs {i} and {j} closer than the rate allows"
                );
            }
        }
        // The first admitted request of the run finds an empty queue.
        if let Some((_, _, first)) = log.iter().find(|(_, _, d)| d.is_allowed()) {
            prop_assert_eq!(us(first.delay), 0);
        }
    }
}
