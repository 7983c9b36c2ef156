//! The cap on store calls in flight, the queue of decisions waiting for a place under it, and
//! the deadline a decision's store work runs within.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::options::QUEUED_PER_IN_FLIGHT;
use super::patience::Deadline;
use super::store::RedisStore;
use super::timeout::within;
use crate::store::{RedisCall, Refusal, ShedReason, StoreError};

/// A decision counted among those waiting for a place under the in-flight cap while it lives.
struct Waiting<'a> {
    count: &'a AtomicUsize,
    /// How many were waiting before it.
    ahead: usize,
}

impl<'a> Waiting<'a> {
    fn join(count: &'a AtomicUsize) -> Self {
        let ahead = count.fetch_add(1, Ordering::Relaxed);
        Waiting { count, ahead }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

impl RedisStore {
    /// The deadline of a decision beginning now.
    pub(super) fn deadline(&self) -> Deadline {
        Deadline::starting(self.options.command_timeout, self.options.max_wait)
    }

    /// Runs the store work `work` makes under the in-flight cap and within the deadline of a
    /// decision beginning now.
    pub(super) async fn bounded<T, F>(
        &self,
        work: impl FnOnce(Deadline) -> F,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        let (_in_flight, deadline) = self.in_flight_place(self.deadline()).await?;
        within(deadline.ceiling, RedisCall::Scripts, work(deadline)).await
    }

    /// A place under the in-flight cap, and the decision's deadline from when it got it. Past
    /// the cap a decision waits its turn, up to its ceiling (or sheds at once when
    /// [`QUEUED_PER_IN_FLIGHT`] times the cap already wait): a burst is not a store failure.
    pub(super) async fn in_flight_place(
        &self,
        deadline: Deadline,
    ) -> Result<(tokio::sync::SemaphorePermit<'_>, Deadline), StoreError> {
        if let Ok(permit) = self.in_flight.try_acquire() {
            return Ok((permit, deadline));
        }
        let queue = self
            .options
            .max_in_flight
            .saturating_mul(QUEUED_PER_IN_FLIGHT);
        let waiting = Waiting::join(&self.waiting);
        if waiting.ahead >= queue {
            return Err(self.shed.shed(ShedReason::QueueFull));
        }
        match tokio::time::timeout_at(deadline.ceiling, self.in_flight.acquire()).await {
            Ok(Ok(permit)) => Ok((permit, deadline.sent())),
            Ok(Err(_)) => Err(StoreError::NotCalled(Refusal::Closed)),
            Err(_) => Err(self.shed.shed(ShedReason::WaitedTooLong)),
        }
    }
}
