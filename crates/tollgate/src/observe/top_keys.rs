//! The heaviest keys of an unbounded stream, in bounded memory (the Space-Saving algorithm).
//!
//! Built for "which clients are throttled most by this rule": record each denied key, and read
//! the top of the table on the debug or admin path. The client key never becomes a metric label;
//! it lives only in this fixed-size table.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;

use parking_lot::Mutex;

/// Longest key kept, in bytes. Longer keys are cut at the last char boundary at or below it, so
/// keys that share their first bytes are counted as one.
pub const MAX_KEY_BYTES: usize = 128;

/// Most entries a table may hold; larger capacities are lowered to this.
pub const MAX_CAPACITY: usize = 1 << 16;

/// Marks a free position in the open-addressing index.
const EMPTY: usize = usize::MAX;

/// A bounded heavy-hitters sketch: the approximate top keys of a weighted stream.
///
/// Holds at most `capacity` keys however many distinct keys arrive. While at most `capacity`
/// distinct keys have been seen, every count is exact. Past that, a new key replaces the key
/// with the smallest count and inherits that count as its `error` (Space-Saving, Metwally et
/// al., 2005). With `total` the sum of all recorded weights, this guarantees:
///
/// * every key whose true count exceeds `total / capacity` is in the table;
/// * for every key in the table, `count - error <= true count <= count`, and
///   `error <= total / capacity`.
///
/// Recording takes a short lock (hash, probe, sift in a heap of `capacity` entries); it
/// allocates only when a key enters the table. Keys are hashed with a randomly keyed SipHash, so
/// clients cannot choose keys that collide.
///
/// ```
/// use tollgate::observe::TopKeys;
///
/// let top = TopKeys::new(2);
/// top.record("alice", 5);
/// top.record("bob", 1);
/// top.record("carol", 1); // evicts bob, inherits his count as error
/// let entries = top.top(1);
/// assert_eq!(entries[0].key, "alice");
/// assert_eq!(entries[0].count, 5);
/// assert_eq!(entries[0].error, 0);
/// ```
pub struct TopKeys {
    capacity: usize,
    hasher: RandomState,
    table: Mutex<Table>,
}

/// One key of [`TopKeys::top`] with its estimated count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopEntry {
    /// The key, cut to at most [`MAX_KEY_BYTES`] bytes.
    pub key: String,
    /// Estimated total weight of the key: never below the true total.
    pub count: u64,
    /// Most by which `count` may overestimate: `count - error` is a guaranteed lower bound.
    pub error: u64,
}

impl TopKeys {
    /// An empty table holding at most `capacity` keys (at least 1, at most [`MAX_CAPACITY`]).
    ///
    /// All memory except the keys themselves is allocated here.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, MAX_CAPACITY);
        TopKeys {
            capacity,
            hasher: RandomState::new(),
            table: Mutex::new(Table::with_capacity(capacity)),
        }
    }

    /// Adds `weight` to `key`, cutting the key to [`MAX_KEY_BYTES`]. A zero weight is ignored.
    pub fn record(&self, key: &str, weight: u64) {
        if weight == 0 {
            return;
        }
        let key = truncate_key(key);
        let hash = self.hasher.hash_one(key);
        self.table.lock().record(key, hash, weight, self.capacity);
    }

    /// The `n` heaviest keys, by count descending, then key ascending.
    pub fn top(&self, n: usize) -> Vec<TopEntry> {
        let table = self.table.lock();
        let mut slots: Vec<&Slot> = table.slots.iter().collect();
        let order = |a: &&Slot, b: &&Slot| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key));
        if n < slots.len() {
            slots.select_nth_unstable_by(n, order);
            slots.truncate(n);
        }
        slots.sort_unstable_by(order);
        slots
            .into_iter()
            .map(|slot| TopEntry {
                key: slot.key.to_string(),
                count: slot.count,
                error: slot.error,
            })
            .collect()
    }

    /// Forgets every key and the running total; keeps the allocated table.
    pub fn clear(&self) {
        self.table.lock().clear();
    }

    /// How many keys the table holds now; never more than [`TopKeys::capacity`].
    pub fn len(&self) -> usize {
        self.table.lock().slots.len()
    }

    /// Whether no key has been recorded since creation or the last [`TopKeys::clear`].
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most keys the table holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sum of all weights recorded since creation or the last [`TopKeys::clear`] (saturating).
    pub fn total(&self) -> u64 {
        self.table.lock().total
    }
}

