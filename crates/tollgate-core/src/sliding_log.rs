//! The sliding window log's state: the cost admitted at each instant, with running sums.
//!
//! The same model as the Lua twin's sorted set (`store/redis/lua/sliding_window_log.lua`):
//!
//! - one entry per instant, the costs admitted then summed (a decision depends only on the cost
//!   admitted at each instant);
//! - each entry keeps the running sum of the costs up to and including it, so the cost of any
//!   run of entries is a difference of two sums;
//! - entries are sorted by instant, so the live ones (those an instant has not expired) are a
//!   suffix found by a binary search, and the instant by which enough of them expire for a
//!   denied request to fit is a second binary search over the sums.
//!
//! A decision reads O(log n) entries; an append drops expired entries from the front
//! (amortised O(1)) and adds at the back, or merges into the newest entry of the same instant.
//! Only a clock that ran backwards (an append or a take-back behind the newest entry) rewrites
//! the sums after it.

use std::collections::VecDeque;

use crate::Timestamp;

/// Admitted cost per instant, oldest first, with running sums; see the [module
/// documentation](self).
#[derive(Debug, Clone, Default)]
pub struct SlidingLog {
    /// The running sum before the first entry.
    base: u64,
    /// `(instant, running sum through this entry)`: both strictly increasing.
    entries: VecDeque<(Timestamp, u64)>,
}

impl PartialEq for SlidingLog {
    /// Logs are equal when they hold the same cost at the same instants, whatever their sums
    /// started from.
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for SlidingLog {}

impl SlidingLog {
    /// An empty log.
    pub const fn new() -> Self {
        SlidingLog {
            base: 0,
            entries: VecDeque::new(),
        }
    }

    /// A log of `(instant, cost)` entries in any order: sorted by instant, the costs of one
    /// instant summed, zero costs dropped. Sums saturate at `u64::MAX` (no log of real charges
    /// comes near it).
    pub fn from_entries(entries: impl IntoIterator<Item = (Timestamp, u64)>) -> Self {
        let mut sorted: Vec<(Timestamp, u64)> = entries.into_iter().filter(|e| e.1 > 0).collect();
        sorted.sort_by_key(|&(at, _)| at);
        let mut log = SlidingLog::new();
        for (at, cost) in sorted {
            let end = log.end().saturating_add(cost);
            match log.entries.back_mut() {
                Some((last, sum)) if *last == at => *sum = end,
                _ => log.entries.push_back((at, end)),
            }
        }
        log
    }

    /// The `(instant, cost)` entries, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (Timestamp, u64)> + '_ {
        self.entries.iter().scan(self.base, |before, &(at, end)| {
            let cost = end.saturating_sub(*before);
            *before = end;
            Some((at, cost))
        })
    }

    /// Number of entries (instants).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The newest entry's instant.
    pub fn newest(&self) -> Option<Timestamp> {
        self.entries.back().map(|&(at, _)| at)
    }

    /// Heap bytes the entries take (their capacity), for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<(Timestamp, u64)>()
    }

    /// The running sum through the newest entry (`base` when empty).
    fn end(&self) -> u64 {
        self.entries.back().map_or(self.base, |&(_, end)| end)
    }

    /// The running sum before entry `i`.
    fn start(&self, i: usize) -> u64 {
        match i.checked_sub(1) {
            Some(j) => self.entries.get(j).map_or(self.base, |&(_, end)| end),
            None => self.base,
        }
    }

    /// Index of the first entry whose instant is not before `after` (`at >= after`): the first
    /// of the entries still live when `after` is the oldest instant that counts. Counts the
    /// entries it reads in `probes`.
    pub(crate) fn first_from(&self, after: u128, probes: &mut u32) -> usize {
        search(self.len(), probes, |i| {
            self.entries
                .get(i)
                .is_some_and(|&(at, _)| u128::from(at.as_micros()) < after)
        })
    }

    /// The cost of the entries from index `first` on.
    pub(crate) fn cost_from(&self, first: usize) -> u64 {
        if first >= self.len() {
            return 0;
        }
        self.end().saturating_sub(self.start(first))
    }

    /// The instant of the first entry from index `first` on by which the cost counted from
    /// `first` reaches `need`; `None` when the whole suffix costs less. Counts the entries it
    /// reads in `probes`.
    pub(crate) fn reaching(&self, first: usize, need: u64, probes: &mut u32) -> Option<Timestamp> {
        let start = self.start(first);
        let tail = self.len().saturating_sub(first);
        let k = first
            + search(tail, probes, |i| {
                self.entries
                    .get(first + i)
                    .is_some_and(|&(_, end)| end.saturating_sub(start) < need)
            });
        self.entries.get(k).map(|&(at, _)| at)
    }

    /// Drops the entries before `evict_before` (expired), then adds `cost` at `at`: at the back,
    /// or into the newest entry when it has the same instant; behind the newest (a clock that
    /// ran backwards) the sums after it are rewritten. A zero cost adds nothing.
    pub fn append(&mut self, evict_before: Timestamp, at: Timestamp, cost: u64) {
        while let Some(&(first, end)) = self.entries.front() {
            if first >= evict_before {
                break;
            }
            self.base = end;
            self.entries.pop_front();
        }
        if self.entries.is_empty() {
            // A log that empties starts its sums again, as the Lua twin's does.
            self.base = 0;
        }
        if cost == 0 {
            return;
        }
        if self.end().checked_add(cost).is_none() {
            self.rebase();
        }
        let index = self.entries.partition_point(|&(time, _)| time <= at);
        let merged = index
            .checked_sub(1)
            .and_then(|j| self.entries.get(j))
            .is_some_and(|&(time, _)| time == at);
        if merged {
            // The entry at `at` and every one after it carry `cost` more.
            for entry in self.entries.range_mut(index - 1..) {
                entry.1 = entry.1.saturating_add(cost);
            }
        } else {
            let end = self.start(index).saturating_add(cost);
            for entry in self.entries.range_mut(index..) {
                entry.1 = entry.1.saturating_add(cost);
            }
            self.entries.insert(index, (at, end));
        }
    }

    /// The cost admitted at `at`: its entry's, 0 when there is none.
    pub fn cost_at(&self, at: Timestamp) -> u64 {
        let index = self.entries.partition_point(|&(time, _)| time < at);
        match self.entries.get(index) {
            Some(&(time, end)) if time == at => end.saturating_sub(self.start(index)),
            _ => 0,
        }
    }

    /// Takes up to `cost` back from the entry at `at` (what a give-back of a charge made at `at`
    /// does, as the Redis REFUND does); an entry left with no cost goes. Returns whether
    /// anything was taken.
    pub fn take_back(&mut self, at: Timestamp, cost: u64) -> bool {
        let index = self.entries.partition_point(|&(time, _)| time < at);
        let Some(&(time, end)) = self.entries.get(index) else {
            return false;
        };
        if time != at || cost == 0 {
            return false;
        }
        let taken = end.saturating_sub(self.start(index)).min(cost);
        for entry in self.entries.range_mut(index..) {
            entry.1 -= taken;
        }
        if self.entries.get(index).map(|&(_, end)| end) == Some(self.start(index)) {
            self.entries.remove(index);
        }
        if self.entries.is_empty() {
            self.base = 0;
        }
        taken > 0
    }

    /// Rewrites the sums from 0 (a log of real charges reaches `u64::MAX` only after about
    /// 2^64 admitted units without a quiet period).
    fn rebase(&mut self) {
        let base = std::mem::take(&mut self.base);
        for entry in &mut self.entries {
            entry.1 -= base;
        }
    }
}

