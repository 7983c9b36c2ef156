//! The calls the lease engine makes (see `leases`) on the memory store: a lease reserved on one
//! counter, and its unused units given back, with the contract of the Redis store's (REFUND in
//! `store::redis::script`), so that the engine runs on either store.

use tollgate_core::{Decision, Timestamp, Transition, refund};

use super::MemoryStore;
use crate::store::{Charge, Grants, StoreError};

impl MemoryStore {
    /// Charges one counter like [`Store::apply`](crate::store::Store::apply), and also returns
    /// the instant (µs, this store's clock) the charge was made at, for a later
    /// [`MemoryStore::give_back`].
    pub fn reserve(&self, charge: Charge<'_>) -> Result<(Decision, i64), StoreError> {
        let now = self.clock.now();
        let decision = self.decide_one_at(now, &charge, true)?;
        Ok((decision, i64::try_from(now.as_micros()).unwrap_or(i64::MAX)))
    }

    /// Takes back `charge.cost` of a charge made at `at` (µs, this store's clock), as
    /// [`tollgate_core::refund`] does: exact when nothing else charged the counter since, never
    /// more than was charged. A counter that has expired since is left alone (its units came
    /// back with it), and so is one made after `at` (the counter charged expired, and this one
    /// holds none of its units), as the Redis store leaves a key made after the charge. Returns
    /// whether the counter changed.
    pub fn give_back(&self, charge: Charge<'_>, at: i64) -> bool {
        // No charge is made before the epoch.
        let Ok(at) = u64::try_from(at).map(Timestamp::from_micros) else {
            return false;
        };
        let now = self.clock.now();
        let hash = self.hash(charge.key);
        let mut table = self.shards[Self::shard_of(hash)].lock();
        let Some(slot) = table.find_mut(hash, |slot| *slot.key == *charge.key) else {
            return false;
        };
        if slot.expires_at <= now || slot.state.born().is_some_and(|born| born > at) {
            return false;
        }
        let transition = refund(charge.params, &slot.state.load(), at, charge.cost);
        if transition == Transition::Keep {
            return false;
        }
        self.apply_held(slot, transition, &charge, now);
        true
    }
}

impl Grants for MemoryStore {
    async fn reserve(&self, charge: Charge<'_>) -> Result<(Decision, i64), StoreError> {
        MemoryStore::reserve(self, charge)
    }

    async fn give_back(&self, charge: Charge<'_>, at: i64) -> Result<(), StoreError> {
        MemoryStore::give_back(self, charge, at);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tollgate_core::{Algorithm, Params};

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::store::Store;

    fn store() -> (Arc<ManualClock>, MemoryStore) {
        let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
            1_700_000_000_000_000,
        )));
        (clock.clone(), MemoryStore::new(clock))
    }

    async fn left(store: &MemoryStore, params: &Params) -> u64 {
        let decisions = store.peek(&[Charge::new(b"k", params, 0)]).await;
        decisions.unwrap_or_else(|e| panic!("{e}"))[0].remaining
    }

    /// A reservation is given back at the instant it names, exactly.
    #[tokio::test]
    async fn a_reservation_goes_back_at_its_instant() {
        let (clock, store) = store();
        let params = Params::new(Algorithm::Gcra, 10, Duration::from_secs(1), None).unwrap();
        let (decision, at) = store.reserve(Charge::new(b"k", &params, 6)).unwrap();
        assert!(decision.is_allowed());
        assert_eq!(at, i64::try_from(clock.now().as_micros()).unwrap());
        clock.advance(Duration::from_millis(100));
        assert_eq!(left(&store, &params).await, 5, "4 used, 1 back since");
        assert!(store.give_back(Charge::new(b"k", &params, 4), at));
        assert_eq!(left(&store, &params).await, 9);
        assert!(
            !store.give_back(Charge::new(b"k", &params, 4), -1),
            "before the epoch"
        );
    }

    /// A counter that expired since the charge, or was made after it, gets nothing back: its
    /// units came back when it expired, and those it holds now are other requests'.
    #[tokio::test]
    async fn a_counter_made_after_the_charge_gets_nothing_back() {
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::Gcra,
            Algorithm::FixedWindow,
        ] {
            let (clock, store) = store();
            let params = Params::new(algorithm, 10, Duration::from_secs(1), None).unwrap();
            let (_, at) = store.reserve(Charge::new(b"k", &params, 5)).unwrap();
            clock.advance(Duration::from_secs(1));
            assert!(
                !store.give_back(Charge::new(b"k", &params, 5), at),
                "{algorithm}"
            );
            store.apply(&[Charge::new(b"k", &params, 3)]).await.unwrap();
            assert!(
                !store.give_back(Charge::new(b"k", &params, 5), at),
                "{algorithm}"
            );
            assert_eq!(
                left(&store, &params).await,
                7,
                "{algorithm}: the 3 stay charged"
            );
        }
    }

    /// A log that a reload replaced by another algorithm's counter is a counter made then: a
    /// give-back of a charge the log took before leaves it alone.
    #[tokio::test]
    async fn a_log_replaced_by_another_algorithm_gets_nothing_back() {
        let (clock, store) = store();
        let log = Params::new(
            Algorithm::SlidingWindowLog,
            10,
            Duration::from_secs(1),
            None,
        )
        .unwrap();
        let gcra = Params::new(Algorithm::Gcra, 10, Duration::from_secs(1), None).unwrap();
        let (_, at) = store.reserve(Charge::new(b"k", &log, 5)).unwrap();
        clock.advance(Duration::from_millis(10));
        store.apply(&[Charge::new(b"k", &gcra, 2)]).await.unwrap();
        assert!(!store.give_back(Charge::new(b"k", &gcra, 5), at));
        assert_eq!(left(&store, &gcra).await, 8, "the 2 stay charged");
    }
}
