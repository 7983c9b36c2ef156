//! Sliding window counter: epoch-aligned windows as in [`crate::fixed_window`], the previous
//! window's count weighted by the share of it the trailing period still covers.
//!
//! With `e = now - window_start`, a request of cost `c` is admitted iff, exactly,
//! `(current + c) * period + previous * (period - e) <= limit * period`: the same as rounding the
//! weighted count `previous * (period - e) / period` UP, so the estimate never under-counts, and
//! `remaining = limit - current - ceil(previous * (period - e) / period)`. Counts of other windows
//! than the current and the previous one are zero. `retry_after` is the first instant the test
//! passes: later in this window as `previous` decays, else in the next window (where `current`
//! becomes `previous`), else at the start of the one after. `reset_after` runs until both counts
//! weigh nothing: the end of the next window if `current > 0`, else of this one. A clock that
//! steps back across a boundary decides at the start of the stored window
//! ([`crate::fixed_window::decision_instant`]).

use std::time::Duration;

use crate::fixed_window::decision_instant;
use crate::scaled::{div_ceil, micros, saturate};
use crate::{Decision, Params, State, Timestamp, Transition};

/// Decides one request; see the [module documentation](self).
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    let limit = params.limit();
    let period = params.period_micros();
    let stored = match *state {
        State::SlidingWindowCounter { window, .. } => Some(window),
        _ => None,
    };
    let now_micros = now.as_micros();
    let at = decision_instant(stored, now_micros, period);
    if at != now_micros {
        let (decision, transition) = decide(params, state, Timestamp::from_micros(at), cost);
        return (
            decision.postponed(micros(u128::from(at - now_micros))),
            transition,
        );
    }
    let window = now_micros / period;
    let (current, previous) = match *state {
        State::SlidingWindowCounter {
            window: stored,
            current,
            previous,
        } if stored == window => (current, previous),
        State::SlidingWindowCounter {
            window: stored,
            current,
            ..
        } if stored.checked_add(1) == Some(window) => (0, current),
        _ => (0, 0),
    };
    let p = u128::from(period);
    let elapsed = u128::from(now_micros % period);
    let weighted_previous = div_ceil(u128::from(previous) * (p - elapsed), p);
    let remaining_with = |current: u64| {
        saturate(u128::from(limit).saturating_sub(u128::from(current) + weighted_previous))
    };
    let reset_after = |current: u64| {
        let windows_left = if current > 0 {
            2
        } else if previous > 0 {
            1
        } else {
            return Duration::ZERO;
        };
        micros(windows_left * p - elapsed)
    };

    if cost > params.capacity() {
        let decision =
            Decision::cost_exceeds_capacity(limit, remaining_with(current), reset_after(current));
        return (decision, Transition::Keep);
    }
    if fits(
        limit,
        period,
        u128::from(current) + u128::from(cost),
        previous,
        elapsed,
    ) {
        let charged = current.saturating_add(cost);
        let decision = Decision::allowed(limit, remaining_with(charged), reset_after(charged));
        let state = State::SlidingWindowCounter {
            window,
            current: charged,
            previous,
        };
        return (decision, Transition::Set(state));
    }
    let retry_after = micros(retry_after(limit, period, current, previous, elapsed, cost));
    let decision = Decision::denied(
        limit,
        remaining_with(current),
        reset_after(current),
        retry_after,
    );
    (decision, Transition::Keep)
}

/// Gives back `cost` charged at `at` (see [`crate::refund`]): from the window `at` lies in,
/// which is the state's previous window once it has rolled once; nothing once it is older.
pub fn refund(params: &Params, state: &State, at: Timestamp, cost: u64) -> Transition {
    let State::SlidingWindowCounter {
        window,
        current,
        previous,
    } = *state
    else {
        return Transition::Keep;
    };
    let charged_in = at.as_micros() / params.period_micros();
    let (current, previous) = if window == charged_in && current > 0 {
        (current.saturating_sub(cost), previous)
    } else if window.checked_sub(1) == Some(charged_in) && previous > 0 {
        (current, previous.saturating_sub(cost))
    } else {
        return Transition::Keep;
    };
    Transition::Set(State::SlidingWindowCounter {
        window,
        current,
        previous,
    })
}

/// Whether `charged * period + previous * (period - elapsed) <= limit * period`, where
/// `charged` includes the request.
fn fits(limit: u64, period: u64, charged: u128, previous: u64, elapsed: u128) -> bool {
    let p = u128::from(period);
    charged * p + u128::from(previous) * (p - elapsed) <= u128::from(limit) * p
}

