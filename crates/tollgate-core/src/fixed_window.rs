//! Fixed window: one counter per window `[k·period, (k+1)·period)`, windows aligned to the epoch.
//!
//! A request of cost `c` is admitted iff `count + c <= limit`, where `count` is the cost already
//! admitted in the window containing `now`; a stored count of any other window counts as zero.
//! `retry_after` (on denial) is the time to the end of the window, when the count starts over.
//! `reset_after` is the same, or zero when the window holds nothing. Up to `2 * limit` can pass
//! within one period that straddles a boundary.

use std::time::Duration;

use crate::scaled::micros;
use crate::{Decision, Params, State, Timestamp, Transition};

/// Decides one request; see the [module documentation](self).
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    let limit = params.limit();
    let period = params.period_micros();
    let now = now.as_micros();
    let window = now / period;
    let count = match *state {
        State::FixedWindow {
            window: stored,
            count,
        } if stored == window => count,
        _ => 0,
    };
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
}
