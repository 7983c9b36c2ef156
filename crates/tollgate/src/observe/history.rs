//! A few minutes of per-rule decision counts, one sample a second, for the admin dashboard.
//!
//! Decisions are never touched: a background sampler reads the counters that already exist
//! (`Limiter::sample_metrics`: the counters behind `/metrics`, not its text) once per interval
//! and pushes one [`Sample`] into a ring of at most [`History::capacity`] samples. A rate is the difference of
//! two consecutive samples over the time between them, so the cost per decision stays the one
//! atomic add the counters already make, and memory is bounded by the ring's length times the
//! policy's rules.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

/// Samples kept by default: five minutes at one a second.
pub const HISTORY_SAMPLES: usize = 300;

/// Columns counted per rule in a [`Sample`], in this order.
pub const COLUMNS: [&str; 5] = [
    "allowed",
    "denied",
    "shadow_would_deny",
    "soft_exceeded",
    "degraded",
];

/// Index of the degraded column in [`COLUMNS`].
pub const DEGRADED: usize = 4;

/// One rule's counters at one instant, counted since the process started.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleCounts {
    /// The rule's domain.
    pub domain: Arc<str>,
    /// The rule's name.
    pub rule: Arc<str>,
    /// Decisions per column of [`COLUMNS`].
    pub counts: [u64; 5],
}

/// One descriptor value's decisions under a `detailed_metric` rule, since the process started.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueCounts {
    /// The rule's domain.
    pub domain: String,
    /// The rule's name.
    pub rule: String,
    /// The descriptor as `key=value,key=value`.
    pub descriptor: String,
    /// Decisions per outcome: the first four columns of [`COLUMNS`].
    pub counts: [u64; 4],
}

/// A latency histogram's cumulative buckets: `(upper bound in seconds, count at or below)`, the
/// last bound infinite.
pub type Buckets = Vec<(f64, u64)>;

/// The counters the dashboard shows, at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// Per rule, in rendering order.
    pub rules: Vec<RuleCounts>,
    /// Per descriptor value of the `detailed_metric` rules.
    pub values: Vec<ValueCounts>,
    /// Degraded decisions per `(domain, rule, posture)`.
    pub degraded: Vec<(String, String, String, u64)>,
    /// `tollgate_decision_duration_seconds`.
    pub decision_latency: Buckets,
    /// `tollgate_store_operation_duration_seconds{op="apply"}`.
    pub store_latency: Buckets,
    /// `tollgate_requests_total`.
    pub requests: u64,
    /// `tollgate_store_errors_total`.
    pub store_errors: u64,
    /// `tollgate_fail_open_total`.
    pub fail_open: u64,
}

/// `histogram`'s buckets as [`Buckets`]: cumulative, each with its upper bound.
pub fn cumulative(histogram: &impl super::prometheus::Distribution) -> Buckets {
    let mut below = 0;
    histogram
        .buckets()
        .map(|(bound, count)| {
            below += count;
            (bound.unwrap_or(f64::INFINITY), below)
        })
        .collect()
}

#[cfg(test)]
/// The labels of one sample line, unescaped, in order: `(name, value)`.
type Labels<'a> = Vec<(&'a str, String)>;

#[cfg(test)]
/// The labels of one sample line.
fn labels(text: &str) -> Option<Labels<'_>> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches(',');
        if rest.is_empty() {
            return Some(out);
        }
        let (name, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        out.push((name, value));
        rest = &after[end + 1..];
    }
}

#[cfg(test)]
/// A sample line split into its name, labels and value.
fn line(text: &str) -> Option<(&str, Labels<'_>, f64)> {
    let (series, value) = text.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    match series.split_once('{') {
        Some((name, rest)) => Some((name, labels(rest.strip_suffix('}')?)?, value)),
        None => Some((series, Vec::new(), value)),
    }
}

#[cfg(test)]
fn label<'a>(labels: &'a [(&str, String)], name: &str) -> &'a str {
    labels
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, v)| v.as_str())
}

#[cfg(test)]
fn outcome_column(outcome: &str) -> Option<usize> {
    COLUMNS[..4].iter().position(|c| *c == outcome)
}

#[cfg(test)]
fn bound(le: &str) -> f64 {
    if le == "+Inf" {
        f64::INFINITY
    } else {
        le.parse().unwrap_or(f64::INFINITY)
    }
}

