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

use std::borrow::Cow;
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::HashTable;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use tollgate_core::{
    Decision, Params, State, Timestamp, Transition, Verdict, as_is, check_as_is, decide_or_check,
};

use super::{Charge, Decisions, INLINE_CHARGES, Mode, Store, StoreError, Unsupported, admitted};
use crate::clock::SharedClock;
use crate::resilience::BreakerState;

const SHARDS: usize = 64;

/// A counter key, inline up to 56 bytes (a rule key with a UUID-sized value spills to the heap).
type Key = SmallVec<[u8; 56]>;

/// The bytes a key is counted for by [`MemoryStore::with_max_bytes`] besides its spilled key
/// and its sliding log: its slot's 128-byte allocation, and the pointer and control byte the
/// table holds for it (9 bytes a bucket, 10 to 20 a key at the table's 44% to 88% load).
pub const KEY_BYTES: usize = 128 + 16;

/// Bytes a key holds inline in its slot; a longer one takes a heap buffer of its own.
const INLINE_KEY: usize = 56;

/// One key and its state, in a single allocation of 128 bytes (see `Slot::SIZE`).
///
/// The table holds pointers to slots rather than slots: a hash table is between 44% and 88%
/// full, so every byte in a bucket costs up to two and a quarter bytes per key, while a
/// pointer costs eight.
#[derive(Debug)]
struct Slot {
    key: Key,
    /// When the state becomes equivalent to an empty one; the entry may be swept from then on.
    expires_at: Timestamp,
    state: Stored,
}

impl Slot {
    /// What a slot occupies: `Key` 64 + 8 + `Stored` 48 bytes (a bucket records when and under
    /// which limit and period it was written), still one 128-byte malloc chunk with its 8-byte
    /// header.
    #[cfg(test)]
    const SIZE: usize = 120;

    /// The bytes this slot is counted for ([`KEY_BYTES`], a spilled key's buffer, a sliding
    /// log's boxed state and entries): a few reads, no walk.
    fn bytes(&self) -> usize {
        let key = if self.key.spilled() {
            self.key.capacity()
        } else {
            0
        };
        KEY_BYTES + key + self.state.heap_bytes()
    }

    /// What a slot for `charge`'s key is counted for when it is made, before its sliding log
    /// (if any) holds an entry: the estimate a new key is refused by.
    fn new_bytes(charge: &Charge<'_>) -> usize {
        let key = if charge.key.len() > INLINE_KEY {
            charge.key.len()
        } else {
            0
        };
        let log = match charge.params.algorithm() {
            tollgate_core::Algorithm::SlidingWindowLog => std::mem::size_of::<State>(),
            _ => 0,
        };
        KEY_BYTES + key + log
    }

    /// Applies `transition` and renews the expiry from the same state, read once. A sliding
    /// log is changed in place (no allocation once its buffer has grown to its longest length).
    /// A state that had expired at `now` was decided as empty, and is replaced by an empty one
    /// first.
    fn apply(&mut self, transition: Transition, params: &Params, now: Timestamp) {
        if self.expires_at <= now {
            self.state = Stored::from(State::empty(params));
        }
        if let Stored::SlidingWindowLog(state) = &mut self.state {
            state.apply(transition);
            self.expires_at = state.expires_at(params);
            return;
        }
        let mut state = self.state.load().into_owned();
        state.apply(transition);
        self.expires_at = state.expires_at(params);
        self.state = Stored::from(state);
    }
}

/// A [`State`] as the memory store keeps it: the same values without `u128` fields, which
/// would align the whole slot to 16 bytes and make it 16 bytes larger. The sliding log keeps
/// its `State` boxed, so its entries are decided in place and never copied.
#[derive(Debug)]
enum Stored {
    FixedWindow {
        window: u64,
        count: u64,
    },
    SlidingWindowLog(Box<State>),
    SlidingWindowCounter {
        window: u64,
        current: u64,
        previous: u64,
    },
    TokenBucket {
        used_scaled: Halves,
        updated: Timestamp,
        limit: NonZeroU64,
        period: NonZeroU64,
    },
    Gcra {
        tat_scaled: Halves,
        updated: Timestamp,
        limit: NonZeroU64,
        period: NonZeroU64,
    },
    LeakyBucket {
        empty_at_scaled: Halves,
        updated: Timestamp,
        limit: NonZeroU64,
        period: NonZeroU64,
    },
}

