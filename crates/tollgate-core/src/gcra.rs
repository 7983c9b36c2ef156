//! Generic cell rate algorithm: one theoretical arrival time (TAT) per key.
//!
//! Time is scaled by `limit` (`now_scaled = now_micros * limit`); one unit of cost is emitted
//! every `period_micros` scaled units and the tolerance is `burst * period_micros`. A request of
//! cost `c` computes `new_tat = max(tat, now_scaled) + c * period_micros` and is admitted iff
//! `new_tat - now_scaled <= burst * period_micros`; the state is then `new_tat`. This is the token
//! bucket seen from the other side (tokens = `burst - (tat - now_scaled) / period_micros`), and
//! under fixed params the decisions are identical to [`crate::token_bucket`]'s: `remaining`
//! rounds down, `retry_after = ceil((new_tat - now_scaled - tolerance) / limit)` and
//! `reset_after = ceil((tat - now_scaled) / limit)` microseconds.
//!
//! Under other params than the TAT was written with (a reload), the key keeps the units it had
//! used when the TAT was written (see [`State`]): how far the TAT was ahead of that instant is
//! as many units of the new params, capped at the new burst, draining at the new rate since. A
//! key that had used 3 of 10 has `max(0, new burst - 3)` left then (1 per hour loosened to 10
//! per minute: a key that used its one unit has 9 left).

use crate::scaled::{div_ceil, micros, rewound, saturate};
use crate::{Decision, Params, State, Timestamp, Transition};

/// Decides one request; see the [module documentation](self).
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    let limit = params.limit();
    let l = u128::from(limit);
    let p = u128::from(params.period_micros());
    let tolerance = u128::from(params.burst()) * p;
    let tat = state.gcra_tat(params).unwrap_or(0);
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
            updated: now,
            limit: params.limit_scale(),
            period: params.period_scale(),
        };
        return (decision, Transition::Set(state));
    }
    let retry_after = micros(div_ceil(new_ahead - tolerance, l));
    let decision = Decision::denied(limit, remaining(ahead), reset_after(ahead), retry_after);
    (decision, Transition::Keep)
}

/// Gives back `cost` charged at `at` (see [`crate::refund`]): the TAT moves back by what the
/// charge added, `cost * period_micros` scaled units (`cost` at most the burst), never before
/// `at`; a TAT written under another limit or period (a reload converted it since) is left
/// alone.
pub fn refund(params: &Params, state: &State, at: Timestamp, cost: u64) -> Transition {
    match *state {
        State::Gcra {
            tat_scaled,
            updated,
            limit,
            period,
        } if limit == params.limit_scale() && period == params.period_scale() => {
            match rewound(params, tat_scaled, at, cost) {
                Some(tat_scaled) => Transition::Set(State::Gcra {
                    tat_scaled,
                    updated,
                    limit,
                    period,
                }),
                None => Transition::Keep,
            }
        }
        _ => Transition::Keep,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Algorithm, Params, State, Timestamp, Transition, Verdict, decide};

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

    /// A reload keeps the units used: 10/s tightened to 5/s (burst 5) leaves a key that used
    /// 4 one unit and one that used all 10 none (the next after one new emission, 200ms);
    /// loosened to 20/s, the first key has 16. Before, the arrival time was kept as an instant,
    /// which under the tighter limit gave the partly used key a fuller bucket than it had.
    #[test]
    fn a_changed_limit_keeps_the_units_used() {
        let second = Duration::from_secs(1);
        let ten = Params::new(Algorithm::Gcra, 10, second, None).unwrap();
        let five = Params::new(Algorithm::Gcra, 5, second, None).unwrap();
        let twenty = Params::new(Algorithm::Gcra, 20, second, None).unwrap();
        let t = Timestamp::from_micros(1_700_000_000_000_000);
        let (mut partly, mut fully) = (State::empty(&ten), State::empty(&ten));
        partly.apply(decide(&ten, &partly, t, 4).1);
        fully.apply(decide(&ten, &fully, t, 10).1);

        let (allowed, _) = decide(&five, &partly, t, 1);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 0));
        assert_eq!(decide(&five, &partly, t, 2).0.verdict, Verdict::Denied);
        let (denied, _) = decide(&five, &fully, t, 1);
        assert_eq!((denied.verdict, denied.remaining), (Verdict::Denied, 0));
        assert_eq!(denied.retry_after, Some(Duration::from_millis(200)));
        assert_eq!(denied.reset_after, second);
        let (allowed, _) = decide(&twenty, &partly, t, 1);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 15));
    }

    /// Loosened from 1 per hour to 10 per minute (or an hourly override lifted), a key that
    /// used its one unit has 9 left, as a window would; tightened back, the 10 units used of
    /// the minute are capped at the hour's one: denied, and recovered an hour later.
    #[test]
    fn a_new_period_keeps_the_units_used() {
        let hourly = Params::new(Algorithm::Gcra, 1, Duration::from_secs(3_600), None).unwrap();
        let minute = Params::new(Algorithm::Gcra, 10, Duration::from_secs(60), None).unwrap();
        let t = Timestamp::from_micros(1_700_000_000_000_000);
        let mut state = State::empty(&hourly);
        state.apply(decide(&hourly, &state, t, 1).1);
        let (allowed, _) = decide(&minute, &state, t, 9);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 0));
        assert_eq!(decide(&minute, &state, t, 10).0.verdict, Verdict::Denied);

        let mut state = State::empty(&minute);
        state.apply(decide(&minute, &state, t, 10).1);
        let (denied, _) = decide(&hourly, &state, t, 1);
        assert_eq!(denied.retry_after, Some(Duration::from_secs(3_600)));
        // 30 s later, under the minute's rate 5 units came back before the hour read them.
        let later = t.saturating_add(Duration::from_secs(30));
        let (allowed, _) = decide(&minute, &state, later, 5);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 0));
    }

    /// Units used that are not a whole number of scaled units under the new period are rounded
    /// up to the next one: never more quota than before.
    #[test]
    fn converted_units_round_up() {
        let three = Params::new(Algorithm::Gcra, 3, Duration::from_micros(3_000), None).unwrap();
        let seven = Params::new(Algorithm::Gcra, 3, Duration::from_micros(7_000), None).unwrap();
        let state = State::Gcra {
            tat_scaled: 3_000 * 3 + 1, // 3000µs and 1/3000 of a unit
            updated: Timestamp::from_micros(3_000),
            limit: three.limit_scale(),
            period: three.period_scale(),
        };
        let (decision, transition) = decide(&seven, &state, Timestamp::from_micros(3_000), 0);
        // 7/3 scaled units of the 7ms period, rounded up to 3.
        assert_eq!(
            transition,
            Transition::Set(State::Gcra {
                tat_scaled: 9_000 + 3,
                updated: Timestamp::from_micros(3_000),
                limit: seven.limit_scale(),
                period: seven.period_scale(),
            })
        );
        assert_eq!(decision.reset_after, Duration::from_micros(1));
    }
}