#[cfg(test)]
impl Metrics {
    /// Reads the series the dashboard shows out of the Prometheus text the limiter renders
    /// (`Limiter::render_metrics`); other lines are skipped. The sampler reads the counters
    /// directly (`Limiter::sample_metrics`); this reading of the text checks that both agree.
    pub fn parse(text: &str) -> Metrics {
        let mut m = Metrics::default();
        for text in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, labels, value)) = line(text) else {
                continue;
            };
            let count = value as u64;
            match name {
                "tollgate_decisions_total" => {
                    let (domain, rule) = (label(&labels, "domain"), label(&labels, "rule"));
                    let Some(column) = outcome_column(label(&labels, "outcome")) else {
                        continue;
                    };
                    let row = match m.rules.last_mut() {
                        Some(r) if &*r.domain == domain && &*r.rule == rule => r,
                        _ => {
                            m.rules.push(RuleCounts {
                                domain: domain.into(),
                                rule: rule.into(),
                                counts: [0; 5],
                            });
                            let Some(r) = m.rules.last_mut() else {
                                continue;
                            };
                            r
                        }
                    };
                    row.counts[column] = count;
                }
                "tollgate_detailed_decisions_total" => {
                    let Some(column) = outcome_column(label(&labels, "outcome")) else {
                        continue;
                    };
                    let (domain, rule) = (label(&labels, "domain"), label(&labels, "rule"));
                    let descriptor = label(&labels, "descriptor");
                    let row = match m.values.last_mut() {
                        Some(v)
                            if v.domain == domain
                                && v.rule == rule
                                && v.descriptor == descriptor =>
                        {
                            v
                        }
                        _ => {
                            m.values.push(ValueCounts {
                                domain: domain.into(),
                                rule: rule.into(),
                                descriptor: descriptor.into(),
                                counts: [0; 4],
                            });
                            let Some(v) = m.values.last_mut() else {
                                continue;
                            };
                            v
                        }
                    };
                    row.counts[column] = count;
                }
                "tollgate_degraded_decisions_total" => m.degraded.push((
                    label(&labels, "domain").into(),
                    label(&labels, "rule").into(),
                    label(&labels, "posture").into(),
                    count,
                )),
                "tollgate_decision_duration_seconds_bucket" => m
                    .decision_latency
                    .push((bound(label(&labels, "le")), count)),
                "tollgate_store_operation_duration_seconds_bucket"
                    if label(&labels, "op") == "apply" =>
                {
                    m.store_latency.push((bound(label(&labels, "le")), count))
                }
                "tollgate_requests_total" => m.requests = count,
                "tollgate_store_errors_total" => m.store_errors = count,
                "tollgate_fail_open_total" => m.fail_open = count,
                _ => {}
            }
        }
        for (domain, rule, _, count) in &m.degraded {
            if let Some(r) = m
                .rules
                .iter_mut()
                .find(|r| &*r.domain == domain && &*r.rule == rule)
            {
                r.counts[DEGRADED] += count;
            }
        }
        m
    }
}

/// The counters at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Per rule of the policy then running.
    pub rules: Vec<RuleCounts>,
    /// Decision latency buckets.
    pub decision_latency: Buckets,
    /// Store call latency buckets.
    pub store_latency: Buckets,
    /// Store errors so far.
    pub store_errors: u64,
    /// Requests allowed by an `open` posture so far.
    pub fail_open: u64,
}

impl Sample {
    /// The sample of `metrics` taken at `at_ms`.
    pub fn of(metrics: Metrics, at_ms: u64) -> Sample {
        Sample {
            at_ms,
            rules: metrics.rules,
            decision_latency: metrics.decision_latency,
            store_latency: metrics.store_latency,
            store_errors: metrics.store_errors,
            fail_open: metrics.fail_open,
        }
    }
}

/// One rule's per-second rates over the history.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSeries {
    /// The rule's domain.
    pub domain: Arc<str>,
    /// The rule's name.
    pub rule: Arc<str>,
    /// Per column of [`COLUMNS`], decisions per second between consecutive samples, oldest
    /// first, one per entry of [`Series::at_ms`] (0 before the rule existed).
    pub rates: [Vec<f64>; 5],
    /// Per column, decisions since the process started, at the newest sample.
    pub totals: [u64; 5],
}

/// The rates of every rule over the history.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// When each rate ends, milliseconds since the Unix epoch, oldest first.
    pub at_ms: Vec<u64>,
    /// Per rule of the newest sample.
    pub rules: Vec<RuleSeries>,
    /// Store errors per second.
    pub store_errors: Vec<f64>,
    /// Fail-open decisions per second.
    pub fail_open: Vec<f64>,
}

/// A latency histogram's quantiles over a stretch of the history.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantiles {
    /// Observations in the stretch.
    pub count: u64,
    /// Upper bound of the bucket holding the median, in seconds (infinite: above the last).
    pub p50: f64,
    /// Upper bound of the bucket holding the 99th percentile, in seconds.
    pub p99: f64,
}