/// A `u128` as two `u64`, so it needs only 8-byte alignment.
#[derive(Debug, Clone, Copy)]
struct Halves([u64; 2]);

impl From<u128> for Halves {
    fn from(v: u128) -> Self {
        // Truncation is the point: the high and the low half.
        Halves([(v >> 64) as u64, v as u64])
    }
}

impl From<Halves> for u128 {
    fn from(Halves([high, low]): Halves) -> Self {
        (u128::from(high) << 64) | u128::from(low)
    }
}

impl Stored {
    /// Heap bytes beyond the slot: the sliding log's boxed state and its entries.
    fn heap_bytes(&self) -> usize {
        match self {
            Stored::SlidingWindowLog(state) => std::mem::size_of::<State>() + state.heap_bytes(),
            _ => 0,
        }
    }

    /// The state, borrowed for the sliding log and rebuilt (a few words) for the others.
    fn load(&self) -> Cow<'_, State> {
        Cow::Owned(match *self {
            Stored::SlidingWindowLog(ref state) => return Cow::Borrowed(state),
            Stored::FixedWindow { window, count } => State::FixedWindow { window, count },
            Stored::SlidingWindowCounter {
                window,
                current,
                previous,
            } => State::SlidingWindowCounter {
                window,
                current,
                previous,
            },
            Stored::TokenBucket {
                used_scaled,
                updated,
                limit,
                period,
            } => State::TokenBucket {
                used_scaled: used_scaled.into(),
                updated,
                limit,
                period,
            },
            Stored::Gcra {
                tat_scaled,
                updated,
                limit,
                period,
            } => State::Gcra {
                tat_scaled: tat_scaled.into(),
                updated,
                limit,
                period,
            },
            Stored::LeakyBucket {
                empty_at_scaled,
                updated,
                limit,
                period,
            } => State::LeakyBucket {
                empty_at_scaled: empty_at_scaled.into(),
                updated,
                limit,
                period,
            },
        })
    }
}

impl From<State> for Stored {
    fn from(state: State) -> Self {
        match state {
            State::FixedWindow { window, count } => Stored::FixedWindow { window, count },
            State::SlidingWindowLog { .. } => Stored::SlidingWindowLog(Box::new(state)),
            State::SlidingWindowCounter {
                window,
                current,
                previous,
            } => Stored::SlidingWindowCounter {
                window,
                current,
                previous,
            },
            State::TokenBucket {
                used_scaled,
                updated,
                limit,
                period,
            } => Stored::TokenBucket {
                used_scaled: used_scaled.into(),
                updated,
                limit,
                period,
            },
            State::Gcra {
                tat_scaled,
                updated,
                limit,
                period,
            } => Stored::Gcra {
                tat_scaled: tat_scaled.into(),
                updated,
                limit,
                period,
            },
            State::LeakyBucket {
                empty_at_scaled,
                updated,
                limit,
                period,
            } => Stored::LeakyBucket {
                empty_at_scaled: empty_at_scaled.into(),
                updated,
                limit,
                period,
            },
        }
    }
}

type Shard = HashTable<Box<Slot>>;