impl fmt::Debug for TopKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = self.table.lock();
        f.debug_struct("TopKeys")
            .field("capacity", &self.capacity)
            .field("len", &table.slots.len())
            .field("total", &table.total)
            .finish_non_exhaustive()
    }
}

/// Cuts `key` to at most [`MAX_KEY_BYTES`] bytes at a char boundary.
fn truncate_key(key: &str) -> &str {
    if key.len() <= MAX_KEY_BYTES {
        return key;
    }
    let mut end = MAX_KEY_BYTES;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    key.get(..end).unwrap_or_default()
}

/// A monitored key. Slots never move once created, so their ids are stable.
struct Slot {
    key: Box<str>,
    hash: u64,
    count: u64,
    error: u64,
    /// Position of this slot's id in `Table::heap`.
    heap_pos: usize,
}

/// The state behind the lock: slots, a min-heap over them by count, and a hash index.
///
/// The index is a hand-rolled linear-probing table of slot ids (rather than a `HashMap`) so each
/// key is stored once, and nothing reallocates after construction.
struct Table {
    slots: Vec<Slot>,
    /// Slot ids ordered as a binary min-heap on `count`; the root is the next to be replaced.
    heap: Vec<usize>,
    /// Slot id or [`EMPTY`]; the length is a power of two at least twice the capacity, so a
    /// probe always reaches an empty position.
    index: Box<[usize]>,
    mask: usize,
    total: u64,
}

impl Table {
    fn with_capacity(capacity: usize) -> Self {
        let index_len = (capacity * 2).next_power_of_two();
        Table {
            slots: Vec::with_capacity(capacity),
            heap: Vec::with_capacity(capacity),
            index: vec![EMPTY; index_len].into_boxed_slice(),
            mask: index_len - 1,
            total: 0,
        }
    }

    fn record(&mut self, key: &str, hash: u64, weight: u64, capacity: usize) {
        self.total = self.total.saturating_add(weight);
        if let Some(id) = self.find(key, hash) {
            let slot = &mut self.slots[id];
            slot.count = slot.count.saturating_add(weight);
            let pos = slot.heap_pos;
            self.sift_down(pos);
        } else if self.slots.len() < capacity {
            let id = self.slots.len();
            let pos = self.heap.len();
            self.slots.push(Slot {
                key: key.into(),
                hash,
                count: weight,
                error: 0,
                heap_pos: pos,
            });
            self.heap.push(id);
            self.insert_index(id, hash);
            self.sift_up(pos);
        } else if let Some(&id) = self.heap.first() {
            // Replace the least-counted key; the newcomer may have been that one all along.
            self.remove_index(id);
            let slot = &mut self.slots[id];
            let floor = slot.count;
            slot.key = key.into();
            slot.hash = hash;
            slot.count = floor.saturating_add(weight);
            slot.error = floor;
            self.insert_index(id, hash);
            self.sift_down(0);
        }
    }

    fn clear(&mut self) {
        self.slots.clear();
        self.heap.clear();
        self.index.fill(EMPTY);
        self.total = 0;
    }

    fn home(&self, hash: u64) -> usize {
        // Truncation on 32-bit targets keeps the low bits, which is all the mask wants.
        hash as usize & self.mask
    }

    // Probes below stop after one lap of the index. The index is at most half full, so they
    // always meet an empty position first; the bound only keeps a broken invariant from
    // spinning forever under the lock.

