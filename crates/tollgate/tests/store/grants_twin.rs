//! The two stores that grant leases, held to one contract on a real `redis-server`: the same
//! reservations, charges and give-backs, at the same pinned instants, get the same decisions
//! from the memory store (`tollgate_core::refund`) as from the Redis store (the REFUND script),
//! and leave counters that decide alike.
//!
//! Redis drops a key at its TTL by its own wall clock, years before the pinned instants (2033):
//! the driver drops it when the pinned clock passes the key's `PEXPIRETIME`, as Redis would
//! then. The instants are whole milliseconds, so that this is exactly when the memory store
//! forgets the key too (its expiry is in µs, the TTL rounds it up to the next ms). The clock
//! only moves forwards here; `lua_twin.rs` holds REFUND to the core under a clock that steps
//! back too.

// Test code: a broken expectation should panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use tollgate::clock::{Clock, ManualClock};
use tollgate::store::redis::script::fits_lua;
use tollgate::store::{Charge, Grants, MemoryStore, RedisOptions, RedisStore, Store, StoreUrl};
use tollgate_core::{Algorithm, Params, Timestamp};
use tollgate_testkit::RedisServer;

use super::strategies::{config, limit, period};

/// A whole day in 2033, in µs: later than any real clock running these tests.
const BASE: u64 = 23_148 * 86_400_000_000;

/// What the driver does after moving the clock forwards.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// Charge this cost (0: a check).
    Charge(u64),
    /// Reserve this many units, as a lease does.
    Reserve(u64),
    /// Give back part of a reservation made earlier (which one, how much of it).
    GiveBack(usize, u64),
}

#[derive(Debug, Clone)]
struct Case {
    params: Params,
    /// Per step: whole milliseconds to move the clock, then what to do.
    steps: Vec<(u64, Op)>,
}

/// Params both stores decide exactly (a bucket's refill time within what Lua represents).
fn params() -> impl Strategy<Value = Params> {
    let algorithm = proptest::sample::select(Algorithm::ALL.to_vec());
    (algorithm, limit(1_000), period(), 0..3u64).prop_filter_map(
        "refills too slowly for Lua",
        |(algorithm, limit, period, burst)| {
            let burst = match burst {
                _ if !algorithm.uses_burst() => None,
                0 => None,
                1 => Some(1.max(limit / 2)),
                _ => Some(2 * limit),
            };
            let params =
                Params::new(algorithm, limit, Duration::from_micros(period), burst).ok()?;
            fits_lua(&params).is_ok().then_some(params)
        },
    )
}

fn case() -> impl Strategy<Value = Case> {
    params().prop_flat_map(|params| {
        let capacity = params.capacity();
        let period_ms = params.period_micros().div_ceil(1_000);
        let advance = prop_oneof![
            3 => Just(0u64),
            4 => 0..=period_ms.div_ceil(4),
            2 => 0..=2 * period_ms,
        ];
        let cost = prop_oneof![4 => 1..=capacity.min(4), 1 => 0..=capacity];
        let op = prop_oneof![
            3 => cost.clone().prop_map(Op::Charge),
            3 => cost.prop_map(Op::Reserve),
            4 => (any::<usize>(), 1..=capacity).prop_map(|(i, part)| Op::GiveBack(i, part)),
        ];
        proptest::collection::vec((advance, op), 1..24)
            .prop_map(move |steps| Case { params, steps })
    })
}

/// Both stores on one pinned clock, and a plain connection to the Redis one.
struct Twins {
    clock: Arc<ManualClock>,
    memory: MemoryStore,
    redis: RedisStore,
    con: redis::Connection,
}

