//! Sliding window log: an exact log of admitted requests over the trailing period.
//!
//! An entry `(time, cost)` counts while `now < time + period`, i.e. while `time` lies in
//! `(now - period, now]` (entries from a clock that ran ahead count too). A request of cost `c`
//! is admitted iff `used + c <= limit` and is then appended; entries that have expired are evicted
//! at the same time, so the log never holds more than `limit` entries. On denial, `retry_after`
//! is when enough of the oldest entries have expired for `c` to fit; `reset_after` is when the
//! newest entry expires (zero for an empty log). No rounding is involved.
//!
//! The log is a [`SlidingLog`]: a decision reads O(log n) of its entries (two binary searches,
//! see [`probes`]), whatever its length.

use std::time::Duration;

use crate::scaled::{micros, saturate};
use crate::{Decision, Params, SlidingLog, State, Timestamp, Transition};

/// Decides one request; see the [module documentation](self).
pub fn decide(params: &Params, state: &State, now: Timestamp, cost: u64) -> (Decision, Transition) {
    decide_counting(params, state, now, cost, &mut 0)
}

/// How many log entries [`decide`] reads to decide this request: at most about
/// `2 * log2(entries) + 2`, the two binary searches (the live entries, then on denial the one
/// whose expiry frees enough).
pub fn probes(params: &Params, state: &State, now: Timestamp, cost: u64) -> u32 {
    let mut probes = 0;
    decide_counting(params, state, now, cost, &mut probes);
    probes
}

fn decide_counting(
    params: &Params,
    state: &State,
    now: Timestamp,
    cost: u64,
    probes: &mut u32,
) -> (Decision, Transition) {
    const EMPTY: SlidingLog = SlidingLog::new();
    let limit = params.limit();
    let period = u128::from(params.period_micros());
    let now_micros = u128::from(now.as_micros());
    let log = match state {
        State::SlidingWindowLog { log } => log,
        _ => &EMPTY,
    };
    // Entries still counting have `time + period > now`: a suffix of the sorted log.
    let first = log.first_from((now_micros + 1).saturating_sub(period), probes);
    let used = log.cost_from(first);
    let newest_expiry = (first < log.len())
        .then(|| log.newest())
        .flatten()
        .map(|newest| u128::from(newest.as_micros()) + period);
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
    // The oldest live entries must expire until `cost` fits: the first by which their cost
    // reaches `need` expires last among them (`need <= used` because `cost <= limit`).
    let need = charged - limit;
    let retry_at = log
        .reaching(first, need, probes)
        .map(|at| u128::from(at.as_micros()) + period)
        .or(newest_expiry);
    let decision = Decision::denied(limit, remaining, until(newest_expiry), until(retry_at));
    (decision, Transition::Keep)
}

/// Gives back `cost` charged at `at` (see [`crate::refund`]): from the log's entry at that
/// instant, which holds every cost admitted then; nothing when there is none (it has expired,
/// or the log is not the one charged).
pub fn refund(_params: &Params, state: &State, at: Timestamp, cost: u64) -> Transition {
    match state {
        State::SlidingWindowLog { log } if log.cost_at(at) > 0 => {
            Transition::LogTakeBack { at, cost }
        }
        _ => Transition::Keep,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Algorithm, Params, SlidingLog, State, Timestamp, Verdict, decide};

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
        let expected = SlidingLog::from_entries([(at(400), 1), (at(1_000), 2)]);
        assert_eq!(state, State::SlidingWindowLog { log: expected });
    }
}

#[cfg(test)]
mod cost {
    use std::time::Duration;

    use crate::{Algorithm, MAX_LOG_LIMIT, Params, State, Timestamp, Transition, decide};

    use super::probes;

    /// A full log of `MAX_LOG_LIMIT` entries (one per microsecond) under a one-second period.
    fn full() -> (Params, State, Timestamp) {
        let params = Params::new(
            Algorithm::SlidingWindowLog,
            MAX_LOG_LIMIT,
            Duration::from_secs(1),
            None,
        )
        .unwrap();
        let mut state = State::empty(&params);
        let start = 10_000_000;
        for i in 0..MAX_LOG_LIMIT {
            let now = Timestamp::from_micros(start + i);
            let (decision, transition) = decide(&params, &state, now, 1);
            assert!(decision.is_allowed());
            state.apply(transition);
        }
        (params, state, Timestamp::from_micros(start + MAX_LOG_LIMIT))
    }

    /// Deciding on a full log reads O(log n) entries, denied or allowed, and an append that
    /// evicts keeps the log at its limit: the cost of a decision does not grow with the log.
    #[test]
    fn a_decision_on_a_full_log_reads_logarithmically_many_entries() {
        let (params, state, now) = full();
        let State::SlidingWindowLog { log } = &state else {
            panic!("a log")
        };
        assert_eq!(log.len() as u64, MAX_LOG_LIMIT);
        let bound = 2 * (MAX_LOG_LIMIT as f64).log2().ceil() as u32 + 2;
        for cost in [0, 1, 7, MAX_LOG_LIMIT] {
            let (decision, _) = decide(&params, &state, now, cost);
            let read = probes(&params, &state, now, cost);
            assert!(read <= bound, "cost {cost}: {read} probes > {bound}");
            if cost > 0 {
                // Exactly when the `cost` oldest entries (one per µs) have expired: the newest of them
                // is `cost - 1` µs after the first.
                assert_eq!(
                    decision.retry_after,
                    Some(Duration::from_micros(1_000_000 - MAX_LOG_LIMIT + cost - 1))
                );
            }
        }
        // A second later every entry has expired: allowed, and the append evicts them all.
        let later = Timestamp::from_micros(now.as_micros() + 1_000_000);
        assert!(probes(&params, &state, later, 1) <= bound);
        let (allowed, transition) = decide(&params, &state, later, 1);
        assert!(allowed.is_allowed());
        let mut state = state;
        state.apply(transition);
        assert!(matches!(&state, State::SlidingWindowLog { log } if log.len() == 1));
        assert_ne!(Transition::Keep, decide(&params, &state, later, 1).1);
    }
}
