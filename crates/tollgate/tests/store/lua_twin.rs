//! The Lua twins (`store/redis/lua/`) against the core, on a real `redis-server`.
//!
//! Every test drives the DECIDE and REFUND scripts with a pinned clock and a Rust reference
//! built from `tollgate_core::decide` and `State::apply`, composed exactly like the memory store
//! composes a request (charges on one key see the earlier ones; all-or-nothing commit), plus
//! the one thing Redis adds: a state already expired at `now` is deleted. Decisions must be
//! identical, TTLs must be `ceil(expires_at / 1000)` ms, and calls that commit nothing must leave
//! every key byte-for-byte unchanged.
//!
//! The pinned clock starts in 2033: Redis expires keys by its own wall clock, so a pinned time
//! in the past would delete what the script just wrote.

// Test code: a broken expectation should panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use redis::{Connection, Script, Value};
use tollgate::store::redis::script::{
    DECIDE_BATCH_SCRIPT, DECIDE_SCRIPT, MAX_NOW_MICROS, MAX_REFILL_MICROS, REFUND_SCRIPT,
    algorithm_code, batch_request_arg, decide_batch_library, fits_lua, split_batch_reply,
};
use tollgate_core::{
    Algorithm, Decision, MAX_LIMIT, MAX_LOG_LIMIT, Params, SlidingLog, State, Timestamp,
    Transition, Verdict, decide, decide_or_check, refund,
};
use tollgate_testkit::RedisServer;

use super::strategies::{MAX_PERIOD_US, config, limit, period};

/// 23148 days after the epoch (in 2033): a whole number of days, so windows of a second, a
/// minute, an hour or a day start on it, and later than any real clock running these tests.
const BASE: u64 = 23_148 * 86_400_000_000;

// ---------------------------------------------------------------------------------------------
// Redis side

/// A redis-server for one test and a connection to it.
struct Redis {
    _server: RedisServer,
    con: Connection,
    decide: Script,
    batch: Script,
    refund: Script,
    /// DECIDE_BATCH calls made: every other one goes by FCALL of the function library, the
    /// others by EVALSHA, so both forms answer like DECIDE calls back to back.
    batch_calls: u64,
}

impl Redis {
    fn start() -> Self {
        let server = RedisServer::start();
        let mut con = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(&decide_batch_library().code)
            .query::<String>(&mut con)
            .unwrap();
        Redis {
            _server: server,
            con,
            decide: Script::new(DECIDE_SCRIPT),
            batch: Script::new(DECIDE_BATCH_SCRIPT),
            refund: Script::new(REFUND_SCRIPT),
            batch_calls: 0,
        }
    }

    /// Runs DECIDE. `now`: pinned, or `None` for the server's clock.
    fn decide(
        &mut self,
        charges: &[Charge],
        now: Option<u64>,
        commit: bool,
    ) -> redis::RedisResult<Answer> {
        self.decide_at(
            charges,
            now.map_or_else(String::new, |n| n.to_string()),
            commit,
        )
    }

    /// Runs DECIDE with `ARGV[2] = now` as given.
    fn decide_at(
        &mut self,
        charges: &[Charge],
        now: String,
        commit: bool,
    ) -> redis::RedisResult<Answer> {
        let mut call = self.decide.prepare_invoke();
        for c in charges {
            call.key(&c.key);
        }
        call.arg(if commit { "1" } else { "0" });
        call.arg(now);
        for c in charges {
            call.arg(algorithm_code(c.params.algorithm()))
                .arg(c.params.limit())
                .arg(c.params.period_micros())
                .arg(c.params.burst())
                .arg(c.cost)
                .arg(c.flags());
        }
        let raw: Vec<i64> = call.invoke(&mut self.con)?;
        Ok(Answer::from_reply(raw, charges.len()))
    }

    /// Runs DECIDE_BATCH: every request `(charges, commit)` at one pinned `now`. Per request,
    /// its answer or the error message it failed with.
    fn decide_batch(
        &mut self,
        requests: &[(Vec<Charge>, bool)],
        now: u64,
    ) -> Vec<Result<Answer, String>> {
        self.decide_batch_at(requests, now.to_string())
    }

    /// Runs DECIDE_BATCH with `ARGV[1] = now` as given.
    fn decide_batch_at(
        &mut self,
        requests: &[(Vec<Charge>, bool)],
        now: String,
    ) -> Vec<Result<Answer, String>> {
        let mut keys = Vec::new();
        let mut texts = Vec::new();
        for (charges, commit) in requests {
            let args: Vec<[u64; 6]> = charges
                .iter()
                .map(|c| {
                    keys.push(c.key.clone());
                    c.script_args()
                })
                .collect();
            let mut text = Vec::new();
            batch_request_arg(&mut text, *commit, args.iter());
            texts.push(text);
        }
        self.batch_calls += 1;
        let reply: Vec<Value> = if self.batch_calls.is_multiple_of(2) {
            let mut call = redis::cmd("FCALL");
            call.arg(&decide_batch_library().function)
                .arg(keys.len())
                .arg(&keys)
                .arg(now)
                .arg(&texts);
            call.query(&mut self.con).unwrap()
        } else {
            let mut call = self.batch.prepare_invoke();
            call.arg(now);
            for key in &keys {
                call.key(key);
            }
            for text in &texts {
                call.arg(text);
            }
            call.invoke(&mut self.con).unwrap()
        };
        let replies = split_batch_reply(&reply, requests.iter().map(|(c, _)| c.len()))
            .expect("one reply per request");
        replies
            .into_iter()
            .zip(requests)
            .map(|(reply, (charges, _))| reply.map(|raw| Answer::from_reply(raw, charges.len())))
            .collect()
    }

    /// Runs REFUND of `(charge, cost)` pairs made at `now`.
    fn refund(&mut self, charges: &[Charge], now: u64) -> redis::RedisResult<i64> {
        let mut call = self.refund.prepare_invoke();
        for c in charges {
            call.key(&c.key);
        }
        call.arg(now);
        for c in charges {
            call.arg(algorithm_code(c.params.algorithm()))
                .arg(c.params.limit())
                .arg(c.params.period_micros())
                .arg(c.params.burst())
                .arg(c.cost);
        }
        call.invoke(&mut self.con)
    }

