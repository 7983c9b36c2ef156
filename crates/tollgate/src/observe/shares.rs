//! Per-value would-deny shares of a rule, in bounded memory: for the most frequent values of a
//! stream of decisions, how many each had and how many of those its rule would have denied.
//!
//! A Space-Saving table (as [`TopKeys`](super::TopKeys)) counting every decision of a value,
//! each entry also counting its hits (the decisions that were not plain allows). A value enters
//! the table by replacing the one with the smallest count, inheriting that count as its
//! `error`; its hits start from zero there. So for every value in the table, `count - error`
//! decisions were counted since the table started tracking it, `hits` of them hits, exactly:
//! the share `hits / (count - error)` is exact for that stretch, which is how it is labelled
//! ("counted since tracking began"). A value whose true count exceeds `total / capacity` is
//! always in the table.
//!
//! Recording is a hash lookup and a sift in a heap of at most `capacity` entries under a short
//! lock: `O(log capacity)`, and an allocation only when a value enters the table.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::MAX_KEY_BYTES;

/// Values tracked per rule by default.
pub const SHARES_CAPACITY: usize = 256;

/// One tracked value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareEntry {
    /// The value, cut to [`MAX_KEY_BYTES`].
    pub key: String,
    /// Decisions counted for it, including the inherited `error`.
    pub count: u64,
    /// Decisions of other values that `count` may include (those before tracking began).
    pub error: u64,
    /// Hits since tracking began.
    pub hits: u64,
}

impl ShareEntry {
    /// Decisions counted since tracking began: exact.
    pub fn tracked(&self) -> u64 {
        self.count - self.error
    }

    /// `hits / tracked`, 0 when nothing was tracked.
    pub fn share(&self) -> f64 {
        match self.tracked() {
            0 => 0.0,
            n => self.hits as f64 / n as f64,
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    /// A min-heap by `count`.
    heap: Vec<ShareEntry>,
    /// Position in `heap` of each key.
    index: HashMap<Box<str>, usize>,
    total: u64,
}

impl Table {
    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        for i in [a, b] {
            if let Some(slot) = self.index.get_mut(self.heap[i].key.as_str()) {
                *slot = i;
            }
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut least = i;
            for c in [l, r] {
                if c < self.heap.len() && self.heap[c].count < self.heap[least].count {
                    least = c;
                }
            }
            if least == i {
                return;
            }
            self.swap(i, least);
            i = least;
        }
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[parent].count <= self.heap[i].count {
                return;
            }
            self.swap(i, parent);
            i = parent;
        }
    }

    fn record(&mut self, key: &str, hit: bool, capacity: usize) {
        self.total = self.total.saturating_add(1);
        let hits = u64::from(hit);
        if let Some(&i) = self.index.get(key) {
            let entry = &mut self.heap[i];
            entry.count = entry.count.saturating_add(1);
            entry.hits += hits;
            self.sift_down(i);
            return;
        }
        if self.heap.len() < capacity {
            self.heap.push(ShareEntry {
                key: key.to_owned(),
                count: 1,
                error: 0,
                hits,
            });
            let i = self.heap.len() - 1;
            self.index.insert(key.into(), i);
            self.sift_up(i);
            return;
        }
        let Some(least) = self.heap.first_mut() else {
            return;
        };
        let old = std::mem::replace(&mut least.key, key.to_owned());
        least.error = least.count;
        least.count = least.count.saturating_add(1);
        least.hits = hits;
        self.index.remove(old.as_str());
        self.index.insert(key.into(), 0);
        self.sift_down(0);
    }
}

/// The table of one rule.
#[derive(Debug)]
pub struct ValueShares {
    capacity: usize,
    table: Mutex<Table>,
}

impl Default for ValueShares {
    fn default() -> Self {
        ValueShares::new(SHARES_CAPACITY)
    }
}

fn truncate(key: &str) -> &str {
    if key.len() <= MAX_KEY_BYTES {
        return key;
    }
    let mut end = MAX_KEY_BYTES;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    &key[..end]
}

impl ValueShares {
    /// An empty table tracking at most `capacity` values (at least 1).
    pub fn new(capacity: usize) -> Self {
        ValueShares {
            capacity: capacity.clamp(1, super::MAX_CAPACITY),
            table: Mutex::new(Table::default()),
        }
    }

    /// Counts one decision of `key`, a hit when its rule did not simply allow it.
    pub fn record(&self, key: &str, hit: bool) {
        self.table.lock().record(truncate(key), hit, self.capacity);
    }

