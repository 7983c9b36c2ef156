//! Store calls timed in a latency histogram, unless they never reached the store: the
//! [`Timed`] layer at the bottom of the decision path, and [`timed_store_call`] for the calls
//! the lease engine makes on its own.

use std::future::Future;
use std::sync::Arc;

use tollgate_core::Decision;

use super::charge::Charge;
use super::contract::{Answered, Call, Decisions, Granting, Mode, Store, health_of_inner};
use super::error::StoreError;
use crate::observe::Histogram;

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

/// A store whose decisions are timed: `[apply, peek]` by the call's mode (a partial answer's
/// charging call as an apply).
#[derive(Debug)]
pub struct Timed<S> {
    inner: S,
    latency: [Histogram; 2],
}

impl<S> Timed<S> {
    /// Times the calls to `inner`.
    pub fn new(inner: S) -> Self {
        Timed {
            inner,
            latency: [
                Histogram::new(Histogram::LATENCY_SECONDS),
                Histogram::new(Histogram::LATENCY_SECONDS),
            ],
        }
    }

    /// The store timed.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The latencies: `[apply, peek]`.
    pub fn latency(&self) -> &[Histogram; 2] {
        &self.latency
    }

    /// The latency of calls in `mode`.
    pub fn latency_of(&self, mode: Mode) -> &Histogram {
        &self.latency[usize::from(!mode.applies())]
    }
}

impl<S: Store> Store for Timed<S> {
    async fn decide(
        &self,
        call: Call,
        charges: &[Charge<'_>],
        decisions: &mut Decisions,
    ) -> Result<Answered, StoreError> {
        let histogram = self.latency_of(call.mode);
        timed_store_call(histogram, self.inner.decide(call, charges, decisions)).await
    }

    async fn apply_before(
        &self,
        charges: &[Charge<'_>],
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        let call = self.inner.apply_before(charges, deadline);
        timed_store_call(&self.latency[0], call).await
    }

    health_of_inner!();
}

impl<S: Granting> Granting for Timed<S> {
    type Grantor = S::Grantor;

    fn grantor(&self) -> Option<&Arc<Self::Grantor>> {
        self.inner.grantor()
    }

    fn shared(&self) -> bool {
        self.inner.shared()
    }
}
