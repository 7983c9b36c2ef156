//! The embedded store's contract: atomic all-or-nothing charges, repeated keys, expiry.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::{Clock, ManualClock};
use tollgate::store::{Charge, MemoryStore, Store, StoreError};
use tollgate_core::{Algorithm, Params, Timestamp, Verdict};

fn params(algorithm: Algorithm, limit: u64, period: Duration) -> Params {
    Params::new(algorithm, limit, period, None).unwrap()
}

fn store() -> (Arc<ManualClock>, MemoryStore) {
    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
        1_700_000_000_000_000,
    )));
    let store = MemoryStore::new(clock.clone());
    (clock, store)
}

fn charge<'a>(key: &'a str, params: &'a Params, cost: u64) -> Charge<'a> {
    Charge::new(key.as_bytes(), params, cost)
}

#[tokio::test]
async fn a_denied_limit_leaves_no_charge_on_the_others() {
    let (_clock, store) = store();
    let wide = params(Algorithm::FixedWindow, 10, Duration::from_secs(60));
    let narrow = params(Algorithm::TokenBucket, 1, Duration::from_secs(60));
    let first = store
        .apply(&[charge("user", &wide, 1), charge("ip", &narrow, 1)])
        .await
        .unwrap();
    assert!(first.iter().all(|d| d.is_allowed()));
    assert_eq!(first[0].remaining, 9);
    for _ in 0..3 {
        let d = store
            .apply(&[charge("user", &wide, 1), charge("ip", &narrow, 1)])
            .await
            .unwrap();
        assert!(d[0].is_allowed(), "the wide limit alone would allow");
        assert_eq!(d[0].remaining, 9, "and says what is left, uncharged");
        assert_eq!(d[1].verdict, Verdict::Denied);
    }
    let alone = store.apply(&[charge("user", &wide, 1)]).await.unwrap();
    assert_eq!(
        alone[0].remaining, 8,
        "the three denied requests charged nothing"
    );
}

/// In a request another limit denies, a limit that would allow its charge answers with its
/// figures as they stand (what a check, cost 0, reads), not as after the charge: for a bucket
/// the time until it is full too, and no shaping delay.
#[tokio::test]
async fn a_denied_request_reports_the_allowed_limits_as_they_stand() {
    let (clock, store) = store();
    let bucket = params(Algorithm::LeakyBucket, 10, Duration::from_secs(60));
    let narrow = params(Algorithm::FixedWindow, 1, Duration::from_secs(60));
    store.apply(&[charge("ip", &narrow, 1)]).await.unwrap();
    store.apply(&[charge("user", &bucket, 4)]).await.unwrap();
    clock.advance(Duration::from_secs(3));
    let denied = store
        .apply(&[charge("user", &bucket, 3), charge("ip", &narrow, 1)])
        .await
        .unwrap();
    assert_eq!(denied[1].verdict, Verdict::Denied);
    let as_it_stands = store.apply(&[charge("user", &bucket, 0)]).await.unwrap();
    assert_eq!(denied[0], as_it_stands[0]);
    let charged = store.peek(&[charge("user", &bucket, 3)]).await.unwrap();
    assert_ne!(denied[0], charged[0], "a charge's figures differ");
}

#[tokio::test]
async fn a_shadow_charge_never_blocks_the_others() {
    let (_clock, store) = store();
    let p = params(Algorithm::FixedWindow, 1, Duration::from_secs(60));
    let shadow = |key| Charge {
        enforce: false,
        ..Charge::new(key, &p, 1)
    };
    store.apply(&[shadow(b"s")]).await.unwrap();
    let d = store
        .apply(&[charge("real", &p, 1), shadow(b"s")])
        .await
        .unwrap();
    assert_eq!(d[1].verdict, Verdict::Denied);
    assert!(d[0].is_allowed());
    let again = store.apply(&[charge("real", &p, 1)]).await.unwrap();
    assert_eq!(
        again[0].verdict,
        Verdict::Denied,
        "the request was admitted and charged"
    );
}

#[tokio::test]
async fn the_same_key_twice_in_one_request_sees_its_own_charge() {
    for algorithm in Algorithm::ALL {
        let (_clock, store) = store();
        let p = params(algorithm, 3, Duration::from_secs(60));
        let d = store
            .apply(&[charge("k", &p, 2), charge("k", &p, 2)])
            .await
            .unwrap();
        assert!(d[0].is_allowed(), "{algorithm}");
        assert_eq!(d[1].verdict, Verdict::Denied, "{algorithm}: 2 + 2 > 3");
        let d = store.apply(&[charge("k", &p, 3)]).await.unwrap();
        assert!(
            d[0].is_allowed(),
            "{algorithm}: the denied request charged nothing"
        );
    }
}