    /// The `n` values with the most hits, then the highest counts.
    pub fn top(&self, n: usize) -> Vec<ShareEntry> {
        let mut entries = self.table.lock().heap.clone();
        entries.sort_by(|a, b| {
            b.hits
                .cmp(&a.hits)
                .then(b.count.cmp(&a.count))
                .then(a.key.cmp(&b.key))
        });
        entries.truncate(n);
        entries
    }

    /// One value's entry, if it is tracked.
    pub fn get(&self, key: &str) -> Option<ShareEntry> {
        let table = self.table.lock();
        let i = *table.index.get(truncate(key))?;
        table.heap.get(i).cloned()
    }

    /// Decisions recorded.
    pub fn total(&self) -> u64 {
        self.table.lock().total
    }

    /// Most values tracked.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Most by which a tracked value's count may overestimate: `total / capacity`.
    pub fn max_error(&self) -> u64 {
        self.total() / self.capacity as u64
    }
}

/// Most rules given a table in one policy (and in one candidate): the first this many of the
/// rules that want one, in policy order; the others are not tracked. A bound on memory: a full
/// table holds [`SHARES_CAPACITY`] values of up to [`MAX_KEY_BYTES`] each.
pub const MAX_RULES: usize = 1024;

/// Tables for a policy's rules, one slot per rule: for each rule that `wants` one (the first
/// [`MAX_RULES`] of them), the table `carried` holds for it or a fresh one; `None` for the
/// others.
pub fn tables(
    carried: impl IntoIterator<Item = Option<Arc<ValueShares>>>,
    wants: impl IntoIterator<Item = bool>,
) -> Box<[Option<Arc<ValueShares>>]> {
    let mut given = 0;
    carried
        .into_iter()
        .zip(wants)
        .map(|(table, wants)| {
            (wants && given < MAX_RULES).then(|| {
                given += 1;
                table.unwrap_or_default()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_capacity_every_share_is_exact() {
        let shares = ValueShares::new(4);
        for i in 0..10 {
            shares.record("tenant=acme", i < 4);
        }
        shares.record("tenant=globex", false);
        let acme = shares.get("tenant=acme").expect("tracked");
        assert_eq!((acme.count, acme.error, acme.hits), (10, 0, 4));
        assert_eq!(acme.share(), 0.4);
        assert_eq!(shares.top(1)[0].key, "tenant=acme");
        assert_eq!(shares.get("tenant=globex").expect("tracked").share(), 0.0);
    }

    #[test]
    fn a_value_entering_a_full_table_is_counted_from_then() {
        let shares = ValueShares::new(2);
        for _ in 0..5 {
            shares.record("a", true);
        }
        shares.record("b", false);
        // `c` replaces `b` (the least), inheriting its count as error; its hits start at 0.
        shares.record("c", false);
        shares.record("c", true);
        let c = shares.get("c").expect("tracked");
        assert_eq!((c.count, c.error, c.hits), (3, 1, 1));
        assert_eq!(c.tracked(), 2);
        assert_eq!(c.share(), 0.5);
        assert_eq!(shares.get("b"), None);
        assert_eq!(shares.get("a").expect("kept").count, 5);
        assert_eq!(shares.total(), 8);
        assert_eq!(shares.max_error(), 4);
    }

    #[test]
    fn the_heaviest_values_stay_whatever_the_stream() {
        let shares = ValueShares::new(8);
        for i in 0..10_000u64 {
            shares.record("heavy", i % 2 == 0);
            shares.record(&format!("noise-{i}"), false);
        }
        let heavy = shares.get("heavy").expect("always tracked");
        assert_eq!(heavy.count, 10_000);
        assert_eq!(heavy.share(), 0.5);
        assert!(shares.table.lock().index.len() <= 8);
    }

    #[test]
    fn tables_go_to_the_first_rules_that_want_one_carrying_what_they_held() {
        let held = Arc::new(ValueShares::default());
        held.record("tenant=acme", true);
        // Every even rule and rule 1 want one: MAX_RULES + 3 of them.
        let n = 2 * MAX_RULES + 4;
        let wants = (0..n).map(|i| i % 2 == 0 || i == 1);
        let carried = (0..n).map(|i| (i == 0).then(|| held.clone()));
        let tables = tables(carried, wants);
        assert_eq!(tables.len(), n);
        assert!(Arc::ptr_eq(tables[0].as_ref().expect("wanted"), &held));
        assert_eq!(tables[1].as_ref().expect("wanted").total(), 0);
        assert!(tables[3].is_none(), "not wanted");
        assert_eq!(tables.iter().flatten().count(), MAX_RULES);
        assert!(tables[n - 2].is_none(), "wanted, but past the cap");
    }
}
