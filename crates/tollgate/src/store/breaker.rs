//! A circuit breaker per Redis node: stop calling a sick node at once, probe it, and come back
//! when it heals; and the permit that logs the breaker changing state.
//!
//! Closed: calls go through; the breaker opens after `consecutive_failures` failures in a row,
//! or when at least `min_calls` calls in the current `window` failed at `failure_ratio` or more.
//! Open: calls are refused without touching the store (the posture answers) for `open_for`.
//! Half-open: one probe call at a time goes through; a success closes the breaker, a failure
//! opens it again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tollgate_core::Timestamp;

use tracing::{info, warn};

use crate::clock::SharedClock;

/// Breaker settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    /// Failures in a row that open the breaker.
    pub consecutive_failures: u32,
    /// Failure ratio in a window that opens the breaker.
    pub failure_ratio: f64,
    /// Calls a window needs before the ratio counts.
    pub min_calls: u32,
    /// Length of the window the ratio is measured over.
    pub window: Duration,
    /// How long the breaker stays open before it lets a probe through.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            failure_ratio: 0.5,
            min_calls: 20,
            window: Duration::from_secs(5),
            open_for: Duration::from_millis(500),
        }
    }
}

/// The breaker's state, as reported in metrics and `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// One probe at a time goes through.
    HalfOpen,
    /// Calls are refused.
    Open,
}

impl BreakerState {
    /// Name for `/readyz` and logs.
    pub fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Open => "open",
        }
    }

    /// Gauge value: 0 closed, 1 half-open, 2 open.
    pub fn gauge(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }
}

#[derive(Debug)]
struct Inner {
    state: BreakerState,
    consecutive: u32,
    window_start: Timestamp,
    calls: u32,
    failures: u32,
    opened_at: Timestamp,
    probe_in_flight: bool,
}

/// One circuit breaker.
#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    clock: SharedClock,
    inner: Mutex<Inner>,
    /// When a call last succeeded, in microseconds after `origin` plus one (0: never), in tokio's
    /// time, as the calls' deadlines are: whether the store answers others while a call waits
    /// (see [`Breaker::answered_after`]).
    answered: AtomicU64,
    origin: tokio::time::Instant,
    /// The calls out on the node now, oldest first (see [`Breaker::call_out`]).
    out: Mutex<CallsOut>,
    /// Told when the breaker opens: the calls waiting on the node fail then.
    opened: tokio::sync::Notify,
}

/// The calls out on one node: each call's decisions by its ticket, tickets handed out in the
/// order the calls were sent.
#[derive(Debug, Default)]
struct CallsOut {
    next: u64,
    calls: BTreeMap<u64, usize>,
    decisions: usize,
}

/// One call out on a node, from its sending to its end (dropped): see [`Breaker::call_out`].
#[derive(Debug)]
pub(super) struct CallOut<'a> {
    breaker: &'a Breaker,
    ticket: u64,
}

impl CallOut<'_> {
    /// Whether no call sent before this one is still out on its node: the others queue behind
    /// it on the node's connection.
    pub(super) fn is_oldest(&self) -> bool {
        let out = self.breaker.out.lock();
        out.calls.keys().next() == Some(&self.ticket)
    }

    /// The decisions the calls out on the node carry, this one's included.
    pub(super) fn decisions_out(&self) -> usize {
        self.breaker.out.lock().decisions
    }
}

impl Drop for CallOut<'_> {
    fn drop(&mut self) {
        let mut out = self.breaker.out.lock();
        if let Some(decisions) = out.calls.remove(&self.ticket) {
            out.decisions -= decisions;
        }
    }
}

/// Permission to make one call. Report the outcome with [`Permit::succeeded`] or
/// [`Permit::failed`]; a permit dropped without either (the call was cancelled, typically by a
/// deadline) counts as a failure.
#[derive(Debug)]
#[must_use = "report the call's outcome"]
pub struct Permit {
    breaker: Arc<Breaker>,
    probe: bool,
    reported: bool,
}

impl Permit {
    /// The call succeeded (the store answered, even if the answer was an error about data).
    pub fn succeeded(mut self) -> Option<BreakerState> {
        self.reported = true;
        self.breaker.record(self.probe, true)
    }

    /// The call failed: unreachable, timed out, overloaded.
    pub fn failed(mut self) -> Option<BreakerState> {
        self.reported = true;
        self.breaker.record(self.probe, false)
    }

