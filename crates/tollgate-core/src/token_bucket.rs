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
//! The state records the tokens *used* (missing from a full bucket) at `updated` and the limit
//! and period it was written under. Under other params (a reload) the key keeps the tokens it
//! had used at `updated` (see [`State`]): as many tokens of the new params, capped at the new
//! burst, so `max(0, new burst - used)` were left then, refilled at the new rate since.

use crate::scaled::{charged, div_ceil, micros, saturate};
use crate::{Decision, Params, State, Timestamp, Transition};

/// Decides one request; see the [module documentation](self).
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    let limit = params.limit();
    let l = u128::from(limit);
    let p = u128::from(params.period_micros());
    let capacity = u128::from(params.burst()) * p;
    let (used, updated) = state.token_bucket(params).unwrap_or((0, Timestamp::EPOCH));
    let at = now.max(updated);
    let late = u128::from(at.as_micros() - now.as_micros());
    let refill = u128::from(at.as_micros() - updated.as_micros()) * l;
    // The tokens used at `updated` (at most the burst), less those refilled since.
    let tokens = capacity - used.saturating_sub(refill);
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
            used_scaled: capacity - left,
            updated: at,
            limit: params.limit_scale(),
            period: params.period_scale(),
        };
        return (decision, Transition::Set(state));
    }
    let retry_after = micros(late.saturating_add(div_ceil(wanted - tokens, l)));
    let decision = Decision::denied(limit, remaining(tokens), until_full(tokens), retry_after);
    (decision, Transition::Keep)
}

/// Gives back `cost` charged at `at` (see [`crate::refund`]): `cost` tokens (at most the
/// burst) go back into the bucket, which holds no more than full; a bucket written under
/// another limit or period (a reload converted it since) is left alone. The tokens go back
/// whenever the charge was made, so a late give-back credits a bucket that has refilled since.
pub fn refund(params: &Params, state: &State, _at: Timestamp, cost: u64) -> Transition {
    match *state {
        State::TokenBucket {
            used_scaled,
            updated,
            limit,
            period,
        } if limit == params.limit_scale()
            && period == params.period_scale()
            && used_scaled > 0 =>
        {
            Transition::Set(State::TokenBucket {
                used_scaled: used_scaled.saturating_sub(charged(params, cost)),
                updated,
                limit,
                period,
            })
        }
        _ => Transition::Keep,
    }
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
            used_scaled: 1_000_000,
            updated: Timestamp::from_micros(5_000),
            limit: params.limit_scale(),
            period: params.period_scale(),
        };
        let (denied, _) = decide(&params, &state, Timestamp::from_micros(4_900), 1);
        assert_eq!(denied.retry_after, Some(Duration::from_micros(1_000_100)));
        assert_eq!(denied.reset_after, Duration::from_micros(1_000_100));
    }

    /// A reload keeps the tokens used: 10/s tightened to 5/s (burst 5) leaves a key that used
    /// 4 one token, one that used all 10 none (one new token after 200ms), and loosened to 20/s
    /// (burst 20) the first key has 16.
    #[test]
    fn a_changed_limit_keeps_the_tokens_used() {
        let second = Duration::from_secs(1);
        let ten = Params::new(Algorithm::TokenBucket, 10, second, None).unwrap();
        let five = Params::new(Algorithm::TokenBucket, 5, second, None).unwrap();
        let twenty = Params::new(Algorithm::TokenBucket, 20, second, None).unwrap();
        let t = Timestamp::from_micros(1_700_000_000_000_000);
        let (mut partly, mut fully) = (State::empty(&ten), State::empty(&ten));
        partly.apply(decide(&ten, &partly, t, 4).1);
        fully.apply(decide(&ten, &fully, t, 10).1);

        let (allowed, _) = decide(&five, &partly, t, 1);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 0));
        let (denied, _) = decide(&five, &partly, t, 2);
        assert_eq!(denied.verdict, Verdict::Denied);
        let (denied, _) = decide(&five, &fully, t, 1);
        assert_eq!((denied.verdict, denied.remaining), (Verdict::Denied, 0));
        assert_eq!(denied.retry_after, Some(Duration::from_millis(200)));
        assert_eq!(denied.reset_after, second);
        let (allowed, _) = decide(&twenty, &partly, t, 1);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 15));
    }

    /// What a state had used when written is as many tokens of a new period, rounded up to the
    /// next `1 / period_micros` token, refilling at the new rate from then on.
    #[test]
    fn a_new_period_converts_the_tokens_used_rounded_up() {
        let per_second =
            Params::new(Algorithm::TokenBucket, 10, Duration::from_secs(1), None).unwrap();
        let per_minute = Params::new(
            Algorithm::TokenBucket,
            60,
            Duration::from_secs(60),
            Some(10),
        )
        .unwrap();
        let t = Timestamp::from_micros(1_000_000_000);
        let mut state = State::empty(&per_second);
        state.apply(decide(&per_second, &state, t, 4).1);
        // 4 used when written, refilling at the new 1 per second since: 50ms later 3.95 are
        // used, 6 whole tokens left of the new 10, and the 7th is 950ms away.
        let later = t.saturating_add(Duration::from_millis(50));
        let (denied, _) = decide(&per_minute, &state, later, 7);
        assert_eq!((denied.verdict, denied.remaining), (Verdict::Denied, 6));
        assert_eq!(denied.retry_after, Some(Duration::from_millis(950)));

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
            used_scaled: 1, // 1/3000 token used
            updated: t,
            limit: p3.limit_scale(),
            period: p3.period_scale(),
        };
        // 7/3 units of 1/7000 token: 3.
        let (_, transition) = decide(&p7, &state, t, 0);
        let expected = State::TokenBucket {
            used_scaled: 3,
            updated: t,
            limit: p7.limit_scale(),
            period: p7.period_scale(),
        };
        assert_eq!(transition, Transition::Set(expected));
    }
}
