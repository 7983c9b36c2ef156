//! What runtime overrides in force cost, in paired rounds: `cargo bench -p tollgate --bench
//! overrides` (pin it: `taskset -c 1 target/release/deps/overrides-* --bench`).
//!
//! - **Unrelated traffic.** Two limiters on the memory store, one fixed-window rule: one with
//!   no override, one with 20,000 in force for values the checked keys never carry. Each round
//!   times 20,000 checks of 1,000 warm keys on each, in an order that alternates from round to
//!   round, so a slow spell of a shared machine falls on both; the summary gives the median
//!   and range of the nanoseconds per check, and of the ratio paired round by round.
//! - **Setting them.** 20,000 set one by one (the first and the last 1,000 timed apart: a set
//!   used to copy every override before it), and 20,000 in one `set_all`, per round.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// A bench times itself with the wall clock.
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use tollgate::limiter::{Limiter, Override};
use tollgate_core::{Algorithm, Timestamp};

const IN_FORCE: usize = 20_000;
const KEYS: usize = 1_000;
const CHECKS: usize = 20_000;
const ROUNDS: usize = 21;

fn other(i: usize) -> Override {
    Override {
        id: 0,
        domain: "bench".into(),
        rule: "r".into(),
        entries: vec![("k".into(), format!("other-{i:024}"))],
        requests_per_unit: 1000,
        period: None,
        expires_at: None,
        set_at: Timestamp::from_micros(1_700_000_000_000_000),
        reason: String::new(),
    }
}

/// Nanoseconds per check of `CHECKS` checks on `limiter` (never inlined: callgrind counts the
/// instructions inside it, see `main`).
#[inline(never)]
fn time_checks(
    clock: &tollgate::clock::ManualClock,
    limiter: &Limiter,
    requests: &[tollgate::limiter::CheckRequest],
) -> f64 {
    let start = Instant::now();
    for n in 0..CHECKS {
        clock.advance(Duration::from_millis(1));
        let response = support::ready(limiter.check(&requests[n % KEYS])).unwrap();
        assert!(response.allowed());
        std::hint::black_box(response);
    }
    start.elapsed().as_nanos() as f64 / CHECKS as f64
}

/// `(median, min, max)`.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

fn main() {
    // `cargo test --benches` runs each bench once as a test: nothing to measure then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let requests: Vec<_> = (0..KEYS).map(support::request).collect();
    // Under callgrind, for instructions per check: `OVERRIDES_IN_FORCE=0` or `20000` runs
    // 2 x 20,000 checks of one limiter and nothing else (see docs/benchmarks.md).
    if let Ok(n) = std::env::var("OVERRIDES_IN_FORCE") {
        let (clock, limiter) = support::limiter(Algorithm::FixedWindow, 10, "1s");
        let n: usize = n.parse().unwrap();
        if n > 0 {
            limiter
                .overrides()
                .set_all((0..n).map(other).collect())
                .unwrap();
        }
        time_checks(&clock, &limiter, &requests);
        time_checks(&clock, &limiter, &requests);
        return;
    }
    let (none_clock, none) = support::limiter(Algorithm::FixedWindow, 10, "1s");
    let (many_clock, many) = support::limiter(Algorithm::FixedWindow, 10, "1s");
    many.overrides()
        .set_all((0..IN_FORCE).map(other).collect())
        .unwrap();
    assert_eq!(many.overrides().len(), IN_FORCE);
    // Warm both: every key's counter exists.
    time_checks(&none_clock, &none, &requests);
    time_checks(&many_clock, &many, &requests);
    let (mut without, mut with, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (a, b) = if round % 2 == 0 {
            let a = time_checks(&none_clock, &none, &requests);
            (a, time_checks(&many_clock, &many, &requests))
        } else {
            let b = time_checks(&many_clock, &many, &requests);
            (time_checks(&none_clock, &none, &requests), b)
        };
        without.push(a);
        with.push(b);
        ratio.push(b / a);
    }
    let show = |name: &str, (median, min, max): (f64, f64, f64), unit: &str| {
        println!("{name}: median {median:.3}{unit} (range {min:.3}-{max:.3}{unit})");
    };
    println!("unrelated checks, {ROUNDS} paired rounds of {CHECKS}:");
    show("  no override, ns/check", spread(without), "");
    show(
        &format!("  {IN_FORCE} in force, ns/check"),
        spread(with),
        "",
    );
    show("  ratio (with / without)", spread(ratio), "");

    let (mut single, mut first, mut last, mut bulk) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let (_clock, limiter) = support::limiter(Algorithm::FixedWindow, 10, "1s");
        let start = Instant::now();
        let mut marks = Vec::new();
        for i in 0..IN_FORCE {
            if i % 1000 == 0 {
                marks.push(Instant::now());
            }
            limiter.overrides().set(other(i)).unwrap();
        }
        marks.push(Instant::now());
        single.push(start.elapsed().as_secs_f64() * 1e3);
        first.push((marks[1] - marks[0]).as_secs_f64() * 1e3);
        last.push((marks[marks.len() - 1] - marks[marks.len() - 2]).as_secs_f64() * 1e3);

        let (_clock, limiter) = support::limiter(Algorithm::FixedWindow, 10, "1s");
        let list = (0..IN_FORCE).map(other).collect();
        let start = Instant::now();
        limiter.overrides().set_all(list).unwrap();
        bulk.push(start.elapsed().as_secs_f64() * 1e3);
    }
    println!("setting {IN_FORCE} in process, 5 rounds:");
    show("  one by one, ms", spread(single), "");
    show("  first 1000 of them, ms", spread(first), "");
    show("  last 1000 of them, ms", spread(last), "");
    show("  in one set_all, ms", spread(bulk), "");
}
