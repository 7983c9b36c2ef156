//! How long a decision waits on Redis, and what a wait that ends without an answer means.
//!
//! A burst is not a store failure. Three waits are told apart:
//!
//! - In tollgate's own queue (the coalescer's, or for a place under the in-flight cap): the
//!   store has not seen the decision yet, so this wait says nothing about it and never goes to
//!   the breaker. It is bounded by `max_wait` from the decision's start.
//! - On a call sent to a node: `command_timeout` runs from when the call is sent. A call still
//!   out at its deadline, on a node that has answered other calls since it was sent and within
//!   the last `command_timeout`, waits its turn: the node is busy working through a backlog
//!   ahead of it. On a node that answered nothing, the timeout goes to the node's breaker as a
//!   failure; the call fails (the posture answers) once the breaker sees the node failing (it
//!   is no longer closed), and waits on, another `command_timeout` at a time, while it does
//!   not: one slow moment of a healthy store is not an outage.
//! - In all, past `max_wait`: the failure posture answers for load (this process is behind),
//!   counted and logged apart from store failures ([`Shed`]: `tollgate_store_shed_total`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::breaker::{Breaker, BreakerState};
use crate::observe::Throttle;
use crate::observe::prometheus::{Exposition, Kind};
use crate::store::StoreError;

/// When a decision's store calls must have answered.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadline {
    /// `command_timeout` after the decision's calls were sent (never past `ceiling`).
    pub at: Instant,
    /// `max_wait` after the decision began: the most it waits, busy store or not.
    pub ceiling: Instant,
    /// `command_timeout`: a call's allowance, and each extension of it on a busy node.
    pub step: Duration,
}

impl Deadline {
    /// The deadline of a decision beginning now (`max_wait` at least `step`).
    pub fn starting(step: Duration, max_wait: Duration) -> Self {
        let now = Instant::now();
        let ceiling = now + max_wait.max(step);
        Deadline {
            at: (now + step).min(ceiling),
            ceiling,
            step,
        }
    }

    /// The deadline of a decision whose store deadline is `at` (a request's remaining charges,
    /// [`StoreError::Partly`]): it may wait on a busy node up to `max_wait` past it.
    pub fn until(at: Instant, step: Duration, max_wait: Duration) -> Self {
        Deadline {
            at,
            ceiling: at + max_wait.saturating_sub(step),
            step,
        }
    }

    /// The same decision's calls sent now, after a wait in tollgate's own queue: their
    /// `command_timeout` runs from now.
    pub fn sent(self) -> Self {
        Deadline {
            at: (Instant::now() + self.step).min(self.ceiling),
            ..self
        }
    }

    /// The instant the late-call guard of a call sent now counts its allowance
    /// (`command_timeout` and the slack) from: now, or earlier when the ceiling cuts the
    /// caller's wait shorter than that (see `now`).
    pub fn guard_since(&self) -> std::time::Instant {
        let now = Instant::now();
        let latest = self.ceiling.checked_sub(self.step).unwrap_or(self.ceiling);
        now.min(latest).into_std()
    }
}

/// Why a wait ended without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unanswered {
    /// The node answered nothing for `command_timeout` while the call was out: it fails.
    Stalled,
    /// The decision reached its ceiling while the node was busy: shed for load.
    TooLong,
}

/// `call`'s answer (`calls` decisions' calls, sent at `sent` to `node`), waiting as the module
/// docs say: until `deadline.at`, and on while the node answers others or its breaker stays
/// closed, up to `deadline.ceiling`.
pub(super) async fn patiently<T>(
    deadline: Deadline,
    (node, breaker): (&str, &Breaker),
    sent: Instant,
    calls: usize,
    call: impl Future<Output = T>,
) -> Result<T, Unanswered> {
    let mut call = std::pin::pin!(call);
    let mut at = deadline.at;
    loop {
        if let Ok(answer) = tokio::time::timeout_at(at, &mut call).await {
            return Ok(answer);
        }
        let now = Instant::now();
        let recently = now.checked_sub(deadline.step).unwrap_or(sent).max(sent);
        // A timer that fired a whole step late says this process was starved (a loaded box),
        // not that the node was: its replies may be waiting unread. One more step.
        let starved = now.saturating_duration_since(at) >= deadline.step;
        if !breaker.answered_after(recently) && !starved {
            if let Some(state) = breaker.timed_out(calls) {
                warn!(node = %node, state = state.name(), "Circuit breaker changed state");
            }
            if breaker.state() != BreakerState::Closed || now >= deadline.ceiling {
                return Err(Unanswered::Stalled);
            }
        } else if now >= deadline.ceiling {
            return Err(Unanswered::TooLong);
        }
        at = (now + deadline.step).min(deadline.ceiling);
    }
}

/// Why the failure posture answered a decision for load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ShedReason {
    /// Tollgate's queue towards the store was full.
    QueueFull,
    /// The decision waited `max_wait` (in the queue, for a place, or on a busy node).
    WaitedTooLong,
}

