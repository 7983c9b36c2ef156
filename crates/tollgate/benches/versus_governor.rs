//! `Limiter::check` beside governor's keyed `check_key`, in the same run: nanoseconds per
//! decision on one thread and on two threads deciding on the same limiter, and the ratio.
//!
//! `cargo bench -p tollgate --bench versus_governor`
//!
//! Both sides decide 1000 warm keys in turn (30-byte values), every decision allowed, on a
//! fake clock advanced 1 ms per decision: tollgate one descriptor on the memory store, a fixed
//! window of 10 a second; governor a `DashMap` keyed limiter (its default hasher, SipHash, as
//! the memory store's) of `Quota::per_second(10)`, keyed by the value's `String`. With two
//! threads each takes half of the iterations, starting half the keys apart, and the figure is
//! the wall time over all decisions (the inverse of their joint throughput).
//!
//! After criterion's own report the bench prints, per case, the median over criterion's
//! samples of nanoseconds per decision, and tollgate's over governor's (warm-up calls of fewer
//! than 100 iterations left out).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Wall time of the bench itself, not of the code under test.
#![allow(clippy::disallowed_methods)]

mod support;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use tollgate::clock::ManualClock;
use tollgate::limiter::{CheckRequest, Limiter};
use tollgate_core::Algorithm;

const KEYS: usize = 1000;

type Governor = RateLimiter<
    String,
    governor::state::keyed::DashMapStateStore<String>,
    FakeRelativeClock,
    governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
>;

/// Per case (`tollgate/1`, `governor/2`...): criterion's samples as (iterations, time).
static SAMPLES: Mutex<Vec<(String, u64, Duration)>> = Mutex::new(Vec::new());

fn record(case: &str, iters: u64, took: Duration) -> Duration {
    SAMPLES.lock().unwrap().push((case.to_owned(), iters, took));
    took
}

struct Tollgate {
    clock: std::sync::Arc<ManualClock>,
    limiter: Limiter,
    requests: Vec<CheckRequest>,
}

impl Tollgate {
    fn new() -> Self {
        let (clock, limiter) = support::limiter(Algorithm::FixedWindow, 10, "1s");
        let requests: Vec<_> = (0..KEYS).map(support::request).collect();
        for r in &requests {
            assert!(support::ready(limiter.check(r)).unwrap().allowed());
        }
        Tollgate {
            clock,
            limiter,
            requests,
        }
    }

    /// `iters` decisions from key `from` on.
    fn run(&self, from: usize, iters: u64) {
        let mut n = from;
        for _ in 0..iters {
            self.clock.advance(Duration::from_millis(1));
            n = (n + 1) % KEYS;
            let response = support::ready(self.limiter.check(&self.requests[n])).unwrap();
            assert!(response.allowed());
            black_box(response);
        }
    }
}

struct Gov {
    clock: FakeRelativeClock,
    refused: AtomicUsize,
    limiter: Governor,
    keys: Vec<String>,
}

impl Gov {
    fn new() -> Self {
        let clock = FakeRelativeClock::default();
        let quota = Quota::per_second(NonZeroU32::new(10).unwrap());
        let limiter = RateLimiter::dashmap_with_clock(quota, clock.clone());
        let keys: Vec<String> = (0..KEYS)
            .map(|n| format!("{n:0width$}", width = support::VALUE_LEN))
            .collect();
        for k in &keys {
            assert!(limiter.check_key(k).is_ok());
        }
        Gov {
            clock,
            refused: AtomicUsize::new(0),
            limiter,
            keys,
        }
    }

    fn run(&self, from: usize, iters: u64) {
        let mut n = from;
        for _ in 0..iters {
            self.clock.advance(Duration::from_millis(1));
            n = (n + 1) % KEYS;
            let answer = self.limiter.check_key(black_box(&self.keys[n]));
            // Counted, not asserted: with two threads governor denies a few (not understood
            // yet; its fake clock is shared and advanced by both), at about the same cost.
            if answer.is_err() {
                self.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Where the next call's decisions start among the keys: calls go on where the last one
/// stopped, so each key keeps seeing one request a simulated second.
fn next_keys(cursor: &AtomicUsize, iters: u64) -> usize {
    let step = usize::try_from(iters % KEYS as u64).unwrap_or(0);
    cursor.fetch_add(step, Ordering::Relaxed) % KEYS
}

/// `iters` decisions split over two threads released together; the longer thread's time.
fn two_threads(iters: u64, from: usize, run: impl Fn(usize, u64) + Sync) -> Duration {
    let barrier = Barrier::new(2);
    let halves = [iters.div_ceil(2), iters / 2];
    std::thread::scope(|s| {
        let handles: Vec<_> = halves
            .iter()
            .enumerate()
            .map(|(t, &half)| {
                let (barrier, run) = (&barrier, &run);
                s.spawn(move || {
                    barrier.wait();
                    let started = Instant::now();
                    run(from + t * KEYS / 2, half);
                    started.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap_or_default()
    })
}

fn versus_governor(c: &mut Criterion) {
    let (tollgate, gov) = (Tollgate::new(), Gov::new());
    let cursors = [AtomicUsize::new(0), AtomicUsize::new(0)];
    let mut group = c.benchmark_group("versus_governor");
    group.throughput(Throughput::Elements(1));
    group.bench_function("tollgate/1", |b| {
        b.iter_custom(|iters| {
            let started = Instant::now();
            tollgate.run(next_keys(&cursors[0], iters), iters);
            record("tollgate/1", iters, started.elapsed())
        })
    });
    group.bench_function("governor/1", |b| {
        b.iter_custom(|iters| {
            let started = Instant::now();
            gov.run(next_keys(&cursors[1], iters), iters);
            record("governor/1", iters, started.elapsed())
        })
    });
    group.bench_function("tollgate/2", |b| {
        b.iter_custom(|iters| {
            let from = next_keys(&cursors[0], iters.div_ceil(2));
            let took = two_threads(iters, from, |from, n| tollgate.run(from, n));
            record("tollgate/2", iters, took)
        })
    });
    group.bench_function("governor/2", |b| {
        b.iter_custom(|iters| {
            let from = next_keys(&cursors[1], iters.div_ceil(2));
            let took = two_threads(iters, from, |from, n| gov.run(from, n));
            record("governor/2", iters, took)
        })
    });
    group.finish();
    println!(
        "versus_governor: governor refused {} of its decisions",
        gov.refused.load(Ordering::Relaxed)
    );
}

/// Samples of fewer iterations (criterion's first warm-up calls) are left out of the median.
const MIN_ITERS: u64 = 100;

/// The median over `case`'s samples of nanoseconds per decision.
fn median_ns(samples: &[(String, u64, Duration)], case: &str) -> Option<f64> {
    let mut per: Vec<f64> = samples
        .iter()
        .filter(|(c, iters, _)| c == case && *iters >= MIN_ITERS)
        .map(|(_, iters, took)| took.as_nanos() as f64 / *iters as f64)
        .collect();
    per.sort_by(f64::total_cmp);
    per.get(per.len() / 2).copied()
}

fn report() {
    let samples = SAMPLES.lock().unwrap();
    println!("versus_governor: median ns per decision over criterion's samples");
    for threads in [1, 2] {
        let tollgate = median_ns(&samples, &format!("tollgate/{threads}"));
        let governor = median_ns(&samples, &format!("governor/{threads}"));
        if let (Some(t), Some(g)) = (tollgate, governor) {
            println!(
                "  {threads} thread(s): tollgate {t:.1} ns, governor {g:.1} ns, ratio {:.2}",
                t / g
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50);
    targets = versus_governor
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    report();
}
