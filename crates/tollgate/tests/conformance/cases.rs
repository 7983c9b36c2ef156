//! The cases every backend must pass. Each gets a fresh backend.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tollgate::clock::Clock;
use tollgate::store::{Charge, Store, StoreBackend};
use tollgate_core::{Algorithm, Decision, Params, State, Verdict, decide};

use super::Backend;

type Case = fn(Backend) -> Pin<Box<dyn Future<Output = ()> + Send>>;

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        pub const ALL: &[(&str, Case)] = &[$((stringify!($name), |b| Box::pin($name(b)))),*];
    };
}

cases!(
    every_algorithm_admits_its_limit_then_denies_until_retry_after,
    weighted_costs_and_costs_beyond_capacity,
    layered_limits_are_all_or_nothing,
    shadow_charges_never_block,
    the_same_key_twice_in_one_request,
    decisions_equal_the_pure_algorithms,
    every_key_expires,
    concurrent_requests_admit_exactly_the_limit,
    checks_charge_nothing_and_deny_when_one_unit_would_not_fit,
    charging_up_to_the_limit_counts_what_is_left,
    a_changed_limit_keeps_the_units_used,
    a_state_lives_until_the_ttl_it_was_written_with,
);

fn params(algorithm: Algorithm, limit: u64, period: Duration, burst: Option<u64>) -> Params {
    Params::new(algorithm, limit, period, burst).unwrap()
}

fn charge<'a>(key: &'a [u8], params: &'a Params, cost: u64) -> Charge<'a> {
    Charge::new(key, params, cost)
}

async fn one(store: &StoreBackend, key: &[u8], params: &Params, cost: u64) -> Decision {
    store.apply(&[charge(key, params, cost)]).await.unwrap()[0]
}

async fn every_algorithm_admits_its_limit_then_denies_until_retry_after(b: Backend) {
    for algorithm in Algorithm::ALL {
        let p = params(algorithm, 5, Duration::from_secs(10), None);
        let key = format!("limit-{algorithm}");
        for expected in (0..5).rev() {
            let d = one(&b.store, key.as_bytes(), &p, 1).await;
            assert_eq!(d.verdict, Verdict::Allowed, "{algorithm}");
            assert_eq!(d.remaining, expected, "{algorithm}");
            assert_eq!(d.limit, 5);
        }
        let denied = one(&b.store, key.as_bytes(), &p, 1).await;
        assert_eq!(denied.verdict, Verdict::Denied, "{algorithm}");
        let retry = denied
            .retry_after
            .expect("a denial that can clear has a retry-after");
        // Within two periods: the sliding counter waits for its current window to age out.
        assert!(
            retry > Duration::ZERO && retry <= Duration::from_secs(20),
            "{algorithm}: {retry:?}"
        );
        b.clock.advance(retry - Duration::from_micros(1));
        assert_eq!(
            one(&b.store, key.as_bytes(), &p, 1).await.verdict,
            Verdict::Denied,
            "{algorithm}: 1µs early"
        );
        b.clock.advance(Duration::from_micros(1));
        assert_eq!(
            one(&b.store, key.as_bytes(), &p, 1).await.verdict,
            Verdict::Allowed,
            "{algorithm}: on time"
        );
    }
}

async fn weighted_costs_and_costs_beyond_capacity(b: Backend) {
    for algorithm in Algorithm::ALL {
        let burst = algorithm.uses_burst().then_some(8);
        let p = params(algorithm, 5, Duration::from_secs(60), burst);
        let capacity = p.capacity();
        let key = format!("weighted-{algorithm}");
        let d = one(&b.store, key.as_bytes(), &p, capacity + 1).await;
        assert_eq!(d.verdict, Verdict::CostExceedsCapacity, "{algorithm}");
        assert_eq!(d.retry_after, None, "{algorithm}");
        let d = one(&b.store, key.as_bytes(), &p, capacity - 1).await;
        assert_eq!(
            d.verdict,
            Verdict::Allowed,
            "{algorithm}: nothing was consumed before"
        );
        assert_eq!(d.remaining, 1, "{algorithm}");
        assert_eq!(
            one(&b.store, key.as_bytes(), &p, 2).await.verdict,
            Verdict::Denied,
            "{algorithm}"
        );
        assert_eq!(
            one(&b.store, key.as_bytes(), &p, 1).await.verdict,
            Verdict::Allowed,
            "{algorithm}"
        );
    }
}

