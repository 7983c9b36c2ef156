//! Token bucket: `burst` tokens, refilled continuously at `limit` tokens per period.
//!
//! Tokens are kept scaled by `period_micros`, so `e` microseconds refill exactly `e * limit`
//! scaled units and no rounding happens in the state. A request of cost `c` is admitted iff the
//! bucket holds at least `c` tokens (`c * period_micros` scaled units), which it then removes. The
//! empty state is a full bucket. `remaining` is the whole tokens left (rounded down);
//! `retry_after` is `ceil(missing_scaled / limit)` microseconds and `reset_after` the time until
//! the bucket is full, rounded up the same way. Time never runs backwards for a key: a `now`
//! earlier than the last update is decided as at that update, with durations counted from `now`.
//! Observably identical to [`crate::gcra`].

use crate::scaled::{div_ceil, micros, saturate};
use crate::{Decision, Params, State, Timestamp, Transition};

/// Decides one request; see the [module documentation](self).
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    let limit = params.limit();
    let l = u128::from(limit);
    let p = u128::from(params.period_micros());
    let capacity = u128::from(params.burst()) * p;
    let (stored, updated) = match *state {
        State::TokenBucket {
            tokens_scaled,
            updated,
        } => (tokens_scaled, updated),
        _ => (capacity, Timestamp::EPOCH),
    };
    let at = now.max(updated);
    let late = u128::from(at.as_micros() - now.as_micros());
    let refill = u128::from(at.as_micros() - updated.as_micros()) * l;
    let tokens = stored.saturating_add(refill).min(capacity);
    let remaining = |tokens: u128| saturate(tokens / p);
    let until_full = |tokens: u128| micros(late.saturating_add(div_ceil(capacity - tokens, l)));

    let wanted = u128::from(cost) * p;
    if cost > params.capacity() {
        let decision =
            Decision::cost_exceeds_capacity(limit, remaining(tokens), until_full(tokens));
        return (decision, Transition::Keep);
    }
    if let Some(left) = tokens.checked_sub(wanted) {
        let decision = Decision::allowed(limit, remaining(left), until_full(left));
        let state = State::TokenBucket {
            tokens_scaled: left,
            updated: at,
        };
        return (decision, Transition::Set(state));
    }
    let retry_after = micros(late.saturating_add(div_ceil(wanted - tokens, l)));
    let decision = Decision::denied(limit, remaining(tokens), until_full(tokens), retry_after);
    (decision, Transition::Keep)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Algorithm, Params, State, Timestamp, Verdict, decide};

    #[test]
    fn refills_continuously() {
        let params =
            Params::new(Algorithm::TokenBucket, 1, Duration::from_secs(1), Some(5)).unwrap();
        let mut state = State::empty(&params);
        let t = Timestamp::from_micros(1_000_000_000);
        for remaining in (0..5).rev() {
            let (decision, transition) = decide(&params, &state, t, 1);
            assert_eq!(
                (decision.verdict, decision.remaining),
                (Verdict::Allowed, remaining)
            );
            state.apply(transition);
        }
        let (denied, _) = decide(&params, &state, t, 1);
        assert_eq!(denied.retry_after, Some(Duration::from_secs(1)));
        assert_eq!(denied.reset_after, Duration::from_secs(5));
        let half = t.saturating_add(Duration::from_millis(1_500));
        let (denied, _) = decide(&params, &state, half, 2);
        assert_eq!(denied.remaining, 1);
        assert_eq!(denied.retry_after, Some(Duration::from_millis(500)));
    }

    #[test]
    fn an_earlier_clock_is_decided_at_the_last_update() {
        let params =
            Params::new(Algorithm::TokenBucket, 1, Duration::from_secs(1), Some(1)).unwrap();
        let state = State::TokenBucket {
            tokens_scaled: 0,
            updated: Timestamp::from_micros(5_000),
        };
        let (denied, _) = decide(&params, &state, Timestamp::from_micros(4_900), 1);
        assert_eq!(denied.retry_after, Some(Duration::from_micros(1_000_100)));
        assert_eq!(denied.reset_after, Duration::from_micros(1_000_100));
    }
}