    /// The call was given up for a reason that says nothing about the store (its caller
    /// waited its longest while the store answered others): counted neither way. A probe's
    /// place is freed for the next call.
    pub fn release(mut self) {
        self.reported = true;
        if self.probe {
            self.breaker.inner.lock().probe_in_flight = false;
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.reported {
            self.breaker.record(self.probe, false);
        }
    }
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig, clock: SharedClock) -> Self {
        let now = clock.now();
        Breaker {
            config,
            clock,
            inner: Mutex::new(Inner {
                state: BreakerState::Closed,
                consecutive: 0,
                window_start: now,
                calls: 0,
                failures: 0,
                opened_at: now,
                probe_in_flight: false,
            }),
            answered: AtomicU64::new(0),
            origin: tokio::time::Instant::now(),
            out: Mutex::default(),
            opened: tokio::sync::Notify::new(),
        }
    }

    /// Ready once the breaker opens after this is called (see `store::redis::patience`).
    pub(super) fn opened(&self) -> tokio::sync::futures::Notified<'_> {
        self.opened.notified()
    }

    /// Counts `failures` failures for a node that left its calls unanswered past a deadline
    /// (they wait on, see `store::redis::patience`): returns the new state if it changed.
    pub fn timed_out(&self, failures: usize) -> Option<BreakerState> {
        let mut changed = None;
        for _ in 0..failures {
            changed = self.record(false, false).or(changed);
        }
        changed
    }

    /// Registers a call carrying `decisions` decisions, sent now, as out on the node until the
    /// returned value is dropped: which call is the oldest out (see `store::redis::patience`).
    pub(super) fn call_out(&self, decisions: usize) -> CallOut<'_> {
        let mut out = self.out.lock();
        let ticket = out.next;
        out.next += 1;
        out.calls.insert(ticket, decisions);
        out.decisions += decisions;
        CallOut {
            breaker: self,
            ticket,
        }
    }

    /// Whether a call succeeded after `instant`: a store that answers others while a call of
    /// its waits is busy, not failing.
    pub fn answered_after(&self, instant: tokio::time::Instant) -> bool {
        let last = self.answered.load(Ordering::Relaxed);
        last > 0 && self.origin + Duration::from_micros(last - 1) > instant
    }

    fn stamp_answer(&self) {
        let micros = self.origin.elapsed().as_micros();
        let micros = u64::try_from(micros).unwrap_or(u64::MAX - 1) + 1;
        // Most calls find a later stamp already there only when they raced: a plain max.
        self.answered.fetch_max(micros, Ordering::Relaxed);
    }

    /// The current state. An open breaker whose wait is over still reports open until a call
    /// comes to be its probe: half-open means a probe is out, so with little traffic a dead
    /// store does not look half-healed between probes.
    pub fn state(&self) -> BreakerState {
        self.inner.lock().state
    }

    fn wait_is_over(&self, inner: &Inner) -> bool {
        self.clock.now() >= inner.opened_at.saturating_add(self.config.open_for)
    }

    /// Asks to make a call. `None` means the breaker is open: do not touch the store.
    pub fn try_call(self: &Arc<Self>) -> Option<Permit> {
        let permit = |probe| Permit {
            breaker: self.clone(),
            probe,
            reported: false,
        };
        let mut inner = self.inner.lock();
        match inner.state {
            BreakerState::Closed => Some(permit(false)),
            BreakerState::Open if !self.wait_is_over(&inner) => None,
            BreakerState::Open | BreakerState::HalfOpen => {
                if inner.probe_in_flight {
                    return None;
                }
                inner.state = BreakerState::HalfOpen;
                inner.probe_in_flight = true;
                Some(permit(true))
            }
        }
    }

    /// Records how a permitted call went. Returns the new state if it changed: a probe was let
    /// through an open breaker, and one that fails leaves it open, no change to report (or
    /// an outage would log the breaker opening at every probe).
    fn record(&self, probe: bool, success: bool) -> Option<BreakerState> {
        if success {
            self.stamp_answer();
        }
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        let before = if probe {
            BreakerState::Open
        } else {
            inner.state
        };
        if probe {
            inner.probe_in_flight = false;
        }
        match (inner.state, success) {
            (BreakerState::HalfOpen, true) if probe => self.close(&mut inner, now),
            (BreakerState::HalfOpen, false) if probe => self.open(&mut inner, now),
            (BreakerState::Closed, _) => {
                if now.saturating_since(inner.window_start) >= self.config.window {
                    inner.window_start = now;
                    inner.calls = 0;
                    inner.failures = 0;
                }
                inner.calls += 1;
                if success {
                    inner.consecutive = 0;
                } else {
                    inner.consecutive += 1;
                    inner.failures += 1;
                }
                let ratio_tripped = inner.calls >= self.config.min_calls
                    && f64::from(inner.failures)
                        >= self.config.failure_ratio * f64::from(inner.calls);
                if inner.consecutive >= self.config.consecutive_failures || ratio_tripped {
                    self.open(&mut inner, now);
                }
            }
            // A call that started before the breaker opened: its outcome changes nothing.
            _ => {}
        }
        (inner.state != before).then_some(inner.state)
    }

    fn open(&self, inner: &mut Inner, now: Timestamp) {
        inner.state = BreakerState::Open;
        inner.opened_at = now;
        self.opened.notify_waiters();
    }

    fn close(&self, inner: &mut Inner, now: Timestamp) {
        inner.state = BreakerState::Closed;
        inner.consecutive = 0;
        inner.calls = 0;
        inner.failures = 0;
        inner.window_start = now;
    }
}

