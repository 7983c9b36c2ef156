//! Fixed-bucket latency histograms, rendered in the Prometheus text format.
//!
//! For timing decisions and store calls on the request path: [`Histogram::observe`] is two
//! plain adds to the calling thread's own counters (see [`super::thread_slot`]), with no lock,
//! no locked instruction and no cache line another thread writes. Bucket bounds are fixed at
//! construction, so a scrape costs one pass over a handful of counters per thread.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::prometheus::Distribution;
use super::thread_slot::{self, OWNED};

/// Counts of durations by upper bound, plus their sum, for one label set.
///
/// Create one per label set when metrics are registered, then call [`Histogram::observe`] on
/// the hot path; a scrape writes it as one series of a histogram family through
/// [`Family::histogram`](super::prometheus::Family::histogram) (it is a [`Distribution`]).
///
/// The total count is the sum of the bucket counters rather than a counter of its own, so a
/// scrape racing with `observe` still renders `_count` equal to the `+Inf` bucket. `_sum` is read
/// separately and may include an observation the buckets do not yet show.
///
/// ```
/// use std::time::Duration;
/// use tollgate::observe::Histogram;
/// use tollgate::observe::prometheus::{Exposition, Kind};
///
/// let latency = Histogram::new(&[0.001, 0.01]);
/// latency.observe(Duration::from_micros(400));
/// let mut out = String::new();
/// Exposition::new(&mut out)
///     .family("decide_seconds", "Time to decide.", Kind::Histogram)
///     .histogram(&[("store", "memory")], &latency);
/// let lines: Vec<&str> = out.lines().collect();
/// assert_eq!(lines, [
///     "# HELP decide_seconds Time to decide.",
///     "# TYPE decide_seconds histogram",
///     r#"decide_seconds_bucket{store="memory",le="0.001"} 1"#,
///     r#"decide_seconds_bucket{store="memory",le="0.01"} 1"#,
///     r#"decide_seconds_bucket{store="memory",le="+Inf"} 1"#,
///     r#"decide_seconds_sum{store="memory"} 0.0004"#,
///     r#"decide_seconds_count{store="memory"} 1"#,
/// ]);
/// ```
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds in seconds, finite and strictly increasing.
    bounds: &'static [f64],
    /// The same in whole nanoseconds (the most each bucket holds), which a duration is
    /// compared with: an integer search where one in seconds converted the duration to a float.
    bounds_nanos: Box<[u64]>,
    /// Per thread slot, made at the slot's first observation: its counters (see [`Counters`]).
    slots: Box<[OnceLock<Counters>]>,
}

/// One thread slot's counters: per bucket (not cumulative), one per bound, then one for `+Inf`,
/// then the sum of its observations in nanoseconds (which wraps after about 584 years). On
/// cache lines of their own, so two threads never write to one line.
#[derive(Debug)]
struct Counters(Box<[Line]>);

#[derive(Debug, Default)]
#[repr(align(64))]
struct Line([AtomicU64; 8]);

impl Counters {
    fn zeroed(cells: usize) -> Self {
        Counters((0..cells.div_ceil(8)).map(|_| Line::default()).collect())
    }

    fn cell(&self, i: usize) -> Option<&AtomicU64> {
        self.0.get(i / 8).map(|line| &line.0[i % 8])
    }

    fn load(&self, i: usize) -> u64 {
        self.cell(i).map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

impl Histogram {
    /// Bounds in seconds for limiter latencies: in-memory decisions take microseconds, store
    /// round trips hundreds of microseconds to tens of milliseconds; the top buckets catch
    /// timeouts.
    pub const LATENCY_SECONDS: &'static [f64] = &[
        0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
        0.05, 0.1, 0.25, 1.0,
    ];

    /// A zeroed histogram with the given upper bounds in seconds.
    ///
    /// `bounds` must be finite and strictly increasing, without `+Inf` (always added); this is
    /// checked in debug builds only. Other bounds never panic, but bucket counts are then
    /// meaningless.
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(
            bounds.iter().all(|b| b.is_finite()) && bounds.windows(2).all(|w| w[0] < w[1]),
            "histogram bounds must be finite and strictly increasing: {bounds:?}"
        );
        Histogram {
            bounds,
            bounds_nanos: bounds.iter().map(|&b| nanos_at_most(b)).collect(),
            slots: (0..=OWNED).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Counts one duration: in the first bucket whose bound is at or above it, else `+Inf`.
    pub fn observe(&self, duration: Duration) {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        // The same steps whatever the duration, so callgrind's counts do not depend on time.
        let bucket = self.bounds_nanos.partition_point(|&bound| bound < nanos);
        let slot = thread_slot::current();
        let Some(counters) = self.slots.get(slot) else {
            return;
        };
        let counters = counters.get_or_init(|| Counters::zeroed(self.sum_cell() + 1));
        for (cell, n) in [(bucket, 1), (self.sum_cell(), nanos)] {
            if let Some(cell) = counters.cell(cell) {
                thread_slot::add(cell, n, slot);
            }
        }
    }

    /// Where a slot's sum is: after its buckets (one per bound, then `+Inf`).
    fn sum_cell(&self) -> usize {
        self.bounds.len() + 1
    }

    /// Counter `cell` added over every thread slot.
    fn total(&self, cell: usize) -> u64 {
        let slots = self.slots.iter().filter_map(OnceLock::get);
        slots.fold(0, |sum, counters| sum.wrapping_add(counters.load(cell)))
    }

    /// Per bucket, not cumulative: one per bound, then `+Inf`.
    fn bucket_counts(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.sum_cell()).map(|bucket| self.total(bucket))
    }

    /// How many durations have been observed.
    pub fn count(&self) -> u64 {
        self.bucket_counts().fold(0, u64::wrapping_add)
    }

    /// The sum of all observed durations.
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.sum_nanos())
    }

    fn sum_nanos(&self) -> u64 {
        self.total(self.sum_cell())
    }
}

