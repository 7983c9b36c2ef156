//! Sliding window log: an exact log of admitted requests over the trailing period.
//!
//! An entry `(time, cost)` counts while `now < time + period`, i.e. while `time` lies in
//! `(now - period, now]` (entries from a clock that ran ahead count too). A request of cost `c`
//! is admitted iff `used + c <= limit` and is then appended; entries that have expired are evicted
//! at the same time, so the log never holds more than `limit` entries. On denial, `retry_after`
//! is when enough of the oldest entries have expired for `c` to fit; `reset_after` is when the
//! newest entry expires (zero for an empty log). No rounding is involved.

use std::time::Duration;

use crate::scaled::{micros, saturate};
use crate::{Decision, Params, State, Timestamp, Transition};

/// Decides one request; see the [module documentation](self).
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    let limit = params.limit();
    let period = u128::from(params.period_micros());
    let now_micros = u128::from(now.as_micros());
    let entries = match state {
        State::SlidingWindowLog { entries } => Some(entries),
        _ => None,
    };
    // Entries still counting, as (expiry, cost), oldest first.
    let live = || {
        entries
            .into_iter()
            .flatten()
            .map(|&(time, cost)| (u128::from(time.as_micros()) + period, cost))
            .filter(|&(expiry, cost)| expiry > now_micros && cost > 0)
    };
    let used = live().fold(0u64, |used, (_, cost)| used.saturating_add(cost));
    let newest_expiry = live().map(|(expiry, _)| expiry).max();
    let until = |expiry: Option<u128>| {
        expiry.map_or(Duration::ZERO, |expiry| {
            micros(expiry.saturating_sub(now_micros))
        })
    };
    let remaining = limit.saturating_sub(used);

    if cost > params.capacity() {
        let decision = Decision::cost_exceeds_capacity(limit, remaining, until(newest_expiry));
        return (decision, Transition::Keep);
    }
    let charged = used.saturating_add(cost);
    if charged <= limit {
        if cost == 0 {
            return (
                Decision::allowed(limit, remaining, until(newest_expiry)),
                Transition::Keep,
            );
        }
        let newest_expiry = newest_expiry.max(Some(now_micros + period));
        let decision = Decision::allowed(limit, limit - charged, until(newest_expiry));
        let transition = Transition::LogAppend {
            // Entries with `time + period <= now` have expired.
            evict_before: Timestamp::from_micros(saturate((now_micros + 1).saturating_sub(period))),
            at: now,
            cost,
        };
        return (decision, transition);
    }
    // Free the oldest entries until `cost` fits. The log is sorted, so the entry that frees
    // enough expires last among those; `need <= used` because `cost <= limit`.
    let need = charged - limit;
    let mut freed = 0u64;
    let mut retry_at = newest_expiry;
    for (expiry, cost) in live() {
        freed = freed.saturating_add(cost);
        if freed >= need {
            retry_at = Some(expiry);
            break;
        }
    }
    let decision = Decision::denied(limit, remaining, until(newest_expiry), until(retry_at));
    (decision, Transition::Keep)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

    use crate::{Algorithm, Params, State, Timestamp, Verdict, decide};

    fn at(millis: u64) -> Timestamp {
        Timestamp::from_micros(millis * 1_000)
    }

    #[test]
    fn retries_when_enough_of_the_oldest_entries_expire() {
        let params =
            Params::new(Algorithm::SlidingWindowLog, 3, Duration::from_secs(1), None).unwrap();
        let mut state = State::empty(&params);
        for (time, cost) in [(0, 2), (400, 1)] {
            let (decision, transition) = decide(&params, &state, at(time), cost);
            assert!(decision.is_allowed());
            state.apply(transition);
        }
        let (denied, _) = decide(&params, &state, at(900), 2);
        assert_eq!(denied.verdict, Verdict::Denied);
        assert_eq!(denied.remaining, 0);
        assert_eq!(denied.retry_after, Some(Duration::from_millis(100)));
        assert_eq!(denied.reset_after, Duration::from_millis(500));
        // One microsecond earlier the entry at 0 still counts.
        let (early, _) = decide(&params, &state, Timestamp::from_micros(999_999), 2);
        assert_eq!(early.verdict, Verdict::Denied);

        let (allowed, transition) = decide(&params, &state, at(1_000), 2);
        assert_eq!((allowed.verdict, allowed.remaining), (Verdict::Allowed, 0));
        assert_eq!(allowed.reset_after, Duration::from_secs(1));
        state.apply(transition);
        let expected = VecDeque::from([(at(400), 1), (at(1_000), 2)]);
        assert_eq!(state, State::SlidingWindowLog { entries: expected });
    }
}