/// A breaker's permit that logs the breaker opening or closing, also when the call it covers is
/// dropped by its deadline (a timeout: the commonest way a breaker opens).
pub(super) struct Logged<'a> {
    node: &'a str,
    permit: Option<Permit>,
}

impl<'a> Logged<'a> {
    pub(super) fn new(node: &'a str, permit: Permit) -> Self {
        Logged {
            node,
            permit: Some(permit),
        }
    }

    /// The call was given up for load while its node kept answering: neither a success nor a
    /// failure of the node.
    pub(super) fn release(mut self) {
        if let Some(permit) = self.permit.take() {
            permit.release();
        }
    }

    pub(super) fn record(&mut self, answered: bool) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let changed = if answered {
            permit.succeeded()
        } else {
            permit.failed()
        };
        match changed {
            // The store is lost for this node's slots: the failure postures answer.
            Some(BreakerState::Open) => {
                warn!(node = %self.node, state = "open", "Circuit breaker changed state");
            }
            Some(state) => {
                info!(node = %self.node, state = state.name(), "Circuit breaker changed state");
            }
            None => {}
        }
    }
}

impl Drop for Logged<'_> {
    fn drop(&mut self) {
        self.record(false);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::ManualClock;

    fn breaker() -> (Arc<ManualClock>, Arc<Breaker>) {
        let clock = Arc::new(ManualClock::new(Timestamp::from_micros(1_000_000)));
        (
            clock.clone(),
            Arc::new(Breaker::new(BreakerConfig::default(), clock)),
        )
    }

    fn call(b: &Arc<Breaker>, ok: bool) -> Option<BreakerState> {
        let permit = b.try_call().expect("permitted");
        if ok {
            permit.succeeded()
        } else {
            permit.failed()
        }
    }

    #[test]
    fn opens_after_consecutive_failures_and_refuses_calls() {
        let (_clock, b) = breaker();
        for _ in 0..4 {
            assert_eq!(call(&b, false), None);
        }
        assert_eq!(call(&b, false), Some(BreakerState::Open));
        assert!(b.try_call().is_none());
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn a_success_resets_the_run_of_failures() {
        let (_clock, b) = breaker();
        for _ in 0..4 {
            call(&b, false);
        }
        call(&b, true);
        for _ in 0..4 {
            assert_eq!(call(&b, false), None);
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn opens_on_the_failure_ratio_of_a_window() {
        let (_clock, b) = breaker();
        // Alternating: never 5 in a row, but half of 20 calls failed.
        for i in 0..19 {
            assert_eq!(call(&b, i % 2 == 0), None, "call {i}");
        }
        assert_eq!(call(&b, false), Some(BreakerState::Open));
    }

    #[test]
    fn half_open_lets_one_probe_through_and_closes_on_success() {
        let (clock, b) = breaker();
        for _ in 0..5 {
            call(&b, false);
        }
        clock.advance(Duration::from_millis(499));
        assert!(b.try_call().is_none(), "still open");
        clock.advance(Duration::from_millis(1));
        assert_eq!(
            b.state(),
            BreakerState::Open,
            "open until a call comes to probe"
        );
        let probe = b.try_call().expect("one probe");
        assert_eq!(b.state(), BreakerState::HalfOpen, "while the probe is out");
        assert!(b.try_call().is_none(), "only one probe at a time");
        assert_eq!(probe.succeeded(), Some(BreakerState::Closed));
        assert!(b.try_call().is_some());
    }

    #[test]
    fn a_cancelled_call_counts_as_a_failure() {
        let (_clock, b) = breaker();
        for _ in 0..5 {
            drop(b.try_call().expect("permitted"));
        }
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn a_failed_probe_opens_it_again() {
        let (clock, b) = breaker();
        for _ in 0..5 {
            call(&b, false);
        }
        clock.advance(Duration::from_millis(500));
        let probe = b.try_call().expect("probe");
        // Still open, as it was before the probe: no change to report.
        assert_eq!(probe.failed(), None);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.try_call().is_none());
        clock.advance(Duration::from_millis(500));
        assert!(b.try_call().is_some(), "probes again after another wait");
    }
}
