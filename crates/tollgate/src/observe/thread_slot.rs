//! A slot index each thread holds while it lives, so that per-thread counters
//! ([`super::Histogram`]'s) are added to with a plain load and store instead of a locked
//! instruction, and threads never write to one cache line.
//!
//! The first [`OWNED`] threads alive at once get a slot of their own; any more, and a thread
//! whose slot has already been given back during its exit, use [`SHARED`], which is added to
//! with locked adds. A slot freed by a thread that ended goes to the next thread that asks:
//! what the slot counted stays, and the new holder goes on adding to it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

/// How many threads at once can hold a slot of their own (`serve` runs one worker per core).
pub const OWNED: usize = 128;

/// The slot every thread without one of its own adds to, with locked adds.
pub const SHARED: usize = OWNED;

/// Slots given back by threads that ended, for the next threads to take.
static FREED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// The next slot never handed out.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A thread's slot; given back when the thread ends.
struct Claim(usize);

impl Claim {
    fn take() -> Self {
        if let Some(slot) = FREED.lock().pop() {
            return Claim(slot);
        }
        let next = NEXT.fetch_add(1, Ordering::Relaxed);
        Claim(next.min(SHARED))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // Under the lock: this thread's last writes to the slot happen before the next
        // holder's first, so no add is lost between the two.
        if self.0 != SHARED {
            FREED.lock().push(self.0);
        }
    }
}

thread_local! {
    static SLOT: Claim = Claim::take();
}

/// The calling thread's slot: below [`OWNED`] when it is the thread's alone, else [`SHARED`].
pub fn current() -> usize {
    SLOT.try_with(|claim| claim.0).unwrap_or(SHARED)
}

/// Adds `n` to `cell`, a counter of slot `slot`: only its holder writes a slot of its own, so
/// a load and a store do; the shared slot takes a locked add.
pub fn add(cell: &AtomicU64, n: u64, slot: usize) {
    if slot == SHARED {
        cell.fetch_add(n, Ordering::Relaxed);
    } else {
        cell.store(
            cell.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
}

/// Held by the tests that count on free slots, and by the one that takes them all.
#[cfg(test)]
pub(super) static EVERY_SLOT: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads alive at once hold different slots of their own.
    #[test]
    fn live_threads_hold_different_slots() {
        let _slots = EVERY_SLOT.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let barrier = std::sync::Barrier::new(4);
        std::thread::scope(|s| {
            for _ in 0..4 {
                let (tx, barrier) = (tx.clone(), &barrier);
                s.spawn(move || {
                    let slot = current();
                    // Every thread holds its slot until all four have one.
                    barrier.wait();
                    tx.send(slot).unwrap();
                });
            }
        });
        drop(tx);
        let mut slots: Vec<usize> = rx.iter().collect();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), 4, "{slots:?}");
        assert!(slots.iter().all(|&s| s < OWNED), "{slots:?}");
    }

    /// A thread that ends gives its slot back: threads started one after another, far more
    /// than there are slots, each still get one of their own.
    #[test]
    fn ended_threads_give_their_slots_back() {
        let _slots = EVERY_SLOT.lock();
        for n in 0..3 * OWNED {
            let slot = std::thread::spawn(current).join().unwrap();
            assert!(slot < OWNED, "thread {n} got the shared slot");
        }
    }
}
