//! How the memory store decides a request: the shards of its keys locked in ascending order,
//! every charge decided, and the transitions committed only if the request is admitted (and
//! the store has room for its new keys).

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;
use smallvec::SmallVec;
use tollgate_core::{
    Decision, State, Timestamp, Transition, Verdict, as_is, check_as_is, decide_or_check,
};

use super::slot::{Key, Slot, Stored};
use super::{MemoryStore, Shard};
use crate::store::{Charge, Decisions, INLINE_CHARGES, StoreError, admitted};

impl MemoryStore {
    /// Decides `charges` into `decisions` (empty) and, when `commit` and the request is
    /// admitted, commits them. Up to [`INLINE_CHARGES`] charges on existing keys, nothing is
    /// allocated.
    ///
    /// A commit that needs more keys or bytes than the store may hold
    /// ([`MemoryStore::with_max_keys`], [`MemoryStore::with_max_bytes`]) changes nothing and
    /// answers [`StoreError::Partly`] (for [`StoreError::NotCalled`]), `decisions` filled as
    /// for a look.
    ///
    /// [`crate::store::Store::decide`] without a future to await: a request of one charge
    /// takes a path of its own, which must answer exactly as this one does for several
    /// (public so that a test can hold the two equal).
    pub fn decide(
        &self,
        charges: &[Charge<'_>],
        commit: bool,
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        self.decide_at(self.clock.now(), charges, commit, decisions)
    }

    /// [`MemoryStore::decide`] at `now`, the caller's reading of the store's clock: a decision
    /// that has just read it for itself (to answer with a reset time) spares the store a second
    /// read, which costs more than the hash probe on a virtual machine.
    pub fn decide_at(
        &self,
        now: Timestamp,
        charges: &[Charge<'_>],
        commit: bool,
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        self.decide_unless(false, now, charges, commit, decisions)
    }

    /// [`MemoryStore::decide_at`] for a request of one charge: its decision, with no buffer.
    pub fn decide_one_at(
        &self,
        now: Timestamp,
        charge: &Charge<'_>,
        commit: bool,
    ) -> Result<Decision, StoreError> {
        let (decision, refused) = self.decide_one(false, now, charge, commit);
        refused.map(|()| decision)
    }

    /// [`MemoryStore::decide`] for a request a limit outside `charges` denies: nothing is
    /// committed, and the allowed charges answer as they stand, as in a request one of them
    /// denies.
    pub fn decide_denied(&self, charges: &[Charge<'_>], decisions: &mut Decisions) {
        // Nothing is committed, so no key is added: never full.
        let _looked = self.decide_unless(true, self.clock.now(), charges, false, decisions);
    }

    fn decide_unless(
        &self,
        denied: bool,
        now: Timestamp,
        charges: &[Charge<'_>],
        commit: bool,
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        if let [charge] = charges {
            let (decision, refused) = self.decide_one(denied, now, charge, commit);
            decisions.push(decision);
            return refused;
        }
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
            self.insert_new(table, hash, charge, transition, now);
        }
    }

    /// [`MemoryStore::decide_unless`] for a request of one charge, the common case, decided
    /// as the general path decides it: one hash, one lock, one probe, and no per-charge
    /// buffers (which cost about as much as the decision). Returns its decision, and whether
    /// the store refused its new key.
    fn decide_one(
        &self,
        denied: bool,
        now: Timestamp,
        charge: &Charge<'_>,
        commit: bool,
    ) -> (Decision, Result<(), StoreError>) {
        let hash = self.hash(charge.key);
        let mut table = self.shards[Self::shard_of(hash)].lock();
        let held = table.find_mut(hash, |slot| *slot.key == *charge.key);
        let (decision, transition) = {
            let stored = state_of(held.as_deref().map(|slot| &**slot), charge, now);
            let (decision, transition) = decide_charge(charge, &stored, now);
            let one = std::slice::from_ref(charge);
            if denied || !admitted(one, std::slice::from_ref(&decision)) {
                // Nothing is charged: an allowed charge answers with its figures as they stand.
                if decision.is_allowed() && transition != Transition::Keep {
                    return (as_is(charge.params, &stored, now), Ok(()));
                }
                return (decision, Ok(()));
            }
            (decision, transition)
        };
        if !commit || transition == Transition::Keep {
            return (decision, Ok(()));
        }
        if let Some(slot) = held {
            self.apply_held(slot, transition, charge, now);
            return (decision, Ok(()));
        }
        if let Some(why) = self.refusal(1, || Slot::new_bytes(charge)) {
            let refused = StoreError::Partly {
                decided: vec![None],
                cause: Box::new(StoreError::NotCalled(why)),
                deadline: tokio::time::Instant::now(),
            };
            return (decision, Err(refused));
        }
        self.insert_new(&mut table, hash, charge, transition, now);
        (decision, Ok(()))
    }

    /// Applies `transition` to a held `slot`, counting its change of bytes when the bound is
    /// set.
    pub(super) fn apply_held(
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

    /// Stores `charge`'s key, new to `table`, with `transition` applied at `now`, and counts
    /// it.
    fn insert_new(
        &self,
        table: &mut Shard,
        hash: u64,
        charge: &Charge<'_>,
        transition: Transition,
        now: Timestamp,
    ) {
        let mut state = State::empty(charge.params);
        state.apply(transition);
        let slot = Slot {
            key: Key::from_slice(charge.key),
            expires_at: state.expires_at(charge.params),
            state: Stored::new(state, now),
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
