//! Fixed window: one counter per window `[k·period, (k+1)·period)`, windows aligned to the epoch.
//!
//! A request of cost `c` is admitted iff `count + c <= limit`, where `count` is the cost already
//! admitted in the window containing `now`; a stored count of any other window counts as zero.
//! `retry_after` (on denial) is the time to the end of the window, when the count starts over.
//! `reset_after` is the same, or zero when the window holds nothing. Up to `2 * limit` can pass
//! within one period that straddles a boundary.
//!
//! A clock that steps back across a boundary (a failover to a server whose clock lags) does not
//! reopen the earlier window: see [`decision_instant`].

use std::time::Duration;

use crate::scaled::micros;
use crate::{Decision, Params, State, Timestamp, Transition};

/// Decides one request; see the [module documentation](self).
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    let limit = params.limit();
    let period = params.period_micros();
    let (stored, count) = match *state {
        State::FixedWindow { window, count } => (Some(window), count),
        _ => (None, 0),
    };
    let now = now.as_micros();
    let at = decision_instant(stored, now, period);
    if at != now {
        let (decision, transition) = decide(params, state, Timestamp::from_micros(at), cost);
        return (decision.postponed(micros(u128::from(at - now))), transition);
    }
    let window = now / period;
    let count = if stored == Some(window) { count } else { 0 };
    // At most one period; computed in u128 because the end of the last window is past u64::MAX.
    let to_window_end = micros((u128::from(window) + 1) * u128::from(period) - u128::from(now));
    let reset_after = |count: u64| {
        if count == 0 {
            Duration::ZERO
        } else {
            to_window_end
        }
    };

    if cost > params.capacity() {
        let decision =
            Decision::cost_exceeds_capacity(limit, limit.saturating_sub(count), reset_after(count));
        return (decision, Transition::Keep);
    }
    let charged = count.saturating_add(cost);
    if charged <= limit {
        let decision = Decision::allowed(limit, limit - charged, reset_after(charged));
        (
            decision,
            Transition::Set(State::FixedWindow {
                window,
                count: charged,
            }),
        )
    } else {
        let decision = Decision::denied(
            limit,
            limit.saturating_sub(count),
            reset_after(count),
            to_window_end,
        );
        (decision, Transition::Keep)
    }
}

/// Gives back `cost` charged at `at` (see [`crate::refund`]): from the count of the window `at`
/// lies in, while the state still holds that window; nothing once it has rolled.
pub fn refund(params: &Params, state: &State, at: Timestamp, cost: u64) -> Transition {
    match *state {
        State::FixedWindow { window, count }
            if window == at.as_micros() / params.period_micros() && count > 0 =>
        {
            Transition::Set(State::FixedWindow {
                window,
                count: count.saturating_sub(cost),
            })
        }
        _ => Transition::Keep,
    }
}

/// The instant, in µs since the epoch, a window algorithm decides at, given the window its
/// state was last written in: `now`, or the start of that window when `now` lies in the window
/// just before it. That happens when the clock steps back across a boundary (a failover to a
/// Redis whose clock lags); deciding in the earlier window would start its count from nothing
/// and admit up to a whole limit again. The answer's durations are then lengthened by the step,
/// so they still count from `now`. A stored window further ahead is no step of a clock but a
/// state written under another period, and counts as no state, as any other window does.
pub(crate) fn decision_instant(stored: Option<u64>, now: u64, period: u64) -> u64 {
    match stored {
        Some(window) if window.checked_sub(1) == Some(now / period) => {
            window.checked_mul(period).unwrap_or(now)
        }
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Algorithm, Params, State, Timestamp, Verdict, decide};

    #[test]
    fn counts_per_epoch_aligned_window() {
        let params = Params::new(Algorithm::FixedWindow, 3, Duration::from_secs(1), None).unwrap();
        let mut state = State::empty(&params);
        let now = Timestamp::from_micros(7_250_000);
        for remaining in [2, 1, 0] {
            let (decision, transition) = decide(&params, &state, now, 1);
            assert_eq!(decision.verdict, Verdict::Allowed);
            assert_eq!(decision.remaining, remaining);
            assert_eq!(decision.reset_after, Duration::from_millis(750));
            state.apply(transition);
        }
        let (denied, _) = decide(&params, &state, now, 1);
        assert_eq!(denied.verdict, Verdict::Denied);
        assert_eq!(denied.retry_after, Some(Duration::from_millis(750)));

        let next_window = Timestamp::from_micros(8_000_000);
        let (decision, _) = decide(&params, &state, next_window, 3);
        assert_eq!(
            (decision.verdict, decision.remaining),
            (Verdict::Allowed, 0)
        );
        let (too_big, transition) = decide(&params, &state, next_window, 4);
        assert_eq!(too_big.verdict, Verdict::CostExceedsCapacity);
        assert_eq!(
            (too_big.remaining, too_big.reset_after),
            (3, Duration::ZERO)
        );
        assert_eq!(transition, crate::Transition::Keep);
    }

    #[test]
    fn a_clock_stepping_back_across_a_boundary_keeps_the_count() {
        let params = Params::new(Algorithm::FixedWindow, 3, Duration::from_secs(1), None).unwrap();
        // Window 8 holds 3 (full); a server whose clock lags 2 ms reads 7.998 s.
        let full = State::FixedWindow {
            window: 8,
            count: 3,
        };
        let behind = Timestamp::from_micros(7_998_000);
        let (denied, transition) = decide(&params, &full, behind, 1);
        assert_eq!((denied.verdict, denied.remaining), (Verdict::Denied, 0));
        // Durations count from the clock's reading: the stored window ends 1.002 s later.
        assert_eq!(denied.retry_after, Some(Duration::from_millis(1_002)));
        assert_eq!(denied.reset_after, Duration::from_millis(1_002));
        assert_eq!(transition, crate::Transition::Keep);
        // An admitted request counts in the stored window, not the one the clock reads.
        let partial = State::FixedWindow {
            window: 8,
            count: 1,
        };
        let (allowed, transition) = decide(&params, &partial, behind, 1);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 1));
        assert_eq!(
            transition,
            crate::Transition::Set(State::FixedWindow {
                window: 8,
                count: 2
            })
        );
        // Two windows behind is no clock step but another period's state: a fresh count.
        let (fresh, _) = decide(&params, &full, Timestamp::from_micros(6_500_000), 3);
        assert_eq!(fresh.verdict, Verdict::Allowed);
    }
}
