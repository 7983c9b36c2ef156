//! The embedded in-memory store: sharded maps behind non-poisoning mutexes.
//!
//! A request's charges are applied in one atomic step: the shards its keys live in are locked in
//! ascending order (so two requests never deadlock), every charge is decided, and the transitions
//! are committed only if the request is admitted. Every entry carries the instant its state
//! becomes equivalent to an empty one, under the params it was written with; a decision reads an
//! entry past it as empty (as a Redis TTL drops the key, which matters once a policy changed the
//! params: see `tollgate_core::State`), and [`MemoryStore::sweep`] drops it, so memory is
//! bounded by live keys, and those by [`MemoryStore::with_max_keys`]: a flood of new keys (one
//! per client address, say) is refused past it, as Redis refuses writes at `maxmemory`, rather
//! than growing the process until it is killed. [`MemoryStore::with_max_bytes`] refuses new keys
//! the same way once the bytes its keys are estimated to hold would pass a bound: a key's slot
//! is a fixed size, but a sliding log's entries grow with its limit (a full log of 131 072
//! entries holds 2 MiB).

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use foldhash::quality::RandomState;
use hashbrown::HashTable;
use parking_lot::Mutex;
use tollgate_core::{Decision, Params, Timestamp};

use super::{Answered, Call, Charge, Decisions, Refusal, Store, StoreError, Unsupported};
use crate::clock::SharedClock;
use crate::resilience::BreakerState;

mod decide;
mod leases;
mod slot;

use slot::Slot;

const SHARDS: usize = 64;

type Shard = HashTable<Box<Slot>>;

/// In-process store; the default when no external store is configured.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// Keyed with a random seed of this store's own: callers choose the keys, and an unkeyed
    /// hash would let them pick keys that all land in one shard and one probe sequence.
    /// foldhash rather than std's SipHash: a 55-byte key hashes in about a fifth of the
    /// instructions, and its seeded folded multiplies defeat precomputed collisions (it does
    /// not claim to resist an attacker who can observe hashes; nothing here shows them).
    hasher: RandomState,
    clock: SharedClock,
    /// Entries held, live or not yet swept.
    entries: AtomicUsize,
    /// Most entries held: a request that needs a new one past it is refused.
    max_keys: usize,
    /// Most bytes the entries are counted for ([`Slot::bytes`]): a request that needs a new
    /// entry past it is refused. `None`: not bounded, and not counted either, so a store
    /// without the bound decides as it did before there was one.
    max_bytes: Option<usize>,
    /// What the entries held are counted for, kept while `max_bytes` is set: raised as one is
    /// added or its sliding log's buffer grows, lowered as one is swept or replaced on expiry.
    bytes: AtomicUsize,
}

