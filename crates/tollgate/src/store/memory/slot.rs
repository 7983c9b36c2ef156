//! How the memory store holds one key: its slot (the key, its expiry and its state in one
//! 128-byte allocation) and the state kept without `u128` fields, with the instant it was made.

use std::borrow::Cow;
use std::num::NonZeroU64;

use smallvec::SmallVec;
use tollgate_core::{Params, State, Timestamp, Transition};

use crate::store::Charge;

/// A counter key, inline up to 56 bytes (a rule key with a UUID-sized value spills to the heap).
pub(super) type Key = SmallVec<[u8; 56]>;

/// The bytes a key is counted for by [`MemoryStore::with_max_bytes`] besides its spilled key
/// and its sliding log: its slot's 128-byte allocation, and the pointer and control byte the
/// table holds for it (9 bytes a bucket, 10 to 20 a key at the table's 44% to 88% load).
///
/// [`MemoryStore::with_max_bytes`]: super::MemoryStore::with_max_bytes
pub const KEY_BYTES: usize = 128 + 16;

/// Bytes a key holds inline in its slot; a longer one takes a heap buffer of its own.
const INLINE_KEY: usize = 56;

/// One key and its state, in a single allocation of 128 bytes (see `Slot::SIZE`).
///
/// The table holds pointers to slots rather than slots: a hash table is between 44% and 88%
/// full, so every byte in a bucket costs up to two and a quarter bytes per key, while a
/// pointer costs eight.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) key: Key,
    /// When the state becomes equivalent to an empty one; the entry may be swept from then on.
    pub(super) expires_at: Timestamp,
    pub(super) state: Stored,
}

impl Slot {
    /// What a slot occupies: `Key` 64 + 8 + `Stored` 48 bytes (a bucket records when and under
    /// which limit and period it was written; [`Born`] fills the bytes beside the tag), still
    /// one 128-byte malloc chunk with its 8-byte header.
    #[cfg(test)]
    const SIZE: usize = 120;

    /// The bytes this slot is counted for ([`KEY_BYTES`], a spilled key's buffer, a sliding
    /// log's boxed state and entries): a few reads, no walk.
    pub(super) fn bytes(&self) -> usize {
        let key = if self.key.spilled() {
            self.key.capacity()
        } else {
            0
        };
        KEY_BYTES + key + self.state.heap_bytes()
    }

    /// What a slot for `charge`'s key is counted for when it is made, before its sliding log
    /// (if any) holds an entry: the estimate a new key is refused by.
    pub(super) fn new_bytes(charge: &Charge<'_>) -> usize {
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
    /// made at `now` first (as Redis makes a new key once a TTL dropped the old one). A log
    /// that a state of another algorithm replaces (a reload changed the rule's algorithm) is
    /// stored as that state, made at `now`.
    pub(super) fn apply(&mut self, transition: Transition, params: &Params, now: Timestamp) {
        match transition {
            // The common charge: a state that replaces one that is not a log. Neither the state
            // it replaces nor an empty one needs building: only the birth is kept, if current.
            Transition::Set(state) if !matches!(self.state, Stored::SlidingWindowLog(_)) => {
                let born = match self.state.born() {
                    Some(born) if self.expires_at > now => born,
                    _ => now,
                };
                self.expires_at = state.expires_at(params);
                self.state = Stored::new(state, born);
            }
            transition => self.apply_slow(transition, params, now),
        }
    }

    /// [`Slot::apply`] for a log, or for a transition that changes one.
    fn apply_slow(&mut self, transition: Transition, params: &Params, now: Timestamp) {
        if self.expires_at <= now {
            self.state = Stored::new(State::empty(params), now);
        }
        if let Stored::SlidingWindowLog(state) = &mut self.state {
            state.apply(transition);
            self.expires_at = state.expires_at(params);
            if !matches!(**state, State::SlidingWindowLog { .. }) {
                self.state = Stored::new((**state).clone(), now);
            }
            return;
        }
        let born = self.state.born().unwrap_or(now);
        let mut state = self.state.load().into_owned();
        state.apply(transition);
        self.expires_at = state.expires_at(params);
        self.state = Stored::new(state, born);
    }
}

/// When a state was made, in µs, in the 7 bytes the tag of [`Stored`] leaves free beside it: a
/// give-back leaves a state made after its charge alone (the counter charged expired, and this
/// one was made since). Instants from 2^56 µs on (the year 4253) read as 2^56 - 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Born([u8; 7]);

impl From<Timestamp> for Born {
    fn from(at: Timestamp) -> Self {
        let micros = at.as_micros().min((1 << 56) - 1).to_le_bytes();
        let mut bytes = [0; 7];
        bytes.copy_from_slice(&micros[..7]);
        Born(bytes)
    }
}

impl From<Born> for Timestamp {
    fn from(Born(bytes): Born) -> Self {
        let mut micros = [0; 8];
        micros[..7].copy_from_slice(&bytes);
        Timestamp::from_micros(u64::from_le_bytes(micros))
    }
}

/// A [`State`] as the memory store keeps it: the same values without `u128` fields, which
/// would align the whole slot to 16 bytes and make it 16 bytes larger, and when it was made
/// ([`Born`]). The sliding log keeps its `State` boxed, so its entries are decided in place and
/// never copied; it needs no birth, as its entries carry their instants (a give-back finds none
/// at the charge's instant in a log made since), as the Redis store's sorted sets do.
#[derive(Debug)]
pub(super) enum Stored {
    FixedWindow {
        window: u64,
        count: u64,
        born: Born,
    },
    SlidingWindowLog(Box<State>),
    SlidingWindowCounter {
        window: u64,
        current: u64,
        previous: u64,
        born: Born,
    },
    TokenBucket {
        used_scaled: Halves,
        updated: Timestamp,
        limit: NonZeroU64,
        period: NonZeroU64,
        born: Born,
    },
    Gcra {
        tat_scaled: Halves,
        updated: Timestamp,
        limit: NonZeroU64,
        period: NonZeroU64,
        born: Born,
    },
    LeakyBucket {
        empty_at_scaled: Halves,
        updated: Timestamp,
        limit: NonZeroU64,
        period: NonZeroU64,
        born: Born,
    },
}

/// A `u128` as two `u64`, so it needs only 8-byte alignment.
#[derive(Debug, Clone, Copy)]
pub(super) struct Halves([u64; 2]);

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
    pub(super) fn load(&self) -> Cow<'_, State> {
        Cow::Owned(match *self {
            Stored::SlidingWindowLog(ref state) => return Cow::Borrowed(state),
            Stored::FixedWindow { window, count, .. } => State::FixedWindow { window, count },
            Stored::SlidingWindowCounter {
                window,
                current,
                previous,
                ..
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
                ..
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
                ..
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
                ..
            } => State::LeakyBucket {
                empty_at_scaled: empty_at_scaled.into(),
                updated,
                limit,
                period,
            },
        })
    }
}

