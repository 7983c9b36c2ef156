//! The [`Limiter`]: matches a request against the policy, charges the store, builds the answer.

mod keys;
mod request;
mod response;

use std::fmt::Write;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use tollgate_core::Verdict;

pub use request::{
    CheckRequest, InvalidRequest, LimitOverride, MAX_COST, MAX_DESCRIPTORS, MAX_ENTRIES,
    MAX_FIELD_LEN, RequestDescriptor, check_cost,
};
pub use response::{AppliedLimit, CheckResponse, Code, DescriptorStatus};

use crate::metrics::{Outcome, RuleCounters};
use crate::policy::{Policy, Rule};
use crate::store::{Charge, Store, StoreBackend, StoreError};

/// Why a request could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The request is malformed; nothing was counted.
    #[error("invalid request: {0}")]
    Invalid(#[from] InvalidRequest),
    /// The store failed; nothing is known about the counters.
    #[error(transparent)]
    Store(#[from] StoreError),
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
    requests: AtomicU64,
}

impl Limiter {
    /// A limiter over `store` enforcing `policy`.
    pub fn new(policy: Policy, store: StoreBackend) -> Self {
        Limiter {
            snapshot: ArcSwap::from_pointee(Self::snapshot(policy)),
            store,
            requests: AtomicU64::new(0),
        }
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

        let mut limits: Vec<Option<AppliedLimit>> = descriptors
            .iter()
            .map(|d| match d.limit_override() {
                Some(o) => Some(AppliedLimit::Override(o.params)),
                None => policy
                    .find(request.domain(), d.entries())
                    .filter(|rule| rule.limit.is_some())
                    .map(|rule| AppliedLimit::Rule(rule.clone())),
            })
            .collect();
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

        let decisions = if charges.is_empty() {
            Vec::new()
        } else {
            self.store.apply(&charges).await?
        };

        let mut statuses: Vec<DescriptorStatus> = descriptors
            .iter()
            .map(|_| DescriptorStatus::unlimited())
            .collect();
        let mut overall = Code::Ok;
        for (((i, _), charge), decision) in spans.iter().zip(&charges).zip(decisions) {
            let denied = decision.verdict != Verdict::Allowed;
            let limit = limits[*i].clone();
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
            };
        }
        Ok(CheckResponse { overall, statuses })
    }

    /// Prometheus text for the decision counters and store gauges.
    pub fn render_metrics(&self) -> String {
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
        out.push_str("# HELP tollgate_store_keys Live keys in the store.\n");
        out.push_str("# TYPE tollgate_store_keys gauge\n");
        let _ = writeln!(out, "tollgate_store_keys {}", self.store.key_count());
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