/// The first index in `0..len` where `below` is false, `below` being true on a prefix (a
/// binary search, counting the indices it reads in `probes`).
fn search(len: usize, probes: &mut u32, below: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        *probes += 1;
        if below(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(micros: u64) -> Timestamp {
        Timestamp::from_micros(micros)
    }

    fn entries(log: &SlidingLog) -> Vec<(u64, u64)> {
        log.iter().map(|(at, c)| (at.as_micros(), c)).collect()
    }

    #[test]
    fn entries_of_one_instant_merge_and_order_is_kept() {
        let log = SlidingLog::from_entries([(t(30), 1), (t(10), 2), (t(30), 4), (t(20), 0)]);
        assert_eq!(entries(&log), [(10, 2), (30, 5)]);
        let mut log = log;
        log.append(t(0), t(30), 1);
        log.append(t(0), t(20), 3); // behind the newest: the sums after it move
        assert_eq!(entries(&log), [(10, 2), (20, 3), (30, 6)]);
        assert_eq!(log.cost_from(1), 9);
        log.append(t(15), t(40), 1); // evicts the entry at 10
        assert_eq!(entries(&log), [(20, 3), (30, 6), (40, 1)]);
        assert_eq!(
            log,
            SlidingLog::from_entries([(t(20), 3), (t(30), 6), (t(40), 1)])
        );
    }

    #[test]
    fn searches_find_the_live_suffix_and_the_freeing_entry() {
        let log = SlidingLog::from_entries((1..=100).map(|i| (t(i * 10), i)));
        let mut probes = 0;
        assert_eq!(log.first_from(0, &mut probes), 0);
        assert_eq!(log.first_from(505, &mut probes), 50);
        assert_eq!(log.first_from(10_000, &mut probes), 100);
        // From the entry at 510 (cost 51): 51 + 52 = 103 reaches 100 at 520.
        assert_eq!(log.reaching(50, 100, &mut probes), Some(t(520)));
        assert_eq!(log.reaching(50, 51, &mut probes), Some(t(510)));
        assert_eq!(log.reaching(99, 101, &mut probes), None);
        assert!(
            probes <= 5 * 8,
            "{probes} probes for five searches of 100 entries"
        );
    }

    #[test]
    fn a_take_back_shrinks_the_entry_at_its_instant() {
        let mut log = SlidingLog::from_entries([(t(10), 2), (t(20), 3), (t(30), 1)]);
        assert_eq!((log.cost_at(t(20)), log.cost_at(t(15))), (3, 0));
        assert!(!log.take_back(t(15), 1), "nothing at 15");
        assert!(log.take_back(t(20), 2));
        assert_eq!(entries(&log), [(10, 2), (20, 1), (30, 1)]);
        assert!(log.take_back(t(20), 5));
        assert_eq!(entries(&log), [(10, 2), (30, 1)]);
        assert!(log.take_back(t(30), 1));
        assert!(log.take_back(t(10), 2));
        assert!(log.is_empty());
    }

    #[test]
    fn sums_rebase_instead_of_overflowing() {
        let mut log = SlidingLog::from_entries([(t(10), u64::MAX - 1)]);
        log.append(t(11), t(20), 5); // evicts the entry at 10; the sum would overflow
        assert_eq!(entries(&log), [(20, 5)]);
        let mut log = SlidingLog::from_entries([(t(10), u64::MAX - 1)]);
        log.append(t(0), t(20), 5);
        assert_eq!(log.len(), 2, "saturated, still two entries");
    }
}
