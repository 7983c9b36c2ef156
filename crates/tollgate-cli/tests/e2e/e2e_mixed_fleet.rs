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
