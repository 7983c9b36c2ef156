//! Open loop: releases each worker's requests on schedule.
//!
//! The schedule is `--rate` requests per second in total: slot `k` is due at `start + k / rate`
//! and belongs to worker `k mod concurrency`. Tokio's timers tick in whole milliseconds, so
//! workers sleeping on their own wake together on each tick and send in bursts of `rate / 1000`
//! requests, a queue at the server that no real fleet of clients makes. One task waiting on a
//! timerfd until each slot (`timer.rs`) spreads them as scheduled instead, on the runtime's own
//! threads: releasing a slot wakes its worker without a context switch, and the slots that
//! fell due since the last wake go out together (at most `MIN_GAP` apart).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::clock::now;
use super::timer::Timer;

/// The pacer re-checks whether the run was stopped at least this often.
const MAX_NAP: Duration = Duration::from_millis(10);

/// The pacer wakes at most once in this long, releasing every slot due by then: a slot goes out
/// up to this late, so at 60,000 a second in groups of about six. Waking for each slot cost the
/// generator its whole core already at 30,000 a second (each request written on its own: one
/// `writev` and the loopback's receive work each), where this costs it 0.72 of its core, and
/// at 60,000 its p99 against the bare server was 2.0-2.9 ms where a pacer thread's was 42 ms
/// (docs/benchmarks.md, "Known limits of this machine").
const MIN_GAP: Duration = Duration::from_micros(100);

#[derive(Debug)]
pub struct Schedule {
    start: Instant,
    /// Time between two slots.
    spacing: Duration,
    gates: Box<[Gate]>,
    /// Set when the pacer has released its last slot: later slots never come.
    over: AtomicBool,
}

/// One worker's slots released so far.
#[derive(Debug, Default)]
struct Gate {
    released: AtomicU64,
    notify: Notify,
}

impl Schedule {
    pub fn new(start: Instant, rate: f64, workers: usize) -> Self {
        Schedule {
            start,
            spacing: Duration::from_secs_f64(1.0 / rate),
            gates: (0..workers.max(1)).map(|_| Gate::default()).collect(),
            over: AtomicBool::new(false),
        }
    }

    fn at(&self, slot: u64) -> Instant {
        self.start + self.spacing.mul_f64(slot as f64)
    }

    /// When `worker`'s `n`th slot (from 0) is due.
    pub fn due(&self, worker: usize, n: u64) -> Instant {
        self.at(n * self.gates.len() as u64 + worker as u64)
    }

    /// Waits until `worker`'s `n`th slot is released: `Some(true)` if it already was (the
    /// worker's previous request ended after this one was due), `Some(false)` after waiting,
    /// `None` when the pacer has stopped without releasing it (the run is over).
    pub async fn wait(&self, worker: usize, n: u64) -> Option<bool> {
        let gate = self.gates.get(worker)?;
        let released = || gate.released.load(Ordering::Acquire) > n;
        if released() {
            return Some(true);
        }
        // `notify_one` keeps a permit when nobody waits yet, so no release is missed.
        loop {
            if released() {
                return Some(false);
            }
            if self.over.load(Ordering::Acquire) {
                return None;
            }
            gate.notify.notified().await;
        }
    }

    /// Releases slots as they fall due, until `deadline` or `stop`; then tells every worker
    /// waiting for a later slot that it will not come (also when the timer fails, whose error
    /// is returned). A task of the workers' runtime.
    pub async fn run(&self, deadline: Instant, stop: &AtomicBool) -> std::io::Result<()> {
        let paced = self.release(deadline, stop).await;
        self.over.store(true, Ordering::Release);
        for gate in self.gates.iter() {
            gate.notify.notify_one();
        }
        paced
    }

    async fn release(&self, deadline: Instant, stop: &AtomicBool) -> std::io::Result<()> {
        let timer = Timer::new()?;
        let mut slot = 0u64;
        let mut woke = now();
        while !stop.load(Ordering::Relaxed) {
            let at = self.at(slot);
            if at >= deadline {
                break;
            }
            let current = now();
            if at > current {
                let wait = at.max(woke + MIN_GAP).saturating_duration_since(current);
                timer.sleep(wait.min(MAX_NAP)).await?;
                woke = now();
                continue;
            }
            let gate = &self.gates[(slot % self.gates.len() as u64) as usize];
            gate.released.fetch_add(1, Ordering::Release);
            gate.notify.notify_one();
            slot += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn slots_go_round_the_workers_in_order() {
        let start = now();
        let schedule = Schedule::new(start, 1000.0, 4);
        assert_eq!(schedule.due(0, 0), start);
        assert_eq!(schedule.due(3, 0), start + Duration::from_millis(3));
        assert_eq!(schedule.due(1, 2), start + Duration::from_millis(9));
    }

    #[tokio::test]
    async fn a_worker_waits_for_its_slot_and_knows_when_it_is_late() {
        // 100 slots a second over two workers: worker `w`'s slot `n` is due at (2n + w) * 10 ms.
        // Margins of hundreds of ms, so a busy machine does not turn waiting into lateness.
        let start = now();
        let schedule = Arc::new(Schedule::new(start, 100.0, 2));
        let stop = Arc::new(AtomicBool::new(false));
        let pacer = {
            let (schedule, stop) = (schedule.clone(), stop.clone());
            tokio::spawn(async move { schedule.run(start + Duration::from_secs(10), &stop).await })
        };
        // Worker 1's slot 25 is due at 510 ms: waiting for it is not late, and it is not
        // released early.
        assert_eq!(schedule.wait(1, 25).await, Some(false));
        assert!(now() >= schedule.due(1, 25));
        // Worker 0's slots 0..=2 were due by 40 ms: they are released already, late.
        assert_eq!(schedule.wait(0, 2).await, Some(true));
        // Its slot 80 is due at 1.6 s.
        assert_eq!(schedule.wait(0, 80).await, Some(false));
        assert!(now() >= schedule.due(0, 80));
        stop.store(true, Ordering::Relaxed);
        pacer.await.unwrap().unwrap();
        // Once the pacer is done, a slot it released is still served; later ones never come.
        assert_eq!(schedule.wait(1, 0).await, Some(true));
        assert_eq!(schedule.wait(1, 1_000_000).await, None);
    }
}
