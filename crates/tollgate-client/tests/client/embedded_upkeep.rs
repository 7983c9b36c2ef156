//! An embedded limiter keeps itself tidy like `tollgate serve` does: expired counters leave the
//! memory store, and the upkeep stops when the limiter is dropped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use tollgate::limiter::{CheckRequest, RequestDescriptor};
use tollgate::policy::Policy;
use tollgate::store::{Store, StoreUrl};
use tollgate_client::{Embedded, Options};

#[tokio::test]
async fn expired_counters_leave_the_memory_store() {
    let policy = Policy::from_yaml(
        "p.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {period: 100ms, requests_per_unit: 5}\n",
    )
    .unwrap();
    let embedded = Embedded::with_policy(policy, &StoreUrl::Memory, Options::default())
        .await
        .unwrap();
    for i in 0..20 {
        let entries = vec![("k".to_owned(), format!("user{i}"))];
        let descriptor = RequestDescriptor::new(entries, 1, None).unwrap();
        let request = CheckRequest::new("d".into(), vec![descriptor]).unwrap();
        assert!(embedded.limiter().check(&request).await.unwrap().allowed());
    }
    let store = embedded.limiter().store();
    assert_eq!(store.key_count().await.unwrap(), 20);
    // The counters expire after 100 ms; the upkeep sweeps once a second.
    let mut left = 20;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = store.key_count().await.unwrap();
        if left == 0 {
            break;
        }
    }
    assert_eq!(left, 0, "expired counters were never swept");

    // The upkeep holds no strong reference: dropping the last handle drops the limiter.
    let weak = Arc::downgrade(embedded.limiter());
    drop(embedded);
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(weak.upgrade().is_none());
}
