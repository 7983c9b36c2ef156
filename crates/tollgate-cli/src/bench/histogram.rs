//! The load generator's latency histogram: `hdrhistogram` at three significant figures (0.1%
//! relative error), growing its range as larger values come; merged across workers.

use std::time::Duration;

/// Latencies in nanoseconds.
#[derive(Debug, Clone)]
pub struct Histogram(hdrhistogram::Histogram<u64>);

impl Default for Histogram {
    fn default() -> Self {
        // Three significant figures always fit: the constructor fails only above five.
        let histogram = hdrhistogram::Histogram::new(3).unwrap_or_else(|_| unreachable!());
        Histogram(histogram)
    }
}

fn nanos(latency: Duration) -> u64 {
    u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX)
}

impl Histogram {
    pub fn record(&mut self, latency: Duration) {
        let ns = nanos(latency);
        // `record` grows the range to hold `ns`; past what any range holds, the largest it can.
        if self.0.record(ns).is_err() {
            self.0.saturating_record(ns);
        }
    }

    pub fn merge(&mut self, other: &Histogram) {
        // Both resize as values come, so an addition never falls outside the range.
        let added = self.0.add(&other.0);
        debug_assert!(added.is_ok(), "{added:?}");
    }

    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.0.max())
    }

    /// The latency at quantile `q` (0..=1), never above the maximum; zero when empty.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.0.value_at_quantile(q).min(self.0.max()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_ordered_and_close() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.99), Duration::ZERO);
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile(0.5).as_nanos() as f64;
        let p99 = h.quantile(0.99).as_nanos() as f64;
        assert!((p50 - 500_000.0).abs() <= 500_000.0 * 0.002, "p50 {p50}");
        assert!((p99 - 990_000.0).abs() <= 990_000.0 * 0.002, "p99 {p99}");
        assert!(h.quantile(0.5) < h.quantile(0.99));
        assert_eq!(h.max().as_micros(), 1000, "{:?}", h.max());
        let mut other = Histogram::default();
        other.record(Duration::from_secs(30));
        h.merge(&other);
        assert_eq!(h.count(), 1001);
        assert!(
            h.max() >= Duration::from_millis(29_990),
            "a merged value past the first's range: {:?}",
            h.max()
        );
    }

    #[test]
    fn a_latency_past_u64_nanoseconds_is_kept_as_the_largest() {
        let mut h = Histogram::default();
        h.record(Duration::MAX);
        assert_eq!(h.count(), 1);
        assert!(h.max() > Duration::from_secs(1 << 30), "{:?}", h.max());
    }
}