async fn layered_limits_are_all_or_nothing(b: Backend) {
    let user = params(Algorithm::FixedWindow, 10, Duration::from_secs(60), None);
    let tenant = params(Algorithm::Gcra, 10, Duration::from_secs(60), None);
    let ip = params(
        Algorithm::SlidingWindowLog,
        1,
        Duration::from_secs(60),
        None,
    );
    let request = |ip_key: &'static [u8]| {
        [
            charge(b"user:u1", &user, 1),
            charge(b"tenant:t1", &tenant, 1),
            charge(ip_key, &ip, 1),
        ]
    };
    let first = b.store.apply(&request(b"ip:1")).await.unwrap();
    assert!(first.iter().all(Decision::is_allowed));
    for _ in 0..4 {
        let d = b.store.apply(&request(b"ip:1")).await.unwrap();
        assert!(
            d[0].is_allowed() && d[1].is_allowed(),
            "the others would allow"
        );
        assert_eq!(d[2].verdict, Verdict::Denied);
    }
    // The four denied requests left no charge on user or tenant.
    let d = b.store.apply(&request(b"ip:2")).await.unwrap();
    assert!(d.iter().all(Decision::is_allowed));
    assert_eq!(d[0].remaining, 8, "user charged twice in all");
    assert_eq!(d[1].remaining, 8, "tenant charged twice in all");
}

/// A cost of 0 (Envoy's per-descriptor `hits_addend: 0`) checks: it answers as a request of 1
/// would, with the quota as it is, and leaves every counter as it found it, also beside charges
/// of other keys (other slots on a cluster) and of its own key.
async fn checks_charge_nothing_and_deny_when_one_unit_would_not_fit(b: Backend) {
    for algorithm in Algorithm::ALL {
        let p = params(algorithm, 3, Duration::from_secs(60), None);
        let key = |name: &str| format!("check-{algorithm}-{name}");
        let (used, fresh, both) = (key("used"), key("fresh"), key("both"));
        for _ in 0..3 {
            let d = one(&b.store, used.as_bytes(), &p, 0).await;
            assert_eq!(d.verdict, Verdict::Allowed, "{algorithm}");
            assert_eq!(d.remaining, 3, "{algorithm}: nothing counted");
            assert_eq!(d.delay, Duration::ZERO, "{algorithm}");
        }
        assert!(one(&b.store, used.as_bytes(), &p, 2).await.is_allowed());
        let d = one(&b.store, used.as_bytes(), &p, 0).await;
        assert_eq!(
            (d.verdict, d.remaining),
            (Verdict::Allowed, 1),
            "{algorithm}"
        );
        assert!(one(&b.store, used.as_bytes(), &p, 1).await.is_allowed());
        let d = one(&b.store, used.as_bytes(), &p, 0).await;
        assert_eq!(d.verdict, Verdict::Denied, "{algorithm}: no unit left");
        assert!(d.retry_after.is_some_and(|r| r > Duration::ZERO));

        // A check that denies denies the request; one that admits lets the others charge.
        let d = b
            .store
            .apply(&[
                charge(fresh.as_bytes(), &p, 1),
                charge(used.as_bytes(), &p, 0),
            ])
            .await
            .unwrap();
        assert_eq!(
            (d[0].verdict, d[1].verdict),
            (Verdict::Allowed, Verdict::Denied)
        );
        let d = b
            .store
            .apply(&[
                charge(fresh.as_bytes(), &p, 0),
                charge(both.as_bytes(), &p, 1),
            ])
            .await
            .unwrap();
        assert!(d.iter().all(Decision::is_allowed), "{algorithm}");
        assert!(
            one(&b.store, fresh.as_bytes(), &p, 3).await.is_allowed(),
            "{algorithm}: neither the denied request nor the check charged it"
        );
        let d = b
            .store
            .apply(&[
                charge(both.as_bytes(), &p, 0),
                charge(both.as_bytes(), &p, 2),
            ])
            .await
            .unwrap();
        assert_eq!(d[0].remaining, 2, "{algorithm}: the earlier charge counts");
        assert!(d[1].is_allowed(), "{algorithm}: the check took nothing");
    }
}

