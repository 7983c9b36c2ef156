//! What the store tests draw from: proptest's settings, limits and periods.

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use tollgate_core::MAX_PERIOD;

pub const MAX_PERIOD_US: u64 = MAX_PERIOD.as_micros() as u64;

/// `cases` cases, or `PROPTEST_CASES` of them for a longer run; failures are kept beside
/// `source_file` (the test's `file!()`).
pub fn config(cases: u32, source_file: &'static str) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        source_file: Some(source_file),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

/// A limit up to `max`: mostly small (filled and emptied within a sequence), sometimes `max`.
pub fn limit(max: u64) -> BoxedStrategy<u64> {
    prop_oneof![
        6 => 1..=10u64.min(max),
        2 => 1..=1_000u64.min(max),
        1 => 1..=max,
        1 => Just(max),
    ]
    .boxed()
}

/// Periods in µs: short (windows fill and roll), a second to a day, up to the 400-day maximum.
pub fn period() -> BoxedStrategy<u64> {
    prop_oneof![
        4 => 1_000..=4_000u64,
        1 => Just(1_000u64),
        2 => 1_000_000..=86_400_000_000u64,
        1 => 86_400_000_000..=MAX_PERIOD_US,
        1 => Just(MAX_PERIOD_US),
    ]
    .boxed()
}
