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
//!   ahead of it. On a node that answered nothing, the call waits on, another
//!   `command_timeout` at a time, while the node's breaker stays closed (one slow moment of a
//!   healthy store is not an outage), and fails (the posture answers) once it is not.
//! - In all, past `max_wait`: the failure posture answers for load (this process is behind),
//!   counted and logged apart from store failures ([`Shed`]: `tollgate_store_shed_total`).
//!
//! ## Whose silence a deadline tells
//!
//! The rule: **a node's silence is counted once per deadline, by the oldest call out on it,
//! after this process has caught up; it counts one failure for each decision out on the node,
//! [`SILENCE_FAILURES`] at most.** In detail:
//!
//! - Only the oldest call out on the node speaks for it. The calls sent after it share its
//!   connection and queue behind it, so their deadlines passing tells nothing its own does
//!   not: a thousand calls out on a node that was silent for one deadline are one silence, not
//!   a thousand timeouts. The others wait on without a word, and fail when the breaker opens
//!   (at once, not at their next deadline).
//! - Only when this process has caught up: a deadline timer that fired a whole
//!   `command_timeout` late says this process was starved, not the node; and before the
//!   silence counts, the runtime gets one turn ([`tokio::task::yield_now`]), so that a reply
//!   that reached the socket while this process was behind is read and taken, not counted.
//! - [`SILENCE_FAILURES`] (two) per deadline at most, however many decisions wait: with
//!   `--breaker-failures` 5, a node that leaves decisions unanswered for three deadlines in a
//!   row opens its breaker (a lone decision, after five), and one silent for two does not.
//!
//! This tells a healthy Redis in a burst from a slow one (measured as docs/burst.md says, on
//! a shared 2-core machine at a load average of 15 to 17): in 20 bursts of 3,000 checks on
//! one Redis and on a cluster, an oldest call passed its 10 ms deadline unanswered, with this
//! process on time, 27 times; the reply was already there, unread, 7 times (taken at the
//! re-check), and no node stayed silent for more than two deadlines in a row. Counting every
//! call out as a timeout (the rule before) opened a node's breaker at its first deadline of
//! silence, in 4 of 6 cluster bursts (load 20). A Redis behind 50 ms of latency each way (20 ms
//! deadline) is silent for five deadlines: its breaker opens at the third, 60 to 65 ms after
//! the calls were sent, and every decision gets the posture within the latency bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::time::Instant;
use tracing::warn;

use super::breaker::{Breaker, BreakerState};
use crate::observe::Throttle;
use crate::observe::prometheus::{Exposition, Kind};
use crate::store::{Refusal, ShedReason, StoreError};

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

/// Most breaker failures one deadline of a node's silence counts (see the module docs).
pub(super) const SILENCE_FAILURES: usize = 2;

/// `call`'s answer (a call carrying `decisions` decisions, sent at `sent` to `node`), waiting
/// as the module docs say: until `deadline.at`, and on while the node answers others or its
/// breaker stays closed, up to `deadline.ceiling`.
pub(super) async fn patiently<T>(
    deadline: Deadline,
    (node, breaker): (&str, &Breaker),
    sent: Instant,
    decisions: usize,
    call: impl Future<Output = T>,
) -> Result<T, Unanswered> {
    let out = breaker.call_out(decisions);
    let mut call = std::pin::pin!(call);
    let mut at = deadline.at;
    loop {
        // Made before the state is looked at, so that an opening in between is not missed.
        let opened = breaker.opened();
        tokio::select! {
            biased;
            answer = &mut call => return Ok(answer),
            // Opened by the oldest call's silence (or the node's errors): the node is failing,
            // and the calls out on it fail now rather than at their next deadline.
            () = opened, if breaker.state() == BreakerState::Closed => {
                return Err(Unanswered::Stalled);
            }
            () = tokio::time::sleep_until(at) => {}
        }
        let now = Instant::now();
        let recently = now.checked_sub(deadline.step).unwrap_or(sent).max(sent);
        // A timer that fired a whole step late says this process was starved (a loaded box),
        // not that the node was: its replies may be waiting unread. One more step.
        let starved = now.saturating_duration_since(at) >= deadline.step;
        let speaks = !starved && !breaker.answered_after(recently) && out.is_oldest();
        if speaks {
            // One turn to the runtime first: a reply read meanwhile is an answer, and answers
            // to other calls show the node busy.
            tokio::task::yield_now().await;
            if let Some(answer) = call.as_mut().now_or_never() {
                return Ok(answer);
            }
        }
        let silent = !starved && !breaker.answered_after(recently);
        if silent {
            if speaks
                && let Some(state) = breaker.timed_out(out.decisions_out().min(SILENCE_FAILURES))
            {
                warn!(node = %node, state = state.name(), "Circuit breaker changed state");
            }
            if breaker.state() != BreakerState::Closed || now >= deadline.ceiling {
                return Err(Unanswered::Stalled);
            }
        } else if now >= deadline.ceiling {
            return Err(Unanswered::TooLong);
        }
        // The next deadline one step after this one, not after the late moment this one was
        // seen at; one step from now when this process was starved past it.
        let next = at + deadline.step;
        at = if next > now {
            next
        } else {
            now + deadline.step
        }
        .min(deadline.ceiling);
    }
}

