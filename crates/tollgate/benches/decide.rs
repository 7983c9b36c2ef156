//! Nanoseconds per decision, per algorithm: `Limiter::check` on the memory store with a 30-byte
//! descriptor value (a 55-byte store key), and the pure `tollgate_core::decide`.
//!
//! `cargo bench -p tollgate --bench decide`
//!
//! Every request is allowed. `limiter_check`: 1000 warm keys are checked in turn while a manual
//! clock advances 1 ms per check, so each key sees one request per simulated second against a
//! limit of 10 per second. `core_decide`: one state, 10 per second, a decision every 100 ms (the
//! sliding log holds 10 entries).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tollgate_core::{Algorithm, Params, State, Timestamp, decide};

const KEYS: usize = 1000;

fn limiter_check(c: &mut Criterion) {
    let mut group = c.benchmark_group("limiter_check");
    group.throughput(Throughput::Elements(1));
    for algorithm in Algorithm::ALL {
        let (clock, limiter) = support::limiter(algorithm, 10, "1s");
        let requests: Vec<_> = (0..KEYS).map(support::request).collect();
        for r in &requests {
            assert!(support::ready(limiter.check(r)).unwrap().allowed());
        }
        let mut n = 0;
        group.bench_function(algorithm.name(), |b| {
            b.iter(|| {
                clock.advance(Duration::from_millis(1));
                n = (n + 1) % KEYS;
                let response = support::ready(limiter.check(&requests[n])).unwrap();
                debug_assert!(response.allowed());
                black_box(response)
            })
        });
    }
    group.finish();
}

fn core_decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("core_decide");
    group.throughput(Throughput::Elements(1));
    for algorithm in Algorithm::ALL {
        let params = Params::new(algorithm, 10, Duration::from_secs(1), None).unwrap();
        let mut state = State::empty(&params);
        let mut now = Timestamp::from_micros(1_700_000_000_000_000);
        group.bench_function(algorithm.name(), |b| {
            b.iter(|| {
                // 100 ms apart at 10 per second: every decision is allowed.
                now = now.saturating_add(Duration::from_millis(100));
                let (decision, transition) = decide(&params, black_box(&state), now, 1);
                state.apply(transition);
                black_box(decision)
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(100);
    targets = limiter_check, core_decide
}
criterion_main!(benches);