/// In-process store; the default when no external store is configured.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
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
            hasher: RandomState::new(),
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
    fn refusal(&self, new_keys: usize, new_bytes: impl FnOnce() -> usize) -> Option<String> {
        if self.len().saturating_add(new_keys) > self.max_keys {
            return Some(format!(
                "the memory store holds its most keys ({}, --memory-max-keys): a limit on a new key takes its failure posture until keys expire",
                self.max_keys
            ));
        }
        let max = self.max_bytes?;
        let held = self.bytes.load(Ordering::Relaxed);
        (held.saturating_add(new_bytes()) > max).then(|| {
            format!(
                "the memory store holds its most bytes ({held} of {max}, --memory-max-bytes): a limit on a new key takes its failure posture until keys expire"
            )
        })
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
        // (tag) of the same keyed SipHash, so the shard takes bits from the middle.
        ((hash >> 32) as usize) & (SHARDS - 1)
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

    /// Decides `charges` into `decisions` (empty) and, when `commit` and the request is
    /// admitted, commits them. Up to [`INLINE_CHARGES`] charges on existing keys, nothing is
    /// allocated.
    ///
    /// A commit that needs more keys or bytes than the store may hold
    /// ([`MemoryStore::with_max_keys`], [`MemoryStore::with_max_bytes`]) changes nothing and
    /// answers [`StoreError::NotCalled`], `decisions` filled as for a look.
    pub(crate) fn decide(
        &self,
        charges: &[Charge<'_>],
        commit: bool,
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        self.decide_unless(false, charges, commit, decisions)
    }

    /// [`MemoryStore::decide`] for a request a limit outside `charges` denies: nothing is
    /// committed, and the allowed charges answer as they stand, as in a request one of them
    /// denies.
    pub(crate) fn decide_denied(&self, charges: &[Charge<'_>], decisions: &mut Decisions) {
        // Nothing is committed, so no key is added: never full.
        let _looked = self.decide_unless(true, charges, false, decisions);
    }

    fn decide_unless(
        &self,
        denied: bool,
        charges: &[Charge<'_>],
        commit: bool,
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        if let [charge] = charges {
            return self.decide_one(denied, charge, commit, decisions);
        }
        let now = self.clock.now();
        let hashes: SmallVec<[u64; INLINE_CHARGES]> =
            charges.iter().map(|c| self.hash(c.key)).collect();
        let mut shard_ids: SmallVec<[usize; INLINE_CHARGES]> =
            hashes.iter().map(|&h| Self::shard_of(h)).collect();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; INLINE_CHARGES]> =
            order.iter().map(|&i| self.shards[i].lock()).collect();
        let guard_index = |shard: usize| order.binary_search(&shard).unwrap_or(0);
        for id in shard_ids.iter_mut() {
            *id = guard_index(*id);
        }

        let mut transitions: SmallVec<[Transition; INLINE_CHARGES]> = SmallVec::new();
        // Per charge, whether the store holds its key.
        let mut held_keys: SmallVec<[bool; INLINE_CHARGES]> = SmallVec::new();
        for (i, charge) in charges.iter().enumerate() {
            let held = held_slot(&guards[shard_ids[i]], hashes[i], charge);
            held_keys.push(held.is_some());
            let repeated = charges[..i].iter().any(|c| c.key == charge.key);
            let stored = state_of(held, charge, now);
            let (decision, transition) = if repeated {
                // The same counter twice in one request: decide against the state the earlier
                // charges of this request leave behind.
                let mut scratch = stored.into_owned();
                // What the earlier ones that were denied would have taken: nothing was applied
                // for them, but the request fits only once they fit too.
                let mut denied_before = 0u64;
                for ((prev, t), d) in charges[..i].iter().zip(&transitions).zip(&decisions[..]) {
                    if prev.key == charge.key {
                        scratch.apply(Transition::clone(t));
                        if d.verdict == Verdict::Denied && !prev.params.charges_up_to_limit() {
                            denied_before = denied_before.saturating_add(prev.cost);
                        }
                    }
                }
                let (mut decision, transition) = decide_charge(charge, &scratch, now);
                if decision.verdict == Verdict::Denied
                    && denied_before > 0
                    && charge.cost > 0
                    && !charge.params.charges_up_to_limit()
                {
                    // Its retry is the wait for all of them, as a client retrying the whole
                    // request needs (the script's decide.lua does the same).
                    let together = denied_before.saturating_add(charge.cost);
                    let (whole, _) = decide_or_check(charge.params, &scratch, now, together);
                    if whole.retry_after > decision.retry_after {
                        decision.retry_after = whole.retry_after;
                    }
                }
                (decision, transition)
            } else {
                decide_charge(charge, &stored, now)
            };
            decisions.push(decision);
            transitions.push(transition);
        }

        if denied || !admitted(charges, decisions) {
            // Nothing is charged: a limit that allowed its charge answers with its figures as
            // they stand, not as after a charge that is never made.
            for (i, charge) in charges.iter().enumerate() {
                if decisions[i].is_allowed() && transitions[i] != Transition::Keep {
                    let stored = stored_state(&guards[shard_ids[i]], hashes[i], charge, now);
                    decisions[i] = as_is(charge.params, &stored, now);
                }
            }
            return Ok(());
        }
        // A charge that needs a key the store does not hold yet: one that changes its counter
        // (not a check), the first such on its key.
        let needs_key = |i: usize| {
            !held_keys[i]
                && transitions[i] != Transition::Keep
                && !(0..i)
                    .any(|j| charges[j].key == charges[i].key && transitions[j] != Transition::Keep)
        };
        let new_keys = (0..charges.len()).filter(|&i| needs_key(i)).count();
        let new_bytes = || {
            let new = (0..charges.len()).filter(|&i| needs_key(i));
            new.map(|i| Slot::new_bytes(&charges[i])).sum()
        };
        if commit
            && new_keys > 0
            && let Some(why) = self.refusal(new_keys, new_bytes)
        {
            // The limits on held keys are decided as usual (their figures as they stand: the
            // limiter charges them once the postures have answered for the others).
            let decided = (0..charges.len())
                .map(|i| {
                    let on_new_key = !held_keys[i] && transitions[i] != Transition::Keep;
                    (!on_new_key).then(|| {
                        if decisions[i].is_allowed() && transitions[i] != Transition::Keep {
                            let stored =
                                stored_state(&guards[shard_ids[i]], hashes[i], &charges[i], now);
                            as_is(charges[i].params, &stored, now)
                        } else {
                            decisions[i]
                        }
                    })
                })
                .collect();
            return Err(StoreError::Partly {
                decided,
                cause: Box::new(StoreError::NotCalled(why)),
                deadline: tokio::time::Instant::now(),
            });
        }
        if commit {
            let at = (&shard_ids[..], &hashes[..], now);
            self.commit(&mut guards, at, charges, transitions);
        }
        Ok(())
    }

    /// Commits the admitted `transitions` of `charges` into the shards `guards` holds
    /// (`shard_ids` index it, `hashes` are the keys' hashes), counting their bytes when the
    /// bound is set.
    fn commit(
        &self,
        guards: &mut [MutexGuard<'_, Shard>],
        (shard_ids, hashes, now): (&[usize], &[u64], Timestamp),
        charges: &[Charge<'_>],
        transitions: SmallVec<[Transition; INLINE_CHARGES]>,
    ) {
        for (i, (charge, transition)) in charges.iter().zip(transitions).enumerate() {
            if transition == Transition::Keep {
                continue;
            }
            let table = &mut guards[shard_ids[i]];
            let hash = hashes[i];
            if let Some(slot) = table.find_mut(hash, |slot| *slot.key == *charge.key) {
                self.apply_held(slot, transition, charge, now);
                continue;
            }
            self.insert_new(table, hash, charge, transition);
        }
    }

    /// [`MemoryStore::decide_unless`] for a request of one charge, the common case, decided
    /// as the general path decides it: one hash, one lock, one probe, and no per-charge
    /// buffers (which cost about as much as the decision).
    fn decide_one(
        &self,
        denied: bool,
        charge: &Charge<'_>,
        commit: bool,
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let hash = self.hash(charge.key);
        let mut table = self.shards[Self::shard_of(hash)].lock();
        let held = table.find_mut(hash, |slot| *slot.key == *charge.key);
        let at = decisions.len();
        let transition = {
            let stored = state_of(held.as_deref().map(|slot| &**slot), charge, now);
            let (decision, transition) = decide_charge(charge, &stored, now);
            decisions.push(decision);
            let one = std::slice::from_ref(charge);
            if denied || !admitted(one, &decisions[at..]) {
                // Nothing is charged: an allowed charge answers with its figures as they stand.
                if decision.is_allowed() && transition != Transition::Keep {
                    decisions[at] = as_is(charge.params, &stored, now);
                }
                return Ok(());
            }
            transition
        };
        if !commit || transition == Transition::Keep {
            return Ok(());
        }
        if let Some(slot) = held {
            self.apply_held(slot, transition, charge, now);
            return Ok(());
        }
        if let Some(why) = self.refusal(1, || Slot::new_bytes(charge)) {
            return Err(StoreError::Partly {
                decided: vec![None],
                cause: Box::new(StoreError::NotCalled(why)),
                deadline: tokio::time::Instant::now(),
            });
        }
        self.insert_new(&mut table, hash, charge, transition);
        Ok(())
    }

    /// Applies `transition` to a held `slot`, counting its change of bytes when the bound is
    /// set.
    fn apply_held(
        &self,
        slot: &mut Slot,
        transition: Transition,
        charge: &Charge<'_>,
        now: Timestamp,
    ) {
        let counts_bytes = self.max_bytes.is_some();
        let before = if counts_bytes { slot.bytes() } else { 0 };
        slot.apply(transition, charge.params, now);
        if counts_bytes {
            self.resized(before, slot.bytes());
        }
    }

    /// Stores `charge`'s key, new to `table`, with `transition` applied, and counts it.
    fn insert_new(
        &self,
        table: &mut Shard,
        hash: u64,
        charge: &Charge<'_>,
        transition: Transition,
    ) {
        let mut state = State::empty(charge.params);
        state.apply(transition);
        let slot = Slot {
            key: Key::from_slice(charge.key),
            expires_at: state.expires_at(charge.params),
            state: Stored::from(state),
        };
        if self.max_bytes.is_some() {
            self.bytes.fetch_add(slot.bytes(), Ordering::Relaxed);
        }
        table.insert_unique(hash, Box::new(slot), |slot| self.hash(&slot.key));
        self.entries.fetch_add(1, Ordering::Relaxed);
    }
}

/// `charge` decided on `state`: a check (cost 0) as [`Charge::checks_as_is`] says, charging
/// nothing; any other cost as [`decide_or_check`] decides it.
fn decide_charge(charge: &Charge<'_>, state: &State, now: Timestamp) -> (Decision, Transition) {
    if charge.cost == 0 && charge.checks_as_is {
        return (check_as_is(charge.params, state, now), Transition::Keep);
    }
    decide_or_check(charge.params, state, now, charge.cost)
}

/// The state `table` holds for `charge`'s key (`hash`), or an empty one.
fn stored_state<'a>(
    table: &'a Shard,
    hash: u64,
    charge: &Charge<'_>,
    now: Timestamp,
) -> Cow<'a, State> {
    state_of(held_slot(table, hash, charge), charge, now)
}

/// The slot `table` holds for `charge`'s key (`hash`).
fn held_slot<'a>(table: &'a Shard, hash: u64, charge: &Charge<'_>) -> Option<&'a Slot> {
    table
        .find(hash, |slot| *slot.key == *charge.key)
        .map(|slot| &**slot)
}

/// The state of `held`, or an empty one for `charge`'s limit: also when it has expired at
/// `now` (its expiry computed from the params it was written with), as a Redis TTL drops it.
/// Under those params an expired state decides like an empty one anyway; under others (a
/// window or log whose period was lengthened since) this is what makes both stores forget it at
/// the same instant.
fn state_of<'a>(held: Option<&'a Slot>, charge: &Charge<'_>, now: Timestamp) -> Cow<'a, State> {
    match held {
        Some(slot) if slot.expires_at > now => slot.state.load(),
        _ => Cow::Owned(State::empty(charge.params)),
    }
}

impl Store for MemoryStore {
    async fn decide(
        &self,
        charges: &[Charge<'_>],
        mode: Mode,
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        decisions.clear();
        MemoryStore::decide(self, charges, mode.applies(), decisions)
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

    use tollgate_core::{Algorithm, decide};

    use super::*;

    #[test]
    fn a_slot_fits_a_128_byte_allocation() {
        assert_eq!(std::mem::size_of::<Slot>(), Slot::SIZE);
    }

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

    #[test]
    fn every_state_is_kept_as_it_was_given() {
        let now = Timestamp::from_micros(1_700_000_000_123_456);
        for algorithm in Algorithm::ALL {
            let params = Params::new(algorithm, 7, Duration::from_secs(3), None).unwrap();
            let mut state = State::empty(&params);
            for step in 0..3 {
                let at = now.saturating_add(Duration::from_millis(step * 100));
                let (_, transition) = decide(&params, &state, at, 2);
                state.apply(transition);
                let stored = Stored::from(state.clone());
                assert_eq!(*stored.load(), state, "{algorithm}");
            }
        }
        let wide = State::Gcra {
            tat_scaled: u128::MAX - 5,
            updated: Timestamp::MAX,
            limit: NonZeroU64::MIN,
            period: NonZeroU64::MAX,
        };
        assert_eq!(*Stored::from(wide.clone()).load(), wide);
    }
}
