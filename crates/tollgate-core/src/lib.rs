//! Pure rate-limiting algorithms.
//!
//! Every algorithm is a function of `(params, state, now, cost)`: it never reads a clock, never
//! allocates on the decision path and never performs I/O. A decision is a value; a denial is not an
//! error. Storage backends keep a [`State`] per key and apply the returned [`Transition`] only when
//! they decide to commit the charge (a request with several limits commits all or none). A charge
//! is given back the same way: [`refund`] is the transition that undoes it.
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

/// Gives back one charge of `cost` made at `at` under `params`: what a holder of units it did
/// not use returns (a lease), or a request denied elsewhere takes back (a Redis Cluster slot
/// that charged when another denied). Returns the transition that undoes the charge, exactly
/// when nothing else touched the state since, conservatively otherwise: it never gives back
/// more than `cost`, and nothing it cannot place.
///
/// - fixed window and sliding window counter: the window `at` lies in gets `cost` back (for the
///   counter, as its previous window once it has rolled once); nothing once it is older;
/// - sliding window log: up to `cost` comes off the entry at `at`; nothing when there is none;
/// - token bucket: `cost` tokens go back, the bucket holding no more than full;
/// - GCRA and leaky bucket: the instant they keep moves back by `cost * period / limit`, never
///   before `at`;
/// - a bucket written under another limit or period than `params` (a reload converted it since
///   the charge) is left alone, as is a state of another algorithm.
///
/// `cost` counts at most the burst; a cost of 0 gives nothing back ([`Transition::Keep`]). The
/// Redis store's REFUND script is this function's twin. A store that may have lost the counter
/// charged and made it anew since (a restart, a flush, an expiry) must leave a state made after
/// `at` alone itself: nothing in a state says when it was made.
pub fn refund(params: &Params, state: &State, at: Timestamp, cost: u64) -> Transition {
    if cost == 0 {
        return Transition::Keep;
    }
    match params.algorithm() {
        Algorithm::FixedWindow => fixed_window::refund(params, state, at, cost),
        Algorithm::SlidingWindowLog => sliding_window_log::refund(params, state, at, cost),
        Algorithm::SlidingWindowCounter => sliding_window_counter::refund(params, state, at, cost),
        Algorithm::TokenBucket => token_bucket::refund(params, state, at, cost),
        Algorithm::LeakyBucket => leaky_bucket::refund(params, state, at, cost),
        Algorithm::Gcra => gcra::refund(params, state, at, cost),
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

    fn charged(params: &Params, state: &State, at: Timestamp, cost: u64) -> State {
        let (decision, transition) = decide(params, state, at, cost);
        assert!(decision.is_allowed(), "{decision:?}");
        let mut state = state.clone();
        state.apply(transition);
        state
    }

    fn refunded(params: &Params, state: &State, at: Timestamp, cost: u64) -> Option<State> {
        let transition = refund(params, state, at, cost);
        (transition != Transition::Keep).then(|| {
            let mut state = state.clone();
            state.apply(transition);
            state
        })
    }

    /// The windows give back into the window the charge landed in, while the state holds it
    /// (the counter's previous window once it rolled once), and nothing from an older one.
    #[test]
    fn the_windows_give_back_into_the_window_charged() {
        let second = Duration::from_secs(1);
        let t = Timestamp::from_micros(7_250_000);
        let next = Timestamp::from_micros(8_100_000);
        let fixed = Params::new(Algorithm::FixedWindow, 5, second, None).unwrap();
        let state = charged(&fixed, &State::empty(&fixed), t, 3);
        let back = refunded(&fixed, &state, t, 2).unwrap();
        assert_eq!(
            back,
            State::FixedWindow {
                window: 7,
                count: 1
            }
        );
        // More than is left: the count stops at zero.
        let back = refunded(&fixed, &back, t, 5).unwrap();
        assert_eq!(
            back,
            State::FixedWindow {
                window: 7,
                count: 0
            }
        );
        assert_eq!(
            refunded(&fixed, &back, t, 1),
            None,
            "nothing left to give back"
        );
        let rolled = charged(&fixed, &state, next, 1);
        assert_eq!(
            refunded(&fixed, &rolled, t, 2),
            None,
            "the window has rolled"
        );

        let counter = Params::new(Algorithm::SlidingWindowCounter, 5, second, None).unwrap();
        let state = charged(&counter, &State::empty(&counter), t, 3);
        let rolled = charged(&counter, &state, next, 1);
        let back = refunded(&counter, &rolled, t, 2).unwrap();
        let expected = State::SlidingWindowCounter {
            window: 8,
            current: 1,
            previous: 1,
        };
        assert_eq!(back, expected, "the previous window gets it back");
        let later = charged(&counter, &rolled, Timestamp::from_micros(9_000_000), 1);
        assert_eq!(refunded(&counter, &later, t, 2), None, "two windows on");
    }

    /// The log gives back from the entry at the charge's instant, at most what it holds.
    #[test]
    fn the_log_gives_back_from_the_entry_at_the_instant() {
        let params =
            Params::new(Algorithm::SlidingWindowLog, 5, Duration::from_secs(1), None).unwrap();
        let t = Timestamp::from_micros(7_250_000);
        let u = Timestamp::from_micros(7_300_000);
        let state = charged(
            &params,
            &charged(&params, &State::empty(&params), t, 2),
            u,
            1,
        );
        assert_eq!(
            refunded(&params, &state, Timestamp::from_micros(7_260_000), 1),
            None
        );
        let back = refunded(&params, &state, t, 9).unwrap();
        let log = SlidingLog::from_entries([(u, 1)]);
        assert_eq!(back, State::SlidingWindowLog { log });
    }

    /// The buckets get back what the charge took: a token bucket no fuller than full, GCRA
    /// and the leaky bucket no earlier than the charge; and nothing under other params.
    #[test]
    fn the_buckets_give_back_what_the_charge_took() {
        let second = Duration::from_secs(1);
        let t = Timestamp::from_micros(10_000_000);
        let later = Timestamp::from_micros(10_100_000);
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::Gcra,
            Algorithm::LeakyBucket,
        ] {
            let params = Params::new(algorithm, 10, second, None).unwrap();
            let once = charged(&params, &State::empty(&params), t, 3);
            let twice = charged(&params, &once, later, 2);
            // All 3 back at `t`: 5 used then, 2 of them at 100ms, 1 of the 3 refilled since.
            let back = refunded(&params, &twice, t, 3).unwrap();
            assert_eq!(
                decide(&params, &back, later, 0).0.remaining,
                decide(&params, &twice, later, 0).0.remaining + 3,
                "{algorithm}"
            );
            // More than was ever charged: a token bucket is full, the others back at `t`.
            let all = refunded(&params, &once, t, 10).unwrap();
            assert_eq!(decide(&params, &all, t, 0).0.remaining, 10, "{algorithm}");
            let other = Params::new(algorithm, 20, second, None).unwrap();
            assert_eq!(
                refunded(&other, &once, t, 1),
                None,
                "{algorithm} under a reload"
            );
            assert_eq!(
                refund(&params, &once, t, 0),
                Transition::Keep,
                "{algorithm}"
            );
        }
        // GCRA's arrival time never moves before the charge: a charge at `later` alone,
        // given back as if made at `t`, leaves it at `later`.
        let gcra = Params::new(Algorithm::Gcra, 10, second, None).unwrap();
        let late = charged(&gcra, &State::empty(&gcra), later, 2);
        let back = refunded(&gcra, &late, later, 5).unwrap();
        assert_eq!(back.expires_at(&gcra), later);
        assert_eq!(
            refunded(&gcra, &back, later, 1),
            None,
            "nothing past the charge"
        );
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