    fn cmd<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.con).unwrap()
    }

    /// Everything observable about `keys`: serialized value and absolute expiry.
    fn snapshot(&mut self, keys: &[&str]) -> Vec<(Value, i64)> {
        let mut pipe = redis::pipe();
        for k in keys {
            pipe.cmd("DUMP").arg(*k).cmd("PEXPIRETIME").arg(*k);
        }
        let values: Vec<Value> = pipe.query(&mut self.con).unwrap();
        values
            .chunks(2)
            .map(|p| {
                let expiry = match &p[1] {
                    Value::Int(i) => *i,
                    other => panic!("PEXPIRETIME answered {other:?}"),
                };
                (p[0].clone(), expiry)
            })
            .collect()
    }

    /// Every key the reference holds has exactly the TTL its `expires_at` gives, and still has
    /// time to live; every other key is gone.
    fn check_ttls(&mut self, reference: &Reference, keys: &[&str]) -> Result<(), TestCaseError> {
        let mut pipe = redis::pipe();
        for k in keys {
            pipe.cmd("PEXPIRETIME").arg(*k).cmd("PTTL").arg(*k);
        }
        let values: Vec<i64> = pipe.query(&mut self.con).unwrap();
        for (k, v) in keys.iter().zip(values.chunks(2)) {
            match reference.states.get(*k) {
                Some((_, expires_at)) => {
                    let want = expires_at.as_micros().div_ceil(1000) as i64;
                    prop_assert_eq!(v[0], want, "PEXPIRETIME of {}", k);
                    prop_assert!(v[1] > 0, "PTTL of {} is {}", k, v[1]);
                }
                None => prop_assert_eq!(v[0], -2, "{} should not exist", k),
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Rust side

#[derive(Debug, Clone)]
struct Charge {
    key: String,
    params: Params,
    cost: u64,
    enforce: bool,
    /// Sends the "a check answers as the counter stands" flag (8) with a charge of a cost, as
    /// replicas before it went with checks only did: it must change nothing.
    flagged_as_is: bool,
}

impl Charge {
    fn new(key: &str, params: Params, cost: u64) -> Self {
        Charge {
            key: key.to_owned(),
            params,
            cost,
            enforce: true,
            flagged_as_is: false,
        }
    }

    /// The six numbers DECIDE takes for this charge.
    fn script_args(&self) -> [u64; 6] {
        [
            u64::from(algorithm_code(self.params.algorithm())),
            self.params.limit(),
            self.params.period_micros(),
            self.params.burst(),
            self.cost,
            self.flags(),
        ]
    }

    /// DECIDE's flags argument: 1 enforced, plus 2 charging up to the limit, plus 8 if flagged.
    fn flags(&self) -> u64 {
        u64::from(self.enforce)
            + 2 * u64::from(self.params.charges_up_to_limit())
            + 8 * u64::from(self.flagged_as_is)
    }
}

/// One call's answer: the script's reply, or the reference's.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    now: u64,
    admitted: bool,
    /// verdict, remaining, reset_after, retry_after (-1: none), delay (µs), charged units.
    decisions: Vec<[i64; 6]>,
}

impl Answer {
    /// A DECIDE reply for `charges` charges.
    fn from_reply(raw: Vec<i64>, charges: usize) -> Self {
        assert_eq!(raw.len(), 2 + 6 * charges, "reply shape: {raw:?}");
        Answer {
            now: raw[0] as u64,
            admitted: raw[1] == 1,
            decisions: raw[2..]
                .chunks(6)
                .map(|c| [c[0], c[1], c[2], c[3], c[4], c[5]])
                .collect(),
        }
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap()
}

/// A decision as DECIDE answers it, with the units it took (`charged`).
fn wire((d, charged): &(Decision, u64)) -> [i64; 6] {
    let verdict = match d.verdict {
        Verdict::Allowed => 0,
        Verdict::Denied => 1,
        Verdict::CostExceedsCapacity => 2,
    };
    [
        verdict,
        i64::try_from(d.remaining).unwrap(),
        micros(d.reset_after),
        d.retry_after.map_or(-1, micros),
        micros(d.delay),
        i64::try_from(*charged).unwrap(),
    ]
}

/// The store the script should behave like: the memory store's composition of the core, plus
/// Redis deleting a state that has expired when it is written. A state past its TTL is read as
/// it stands, as the script reads it here (Redis expires keys by its wall clock, years before
/// these pinned instants); that both stores forget it at that TTL is the conformance suite's
/// `a_state_lives_until_the_ttl_it_was_written_with`.
#[derive(Debug, Default, Clone)]
struct Reference {
    /// State and `expires_at` (from the params of the last charge that changed it).
    states: HashMap<String, (State, Timestamp)>,
    /// When each hash state's key was made (its `b` field): the sliding log's ZSET has none.
    born: HashMap<String, u64>,
}

impl Reference {
    fn decide(&mut self, charges: &[Charge], now: u64, commit: bool) -> Answer {
        let at = Timestamp::from_micros(now);
        let mut decisions: Vec<(Decision, u64)> = Vec::new();
        let mut transitions: Vec<Transition> = Vec::new();
        for (i, charge) in charges.iter().enumerate() {
            let stored = self.states.get(&charge.key).map(|(s, _)| s);
            let repeated = charges[..i].iter().any(|c| c.key == charge.key);
            let mut state = stored
                .cloned()
                .unwrap_or_else(|| State::empty(&charge.params));
            // Earlier charges on this key that were denied: their costs count in a denial's
            // retry, since the request fits only once they fit too.
            let mut denied_before = 0;
            if repeated {
                for ((prev, t), (d, _)) in charges[..i].iter().zip(&transitions).zip(&decisions) {
                    if prev.key == charge.key {
                        state.apply(t.clone());
                        if d.verdict == Verdict::Denied && !prev.params.charges_up_to_limit() {
                            denied_before += prev.cost;
                        }
                    }
                }
            }
            let (mut decision, transition) =
                decide_or_check(&charge.params, &state, at, charge.cost);
            if decision.verdict == Verdict::Denied
                && denied_before > 0
                && charge.cost > 0
                && !charge.params.charges_up_to_limit()
            {
                let together = denied_before + charge.cost;
                let whole = decide_or_check(&charge.params, &state, at, together).0;
                decision.retry_after = decision.retry_after.max(whole.retry_after);
            }
            // The units it takes: the whole units it leaves fewer than there were.
            let before = decide(&charge.params, &state, at, 0).0.remaining;
            let charged = match transition {
                Transition::Keep => 0,
                _ => before - decision.remaining,
            };
            decisions.push((decision, charged));
            transitions.push(transition);
        }
        let admitted = charges
            .iter()
            .zip(&decisions)
            .all(|(c, (d, _))| !c.enforce || d.is_allowed());
        if !admitted {
            // Nothing is charged: an allowed charge answers with the figures of the stored
            // state (still saying what it would have taken).
            for ((charge, (decision, _)), transition) in
                charges.iter().zip(&mut decisions).zip(&transitions)
            {
                if decision.is_allowed() && *transition != Transition::Keep {
                    let stored = self
                        .states
                        .get(&charge.key)
                        .map_or_else(|| State::empty(&charge.params), |(s, _)| s.clone());
                    *decision = tollgate_core::as_is(&charge.params, &stored, at);
                }
            }
        }
        if admitted && commit {
            let mut written = Vec::new();
            for (charge, transition) in charges.iter().zip(transitions) {
                if transition == Transition::Keep {
                    continue;
                }
                let entry = self
                    .states
                    .entry(charge.key.clone())
                    .or_insert_with(|| (State::empty(&charge.params), at));
                entry.0.apply(transition);
                entry.1 = entry.0.expires_at(&charge.params);
                // A hash keeps the instant its key was made; a ZSET replacing it has none, and
                // a hash replacing a ZSET is a new key.
                if charge.params.algorithm() == Algorithm::SlidingWindowLog {
                    self.born.remove(&charge.key);
                } else {
                    self.born.entry(charge.key.clone()).or_insert(now);
                }
                written.push(charge.key.clone());
            }
            for key in written {
                if self.states.get(&key).is_some_and(|(_, e)| *e <= at) {
                    self.states.remove(&key);
                    self.born.remove(&key);
                }
            }
        }
        Answer {
            now,
            admitted,
            decisions: decisions.iter().map(wire).collect(),
        }
    }

    /// The REFUND contract, on the core's states ([`refund`], and a key made after the charge
    /// left alone). Returns the number of keys changed.
    fn refund(&mut self, charges: &[Charge], now: u64) -> i64 {
        let mut changed: Vec<String> = Vec::new();
        for charge in charges {
            let Some((state, expires)) = self.states.get_mut(&charge.key) else {
                continue;
            };
            if state.algorithm() != charge.params.algorithm() {
                continue;
            }
            // A key made after the charge (here only when the clock stepped back between the
            // two) is taken for a counter Redis lost and made again: nothing is taken back.
            if self.born.get(&charge.key).is_some_and(|b| *b > now) {
                continue;
            }
            if refund_state(state, &charge.params, now, charge.cost) {
                *expires = state.expires_at(&charge.params);
                if !changed.contains(&charge.key) {
                    changed.push(charge.key.clone());
                }
            }
        }
        let at = Timestamp::from_micros(now);
        for key in &changed {
            if self.states.get(key).is_some_and(|(_, e)| *e <= at) {
                self.states.remove(key);
                self.born.remove(key);
            }
        }
        changed.len() as i64
    }
}

/// Undoes one charge of `cost` made at `now`: the core's [`refund`], REFUND's twin. Returns
/// whether the state changed.
fn refund_state(state: &mut State, params: &Params, now: u64, cost: u64) -> bool {
    let transition = refund(params, state, Timestamp::from_micros(now), cost);
    let changed = transition != Transition::Keep;
    state.apply(transition);
    changed
}

// ---------------------------------------------------------------------------------------------
// Drivers

static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

fn fresh_key(prefix: &str) -> String {
    format!("{prefix}:{}", NEXT_KEY.fetch_add(1, Ordering::Relaxed))
}

/// A clock step: `advance` µs (negative: backwards), kept within [BASE, MAX_NOW_MICROS).
fn step_clock(now: u64, advance: i64) -> u64 {
    let next = (now as i128 + i128::from(advance)).clamp(BASE as i128, MAX_NOW_MICROS as i128 - 1);
    next as u64
}

/// Decides `charges` on both sides and requires identical answers; commits on both. Calls that
/// commit nothing must leave `watch` untouched; after a commit every watched key has the TTL
/// the reference says. Every denial is probed at `now + retry_after` and 1µs before.
fn both(
    redis: &mut Redis,
    reference: &mut Reference,
    charges: &[Charge],
    now: u64,
    commit: bool,
    watch: &[&str],
) -> Result<Answer, TestCaseError> {
    let before = redis.snapshot(watch);
    let expected = reference.decide(charges, now, commit);
    let got = redis
        .decide(charges, Some(now), commit)
        .map_err(|e| TestCaseError::fail(format!("script failed: {e}")))?;
    prop_assert_eq!(&got, &expected, "charges {:?}", charges);
    if commit && expected.admitted {
        redis.check_ttls(reference, watch)?;
    } else {
        prop_assert_eq!(
            redis.snapshot(watch),
            before,
            "a call that commits nothing wrote"
        );
    }
    for (i, d) in expected.decisions.iter().enumerate() {
        if d[0] != 1 {
            continue;
        }
        let retry = u64::try_from(d[3]).unwrap();
        let probe = [Charge {
            enforce: true,
            ..charges[i].clone()
        }];
        for (at, verdict) in [(now + retry, 0), (now + retry - 1, 1)] {
            if at >= MAX_NOW_MICROS || charges.len() > 1 {
                continue; // a later charge of this call may have changed the key
            }
            let expected = reference.decide(&probe, at, false);
            let got = redis
                .decide(&probe, Some(at), false)
                .map_err(|e| TestCaseError::fail(format!("probe failed: {e}")))?;
            prop_assert_eq!(
                &got,
                &expected,
                "probe at now + {} - {}",
                retry,
                now + retry - at
            );
            prop_assert_eq!(got.decisions[0][0], verdict, "retry_after is not exact");
        }
    }
    Ok(got)
}

/// Runs a proptest whose body needs the shared server.
fn check<S: Strategy>(
    redis: &RefCell<Redis>,
    cases: u32,
    strategy: S,
    test: impl Fn(&mut Redis, S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let mut runner = TestRunner::new(config(cases, file!()));
    if let Err(e) = runner.run(&strategy, |value| test(&mut redis.borrow_mut(), value)) {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies

/// Parameters the script accepts: a bucket's burst is capped to the longest refill it can
/// represent (the cap itself is a common draw, through `limit`'s `Just(max)`).
fn params(algorithm: Algorithm) -> BoxedStrategy<Params> {
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
    (limit(max), period(), burst, proptest::bool::weighted(0.3))
        .prop_map(move |(limit, period, burst, up_to_limit)| {
            let burst = if algorithm.uses_burst() {
                let cap = u128::from(MAX_REFILL_MICROS) * u128::from(limit) / u128::from(period);
                let cap = u64::try_from(cap).unwrap_or(u64::MAX).min(MAX_LIMIT);
                Some(burst.unwrap_or(limit).min(cap))
            } else {
                None
            };
            let params = Params::new(algorithm, limit, Duration::from_micros(period), burst)
                .unwrap()
                .charging_up_to_limit(up_to_limit);
            fits_lua(&params).unwrap();
            params
        })
        .boxed()
}

/// A clock step and a cost, drawn relative to the limit they will meet.
#[derive(Debug, Clone, Copy)]
struct Step {
    advance: (u8, u64),
    cost: (u8, u64),
}

impl Step {
    fn advance(&self, period: u64) -> i64 {
        let (kind, seed) = self.advance;
        let up_to = |n: u64| i64::try_from(seed % (n + 1)).unwrap();
        match kind % 14 {
            0..=2 => 0,
            3..=8 => up_to(period / 8),
            9..=11 => up_to(period),
            12 => up_to(3 * period),
            _ => -up_to(period / 4), // the clock runs backwards (a failover to a skewed replica)
        }
    }

    fn cost(&self, capacity: u64) -> u64 {
        let (kind, seed) = self.cost;
        match kind % 12 {
            0..=7 => 1 + seed % capacity.min(3),
            8 | 9 => 1 + seed % capacity,
            10 => 0,
            _ => capacity + seed % 3,
        }
    }
}

fn steps(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(
        ((any::<u8>(), any::<u64>()), (any::<u8>(), any::<u64>()))
            .prop_map(|(advance, cost)| Step { advance, cost }),
        len,
    )
}

fn start() -> impl Strategy<Value = u64> {
    prop_oneof![Just(BASE), BASE..=BASE + 100_000_000_000_000]
}

// ---------------------------------------------------------------------------------------------
// Tests

/// The hand-written vectors in `fixtures/lua_twin_vectors.txt`.
#[test]
fn shared_vectors_decide_like_the_core() {
    let mut redis = Redis::start();
    let text = include_str!("../fixtures/lua_twin_vectors.txt");
    let mut count = 0;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, algorithm, limit, period, burst, start, steps @ ..] = fields.as_slice() else {
            panic!("bad vector line: {line}");
        };
        let burst = (*burst != "-").then(|| burst.parse::<u64>().unwrap());
        let params = Params::new(
            algorithm.parse().unwrap(),
            limit.parse().unwrap(),
            Duration::from_micros(period.parse().unwrap()),
            burst,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        fits_lua(&params).unwrap_or_else(|e| panic!("{name}: {e}"));
        let key = fresh_key(name);
        let mut reference = Reference::default();
        let mut now = BASE + start.parse::<u64>().unwrap();
        for (i, step) in steps.iter().enumerate() {
            let (advance, cost) = step.split_once(':').unwrap();
            now = step_clock(now, advance.parse().unwrap());
            let charge = [Charge::new(&key, params, cost.parse().unwrap())];
            both(&mut redis, &mut reference, &charge, now, true, &[&key])
                .unwrap_or_else(|e| panic!("{name}, step {i} ({step}): {e}"));
        }
        count += 1;
    }
    assert!(count >= 20, "only {count} vectors");
}

/// A key's limit tightened, then loosened, for every algorithm: a key that used all its 10 a
/// minute is denied under 5 a minute, one that used 3 is admitted once more (5 - 3 - 1 = 1
/// left), and loosened to 20 a minute it has 20 - 4 - 1 = 15 left after one more; the script
/// answers exactly as the core, with the same TTLs.
#[test]
fn a_changed_limit_keeps_the_units_used_like_the_core() {
    let mut redis = Redis::start();
    for algorithm in Algorithm::ALL {
        let minute = Duration::from_secs(60);
        let per_minute = |limit| Params::new(algorithm, limit, minute, None).unwrap();
        let (ten, five, twenty) = (per_minute(10), per_minute(5), per_minute(20));
        let (full, partly) = (fresh_key("full"), fresh_key("partly"));
        let mut reference = Reference::default();
        let mut call = |key: &str, params, at, cost| {
            let charge = [Charge::new(key, params, cost)];
            both(&mut redis, &mut reference, &charge, at, true, &[key]).unwrap()
        };
        assert!(call(&full, ten, BASE, 10).admitted, "{algorithm}");
        assert!(call(&partly, ten, BASE, 3).admitted, "{algorithm}");
        let denied = call(&full, five, BASE + 1, 1);
        assert_eq!(denied.decisions[0][..2], [1, 0], "{algorithm}: fully used");
        let tightened = call(&partly, five, BASE + 1, 1);
        assert_eq!(
            tightened.decisions[0][..2],
            [0, 1],
            "{algorithm}: partly used"
        );
        let loosened = call(&partly, twenty, BASE + 2, 1);
        assert_eq!(loosened.decisions[0][..2], [0, 15], "{algorithm}: loosened");
    }
}

/// Random parameters (limits up to 1e12, periods from 1ms to 400 days, bursts up to the
/// representable bound) and random request sequences, for every algorithm.
#[test]
fn random_sequences_decide_like_the_core() {
    let redis = RefCell::new(Redis::start());
    for algorithm in Algorithm::ALL {
        let strategy = (params(algorithm), start(), steps(1..40));
        check(&redis, 64, strategy, |redis, (params, start, steps)| {
            let key = fresh_key(algorithm.name());
            let mut reference = Reference::default();
            let mut now = start;
            for step in &steps {
                now = step_clock(now, step.advance(params.period_micros()));
                let cost = step.cost(params.capacity());
                let charge = [Charge {
                    flagged_as_is: cost > 0 && step.cost.0 & 0x80 != 0,
                    ..Charge::new(&key, params, cost)
                }];
                both(redis, &mut reference, &charge, now, true, &[&key])?;
            }
            Ok(())
        });
    }
}

/// Random parameters changing between the calls on one key (a reload tightening or loosening
/// its limit, burst or period, back and forth), for every algorithm: the script keeps the
/// units used exactly as the core does, with the same TTLs.
#[test]
fn changed_params_decide_like_the_core() {
    let redis = RefCell::new(Redis::start());
    for algorithm in Algorithm::ALL {
        let strategy = (
            proptest::array::uniform3(params(algorithm)),
            start(),
            steps(1..40),
            proptest::collection::vec(0..3usize, 40),
        );
        check(
            &redis,
            64,
            strategy,
            |redis, (by_step, start, steps, picks)| {
                let key = fresh_key(algorithm.name());
                let mut reference = Reference::default();
                let mut now = start;
                for (step, pick) in steps.iter().zip(picks) {
                    let params = by_step[pick];
                    now = step_clock(now, step.advance(params.period_micros()));
                    let charge = [Charge::new(&key, params, step.cost(params.capacity()))];
                    both(redis, &mut reference, &charge, now, true, &[&key])?;
                }
                Ok(())
            },
        );
    }
}

/// Every algorithm's params, then a second variant of each (keys that switch params: a reload
/// tightening or loosening a live key's limit, burst or period). See
/// `multi_charge_calls_are_all_or_nothing`.
fn params_by_algorithm() -> impl Strategy<Value = Vec<Params>> {
    (Algorithm::ALL.map(params), Algorithm::ALL.map(params)).prop_map(|(main, variants)| {
        let mut all = main.to_vec();
        all.extend(variants);
        all
    })
}

/// One call of up to three charges on three keys.
#[derive(Debug, Clone)]
struct Call {
    picks: Vec<(usize, u8, (u8, u64), bool)>, // key, algorithm draw, cost draw, enforce
    advance: (u8, u64),
    commit: bool,
}

impl Call {
    fn strategy() -> impl Strategy<Value = Call> {
        (
            proptest::collection::vec(
                (
                    0..3usize,
                    any::<u8>(),
                    (any::<u8>(), any::<u64>()),
                    prop::bool::weighted(0.8),
                ),
                1..4,
            ),
            (any::<u8>(), any::<u64>()),
            prop::bool::weighted(0.85),
        )
            .prop_map(|(picks, advance, commit)| Call {
                picks,
                advance,
                commit,
            })
    }

    /// The charges, on `keys`; key `k` mostly uses its home algorithm `homes[k]`.
    fn charges(&self, keys: &[String], homes: &[usize; 3], by_algorithm: &[Params]) -> Vec<Charge> {
        self.picks
            .iter()
            .map(|&(k, algorithm, cost, enforce)| {
                // Mostly the key's own algorithm, under its params or their variant (a reload
                // changed them); sometimes another one (a policy switch).
                let a = if algorithm % 8 == 0 {
                    usize::from(algorithm / 8) % by_algorithm.len()
                } else if algorithm % 8 < 3 {
                    homes[k] + Algorithm::ALL.len()
                } else {
                    homes[k]
                };
                let params = by_algorithm[a];
                let step = Step {
                    advance: (0, 0),
                    cost,
                };
                Charge {
                    key: keys[k].clone(),
                    params,
                    cost: step.cost(params.capacity()),
                    enforce,
                    flagged_as_is: false,
                }
            })
            .collect()
    }

    /// The clock after this call's advance from `now`.
    fn at(&self, now: u64, charges: &[Charge]) -> u64 {
        let step = Step {
            advance: self.advance,
            cost: (0, 0),
        };
        step_clock(now, step.advance(charges[0].params.period_micros()))
    }
}

/// Several limits per call: all-or-nothing, shadow (`enforce = 0`) charges, the same key twice
/// in one call, decide-only calls, keys that switch algorithm (a policy reload), including
/// between the hash and the ZSET layouts, and keys whose params change between calls (every
/// algorithm has a second variant).
#[test]
fn multi_charge_calls_are_all_or_nothing() {
    let redis = RefCell::new(Redis::start());
    let strategy = (
        params_by_algorithm(),
        proptest::array::uniform3(0..6usize),
        start(),
        proptest::collection::vec(Call::strategy(), 1..25),
    );
    check(
        &redis,
        64,
        strategy,
        |redis, (by_algorithm, homes, start, calls)| {
            let keys: Vec<String> = (0..3).map(|_| fresh_key("multi")).collect();
            let watch: Vec<&str> = keys.iter().map(String::as_str).collect();
            let mut reference = Reference::default();
            let mut now = start;
            for call in &calls {
                let charges = call.charges(&keys, &homes, &by_algorithm);
                now = call.at(now, &charges);
                both(redis, &mut reference, &charges, now, call.commit, &watch)?;
            }
            Ok(())
        },
    );
}

/// DECIDE_BATCH (the coalescer's script) answers each request of a batch exactly as DECIDE
/// calls back to back at the batch's instant would, and leaves the same state and TTLs.
#[test]
fn batches_decide_like_calls_back_to_back() {
    let redis = RefCell::new(Redis::start());
    let strategy = (
        params_by_algorithm(),
        proptest::array::uniform3(0..6usize),
        start(),
        proptest::collection::vec(proptest::collection::vec(Call::strategy(), 1..8), 1..8),
    );
    check(
        &redis,
        48,
        strategy,
        |redis, (by_algorithm, homes, start, batches)| {
            let keys: Vec<String> = (0..3).map(|_| fresh_key("batch")).collect();
            let watch: Vec<&str> = keys.iter().map(String::as_str).collect();
            let mut reference = Reference::default();
            let mut now = start;
            for batch in &batches {
                let requests: Vec<(Vec<Charge>, bool)> = batch
                    .iter()
                    .map(|call| (call.charges(&keys, &homes, &by_algorithm), call.commit))
                    .collect();
                now = batch[0].at(now, &requests[0].0);
                let got = redis.decide_batch(&requests, now);
                for ((charges, commit), got) in requests.iter().zip(got) {
                    let expected = reference.decide(charges, now, *commit);
                    prop_assert_eq!(got, Ok(expected), "charges {:?}", charges);
                }
                redis.check_ttls(&reference, &watch)?;
            }
            Ok(())
        },
    );
}

/// A request of a batch that meets a foreign value fails alone: it writes nothing, and the
/// requests before and after it are decided and committed as usual.
#[test]
fn a_failing_request_does_not_fail_its_batch() {
    let mut redis = Redis::start();
    let now = BASE + 987_654_321;
    let mut reference = Reference::default();
    for algorithm in Algorithm::ALL {
        let params = Params::new(algorithm, 2, Duration::from_secs(1), None).unwrap();
        let (key, foreign) = (fresh_key("around"), fresh_key("foreign"));
        let _: () = redis.cmd(&["SET", &foreign, "x"]);
        let one = || vec![Charge::new(&key, params, 1)];
        let both_keys = vec![
            Charge::new(&key, params, 1),
            Charge::new(&foreign, params, 1),
        ];
        let requests = [
            (one(), true),
            (both_keys, true),
            (one(), true),
            (one(), true),
        ];
        let got = redis.decide_batch(&requests, now);
        let err = got[1].as_ref().unwrap_err();
        assert!(err.contains("WRONGTYPE"), "{algorithm}: {err}");
        // The others are the calls without the failed one: two admitted, then a denial.
        for i in [0, 2, 3] {
            let expected = reference.decide(&requests[i].0, now, true);
            assert_eq!(got[i], Ok(expected), "{algorithm}, request {i}");
        }
        assert_eq!(
            got[3].as_ref().map(|a| a.admitted),
            Ok(false),
            "{algorithm}"
        );
        let value: String = redis.cmd(&["GET", &foreign]);
        assert_eq!(value, "x");
    }
}

/// The function library keeps its reply array from call to call: a batch after a longer one,
/// or a late one after it, answers its own requests and nothing more.
#[test]
fn a_batch_after_a_longer_one_answers_only_its_own() {
    let mut redis = Redis::start();
    let params = Params::new(Algorithm::FixedWindow, 100, Duration::from_secs(1), None).unwrap();
    let key = fresh_key("shorter");
    let charge = [Charge::new(&key, params, 1)];
    let mut fcall = |now: String, requests: usize| -> Vec<Value> {
        let mut text = Vec::new();
        batch_request_arg(&mut text, true, [charge[0].script_args()].iter());
        redis::cmd("FCALL")
            .arg(&decide_batch_library().function)
            .arg(requests)
            .arg(vec![&key; requests])
            .arg(now)
            .arg(vec![&text; requests])
            .query(&mut redis.con)
            .unwrap()
    };
    let now = BASE + 5_000_000;
    // The call's now, then each allowed charge's short form (-2, remaining, reset, charged).
    assert_eq!(fcall(now.to_string(), 5).len(), 1 + 5 * 4);
    let reply = fcall(now.to_string(), 2);
    assert_eq!(reply.len(), 1 + 2 * 4, "{reply:?}");
    assert_eq!(
        reply[1 + 4..1 + 4 + 2],
        [Value::Int(-2), Value::Int(100 - 7)],
        "the seventh charge of the window"
    );
    let late = fcall("<1".to_owned(), 1);
    assert_eq!(late.len(), 3, "{late:?}");
    assert_eq!(late[1], Value::Int(-1));
}

/// The function library keeps each request text's words and plan, and the numbers and texts it
/// parsed, from call to call, but bounded: 40,000 distinct request texts (a limit each, as
/// many rules or per-tenant overrides would send) leave its Lua memory where 4,000 left it,
/// within a few megabytes, and every decision right.
#[test]
fn the_librarys_caches_stay_bounded() {
    let mut redis = Redis::start();
    let function = decide_batch_library().function.clone();
    let mut texts_sent = 0u64;
    let mut send = |redis: &mut Redis, texts: u64| {
        for _ in 0..texts / 100 {
            let (mut keys, mut args) = (Vec::new(), Vec::new());
            for _ in 0..100 {
                texts_sent += 1;
                let limit = 1_000 + texts_sent;
                let params =
                    Params::new(Algorithm::FixedWindow, limit, Duration::from_secs(60), None)
                        .unwrap();
                let charge = Charge::new(&format!("bounded-{}", texts_sent % 500), params, 1);
                let mut text = Vec::new();
                batch_request_arg(&mut text, true, [charge.script_args()].iter());
                keys.push(charge.key);
                args.push(text);
            }
            let reply: Vec<Value> = redis::cmd("FCALL")
                .arg(&function)
                .arg(keys.len())
                .arg(&keys)
                .arg(BASE + texts_sent)
                .arg(&args)
                .query(&mut redis.con)
                .unwrap();
            // The call's now, then every charge allowed, in its short form.
            assert_eq!(
                reply.len(),
                1 + 4 * 100,
                "{:?}",
                &reply[..9.min(reply.len())]
            );
            assert!(reply[1..].chunks(4).all(|r| r[0] == Value::Int(-2)));
        }
    };
    let lua_memory = |redis: &mut Redis| -> u64 {
        let info: String = redis.cmd(&["INFO", "memory"]);
        let field = "used_memory_vm_functions:";
        let line = info.lines().find(|l| l.starts_with(field)).unwrap();
        line[field.len()..].trim().parse().unwrap()
    };
    send(&mut redis, 4_000);
    let after_4k = lua_memory(&mut redis);
    send(&mut redis, 36_000);
    let after_40k = lua_memory(&mut redis);
    assert!(
        after_40k < 8 << 20 && after_40k < after_4k + (4 << 20),
        "Lua memory after 4,000 texts {after_4k} B, after 40,000 {after_40k} B"
    );
}

/// Charge then refund at the same instant, nothing in between: every later decision is the one
/// a key that never saw the charge gets. The charge comes at the latest instant seen so far: a
/// charge behind the clock can land where a refund at its instant does not look (a window
/// algorithm a window behind its state charges the stored window), and there refunds are only
/// conservative.
#[test]
fn refund_undoes_a_charge_exactly() {
    let redis = RefCell::new(Redis::start());
    for algorithm in Algorithm::ALL {
        let strategy = (
            params(algorithm),
            start(),
            steps(0..20),
            (any::<u8>(), any::<u64>()),
            steps(1..15),
        );
        check(
            &redis,
            48,
            strategy,
            |redis, (params, start, before, refunded, after)| {
                let charged = fresh_key("refund");
                let untouched = fresh_key("control");
                let mut with_charge = Reference::default();
                let mut without = Reference::default();
                let (mut now, mut latest) = (start, start);
                for step in &before {
                    now = step_clock(now, step.advance(params.period_micros()));
                    latest = latest.max(now);
                    let cost = step.cost(params.capacity());
                    both(
                        redis,
                        &mut with_charge,
                        &[Charge::new(&charged, params, cost)],
                        now,
                        true,
                        &[&charged],
                    )?;
                    both(
                        redis,
                        &mut without,
                        &[Charge::new(&untouched, params, cost)],
                        now,
                        true,
                        &[&untouched],
                    )?;
                }
                now = latest;
                let step = Step {
                    advance: (0, 0),
                    cost: refunded,
                };
                let charge = [Charge::new(
                    &charged,
                    params,
                    step.cost(params.capacity()).max(1),
                )];
                let answer = both(redis, &mut with_charge, &charge, now, true, &[&charged])?;
                if answer.admitted {
                    // What the script says it took (all of the cost, or what was left when the
                    // limit charges up to itself): what `Store::run_refund` gives back.
                    let taken = u64::try_from(answer.decisions[0][5]).unwrap();
                    let charge = [Charge::new(&charged, params, taken)];
                    let count = redis
                        .refund(&charge, now)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(count, with_charge.refund(&charge, now), "refunded keys");
                    prop_assert_eq!(count, 1);
                    redis.check_ttls(&with_charge, &[&charged])?;
                }
                // From here on, the refunded key answers like the key that never saw the charge.
                for step in &after {
                    now = step_clock(now, step.advance(params.period_micros()).max(0));
                    let cost = step.cost(params.capacity());
                    let a = both(
                        redis,
                        &mut with_charge,
                        &[Charge::new(&charged, params, cost)],
                        now,
                        true,
                        &[&charged],
                    )?;
                    let b = both(
                        redis,
                        &mut without,
                        &[Charge::new(&untouched, params, cost)],
                        now,
                        true,
                        &[&untouched],
                    )?;
                    prop_assert_eq!(a, b, "refunded key and control differ");
                }
                Ok(())
            },
        );
    }
}

/// Refunds that come late (other charges in between, the clock moved on or back) follow the
/// conservative contract, as the Rust reference of it says; repeated keys in one refund too.
#[test]
fn late_refunds_follow_the_contract() {
    let redis = RefCell::new(Redis::start());
    for algorithm in Algorithm::ALL {
        let strategy = (
            params(algorithm),
            start(),
            steps(1..40),
            proptest::collection::vec(any::<u8>(), 40),
        );
        check(
            &redis,
            48,
            strategy,
            |redis, (params, start, steps, refunds)| {
                let key = fresh_key("late");
                let mut reference = Reference::default();
                let mut charged: Vec<(u64, u64)> = Vec::new(); // (now, cost) of allowed charges
                let mut now = start;
                for (step, refund) in steps.iter().zip(&refunds) {
                    now = step_clock(now, step.advance(params.period_micros()));
                    let charge = [Charge::new(&key, params, step.cost(params.capacity()))];
                    let answer = both(redis, &mut reference, &charge, now, true, &[&key])?;
                    let taken = u64::try_from(answer.decisions[0][5]).unwrap();
                    if answer.admitted && taken > 0 {
                        charged.push((now, taken));
                    }
                    if refund % 3 == 0 && !charged.is_empty() {
                        // Refund one of the last few charges, sometimes twice in one call.
                        let (at, cost) = charged.remove(
                            charged.len() - 1 - usize::from(refund / 3) % charged.len().min(3),
                        );
                        let twice = refund % 2 == 0;
                        let mut refunds = vec![Charge::new(&key, params, cost)];
                        if twice {
                            refunds.push(Charge::new(&key, params, cost / 2 + 1));
                        }
                        let expected = reference.refund(&refunds, at);
                        let got = redis
                            .refund(&refunds, at)
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                        prop_assert_eq!(got, expected, "refunded keys");
                        redis.check_ttls(&reference, &[&key])?;
                    }
                }
                Ok(())
            },
        );
    }
}

/// A key of a foreign Redis type fails the call before anything is written, wherever it is
/// among the call's keys, for both layouts; REFUND too.
#[test]
fn foreign_types_fail_without_writing() {
    let mut redis = Redis::start();
    let now = BASE + 123_456_789;
    let gcra = Params::new(Algorithm::Gcra, 5, Duration::from_secs(1), None).unwrap();
    let log = Params::new(Algorithm::SlidingWindowLog, 5, Duration::from_secs(1), None).unwrap();
    let window = Params::new(Algorithm::FixedWindow, 5, Duration::from_secs(1), None).unwrap();
    for (foreign, setup) in [
        ("string", &["SET", "{f}:foreign", "x"][..]),
        ("list", &["RPUSH", "{f}:foreign", "x"][..]),
        ("set", &["SADD", "{f}:foreign", "x"][..]),
    ] {
        for params in [gcra, log, window] {
            for foreign_first in [false, true] {
                let _: i64 = redis.cmd(&["DEL", "{f}:a", "{f}:b", "{f}:foreign"]);
                let _: Value = redis.cmd(setup);
                // {f}:a holds state already; {f}:b does not exist.
                redis
                    .decide(&[Charge::new("{f}:a", params, 1)], Some(now), true)
                    .unwrap();
                let watch = ["{f}:a", "{f}:b", "{f}:foreign"];
                let before = redis.snapshot(&watch);
                let mut charges = vec![
                    Charge::new("{f}:a", params, 1),
                    Charge::new("{f}:b", log, 1),
                ];
                let foreign_charge = Charge::new("{f}:foreign", params, 1);
                if foreign_first {
                    charges.insert(0, foreign_charge.clone());
                } else {
                    charges.push(foreign_charge.clone());
                }
                let err = redis.decide(&charges, Some(now + 1), true).unwrap_err();
                assert!(
                    err.to_string().contains("WRONGTYPE"),
                    "{foreign} at a {} key: {err}",
                    params.algorithm()
                );
                assert_eq!(
                    redis.snapshot(&watch),
                    before,
                    "{foreign}, {}",
                    params.algorithm()
                );
                let err = redis.refund(&charges, now).unwrap_err();
                assert!(err.to_string().contains("WRONGTYPE"), "refund: {err}");
                assert_eq!(redis.snapshot(&watch), before, "refund wrote");
            }
        }
    }
}

/// Decide-only calls (`ARGV[1] = "0"`) never write, even when every charge is allowed and the
/// keys do not exist yet.
#[test]
fn decide_only_never_writes() {
    let mut redis = Redis::start();
    let now = BASE + 42;
    for algorithm in Algorithm::ALL {
        let params = Params::new(algorithm, 3, Duration::from_millis(10), None).unwrap();
        let fresh = fresh_key("only");
        let used = fresh_key("only");
        redis
            .decide(&[Charge::new(&used, params, 1)], Some(now), true)
            .unwrap();
        let watch = [fresh.as_str(), used.as_str()];
        let before = redis.snapshot(&watch);
        for cost in [1, 2, 3] {
            let charges = [
                Charge::new(&fresh, params, cost),
                Charge::new(&used, params, 1),
            ];
            let answer = redis.decide(&charges, Some(now + 5), false).unwrap();
            assert!(answer.admitted, "{algorithm}");
            assert_eq!(redis.snapshot(&watch), before, "{algorithm}");
        }
        assert_eq!(before[0], (Value::Nil, -2), "{algorithm}");
    }
}

/// With `ARGV[2] = ""` the script reads the server's TIME.
#[test]
fn unpinned_calls_use_the_server_clock() {
    let mut redis = Redis::start();
    let params = Params::new(Algorithm::TokenBucket, 3, Duration::from_secs(60), None).unwrap();
    let key = fresh_key("time");
    let answer = redis
        .decide(&[Charge::new(&key, params, 1)], None, true)
        .unwrap();
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(&mut redis.con).unwrap();
    let server_now = seconds * 1_000_000 + micros;
    assert!(
        answer.now <= server_now && server_now - answer.now < 5_000_000,
        "{answer:?}"
    );
    assert_eq!(answer.decisions, vec![[0, 2, 20_000_000, -1, 0, 1]]);
    let ttl: i64 = redis.cmd(&["PTTL", &key]);
    assert!((19_000..=20_001).contains(&ttl), "PTTL {ttl}");
}

/// `now = "<D"`: the server's TIME, and a call that runs after server instant `D` (its caller
/// has given up on it) writes nothing and answers the late error, in DECIDE and for every
/// request of a DECIDE_BATCH; before `D` it decides as usual.
#[test]
fn a_call_run_after_its_last_instant_writes_nothing() {
    let mut redis = Redis::start();
    let params = Params::new(Algorithm::FixedWindow, 3, Duration::from_secs(60), None).unwrap();
    let key = fresh_key("late");
    let charge = || vec![Charge::new(&key, params, 1)];
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(&mut redis.con).unwrap();
    let server_now = seconds * 1_000_000 + micros;
    let past = format!("<{}", server_now - 1);
    let future = format!("<{}", server_now + 60_000_000);

    let late = redis.decide_at(&charge(), past.clone(), true).unwrap_err();
    assert!(late.to_string().contains("tollgate: late"), "{late}");
    let batch = redis.decide_batch_at(&[(charge(), true), (charge(), true)], past);
    for reply in &batch {
        let message = reply.as_ref().unwrap_err();
        assert!(message.contains("tollgate: late"), "{message}");
    }
    let exists: i64 = redis.cmd(&["EXISTS", &key]);
    assert_eq!(exists, 0, "late calls wrote nothing");

    let answer = redis.decide_at(&charge(), future.clone(), true).unwrap();
    assert!(answer.admitted);
    assert!(answer.now >= server_now, "the server's clock: {answer:?}");
    let batch = redis.decide_batch_at(&[(charge(), true)], future);
    assert_eq!(
        batch[0].as_ref().unwrap().decisions[0][1],
        1,
        "3 - 2 charged"
    );
    let malformed = redis
        .decide_at(&charge(), "<soon".into(), true)
        .unwrap_err();
    assert!(malformed.to_string().contains("now must be"), "{malformed}");
}

/// Bad arguments are errors, not decisions.
#[test]
fn bad_arguments_are_errors() {
    let mut redis = Redis::start();
    let params = Params::new(Algorithm::Gcra, 3, Duration::from_secs(1), None).unwrap();
    let charge = [Charge::new("bad", params, 1)];
    for now in [MAX_NOW_MICROS, u64::MAX] {
        let err = redis.decide(&charge, Some(now), true).unwrap_err();
        assert!(err.to_string().contains("now must be"), "{err}");
    }
    let err: redis::RedisError = redis::cmd("EVAL")
        .arg(DECIDE_SCRIPT)
        .arg(1)
        .arg("bad")
        .arg("1")
        .arg(BASE)
        .arg(9)
        .arg(3)
        .arg(1_000_000)
        .arg(3)
        .arg(1)
        .arg("1")
        .query::<Value>(&mut redis.con)
        .unwrap_err();
    assert!(err.to_string().contains("unknown algorithm"), "{err}");
}

/// The sliding log's running sums are rewritten from 0 once they pass 2^50, and a log written
/// by hand in the documented layout decides like the same entries in the core.
#[test]
fn sliding_log_rebases_its_running_sums() {
    let mut redis = Redis::start();
    let params = Params::new(
        Algorithm::SlidingWindowLog,
        10,
        Duration::from_secs(1),
        None,
    )
    .unwrap();
    let key = fresh_key("rebase");
    let now = BASE + 5_000_000;
    let start = (1u64 << 50) - 3;
    // (time, cost): one expired, three live.
    let entries = [
        (now - 1_500_000, 2),
        (now - 900_000, 1),
        (now - 500_000, 3),
        (now - 1, 1),
    ];
    let mut s = start;
    for (time, cost) in entries {
        let member = format!("{s:016}:{cost}");
        let _: i64 = redis.cmd(&["ZADD", &key, &time.to_string(), &member]);
        s += cost;
    }
    let _: i64 = redis.cmd(&["PEXPIREAT", &key, &((now + 1_000_000) / 1000).to_string()]);
    let mut reference = Reference::default();
    let state = State::SlidingWindowLog {
        log: SlidingLog::from_entries(entries.iter().map(|&(t, c)| (Timestamp::from_micros(t), c))),
    };
    let expires = state.expires_at(&params);
    reference.states.insert(key.clone(), (state, expires));
    let mut now = now;
    for (advance, cost) in [
        (0, 4),
        (0, 2),
        (1, 1),
        (100_000, 3),
        (400_000, 3),
        (1_000_000, 10),
    ] {
        now += advance;
        let charge = [Charge::new(&key, params, cost)];
        both(&mut redis, &mut reference, &charge, now, true, &[&key]).unwrap();
        let members: Vec<String> = redis.cmd(&["ZRANGE", &key, "0", "-1"]);
        let first: u64 = members[0][..16].parse().unwrap();
        assert!(first < 100, "running sums not rebased: {members:?}");
    }
}

/// `muldivmod`, `divmod` and `div_ceil` of `exact.lua` against u128, at and near every bound.
#[test]
fn exact_arithmetic_matches_u128() {
    let redis = RefCell::new(Redis::start());
    const TWO53: u64 = 1 << 53;
    const BODY: &str = "
exact_begin(KEYS)
local out = {}
for i = 1, #ARGV, 3 do
  local a, b, m = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local q, r = muldivmod(a, b, m)
  local q2, r2 = divmod(a, m)
  out[#out + 1] = int(q) .. ' ' .. int(r) .. ' ' .. int(q2) .. ' ' .. int(r2) .. ' ' .. int(div_ceil(a, m))
end
return out";
    let script = Script::new(&format!(
        "{}{BODY}",
        include_str!("../../src/store/redis/lua/exact.lua")
    ));
    let special = |max: u64| {
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(2),
            Just(max),
            Just(max - 1),
            Just(max / 2 + 1),
            (1..=max),
            (0..=1_000u64),
        ]
    };
    let modulus = prop_oneof![
        Just(1u64),
        Just(3),
        Just(1_000_000_000_000),
        Just(MAX_PERIOD_US),
        Just(1u64 << 46),
        Just((1u64 << 46) - 1),
        1..=(1u64 << 46),
        1..=1_000_000u64,
    ];
    let triple = (special(TWO53 - 1), special(TWO53 - 1), modulus);
    check(
        &redis,
        64,
        proptest::collection::vec(triple, 64),
        |redis, triples| {
            let mut call = script.prepare_invoke();
            let mut kept = Vec::new();
            for (a, b, m) in triples {
                // The contract: a quotient below 2^53 (and so is every dividend here).
                if u128::from(a) * u128::from(b) / u128::from(m) >= u128::from(TWO53) {
                    continue;
                }
                call.arg(a).arg(b).arg(m);
                kept.push((a, b, m));
            }
            if kept.is_empty() {
                return Ok(());
            }
            let lines: Vec<String> = call.invoke(&mut redis.con).unwrap();
            prop_assert_eq!(lines.len(), kept.len());
            for ((a, b, m), line) in kept.into_iter().zip(lines) {
                let product = u128::from(a) * u128::from(b);
                let (m128, a128) = (u128::from(m), u128::from(a));
                let want = format!(
                    "{} {} {} {} {}",
                    product / m128,
                    product % m128,
                    a128 / m128,
                    a128 % m128,
                    a128.div_ceil(m128)
                );
                prop_assert_eq!(line, want, "muldivmod({}, {}, {})", a, b, m);
            }
            Ok(())
        },
    );
}

/// Redis's count of calls of `command` since the last `CONFIG RESETSTAT`.
fn calls(redis: &mut Redis, command: &str) -> u64 {
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// A write that leaves a key's expiry where it was sends no PEXPIREAT and writes only the
/// fields whose text changed: a count within its window is one field; a window hash written
/// before `p` was recorded still gets its TTL set, and its `p`.
#[test]
fn a_count_within_its_window_writes_only_the_count() {
    let mut redis = Redis::start();
    let minute = Duration::from_secs(60);
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let params = Params::new(algorithm, 10, minute, None).unwrap();
        let key = fresh_key("within");
        let charge = Charge::new(&key, params, 1);
        redis
            .decide(std::slice::from_ref(&charge), Some(BASE + 1_000), true)
            .unwrap();
        let expiry: i64 = redis.cmd(&["PEXPIRETIME", &key]);
        let _: () = redis.cmd(&["CONFIG", "RESETSTAT"]);
        let answer = redis
            .decide(std::slice::from_ref(&charge), Some(BASE + 2_000), true)
            .unwrap();
        assert_eq!(answer.decisions[0][..2], [0, 8], "{algorithm:?}");
        assert_eq!(calls(&mut redis, "pexpireat"), 0, "{algorithm:?}");
        assert_eq!(calls(&mut redis, "hset"), 1, "{algorithm:?}");
        let fields: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&key)
            .query(&mut redis.con)
            .unwrap();
        assert_eq!(
            fields.get("y").map(String::as_str),
            Some("2"),
            "{algorithm:?}"
        );
        assert_eq!(
            fields.get("p").map(String::as_str),
            Some("60000000"),
            "{algorithm:?}"
        );
        assert_eq!(
            redis.cmd::<i64>(&["PEXPIRETIME", &key]),
            expiry,
            "{algorithm:?}"
        );

        // As an older version left it: no `p`, and a TTL that is not the state's.
        let _: () = redis.cmd(&["HDEL", &key, "p"]);
        let _: () = redis.cmd(&["PEXPIREAT", &key, &(expiry + 5_000).to_string()]);
        redis.decide(&[charge], Some(BASE + 3_000), true).unwrap();
        assert_eq!(
            redis.cmd::<i64>(&["PEXPIRETIME", &key]),
            expiry,
            "{algorithm:?}"
        );
        let p: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg("p")
            .query(&mut redis.con)
            .unwrap();
        assert_eq!(p.as_deref(), Some("60000000"), "{algorithm:?}");
    }
}
