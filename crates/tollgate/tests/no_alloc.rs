//! Once its keys are warm, `Limiter::check` on the memory store allocates nothing for a request
//! of one descriptor, allowed or denied, and exactly once (its answer's statuses, held inline for
//! one) for a request of two to four, no shadow candidate. A counting global allocator (this file
//! is its own test binary, so it counts nothing else) measures every allocation and reallocation
//! made while 10,000 checks run.
//!
//! Not covered, and allocating by design: a key the store has never seen (a new map entry), a
//! sliding log growing past its largest length so far, a denied key entering the top-keys table,
//! more than four descriptors or 256 bytes of counter keys, a shadow candidate, runtime
//! overrides, the Redis store and the failure postures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::System;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tollgate::clock::ManualClock;
use tollgate::limiter::{CheckRequest, Limiter, RequestDescriptor};
use tollgate::policy::Policy;
use tollgate::store::{MemoryStore, StoreBackend};
use tollgate_core::Timestamp;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Every algorithm, four descriptors in one request and two in another; the `tight` rules deny.
const POLICY: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: {name: user, period: 1s, requests_per_unit: 100, algorithm: gcra}
  - key: ip
    rate_limit: {name: ip, period: 1s, requests_per_unit: 100, algorithm: fixed_window}
  - key: tenant
    rate_limit: {name: tenant, period: 1s, requests_per_unit: 100, algorithm: token_bucket}
  - key: path
    rate_limit: {name: path, period: 1s, requests_per_unit: 100, algorithm: sliding_window_counter}
  - key: app
    rate_limit: {name: app, period: 1s, requests_per_unit: 100, algorithm: leaky_bucket, burst: 100}
  - key: device
    rate_limit: {name: device, period: 1s, requests_per_unit: 100, algorithm: sliding_window_log}
  - key: tight
    rate_limit: {name: tight, unit: hour, requests_per_unit: 1, algorithm: gcra}
  - key: tight_window
    rate_limit: {name: tight_window, unit: hour, requests_per_unit: 1}
  - key: tight_alone
    rate_limit: {name: tight_alone, unit: hour, requests_per_unit: 1, algorithm: gcra}
"#;

/// Distinct clients already seen before counting starts.
const CLIENTS: usize = 300;
const CHECKS: usize = 10_000;

fn request(entries: &[(&str, String)]) -> CheckRequest {
    let descriptors = entries
        .iter()
        .map(|(k, v)| RequestDescriptor::new(vec![((*k).into(), v.clone())], 1, None).unwrap())
        .collect();
    CheckRequest::new("api".into(), descriptors).unwrap()
}

/// Polls once: the memory store never waits.
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a memory-store check waited"),
    }
}

/// Allocations and reallocations made while `f` runs.
fn allocations(f: impl FnOnce()) -> usize {
    let region = Region::new(GLOBAL);
    f();
    let stats = region.change();
    stats.allocations + stats.reallocations
}

// One test function: the counter is process-wide, and tests of one binary run in parallel.
#[test]
fn warm_checks_do_not_allocate() {
    // The counter sees allocations at all.
    assert!(allocations(|| drop(std::hint::black_box(vec![1u8; 64]))) >= 1);

    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
        1_700_000_000_000_000,
    )));
    let store = StoreBackend::Memory(MemoryStore::new(clock.clone()));
    let limiter = Limiter::new(Policy::from_yaml("no_alloc.yaml", POLICY).unwrap(), store);

    // One descriptor, every algorithm: 600 requests, as many as `allowed` below.
    let single: Vec<CheckRequest> = (0..CLIENTS / 3)
        .flat_map(|n| {
            ["user", "ip", "tenant", "path", "app", "device"]
                .map(|key| request(&[(key, format!("solo-{n}"))]))
        })
        .collect();
    let allowed: Vec<CheckRequest> = (0..CLIENTS)
        .flat_map(|n| {
            [
                request(&[
                    ("user", format!("user-{n}")),
                    ("ip", format!("10.0.{}.{}", n / 256, n % 256)),
                    ("tenant", format!("tenant-{}", n % 7)),
                    ("path", format!("/v1/items/{}", n % 13)),
                ]),
                request(&[("app", format!("app-{n}")), ("device", format!("d-{n}"))]),
            ]
        })
        .collect();
    // Each key sees a request every 600 simulated ms, well under 100 a second, and before its
    // counter expires (one that did would be dropped and stored anew).
    let check_allowed = |requests: &[CheckRequest], n: usize| {
        clock.advance(Duration::from_millis(1));
        let response = ready(limiter.check(&requests[n % requests.len()])).unwrap();
        assert!(response.allowed(), "{response:?}");
    };
    // Each set warmed for three simulated seconds, then counted at once (the other's warm-up
    // would let its counters expire): every key exists, every sliding log has its longest length.
    let warm_then_count = |requests: &[CheckRequest]| {
        (0..3 * requests.len()).for_each(|n| check_allowed(requests, n));
        allocations(|| (0..CHECKS).for_each(|n| check_allowed(requests, n)))
    };
    let counted = warm_then_count(&single);
    assert_eq!(
        counted, 0,
        "allocations in {CHECKS} allowed checks of one descriptor"
    );
    let counted = warm_then_count(&allowed);
    assert_eq!(
        counted, CHECKS,
        "allocations in {CHECKS} allowed checks of two or four descriptors"
    );

    // Denied: each client's first request passes, its second enters the top-keys table, and
    // from then on denials allocate nothing. At most 64 clients: the table's size per rule.
    let denied: Vec<CheckRequest> = (0..50)
        .map(|n| {
            request(&[
                ("tight", format!("client-{n}")),
                ("tight_window", format!("client-{n}")),
                ("user", format!("denied-{n}")),
            ])
        })
        .collect();
    let denied_single: Vec<CheckRequest> = (0..50)
        .map(|n| request(&[("tight_alone", format!("client-{n}"))]))
        .collect();
    for r in denied.iter().chain(&denied_single) {
        assert!(ready(limiter.check(r)).unwrap().allowed());
        assert!(!ready(limiter.check(r)).unwrap().allowed());
    }
    let check_denied = |requests: &[CheckRequest]| {
        for n in 0..CHECKS {
            let response = ready(limiter.check(&requests[n % requests.len()])).unwrap();
            assert!(!response.allowed());
        }
    };
    let counted = allocations(|| check_denied(&denied_single));
    assert_eq!(
        counted, 0,
        "allocations in {CHECKS} denied checks of one descriptor"
    );
    let counted = allocations(|| check_denied(&denied));
    assert_eq!(
        counted, CHECKS,
        "allocations in {CHECKS} denied checks of three descriptors"
    );
}
