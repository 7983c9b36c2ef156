//! Observability building blocks that keep memory and label cardinality bounded.
//!
//! * [`Histogram`]: fixed-bucket latency histograms for the hot path, rendered for Prometheus.
//! * [`TopKeys`]: the most frequent keys of a stream (e.g. the most throttled clients of a rule)
//!   in a fixed-size table, so client keys never become metric labels.
//! * [`prometheus`]: the one writer of the Prometheus text format every `/metrics` part uses.
//! * [`Throttle`]: a log line at most once per interval, with a count of those held back.

mod histogram;
pub mod history;
pub mod prometheus;
pub mod shares;
mod thread_slot;
mod throttle;
mod top_keys;

pub use histogram::{Histogram, Summed};
pub use throttle::Throttle;
pub use top_keys::{MAX_CAPACITY, MAX_KEY_BYTES, TopEntry, TopKeys};