impl Stored {
    /// `state`, kept as made at `born` (a sliding log keeps no birth).
    pub(super) fn new(state: State, born: Timestamp) -> Self {
        let born = Born::from(born);
        match state {
            State::FixedWindow { window, count } => Stored::FixedWindow {
                window,
                count,
                born,
            },
            State::SlidingWindowLog { .. } => Stored::SlidingWindowLog(Box::new(state)),
            State::SlidingWindowCounter {
                window,
                current,
                previous,
            } => Stored::SlidingWindowCounter {
                window,
                current,
                previous,
                born,
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
                born,
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
                born,
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
                born,
            },
        }
    }

    /// When the state was made; `None` for a sliding log, which keeps no birth.
    pub(super) fn born(&self) -> Option<Timestamp> {
        match *self {
            Stored::SlidingWindowLog(_) => None,
            Stored::FixedWindow { born, .. }
            | Stored::SlidingWindowCounter { born, .. }
            | Stored::TokenBucket { born, .. }
            | Stored::Gcra { born, .. }
            | Stored::LeakyBucket { born, .. } => Some(born.into()),
        }
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
                let stored = Stored::new(state.clone(), now);
                assert_eq!(*stored.load(), state, "{algorithm}");
                let born = (algorithm != Algorithm::SlidingWindowLog).then_some(now);
                assert_eq!(stored.born(), born, "{algorithm}");
            }
        }
        let wide = State::Gcra {
            tat_scaled: u128::MAX - 5,
            updated: Timestamp::MAX,
            limit: NonZeroU64::MIN,
            period: NonZeroU64::MAX,
        };
        let stored = Stored::new(wide.clone(), Timestamp::MAX);
        assert_eq!(*stored.load(), wide);
        let latest = Timestamp::from_micros((1 << 56) - 1);
        assert_eq!(stored.born(), Some(latest), "the latest birth kept");
    }

    /// A slot of `params`' algorithm made at `at`, holding nothing yet.
    fn empty_slot(params: &Params, at: Timestamp) -> Slot {
        Slot {
            key: Key::from_slice(b"k"),
            expires_at: Timestamp::EPOCH,
            state: Stored::new(State::empty(params), at),
        }
    }

    #[test]
    fn a_charge_keeps_the_birth_while_current_and_its_own_once_expired() {
        let start = Timestamp::from_micros(1_700_000_000_000_000);
        let at = |ms| start.saturating_add(Duration::from_millis(ms));
        for algorithm in Algorithm::ALL {
            let params = Params::new(algorithm, 5, Duration::from_secs(1), None).unwrap();
            // The fast path and the general one, charged alike: both agree at every step, on
            // the state, the expiry and the birth.
            let (mut fast, mut slow) = (empty_slot(&params, at(0)), empty_slot(&params, at(0)));
            // Charges 0.3 s apart, then one after a pause that lets the state expire.
            for ms in [0, 300, 600, 5_000, 5_300] {
                let (_, transition) = decide(&params, &fast.state.load(), at(ms), 2);
                fast.apply(transition.clone(), &params, at(ms));
                slow.apply_slow(transition, &params, at(ms));
                assert_eq!(
                    *fast.state.load(),
                    *slow.state.load(),
                    "{algorithm} at {ms}"
                );
                assert_eq!(fast.expires_at, slow.expires_at, "{algorithm} at {ms}");
                assert_eq!(fast.state.born(), slow.state.born(), "{algorithm} at {ms}");
            }
            if algorithm != Algorithm::SlidingWindowLog {
                // Born with its first charge; made again by the one after the pause.
                assert_eq!(fast.state.born(), Some(at(5_000)), "{algorithm}");
            }
        }
    }
}
