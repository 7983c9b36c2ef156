//! A policy reload changes the params of a live key (its counter key depends only on the rule's
//! path): the state written under the old params is decided under the new ones. Every algorithm
//! keeps the units used: the windows and the log their counts, the buckets their units used,
//! capped at the new burst. Whatever the change, the key gets no absurd wait, a higher limit denies
//! nothing the old one allowed, a lower one admits no more than its burst and rate, and the
//! contract (exact `retry_after`, `reset_after` = expiry) holds from the first decision on.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{Algorithm, MAX_LIMIT, MAX_LOG_LIMIT, Params, State, Timestamp, decide};

use crate::support::{Step, config, params, run, start, steps, us};

const BUCKETS: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
];

const WINDOWS: [Algorithm; 3] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
];

fn bucket() -> impl Strategy<Value = Algorithm> {
    proptest::sample::select(BUCKETS.to_vec())
}

/// `params` with another limit and burst (`None`: the burst follows the limit).
fn with_limit(params: &Params, limit: u64, burst: Option<u64>) -> Params {
    Params::new(params.algorithm(), limit, params.period(), burst).unwrap()
}

/// Whether `a` refills or drains at most as fast as `b` (`limit / period`).
fn slower_or_equal(a: &Params, b: &Params) -> bool {
    u128::from(a.limit()) * u128::from(b.period_micros())
        <= u128::from(b.limit()) * u128::from(a.period_micros())
}

/// Old and new params of a bucket algorithm, the new rate no higher than the old one: 1000/s
/// to 10/s, or any two of the test params (bursts and periods may change too).
fn lowered(algorithm: Algorithm) -> impl Strategy<Value = (Params, Params)> {
    let per_second = |limit| Params::new(algorithm, limit, Duration::from_secs(1), None).unwrap();
    prop_oneof![
        Just((per_second(1_000), per_second(10))),
        (params(algorithm), params(algorithm)).prop_map(|(a, b)| {
            if slower_or_equal(&b, &a) {
                (a, b)
            } else {
                (b, a)
            }
        }),
    ]
}

/// Old params, a history under them and a later instant; the state and time reached.
fn history(old: Params) -> impl Strategy<Value = (State, u64)> {
    (start(), steps(old, 0..40), 0..=old.period_micros() / 4).prop_map(
        move |(start, history, advance)| {
            let (state, last, _) = run(&old, start, &history);
            (state, last + advance)
        },
    )
}

/// Cost admitted at times in `[from, to]`, per `(time, cost)` event.
fn admitted_between(events: &[(u64, u64)], from: u64, to: u64) -> u128 {
    events
        .iter()
        .filter(|&&(t, _)| from <= t && t <= to)
        .map(|&(_, c)| u128::from(c))
        .sum()
}

fn at(micros: u64) -> Timestamp {
    Timestamp::from_micros(micros)
}

/// `ceil(n / d)` for the bounds below.
fn ceil(n: u128, d: u128) -> u128 {
    n.div_ceil(d)
}

