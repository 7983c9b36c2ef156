//! The [`Limiter`]: matches a request against the policy, charges the store, builds the answer.

mod fallback;
mod keys;
mod request;
mod response;

use std::fmt::Write;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use tollgate_core::Verdict;
use tracing::warn;

pub use fallback::FailureSettings;
pub use request::{
    CheckRequest, InvalidRequest, LimitOverride, MAX_COST, MAX_DESCRIPTORS, MAX_ENTRIES,
    MAX_FIELD_LEN, RequestDescriptor, check_cost,
};
pub use response::{AppliedLimit, CheckResponse, Code, DescriptorStatus};

use self::fallback::Fallback;
use crate::clock::{SharedClock, SystemClock};
use crate::metrics::{Outcome, RuleCounters};
use crate::policy::{Policy, Rule};
use crate::resilience::Posture;
use crate::store::{Charge, Store, StoreBackend, StoreError};

/// Why a request could not be decided. A store failure is not one of them: the failure
/// postures answer instead (see [`FailureSettings`]).
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The request is malformed; nothing was counted.
    #[error("invalid request: {0}")]
    Invalid(#[from] InvalidRequest),
}

/// A policy together with its per-rule counters, swapped as one unit.
#[derive(Debug)]
struct Snapshot {
    policy: Arc<Policy>,
    counters: RuleCounters,
}

/// Decides requests against the current policy using one store.
#[derive(Debug)]
pub struct Limiter {
    snapshot: ArcSwap<Snapshot>,
    store: StoreBackend,
    fallback: Fallback,
    clock: SharedClock,
    requests: AtomicU64,
    store_errors: AtomicU64,
    fail_open: AtomicU64,
    /// When a store error was last logged (microseconds), so an outage cannot flood the log.
    last_error_log: AtomicU64,
}

impl Limiter {
    /// A limiter over `store` enforcing `policy`, with the default failure settings (`open`).
    pub fn new(policy: Policy, store: StoreBackend) -> Self {
        let clock = Arc::new(SystemClock::new());
        Self::with_failure_settings(policy, store, FailureSettings::default(), clock)
    }

    /// A limiter with explicit failure settings; `clock` drives the `local` posture's store.
    pub fn with_failure_settings(
        policy: Policy,
        store: StoreBackend,
        settings: FailureSettings,
        clock: SharedClock,
    ) -> Self {
        Limiter {
            snapshot: ArcSwap::from_pointee(Self::snapshot(policy)),
            store,
            fallback: Fallback::new(settings, clock.clone()),
            clock,
            requests: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
            fail_open: AtomicU64::new(0),
            last_error_log: AtomicU64::new(0),
        }
    }

    /// The server-wide failure settings.
    pub fn failure_settings(&self) -> &FailureSettings {
        &self.fallback.settings
    }

    /// The in-process store of the `local` posture (for sweeping and tests).
    pub fn local_store(&self) -> &crate::store::MemoryStore {
        self.fallback.local_store()
    }