/// `charge: up_to_limit`: a charge that does not fit whole is admitted while a unit is left and
/// counts what is left; with nothing left it is denied; and a request another limit denies
/// still charges nothing.
async fn charging_up_to_the_limit_counts_what_is_left(b: Backend) {
    for algorithm in Algorithm::ALL {
        let whole = params(algorithm, 5, Duration::from_secs(60), None);
        let up_to = whole.charging_up_to_limit(true);
        let key = |name: &str| format!("up-to-{algorithm}-{name}");
        let (tokens, fresh, full) = (key("tokens"), key("fresh"), key("full"));
        let d = one(&b.store, tokens.as_bytes(), &up_to, 3).await;
        assert_eq!(
            (d.verdict, d.remaining),
            (Verdict::Allowed, 2),
            "{algorithm}"
        );
        let d = one(&b.store, tokens.as_bytes(), &up_to, 4).await;
        assert_eq!(
            (d.verdict, d.remaining),
            (Verdict::Allowed, 0),
            "{algorithm}: the two units left are charged"
        );
        let d = one(&b.store, tokens.as_bytes(), &up_to, 0).await;
        assert_eq!(
            d.verdict,
            Verdict::Denied,
            "{algorithm}: a check sees none left"
        );
        let d = one(&b.store, tokens.as_bytes(), &up_to, 9).await;
        assert_eq!(d.verdict, Verdict::Denied, "{algorithm}");
        assert!(
            d.retry_after.is_some(),
            "{algorithm}: one unit will come back"
        );

        assert!(one(&b.store, full.as_bytes(), &whole, 5).await.is_allowed());
        let d = b
            .store
            .apply(&[
                charge(fresh.as_bytes(), &up_to, 9),
                charge(full.as_bytes(), &whole, 1),
            ])
            .await
            .unwrap();
        assert_eq!(d[1].verdict, Verdict::Denied, "{algorithm}");
        assert!(
            one(&b.store, fresh.as_bytes(), &whole, 5)
                .await
                .is_allowed(),
            "{algorithm}: the denied request charged nothing"
        );
    }
}

async fn shadow_charges_never_block(b: Backend) {
    let p = params(Algorithm::TokenBucket, 1, Duration::from_secs(60), None);
    let shadow = Charge {
        enforce: false,
        ..Charge::new(b"shadow", &p, 1)
    };
    b.store.apply(&[shadow]).await.unwrap();
    let d = b
        .store
        .apply(&[charge(b"real", &p, 1), shadow])
        .await
        .unwrap();
    assert!(d[0].is_allowed());
    assert_eq!(d[1].verdict, Verdict::Denied, "the shadow limit would deny");
    assert_eq!(
        one(&b.store, b"real", &p, 1).await.verdict,
        Verdict::Denied,
        "the request was charged"
    );
}

async fn the_same_key_twice_in_one_request(b: Backend) {
    for algorithm in Algorithm::ALL {
        let p = params(algorithm, 3, Duration::from_secs(60), None);
        let key = format!("twice-{algorithm}");
        let d = b
            .store
            .apply(&[charge(key.as_bytes(), &p, 2), charge(key.as_bytes(), &p, 2)])
            .await
            .unwrap();
        assert!(d[0].is_allowed(), "{algorithm}");
        assert_eq!(d[1].verdict, Verdict::Denied, "{algorithm}: 2 + 2 > 3");
        assert!(
            one(&b.store, key.as_bytes(), &p, 3).await.is_allowed(),
            "{algorithm}: nothing charged"
        );
    }
}

/// A fixed pseudo-random walk of time steps and costs, checked decision by decision against
/// `tollgate_core::decide` applied to a local state.
async fn decisions_equal_the_pure_algorithms(b: Backend) {
    for algorithm in Algorithm::ALL {
        let burst = algorithm.uses_burst().then_some(7);
        let p = params(algorithm, 5, Duration::from_millis(1_500), burst);
        let key = format!("walk-{algorithm}");
        let mut state = State::empty(&p);
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for step in 0..60 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            b.clock.advance(Duration::from_micros(seed % 400_000));
            let cost = 1 + (seed >> 20) % 3;
            let now = b.clock.now();
            let (expected, transition) = decide(&p, &state, now, cost);
            let got = one(&b.store, key.as_bytes(), &p, cost).await;
            assert_eq!(got, expected, "{algorithm}, step {step}, cost {cost}");
            state.apply(transition);
        }
    }
}