/// The counters' side of [`ShedReason`] (its text is the refusal's, in `store::error`).
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
        if let Some(held_back) = self.log.note(Instant::now()) {
            warn!(
                reason = reason.name(),
                shed_total = total,
                held_back,
                "Store busy, not failing: {reason}; the failure posture answered for load"
            );
        }
        StoreError::NotCalled(Refusal::Busy(reason))
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

    /// `count` calls of one decision each, sent together to a node whose calls end after
    /// `answer` (never, if `None`): each one's outcome and when it ended, from the start.
    async fn calls_at_once(
        breaker: &Arc<Breaker>,
        count: usize,
        answer: Option<Duration>,
    ) -> Vec<(Result<(), Unanswered>, Duration)> {
        let started = Instant::now();
        let calls = (0..count).map(|_| {
            let breaker = breaker.clone();
            tokio::spawn(async move {
                let deadline = Deadline::starting(STEP, Duration::from_secs(5));
                let call = async {
                    match answer {
                        Some(after) => tokio::time::sleep(after).await,
                        None => std::future::pending().await,
                    }
                };
                let node = ("node", breaker.as_ref());
                let outcome = patiently(deadline, node, Instant::now(), 1, call).await;
                (outcome, started.elapsed())
            })
        });
        let calls: Vec<_> = calls.collect();
        let mut outcomes = Vec::with_capacity(count);
        for call in calls {
            outcomes.push(call.await.unwrap());
        }
        outcomes
    }

    /// A burst on a node that answers late, but answers: a thousand calls unanswered at their
    /// deadline, and at the next, are one node's silence of two deadlines, not two thousand
    /// timeouts. Every call waits for its answer, and the breaker stays closed.
    #[tokio::test(start_paused = true)]
    async fn a_burst_on_a_node_that_answers_late_gets_its_answers() {
        let breaker = breaker();
        let late = STEP * 5 / 2;
        let outcomes = calls_at_once(&breaker, 1_000, Some(late)).await;
        assert!(
            outcomes
                .iter()
                .all(|(outcome, took)| outcome.is_ok() && *took == late),
            "{:?}",
            outcomes.iter().find(|(outcome, _)| outcome.is_err())
        );
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    /// Calls on a silent node fail once its silence has lasted three deadlines (two failures
    /// for each: the breaker opens at 5), however many calls are out: the oldest one opens the
    /// breaker at its third deadline, and the others fail with it.
    #[tokio::test(start_paused = true)]
    async fn calls_on_a_silent_node_fail_at_its_third_deadline_of_silence() {
        for count in [2, 1_000] {
            let breaker = breaker();
            let outcomes = calls_at_once(&breaker, count, None).await;
            assert_eq!(breaker.state(), BreakerState::Open, "{count} calls");
            for (outcome, took) in outcomes {
                assert_eq!(outcome, Err(Unanswered::Stalled), "{count} calls");
                assert_eq!(took, STEP * 3, "{count} calls");
            }
        }
    }

    /// A lone decision on a silent node counts one failure a deadline: it fails at its fifth.
    #[tokio::test(start_paused = true)]
    async fn a_lone_call_on_a_silent_node_fails_at_its_fifth_deadline() {
        let breaker = breaker();
        let outcomes = calls_at_once(&breaker, 1, None).await;
        assert_eq!(outcomes, [(Err(Unanswered::Stalled), STEP * 5)]);
        assert_eq!(breaker.state(), BreakerState::Open);
    }

    /// A reply that reached this process at the deadline, but is read only at the runtime's
    /// next turn (the process was behind), is taken at the re-check, and nothing is counted: a
    /// breaker that opens at one failure stays closed.
    #[tokio::test(start_paused = true)]
    async fn a_reply_unread_at_the_deadline_is_taken_not_counted() {
        /// Pending until `at`; then pending once more (the reply is there, unread), then
        /// answered.
        struct UnreadAt(Instant, bool);
        impl Future for UnreadAt {
            type Output = &'static str;
            fn poll(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<&'static str> {
                if Instant::now() < self.0 || !std::mem::replace(&mut self.1, true) {
                    return std::task::Poll::Pending;
                }
                std::task::Poll::Ready("answered")
            }
        }
        let breaker = Arc::new(Breaker::new(
            BreakerConfig {
                consecutive_failures: 1,
                ..BreakerConfig::default()
            },
            Arc::new(SystemClock::new()),
        ));
        let deadline = Deadline::starting(STEP, Duration::from_secs(5));
        let call = UnreadAt(deadline.at, false);
        let node = ("node", breaker.as_ref());
        let answer = patiently(deadline, node, Instant::now(), 1, call).await;
        assert_eq!(answer, Ok("answered"));
        assert_eq!(breaker.state(), BreakerState::Closed);
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
        assert!(
            matches!(
                error,
                StoreError::NotCalled(Refusal::Busy(ShedReason::WaitedTooLong))
            ),
            "{error}"
        );
        assert_eq!(shed.count(ShedReason::WaitedTooLong), 1);
        assert_eq!(shed.count(ShedReason::QueueFull), 0);
    }
}
