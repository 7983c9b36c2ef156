//! envoyproxy/ratelimit's `quota_mode` in tollgate's all-or-nothing step, and its answer to a
//! check (`hits_addend: 0`) on a limit exactly used up, on every store: memory, one Redis
//! server (with and without coalescing) and a Redis Cluster, where the request's counters
//! live on several slots and the quota rule is decided across them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::SystemClock;
use tollgate::limiter::{CheckRequest, CheckResponse, Code, Limiter, RequestDescriptor};
use tollgate::policy::Policy;
use tollgate::store::{MemoryStore, StoreBackend};

/// Day windows: a test never sees one roll over (short of midnight UTC).
const POLICY: &str = r#"
domain: q
descriptors:
  - key: plain
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: tight
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: qa
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: qb
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: qs
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: qz
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 0}
  - key: budget
    rate_limit: {unit: day, requests_per_unit: 3, charge: up_to_limit}
"#;

fn request(descriptors: &[(&str, &str, u64)]) -> CheckRequest {
    let descriptors = descriptors
        .iter()
        .map(|&(key, value, cost)| {
            RequestDescriptor::new(vec![(key.into(), value.into())], cost, None).unwrap()
        })
        .collect();
    CheckRequest::new("q".into(), descriptors).unwrap()
}

async fn ask(limiter: &Limiter, descriptors: &[(&str, &str, u64)]) -> CheckResponse {
    limiter.check(&request(descriptors)).await.unwrap()
}

fn codes(response: &CheckResponse) -> (Code, Vec<Code>) {
    let statuses = response.statuses.iter().map(|s| s.code).collect();
    (response.overall, statuses)
}

fn remaining(response: &CheckResponse, i: usize) -> u64 {
    response.statuses[i].decision.unwrap().remaining
}

use Code::{Ok, OverLimit as Over};

/// The behaviour every store must give. Each call uses values of its own (`run`), so one
/// store can run it more than once.
async fn quota_mode_on(limiter: &Limiter, run: &str) {
    let u = &format!("u{run}");
    let three = [("plain", u.as_str(), 1), ("qa", u, 1), ("qb", u, 1)];
    // All under their limits: admitted, every limit charged.
    let first = ask(limiter, &three).await;
    assert_eq!(codes(&first), (Ok, vec![Ok, Ok, Ok]), "{first:?}");
    // One quota limit over, the other not: admitted. The over one reports OVER_LIMIT and
    // charges nothing; the others are charged.
    let second = ask(limiter, &three).await;
    assert_eq!(codes(&second), (Ok, vec![Ok, Over, Ok]), "{second:?}");
    assert_eq!(remaining(&second, 0), 8);
    assert_eq!(remaining(&second, 2), 0);
    // Every quota limit over: denied, and nothing is charged anywhere.
    let third = ask(limiter, &three).await;
    assert_eq!(codes(&third), (Over, vec![Ok, Over, Over]), "{third:?}");
    assert_eq!(remaining(&third, 0), 8, "as it stands: nothing charged");
    let plain = ask(limiter, &[("plain", u, 1)]).await;
    assert_eq!(remaining(&plain, 0), 7, "{plain:?}");

    // A lone quota limit over is every quota limit over.
    let v = &format!("v{run}");
    assert_eq!(codes(&ask(limiter, &[("qa", v, 1)]).await), (Ok, vec![Ok]));
    assert_eq!(
        codes(&ask(limiter, &[("qa", v, 1)]).await),
        (Over, vec![Over])
    );
    // A limit without quota mode over denies, whatever the quota limits say; the quota
    // limit that allowed is not charged (qb admits twice after it).
    let w = &format!("w{run}");
    assert_eq!(codes(&ask(limiter, &[("tight", w, 1)]).await).0, Ok);
    let denied = ask(limiter, &[("tight", w, 1), ("qb", w, 1)]).await;
    assert_eq!(codes(&denied), (Over, vec![Over, Ok]), "{denied:?}");
    for _ in 0..2 {
        assert_eq!(codes(&ask(limiter, &[("qb", w, 1)]).await).0, Ok);
    }
    assert_eq!(codes(&ask(limiter, &[("qb", w, 1)]).await).0, Over);

    // A shadow quota limit never counts as over: with it, the request is admitted though the
    // enforced quota limit is over (its status OK, as envoyproxy/ratelimit reports a shadow
    // limit).
    let s = &format!("s{run}");
    assert_eq!(codes(&ask(limiter, &[("qs", s, 1)]).await), (Ok, vec![Ok]));
    let over_in_shadow = ask(limiter, &[("qs", s, 1)]).await;
    assert_eq!(codes(&over_in_shadow), (Ok, vec![Ok]));
    assert!(over_in_shadow.statuses[0].shadow_would_deny);
    assert_eq!(codes(&ask(limiter, &[("qa", s, 1)]).await).0, Ok);
    let shadowed = ask(limiter, &[("plain", s, 1), ("qa", s, 1), ("qs", s, 1)]).await;
    assert_eq!(codes(&shadowed), (Ok, vec![Ok, Over, Ok]), "{shadowed:?}");
    assert_eq!(remaining(&shadowed, 0), 9, "the plain limit is charged");

    // A quota limit of 0 is one always over: alone among the quota limits it denies, charging
    // nothing; beside one with room it reports OVER_LIMIT and the request is admitted.
    let z = &format!("z{run}");
    let blocked = ask(limiter, &[("plain", z, 1), ("qz", z, 1)]).await;
    assert_eq!(codes(&blocked), (Over, vec![Ok, Over]), "{blocked:?}");
    let beside = ask(limiter, &[("plain", z, 1), ("qz", z, 1), ("qb", z, 1)]).await;
    assert_eq!(codes(&beside), (Ok, vec![Ok, Over, Ok]), "{beside:?}");
    assert_eq!(
        remaining(&beside, 0),
        9,
        "charged once: the block charged nothing before"
    );
}