async fn every_key_expires(b: Backend) {
    // Start just after a window boundary, so no window ends while the keys are written.
    let period = Duration::from_millis(500);
    let period_us = period.as_micros() as u64;
    // From the real time, not the pinned clock (which starts ahead of it): Redis expires the
    // keys in real time.
    let now = tollgate::clock::SystemClock::new().now().as_micros();
    b.clock.set(tollgate_core::Timestamp::from_micros(
        (now / period_us + 1) * period_us + 1_000,
    ));
    let wait_real = Duration::from_micros(b.clock.now().as_micros() - now) + 2 * period;
    for algorithm in Algorithm::ALL {
        let p = params(algorithm, 2, period, None);
        for i in 0..5 {
            let key = format!("ttl-{algorithm}-{i}");
            assert!(one(&b.store, key.as_bytes(), &p, 1).await.is_allowed());
        }
    }
    assert_eq!(b.store.key_count().await.unwrap(), 30);
    for output in (b.redis_cli)(&["--scan"]) {
        for key in output.lines().filter(|k| !k.is_empty()) {
            // On a cluster only the owner answers with a number; the others answer MOVED.
            let ttls: Vec<i64> = (b.redis_cli)(&["PTTL", key])
                .iter()
                .filter_map(|t| t.trim().parse().ok())
                .collect();
            assert_eq!(ttls.len(), 1, "{key}: {ttls:?}");
            // -1 is a key without a TTL; 0 is one expiring this millisecond (a slow machine
            // can get there between the scan and this read) and -2 one already gone.
            assert_ne!(ttls[0], -1, "{key} has no TTL");
        }
    }
    // Real time must pass for Redis to expire keys; the pinned clock follows it.
    tokio::time::sleep(wait_real).await;
    b.clock.advance(2 * period);
    for _ in 0..50 {
        if let StoreBackend::Memory(m) = &b.store {
            m.sweep_now();
        }
        if b.store.key_count().await.unwrap() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{}: {} keys still present after their TTL",
        b.name,
        b.store.key_count().await.unwrap()
    );
}

/// Many requests in flight at once (on Redis they share batched script calls): a per-user limit
/// and a tenant limit shared by every user admit exactly what the limits allow, however the
/// requests are interleaved.
async fn concurrent_requests_admit_exactly_the_limit(b: Backend) {
    // Start just after a 10-minute boundary: a fixed window ending while the requests run
    // (pinned time) would be given an expiry already past on Redis's own clock, and its keys
    // would vanish as they are written, admitting everything (it happened once, in a test run).
    let period_us = 600_000_000;
    let now = b.clock.now().as_micros();
    b.clock.set(tollgate_core::Timestamp::from_micros(
        (now / period_us + 1) * period_us + 1_000,
    ));
    for algorithm in Algorithm::ALL {
        let user = params(algorithm, 30, Duration::from_secs(600), None);
        let tenant = params(algorithm, 50, Duration::from_secs(600), None);
        let tenant_key = format!("tenant-{algorithm}");
        let user_keys: Vec<String> = (0..4).map(|u| format!("user-{u}-{algorithm}")).collect();
        let requests = (0..240).map(|i| {
            let (user_key, tenant_key) = (&user_keys[i % 4], &tenant_key);
            let (user, tenant, store) = (&user, &tenant, &b.store);
            async move {
                let charges = [
                    charge(user_key.as_bytes(), user, 1),
                    charge(tenant_key.as_bytes(), tenant, 1),
                ];
                let decisions = store.apply(&charges).await.unwrap();
                (i % 4, decisions.iter().all(Decision::is_allowed))
            }
        });
        let outcomes = futures_util::future::join_all(requests).await;
        let admitted = outcomes.iter().filter(|(_, ok)| *ok).count();
        for u in 0..4 {
            let per_user = outcomes.iter().filter(|(x, ok)| *x == u && *ok).count();
            assert!(per_user <= 30, "{algorithm}: user {u} got {per_user}");
        }
        if b.name == "cluster" {
            // The two keys live on different slots: a request that loses a race between its
            // slots is refunded conservatively, so a cluster may under-admit, never over-admit.
            assert!((1..=50).contains(&admitted), "{algorithm}: {admitted}");
            continue;
        }
        assert_eq!(admitted, 50, "{algorithm}: the tenant limit binds");
        let d = one(&b.store, tenant_key.as_bytes(), &tenant, 1).await;
        assert_eq!(
            (d.verdict, d.remaining),
            (Verdict::Denied, 0),
            "{algorithm}"
        );
    }
}

