//! A map from counter keys to per-key state, split into shards under their own locks, for the
//! prefilter's denials and the local-budget leases. A key is hashed once, for both its shard
//! and its place in the shard's table (as the memory store does).

use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use parking_lot::Mutex;

const SHARDS: usize = 16;

type Shard<V> = Mutex<HashTable<(Box<[u8]>, V)>>;

#[derive(Debug)]
pub(super) struct KeyedShards<V> {
    shards: Box<[Shard<V>]>,
    hasher: RandomState,
}

impl<V> Default for KeyedShards<V> {
    fn default() -> Self {
        KeyedShards {
            shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl<V> KeyedShards<V> {
    fn locate(&self, key: &[u8]) -> (u64, &Shard<V>) {
        let hash = self.hasher.hash_one(key);
        // The table uses the hash's low bits and its top seven: the shard takes the middle.
        (hash, &self.shards[((hash >> 32) as usize) & (SHARDS - 1)])
    }

    /// `f` of the value under `key`, if there is one.
    pub fn get<R>(&self, key: &[u8], f: impl FnOnce(&V) -> R) -> Option<R> {
        let (hash, shard) = self.locate(key);
        let table = shard.lock();
        table.find(hash, |(k, _)| **k == *key).map(|(_, v)| f(v))
    }

    /// Sets the value under `key` to `value`; a new key is only added while its shard holds
    /// fewer than `cap` keys. Returns whether the value is in.
    pub fn set(&self, key: &[u8], value: V, cap: usize) -> bool {
        let (hash, shard) = self.locate(key);
        let mut table = shard.lock();
        let full = table.len() >= cap;
        match table.entry(hash, |(k, _)| **k == *key, |(k, _)| self.hasher.hash_one(k)) {
            Entry::Occupied(mut e) => e.get_mut().1 = value,
            Entry::Vacant(_) if full => return false,
            Entry::Vacant(e) => {
                e.insert((key.into(), value));
            }
        }
        true
    }

    /// The value under `key`, added with `make` if there is none.
    pub fn get_or_insert_with(&self, key: &[u8], make: impl FnOnce() -> V) -> V
    where
        V: Clone,
    {
        let (hash, shard) = self.locate(key);
        let mut table = shard.lock();
        let entry = table.entry(hash, |(k, _)| **k == *key, |(k, _)| self.hasher.hash_one(k));
        entry
            .or_insert_with(|| (key.into(), make()))
            .get()
            .1
            .clone()
    }

    /// Drops the value under `key`, if any.
    pub fn remove(&self, key: &[u8]) {
        let (hash, shard) = self.locate(key);
        let mut table = shard.lock();
        if let Ok(e) = table.find_entry(hash, |(k, _)| **k == *key) {
            e.remove();
        }
    }

    /// Keeps the entries for which `keep` is true, shard by shard. Returns how many remain.
    pub fn retain(&self, mut keep: impl FnMut(&[u8], &mut V) -> bool) -> usize {
        let mut remaining = 0;
        for shard in self.shards.iter() {
            let mut table = shard.lock();
            table.retain(|(k, v)| keep(k, v));
            remaining += table.len();
        }
        remaining
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_remove_and_the_cap() {
        let map = KeyedShards::<u32>::default();
        assert!(map.set(b"a", 1, 10));
        assert!(map.set(b"a", 2, 10));
        assert_eq!(map.get(b"a", |v| *v), Some(2));
        assert_eq!(map.get(b"b", |v| *v), None);
        // A full shard takes no new key but still updates the ones it has.
        let tiny = KeyedShards::<u32>::default();
        assert!(tiny.set(b"x", 1, 1));
        assert!(tiny.set(b"x", 3, 1));
        let added = (0..200u32)
            .filter(|n| tiny.set(format!("k{n}").as_bytes(), *n, 1))
            .count();
        assert!(added < 200, "the cap of one key a shard held");
        assert_eq!(tiny.len(), added + 1);
        map.remove(b"a");
        assert_eq!(map.get(b"a", |v| *v), None);
    }

    #[test]
    fn get_or_insert_and_retain() {
        let map = KeyedShards::<u32>::default();
        assert_eq!(map.get_or_insert_with(b"a", || 5), 5);
        assert_eq!(map.get_or_insert_with(b"a", || 6), 5);
        for n in 0..100u32 {
            map.set(format!("k{n}").as_bytes(), n, usize::MAX);
        }
        let remaining = map.retain(|_, v| *v % 2 == 0);
        assert_eq!(remaining, 50, "k0, k2, ... k98; `a` (5) is dropped");
        assert_eq!(map.len(), 50);
        assert_eq!(map.get(b"a", |v| *v), None);
        assert_eq!(map.get(b"k42", |v| *v), Some(42));
    }
}
