//! A filter in front of the overrides' index: one bit per target held, at a cheap hash of it,
//! so that the lookup of a target no override is for (nearly every request, once thousands are
//! in force) stops at one hash and one bit instead of a walk down the index.
//!
//! A target's bit is set before the index holding it is published, and is never cleared while
//! the filter is in use: a removed target's bit stays set, which costs a later lookup of it the
//! full walk only. The bits are shared by the copies of one index (a set sets one bit, copying
//! nothing); when the targets set outgrow the filter, the index that notices builds a bigger one
//! from what it holds (doubling, so amortised O(1) per set).

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::FxHasher;

/// Bits per target held, at least: about one lookup in 16 of a target not held goes on to the
/// index.
const BITS_PER_TARGET: usize = 16;
/// The smallest filter, in bits.
const MIN_BITS: usize = 4096;

/// One bit per target held, at its hash.
#[derive(Debug)]
pub(super) struct Filter {
    words: Box<[AtomicU64]>,
    /// log2 of the number of bits.
    shift: u32,
}

/// The filter's hash of a target: not keyed (a crafted collision costs its sender a full
/// lookup, nothing more), and fast.
pub(super) fn hash(domain: &str, rule: &str, entries: &[(String, String)]) -> u64 {
    let mut hasher = FxHasher::default();
    domain.hash(&mut hasher);
    rule.hash(&mut hasher);
    entries.hash(&mut hasher);
    hasher.finish()
}

impl Filter {
    /// An empty filter for `targets` targets.
    pub fn for_targets(targets: usize) -> Self {
        let bits = (targets.saturating_mul(2 * BITS_PER_TARGET))
            .max(MIN_BITS)
            .next_power_of_two();
        Filter {
            words: (0..bits / 64).map(|_| AtomicU64::new(0)).collect(),
            shift: bits.trailing_zeros(),
        }
    }

    /// How many targets it holds well.
    pub fn capacity(&self) -> usize {
        (self.words.len() * 64) / BITS_PER_TARGET
    }

    fn bit(&self, hash: u64) -> (usize, u64) {
        // The high bits of a multiplicative mix: every bit of the hash counts.
        let at = (hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - self.shift)) as usize;
        (at / 64, 1 << (at % 64))
    }

    /// Marks the target of `hash` as held.
    pub fn insert(&self, hash: u64) {
        let (word, bit) = self.bit(hash);
        self.words[word].fetch_or(bit, Ordering::Relaxed);
    }

    /// Whether the target of `hash` may be held (`false`: it is not).
    pub fn may_hold(&self, hash: u64) -> bool {
        let (word, bit) = self.bit(hash);
        self.words[word].load(Ordering::Relaxed) & bit != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every target inserted may be held; of targets never inserted, few pass.
    #[test]
    fn it_holds_what_was_inserted_and_few_others() {
        let entries = |i: usize| vec![("tenant".to_owned(), format!("t{i}"))];
        let filter = Filter::for_targets(20_000);
        for i in 0..20_000 {
            filter.insert(hash("api", "per_tenant", &entries(i)));
        }
        assert!((0..20_000).all(|i| filter.may_hold(hash("api", "per_tenant", &entries(i)))));
        let passed = (20_000..40_000)
            .filter(|&i| filter.may_hold(hash("api", "per_tenant", &entries(i))))
            .count();
        assert!(passed < 20_000 / 10, "{passed} of 20,000 passed");
    }
}
