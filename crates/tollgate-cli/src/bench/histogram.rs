//! A log-bucketed latency histogram: fixed memory, about 3% relative error.

use std::time::Duration;

/// Values below this are counted exactly; above, each power of two is split into this many buckets.
const SUB_BUCKETS: u64 = 32;
const SUB_BITS: u32 = 5;
/// Enough buckets for any `u64` nanosecond value.
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB_BUCKETS as usize;

/// Latencies in nanoseconds, bucketed so that memory does not grow with the number of samples.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Box<[u64]>,
    total: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            total: 0,
            max: 0,
        }
    }
}

fn bucket(ns: u64) -> usize {
    if ns < SUB_BUCKETS {
        return ns as usize;
    }
    let exponent = 63 - ns.leading_zeros(); // >= SUB_BITS
    let sub = (ns >> (exponent - SUB_BITS)) & (SUB_BUCKETS - 1);
    ((exponent - SUB_BITS + 1) as u64 * SUB_BUCKETS + sub) as usize
}

/// The largest value that falls in bucket `index`.
fn upper_bound(index: usize) -> u64 {
    let index = index as u64;
    if index < SUB_BUCKETS {
        return index;
    }
    let exponent = (index / SUB_BUCKETS) as u32 + SUB_BITS - 1;
    let sub = index % SUB_BUCKETS;
    let width = 1u64 << (exponent - SUB_BITS);
    ((1u64 << exponent) | (sub << (exponent - SUB_BITS))).saturating_add(width - 1)
}

impl Histogram {
    pub fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket(ns)] += 1;
        self.total += 1;
        self.max = self.max.max(ns);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine += theirs;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max)
    }

    /// The latency at quantile `q` (0..=1): the upper edge of its bucket, never above the maximum.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.total == 0 {
            return Duration::ZERO;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Duration::from_nanos(upper_bound(index).min(self.max));
            }
        }
        self.max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_lies_within_its_bucket_and_error_is_small() {
        for ns in (0..100_000u64).chain([u64::MAX / 3, u64::MAX]) {
            let b = bucket(ns);
            assert!(b < BUCKETS);
            let upper = upper_bound(b);
            assert!(ns <= upper, "{ns} above its bucket's bound {upper}");
            assert!(upper - ns <= ns / 16, "{ns} -> {upper}: bucket too wide");
            if b > 0 {
                assert!(upper_bound(b - 1) < ns, "{ns} belongs in an earlier bucket");
            }
        }
    }

    #[test]
    fn quantiles_are_ordered_and_close() {
        let mut h = Histogram::default();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile(0.5).as_micros() as f64;
        let p99 = h.quantile(0.99).as_micros() as f64;
        assert!((p50 - 500.0).abs() <= 500.0 * 0.04, "p50 {p50}");
        assert!((p99 - 990.0).abs() <= 990.0 * 0.04, "p99 {p99}");
        assert_eq!(h.quantile(1.0), Duration::from_micros(1000));
        assert_eq!(h.max(), Duration::from_micros(1000));
        let mut other = Histogram::default();
        other.record(Duration::from_millis(5));
        h.merge(&other);
        assert_eq!(h.count(), 1001);
        assert_eq!(h.max(), Duration::from_millis(5));
    }
}