/// A reload tightens a live key's limit, then loosens it (10 a minute, then 5, then 20), for
/// every algorithm: what is left is `max(0, new limit - used)`. A key that used all its 10 is
/// denied under 5; one that used 3 is admitted once more with 1 left, then denied; loosened to
/// 20 it has 20 - 4 - 1 = 15 left after one more.
async fn a_changed_limit_keeps_the_units_used(b: Backend) {
    let minute = Duration::from_secs(60);
    // Start just after a window boundary, so no window ends in between.
    let minute_us = minute.as_micros() as u64;
    let now = b.clock.now().as_micros();
    b.clock.set(tollgate_core::Timestamp::from_micros(
        (now / minute_us + 1) * minute_us + 1_000,
    ));
    for algorithm in Algorithm::ALL {
        let (ten, five, twenty) = (
            params(algorithm, 10, minute, None),
            params(algorithm, 5, minute, None),
            params(algorithm, 20, minute, None),
        );
        let (full, partly) = (format!("full-{algorithm}"), format!("partly-{algorithm}"));
        let (full, partly) = (full.as_bytes(), partly.as_bytes());
        assert!(
            one(&b.store, full, &ten, 10).await.is_allowed(),
            "{algorithm}"
        );
        assert!(
            one(&b.store, partly, &ten, 3).await.is_allowed(),
            "{algorithm}"
        );
        b.clock.advance(Duration::from_micros(1));

        let denied = one(&b.store, full, &five, 1).await;
        assert_eq!(denied.verdict, Verdict::Denied, "{algorithm}: fully used");
        assert_eq!(denied.remaining, 0, "{algorithm}: fully used");
        let tightened = one(&b.store, partly, &five, 1).await;
        assert_eq!(
            (tightened.verdict, tightened.remaining),
            (Verdict::Allowed, 1),
            "{algorithm}: partly used"
        );
        let over = one(&b.store, partly, &five, 2).await;
        assert_eq!(over.verdict, Verdict::Denied, "{algorithm}: partly used");
        let loosened = one(&b.store, partly, &twenty, 1).await;
        assert_eq!(
            (loosened.verdict, loosened.remaining),
            (Verdict::Allowed, 15),
            "{algorithm}: loosened"
        );
    }
}

/// A state keeps the TTL it was written with: 1 per 300ms lengthened to 1 an hour, a key that
/// used its unit is denied (the log keeps its entry, the buckets their unit used), and once the
/// old TTL has passed both stores have forgotten it: admitted, on every algorithm (the windows
/// start afresh at once, their window number changing with the period).
async fn a_state_lives_until_the_ttl_it_was_written_with(b: Backend) {
    // Redis expires keys by its own clock: start the pinned one at the real time again, so the
    // short TTLs below are in the future for Redis however long the backend took to start.
    b.clock.set(tollgate::clock::SystemClock::new().now());
    let short = Duration::from_millis(300);
    let hour = Duration::from_secs(3_600);
    for algorithm in Algorithm::ALL {
        let key = format!("lengthened-{algorithm}");
        let key = key.as_bytes();
        let (before, after) = (
            params(algorithm, 1, short, None),
            params(algorithm, 1, hour, None),
        );
        assert!(
            one(&b.store, key, &before, 1).await.is_allowed(),
            "{algorithm}"
        );
        if !matches!(
            algorithm,
            Algorithm::FixedWindow | Algorithm::SlidingWindowCounter
        ) {
            let denied = one(&b.store, key, &after, 1).await;
            assert_eq!(denied.verdict, Verdict::Denied, "{algorithm}: still used");
        }
    }
    // Real time must pass for Redis to expire keys; the pinned clock follows it.
    tokio::time::sleep(2 * short + Duration::from_millis(100)).await;
    b.clock.advance(2 * short + Duration::from_millis(100));
    for algorithm in Algorithm::ALL {
        let key = format!("lengthened-{algorithm}");
        let after = params(algorithm, 1, hour, None);
        let decision = one(&b.store, key.as_bytes(), &after, 1).await;
        assert_eq!(
            (decision.verdict, decision.remaining),
            (Verdict::Allowed, 0),
            "{}: {algorithm} past the TTL it was written with",
            b.name
        );
    }
}
