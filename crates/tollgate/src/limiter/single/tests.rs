//! The single-descriptor path against the general one: two limiters on one clock, each on a
//! memory store of its own, decide the same requests, one on each path, and must answer, count
//! and remember alike.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::Timestamp;

use super::super::answer;
use super::super::candidate::Candidate;
use crate::clock::{Clock, ManualClock};
use crate::limiter::{
    CheckRequest, FailureSettings, LimitOverride, Limiter, Override, RequestDescriptor,
};
use crate::policy::Policy;
use crate::store::{MemoryStore, StoreBackend};

const POLICY: &str = "
domain: api
descriptors:
  - key: fw
    rate_limit: {name: fw, unit: second, requests_per_unit: 3}
  - key: log
    rate_limit: {name: log, unit: second, requests_per_unit: 3, algorithm: sliding_window_log}
  - key: counter
    rate_limit: {name: counter, unit: second, requests_per_unit: 3, algorithm: sliding_window_counter}
  - key: tokens
    rate_limit: {name: tokens, unit: second, requests_per_unit: 3, algorithm: token_bucket, burst: 4}
  - key: leaky
    rate_limit: {name: leaky, unit: second, requests_per_unit: 3, algorithm: leaky_bucket}
  - key: gcra
    rate_limit: {name: gcra, unit: second, requests_per_unit: 3, algorithm: gcra}
  - key: shadow
    shadow_mode: true
    rate_limit: {name: shadow, unit: second, requests_per_unit: 2}
  - key: soft
    rate_limit: {name: soft, unit: second, requests_per_unit: 2, mode: soft}
  - key: quota
    quota_mode: true
    detailed_metric: true
    rate_limit: {name: quota, unit: second, requests_per_unit: 2}
  - key: upto
    rate_limit: {name: upto, unit: second, requests_per_unit: 5, charge: up_to_limit}
  - key: zero
    rate_limit: {name: zero, unit: second, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
";

/// The descriptor keys requests use: every rule's, and one no rule matches.
const KEYS: [&str; 13] = [
    "fw", "log", "counter", "tokens", "leaky", "gcra", "shadow", "soft", "quota", "upto", "zero",
    "free", "nothing",
];

/// Whether the single path takes a request of `key` with `value`: the rules with a limit above
/// 0, but for the one key a runtime override limits (see [`pair`]).
fn takes(key: &str, value: usize) -> bool {
    let overridden = key == "fw" && value == 1;
    !overridden && !matches!(key, "zero" | "free" | "nothing")
}

fn limiter(clock: &Arc<ManualClock>) -> Limiter {
    let policy = Policy::from_yaml("api.yaml", POLICY).unwrap();
    let store = StoreBackend::Memory(MemoryStore::new(clock.clone()));
    let limiter =
        Limiter::with_failure_settings(policy, store, FailureSettings::default(), clock.clone());
    let override_on = Override {
        id: 0,
        domain: "api".into(),
        rule: "fw".into(),
        entries: vec![("fw".into(), "v1".into())],
        requests_per_unit: 1,
        period: None,
        expires_at: None,
        set_at: clock.now(),
        reason: String::new(),
    };
    limiter.overrides().set(override_on).unwrap();
    limiter
}

/// Two limiters alike on one clock, which starts on a second boundary.
fn pair() -> (Arc<ManualClock>, Limiter, Limiter) {
    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
        1_700_000_000_000_000,
    )));
    let (a, b) = (limiter(&clock), limiter(&clock));
    (clock, a, b)
}

fn request(key: &str, value: usize, cost: u64, as_is: bool) -> CheckRequest {
    let entries = vec![(key.to_owned(), format!("v{value}"))];
    let descriptor = RequestDescriptor::new(entries, cost, None).unwrap();
    CheckRequest::new("api".into(), vec![descriptor])
        .unwrap()
        .with_checks_as_is(as_is)
}

