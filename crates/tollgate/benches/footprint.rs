//! Resident memory of one million live keys in the memory store, per algorithm.
//!
//! `cargo bench -p tollgate --bench footprint` runs every algorithm, each in a fresh child
//! process (so one algorithm's freed memory cannot hide another's); `-- gcra` runs one. Each
//! child checks 1,000,000 distinct requests `k=<30-byte value>` (55-byte store keys) once
//! through `Limiter::check`, with a one-hour period so no key expires, and prints the growth of
//! its resident set (`VmRSS`) and the bytes per key.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::process::Command;

use tollgate::store::StoreBackend;
use tollgate_core::Algorithm;

const KEYS: usize = 1_000_000;

fn main() {
    let wanted: Vec<Algorithm> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if std::env::var_os("TOLLGATE_FOOTPRINT_CHILD").is_some() {
        for algorithm in wanted {
            measure(algorithm);
        }
        return;
    }
    let algorithms = if wanted.is_empty() {
        Algorithm::ALL.to_vec()
    } else {
        wanted
    };
    println!(
        "{:<24} {:>10} {:>12} {:>10}",
        "algorithm", "keys", "RSS delta", "bytes/key"
    );
    let exe = std::env::current_exe().unwrap();
    for algorithm in algorithms {
        let status = Command::new(&exe)
            .arg(algorithm.name())
            .env("TOLLGATE_FOOTPRINT_CHILD", "1")
            .status()
            .unwrap();
        assert!(status.success(), "{algorithm}: {status}");
    }
}

fn measure(algorithm: Algorithm) {
    let (_clock, limiter) = support::limiter(algorithm, 10, "1h");
    let before = rss_bytes();
    for n in 0..KEYS {
        assert!(
            support::ready(limiter.check(&support::request(n)))
                .unwrap()
                .allowed()
        );
    }
    let after = rss_bytes();
    let StoreBackend::Memory(store) = limiter.store() else {
        unreachable!("the bench limiter runs on the memory store")
    };
    assert_eq!(store.len(), KEYS);
    let delta = after.saturating_sub(before);
    println!(
        "{:<24} {:>10} {:>9.1} MiB {:>10}",
        algorithm.name(),
        KEYS,
        delta as f64 / (1024.0 * 1024.0),
        delta / KEYS as u64
    );
}

/// This process's resident set in bytes, from `/proc/self/status`.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}
