//! The prefilter: a replica remembers counters the shared store denied, until their
//! retry-after, and denies again locally instead of asking the store.
//!
//! Why it never denies what the store would allow: the store denied a request of cost `c` on a
//! counter at `t` and said it fits again at `t + retry_after` if nothing else is charged. Between
//! the two, other requests can only consume more, so a request of cost `c` before
//! `t + retry_after` is denied by the store too. Only requests of that same cost are answered,
//! so the retry-after given is the store's own (another cost has another retry-after; it goes to
//! the store); other requests charging the key in between can only make the true one later, and
//! a request this replica sees admitted on the key makes it forget the denial. What could make
//! the store allow earlier is a change of limit, which is why an entry is valid only within the
//! epoch it was recorded in (the limiter starts a new epoch when the policy changes, a version
//! is rolled back or a runtime override is set or removed), and a counter given back, which
//! the limiter avoids by never remembering denials of rules with a `local_budget` or of limits
//! set by a runtime override. On a Redis Cluster, a request that lost a race between slots is
//! refunded (see `store::redis`): that is the one case left, for at most that request's cost
//! and the time of one round trip.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate_core::{Decision, Timestamp, Verdict};

use super::keyed_shards::KeyedShards;

/// Most denials remembered per shard (of 16); beyond it new ones are not recorded until a
/// sweep.
const MAX_ENTRIES_PER_SHARD: usize = 16_384;

#[derive(Debug, Clone, Copy)]
struct Denial {
    /// The store's answer and when it was given.
    decision: Decision,
    at: Timestamp,
    /// The cost it was given for: only requests of this cost are denied from it.
    cost: u64,
    epoch: u64,
}

impl Denial {
    fn until(&self) -> Timestamp {
        self.at
            .saturating_add(self.decision.retry_after.unwrap_or(Duration::ZERO))
    }
}

/// Remembered denials, by counter key.
#[derive(Debug, Default)]
pub struct Prefilter {
    denials: KeyedShards<Denial>,
    /// Whether any denial may be remembered: lets the common case (nothing remembered) skip
    /// hashing and locking.
    any: AtomicBool,
}

impl Prefilter {
    /// The store's denial of a request of `cost` on `key` at `now`, if one of the same cost
    /// recorded in `epoch` still holds: its retry-after and reset shortened by the time passed
    /// since.
    pub fn check(&self, key: &[u8], cost: u64, now: Timestamp, epoch: u64) -> Option<Decision> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let denial = self.denials.get(key, |d| *d)?;
        if denial.epoch != epoch || cost != denial.cost || now < denial.at {
            return None;
        }
        let left = denial.until().saturating_since(now);
        if left.is_zero() {
            return None;
        }
        let passed = now.saturating_since(denial.at);
        Some(Decision {
            retry_after: Some(left),
            reset_after: denial.decision.reset_after.saturating_sub(passed),
            ..denial.decision
        })
    }

    /// Remembers the store's `decision` for a request of `cost` on `key` at `now`, if it is a
    /// denial that can clear.
    pub fn record(&self, key: &[u8], cost: u64, decision: &Decision, now: Timestamp, epoch: u64) {
        if decision.verdict != Verdict::Denied || decision.retry_after.is_none() {
            return;
        }
        let denial = Denial {
            decision: *decision,
            at: now,
            cost,
            epoch,
        };
        // A check that runs before `any` is raised only misses this denial, and asks the store.
        if self.denials.set(key, denial, MAX_ENTRIES_PER_SHARD) {
            self.any.store(true, Ordering::Relaxed);
        }
    }

    /// Forgets the denial remembered for `key`, if any.
    pub fn forget(&self, key: &[u8]) {
        if !self.any.load(Ordering::Relaxed) {
            return;
        }
        self.denials.remove(key);
    }

    /// Drops the denials that have cleared at `now` (or belong to an older epoch).
    pub fn sweep(&self, now: Timestamp, epoch: u64) -> usize {
        let mut removed = 0;
        let remaining = self.denials.retain(|_, d| {
            let keep = d.epoch == epoch && d.until() > now;
            removed += usize::from(!keep);
            keep
        });
        // A denial recorded while this sweep ran may be hidden until the next one (the
        // prefilter then simply asks the store).
        self.any.store(remaining > 0, Ordering::Relaxed);
        removed
    }

    /// Denials remembered.
    pub fn len(&self) -> usize {
        self.denials.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(retry_ms: u64) -> Decision {
        Decision {
            verdict: Verdict::Denied,
            limit: 10,
            remaining: 0,
            reset_after: Duration::from_millis(2 * retry_ms),
            retry_after: Some(Duration::from_millis(retry_ms)),
            delay: Duration::ZERO,
        }
    }

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_micros(1_000_000_000 + ms * 1000)
    }

    #[test]
    fn a_denial_holds_until_its_retry_after_for_the_same_cost() {
        let p = Prefilter::default();
        p.record(b"k", 2, &denial(100), at(0), 7);
        let hit = p.check(b"k", 2, at(40), 7).unwrap();
        assert_eq!(hit.retry_after, Some(Duration::from_millis(60)));
        assert_eq!(hit.reset_after, Duration::from_millis(160));
        assert_eq!(hit.verdict, Verdict::Denied);
        assert!(p.check(b"k", 2, at(99), 7).is_some());
        // A cheaper request may fit, a costlier one has a later retry-after: ask the store.
        assert!(p.check(b"k", 1, at(40), 7).is_none());
        assert!(p.check(b"k", 3, at(40), 7).is_none());
        // On time, the store decides again.
        assert!(p.check(b"k", 2, at(100), 7).is_none());
        assert!(p.check(b"other", 2, at(40), 7).is_none());
    }

    #[test]
    fn a_new_epoch_forgets_every_denial() {
        let p = Prefilter::default();
        p.record(b"k", 1, &denial(100), at(0), 7);
        assert!(p.check(b"k", 1, at(1), 8).is_none());
        assert_eq!(p.sweep(at(1), 8), 1);
        assert_eq!(p.len(), 0);
    }

    #[test]
    fn only_denials_that_can_clear_are_remembered() {
        let p = Prefilter::default();
        let allowed = Decision {
            verdict: Verdict::Allowed,
            retry_after: None,
            ..denial(100)
        };
        let never = Decision {
            verdict: Verdict::CostExceedsCapacity,
            retry_after: None,
            ..denial(100)
        };
        p.record(b"a", 1, &allowed, at(0), 1);
        p.record(b"b", 1, &never, at(0), 1);
        assert_eq!(p.len(), 0);
        p.record(b"c", 1, &denial(10), at(0), 1);
        assert_eq!(p.sweep(at(5), 1), 0);
        assert_eq!(p.sweep(at(10), 1), 1);
    }
}