/// Decides `request` on `single`'s path of its own (falling back to the general one, as
/// `Limiter::check` does) and on `general`'s general path; asserts the two answers are the
/// same, and returns whether the single path took it.
fn decide_both(single: &Limiter, general: &Limiter, request: &CheckRequest, commit: bool) -> bool {
    #[allow(clippy::disallowed_methods)] // what the decisions are timed from; never compared
    let started = tokio::time::Instant::now();
    let (memory_a, memory_b) = (
        single.store().memory().unwrap(),
        general.store().memory().unwrap(),
    );
    let now = memory_a.now();
    let mut fast = answer::empty();
    let pipeline = single.pipeline(started);
    let taken = pipeline.decide_single((memory_a, now), request, commit, &mut fast);
    if taken.is_none() {
        let again = pipeline.decide_now((memory_a, now), request, commit, &mut fast);
        again.unwrap().unwrap();
    }
    let mut slow = answer::empty();
    let mode = general
        .pipeline(started)
        .decide_now((memory_b, now), request, commit, &mut slow);
    let mode = mode.unwrap().unwrap();
    assert_eq!(
        format!("{fast:?}"),
        format!("{slow:?}"),
        "{request:?}, commit {commit}"
    );
    if let Some(taken) = taken {
        assert_eq!(Some(taken), mode, "the store call's mode");
    }
    taken.is_some()
}

/// What the two limiters count: their metrics (outcomes per rule, per value for the detailed
/// rule) and each rule's top keys.
fn counted(limiter: &Limiter) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut out = runtime.block_on(limiter.render_metrics());
    for key in KEYS {
        out.push_str(&format!("{:?}\n", limiter.top_keys("api", key, 10)));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any sequence of one-descriptor requests, on every algorithm and mode, charged or
    /// looked at, with costs from 0 (checks, as they stand or not) to more than a limit, and
    /// time moving on between them.
    #[test]
    fn one_descriptor_is_answered_and_counted_as_the_general_path_does(
        steps in prop::collection::vec(
            (0..KEYS.len(), 0..3usize, 0..7u64, 0..400u64, any::<bool>(), any::<bool>()),
            1..80,
        )
    ) {
        let (clock, single, general) = pair();
        for (key, value, cost, wait_ms, commit, as_is) in steps {
            clock.advance(Duration::from_millis(wait_ms));
            let request = request(KEYS[key], value, cost, as_is);
            let taken = decide_both(&single, &general, &request, commit);
            prop_assert_eq!(taken, takes(KEYS[key], value), "{:?}", request);
        }
        prop_assert_eq!(counted(&single), counted(&general));
    }
}

#[test]
fn a_caller_limit_several_descriptors_or_a_charged_candidate_take_the_general_path() {
    let (_clock, single, general) = pair();
    let limit = LimitOverride::new(5, Duration::from_secs(1)).unwrap();
    let sent = RequestDescriptor::new(vec![("fw".into(), "v0".into())], 1, Some(limit)).unwrap();
    let with_limit = CheckRequest::new("api".into(), vec![sent]).unwrap();
    assert!(!decide_both(&single, &general, &with_limit, true));
    let two =
        ["fw", "gcra"].map(|k| RequestDescriptor::new(vec![(k.into(), "v0".into())], 1, None));
    let two = CheckRequest::new("api".into(), two.into_iter().map(Result::unwrap).collect());
    assert!(!decide_both(&single, &general, &two.unwrap(), true));

    let plain = request("fw", 0, 1, false);
    assert!(decide_both(&single, &general, &plain, true));
    let candidate = |at| {
        let sources = vec![("api.yaml".to_owned(), POLICY.to_owned())];
        let policy = Policy::from_sources(&sources).unwrap();
        Arc::new(Candidate::new(policy, sources, at))
    };
    for limiter in [&single, &general] {
        limiter.set_candidate(Some(candidate(limiter.clock().now())));
    }
    // A charged request feeds the candidate, which the general path charges beside it; one only
    // looked at does not.
    assert!(!decide_both(&single, &general, &plain, true));
    assert!(decide_both(&single, &general, &plain, false));
}
