//! Pure rate-limiting algorithms.
//!
//! Every algorithm is a function of `(params, state, now, cost)`: it never reads a clock, never
//! allocates on the decision path and never performs I/O. A decision is a value; a denial is not an
//! error. Storage backends keep a [`State`] per key and apply the returned [`Transition`] only when
//! they decide to commit the charge (a request with several limits commits all or none).
//!
//! Every algorithm keeps the same contract (each module documents its exact arithmetic):
//! - a denied request, or one costing more than [`Params::capacity`], charges nothing
//!   ([`Transition::Keep`]); with [`Params::charges_up_to_limit`], [`decide`] admits such a
//!   request for what is left instead, while a unit is;
//! - on denial `retry_after` is exact: if nothing else is charged, the same request is admitted at
//!   `now + retry_after` and still denied one microsecond earlier;
//! - `reset_after` is the time until the state behaves like [`State::empty`] again, which is
//!   [`State::expires_at`] of the state after the decision;
//! - all arithmetic is exact integer arithmetic on microseconds and saturates instead of
//!   overflowing; time is assumed not to run backwards for a key (it never panics if it does);
//! - a state written under other params of the same algorithm (a policy reload changed the
//!   key's limit, burst or period) keeps the units it has used, and what is left is
//!   `max(0, new capacity - used)`: a window's count, the log's entries, the token bucket's
//!   missing tokens, GCRA's and the leaky bucket's backlog (the buckets drained or refilled at the
//!   rate they were written under until the decision that reads them, converted through the
//!   period and capped at the new burst, rounded so as to give no more quota than before; see
//!   [`State`]). A bucket's [`State::expires_at`] is its own, whatever the params, so a store
//!   that drops it at the TTL it wrote decides as one that keeps it. One exception: a fixed
//!   window or sliding counter keeps the number of its window, not its bounds, so after a
//!   change of *period* the count only carries over into a window that happens to bear the same
//!   number; otherwise it starts from zero, which may admit up to one new limit early. And the
//!   windows and the log expire at the end of the period they were written under: after a
//!   change that lengthens the period, the stores forget such a state at that old expiry.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{decide, Algorithm, Params, State, Timestamp, Verdict};
//!
//! let params = Params::new(Algorithm::Gcra, 2, Duration::from_secs(1), None).unwrap();
//! let mut state = State::empty(&params);
//! let now = Timestamp::from_micros(1_700_000_000_000_000);
//! for expected in [Verdict::Allowed, Verdict::Allowed, Verdict::Denied] {
//!     let (decision, transition) = decide(&params, &state, now, 1);
//!     assert_eq!(decision.verdict, expected);
//!     state.apply(transition);
//! }
//! ```

// The core's public API is its documentation: keep every public item documented.
#![warn(missing_docs)]

mod algorithm;
mod decision;
mod params;
mod scaled;
mod sliding_log;
mod state;
mod time;

pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

pub use algorithm::{Algorithm, UnknownAlgorithm};
pub use decision::{Decision, Verdict};
pub use params::{MAX_LIMIT, MAX_LOG_LIMIT, MAX_PERIOD, MIN_PERIOD, Params, ParamsError};
pub use sliding_log::SlidingLog;
pub use state::{State, Transition};
pub use time::Timestamp;

/// Decides one request of weight `cost` against one limit.
///
/// Returns the decision and the transition that charges it. A denied request (or one whose cost
/// exceeds what the limit can ever admit) returns [`Transition::Keep`]: it consumes nothing
/// (but see charging up to the limit, below).
/// `state` must have been created for the same algorithm (see [`State::empty`]); a state of
/// another algorithm is treated as empty, and one written under other params of this algorithm
/// is first converted to these params (see [`State`]).
///
/// With [`Params::charges_up_to_limit`], a request whose whole cost does not fit (denied, or
/// above the capacity) is decided again for what is left, `min(cost, remaining)`, and admitted
/// with that charge; with nothing left it is denied as a request of 1 would be, so its
/// `retry_after` is when one unit fits.
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    let whole = decide_whole(params, state, now, cost);
    if whole.0.is_allowed() || cost <= 1 || !params.charges_up_to_limit() {
        return whole;
    }
    let part = whole.0.remaining.clamp(1, cost);
    if part == cost {
        return whole;
    }
    decide_whole(params, state, now, part)
}