/// The earliest `d >= 0` at which `elapsed + d` (possibly in a later window) admits `cost`, in
/// microseconds. Within one window the test is monotone in the elapsed time, so it suffices to
/// solve `previous * (period - e) <= room` for the least `e` in each window in turn.
fn retry_after(
    limit: u64,
    period: u64,
    current: u64,
    previous: u64,
    elapsed: u128,
    cost: u64,
) -> u128 {
    let p = u128::from(period);
    // Least elapsed time `e` in a window with counts (`charged`, `weighed`) where the request
    // fits, if any: `weighed * (p - e) <= (limit - charged) * p`.
    let least_elapsed = |charged: u128, weighed: u64| -> Option<u128> {
        let room = u128::from(limit).checked_sub(charged)? * p;
        if weighed == 0 {
            return Some(0);
        }
        let decayed = room / u128::from(weighed); // `p - e` may be at most this
        (decayed >= 1).then(|| p.saturating_sub(decayed))
    };
    let cost = u128::from(cost);
    if let Some(e) = least_elapsed(u128::from(current) + cost, previous)
        && e > elapsed
    {
        return e - elapsed;
    }
    if let Some(e) = least_elapsed(cost, current) {
        return p - elapsed + e;
    }
    2 * p - elapsed
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Algorithm, Params, State, Timestamp, Verdict, decide};

    #[test]
    fn weighs_the_previous_window_rounding_up() {
        let params = Params::new(
            Algorithm::SlidingWindowCounter,
            10,
            Duration::from_millis(1),
            None,
        )
        .unwrap();
        // Window 4 admitted 10; now is 250µs into window 5: 10 * 750 / 1000 = 7.5 still counts.
        let state = State::SlidingWindowCounter {
            window: 4,
            current: 10,
            previous: 0,
        };
        let now = Timestamp::from_micros(5_250);
        let (allowed, transition) = decide(&params, &state, now, 2);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 0));
        assert_eq!(allowed.reset_after, Duration::from_micros(1_750));
        assert_eq!(
            transition,
            crate::Transition::Set(State::SlidingWindowCounter {
                window: 5,
                current: 2,
                previous: 10
            })
        );

        // Cost 3 fits once 10 * (1000 - e) <= 7 * 1000, i.e. at e = 300.
        let (denied, _) = decide(&params, &state, now, 3);
        assert_eq!(denied.verdict, Verdict::Denied);
        assert_eq!(denied.remaining, 2);
        assert_eq!(denied.retry_after, Some(Duration::from_micros(50)));
        assert_eq!(denied.reset_after, Duration::from_micros(750));
        let (on_time, _) = decide(&params, &state, Timestamp::from_micros(5_300), 3);
        assert!(on_time.is_allowed());
    }

    fn four_a_millisecond() -> Params {
        Params::new(
            Algorithm::SlidingWindowCounter,
            4,
            Duration::from_millis(1),
            None,
        )
        .unwrap()
    }

    #[test]
    fn retries_in_the_next_window_when_the_current_one_is_full() {
        let params = four_a_millisecond();
        let state = State::SlidingWindowCounter {
            window: 5,
            current: 4,
            previous: 0,
        };
        // Next window: 4 * (1000 - e) <= (4 - 1) * 1000 from e = 250.
        let (denied, _) = decide(&params, &state, Timestamp::from_micros(5_900), 1);
        assert_eq!(denied.retry_after, Some(Duration::from_micros(350)));
        // A full-limit request must wait for the window after.
        let (denied, _) = decide(&params, &state, Timestamp::from_micros(5_900), 4);
        assert_eq!(denied.retry_after, Some(Duration::from_micros(1_100)));
    }

    #[test]
    fn a_clock_stepping_back_across_a_boundary_keeps_the_counts() {
        let params = four_a_millisecond();
        // Window 6 holds 4 (full) over a previous 2; the clock now reads 5.990 ms.
        let state = State::SlidingWindowCounter {
            window: 6,
            current: 4,
            previous: 2,
        };
        let (denied, transition) = decide(&params, &state, Timestamp::from_micros(5_990), 1);
        assert_eq!((denied.verdict, denied.remaining), (Verdict::Denied, 0));
        // Window 6 is full, so 1 more fits in window 7 once 4 * (1000 - e) <= 3 * 1000, at
        // e = 250: 1.25 ms after the start of window 6, which is 10 µs after the clock's reading.
        assert_eq!(denied.retry_after, Some(Duration::from_micros(1_260)));
        assert_eq!(transition, crate::Transition::Keep);
        let (allowed, transition) = decide(
            &params,
            &State::SlidingWindowCounter {
                window: 6,
                current: 1,
                previous: 2,
            },
            Timestamp::from_micros(5_990),
            1,
        );
        // At the start of window 6 the previous 2 weigh fully: 4 - 2 - 2 = 0 left.
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 0));
        assert_eq!(
            transition,
            crate::Transition::Set(State::SlidingWindowCounter {
                window: 6,
                current: 2,
                previous: 2
            })
        );
    }
}
