//! The memory store's path for a request of one charge (`MemoryStore::decide_one`: one hash,
//! one lock, no per-charge buffers) held equal to its general path, which decides any number
//! of charges.
//!
//! Two fresh stores on one manual clock decide the same random sequence of applies, peeks and
//! decisions for requests a limit outside the call denies (`MemoryStore::decide_denied`): one
//! is given each charge alone (the fast path), the other the same charge beside a neutral
//! one, which sends it down the general path. The neutral charge is a check that answers as
//! the counter stands (`checks_as_is`, cost 0: it never changes its counter, so it needs no
//! key), on a key no request uses, under a limit no check can be over, and it does not
//! enforce: it can neither deny the request nor take room in the store. Every answer (a
//! decision, and a refusal for a store at its most keys or bytes) must be the same, so must
//! the keys and bytes held after each request, and, at the end, what every key reads under
//! every params of the sequence.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use tollgate::clock::{Clock, ManualClock};
use tollgate::store::{Charge, Decisions, MemoryStore, StoreError};
use tollgate_core::{Algorithm, Decision, MAX_LIMIT, MAX_LOG_LIMIT, Params, Timestamp};

use super::strategies::{config, limit, period};

/// The key of the neutral charge; the sequence's keys are `k0`, `k1`, `k2`.
const NEUTRAL_KEY: &[u8] = b"neutral";
const KEYS: [&str; 3] = ["k0", "k1", "k2"];

/// Params of any algorithm, a bucket's burst below, at or above its limit, some charging up
/// to the limit.
fn params() -> impl Strategy<Value = Params> {
    proptest::sample::select(Algorithm::ALL.to_vec()).prop_flat_map(|algorithm| {
        let max = if algorithm == Algorithm::SlidingWindowLog {
            MAX_LOG_LIMIT
        } else {
            MAX_LIMIT
        };
        let burst = if algorithm.uses_burst() {
            prop_oneof![
                2 => Just(None),
                2 => (1..=20u64).prop_map(Some),
                1 => limit(MAX_LIMIT).prop_map(Some),
            ]
            .boxed()
        } else {
            Just(None).boxed()
        };
        (limit(max), period(), burst, prop::bool::weighted(0.3)).prop_map(
            move |(limit, period, burst, up_to_limit)| {
                Params::new(algorithm, limit, Duration::from_micros(period), burst)
                    .unwrap()
                    .charging_up_to_limit(up_to_limit)
            },
        )
    })
}

/// How many keys, or bytes, the stores may hold.
#[derive(Debug, Clone, Copy)]
enum Bound {
    None,
    Keys(usize),
    Bytes(usize),
}

impl Bound {
    fn strategy() -> impl Strategy<Value = Bound> {
        prop_oneof![
            3 => Just(Bound::None),
            1 => (0..=3usize).prop_map(Bound::Keys),
            // `KEY_BYTES` (144) a key, a sliding log's entries besides.
            1 => (0..=1_200usize).prop_map(Bound::Bytes),
        ]
    }

    fn store(self, clock: &Arc<ManualClock>) -> MemoryStore {
        let store = MemoryStore::new(clock.clone());
        match self {
            Bound::None => store,
            Bound::Keys(max) => store.with_max_keys(max),
            Bound::Bytes(max) => store.with_max_bytes(max),
        }
    }
}

/// One request of the sequence: its charge, the clock step before it, and how it is decided.
#[derive(Debug, Clone)]
struct Request {
    key: usize,
    /// Index into the sequence's params.
    params: usize,
    /// Kind and seed, drawn relative to the capacity (see [`Request::cost`]).
    cost: (u8, u64),
    checks_as_is: bool,
    enforce: bool,
    quota: bool,
    call: Call,
    /// Kind and seed, drawn relative to the period (see [`Request::advance`]).
    advance: (u8, u64),
    /// Whether the general path gets the neutral charge before this one rather than after.
    neutral_first: bool,
}

impl Request {
    fn strategy() -> impl Strategy<Value = Request> {
        (
            (0..KEYS.len(), 0..8usize, (any::<u8>(), any::<u64>())),
            (
                prop::bool::weighted(0.3),
                prop::bool::weighted(0.85),
                prop::bool::weighted(0.2),
                prop_oneof![6 => Just(Call::Apply), 2 => Just(Call::Peek), 1 => Just(Call::Denied)],
            ),
            ((any::<u8>(), any::<u64>()), any::<bool>()),
        )
            .prop_map(
                |(
                    (key, params, cost),
                    (checks_as_is, enforce, quota, call),
                    (advance, neutral_first),
                )| Request {
                    key,
                    params,
                    cost,
                    checks_as_is,
                    enforce,
                    quota,
                    call,
                    advance,
                    neutral_first,
                },
            )
    }

    /// 0 (a check), 1, up to the capacity, the capacity, past it, or far past it.
    fn cost(&self, capacity: u64) -> u64 {
        let (kind, seed) = self.cost;
        match kind % 12 {
            0 | 1 => 0,
            2..=4 => 1,
            5..=7 => 1 + seed % capacity.min(3),
            8 => 1 + seed % capacity,
            9 => capacity,
            10 => capacity.saturating_add(1 + seed % 3),
            _ => seed,
        }
    }