proptest! {
    #![proptest_config(config(192))]

    /// (1) After a lower rate, the wait for one unit is at most the old debt drained at the new
    /// rate plus one new emission interval, and the bucket is full again no later than that
    /// plus a whole new burst: nothing like the years a reinterpreted state would wait.
    #[test]
    fn a_lower_rate_waits_no_longer_than_the_old_debt_drains(
        ((old, new), (state, now)) in bucket()
            .prop_flat_map(lowered)
            .prop_flat_map(|(old, new)| (Just((old, new)), history(old))),
    ) {
        let (l, p) = (u128::from(old.limit()), u128::from(old.period_micros()));
        let (l2, p2) = (u128::from(new.limit()), u128::from(new.period_micros()));
        // The old debt as time at the old rate (rounded up), then as time at the new rate.
        let debt_time = u128::from(us(decide(&old, &state, at(now), 0).0.reset_after));
        let drained_at_new_rate = ceil(debt_time * l * p2, p * l2);
        let interval = ceil(p2, l2);

        let (decision, _) = decide(&new, &state, at(now), 1);
        if let Some(retry) = decision.retry_after {
            let retry = u128::from(us(retry));
            prop_assert!(
                retry <= drained_at_new_rate + interval,
                "retry after {retry}µs; the debt drains in {drained_at_new_rate}µs"
            );
        }
        let burst_time = ceil(u128::from(new.burst()) * p2, l2);
        let reset = u128::from(us(decision.reset_after));
        prop_assert!(reset <= drained_at_new_rate + burst_time, "reset after {reset}µs");
    }

    /// (2) A higher limit (same period, burst following the limit or raised in proportion to
    /// it; the token bucket with any burst at least the old one) admits every request the old
    /// limit admitted.
    #[test]
    fn a_higher_limit_denies_nothing_the_old_one_allowed(
        ((old, new), (state, now), costs) in (bucket(), any::<bool>(), 0.0..1.0f64)
            .prop_flat_map(|(algorithm, keep_burst, raise)| {
                params(algorithm).prop_flat_map(move |old| {
                    // Mostly small raises (1x to 11x), sometimes up to the maximum.
                    let limit = if raise < 0.8 {
                        let factor = 1.0 + raise * 12.5;
                        ((old.limit() as f64 * factor) as u64).clamp(old.limit(), MAX_LIMIT)
                    } else {
                        old.limit() + ((MAX_LIMIT - old.limit()) as f64 * raise) as u64
                    };
                    let (b, l) = (u128::from(old.burst()), u128::from(old.limit()));
                    let proportional = (b * u128::from(limit)).div_ceil(l);
                    let burst = if algorithm == Algorithm::TokenBucket && keep_burst {
                        Some(old.burst())
                    } else if old.burst() == old.limit() {
                        None
                    } else {
                        Some(u64::try_from(proportional).unwrap_or(u64::MAX).min(MAX_LIMIT))
                    };
                    let new = with_limit(&old, limit, burst);
                    let capacity = old.capacity();
                    (
                        Just((old, new)),
                        history(old),
                        proptest::collection::vec(1..=capacity.min(5), 1..4),
                    )
                })
            }),
    ) {
        // A burst capped at MAX_LIMIT is smaller than proportional: that is a lower tolerance.
        prop_assume!(
            new.algorithm() == Algorithm::TokenBucket
                || u128::from(new.burst()) * u128::from(old.limit())
                    >= u128::from(old.burst()) * u128::from(new.limit())
        );
        prop_assert!(new.capacity() >= old.capacity());
        for cost in costs.into_iter().chain([old.capacity()]) {
            if decide(&old, &state, at(now), cost).0.is_allowed() {
                let (decision, _) = decide(&new, &state, at(now), cost);
                prop_assert!(decision.is_allowed(), "cost {cost}: {decision:?}");
            }
        }
    }

    /// (3) After a lower rate, over any closed interval `[a, b]` after the change, at most
    /// `burst + limit * (b - a) / period` of the new params is admitted; in particular at most
    /// the new burst at any one instant.
    #[test]
    fn a_lower_rate_admits_at_most_the_new_burst_plus_rate(
        ((_, new), (state, now), after) in bucket()
            .prop_flat_map(lowered)
            .prop_flat_map(|(old, new)| (Just((old, new)), history(old), steps(new, 1..60))),
    ) {
        let mut state = state;
        let mut now = now;
        let mut events = Vec::new();
        for step in &after {
            now += step.advance;
            let (decision, transition) = decide(&new, &state, at(now), step.cost);
            if decision.is_allowed() {
                events.push((now, step.cost));
            }
            state.apply(transition);
        }
        let (burst, l, p) = (
            u128::from(new.burst()),
            u128::from(new.limit()),
            u128::from(new.period_micros()),
        );
        for &(a, _) in &events {
            for &(b, _) in events.iter().filter(|&&(b, _)| b >= a) {
                let total = admitted_between(&events, a, b);
                prop_assert!(
                    total * p <= burst * p + l * u128::from(b - a),
                    "{total} admitted in [{a}, {b}]"
                );
            }
        }
    }

    /// Every bucket keeps the units it has used, whatever the change: at the instant the state
    /// was written, what the new params leave is `max(0, new burst - used)`, `used` being the
    /// whole units the old params counted then (`old burst - old remaining`: a fraction used
    /// counts as a unit under both), and one unit fits exactly when one is left. A key that
    /// used all its units under a looser limit is denied under a tighter one.
    #[test]
    fn every_bucket_keeps_its_units_used(
        ((old, new), start, history) in bucket()
            .prop_flat_map(|a| (params(a), params(a)))
            .prop_flat_map(|(old, new)| (Just((old, new)), start(), steps(old, 0..40))),
    ) {
        // A last zero-cost request writes the state at the last instant.
        let mut history = history;
        history.push(Step { advance: 0, cost: 0 });
        let (state, now, _) = run(&old, start, &history);
        let (before, _) = decide(&old, &state, at(now), 0);
        let used = old.burst() - before.remaining;
        let (after, _) = decide(&new, &state, at(now), 0);
        prop_assert_eq!(after.remaining, new.burst().saturating_sub(used));
        let (one, _) = decide(&new, &state, at(now), 1);
        prop_assert_eq!(one.is_allowed(), after.remaining >= 1);
    }

    /// From the first decision under new params on, the contract holds for every algorithm:
    /// a denial is admitted exactly at `now + retry_after` and not 1µs earlier, `reset_after`
    /// is the expiry of the state after the decision, and from then on the state decides like
    /// an empty one.
    #[test]
    fn the_contract_holds_across_a_change(
        ((_, new), (state, now), advance, cost) in proptest::sample::select(
            tollgate_core::Algorithm::ALL.to_vec(),
        )
        .prop_flat_map(|a| (params(a), params(a)))
        .prop_flat_map(|(old, new)| {
            let capacity = new.capacity();
            (
                Just((old, new)),
                history(old),
                prop_oneof![Just(0u64), 0..=new.period_micros()],
                prop_oneof![3 => 1..=capacity.min(3), 1 => 0..=capacity],
            )
        }),
    ) {
        let now = now + advance;
        let (decision, transition) = decide(&new, &state, at(now), cost);
        if let Some(retry) = decision.retry_after {
            let retry = us(retry);
            let verdict = |t: u64| decide(&new, &state, at(t), cost).0.is_allowed();
            prop_assert!(verdict(now + retry), "not admitted at now + retry_after");
            prop_assert!(!verdict(now + retry - 1), "admitted 1µs before retry_after");
        }
        let mut after = state.clone();
        after.apply(transition);
        let expires = after.expires_at(&new).as_micros();
        prop_assert_eq!(now + us(decision.reset_after), expires.max(now));
        let empty = State::empty(&new);
        let from = expires.max(now);
        for t in [from, from + 1, from + new.period_micros()] {
            for c in [0, 1, cost] {
                prop_assert_eq!(decide(&new, &after, at(t), c), decide(&new, &empty, at(t), c));
            }
        }
    }

    /// (4) The windows and the log keep their raw counts under another limit (same period):
    /// the new limit sees exactly the cost the old one had counted, and charges it the same way.
    #[test]
    fn windows_and_the_log_keep_their_counts(
        ((old, new), (state, now), costs) in proptest::sample::select(WINDOWS.to_vec())
            .prop_flat_map(|a| (params(a), params(a)))
            .prop_flat_map(|(old, other)| {
                let max = if old.algorithm() == Algorithm::SlidingWindowLog {
                    MAX_LOG_LIMIT
                } else {
                    MAX_LIMIT
                };
                let limit = prop_oneof![
                    2 => Just(other.limit()),
                    1 => 1..=old.limit().saturating_add(3).min(max),
                ];
                (Just(old), limit, history(old), proptest::collection::vec(0..=5u64, 1..4))
            })
            .prop_map(|(old, limit, history, costs)| {
                ((old, with_limit(&old, limit, None)), history, costs)
            }),
    ) {
        // States built by `decide` never count more than the limit they were built under.
        let counted = old.limit() - decide(&old, &state, at(now), 0).0.remaining;
        let (probe, _) = decide(&new, &state, at(now), 0);
        prop_assert_eq!(probe.remaining, new.limit().saturating_sub(counted));
        for cost in costs {
            let (decision, transition) = decide(&new, &state, at(now), cost);
            let fits = cost <= new.capacity() && counted + cost <= new.limit();
            prop_assert_eq!(decision.is_allowed(), fits, "cost {} on {}", cost, counted);
            let (before, same) = decide(&old, &state, at(now), cost);
            if fits && before.is_allowed() {
                prop_assert_eq!(&transition, &same, "the same charge");
            }
        }
    }
}
