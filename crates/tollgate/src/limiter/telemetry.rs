//! What the limiter counts and times about its own work: requests, store errors, the open
//! posture's admissions, invalid requests, the prefilter's and local budgets' savings, and
//! the latency of decisions and store calls; and the Prometheus text it renders.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_core::Timestamp;
use tracing::warn;

use super::candidate::Candidate;
use super::response::CheckResponse;
use super::snapshot::Snapshot;
use crate::leases::HotKeys;
use crate::metrics::Outcome;
use crate::observe::Histogram;
use crate::observe::history::{COLUMNS, DEGRADED, Metrics, RuleCounts, ValueCounts, cumulative};
use crate::resilience::Posture;
use crate::store::{Store, StoreBackend, StoreError};

/// How a request reached the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Envoy RLS v3 over gRPC.
    Grpc,
    /// The HTTP/JSON API.
    Http,
}

impl Transport {
    pub const ALL: [Transport; 2] = [Transport::Grpc, Transport::Http];

    /// Its name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Http => "http",
        }
    }
}

/// The limiter's own counters, histograms and log throttles.
#[derive(Debug)]
pub(super) struct Telemetry {
    pub decision_latency: Histogram,
    /// Store call latency: `[apply, peek]`.
    pub store_latency: [Histogram; 2],
    pub requests: AtomicU64,
    store_errors: AtomicU64,
    fail_open: AtomicU64,
    /// When a store error was last logged (microseconds), so an outage cannot flood the log.
    last_error_log: AtomicU64,
    /// Requests refused as invalid, per [`Transport`].
    invalid: [AtomicU64; 2],
    /// When an invalid request was last logged (microseconds).
    last_invalid_log: AtomicU64,
    pub prefilter_denials: AtomicU64,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            decision_latency: Histogram::new(Histogram::LATENCY_SECONDS),
            store_latency: [
                Histogram::new(Histogram::LATENCY_SECONDS),
                Histogram::new(Histogram::LATENCY_SECONDS),
            ],
            requests: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
            fail_open: AtomicU64::new(0),
            last_error_log: AtomicU64::new(0),
            invalid: Default::default(),
            last_invalid_log: AtomicU64::new(0),
            prefilter_denials: AtomicU64::new(0),
        }
    }
}

impl Telemetry {
    /// Counts a decision the store could not make, and logs it at most once a second.
    pub fn note_store_error(&self, error: &StoreError, now: Timestamp) {
        let errors = self.store_errors.fetch_add(1, Ordering::Relaxed) + 1;
        if log_due(&self.last_error_log, now) {
            // The total since the start, as `tollgate_store_errors_total` counts it.
            warn!(error = %error, errors_total = errors, "Store could not decide; failure postures answer");
        }
    }

    /// Counts a request refused as invalid over `over`, and logs it at most once a second.
    pub fn note_invalid(&self, over: Transport, why: &dyn std::fmt::Display, now: Timestamp) {
        let invalid = self.invalid[over as usize].fetch_add(1, Ordering::Relaxed) + 1;
        if log_due(&self.last_invalid_log, now) {
            warn!(transport = over.name(), error = %why, invalid_total = invalid, "Invalid request refused");
        }
    }

