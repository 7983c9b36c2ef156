//! Token bucket: `burst` tokens, refilled continuously at `limit` tokens per period.
//!
//! Tokens are kept scaled by `period_micros`, so `e` microseconds refill exactly `e * limit`
//! scaled units and no rounding happens in the state. A request of cost `c` is admitted iff the
//! bucket holds at least `c` tokens (`c * period_micros` scaled units), which it then removes. The
//! empty state is a full bucket. `remaining` is the whole tokens left (rounded down);
//! `retry_after` is `ceil(missing_scaled / limit)` microseconds and `reset_after` the time until
//! the bucket is full, rounded up the same way. Time never runs backwards for a key: a `now`
//! earlier than the last update is decided as at that update, with durations counted from `now`.
//! Observably identical to [`crate::gcra`] under fixed params.
//!
//! Tokens written under another period are the same number of tokens under this one, rounded
//! down to the next `1 / period_micros` token (see [`State`]); they refill from `updated` at the
//! current rate and never count for more than the current burst. A reload keeps the key's
//! tokens, not its refill time (which GCRA keeps), so the two can differ after one.

use crate::scaled::{div_ceil, micros, saturate};
use crate::{Decision, Params, State, Timestamp, Transition};

/// Decides one request; see the [module documentation](self).
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    let limit = params.limit();
    let l = u128::from(limit);
    let p = u128::from(params.period_micros());
    let capacity = u128::from(params.burst()) * p;
    let (stored, updated) = state
        .token_bucket(params)
        .unwrap_or((capacity, Timestamp::EPOCH));
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
            scale: params.period_scale(),
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

    use crate::{Algorithm, Params, State, Timestamp, Transition, Verdict, decide};

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
            scale: params.period_scale(),
        };
        let (denied, _) = decide(&params, &state, Timestamp::from_micros(4_900), 1);
        assert_eq!(denied.retry_after, Some(Duration::from_micros(1_000_100)));
        assert_eq!(denied.reset_after, Duration::from_micros(1_000_100));
    }

    /// After a reload from 1000/s to 10/s the bucket keeps its tokens, up to the new burst.
    #[test]
    fn a_lower_limit_keeps_the_tokens() {
        let fast =
            Params::new(Algorithm::TokenBucket, 1_000, Duration::from_secs(1), None).unwrap();
        let slow = Params::new(Algorithm::TokenBucket, 10, Duration::from_secs(1), None).unwrap();
        let t = Timestamp::from_micros(1_700_000_000_000_000);
        let (mut one, mut all) = (State::empty(&fast), State::empty(&fast));
        one.apply(decide(&fast, &one, t, 1).1);
        all.apply(decide(&fast, &all, t, 995).1);
        // 999 tokens left: a full bucket of 10.
        let (allowed, _) = decide(&slow, &one, t, 10);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 0));
        assert_eq!(one.expires_at(&slow), t);
        // 5 left: 5 now, then one per 100ms.
        let (denied, _) = decide(&slow, &all, t, 6);
        assert_eq!(
            (denied.remaining, denied.retry_after),
            (5, Some(Duration::from_millis(100)))
        );
        assert_eq!(denied.reset_after, Duration::from_millis(500));
    }

    /// A new period keeps the number of tokens; a fraction that the new period cannot express
    /// rounds down.
    #[test]
    fn a_new_period_keeps_the_tokens_rounded_down() {
        let per_second =
            Params::new(Algorithm::TokenBucket, 10, Duration::from_secs(1), None).unwrap();
        let per_minute = Params::new(
            Algorithm::TokenBucket,
            600,
            Duration::from_secs(60),
            Some(10),
        )
        .unwrap();
        let t = Timestamp::from_micros(1_000_000_000);
        let mut state = State::empty(&per_second);
        state.apply(decide(&per_second, &state, t, 4).1);
        let later = t.saturating_add(Duration::from_millis(50));
        // Same rate: 6.5 tokens either way.
        let (mut decision, _) = decide(&per_minute, &state, later, 7);
        assert_eq!(decision.retry_after, Some(Duration::from_millis(50)));
        decision.limit = per_second.limit();
        assert_eq!(decision, decide(&per_second, &state, later, 7).0);

        let p3 = Params::new(
            Algorithm::TokenBucket,
            1,
            Duration::from_micros(3_000),
            None,
        )
        .unwrap();
        let p7 = Params::new(
            Algorithm::TokenBucket,
            1,
            Duration::from_micros(7_000),
            None,
        )
        .unwrap();
        let state = State::TokenBucket {
            tokens_scaled: 1, // 1/3000 token: one microsecond of refill
            updated: t,
            scale: p3.period_scale(),
        };
        // 7/3 units of 1/7000 token: 2.
        let (_, transition) = decide(&p7, &state, t, 0);
        let expected = State::TokenBucket {
            tokens_scaled: 2,
            updated: t,
            scale: p7.period_scale(),
        };
        assert_eq!(transition, Transition::Set(expected));
    }
}