    /// The clock step before the request: none, within a period, up to three periods later,
    /// or back a little (a clock that steps backwards).
    fn advance(&self, clock: &ManualClock, period: u64) {
        let (kind, seed) = self.advance;
        let up_to = |n: u64| seed % (n + 1);
        match kind % 14 {
            0..=3 => {}
            4..=8 => clock.advance(Duration::from_micros(up_to(period / 8))),
            9..=11 => clock.advance(Duration::from_micros(up_to(period))),
            12 => clock.advance(Duration::from_micros(up_to(3 * period))),
            _ => {
                let back = up_to(period / 4);
                clock.set(Timestamp::from_micros(
                    clock.now().as_micros().saturating_sub(back),
                ));
            }
        }
    }
}

/// What a store answered a request: the charge's decision, and whether the store refused to
/// commit it (at its most keys or bytes), with what it decided of the charge then and why.
#[derive(Debug, PartialEq)]
struct Answer {
    decision: Decision,
    refused: Option<(Option<Decision>, String)>,
}

/// How a request is decided: applied (committed when admitted), peeked, or decided for a
/// request a limit outside the store call denies (as a failure posture decides the local
/// limits beside a denied one).
#[derive(Debug, Clone, Copy)]
enum Call {
    Apply,
    Peek,
    Denied,
}

/// `charges` decided on `store` as `call` says: the answer for the charge at `at`, and every
/// charge's decision.
fn decide(
    store: &MemoryStore,
    charges: &[Charge<'_>],
    call: Call,
    at: usize,
) -> Result<(Answer, Decisions), TestCaseError> {
    let mut decisions = Decisions::new();
    let result = match call {
        Call::Apply => store.decide(charges, true, &mut decisions),
        Call::Peek => store.decide(charges, false, &mut decisions),
        Call::Denied => {
            store.decide_denied(charges, &mut decisions);
            Ok(())
        }
    };
    prop_assert_eq!(decisions.len(), charges.len(), "a decision a charge");
    let refused = match result {
        Ok(()) => None,
        Err(StoreError::Partly { decided, cause, .. }) => Some((decided[at], cause.to_string())),
        Err(other) => return Err(TestCaseError::fail(format!("the store failed: {other}"))),
    };
    let answer = Answer {
        decision: decisions[at],
        refused,
    };
    Ok((answer, decisions))
}

/// Decides `requests` from `start` on a store through the fast path and on one through the
/// general path, both bounded by `bound`, and requires the same answers and the same state.
fn fast_and_general_paths_agree(
    pool: &[Params],
    bound: Bound,
    start: u64,
    requests: &[Request],
) -> Result<(), TestCaseError> {
    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(start)));
    let (fast, general) = (bound.store(&clock), bound.store(&clock));
    // No check is ever over a limit this large, and none changes its counter.
    let neutral_params = Params::new(
        Algorithm::FixedWindow,
        MAX_LIMIT,
        Duration::from_secs(86_400),
        None,
    )
    .unwrap();
    let neutral = Charge {
        enforce: false,
        checks_as_is: true,
        ..Charge::new(NEUTRAL_KEY, &neutral_params, 0)
    };
    for (n, request) in requests.iter().enumerate() {
        let params = &pool[request.params % pool.len()];
        request.advance(&clock, params.period_micros());
        let charge = Charge {
            checks_as_is: request.checks_as_is,
            enforce: request.enforce,
            quota: request.quota,
            ..Charge::new(
                KEYS[request.key].as_bytes(),
                params,
                request.cost(params.capacity()),
            )
        };
        let (beside, at, other) = if request.neutral_first {
            ([neutral, charge], 1, 0)
        } else {
            ([charge, neutral], 0, 1)
        };
        let (alone, _) = decide(&fast, &[charge], request.call, 0)?;
        let (among, decisions) = decide(&general, &beside, request.call, at)?;
        prop_assert!(
            decisions[other].is_allowed(),
            "the neutral charge was not: {:?}",
            decisions[other]
        );
        prop_assert_eq!(
            &alone,
            &among,
            "request {} at {:?}: {:?}",
            n,
            clock.now(),
            charge
        );
        prop_assert_eq!(fast.len(), general.len(), "keys held after request {}", n);
        prop_assert_eq!(
            fast.bytes(),
            general.bytes(),
            "bytes held after request {}",
            n
        );
    }
    // What every key reads under every params, charge or check, read the same way on both.
    for key in KEYS {
        for params in pool {
            for cost in [0, 1] {
                let look = [Charge::new(key.as_bytes(), params, cost)];
                let (fast_reads, _) = decide(&fast, &look, Call::Peek, 0)?;
                let (general_reads, _) = decide(&general, &look, Call::Peek, 0)?;
                prop_assert_eq!(fast_reads, general_reads, "{} under {:?}", key, params);
            }
        }
    }
    Ok(())
}

/// Random params (every algorithm, charging whole or up to the limit), costs (checks, 1, up
/// to and past the capacity), checks that answer as the counter stands, shadow and quota
/// charges, applies and peeks, clock steps (forwards, past expiry, backwards) and store
/// bounds: a request of one charge is decided and committed as the general path decides it.
#[test]
fn one_charge_decides_as_the_general_path_does() {
    let strategy = (
        proptest::collection::vec(params(), 1..=4),
        Bound::strategy(),
        prop_oneof![Just(1_700_000_000_000_000u64), 0..=4_000_000_000_000_000u64],
        proptest::collection::vec(Request::strategy(), 1..40),
    );
    let mut runner = TestRunner::new(config(512, file!()));
    let outcome = runner.run(&strategy, |(pool, bound, start, requests)| {
        fast_and_general_paths_agree(&pool, bound, start, &requests)
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}