    fn find(&self, key: &str, hash: u64) -> Option<usize> {
        let mut pos = self.home(hash);
        for _ in 0..self.index.len() {
            let id = self.index[pos];
            if id == EMPTY {
                return None;
            }
            let slot = &self.slots[id];
            if slot.hash == hash && *slot.key == *key {
                return Some(id);
            }
            pos = (pos + 1) & self.mask;
        }
        None
    }

    fn insert_index(&mut self, id: usize, hash: u64) {
        let mut pos = self.home(hash);
        for _ in 0..self.index.len() {
            if self.index[pos] == EMPTY {
                self.index[pos] = id;
                return;
            }
            pos = (pos + 1) & self.mask;
        }
    }

    /// Where slot `id` sits in the index.
    fn index_position(&self, id: usize) -> Option<usize> {
        let mut pos = self.home(self.slots[id].hash);
        for _ in 0..self.index.len() {
            match self.index[pos] {
                found if found == id => return Some(pos),
                EMPTY => return None,
                _ => pos = (pos + 1) & self.mask,
            }
        }
        None
    }

    /// Removes slot `id` from the index by backward-shift deletion (no tombstones, so probes
    /// stay short however many keys pass through).
    fn remove_index(&mut self, id: usize) {
        let Some(mut hole) = self.index_position(id) else {
            return;
        };
        let mut next = hole;
        for _ in 1..self.index.len() {
            next = (next + 1) & self.mask;
            let moved = self.index[next];
            if moved == EMPTY {
                break;
            }
            let home = self.home(self.slots[moved].hash);
            // `moved` may fill the hole only if the hole lies on its probe path home..=next.
            if next.wrapping_sub(home) & self.mask >= next.wrapping_sub(hole) & self.mask {
                self.index[hole] = moved;
                hole = next;
            }
        }
        self.index[hole] = EMPTY;
    }

    fn count_at(&self, pos: usize) -> u64 {
        self.slots[self.heap[pos]].count
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        let (id_a, id_b) = (self.heap[a], self.heap[b]);
        self.slots[id_a].heap_pos = a;
        self.slots[id_b].heap_pos = b;
    }

