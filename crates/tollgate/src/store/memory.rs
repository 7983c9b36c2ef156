//! The embedded in-memory store: sharded maps behind non-poisoning mutexes.
//!
//! A request's charges are applied in one atomic step: the shards its keys live in are locked in
//! ascending order (so two requests never deadlock), every charge is decided, and the transitions
//! are committed only if the request is admitted. Every entry carries the instant its state
//! becomes equivalent to an empty one; [`MemoryStore::sweep`] drops entries past it, so memory is
//! bounded by live keys.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use tollgate_core::{Decision, State, Timestamp, Transition, decide};

use super::{Charge, Decisions, INLINE_CHARGES, Store, StoreError, admitted};
use crate::clock::SharedClock;

const SHARDS: usize = 64;

#[derive(Debug)]
struct Entry {
    state: State,
    expires_at: Timestamp,
}

type Shard = HashMap<Box<[u8]>, Entry>;

/// In-process store; the default when no external store is configured.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    clock: SharedClock,
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: SharedClock) -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            clock,
        }
    }

    fn shard_of(&self, key: &[u8]) -> usize {
        // SHARDS is a power of two; the low bits of a keyed SipHash are uniform.
        (self.hasher.hash_one(key) as usize) & (SHARDS - 1)
    }

    /// Removes every entry whose state has expired at `now`. Returns how many were removed.
    pub fn sweep(&self, now: Timestamp) -> usize {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut map = shard.lock();
            let before = map.len();
            map.retain(|_, e| e.expires_at > now);
            removed += before - map.len();
        }
        removed
    }

    /// Number of entries, live or not yet swept.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether the store holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes expired entries using the store's own clock.
    pub fn sweep_now(&self) -> usize {
        self.sweep(self.clock.now())
    }

    /// Decides `charges` into `decisions` (empty) and, when `commit` and the request is
    /// admitted, commits them. Up to [`INLINE_CHARGES`] charges on existing keys, nothing is
    /// allocated.
    pub(crate) fn decide(&self, charges: &[Charge<'_>], commit: bool, decisions: &mut Decisions) {
        let now = self.clock.now();
        let mut shard_ids: SmallVec<[usize; INLINE_CHARGES]> =
            charges.iter().map(|c| self.shard_of(c.key)).collect();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[(usize, MutexGuard<'_, Shard>); INLINE_CHARGES]> =
            order.iter().map(|&i| (i, self.shards[i].lock())).collect();
        let guard_index = |shard: usize| order.binary_search(&shard).unwrap_or(0);
        for id in shard_ids.iter_mut() {
            *id = guard_index(*id);
        }

        let mut transitions: SmallVec<[Transition; INLINE_CHARGES]> = SmallVec::new();
        for (i, charge) in charges.iter().enumerate() {
            let map = &guards[shard_ids[i]].1;
            let stored = map.get(charge.key).map(|e| &e.state);
            let repeated = charges[..i].iter().any(|c| c.key == charge.key);
            let (decision, transition) = if repeated {
                // The same counter twice in one request: decide against the state the earlier
                // charges of this request leave behind.
                let mut scratch = stored
                    .cloned()
                    .unwrap_or_else(|| State::empty(charge.params));
                for (prev, t) in charges[..i].iter().zip(&transitions) {
                    if prev.key == charge.key {
                        scratch.apply(Transition::clone(t));
                    }
                }
                decide(charge.params, &scratch, now, charge.cost)
            } else {
                match stored {
                    Some(state) => decide(charge.params, state, now, charge.cost),
                    None => decide(
                        charge.params,
                        &State::empty(charge.params),
                        now,
                        charge.cost,
                    ),
                }
            };
            decisions.push(decision);
            transitions.push(transition);
        }

        if commit && admitted(charges, decisions) {
            for ((charge, transition), shard) in charges.iter().zip(transitions).zip(&shard_ids) {
                if transition == Transition::Keep {
                    continue;
                }
                let map = &mut guards[*shard].1;
                let entry = match map.get_mut(charge.key) {
                    Some(entry) => entry,
                    None => map.entry(charge.key.into()).or_insert(Entry {
                        state: State::empty(charge.params),
                        expires_at: now,
                    }),
                };
                entry.state.apply(transition);
                entry.expires_at = entry.state.expires_at(charge.params);
            }
        }
    }
}

impl Store for MemoryStore {
    async fn apply(&self, charges: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        let mut decisions = Decisions::new();
        self.decide(charges, true, &mut decisions);
        Ok(decisions.into_vec())
    }

    async fn peek(&self, charges: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        let mut decisions = Decisions::new();
        self.decide(charges, false, &mut decisions);
        Ok(decisions.into_vec())
    }

    async fn key_count(&self) -> Result<usize, StoreError> {
        Ok(self.len())
    }
}