impl MemoryStore {
    /// An empty store reading time from `clock`, with no limit on its keys.
    pub fn new(clock: SharedClock) -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            hasher: RandomState::default(),
            clock,
            entries: AtomicUsize::new(0),
            max_keys: usize::MAX,
            max_bytes: None,
            bytes: AtomicUsize::new(0),
        }
    }

    /// This store, holding at most about `max` keys (concurrent requests may each add theirs
    /// past it, a few at most): a request whose charge needs a key more is refused with
    /// [`StoreError::NotCalled`], charging nothing, and its limits take their failure
    /// postures; keys already held are decided as usual, and room comes back as keys expire.
    pub fn with_max_keys(mut self, max: usize) -> Self {
        self.max_keys = max;
        self
    }

    /// This store, refusing a request that needs a new key once the bytes its keys are counted
    /// for ([`KEY_BYTES`] each, a longer key's buffer, a sliding log's entries) and the new
    /// key's would pass `max`, exactly as [`MemoryStore::with_max_keys`] refuses one past its
    /// keys. Keys already held are decided as usual, a sliding log growing past `max` too (each
    /// by at most its limit's entries), and bytes come back as keys expire and are swept. Set
    /// before the store holds a key: it counts from then on.
    ///
    /// [`KEY_BYTES`]: slot::KEY_BYTES
    pub fn with_max_bytes(mut self, max: usize) -> Self {
        self.max_bytes = Some(max);
        self
    }

    /// The bytes the entries held are counted for, when [`MemoryStore::with_max_bytes`] bounds
    /// them (they are not counted otherwise).
    pub fn bytes(&self) -> Option<usize> {
        self.max_bytes.map(|_| self.bytes.load(Ordering::Relaxed))
    }

    /// Why a commit that needs `new_keys` more keys, counted for `new_bytes`, is refused: the
    /// store holds its most keys or bytes. Out of line: requests on held keys never call it.
    #[inline(never)]
    fn refusal(&self, new_keys: usize, new_bytes: impl FnOnce() -> usize) -> Option<Refusal> {
        if self.len().saturating_add(new_keys) > self.max_keys {
            return Some(Refusal::MostKeys { max: self.max_keys });
        }
        let max = self.max_bytes?;
        let held = self.bytes.load(Ordering::Relaxed);
        (held.saturating_add(new_bytes()) > max).then_some(Refusal::MostBytes { held, max })
    }

    /// Counts a slot that went from `before` to `after` bytes.
    #[inline(never)]
    fn resized(&self, before: usize, after: usize) {
        if after > before {
            self.bytes.fetch_add(after - before, Ordering::Relaxed);
        } else if before > after {
            self.bytes.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard_of(hash: u64) -> usize {
        // SHARDS is a power of two. The table uses the low bits (bucket) and the top seven
        // (tag) of the same keyed hash, so the shard takes bits from the middle.
        ((hash >> 32) as usize) & (SHARDS - 1)
    }

    /// The time on this store's clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Whether this store reads its time from `clock` (the same one, not one alike).
    pub fn reads(&self, clock: &SharedClock) -> bool {
        Arc::ptr_eq(&self.clock, clock)
    }

    /// Removes every entry whose state has expired at `now`. Returns how many were removed.
    pub fn sweep(&self, now: Timestamp) -> usize {
        let mut removed = 0;
        let counts_bytes = self.max_bytes.is_some();
        for shard in self.shards.iter() {
            let mut table = shard.lock();
            let before = table.len();
            let mut freed = 0usize;
            table.retain(|slot| {
                let live = slot.expires_at > now;
                if !live && counts_bytes {
                    freed += slot.bytes();
                }
                live
            });
            let gone = before - table.len();
            self.entries.fetch_sub(gone, Ordering::Relaxed);
            if freed > 0 {
                self.bytes.fetch_sub(freed, Ordering::Relaxed);
            }
            removed += gone;
        }
        removed
    }

    /// Number of entries, live or not yet swept.
    pub fn len(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    /// Whether the store holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes expired entries using the store's own clock.
    pub fn sweep_now(&self) -> usize {
        self.sweep(self.clock.now())
    }
}

impl Store for MemoryStore {
    async fn decide(
        &self,
        call: Call,
        charges: &[Charge<'_>],
        decisions: &mut Decisions,
    ) -> Result<Answered, StoreError> {
        decisions.clear();
        MemoryStore::decide(self, charges, call.mode.applies(), decisions)?;
        Ok(Answered::Store)
    }

    async fn apply_before(
        &self,
        charges: &[Charge<'_>],
        _deadline: tokio::time::Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        self.apply(charges).await
    }

    fn supports(&self, _params: &Params) -> Result<(), Unsupported> {
        Ok(())
    }

    async fn key_count(&self) -> Result<usize, StoreError> {
        Ok(self.len())
    }

    fn breakers(&self) -> Vec<(String, BreakerState)> {
        Vec::new()
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::Algorithm;

    use super::slot::KEY_BYTES;
    use super::*;

    /// What a walk of every slot counts: the running total must always equal it.
    fn walked(store: &MemoryStore) -> usize {
        let shards = store.shards.iter();
        shards
            .map(|s| s.lock().iter().map(|slot| slot.bytes()).sum::<usize>())
            .sum()
    }

    /// The running total follows every way a slot's bytes change: a new key (a longer one with
    /// its own buffer), a sliding log's buffer growing, a key changing algorithm (a reload), an
    /// expired log replaced by an empty one, a sweep.
    #[test]
    fn the_counted_bytes_follow_every_change_of_a_slot() {
        use std::sync::Arc;

        use crate::clock::{Clock, ManualClock};

        let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
            1_700_000_000_000_000,
        )));
        let store = MemoryStore::new(clock.clone()).with_max_bytes(usize::MAX);
        let second = Duration::from_secs(1);
        let log = Params::new(Algorithm::SlidingWindowLog, 1_000, second, None).unwrap();
        let fixed = Params::new(Algorithm::FixedWindow, 1_000, second, None).unwrap();
        let long_key = "k".repeat(100);
        let charge = |key: &'static str, params| Charge::new(key.as_bytes(), params, 1);
        let apply = |charges: &[Charge<'_>]| {
            let mut decisions = Decisions::new();
            store.decide(charges, true, &mut decisions).unwrap();
            assert_eq!(store.bytes(), Some(walked(&store)));
        };
        apply(&[charge("a", &fixed)]);
        assert_eq!(store.bytes(), Some(KEY_BYTES));
        apply(&[Charge::new(long_key.as_bytes(), &fixed, 1)]);
        assert_eq!(store.bytes(), Some(2 * KEY_BYTES + 100));
        for _ in 0..100 {
            clock.advance(Duration::from_millis(1));
            apply(&[charge("log", &log)]);
        }
        let grown = store.bytes().unwrap();
        assert!(grown >= 3 * KEY_BYTES + 100 + 100 * 16, "{grown}");
        // A reload made the log a fixed window, and the fixed window a log.
        apply(&[charge("log", &fixed), charge("a", &log)]);
        assert!(store.bytes().unwrap() < grown);
        // Expired, the log is replaced by an empty one before its new entry.
        clock.advance(Duration::from_secs(2));
        for _ in 0..100 {
            clock.advance(Duration::from_millis(1));
            apply(&[charge("b", &log)]);
        }
        let full = store.bytes().unwrap();
        clock.advance(Duration::from_secs(2));
        apply(&[charge("b", &log)]);
        assert!(
            store.bytes().unwrap() + 100 * 16 <= full,
            "the expired entries' buffer went"
        );
        clock.advance(Duration::from_secs(2));
        assert_eq!(store.sweep(clock.now()), 4);
        assert_eq!(store.bytes(), Some(0));
        assert_eq!(walked(&store), 0);
    }

    /// Without the bound nothing is counted, and nothing reported.
    #[test]
    fn an_unbounded_store_counts_no_bytes() {
        let clock = std::sync::Arc::new(crate::clock::ManualClock::new(Timestamp::EPOCH));
        let store = MemoryStore::new(clock);
        let fixed = Params::new(Algorithm::FixedWindow, 9, Duration::from_secs(1), None).unwrap();
        let mut decisions = Decisions::new();
        store
            .decide(&[Charge::new(b"a", &fixed, 1)], true, &mut decisions)
            .unwrap();
        assert_eq!(store.bytes(), None);
        assert_eq!(store.bytes.load(Ordering::Relaxed), 0);
    }
}