    fn sift_up(&mut self, mut pos: usize) {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.count_at(parent) <= self.count_at(pos) {
                break;
            }
            self.swap(parent, pos);
            pos = parent;
        }
    }

    fn sift_down(&mut self, mut pos: usize) {
        let len = self.heap.len();
        loop {
            let left = 2 * pos + 1;
            if left >= len {
                break;
            }
            let right = left + 1;
            let child = if right < len && self.count_at(right) < self.count_at(left) {
                right
            } else {
                left
            };
            if self.count_at(child) >= self.count_at(pos) {
                break;
            }
            self.swap(pos, child);
            pos = child;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    impl TopKeys {
        /// Panics if the heap, the index or the slots disagree.
        fn check_invariants(&self) {
            let table = self.table.lock();
            assert!(table.slots.len() <= self.capacity);
            assert_eq!(table.heap.len(), table.slots.len());
            for (pos, &id) in table.heap.iter().enumerate() {
                assert_eq!(table.slots[id].heap_pos, pos);
                if pos > 0 {
                    assert!(table.count_at((pos - 1) / 2) <= table.count_at(pos));
                }
            }
            let indexed = table.index.iter().filter(|&&id| id != EMPTY).count();
            assert_eq!(indexed, table.slots.len());
            for (id, slot) in table.slots.iter().enumerate() {
                assert_eq!(table.find(&slot.key, slot.hash), Some(id));
            }
        }
    }

    /// Exact weighted counts, the reference the sketch is checked against.
    #[derive(Default)]
    struct Exact(HashMap<String, u64>);

    impl Exact {
        fn record(&mut self, key: &str, weight: u64) {
            *self.0.entry(truncate_key(key).to_owned()).or_default() += weight;
        }
        fn get(&self, key: &str) -> u64 {
            self.0.get(key).copied().unwrap_or(0)
        }
        fn total(&self) -> u64 {
            self.0.values().sum()
        }
    }

    /// xorshift64*: a deterministic stream without a `rand` dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn counts_are_exact_while_keys_fit() {
        let top = TopKeys::new(4);
        for (key, weight) in [("a", 3), ("b", 1), ("a", 2), ("c", 7), ("d", 1), ("b", 4)] {
            top.record(key, weight);
        }
        let entries = top.top(10);
        let got: Vec<(&str, u64, u64)> = entries
            .iter()
            .map(|e| (e.key.as_str(), e.count, e.error))
            .collect();
        assert_eq!(
            got,
            [("c", 7, 0), ("a", 5, 0), ("b", 5, 0), ("d", 1, 0)],
            "count descending, ties by key"
        );
        assert_eq!(top.len(), 4);
        assert_eq!(top.total(), 18);
        top.check_invariants();
    }

    #[test]
    fn top_n_cuts_after_sorting() {
        let top = TopKeys::new(8);
        for (i, key) in ["e", "d", "c", "b", "a"].iter().enumerate() {
            top.record(key, i as u64 + 1);
        }
        let keys: Vec<String> = top.top(2).into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["a", "b"]);
        assert!(top.top(0).is_empty());
    }

    #[test]
    fn newcomer_inherits_the_minimum_as_error() {
        let top = TopKeys::new(2);
        top.record("a", 10);
        top.record("b", 3);
        top.record("c", 1);
        assert_eq!(
            top.top(2),
            [
                TopEntry {
                    key: "a".into(),
                    count: 10,
                    error: 0
                },
                TopEntry {
                    key: "c".into(),
                    count: 4,
                    error: 3
                },
            ]
        );
    }

    #[test]
    fn zero_weight_is_ignored() {
        let top = TopKeys::new(2);
        top.record("a", 0);
        assert!(top.is_empty());
        assert_eq!(top.total(), 0);
    }

    #[test]
    fn capacity_is_clamped() {
        assert_eq!(TopKeys::new(0).capacity(), 1);
        assert_eq!(TopKeys::new(usize::MAX).capacity(), MAX_CAPACITY);
        let one = TopKeys::new(0);
        one.record("a", 1);
        one.record("b", 1);
        assert_eq!(one.len(), 1);
        assert_eq!(
            one.top(1)[0],
            TopEntry {
                key: "b".into(),
                count: 2,
                error: 1
            }
        );
    }

    /// 10k distinct keys with Zipf frequencies (key i seen about 20000 / i times), shuffled.
    #[test]
    fn zipf_stream_keeps_the_true_top_keys() {
        let mut stream: Vec<String> = Vec::new();
        for i in 1..=10_000u64 {
            for _ in 0..(20_000 / i).max(1) {
                stream.push(format!("client-{i}"));
            }
        }
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for i in (1..stream.len()).rev() {
            stream.swap(i, rng.below(i + 1));
        }

        let top = TopKeys::new(64);
        let mut exact = Exact::default();
        for key in &stream {
            top.record(key, 1);
            exact.record(key, 1);
            assert!(top.len() <= 64);
        }
        top.check_invariants();
        assert_eq!(top.total(), exact.total());

        let reported = top.top(10);
        let reported_keys: Vec<&str> = reported.iter().map(|e| e.key.as_str()).collect();
        for i in 1..=5 {
            let key = format!("client-{i}");
            assert!(
                reported_keys.contains(&key.as_str()),
                "{key} missing from {reported_keys:?}"
            );
        }
        for entry in top.top(64) {
            let truth = exact.get(&entry.key);
            assert!(
                truth <= entry.count && entry.count <= truth + entry.error,
                "{entry:?} against true count {truth}"
            );
            assert!(entry.error <= top.total() / 64);
        }
    }

    #[test]
    fn memory_stays_bounded_by_capacity() {
        let top = TopKeys::new(16);
        for i in 0..10_000 {
            top.record(&format!("k{i}"), 1);
            assert!(top.len() <= 16);
        }
        assert_eq!(top.len(), 16);
        top.check_invariants();
        top.clear();
        assert!(top.is_empty());
        assert_eq!(top.total(), 0);
        top.check_invariants();
        top.record("after-clear", 2);
        assert_eq!(
            top.top(1)[0],
            TopEntry {
                key: "after-clear".into(),
                count: 2,
                error: 0
            }
        );
    }

    #[test]
    fn long_keys_are_cut_at_a_char_boundary() {
        let top = TopKeys::new(8);
        let ascii = "a".repeat(200);
        let euro = "€".repeat(50); // 3 bytes each: 128 falls inside a char
        let emoji = format!("{}🦀🦀", "x".repeat(126)); // the crab straddles 128
        for key in [&ascii, &euro, &emoji] {
            top.record(key, 1);
        }
        let mut keys: Vec<String> = top.top(8).into_iter().map(|e| e.key).collect();
        keys.sort();
        assert_eq!(keys, ["a".repeat(128), "x".repeat(126), "€".repeat(42)]);

        let short = "é".repeat(64); // exactly 128 bytes: kept whole
        assert_eq!(truncate_key(&short), short);
    }

    #[test]
    fn keys_sharing_the_kept_prefix_count_as_one() {
        let top = TopKeys::new(8);
        let prefix = "p".repeat(MAX_KEY_BYTES);
        top.record(&format!("{prefix}-one"), 1);
        top.record(&format!("{prefix}-two"), 2);
        assert_eq!(
            top.top(8),
            [TopEntry {
                key: prefix,
                count: 3,
                error: 0
            }]
        );
    }

    #[test]
    fn concurrent_records_are_all_counted() {
        let top = TopKeys::new(8);
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let top = &top;
                scope.spawn(move || {
                    for i in 0..10_000u64 {
                        top.record(&format!("k{}", (i + t) % 8), 1);
                    }
                });
            }
        });
        assert_eq!(top.total(), 40_000);
        let entries = top.top(8);
        assert_eq!(entries.len(), 8);
        assert!(
            entries.iter().all(|e| e.count == 5_000 && e.error == 0),
            "{entries:?}"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Record(u8, u64),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            40 => (0u8..24, 1u64..6).prop_map(|(k, w)| Op::Record(k, w)),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// The Space-Saving guarantees hold after every step, against exact counts.
        #[test]
        fn guarantees_hold_against_exact_counts(
            capacity in 1usize..10,
            ops in proptest::collection::vec(op(), 0..400),
        ) {
            let top = TopKeys::new(capacity);
            let mut exact = Exact::default();
            for op in ops {
                match op {
                    Op::Record(k, w) => {
                        let key = format!("key-{k}");
                        top.record(&key, w);
                        exact.record(&key, w);
                    }
                    Op::Clear => {
                        top.clear();
                        exact = Exact::default();
                    }
                }
                top.check_invariants();
                let total = exact.total();
                let distinct = exact.0.len();
                prop_assert_eq!(top.total(), total);
                prop_assert_eq!(top.len(), distinct.min(capacity));

                let entries = top.top(capacity);
                prop_assert_eq!(entries.iter().map(|e| e.count).sum::<u64>(), total);
                for e in &entries {
                    let truth = exact.get(&e.key);
                    prop_assert!(e.count - e.error <= truth && truth <= e.count, "{:?} vs {}", e, truth);
                    prop_assert!(e.error * capacity as u64 <= total);
                    if distinct <= capacity {
                        prop_assert_eq!(e.error, 0);
                    }
                }
                for (key, &truth) in &exact.0 {
                    if truth * capacity as u64 > total {
                        prop_assert!(entries.iter().any(|e| &e.key == key), "heavy {} missing", key);
                    }
                }
            }
        }
    }
}