/// [`decide`] for the whole `cost`.
fn decide_whole(
    params: &Params,
    state: &State,
    now: Timestamp,
    cost: u64,
) -> (Decision, Transition) {
    match params.algorithm() {
        Algorithm::FixedWindow => fixed_window::decide(params, state, now, cost),
        Algorithm::SlidingWindowLog => sliding_window_log::decide(params, state, now, cost),
        Algorithm::SlidingWindowCounter => sliding_window_counter::decide(params, state, now, cost),
        Algorithm::TokenBucket => token_bucket::decide(params, state, now, cost),
        Algorithm::LeakyBucket => leaky_bucket::decide(params, state, now, cost),
        Algorithm::Gcra => gcra::decide(params, state, now, cost),
    }
}

/// Checks one limit without charging it (Envoy's per-descriptor `hits_addend: 0`).
///
/// The verdict is the one a request of cost 1 would get, and so is a denial's `retry_after`.
/// When admitted, the figures are those of the state as it is: `remaining` and `reset_after`
/// count nothing more, and there is no `delay`. Nothing is charged, so there is no transition.
pub fn check(params: &Params, state: &State, now: Timestamp) -> Decision {
    let (one, _) = decide(params, state, now, 1);
    if !one.is_allowed() {
        return one;
    }
    as_is(params, state, now)
}

/// Checks one limit without charging it as envoyproxy/ratelimit answers `hits_addend: 0`:
/// over only when the state is already past the limit (a cost of 0 would be denied), so a
/// limit exactly used up still admits. When admitted, the figures of [`as_is`].
pub fn check_as_is(params: &Params, state: &State, now: Timestamp) -> Decision {
    let (zero, _) = decide(params, state, now, 0);
    if !zero.is_allowed() {
        return zero;
    }
    as_is(params, state, now)
}

/// The figures of a limit as its state stands: allowed, `remaining` and `reset_after`
/// counting nothing more, no `retry_after` and no `delay` (a decision of cost 0). What an
/// admitted [`check`] answers, and what a limit that allowed its charge answers in a request
/// another limit denied, since nothing is charged then.
pub fn as_is(params: &Params, state: &State, now: Timestamp) -> Decision {
    // Even over a state fuller than the limit (a limit lowered since it was written, or a
    // clock that stepped back), where a cost of 0 is denied: the limit allowed its charge.
    let (figures, _) = decide(params, state, now, 0);
    Decision {
        verdict: Verdict::Allowed,
        retry_after: None,
        delay: std::time::Duration::ZERO,
        ..figures
    }
}

/// Decides a charge as the stores do: a `cost` of 0 is a [`check`], which charges nothing
/// ([`Transition::Keep`]); any other cost is [`decide`]d.
pub fn decide_or_check(
    params: &Params,
    state: &State,
    now: Timestamp,
    cost: u64,
) -> (Decision, Transition) {
    if cost == 0 {
        return (check(params, state, now), Transition::Keep);
    }
    decide(params, state, now, cost)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// On a limit exactly used up, tollgate's check is over (one more unit does not fit) and
    /// envoyproxy/ratelimit's is not (the counter is not past the limit); past it, both are.
    #[test]
    fn a_check_as_is_is_over_only_past_the_limit() {
        let params = Params::new(Algorithm::FixedWindow, 2, Duration::from_secs(60), None).unwrap();
        let now = Timestamp::from_micros(60_000_000);
        let window = now.as_micros() / 60_000_000;
        let at = |count| State::FixedWindow { window, count };
        assert!(!check(&params, &at(2), now).is_allowed());
        let as_is = check_as_is(&params, &at(2), now);
        assert!(as_is.is_allowed());
        assert_eq!((as_is.remaining, as_is.retry_after), (0, None));
        assert!(check_as_is(&params, &at(1), now).is_allowed());
        assert!(!check_as_is(&params, &at(3), now).is_allowed());
    }

    /// A log holding more than a lowered limit: a cost of 0 is denied there, but a limit that
    /// allowed its charge (on a tentative state) still answers allowed, without a retry.
    #[test]
    fn as_is_is_allowed_even_over_a_state_fuller_than_the_limit() {
        let params =
            Params::new(Algorithm::SlidingWindowLog, 1, Duration::from_secs(1), None).unwrap();
        let now = Timestamp::from_micros(10_000_000);
        let full = State::SlidingWindowLog {
            log: SlidingLog::from_entries([(now, 2)]),
        };
        assert!(!decide(&params, &full, now, 0).0.is_allowed());
        let figures = as_is(&params, &full, now);
        assert_eq!(figures.verdict, Verdict::Allowed);
        assert_eq!(figures.retry_after, None);
        assert_eq!(figures.remaining, 0);
        assert_eq!(figures.reset_after, Duration::from_secs(1));
    }
}