    fn snapshot(policy: Policy) -> Snapshot {
        let counters = RuleCounters::for_policy(&policy);
        Snapshot {
            policy: Arc::new(policy),
            counters,
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<Policy> {
        self.snapshot.load().policy.clone()
    }

    /// Replaces the policy atomically; requests in flight finish on the old one.
    pub fn replace_policy(&self, policy: Policy) {
        self.snapshot.store(Arc::new(Self::snapshot(policy)));
    }

    /// The store.
    pub fn store(&self) -> &StoreBackend {
        &self.store
    }

    /// Decides one request. A denial is `Ok` with `overall == OverLimit`; `Err` means the
    /// request could not be decided.
    pub async fn check(&self, request: &CheckRequest) -> Result<CheckResponse, LimitError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let snapshot = self.snapshot.load();
        let policy = &snapshot.policy;
        let descriptors = request.descriptors();

        let mut limits: Vec<Option<AppliedLimit>> = Vec::with_capacity(descriptors.len());
        for d in descriptors {
            limits.push(match d.limit_override() {
                Some(o) => {
                    // Configured rules were checked against the store at load time; a limit
                    // sent by the caller is checked here.
                    self.store.supports(&o.params).map_err(InvalidRequest)?;
                    Some(AppliedLimit::Override(o.params))
                }
                None => policy
                    .find(request.domain(), d.entries())
                    .filter(|rule| rule.limit.is_some())
                    .map(|rule| AppliedLimit::Rule(rule.clone())),
            });
        }
        drop_replaced(&mut limits);

        // Build every key into one buffer, then borrow slices of it for the charges.
        let mut key_buf = Vec::with_capacity(64 * descriptors.len());
        let mut spans: Vec<(usize, Range<usize>)> = Vec::with_capacity(descriptors.len());
        for (i, (descriptor, limit)) in descriptors.iter().zip(&limits).enumerate() {
            let start = key_buf.len();
            match limit {
                Some(AppliedLimit::Rule(rule)) => {
                    keys::rule_key(&mut key_buf, &rule.identity, descriptor)
                }
                Some(AppliedLimit::Override(params)) => {
                    keys::override_key(&mut key_buf, request.domain(), descriptor, params)
                }
                None => continue,
            }
            spans.push((i, start..key_buf.len()));
        }
        let charges: Vec<Charge<'_>> = spans
            .iter()
            .filter_map(|(i, span)| {
                let limit = limits[*i].as_ref()?;
                Some(Charge {
                    key: &key_buf[span.clone()],
                    params: limit.params()?,
                    cost: descriptors[*i].cost(),
                    enforce: !matches!(limit, AppliedLimit::Rule(rule) if rule.shadow),
                })
            })
            .collect();

        let (decisions, postures) = if charges.is_empty() {
            (Vec::new(), None)
        } else {
            match self.store.apply(&charges).await {
                Ok(decisions) => (decisions, None),
                Err(e) => {
                    self.note_store_error(&e);
                    let of = |i: &usize| limits[*i].as_ref();
                    let postures: Vec<Posture> =
                        spans.iter().map(|(i, _)| self.posture_of(of(i))).collect();
                    let shares: Vec<f64> =
                        spans.iter().map(|(i, _)| self.share_of(of(i))).collect();
                    let decisions = self.fallback.decide(&charges, &postures, &shares).await;
                    (decisions, Some(postures))
                }
            }
        };

        let mut statuses: Vec<DescriptorStatus> = descriptors
            .iter()
            .map(|_| DescriptorStatus::unlimited())
            .collect();
        let mut overall = Code::Ok;
        for (n, (((i, _), charge), decision)) in
            spans.iter().zip(&charges).zip(decisions).enumerate()
        {
            let denied = decision.verdict != Verdict::Allowed;
            let limit = limits[*i].clone();
            let degraded = postures.as_ref().and_then(|p| p.get(n).copied());
            if let (Some(AppliedLimit::Rule(rule)), Some(posture)) = (&limit, degraded) {
                snapshot.counters.record_degraded(rule.index, posture);
            }
            if let Some(AppliedLimit::Rule(rule)) = &limit {
                let outcome = match (denied, charge.enforce) {
                    (false, _) => Outcome::Allowed,
                    (true, true) => Outcome::Denied,
                    (true, false) => Outcome::ShadowWouldDeny,
                };
                snapshot.counters.record(rule.index, outcome);
            }
            let code = if denied && charge.enforce {
                Code::OverLimit
            } else {
                Code::Ok
            };
            if code == Code::OverLimit {
                overall = Code::OverLimit;
            }
            statuses[*i] = DescriptorStatus {
                code,
                limit,
                decision: Some(decision),
                shadow_would_deny: denied && !charge.enforce,
                degraded,
            };
        }
        let response = CheckResponse { overall, statuses };
        if response.allowed() && response.degraded() == Some(Posture::Open) {
            self.fail_open.fetch_add(1, Ordering::Relaxed);
        }
        Ok(response)
    }

    fn posture_of(&self, limit: Option<&AppliedLimit>) -> Posture {
        match limit {
            Some(AppliedLimit::Rule(rule)) => rule.on_store_error,
            _ => None,
        }
        .unwrap_or(self.fallback.settings.posture)
    }

    fn share_of(&self, limit: Option<&AppliedLimit>) -> f64 {
        match limit {
            Some(AppliedLimit::Rule(rule)) => rule.local_share,
            _ => None,
        }
        .unwrap_or(self.fallback.settings.local_share)
    }

    fn note_store_error(&self, error: &StoreError) {
        let errors = self.store_errors.fetch_add(1, Ordering::Relaxed) + 1;
        // At most one line per second, however many requests fail.
        let now = self.clock.now().as_micros();
        let last = self.last_error_log.load(Ordering::Relaxed);
        let due = now.saturating_sub(last) >= 1_000_000;
        if due
            && self
                .last_error_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            warn!(error = %error, errors, "Store could not decide; failure postures answer");
        }
    }

    /// Prometheus text for the decision counters and store gauges.
    pub async fn render_metrics(&self) -> String {
        let snapshot = self.snapshot.load();
        let mut out = String::new();
        snapshot.counters.render(&snapshot.policy, &mut out);
        out.push_str("# HELP tollgate_requests_total Check requests received (valid or not).\n");
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
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
        out.push_str("# HELP tollgate_breaker_state Circuit breaker per store node: 0 closed, 1 half-open, 2 open.\n");
        out.push_str("# TYPE tollgate_breaker_state gauge\n");
        for (node, state) in self.store.breakers() {
            let node = crate::metrics::escape_label(&node);
            let _ = writeln!(
                out,
                "tollgate_breaker_state{{node=\"{node}\"}} {}",
                state.gauge()
            );
        }
        if let Ok(keys) = self.store.key_count().await {
            out.push_str("# HELP tollgate_store_keys Keys in the store.\n");
            out.push_str("# TYPE tollgate_store_keys gauge\n");
            let _ = writeln!(
                out,
                "tollgate_store_keys{{store=\"{}\"}} {keys}",
                self.store.kind()
            );
        }
        out
    }

    /// Count of `outcome` for `rule` in the current policy (for tests and summaries).
    pub fn rule_count(&self, rule: &Rule, outcome: Outcome) -> u64 {
        self.snapshot.load().counters.get(rule.index, outcome)
    }
}

/// Drops the limits replaced by another limit matched in the same request (envoyproxy/ratelimit's
/// `replaces`): a replaced descriptor is answered OK without a limit.
fn drop_replaced(limits: &mut [Option<AppliedLimit>]) {
    let replaced = |name: &str, limits: &[Option<AppliedLimit>]| {
        limits.iter().flatten().any(|l| match l {
            AppliedLimit::Rule(rule) => rule.replaces.iter().any(|r| r == name),
            AppliedLimit::Override(_) => false,
        })
    };
    let drop: Vec<bool> = limits
        .iter()
        .map(|l| match l {
            Some(AppliedLimit::Rule(rule)) => replaced(&rule.name, limits),
            _ => false,
        })
        .collect();
    for (limit, drop) in limits.iter_mut().zip(drop) {
        if drop {
            *limit = None;
        }
    }
}
