//! Generic cell rate algorithm: one theoretical arrival time (TAT) per key.
//!
//! Time is scaled by `limit` (`now_scaled = now_micros * limit`); one unit of cost is emitted
//! every `period_micros` scaled units and the tolerance is `burst * period_micros`. A request of
//! cost `c` computes `new_tat = max(tat, now_scaled) + c * period_micros` and is admitted iff
//! `new_tat - now_scaled <= burst * period_micros`; the state is then `new_tat`. This is the token
//! bucket seen from the other side (tokens = `burst - (tat - now_scaled) / period_micros`), and
//! the decisions are identical to [`crate::token_bucket`]'s: `remaining` rounds down,
//! `retry_after = ceil((new_tat - now_scaled - tolerance) / limit)` and
//! `reset_after = ceil((tat - now_scaled) / limit)` microseconds.

use crate::scaled::{div_ceil, micros, saturate};
use crate::{Decision, Params, State, Timestamp, Transition};

/// Decides one request; see the [module documentation](self).
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    let limit = params.limit();
    let l = u128::from(limit);
    let p = u128::from(params.period_micros());
    let tolerance = u128::from(params.burst()) * p;
    let tat = match *state {
        State::Gcra { tat_scaled } => tat_scaled,
        _ => 0,
    };
    let now_scaled = u128::from(now.as_micros()) * l;
    // How far the TAT is ahead of now: the bucket's missing tokens, scaled.
    let ahead = tat.saturating_sub(now_scaled);
    let remaining = |ahead: u128| saturate(tolerance.saturating_sub(ahead) / p);
    let reset_after = |ahead: u128| micros(div_ceil(ahead, l));

    if cost > params.capacity() {
        let decision = Decision::cost_exceeds_capacity(limit, remaining(ahead), reset_after(ahead));
        return (decision, Transition::Keep);
    }
    let new_ahead = ahead.saturating_add(u128::from(cost) * p);
    if new_ahead <= tolerance {
        let decision = Decision::allowed(limit, remaining(new_ahead), reset_after(new_ahead));
        let state = State::Gcra {
            tat_scaled: now_scaled + new_ahead,
        };
        return (decision, Transition::Set(state));
    }
    let retry_after = micros(div_ceil(new_ahead - tolerance, l));
    let decision = Decision::denied(limit, remaining(ahead), reset_after(ahead), retry_after);
    (decision, Transition::Keep)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Algorithm, Params, State, Timestamp, Verdict, decide};

    #[test]
    fn spaces_requests_at_the_emission_interval() {
        let params = Params::new(Algorithm::Gcra, 2, Duration::from_secs(1), None).unwrap();
        let mut state = State::empty(&params);
        let t = Timestamp::from_micros(10_000_000);
        for remaining in [1, 0] {
            let (decision, transition) = decide(&params, &state, t, 1);
            assert_eq!(
                (decision.verdict, decision.remaining),
                (Verdict::Allowed, remaining)
            );
            state.apply(transition);
        }
        let (denied, _) = decide(&params, &state, t, 1);
        assert_eq!(denied.retry_after, Some(Duration::from_millis(500)));
        assert_eq!(denied.reset_after, Duration::from_secs(1));
        assert_eq!(
            state.expires_at(&params),
            Timestamp::from_micros(11_000_000)
        );
        let (early, _) = decide(&params, &state, Timestamp::from_micros(10_499_999), 1);
        assert_eq!(early.verdict, Verdict::Denied);
        let (on_time, _) = decide(&params, &state, Timestamp::from_micros(10_500_000), 1);
        assert_eq!(on_time.verdict, Verdict::Allowed);
    }
}
