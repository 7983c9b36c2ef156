//! What `Embedded::open` refuses, and why, as a typed error.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use tollgate::policy::Policy;
use tollgate::store::StoreUrl;
use tollgate_client::{Embedded, OpenError, Options};
use tollgate_testkit::RedisServer;

/// Refilling a bucket of 10^12 at one per 400 days takes longer than the Redis scripts can
/// count exactly; the memory store decides it.
const INEXACT_ON_REDIS: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: gcra, period: 400d, requests_per_unit: 1, burst: 1000000000000}\n";

/// A rule the Redis store cannot decide exactly is refused before anything is decided: the
/// error names the store and holds every problem with its location, and says them as they
/// are.
#[tokio::test]
async fn a_rule_redis_cannot_decide_exactly_is_refused_with_its_location() {
    let redis = RedisServer::start();
    let url: StoreUrl = redis.url().parse().unwrap();
    let policy = Policy::from_yaml("p.yaml", INEXACT_ON_REDIS).unwrap();
    let refused = Embedded::with_policy(policy, &url, Options::default())
        .await
        .unwrap_err();
    let said = refused.to_string();
    let OpenError::Unsupported { store, problems } = refused else {
        panic!("not refused as unsupported: {refused}")
    };
    assert_eq!(store, "redis");
    assert_eq!(problems.0.len(), 1, "{problems}");
    assert_eq!(said, problems.to_string(), "the problems, as they are");
    assert!(
        said.contains("p.yaml:4:") && said.contains("cannot run on the redis store"),
        "{said}"
    );

    let policy = Policy::from_yaml("p.yaml", INEXACT_ON_REDIS).unwrap();
    Embedded::with_policy(policy, &StoreUrl::Memory, Options::default())
        .await
        .unwrap();
}