/// The most whole nanoseconds a bound of `seconds` holds (0 for a negative one). A decimal
/// bound is a few ulps off its value in binary (1e-5 × 1e9 is 10000.000000000002): the
/// integer it lies that close to is the bound itself.
fn nanos_at_most(seconds: f64) -> u64 {
    let nanos = seconds * 1e9;
    let nearest = nanos.round();
    // `as` saturates: a negative bound holds nothing above 0, a huge one everything.
    if (nanos - nearest).abs() <= nanos.abs() * 1e-12 {
        nearest as u64
    } else {
        nanos.floor() as u64
    }
}

impl Distribution for Histogram {
    /// Per bucket, in order: its upper bound in seconds (`None` for `+Inf`, last) and its own
    /// count (not cumulative).
    fn buckets(&self) -> impl Iterator<Item = (Option<f64>, u64)> {
        let bounds = self.bounds.iter().copied().map(Some).chain([None]);
        bounds.zip(self.bucket_counts())
    }

    /// The sum of all observed durations in seconds, as `_sum` shows it.
    fn sum_seconds(&self) -> f64 {
        // One correctly rounded division, so e.g. 350µs renders as 0.00035, not 0.00035000000000000005.
        self.sum_nanos() as f64 / 1e9
    }
}

/// Two histograms of the same bounds read as one, their buckets and sums added: for a duration
/// observed once, in a histogram of its own, that two series show (see [`Summed::count`]).
#[derive(Debug, Clone, Copy)]
pub struct Summed<'a>(pub &'a Histogram, pub &'a Histogram);

impl Summed<'_> {
    /// How many durations the two have observed.
    pub fn count(&self) -> u64 {
        self.0.count().wrapping_add(self.1.count())
    }
}