/// A check (cost 0) on a limit exactly used up: OK when it answers as the counter stands
/// (RLS), OVER_LIMIT as tollgate's own check; on a `charge: up_to_limit` rule OVER_LIMIT both
/// ways, once an overshooting charge has used it up.
async fn checks_on(limiter: &Limiter, run: &str) {
    let u = &format!("c{run}");
    let check = |key: &'static str, as_is: bool| {
        let request = request(&[(key, u.as_str(), 0)]).with_checks_as_is(as_is);
        async move { limiter.check(&request).await.unwrap().overall }
    };
    assert_eq!(codes(&ask(limiter, &[("tight", u, 1)]).await).0, Ok);
    assert_eq!(check("tight", true).await, Ok, "used up, not past it");
    assert_eq!(check("tight", false).await, Over, "no unit left");
    // The token budget: a check admits, a charge overshoots (charged up to the limit), then
    // a check is over whichever way it is asked.
    assert_eq!(check("budget", true).await, Ok);
    let overshoot = ask(limiter, &[("budget", u, 5)]).await;
    assert_eq!(codes(&overshoot).0, Ok);
    assert_eq!(remaining(&overshoot, 0), 0);
    assert_eq!(check("budget", true).await, Over);
    assert_eq!(check("budget", false).await, Over);
}

async fn on_store(store: StoreBackend, clock: Arc<SystemClock>, run: &str) {
    assert!(store.wait_ready(Duration::from_secs(10)).await);
    let policy = Policy::from_yaml("q.yaml", POLICY).unwrap();
    let limiter = Limiter::with_failure_settings(policy, store, Default::default(), clock);
    quota_mode_on(&limiter, run).await;
    checks_on(&limiter, run).await;
}

#[tokio::test]
async fn quota_mode_and_checks_on_the_memory_store() {
    let clock = Arc::new(SystemClock::new());
    let store = StoreBackend::Memory(MemoryStore::new(clock.clone()));
    on_store(store, clock, "m").await;
}

/// The Redis stores (the `redis` feature).
#[cfg(feature = "redis")]
mod redis {
    use tollgate::store::{CoalesceOptions, RedisOptions, StoreUrl};
    use tollgate_testkit::{RedisCluster, RedisServer};

    use super::*;

    async fn on_redis(url: &str, options: RedisOptions, run: &str) {
        let clock = Arc::new(SystemClock::new());
        let url: StoreUrl = url.parse().unwrap();
        let store = StoreBackend::open(&url, options, clock.clone())
            .await
            .unwrap();
        on_store(store, clock, run).await;
    }

    fn options() -> RedisOptions {
        RedisOptions {
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(2),
            ..RedisOptions::default()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn quota_mode_and_checks_on_redis() {
        let redis = RedisServer::start();
        on_redis(&redis.url(), options(), "one").await;
        let batched = RedisOptions {
            coalesce: CoalesceOptions {
                max_batch: 0,
                ..CoalesceOptions::default()
            },
            ..options()
        };
        on_redis(&redis.url(), batched, "unbatched").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn quota_mode_and_checks_across_cluster_slots() {
        let cluster = RedisCluster::start(3, 0);
        on_redis(&cluster.store_url(), options(), "cluster").await;
    }
}
