//! What the Redis store tests share: a store opened and ready, and an hourly limit.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::SystemClock;
use tollgate::store::{RedisOptions, StoreBackend, StoreUrl};
use tollgate_core::{Algorithm, Params};

/// The store at `url`, coalescing as `serve` does, with `command_timeout`, ready to decide.
pub async fn open_ready(url: &str, command_timeout: Duration) -> StoreBackend {
    let url: StoreUrl = url.parse().unwrap();
    let options = RedisOptions {
        connect_timeout: Duration::from_secs(2),
        command_timeout,
        ..RedisOptions::default()
    };
    let store = StoreBackend::open(&url, options, Arc::new(SystemClock::new()))
        .await
        .unwrap();
    assert!(store.wait_ready(Duration::from_secs(10)).await);
    store
}

/// `limit` an hour with `algorithm`.
pub fn hourly(algorithm: Algorithm, limit: u64) -> Params {
    Params::new(algorithm, limit, Duration::from_secs(3600), None).unwrap()
}
