//! What the limiter counts and times about its own work: requests, store errors, the open
//! posture's admissions, invalid requests, the prefilter's and local budgets' savings, and
//! the latency of decisions and store calls; and the Prometheus text it renders.

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_core::Timestamp;
use tracing::warn;

use super::candidate::Candidate;
use super::response::CheckResponse;
use super::snapshot::Snapshot;
use crate::leases::HotKeys;
use crate::metrics::Outcome;
use crate::observe::history::{COLUMNS, DEGRADED, Metrics, RuleCounts, ValueCounts, cumulative};
use crate::observe::prometheus::{Exposition, Kind};
use crate::observe::{Histogram, Summed};
use crate::policy::posture_of;
use crate::resilience::Posture;
use crate::store::{Granting, Store, StoreBackend, StoreError, Timed};

/// Check requests decided.
pub const REQUESTS: &str = "tollgate_requests_total";

/// Decisions the store could not make.
pub const STORE_ERRORS: &str = "tollgate_store_errors_total";

/// Requests an `open` posture allowed.
pub const FAIL_OPEN: &str = "tollgate_fail_open_total";

/// The time to decide a check request (a histogram).
pub const DECISION_DURATION: &str = "tollgate_decision_duration_seconds";

/// Store calls by backend and operation (a histogram).
pub const STORE_OPERATION_DURATION: &str = "tollgate_store_operation_duration_seconds";

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
    /// Decisions timed apart from their store call (see `in_place`).
    pub decision_latency: Histogram,
    /// Charged decisions on the memory store, which calls it in place: each is timed once, and
    /// counted both as a decision and as the store's `apply` call (the two would be the same
    /// duration, observed twice: twice the adds). Every check is timed in one of the two, so
    /// their count is the requests decided.
    pub in_place: Histogram,
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
            in_place: Histogram::new(Histogram::LATENCY_SECONDS),
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
    /// The latency of every decision.
    fn decisions(&self) -> Summed<'_> {
        Summed(&self.decision_latency, &self.in_place)
    }

    /// The latency of the store's `apply` calls, which the `Timed` layer timed in `timed`.
    fn store_applies<'a>(&'a self, timed: &'a Histogram) -> Summed<'a> {
        Summed(timed, &self.in_place)
    }

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
    /// the store is not asked anything (a key count on Redis is a call). A row per rule with a
    /// limit, and each rule's degraded decisions under its posture (its own, else
    /// `default_posture`), as `/metrics` shows them. A row's columns read every counter the
    /// rule has, so they never go down when a reload changes its mode or posture (where
    /// `/metrics` stops showing the series the rule no longer produces).
    pub fn sample(
        &self,
        snapshot: &Snapshot,
        default_posture: Posture,
        store_latency: &[Histogram; 2],
    ) -> Metrics {
        let (policy, counters) = (&snapshot.policy, &snapshot.counters);
        let mut m = Metrics::default();
        for rule in policy.rules().iter().filter(|r| r.limit.is_some()) {
            let mut counts = [0; COLUMNS.len()];
            for outcome in Outcome::ALL {
                counts[outcome as usize] = counters.get(rule.index, outcome);
            }
            counts[DEGRADED] = Posture::ALL
                .into_iter()
                .map(|p| counters.degraded(rule.index, p))
                .sum();
            let posture = posture_of(Some(rule), default_posture);
            m.degraded.push((
                rule.domain.clone(),
                rule.name.clone(),
                posture.name().to_owned(),
                counters.degraded(rule.index, posture),
            ));
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
        m.decision_latency = cumulative(&self.decisions());
        m.store_latency = cumulative(&self.store_applies(&store_latency[0]));
        m.requests = self.decisions().count();
        m.store_errors = self.store_errors.load(Ordering::Relaxed);
        m.fail_open = self.fail_open.load(Ordering::Relaxed);
        m
    }

    /// Prometheus text for the decision counters and store gauges; a rule's degraded decisions
    /// are shown under its posture, its own or else `default_posture`.
    pub async fn render_metrics(
        &self,
        snapshot: &Snapshot,
        default_posture: Posture,
        candidate: Option<&Candidate>,
        hot_keys: &HotKeys<Timed<StoreBackend>>,
    ) -> String {
        let (prefilter, leases) = (hot_keys.prefilter(), hot_keys.leases());
        let store = hot_keys.inner().inner();
        let mut out = String::new();
        snapshot
            .counters
            .render(&snapshot.policy, default_posture, &mut out);
        if let Some(candidate) = candidate {
            candidate.render_metrics(&mut out);
        }
        let mut text = Exposition::new(&mut out);
        text.family(
            REQUESTS,
            "Check requests decided (a request refused as malformed is not counted).",
            Kind::Counter,
        )
        .sample(&[], self.decisions().count());
        let counters = [
            (
                STORE_ERRORS,
                "Decisions the store could not make.",
                &self.store_errors,
            ),
            (
                FAIL_OPEN,
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
            text.family(name, help, Kind::Counter)
                .sample(&[], value.load(Ordering::Relaxed));
        }
        let mut invalid = text.family(
            "tollgate_invalid_requests_total",
            "Requests refused as invalid (HTTP 400, gRPC INVALID_ARGUMENT); nothing was counted for them.",
            Kind::Counter,
        );
        for over in Transport::ALL {
            let count = self.invalid[over as usize].load(Ordering::Relaxed);
            invalid.sample(&[("transport", over.name())], count);
        }
        if let Some(prefilter) = prefilter {
            text.family(
                "tollgate_prefilter_entries",
                "Store denials remembered by the prefilter.",
                Kind::Gauge,
            )
            .sample(&[], prefilter.len());
        }
        let mut breakers = text.family(
            "tollgate_breaker_state",
            "Circuit breaker per store node: 0 closed, 1 half-open, 2 open.",
            Kind::Gauge,
        );
        for (node, state) in store.breakers() {
            breakers.sample(&[("node", node.as_str())], state.gauge());
        }
        text.family(
            DECISION_DURATION,
            "Time to decide a check request, store included.",
            Kind::Histogram,
        )
        .histogram(&[], &self.decisions());
        let kind = store.kind();
        let lease_ops = store.shared().then(|| leases.store_latency());
        let [apply, peek] = hot_keys.inner().latency();
        let mut store_ops = text.family(
            STORE_OPERATION_DURATION,
            "Store calls by backend and operation.",
            Kind::Histogram,
        );
        store_ops.histogram(
            &[("store", kind), ("op", "apply")],
            &self.store_applies(apply),
        );
        store_ops.histogram(&[("store", kind), ("op", "peek")], peek);
        for (op, histogram) in lease_ops.into_iter().flatten() {
            store_ops.histogram(&[("store", kind), ("op", op)], histogram);
        }
        if store.shared() {
            let mut failures = text.family(
                "tollgate_local_budget_store_failures_total",
                "Local-budget store calls that failed: a reservation that timed out after Redis ran it strands its units, a failed give-back leaves them charged (under the limit until the counter resets).",
                Kind::Counter,
            );
            for (op, count) in leases.store_failures() {
                failures.sample(&[("op", op)], count);
            }
        }
        if let Some((batches, decisions)) = store.batch_stats() {
            text.family(
                "tollgate_store_batches_total",
                "Script calls that carried coalesced decisions to Redis.",
                Kind::Counter,
            )
            .sample(&[], batches);
            text.family(
                "tollgate_store_batched_decisions_total",
                "Decisions those calls carried (divide by batches: the mean batch size).",
                Kind::Counter,
            )
            .sample(&[], decisions);
        }
        if let Ok(keys) = store.key_count().await {
            Exposition::new(&mut out)
                .family("tollgate_store_keys", "Keys in the store.", Kind::Gauge)
                .sample(&[("store", kind)], keys);
        }
        if let Some(bytes) = store.memory().and_then(|memory| memory.bytes()) {
            Exposition::new(&mut out)
                .family(
                    "tollgate_store_bytes",
                    "Bytes the memory store's keys are estimated to hold (counted only under --memory-max-bytes).",
                    Kind::Gauge,
                )
                .sample(&[("store", "memory")], bytes);
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
        // A row per rule with a limit: `internal` (unlimited) decides nothing.
        assert_eq!(sampled.rules.len(), 3);
        assert_eq!(sampled.degraded.len(), 3, "one posture each");
    }
}
