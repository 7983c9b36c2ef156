//! Store calls timed in a latency histogram, unless they never reached the store.

use std::future::Future;

use crate::observe::Histogram;

use super::StoreError;

/// Awaits a store call, timing it in `histogram` unless it never reached the store (refused by
/// an open breaker, the in-flight cap...).
pub async fn timed_store_call<T>(
    histogram: &Histogram,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = tokio::time::Instant::now();
    let answer = call.await;
    observe(histogram, started, &answer);
    answer
}

fn observe<T>(
    histogram: &Histogram,
    started: tokio::time::Instant,
    answer: &Result<T, StoreError>,
) {
    if !matches!(answer, Err(StoreError::NotCalled(_))) {
        histogram.observe(started.elapsed());
    }
}