impl ShedReason {
    const ALL: [ShedReason; 2] = [ShedReason::QueueFull, ShedReason::WaitedTooLong];

    fn name(self) -> &'static str {
        match self {
            ShedReason::QueueFull => "queue_full",
            ShedReason::WaitedTooLong => "waited_too_long",
        }
    }
}

/// Decisions answered by the failure posture because this process was behind, not because the
/// store failed: counted and logged apart.
#[derive(Debug)]
pub(super) struct Shed {
    counts: [AtomicU64; 2],
    log: Throttle,
}

impl Default for Shed {
    fn default() -> Self {
        Shed {
            counts: [AtomicU64::new(0), AtomicU64::new(0)],
            log: Throttle::new(Duration::from_secs(1)),
        }
    }
}

impl Shed {
    /// Counts one decision shed for `reason`, logs it (at most once a second), and returns the
    /// error the posture answers for. Nothing went to the breaker.
    pub fn shed(&self, reason: ShedReason) -> StoreError {
        let total = self.counts[reason as usize].fetch_add(1, Ordering::Relaxed) + 1;
        let why = match reason {
            ShedReason::QueueFull => "tollgate's queue towards Redis is full",
            ShedReason::WaitedTooLong => "the decision waited --store-max-wait for a busy Redis",
        };
        if let Some(held_back) = self.log.note(Instant::now()) {
            warn!(
                reason = reason.name(),
                shed_total = total,
                held_back,
                "Store busy, not failing: {why}; the failure posture answered for load"
            );
        }
        StoreError::NotCalled(format!("redis busy: {why}"))
    }

    /// Decisions shed for `reason` so far.
    pub fn count(&self, reason: ShedReason) -> u64 {
        self.counts[reason as usize].load(Ordering::Relaxed)
    }

    /// Prometheus text for the counter, one series per reason from the start.
    pub fn render(&self, out: &mut String) {
        let mut text = Exposition::new(out);
        let mut family = text.family(
            "tollgate_store_shed_total",
            "Decisions the failure posture answered because tollgate was behind (its queue towards Redis full, or a wait past --store-max-wait), not because the store failed; tollgate_store_errors_total counts them too.",
            Kind::Counter,
        );
        for reason in ShedReason::ALL {
            family.sample(&[("reason", reason.name())], self.count(reason));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::SystemClock;
    use crate::store::redis::breaker::BreakerConfig;

    fn breaker() -> Arc<Breaker> {
        Arc::new(Breaker::new(
            BreakerConfig::default(),
            Arc::new(SystemClock::new()),
        ))
    }

    const STEP: Duration = Duration::from_millis(20);

    /// Calls out on a node that answers nothing fail at their deadline once their timeouts
    /// open its breaker.
    #[tokio::test]
    async fn a_call_on_a_silent_node_fails_at_its_deadline() {
        let breaker = breaker();
        let deadline = Deadline::starting(STEP, Duration::from_secs(5));
        let started = Instant::now();
        // Five calls time out together: the breaker opens at once.
        let call = std::future::pending::<()>();
        let waited = patiently(deadline, ("node", &breaker), started, 5, call).await;
        assert_eq!(waited, Err(Unanswered::Stalled));
        assert_eq!(breaker.state(), BreakerState::Open);
        assert!(started.elapsed() < STEP * 3, "{:?}", started.elapsed());
    }

    /// A call out on a node that keeps answering other calls waits its turn, past its deadline,
    /// up to the ceiling.
    #[tokio::test]
    async fn a_call_on_a_busy_node_waits_its_turn_up_to_the_ceiling() {
        let breaker = breaker();
        let answering = {
            let breaker = breaker.clone();
            tokio::spawn(async move {
                loop {
                    breaker.try_call().unwrap().succeeded();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        };
        let deadline = Deadline::starting(STEP, Duration::from_millis(300));
        let sent = Instant::now();
        let late = async {
            tokio::time::sleep(STEP * 4).await;
            "answered"
        };
        let node = ("node", breaker.as_ref());
        assert_eq!(
            patiently(deadline, node, sent, 1, late).await,
            Ok("answered")
        );
        let waited = patiently(deadline, node, sent, 1, std::future::pending::<()>()).await;
        assert_eq!(waited, Err(Unanswered::TooLong));
        answering.abort();
    }

    #[test]
    fn each_reason_is_counted_apart_and_rendered_from_the_start() {
        let shed = Shed::default();
        let mut text = String::new();
        shed.render(&mut text);
        assert!(text.contains("tollgate_store_shed_total{reason=\"queue_full\"} 0"));
        assert!(text.contains("tollgate_store_shed_total{reason=\"waited_too_long\"} 0"));
        let error = shed.shed(ShedReason::WaitedTooLong);
        assert!(matches!(error, StoreError::NotCalled(_)), "{error}");
        assert_eq!(shed.count(ShedReason::WaitedTooLong), 1);
        assert_eq!(shed.count(ShedReason::QueueFull), 0);
    }
}
