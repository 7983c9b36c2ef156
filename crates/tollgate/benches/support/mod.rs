//! Shared by the benches: a limiter per algorithm over the memory store, and a poll-once
//! executor (the memory store never waits, so one poll decides).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tollgate::clock::ManualClock;
use tollgate::limiter::{CheckRequest, Limiter, RequestDescriptor};
use tollgate::policy::Policy;
use tollgate::store::{MemoryStore, StoreBackend};
use tollgate_core::{Algorithm, Timestamp};

/// Length of the descriptor value every bench request carries. The memory store key built from
/// it for rule `k` of domain `bench` is 55 bytes: `r|12:d5:benchk1:k1|1:k30:` and the value.
pub const VALUE_LEN: usize = 30;

/// A limiter on the memory store with one rule, `limit` per `period` of `algorithm` on `k`.
pub fn limiter(algorithm: Algorithm, limit: u64, period: &str) -> (Arc<ManualClock>, Limiter) {
    let yaml = format!(
        "domain: bench\ndescriptors:\n  - key: k\n    rate_limit: {{name: r, period: {period}, requests_per_unit: {limit}, algorithm: {}}}\n",
        algorithm.name()
    );
    let policy = match Policy::from_yaml("bench.yaml", &yaml) {
        Ok(p) => p,
        Err(e) => panic!("bench policy: {e}"),
    };
    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
        1_700_000_000_000_000,
    )));
    let store = StoreBackend::Memory(MemoryStore::new(clock.clone()));
    (clock, Limiter::new(policy, store))
}

/// The request `k=<value n, zero-padded to 30 bytes>`.
pub fn request(n: usize) -> CheckRequest {
    let value = format!("{n:0width$}", width = VALUE_LEN);
    let d = RequestDescriptor::new(vec![("k".into(), value)], 1, None);
    match d.and_then(|d| CheckRequest::new("bench".into(), vec![d])) {
        Ok(r) => r,
        Err(e) => panic!("bench request: {e}"),
    }
}

/// Runs a future that completes without waiting (every memory-store call does).
pub fn ready<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a memory-store future waited"),
    }
}
