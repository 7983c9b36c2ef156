//! One behaviour suite, run unchanged against every store backend: the embedded memory store,
//! a single Redis server and a 3+3 Redis Cluster (real servers, started by the test kit).
//!
//! Time is a manual clock; the Redis backends pass it to the script instead of the server's
//! `TIME`, so every backend sees exactly the same instants. The clock starts at the real wall
//! time so that Redis TTLs (absolute, derived from the pinned time) are meaningful.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_debug_implementations
)]

mod cases;
// The suite on a Redis server and a cluster: the `redis` feature (on by default).
#[cfg(feature = "redis")]
mod redis;

use std::sync::Arc;

use tollgate::clock::ManualClock;
use tollgate::store::{MemoryStore, StoreBackend};

/// Runs one `redis-cli` command on each data node; returns each node's output.
pub type RedisCli = Box<dyn Fn(&[&str]) -> Vec<String> + Send + Sync>;

/// A backend under test plus the handles a case needs.
pub struct Backend {
    pub name: &'static str,
    pub clock: Arc<ManualClock>,
    pub store: StoreBackend,
    /// Runs a `redis-cli` command on every node that holds data (empty for memory).
    pub redis_cli: RedisCli,
}

/// See [`ManualClock::ahead_of_wall_clock`]: Redis expires keys in real time.
fn wall_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::ahead_of_wall_clock())
}

async fn run_suite(make: impl AsyncFn() -> Backend) {
    for (name, case) in cases::ALL {
        let backend = make().await;
        eprintln!("[{}] {name}", backend.name);
        case(backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_conforms() {
    run_suite(async || {
        let clock = wall_clock();
        Backend {
            name: "memory",
            store: StoreBackend::Memory(MemoryStore::new(clock.clone())),
            clock,
            redis_cli: Box::new(|_| Vec::new()),
        }
    })
    .await;
}