    /// Counts `response` among the requests the open posture let through: any limit it let
    /// through counts, whatever other postures answered.
    pub fn note_answer(&self, response: &CheckResponse, commit: bool) {
        if commit
            && response.allowed()
            && response
                .statuses
                .iter()
                .any(|s| s.degraded == Some(Posture::Open))
        {
            self.fail_open.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counters the dashboard's history samples, read directly: no text is rendered and
    /// the store is not asked anything (a key count on Redis is a call).
    pub fn sample(&self, snapshot: &Snapshot) -> Metrics {
        let (policy, counters) = (&snapshot.policy, &snapshot.counters);
        let mut m = Metrics::default();
        for rule in policy.rules() {
            let mut counts = [0; COLUMNS.len()];
            for outcome in Outcome::ALL {
                counts[outcome as usize] = counters.get(rule.index, outcome);
            }
            if rule.limit.is_some() {
                for posture in Posture::ALL {
                    let count = counters.degraded(rule.index, posture);
                    counts[DEGRADED] += count;
                    m.degraded.push((
                        rule.domain.clone(),
                        rule.name.clone(),
                        posture.name().to_owned(),
                        count,
                    ));
                }
            }
            m.rules.push(RuleCounts {
                domain: rule.domain.as_str().into(),
                rule: rule.name.as_str().into(),
                counts,
            });
            if rule.detailed_metric {
                m.values.extend(counters.values(rule.index).into_iter().map(
                    |(descriptor, counts)| ValueCounts {
                        domain: rule.domain.clone(),
                        rule: rule.name.clone(),
                        descriptor: descriptor.into(),
                        counts,
                    },
                ));
            }
        }
        m.decision_latency = cumulative(&self.decision_latency);
        m.store_latency = cumulative(&self.store_latency[0]);
        m.requests = self.requests.load(Ordering::Relaxed);
        m.store_errors = self.store_errors.load(Ordering::Relaxed);
        m.fail_open = self.fail_open.load(Ordering::Relaxed);
        m
    }

    /// Prometheus text for the decision counters and store gauges.
    pub async fn render_metrics(
        &self,
        snapshot: &Snapshot,
        candidate: Option<&Candidate>,
        hot_keys: &HotKeys,
        store: &StoreBackend,
    ) -> String {
        let (prefilter, leases) = (hot_keys.prefilter(store), hot_keys.leases());
        let mut out = String::new();
        snapshot.counters.render(&snapshot.policy, &mut out);
        if let Some(candidate) = candidate {
            candidate.render_metrics(&mut out);
        }
        out.push_str("# HELP tollgate_requests_total Check requests decided (a request refused as malformed is not counted).\n");
        out.push_str("# TYPE tollgate_requests_total counter\n");
        let _ = writeln!(
            out,
            "tollgate_requests_total {}",
            self.requests.load(Ordering::Relaxed)
        );
        let counters = [
            (
                "tollgate_store_errors_total",
                "Decisions the store could not make.",
                &self.store_errors,
            ),
            (
                "tollgate_fail_open_total",
                "Requests allowed by an `open` posture while the store could not decide.",
                &self.fail_open,
            ),
            (
                "tollgate_prefilter_denials_total",
                "Requests denied from a remembered store denial, without calling the store.",
                &self.prefilter_denials,
            ),
            (
                "tollgate_local_budget_admissions_total",
                "Limits admitted from a local budget already reserved, without calling the store.",
                hot_keys.local_admissions(),
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
        let name = "tollgate_invalid_requests_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests refused as invalid (HTTP 400, gRPC INVALID_ARGUMENT); nothing was counted for them.\n# TYPE {name} counter"
        );
        for over in Transport::ALL {
            let count = self.invalid[over as usize].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{transport=\"{}\"}} {count}", over.name());
        }
        if let Some(prefilter) = prefilter {
            let name = "tollgate_prefilter_entries";
            let _ = writeln!(
                out,
                "# HELP {name} Store denials remembered by the prefilter.\n# TYPE {name} gauge\n{name} {}",
                prefilter.len()
            );
        }
        out.push_str("# HELP tollgate_breaker_state Circuit breaker per store node: 0 closed, 1 half-open, 2 open.\n");
        out.push_str("# TYPE tollgate_breaker_state gauge\n");
        for (node, state) in store.breakers() {
            let node = crate::metrics::escape_label(&node);
            let _ = writeln!(
                out,
                "tollgate_breaker_state{{node=\"{node}\"}} {}",
                state.gauge()
            );
        }
        let decision = "tollgate_decision_duration_seconds";
        Histogram::render_header(
            decision,
            "Time to decide a check request, store included.",
            &mut out,
        );
        self.decision_latency.render(decision, "", &mut out);
        let store_op = "tollgate_store_operation_duration_seconds";
        Histogram::render_header(store_op, "Store calls by backend and operation.", &mut out);
        let kind = store.kind();
        let lease_ops = store.redis().map(|_| leases.store_latency());
        let ops = ["apply", "peek"].into_iter().zip(&self.store_latency);
        for (op, histogram) in ops.chain(lease_ops.into_iter().flatten()) {
            histogram.render(store_op, &format!("store=\"{kind}\",op=\"{op}\""), &mut out);
        }
        if store.redis().is_some() {
            let name = "tollgate_local_budget_store_failures_total";
            let _ = writeln!(
                out,
                "# HELP {name} Local-budget store calls that failed: a reservation that timed out after Redis ran it strands its units, a failed give-back leaves them charged (under the limit until the counter resets).\n# TYPE {name} counter"
            );
            for (op, failures) in leases.store_failures() {
                let _ = writeln!(out, "{name}{{op=\"{op}\"}} {failures}");
            }
        }
        if let Some(redis) = store.redis()
            && let Some((batches, decisions)) = redis.batch_stats()
        {
            let name = "tollgate_store_batches_total";
            let help = "Script calls that carried coalesced decisions to Redis.";
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {batches}"
            );
            let name = "tollgate_store_batched_decisions_total";
            let help = "Decisions those calls carried (divide by batches: the mean batch size).";
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {decisions}"
            );
        }
        if let Ok(keys) = store.key_count().await {
            out.push_str("# HELP tollgate_store_keys Keys in the store.\n");
            out.push_str("# TYPE tollgate_store_keys gauge\n");
            let _ = writeln!(
                out,
                "tollgate_store_keys{{store=\"{}\"}} {keys}",
                store.kind()
            );
        }
        out
    }
}

/// Whether a line rate-limited by `last` (when it was last written, in microseconds) is due
/// at `now`: at most one a second, however many events call for it.
fn log_due(last: &AtomicU64, now: Timestamp) -> bool {
    let now = now.as_micros();
    let then = last.load(Ordering::Relaxed);
    now.saturating_sub(then) >= 1_000_000
        && last
            .compare_exchange(then, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tollgate_core::Timestamp;

    use crate::clock::ManualClock;
    use crate::limiter::{CheckRequest, FailureSettings, Limiter, RequestDescriptor};
    use crate::observe::history::Metrics;
    use crate::policy::Policy;
    use crate::store::{MemoryStore, StoreBackend};

    const POLICY: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
    detailed_metric: true
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 1, mode: shadow}
  - key: burst
    rate_limit: {name: soft_burst, unit: minute, requests_per_unit: 1, mode: soft}
  - key: internal
    rate_limit: {unlimited: true}
";

    /// What the sampler reads directly is what `/metrics` shows: the dashboard and Prometheus
    /// never disagree.
    #[tokio::test]
    async fn the_sample_reads_what_the_metrics_text_shows() {
        let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
            1_700_000_040_000_000,
        )));
        let store = StoreBackend::Memory(MemoryStore::new(clock.clone()));
        let policy = Policy::from_yaml("p.yaml", POLICY).unwrap();
        let limiter =
            Limiter::with_failure_settings(policy, store, FailureSettings::default(), clock);
        for (key, value) in [
            ("user", "alice"),
            ("user", "alice"),
            ("user", "alice"),
            ("user", "bob"),
            ("tenant", "acme"),
            ("tenant", "acme"),
            ("burst", "x"),
            ("burst", "x"),
            ("internal", "y"),
        ] {
            let entries = vec![(key.to_owned(), value.to_owned())];
            let descriptor = RequestDescriptor::new(entries, 1, None).unwrap();
            let request = CheckRequest::new("api".into(), vec![descriptor]).unwrap();
            limiter.check(&request).await.unwrap();
        }
        let sampled = limiter.sample_metrics();
        assert_eq!(sampled, Metrics::parse(&limiter.render_metrics().await));
        // And the sample is not empty: alice's third was denied, counted per value.
        let alice = sampled.values.iter().find(|v| v.descriptor == "user=alice");
        assert_eq!(alice.map(|v| v.counts), Some([2, 1, 0, 0]));
        assert_eq!(sampled.requests, 9);
        assert_eq!(sampled.rules.len(), 4);
    }
}