impl Twins {
    async fn start(server: &RedisServer) -> Self {
        let clock = Arc::new(ManualClock::new(Timestamp::from_micros(BASE)));
        let url: StoreUrl = server.url().parse().unwrap();
        let options = RedisOptions {
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(2),
            max_wait: Duration::from_secs(2),
            ..RedisOptions::default()
        };
        let redis = RedisStore::connect(&url, options, clock.clone())
            .await
            .unwrap()
            .pin_clock(clock.clone());
        let con = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        Twins {
            memory: MemoryStore::new(clock.clone()),
            clock,
            redis,
            con,
        }
    }

    /// Moves the clock `ms` forwards and drops the Redis key of counter `key` (the store's
    /// name for it ends in `:key`) if its TTL has passed.
    fn advance(&mut self, ms: u64, key: &str) {
        self.clock.advance(Duration::from_millis(ms));
        let now_ms = i64::try_from(self.clock.now().as_micros() / 1_000).unwrap();
        let names: Vec<String> = redis::cmd("KEYS")
            .arg(format!("*:{key}"))
            .query(&mut self.con)
            .unwrap();
        for name in names {
            let expires: i64 = redis::cmd("PEXPIRETIME")
                .arg(&name)
                .query(&mut self.con)
                .unwrap();
            if expires >= 0 && expires <= now_ms {
                let _: i64 = redis::cmd("DEL").arg(&name).query(&mut self.con).unwrap();
            }
        }
    }

    /// Runs `case` on a key of its own on both stores.
    async fn run(&mut self, case: &Case, key: &str) -> Result<(), TestCaseError> {
        let params = &case.params;
        let charge = |cost| Charge::new(key.as_bytes(), params, cost);
        // Reservations the stores admitted: units, and the instant both named.
        let mut reserved: Vec<(u64, i64)> = Vec::new();
        for (n, &(ms, op)) in case.steps.iter().enumerate() {
            self.advance(ms, key);
            match op {
                Op::Charge(cost) => {
                    let memory = self.memory.apply(&[charge(cost)]).await.unwrap();
                    let redis = self.redis.apply(&[charge(cost)]).await.unwrap();
                    prop_assert_eq!(memory, redis, "step {}: charge {}", n, cost);
                }
                Op::Reserve(cost) => {
                    let memory = Grants::reserve(&self.memory, charge(cost)).await.unwrap();
                    let redis = Grants::reserve(&self.redis, charge(cost)).await.unwrap();
                    prop_assert_eq!(memory, redis, "step {}: reserve {}", n, cost);
                    if memory.0.is_allowed() && cost > 0 {
                        reserved.push((cost, memory.1));
                    }
                }
                Op::GiveBack(which, part) => {
                    let Some(&(cost, at)) = reserved.get(which % reserved.len().max(1)) else {
                        continue;
                    };
                    let back = charge(part.min(cost));
                    Grants::give_back(&self.memory, back, at).await.unwrap();
                    Grants::give_back(&self.redis, back, at).await.unwrap();
                }
            }
            for cost in [0, 1, params.capacity()] {
                let memory = self.memory.peek(&[charge(cost)]).await.unwrap();
                let redis = self.redis.peek(&[charge(cost)]).await.unwrap();
                prop_assert_eq!(
                    memory,
                    redis,
                    "step {} {:?}: then a look of {}",
                    n,
                    op,
                    cost
                );
            }
        }
        Ok(())
    }
}

/// Any sequence of charges, reservations and give-backs (late, partial, repeated, into a
/// counter made anew since) leaves the two stores deciding alike.
#[test]
fn the_memory_store_gives_back_as_the_redis_store_does() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let twins = RefCell::new(runtime.block_on(Twins::start(&server)));
    let cases = Cell::new(0u64);
    let mut runner = TestRunner::new(config(96, file!()));
    let result = runner.run(&case(), |case| {
        cases.set(cases.get() + 1);
        let key = format!("grants:{}", cases.get());
        let mut twins = twins.borrow_mut();
        // A key of its own, from the same instant (the clock moves up to decades a case).
        twins.clock.set(Timestamp::from_micros(BASE));
        runtime.block_on(twins.run(&case, &key))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
