//! A mixed fleet: the `tollgate` service and an embedded limiter (`tollgate-client`) in this
//! process share one Redis and one policy, so they enforce one quota together.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use support::Server;
use tollgate::limiter::{CheckRequest, RequestDescriptor};
use tollgate::store::{RedisOptions, StoreUrl};
use tollgate_client::{Backend, Embedded, Options};
use tollgate_testkit::RedisServer;

const POLICY: &str = "
domain: fleet
descriptors:
  - key: k
    rate_limit: {name: shared, unit: day, requests_per_unit: 100}
";

/// 64 concurrent callers, half through the service's HTTP API and half through the embedded
/// limiter, 4 requests each on one key with a limit of 100: exactly 100 are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_and_embedded_limiter_share_one_quota() {
    let redis = RedisServer::start();
    let server =
        Server::start_with_args(POLICY, &["--store", &redis.url(), "--store-timeout", "2s"]);
    let store: StoreUrl = redis.url().parse().unwrap();
    let options = Options {
        redis: RedisOptions {
            command_timeout: Duration::from_secs(2),
            ..RedisOptions::default()
        },
        ..Options::default()
    };
    let embedded = Arc::new(
        Embedded::open(&server.config, &store, options)
            .await
            .unwrap(),
    );
    let http = reqwest::Client::new();
    let url = server.url("/v1/check");

    let allowed = Arc::new(AtomicU64::new(0));
    let via_service = Arc::new(AtomicU64::new(0));
    let via_embedded = Arc::new(AtomicU64::new(0));
    let mut callers = Vec::new();
    for caller in 0..64 {
        let allowed = allowed.clone();
        let (embedded, http, url) = (embedded.clone(), http.clone(), url.clone());
        let (via_service, via_embedded) = (via_service.clone(), via_embedded.clone());
        callers.push(tokio::spawn(async move {
            for _ in 0..4 {
                let admitted = if caller % 2 == 0 {
                    let body = serde_json::json!({
                        "domain": "fleet",
                        "descriptors": [{"entries": [{"key": "k", "value": "v"}]}],
                    });
                    let r = http.post(&url).json(&body).send().await.unwrap();
                    let status = r.status().as_u16();
                    assert!(status == 200 || status == 429, "status {status}");
                    let body: serde_json::Value = r.json().await.unwrap();
                    assert!(body.get("degraded").is_none(), "{body}");
                    let admitted = status == 200;
                    via_service.fetch_add(u64::from(admitted), Ordering::SeqCst);
                    admitted
                } else {
                    let d =
                        RequestDescriptor::new(vec![("k".into(), "v".into())], 1, None).unwrap();
                    let check = CheckRequest::new("fleet".into(), vec![d]).unwrap();
                    let verdict = embedded.check(&check).await.unwrap();
                    assert!(
                        verdict.header("x-tollgate-degraded").is_none(),
                        "{verdict:?}"
                    );
                    let admitted = verdict.allowed();
                    via_embedded.fetch_add(u64::from(admitted), Ordering::SeqCst);
                    admitted
                };
                if admitted {
                    allowed.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for c in callers {
        c.await.unwrap();
    }
    let (service, local) = (
        via_service.load(Ordering::SeqCst),
        via_embedded.load(Ordering::SeqCst),
    );
    assert_eq!(
        allowed.load(Ordering::SeqCst),
        100,
        "256 requests: {service} admitted by the service, {local} by the embedded limiter"
    );
    eprintln!("admitted: {service} by the service, {local} by the embedded limiter");

    // Deterministically: each side sees the other's charges.
    let check = || {
        let d = RequestDescriptor::new(vec![("k".into(), "w".into())], 1, None).unwrap();
        CheckRequest::new("fleet".into(), vec![d]).unwrap()
    };
    let body = serde_json::json!({
        "domain": "fleet",
        "descriptors": [{"entries": [{"key": "k", "value": "w"}]}],
    });
    let first = embedded.check(&check()).await.unwrap();
    assert_eq!(first.header("x-ratelimit-remaining"), Some("99"));
    let second = http.post(&url).json(&body).send().await.unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(second.headers()["x-ratelimit-remaining"], "98");
    let third = embedded.check(&check()).await.unwrap();
    assert_eq!(third.header("x-ratelimit-remaining"), Some("97"));
}

const FOLLOWED: &str = "
domain: fleet
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: day, requests_per_unit: 100}
";

/// How often the service and the embedded limiter below look at Redis.
const SYNC: Duration = Duration::from_millis(200);

/// Waits (5 s at most: many intervals, on a loaded machine) until `done` holds; how long it took.
async fn within_sync(what: &str, done: impl Fn() -> bool) -> Duration {
    let start = tokio::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the embedded limiter never followed: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// How many of `n` checks for `user` the embedded limiter admits, and the limit it advertised.
async fn admitted(embedded: &Embedded, user: &str, n: usize) -> (usize, Option<String>) {
    let (mut admitted, mut limit) = (0, None);
    for _ in 0..n {
        let d = RequestDescriptor::new(vec![("user".into(), user.into())], 1, None).unwrap();
        let verdict = embedded
            .check(&CheckRequest::new("fleet".into(), vec![d]).unwrap())
            .await
            .unwrap();
        admitted += usize::from(verdict.allowed());
        limit = verdict.header("x-ratelimit-limit").map(str::to_owned);
    }
    (admitted, limit)
}

/// The embedded limiter follows the fleet it shares a Redis with: an override set through the
/// service's admin API, a pushed tighter limit and a rollback are enforced by it within the
/// sync interval, as by the service. It used to run no sync: it kept admitting (and
/// advertising) its own policy's quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_limiter_follows_overrides_pushes_and_rollbacks() {
    let redis = RedisServer::start();
    let interval = format!("{}ms", SYNC.as_millis());
    let server = Server::start_with_args(
        FOLLOWED,
        &[
            "--store",
            &redis.url(),
            "--store-timeout",
            "2s",
            "--policy-sync-interval",
            &interval,
        ],
    );
    let store: StoreUrl = redis.url().parse().unwrap();
    let options = Options {
        redis: RedisOptions {
            command_timeout: Duration::from_secs(2),
            ..RedisOptions::default()
        },
        ..Options::default()
    }
    .policy_sync(Some(SYNC));
    // Started on a policy of its own (50 a day): it takes the fleet's and never publishes its own.
    let own =
        tollgate::policy::Policy::from_yaml("own.yaml", &FOLLOWED.replace("100}", "50}")).unwrap();
    let embedded = Embedded::with_policy(own, &store, options).await.unwrap();
    let limiter = embedded.limiter().clone();
    let rule_limit = move || limiter.policy().rules()[0].limit.map(|p| p.limit());
    let rule = rule_limit.clone();
    within_sync("the fleet's policy", move || rule() == Some(100)).await;
    tokio::time::sleep(SYNC * 3).await;
    let body = serde_json::json!({"domain": "fleet",
        "descriptors": [{"entries": [{"key": "user", "value": "erin"}]}]});
    let r = reqwest::Client::new()
        .post(server.url("/v1/check"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["x-ratelimit-limit"],
        "100",
        "the service kept its policy"
    );

    // An override for alice, set on the service: 5 a day.
    let set = serde_json::json!({"domain": "fleet", "rule": "per_user",
        "entries": [{"key": "user", "value": "alice"}], "requests_per_unit": 5});
    let r = server
        .admin_send(reqwest::Method::PUT, "/v1/admin/overrides", &set)
        .await;
    assert_eq!(r.status(), 200);
    let overrides = embedded.limiter().clone();
    let took = within_sync("the override", || !overrides.overrides().all().is_empty()).await;
    eprintln!("override followed in {took:?}");
    assert_eq!(
        admitted(&embedded, "alice", 8).await,
        (5, Some("5".to_owned()))
    );
    assert_eq!(
        admitted(&embedded, "bob", 8).await,
        (8, Some("100".to_owned()))
    );

    // A tighter limit pushed to the service: 3 a day.
    let push = serde_json::json!({"sources": [{"name": "pushed.yaml",
        "text": FOLLOWED.replace("100}", "3}")}]});
    let r = server
        .admin_send(reqwest::Method::POST, "/v1/admin/policy", &push)
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let rule = rule_limit.clone();
    let took = within_sync("the push", move || rule() == Some(3)).await;
    eprintln!("push followed in {took:?}");
    assert_eq!(
        admitted(&embedded, "carol", 5).await,
        (3, Some("3".to_owned()))
    );

    // Rolled back on the service: 100 a day again.
    let r = server
        .admin_send(
            reqwest::Method::POST,
            "/v1/admin/policy/rollback",
            &serde_json::json!({}),
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let rule = rule_limit.clone();
    let took = within_sync("the rollback", move || rule() == Some(100)).await;
    eprintln!("rollback followed in {took:?}");
    assert_eq!(
        admitted(&embedded, "dave", 5).await,
        (5, Some("100".to_owned()))
    );
}