#[tokio::test]
async fn expired_keys_are_swept_so_memory_follows_live_keys() {
    for algorithm in Algorithm::ALL {
        let (clock, store) = store();
        let p = params(algorithm, 5, Duration::from_secs(10));
        for i in 0..100 {
            let key = format!("user-{i}");
            store.apply(&[charge(&key, &p, 1)]).await.unwrap();
        }
        assert_eq!(store.len(), 100, "{algorithm}");
        assert_eq!(store.sweep_now(), 0, "{algorithm}: nothing has expired yet");
        clock.advance(Duration::from_secs(21));
        assert_eq!(store.sweep_now(), 100, "{algorithm}");
        assert_eq!(store.len(), 0, "{algorithm}");
    }
}

#[tokio::test]
async fn a_denied_request_on_a_new_key_stores_nothing() {
    let (_clock, store) = store();
    let p = params(Algorithm::Gcra, 2, Duration::from_secs(1));
    let d = store.apply(&[charge("big", &p, 3)]).await.unwrap();
    assert_eq!(d[0].verdict, Verdict::CostExceedsCapacity);
    assert_eq!(store.len(), 0);
}

/// A store that holds its most keys refuses a request that needs a new one, charging nothing
/// (not even the keys it already holds), and goes on deciding the keys it has; room comes back
/// as keys expire and are swept.
#[tokio::test]
async fn a_full_store_refuses_new_keys_and_keeps_deciding_the_others() {
    let (clock, store) = store();
    let store = store.with_max_keys(2);
    let minute = params(Algorithm::FixedWindow, 10, Duration::from_secs(60));
    for key in ["a", "b"] {
        assert!(store.apply(&[charge(key, &minute, 1)]).await.unwrap()[0].is_allowed());
    }
    let full = store.apply(&[charge("c", &minute, 1)]).await.unwrap_err();
    assert!(full.to_string().contains("--memory-max-keys"), "{full}");
    // Beside a held key, the new one cannot be added: the held one is decided as it stands
    // (charged by the limiter once the posture has answered for the new one), the new one not.
    let partly = store
        .apply(&[charge("a", &minute, 1), charge("c", &minute, 1)])
        .await
        .unwrap_err();
    let StoreError::Partly { decided, .. } = partly else {
        panic!("{partly}")
    };
    assert_eq!(decided.len(), 2);
    assert_eq!(decided[0].map(|d| d.remaining), Some(9), "as it stands");
    assert!(decided[1].is_none());
    let a = store.apply(&[charge("a", &minute, 1)]).await.unwrap();
    assert_eq!(a[0].remaining, 8, "charged once before, once now");
    // A look, or a check of a new key, needs no room; a key twice in one request is one key.
    assert!(store.peek(&[charge("c", &minute, 1)]).await.is_ok());
    assert!(store.apply(&[charge("c", &minute, 0)]).await.is_ok());
    assert_eq!(store.len(), 2);

    clock.advance(Duration::from_secs(61));
    assert_eq!(store.sweep_now(), 2);
    assert_eq!(store.len(), 0);
    let decided = store
        .apply(&[
            charge("c", &minute, 1),
            charge("c", &minute, 1),
            charge("d", &minute, 1),
        ])
        .await
        .unwrap();
    assert_eq!(decided[1].remaining, 8);
    assert_eq!(store.len(), 2);
}