impl Distribution for Summed<'_> {
    fn buckets(&self) -> impl Iterator<Item = (Option<f64>, u64)> {
        debug_assert_eq!(
            self.0.bounds, self.1.bounds,
            "summed histograms share bounds"
        );
        let pairs = self.0.buckets().zip(self.1.buckets());
        pairs.map(|((bound, a), (_, b))| (bound, a.wrapping_add(b)))
    }

    fn sum_seconds(&self) -> f64 {
        self.0.sum_nanos().wrapping_add(self.1.sum_nanos()) as f64 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::prometheus::{Exposition, Kind};

    fn lines(out: &str) -> Vec<&str> {
        out.lines().collect()
    }

    /// The sample lines of `h` as the one series of histogram family `name`, with `labels`.
    fn samples(h: &Histogram, name: &str, labels: &[(&str, &str)]) -> String {
        let mut out = String::new();
        Exposition::new(&mut out)
            .family(name, "Test.", Kind::Histogram)
            .histogram(labels, h);
        out.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// The values of every `_bucket` line, in order.
    fn bucket_values(out: &str) -> Vec<u64> {
        out.lines()
            .filter(|l| l.contains("_bucket{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect()
    }

    #[test]
    fn latency_bounds_are_valid() {
        let bounds = Histogram::LATENCY_SECONDS;
        assert!(bounds.iter().all(|b| b.is_finite() && *b > 0.0));
        assert!(bounds.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn tiny_example_renders_exact_lines_without_labels() {
        let h = Histogram::new(&[0.001, 0.01]);
        for micros in [500, 1_000, 5_000, 2_000_000] {
            h.observe(Duration::from_micros(micros));
        }
        let mut out = String::new();
        Exposition::new(&mut out)
            .family("t_seconds", "Test latency.", Kind::Histogram)
            .histogram(&[], &h);
        assert_eq!(
            lines(&out),
            [
                "# HELP t_seconds Test latency.",
                "# TYPE t_seconds histogram",
                r#"t_seconds_bucket{le="0.001"} 2"#,
                r#"t_seconds_bucket{le="0.01"} 3"#,
                r#"t_seconds_bucket{le="+Inf"} 4"#,
                "t_seconds_sum 2.0065",
                "t_seconds_count 4",
            ]
        );
        assert!(out.ends_with('\n'));
    }

    /// Summed, two histograms read as one: each bucket and the sum are the two added, and the
    /// count is every duration either observed.
    #[test]
    fn summed_histograms_add_bucket_by_bucket() {
        let (a, b) = (
            Histogram::new(&[0.001, 0.01]),
            Histogram::new(&[0.001, 0.01]),
        );
        a.observe(Duration::from_micros(500));
        a.observe(Duration::from_millis(20));
        b.observe(Duration::from_millis(5));
        b.observe(Duration::from_micros(700));
        b.observe(Duration::from_micros(300));
        let both = Summed(&a, &b);
        assert_eq!(both.count(), 5);
        let mut out = String::new();
        Exposition::new(&mut out)
            .family("t_seconds", "Test.", Kind::Histogram)
            .histogram(&[], &both);
        assert_eq!(
            lines(&out)[2..],
            [
                r#"t_seconds_bucket{le="0.001"} 3"#,
                r#"t_seconds_bucket{le="0.01"} 4"#,
                r#"t_seconds_bucket{le="+Inf"} 5"#,
                "t_seconds_sum 0.0265",
                "t_seconds_count 5",
            ]
        );
    }

    #[test]
    fn labels_come_before_le() {
        let h = Histogram::new(&[0.5]);
        h.observe(Duration::from_millis(250));
        let out = samples(&h, "op_seconds", &[("store", "redis"), ("op", "decide")]);
        assert_eq!(
            lines(&out),
            [
                r#"op_seconds_bucket{store="redis",op="decide",le="0.5"} 1"#,
                r#"op_seconds_bucket{store="redis",op="decide",le="+Inf"} 1"#,
                r#"op_seconds_sum{store="redis",op="decide"} 0.25"#,
                r#"op_seconds_count{store="redis",op="decide"} 1"#,
            ]
        );
    }

    #[test]
    fn empty_histogram_renders_zeros() {
        let h = Histogram::new(&[1.0]);
        let out = samples(&h, "e", &[]);
        assert_eq!(
            lines(&out),
            [
                r#"e_bucket{le="1"} 0"#,
                r#"e_bucket{le="+Inf"} 0"#,
                "e_sum 0",
                "e_count 0"
            ]
        );
    }

    #[test]
    fn every_latency_bound_holds_its_own_value_and_not_a_nanosecond_more() {
        let bounds = Histogram::LATENCY_SECONDS;
        let micros = [
            10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000,
            250_000, 1_000_000,
        ];
        assert_eq!(bounds.len(), micros.len());
        for (i, (&bound, &micros)) in bounds.iter().zip(&micros).enumerate() {
            let h = Histogram::new(bounds);
            let at = Duration::from_micros(micros);
            h.observe(at);
            h.observe(at + Duration::from_nanos(1));
            let counts: Vec<u64> = h.bucket_counts().collect();
            assert_eq!(
                (counts[i], counts[i + 1]),
                (1, 1),
                "bound {bound}: {counts:?}"
            );
        }
        assert_eq!(nanos_at_most(1.5e-9), 1);
        assert_eq!(nanos_at_most(-1.0), 0);
        assert_eq!(nanos_at_most(1e30), u64::MAX);
    }

    #[test]
    fn a_bound_includes_its_own_value() {
        let h = Histogram::new(Histogram::LATENCY_SECONDS);
        h.observe(Duration::from_micros(100)); // exactly the 0.0001 bound
        h.observe(Duration::ZERO);
        h.observe(Duration::MAX);
        let out = samples(&h, "b", &[]);
        assert!(out.contains("b_bucket{le=\"0.00005\"} 1\n"), "{out}");
        assert!(out.contains("b_bucket{le=\"0.0001\"} 2\n"), "{out}");
        assert!(out.contains("b_bucket{le=\"1\"} 2\n"), "{out}");
        assert!(out.contains("b_bucket{le=\"+Inf\"} 3\n"), "{out}");
    }

    #[test]
    fn buckets_are_cumulative_and_sum_is_right() {
        let h = Histogram::new(Histogram::LATENCY_SECONDS);
        let mut expected_sum = Duration::ZERO;
        let mut n = 0u64;
        // 1µs .. ~3s on a geometric ladder, so every bucket and +Inf get something.
        let mut micros = 1u64;
        while micros < 3_000_000 {
            let d = Duration::from_micros(micros);
            h.observe(d);
            expected_sum += d;
            n += 1;
            micros = micros * 5 / 4 + 1;
        }
        let out = samples(&h, "lat", &[("op", "decide")]);

        let values = bucket_values(&out);
        assert_eq!(values.len(), Histogram::LATENCY_SECONDS.len() + 1);
        assert!(
            values.windows(2).all(|w| w[0] <= w[1]),
            "not monotone: {values:?}"
        );
        assert!(values.windows(2).any(|w| w[0] < w[1]));
        assert_eq!(values.last(), Some(&n), "+Inf equals the count");
        assert!(out.contains(&format!("lat_count{{op=\"decide\"}} {n}\n")));

        // Each cumulative value matches a direct count of observations at or under the bound.
        let mut micros = 1u64;
        let mut observed = Vec::new();
        while micros < 3_000_000 {
            observed.push(Duration::from_micros(micros).as_secs_f64());
            micros = micros * 5 / 4 + 1;
        }
        for (bound, value) in Histogram::LATENCY_SECONDS.iter().zip(&values) {
            let direct = observed.iter().filter(|&&s| s <= *bound).count() as u64;
            assert_eq!(*value, direct, "bucket le={bound}");
        }

        assert_eq!(h.count(), n);
        assert_eq!(h.sum(), expected_sum);
        let sum_line = out.lines().find(|l| l.starts_with("lat_sum")).unwrap();
        let rendered: f64 = sum_line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(
            (rendered - expected_sum.as_secs_f64()).abs() < 1e-9,
            "{sum_line}"
        );
    }

    #[test]
    fn concurrent_observations_are_all_counted() {
        let h = Histogram::new(Histogram::LATENCY_SECONDS);
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let h = &h;
                scope.spawn(move || {
                    for i in 0..10_000u64 {
                        h.observe(Duration::from_micros((i + t) % 2_000));
                    }
                });
            }
        });
        assert_eq!(h.count(), 40_000);
        let expected: u64 = (0..4u64)
            .flat_map(|t| (0..10_000u64).map(move |i| (i + t) % 2_000))
            .sum();
        assert_eq!(h.sum(), Duration::from_micros(expected));
        let out = samples(&h, "c", &[]);
        assert_eq!(bucket_values(&out).last(), Some(&40_000));
        assert!(out.contains("\nc_count 40000\n"));
    }

    /// More threads at once than there are slots of their own: those beyond share one, and
    /// every observation is still counted once.
    #[test]
    fn observations_of_more_threads_than_slots_are_all_counted() {
        // Enough for two threads on one slot to race, were the shared slot's adds not locked.
        const ROUNDS: u64 = 20_000;
        // Other tests must not find every slot taken meanwhile.
        let _slots = thread_slot::EVERY_SLOT.lock();
        let h = Histogram::new(&[0.001]);
        let threads = OWNED + 12;
        let barrier = std::sync::Barrier::new(threads);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                let (h, barrier) = (&h, &barrier);
                scope.spawn(move || {
                    // All alive at once, so that some cannot have a slot of their own.
                    barrier.wait();
                    for _ in 0..ROUNDS {
                        h.observe(Duration::from_micros(3));
                        h.observe(Duration::from_millis(2));
                    }
                    barrier.wait();
                });
            }
        });
        let each = threads as u64 * ROUNDS;
        assert_eq!(h.count(), 2 * each);
        assert_eq!(h.bucket_counts().collect::<Vec<_>>(), [each; 2]);
        assert_eq!(h.sum(), Duration::from_micros(2003 * each));
        assert!(
            h.slots[thread_slot::SHARED].get().is_some(),
            "no thread shared a slot"
        );
    }

    #[test]
    fn a_histogram_writes_cumulative_buckets_sum_and_count() {
        let histogram = Histogram::new(&[0.001, 1.0]);
        histogram.observe(Duration::from_micros(350));
        histogram.observe(Duration::from_secs(2));
        let mut out = String::new();
        let mut text = Exposition::new(&mut out);
        text.family("d_seconds", "Time.", Kind::Histogram)
            .histogram(&[("op", "apply")], &histogram)
            .histogram(&[], &histogram);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "# HELP d_seconds Time.",
                "# TYPE d_seconds histogram",
                "d_seconds_bucket{op=\"apply\",le=\"0.001\"} 1",
                "d_seconds_bucket{op=\"apply\",le=\"1\"} 1",
                "d_seconds_bucket{op=\"apply\",le=\"+Inf\"} 2",
                "d_seconds_sum{op=\"apply\"} 2.00035",
                "d_seconds_count{op=\"apply\"} 2",
                "d_seconds_bucket{le=\"0.001\"} 1",
                "d_seconds_bucket{le=\"1\"} 1",
                "d_seconds_bucket{le=\"+Inf\"} 2",
                "d_seconds_sum 2.00035",
                "d_seconds_count 2",
            ]
        );
    }
}