/// The ring of samples.
#[derive(Debug)]
pub struct History {
    capacity: usize,
    samples: Mutex<VecDeque<Sample>>,
}

impl Default for History {
    fn default() -> Self {
        History::new(HISTORY_SAMPLES)
    }
}

fn rate(newer: u64, older: u64, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        0.0
    } else {
        newer.saturating_sub(older) as f64 / seconds
    }
}

/// The quantile `q` of the observations between two cumulative bucket lists.
fn quantile(newer: &Buckets, older: Option<&Buckets>, q: f64) -> (u64, f64) {
    let before = |i: usize| older.and_then(|o| o.get(i)).map_or(0, |(_, c)| *c);
    let total = newer
        .last()
        .map_or(0, |(_, c)| *c)
        .saturating_sub(older.and_then(|o| o.last()).map_or(0, |(_, c)| *c));
    if total == 0 {
        return (0, 0.0);
    }
    let wanted = (q * total as f64).ceil().max(1.0) as u64;
    for (i, (bound, count)) in newer.iter().enumerate() {
        if count.saturating_sub(before(i)) >= wanted {
            return (total, *bound);
        }
    }
    (total, f64::INFINITY)
}

impl History {
    /// An empty ring keeping at most `capacity` samples (at least 2).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(2);
        History {
            capacity,
            samples: Mutex::new(VecDeque::with_capacity(capacity)),
        }
    }

    /// Most samples kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Samples held now.
    pub fn len(&self) -> usize {
        self.samples.lock().len()
    }

    /// Whether no sample was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `sample`, dropping the oldest when full. A rule's names are shared with the
    /// previous sample's when they are the same, so a long history of a steady policy holds
    /// each name once.
    pub fn push(&self, mut sample: Sample) {
        let mut samples = self.samples.lock();
        if let Some(previous) = samples.back() {
            for (row, old) in sample.rules.iter_mut().zip(&previous.rules) {
                if row.domain == old.domain && row.rule == old.rule {
                    row.domain = old.domain.clone();
                    row.rule = old.rule.clone();
                }
            }
        }
        if samples.len() == self.capacity {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// Per-second rates between consecutive samples, for every rule of the newest sample.
    pub fn series(&self) -> Series {
        let samples = self.samples.lock();
        let Some(newest) = samples.back() else {
            return Series::default();
        };
        let pairs: Vec<(&Sample, &Sample)> = samples.iter().zip(samples.iter().skip(1)).collect();
        let seconds = |(a, b): &(&Sample, &Sample)| b.at_ms.saturating_sub(a.at_ms) as f64 / 1e3;
        let rules = newest
            .rules
            .iter()
            .map(|r| {
                let find = |s: &Sample| {
                    s.rules
                        .iter()
                        .find(|o| o.domain == r.domain && o.rule == r.rule)
                        .map(|o| o.counts)
                };
                let mut rates: [Vec<f64>; 5] = Default::default();
                for pair in &pairs {
                    let (a, b) = (find(pair.0), find(pair.1));
                    for (column, out) in rates.iter_mut().enumerate() {
                        out.push(match (a, b) {
                            (Some(a), Some(b)) => rate(b[column], a[column], seconds(pair)),
                            _ => 0.0,
                        });
                    }
                }
                RuleSeries {
                    domain: r.domain.clone(),
                    rule: r.rule.clone(),
                    rates,
                    totals: r.counts,
                }
            })
            .collect();
        Series {
            at_ms: pairs.iter().map(|(_, b)| b.at_ms).collect(),
            rules,
            store_errors: pairs
                .iter()
                .map(|p| rate(p.1.store_errors, p.0.store_errors, seconds(p)))
                .collect(),
            fail_open: pairs
                .iter()
                .map(|p| rate(p.1.fail_open, p.0.fail_open, seconds(p)))
                .collect(),
        }
    }

    /// Decision and store latency quantiles over the last `window_ms` (or all the history).
    pub fn latency(&self, window_ms: u64) -> Option<(Quantiles, Quantiles)> {
        let samples = self.samples.lock();
        let newest = samples.back()?;
        let since = newest.at_ms.saturating_sub(window_ms);
        let oldest = samples.iter().find(|s| s.at_ms >= since)?;
        let older = (!std::ptr::eq(oldest, newest)).then_some(oldest);
        let of = |newer: &Buckets, older: Option<&Buckets>| {
            let (count, p50) = quantile(newer, older, 0.5);
            let (_, p99) = quantile(newer, older, 0.99);
            Quantiles { count, p50, p99 }
        };
        Some((
            of(&newest.decision_latency, older.map(|o| &o.decision_latency)),
            of(&newest.store_latency, older.map(|o| &o.store_latency)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP tollgate_decisions_total x
# TYPE tollgate_decisions_total counter
tollgate_decisions_total{domain="api",rule="per_tenant",outcome="allowed"} 7
tollgate_decisions_total{domain="api",rule="per_tenant",outcome="denied"} 3
tollgate_decisions_total{domain="api",rule="per_tenant",outcome="shadow_would_deny"} 0
tollgate_decisions_total{domain="api",rule="per_tenant",outcome="soft_exceeded"} 0
tollgate_decisions_total{domain="api",rule="q\"uo\\te",outcome="shadow_would_deny"} 2
tollgate_detailed_decisions_total{domain="api",rule="per_tenant",descriptor="tenant=a\\,b",outcome="allowed"} 5
tollgate_detailed_decisions_total{domain="api",rule="per_tenant",descriptor="tenant=a\\,b",outcome="denied"} 1
tollgate_degraded_decisions_total{domain="api",rule="per_tenant",posture="open"} 4
tollgate_degraded_decisions_total{domain="api",rule="per_tenant",posture="closed"} 1
tollgate_requests_total 12
tollgate_decision_duration_seconds_bucket{le="0.001"} 90
tollgate_decision_duration_seconds_bucket{le="0.01"} 99
tollgate_decision_duration_seconds_bucket{le="+Inf"} 100
tollgate_store_operation_duration_seconds_bucket{store="memory",op="peek",le="+Inf"} 5
tollgate_store_operation_duration_seconds_bucket{store="memory",op="apply",le="+Inf"} 6
"#;

    #[test]
    fn the_rendered_counters_are_read_back() {
        let m = Metrics::parse(TEXT);
        assert_eq!(m.rules.len(), 2);
        assert_eq!(&*m.rules[0].rule, "per_tenant");
        assert_eq!(m.rules[0].counts, [7, 3, 0, 0, 5]);
        assert_eq!(&*m.rules[1].rule, "q\"uo\\te");
        assert_eq!(m.rules[1].counts, [0, 0, 2, 0, 0]);
        assert_eq!(m.values.len(), 1);
        assert_eq!(m.values[0].descriptor, "tenant=a\\,b");
        assert_eq!(m.values[0].counts, [5, 1, 0, 0]);
        assert_eq!(m.requests, 12);
        assert_eq!(m.decision_latency.len(), 3);
        assert_eq!(m.store_latency, vec![(f64::INFINITY, 6)]);
    }

    fn sample(at_ms: u64, allowed: u64, buckets: [u64; 3]) -> Sample {
        Sample {
            at_ms,
            rules: vec![RuleCounts {
                domain: "api".into(),
                rule: "r".into(),
                counts: [allowed, 0, 0, 0, 0],
            }],
            decision_latency: vec![
                (0.001, buckets[0]),
                (0.01, buckets[1]),
                (f64::INFINITY, buckets[2]),
            ],
            store_latency: Vec::new(),
            store_errors: 0,
            fail_open: 0,
        }
    }

    #[test]
    fn rates_are_differences_over_the_time_between_samples() {
        let history = History::new(3);
        history.push(sample(1_000, 0, [0, 0, 0]));
        history.push(sample(2_000, 10, [0, 0, 0]));
        history.push(sample(4_000, 30, [0, 0, 0]));
        let series = history.series();
        assert_eq!(series.at_ms, vec![2_000, 4_000]);
        assert_eq!(series.rules[0].rates[0], vec![10.0, 10.0]);
        assert_eq!(series.rules[0].totals[0], 30);
        // Bounded: the oldest goes.
        history.push(sample(5_000, 35, [0, 0, 0]));
        assert_eq!(history.len(), 3);
        assert_eq!(history.series().rules[0].rates[0], vec![10.0, 5.0]);
    }

    #[test]
    fn quantiles_cover_the_window_only() {
        let history = History::new(10);
        // Before the window: slow decisions.
        history.push(sample(0, 0, [0, 0, 0]));
        history.push(sample(10_000, 0, [0, 0, 100]));
        // In it: 99 fast, 1 at most 10 ms.
        history.push(sample(20_000, 0, [99, 100, 200]));
        let (decision, store) = history.latency(10_000).expect("samples");
        assert_eq!(decision.count, 100);
        assert_eq!(decision.p50, 0.001);
        assert_eq!(decision.p99, 0.001);
        assert_eq!(store.count, 0);
        let (all, _) = history.latency(u64::MAX).expect("samples");
        assert_eq!(all.count, 200);
        assert_eq!(all.p50, 0.01);
        assert_eq!(all.p99, f64::INFINITY);
    }
}