/// Past its bytes (a sliding log's entries, here) a store refuses a request that needs a new
/// key, as past its keys, and goes on deciding the keys it has; the bytes come back as the log
/// expires, whether it is replaced on its next charge or swept.
#[tokio::test]
async fn a_store_past_its_bytes_refuses_new_keys_and_keeps_deciding_the_others() {
    let (clock, store) = store();
    let store = store.with_max_bytes(64 << 10);
    let log = params(
        Algorithm::SlidingWindowLog,
        100_000,
        Duration::from_secs(60),
    );
    let minute = params(Algorithm::FixedWindow, 10, Duration::from_secs(60));
    assert!(store.apply(&[charge("fixed", &minute, 1)]).await.is_ok());
    // 4 100 entries at as many instants: a buffer of 8 192, 128 KiB.
    for _ in 0..4_100 {
        clock.advance(Duration::from_micros(10));
        assert!(store.apply(&[charge("log", &log, 1)]).await.unwrap()[0].is_allowed());
    }
    let held = store.bytes().unwrap();
    assert!(held > 128 << 10, "{held}");

    let full = store.apply(&[charge("new", &minute, 1)]).await.unwrap_err();
    assert!(full.to_string().contains("--memory-max-bytes"), "{full}");
    let partly = store
        .apply(&[charge("fixed", &minute, 1), charge("new", &minute, 1)])
        .await
        .unwrap_err();
    let StoreError::Partly { decided, .. } = partly else {
        panic!("{partly}")
    };
    assert_eq!(decided[0].map(|d| d.remaining), Some(9), "as it stands");
    assert!(decided[1].is_none());
    // The keys held keep deciding, the log growing past the bound.
    let fixed = store.apply(&[charge("fixed", &minute, 1)]).await.unwrap();
    assert_eq!(fixed[0].remaining, 8);
    let logged = store.apply(&[charge("log", &log, 1)]).await.unwrap();
    assert_eq!(logged[0].remaining, 100_000 - 4_101);
    assert_eq!(store.len(), 2);
    assert_eq!(store.bytes(), Some(held), "the buffer had room for it");

    // Expired, the log is replaced by an empty one at its next charge: room again.
    clock.advance(Duration::from_secs(61));
    assert!(store.apply(&[charge("log", &log, 1)]).await.is_ok());
    assert!(store.bytes().unwrap() < 2 << 10, "{:?}", store.bytes());
    assert!(store.apply(&[charge("new", &minute, 1)]).await.is_ok());
    assert_eq!(store.len(), 3);
    clock.advance(Duration::from_secs(61));
    assert_eq!(store.sweep_now(), 3);
    assert_eq!(store.bytes(), Some(0), "every byte counted comes back");
}

/// The same counter twice in one request, both denied: the request fits only once both do, so
/// the later charge's retry is the wait for the two together, and retrying after the longer
/// retry is admitted. (Each used to give the wait for its own cost, so a client retrying then
/// was denied again.)
#[tokio::test]
async fn a_counter_charged_twice_retries_for_both_charges() {
    let (clock, store) = store();
    // One token back a second, six at most.
    let bucket = Params::new(Algorithm::TokenBucket, 4, Duration::from_secs(4), Some(6)).unwrap();
    assert!(store.apply(&[charge("k", &bucket, 6)]).await.unwrap()[0].is_allowed());
    let twice = [charge("k", &bucket, 1), charge("k", &bucket, 1)];
    let denied = store.apply(&twice).await.unwrap();
    assert_eq!(denied[0].retry_after, Some(Duration::from_secs(1)));
    assert_eq!(denied[1].retry_after, Some(Duration::from_secs(2)));

    clock.advance(Duration::from_secs(1));
    let still = store.apply(&twice).await.unwrap();
    assert!(!still[1].is_allowed(), "one token is back, two are needed");
    assert_eq!(still[1].retry_after, Some(Duration::from_secs(1)));
    clock.advance(Duration::from_secs(1));
    let admitted = store.apply(&twice).await.unwrap();
    assert!(admitted.iter().all(|d| d.is_allowed()), "{admitted:?}");
}

/// A sliding log filled to its most entries, then charged 64 times in one request, decides in
/// O(log n) reads a charge (see `tollgate_core::sliding_window_log::probes`), and its neighbours
/// are decided as on a store without it: the same answers, one after the other.
#[tokio::test]
async fn the_neighbours_of_a_full_sliding_log_are_decided_as_before() {
    use tollgate_core::MAX_LOG_LIMIT;
    let (clock, store) = store();
    let log = params(
        Algorithm::SlidingWindowLog,
        MAX_LOG_LIMIT,
        Duration::from_secs(1),
    );
    for _ in 0..MAX_LOG_LIMIT {
        clock.advance(Duration::from_micros(1));
        let d = store.apply(&[charge("full", &log, 1)]).await.unwrap();
        assert!(d[0].is_allowed());
    }
    let hot: Vec<Charge<'_>> = (0..64).map(|_| charge("full", &log, 1)).collect();
    let denied = store.apply(&hot).await.unwrap();
    assert!(denied.iter().all(|d| d.verdict == Verdict::Denied));
    // The oldest entry went in a microsecond after the start, a second before it expires.
    let oldest_expires = 1_000_000 + 1 - MAX_LOG_LIMIT;
    assert_eq!(
        denied[0].retry_after,
        Some(Duration::from_micros(oldest_expires))
    );

    let (fresh_clock, fresh) = self::store();
    fresh_clock.set(clock.now());
    let neighbour = params(Algorithm::SlidingWindowLog, 3, Duration::from_secs(1));
    for n in 0..5 {
        let key = format!("neighbour-{}", n % 2);
        let here = store.apply(&[charge(&key, &neighbour, 1)]).await.unwrap();
        let there = fresh.apply(&[charge(&key, &neighbour, 1)]).await.unwrap();
        assert_eq!(here, there, "request {n} on {key}");
    }
}
