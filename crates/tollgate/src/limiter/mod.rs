//! The [`Limiter`]: matches a request against the policy, charges the store, builds the answer.

mod candidate;
mod fallback;
pub mod headers;
mod hot_keys;
mod keyed_shards;
mod keys;
mod local_budget;
mod overrides;
mod partial;
mod prefilter;
mod request;
mod response;

use std::fmt::Write;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use smallvec::SmallVec;
use tollgate_core::{Decision, Timestamp, Verdict};
use tracing::warn;

pub use candidate::{CANDIDATE_DECISIONS, Candidate, RuleReport};
pub use fallback::FailureSettings;
pub use overrides::{Override, OverrideChange, Overrides};
pub use request::{
    CheckRequest, InvalidRequest, LimitOverride, MAX_BODY, MAX_COST, MAX_DESCRIPTORS, MAX_ENTRIES,
    MAX_FIELD_LEN, RequestDescriptor, check_cost, normalized_path,
};
pub use response::{AppliedLimit, CheckResponse, Code, DescriptorStatus, Statuses};

use self::fallback::Fallback;
use crate::clock::{SharedClock, SystemClock};
use crate::metrics::{Outcome, RuleCounters};
use crate::observe::{Histogram, TopEntry, TopKeys};
use crate::policy::{Policy, Rule, RuleMode};
use crate::resilience::Posture;
use crate::store::{Charge, Decisions, INLINE_CHARGES, Store, StoreBackend, StoreError};
use keys::KeyBuf;

/// Why a request could not be decided. A store failure is not one of them: the failure
/// postures answer instead (see [`FailureSettings`]).
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The request is malformed; nothing was counted.
    #[error("invalid request: {0}")]
    Invalid(#[from] InvalidRequest),
}

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

/// Distinct keys remembered per rule for "top throttled keys".
const TOP_KEYS_PER_RULE: usize = 64;

/// A policy together with its per-rule counters, swapped as one unit.
#[derive(Debug)]
struct Snapshot {
    policy: Arc<Policy>,
    counters: RuleCounters,
    /// Per rule: the keys it denied (or would have, in shadow and soft mode) most often, since
    /// the process started (carried over policy changes that keep the rule, as the counters).
    top: Box<[Arc<TopKeys>]>,
}

/// Decides requests against the current policy using one store.
#[derive(Debug)]
pub struct Limiter {
    snapshot: ArcSwap<Snapshot>,
    /// A policy decided beside the live one and never enforced (see [`Candidate`]).
    candidate: ArcSwapOption<Candidate>,
    store: StoreBackend,
    fallback: Fallback,
    overrides: Overrides,
    clock: SharedClock,
    decision_latency: Histogram,
    /// Store call latency: `[apply, peek]`.
    store_latency: [Histogram; 2],
    requests: AtomicU64,
    store_errors: AtomicU64,
    fail_open: AtomicU64,
    /// When a store error was last logged (microseconds), so an outage cannot flood the log.
    last_error_log: AtomicU64,
    /// Requests refused as invalid, per [`Transport`].
    invalid: [AtomicU64; 2],
    /// When an invalid request was last logged (microseconds).
    last_invalid_log: AtomicU64,
    /// Remembered store denials (`None` when disabled); used with a Redis store only.
    prefilter: Option<prefilter::Prefilter>,
    /// Local budgets in use on this replica.
    leases: local_budget::Leases,
    /// Counts policy replacements, for [`Limiter::epoch`].
    policy_epoch: AtomicU64,
    prefilter_denials: AtomicU64,
    local_admissions: AtomicU64,
}

impl Limiter {
    /// A limiter over `store` enforcing `policy`, with the default failure settings (`open`).
    pub fn new(policy: Policy, store: StoreBackend) -> Self {
        let clock = Arc::new(SystemClock::new());
        Self::with_failure_settings(policy, store, FailureSettings::default(), clock)
    }

    /// A limiter with explicit failure settings. `clock` is the limiter's own time: the `local`
    /// posture's store, override expiry, the prefilter and local budgets.
    pub fn with_failure_settings(
        policy: Policy,
        store: StoreBackend,
        settings: FailureSettings,
        clock: SharedClock,
    ) -> Self {
        Limiter {
            snapshot: ArcSwap::from_pointee(Self::snapshot(policy, None)),
            candidate: ArcSwapOption::empty(),
            store,
            fallback: Fallback::new(settings, clock.clone()),
            overrides: Overrides::default(),
            clock,
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
            prefilter: Some(prefilter::Prefilter::default()),
            leases: local_budget::Leases::default(),
            policy_epoch: AtomicU64::new(0),
            prefilter_denials: AtomicU64::new(0),
            local_admissions: AtomicU64::new(0),
        }
    }

    /// Turns the prefilter (remembered denials, Redis store only) on or off; it is on by
    /// default.
    pub fn with_prefilter(mut self, on: bool) -> Self {
        self.prefilter = on.then(prefilter::Prefilter::default);
        self
    }

    /// The server-wide failure settings.
    pub fn failure_settings(&self) -> &FailureSettings {
        &self.fallback.settings
    }

    /// The in-process store of the `local` posture (for sweeping and tests).
    pub fn local_store(&self) -> &crate::store::MemoryStore {
        self.fallback.local_store()
    }

    /// Drops expired counters from the in-process stores: the memory store, if that is the
    /// store, and the `local` posture's (Redis expires its keys itself: every key has a TTL);
    /// and the runtime overrides that expired, each logged once.
    pub fn sweep_expired(&self) {
        if let StoreBackend::Memory(m) = &self.store {
            m.sweep_now();
        }
        self.local_store().sweep_now();
        self.overrides.drop_expired(self.clock().now());
    }

    /// The snapshot of `policy`, its counters continuing those of `previous`.
    fn snapshot(policy: Policy, previous: Option<&Snapshot>) -> Snapshot {
        let counters = match previous {
            Some(p) => RuleCounters::continuing(&policy, &p.policy, &p.counters),
            None => RuleCounters::for_policy(&policy),
        };
        let fresh = || Arc::new(top_keys());
        let top = match previous {
            Some(p) => policy.carry_over(&p.policy, &p.top, fresh),
            None => policy.rules().iter().map(|_| fresh()).collect(),
        };
        Snapshot {
            policy: Arc::new(policy),
            counters,
            top,
        }
    }

    /// The `n` keys `rule` (by domain and name) denied most often since the process started
    /// (or since a policy change brought the rule in), or `None` if no such rule runs.
    pub fn top_keys(&self, domain: &str, rule: &str, n: usize) -> Option<Vec<TopEntry>> {
        let snapshot = self.snapshot.load();
        let rule = snapshot
            .policy
            .rules()
            .iter()
            .find(|r| r.domain == domain && r.name == rule)?;
        Some(snapshot.top.get(rule.index)?.top(n))
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<Policy> {
        self.snapshot.load().policy.clone()
    }

    /// Replaces the policy atomically; requests in flight finish on the old one. A runtime
    /// override that applied and applies to nothing under the new policy is logged.
    pub fn replace_policy(&self, policy: Policy) {
        let previous = self.snapshot.load_full();
        for o in self.overrides.all() {
            if o.applies_under(&previous.policy) && !o.applies_under(&policy) {
                warn!(id = o.id, domain = %o.domain, rule = %o.rule, entries = ?o.entries,
                    "A runtime override applies to nothing under the new policy (its rule is gone, or its name now belongs to another rule); it is kept, and applies again under a policy where its rule matches its entries");
            }
        }
        let next = Self::snapshot(policy, Some(&previous));
        self.snapshot.store(Arc::new(next));
        // After the store: a decision made under the old policy records the old epoch.
        self.policy_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The shared store lost its data (Redis restarted empty, was flushed, or failed over to an
    /// empty replica): the denials remembered and the local budgets reserved were about
    /// counters that no longer exist. The budgets are dropped without being given back, which
    /// would credit the counts made since (those reserved between the loss and this call go
    /// too: under the limit, never over; a renewal under way may still give back once); then a
    /// new epoch forgets the denials. In that order: a lease of the old epoch seen after the
    /// new one begins is given back, and only leases reserved after the forfeit can be.
    pub fn store_data_lost(&self) {
        self.leases.forfeit();
        self.policy_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The store.
    pub fn store(&self) -> &StoreBackend {
        &self.store
    }

    /// Sets (or with `None` clears) the shadow candidate; returns the one it replaces. Requests
    /// in flight finish with the candidate they started with.
    pub fn set_candidate(&self, candidate: Option<Arc<Candidate>>) -> Option<Arc<Candidate>> {
        self.candidate.swap(candidate)
    }

    /// Clears the candidate if it is still `expected`; returns whether it was.
    pub fn clear_candidate(&self, expected: &Arc<Candidate>) -> bool {
        let previous = self.candidate.compare_and_swap(expected, None);
        previous
            .as_ref()
            .is_some_and(|previous| Arc::ptr_eq(previous, expected))
    }

    /// The shadow candidate, if one is set.
    pub fn candidate(&self) -> Option<Arc<Candidate>> {
        self.candidate.load_full()
    }

    /// Decides one request. A denial is `Ok` with `overall == OverLimit`; `Err` means the
    /// request is invalid (nothing was counted).
    pub async fn check(&self, request: &CheckRequest) -> Result<CheckResponse, LimitError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let started = tokio::time::Instant::now();
        // Not a `match`: its scrutinee, a whole response, would be kept across the await.
        let answer = if let Some(answer) = self.decide_in_place(request, true) {
            answer
        } else {
            Box::pin(self.decide(request, true)).await
        };
        self.decision_latency.observe(started.elapsed());
        answer
    }

    /// Decides one request without charging anything or counting it in the decision metrics
    /// (its store call is timed as `op="peek"`): which rules match, which binds, and the
    /// current counters.
    pub async fn explain(&self, request: &CheckRequest) -> Result<CheckResponse, LimitError> {
        if let Some(answer) = self.decide_in_place(request, false) {
            answer
        } else {
            Box::pin(self.decide(request, false)).await
        }
    }

    /// The decision on the memory store, made on this stack frame; `None` on Redis.
    ///
    /// The decision's future holds the plans and decisions inline (about 1.4 KB). Awaited, it
    /// would sit inside the caller's future, which the HTTP and gRPC servers box per request:
    /// above glibc's 1 KB per-thread cache, so every request took the allocator's shared arena
    /// lock and consolidated its free lists. The memory store answers in place, so its future
    /// completes on the first poll and never needs to outlive this call; Redis futures are
    /// boxed on their own instead.
    fn decide_in_place(
        &self,
        request: &CheckRequest,
        commit: bool,
    ) -> Option<Result<CheckResponse, LimitError>> {
        if !matches!(self.store, StoreBackend::Memory(_)) {
            return None;
        }
        let decision = std::pin::pin!(self.decide(request, commit));
        match decision.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(answer) => Some(answer),
            // The memory store's path awaits nothing that can be pending: `StoreBackend::decide`
            // and `decide_with_budgets` return before any `.await` on it.
            Poll::Pending => unreachable!("a decision on the memory store waited"),
        }
    }

    async fn decide(
        &self,
        request: &CheckRequest,
        commit: bool,
    ) -> Result<CheckResponse, LimitError> {
        // Before the policy and overrides are read: what is remembered under this epoch was
        // decided with them or newer ones.
        let epoch = self.epoch();
        let snapshot = self.snapshot.load();
        let descriptors = request.descriptors();
        let now = self.clock.now();
        // Plans are filled in place: each holds a few hundred bytes inline.
        let mut live = Plan::default();
        self.plan(&snapshot.policy, request, now, Side::Live, &mut live)?;
        // A caller's limit of 0 denies the request whatever else is asked: its other limits
        // are only looked at, as explain does, so nothing is charged anywhere (store, local
        // share, lease).
        let commit = commit
            && !live
                .limits
                .iter()
                .any(|l| matches!(l, Some(AppliedLimit::Blocked(_))));
        // Only charged decisions feed the candidate: explain shows the live policy alone.
        let candidate = if commit {
            self.candidate.load_full()
        } else {
            None
        };
        // Boxed: a candidate is rare, and inline it would grow every check's future.
        let shadow = match &candidate {
            Some(c) => {
                let mut plan = Box::<Plan>::default();
                self.plan(
                    c.policy(),
                    request,
                    now,
                    Side::Candidate(c.hash()),
                    &mut plan,
                )?;
                Some(plan)
            }
            None => None,
        };

        // One store call for both: the candidate's charges go after the live ones.
        let mut charges: SmallVec<[Charge<'_>; INLINE_CHARGES]> = SmallVec::new();
        live.push_charges(descriptors, true, &mut charges);
        let live_charges = charges.len();
        if let Some(plan) = &shadow {
            plan.push_charges(descriptors, false, &mut charges);
        }
        // Charges of one request on one counter are decided in order, each on top of the ones
        // before it: costs that add up past what the counter can ever hold are never admitted
        // together. Such a request is looked at, charging nothing, and answered as a cost above
        // the capacity, not as a denial a retry would clear (it never would).
        let never_fits = (0..live_charges).any(|i| exceeds_with_earlier(&charges, i));
        let charge = commit && !never_fits;

        // Not while a candidate shadows: it must see every request the running policy decides.
        if commit
            && shadow.is_none()
            && let Some(denial) = self.prefiltered(&live, &charges[..live_charges], now, epoch)
        {
            return Ok(self.prefiltered_response(&snapshot, &live, descriptors, denial));
        }

        // Filled in place, like the plans: a few hundred bytes not copied from frame to frame.
        let mut decisions = Decisions::new();
        let answer = if charges.is_empty() {
            Ok(())
        } else {
            let at = (now, epoch);
            self.decide_with_budgets(&live, &charges, live_charges, at, charge, &mut decisions)
                .await
        };
        // A cluster primary down under part of the request, or a full memory store and a
        // limit on a key it does not hold: the postures answer for those limits alone (not
        // with a candidate or local budgets in the call: they take the postures for the whole
        // request, as any other store failure).
        let answer = match answer {
            Err(StoreError::Partly {
                decided,
                cause,
                deadline,
            }) if shadow.is_none()
                && decided.len() == charges.len()
                && !hot_keys::has_budgets(&live, live_charges) =>
            {
                let partly = (decided, deadline);
                let answer = self
                    .decide_partly(&live, &charges, partly, charge, &mut decisions)
                    .await;
                if charge && answer.is_ok() {
                    self.note_store_error(&cause);
                }
                answer.map(Some)
            }
            answer => answer.map(|()| None),
        };
        let postures = match answer {
            Ok(Some(degraded)) => Some(degraded),
            Ok(None) => {
                if charge {
                    let live_decisions = decisions.get(..live_charges).unwrap_or_default();
                    self.remember_denials(&live, &charges, live_decisions, now, epoch);
                }
                if let (Some(candidate), Some(plan)) = (&candidate, &shadow) {
                    let shadowed = decisions.get(live_charges..).unwrap_or_default();
                    for ((i, _), decision) in plan.spans.iter().zip(shadowed) {
                        if let Some(rule) = plan.limits[*i].as_ref().and_then(AppliedLimit::rule) {
                            let denied = decision.verdict != Verdict::Allowed;
                            candidate.record(rule, &descriptors[*i], denied);
                        }
                    }
                    decisions.truncate(live_charges);
                }
                None
            }
            Err(e) => {
                if charge {
                    self.note_store_error(&e);
                }
                // The failure postures answer for the live policy only; the candidate skips
                // this request rather than report what a posture decided.
                let (postures, shares) = self.postures_and_shares(&live);
                let live_only = charges.get(..live_charges).unwrap_or_default();
                // A cost its counter can never hold needs no store to be answered: refused as
                // such, not let through by `open` nor sent to retry by `closed`, and nothing is
                // charged to a `local` share for the request it denies.
                let hopeless = |i: &usize| never_admitted(live_only, *i);
                let any_hopeless = (0..live_only.len()).any(|i| hopeless(&i));
                decisions =
                    self.fallback
                        .decide(live_only, &postures, &shares, charge && !any_hopeless);
                let mut postures: SmallVec<[Option<Posture>; INLINE_CHARGES]> =
                    postures.into_iter().map(Some).collect();
                for i in (0..live_only.len().min(decisions.len())).filter(hopeless) {
                    decisions[i] = Decision {
                        verdict: Verdict::CostExceedsCapacity,
                        retry_after: None,
                        delay: Duration::ZERO,
                        ..decisions[i]
                    };
                    postures[i] = None;
                }
                Some(postures)
            }
        };

        if never_fits && postures.is_none() {
            for i in 0..live_charges.min(decisions.len()) {
                if exceeds_with_earlier(&charges, i) {
                    // The figures as they stand: those of the counter's first charge, allowed
                    // (nothing was charged) or denied by the counter as it is.
                    let first = charges[..i]
                        .iter()
                        .position(|c| c.key == charges[i].key)
                        .unwrap_or(i);
                    decisions[i] = Decision {
                        verdict: Verdict::CostExceedsCapacity,
                        retry_after: None,
                        delay: Duration::ZERO,
                        ..decisions[first]
                    };
                }
            }
        }

        // Built where it stays: the response holds its statuses inline.
        // The charges borrow the plan's keys; the limits move out of it below.
        drop(charges);
        let mut response = CheckResponse {
            overall: Code::Ok,
            statuses: Statuses::new(),
        };
        let statuses = &mut response.statuses;
        statuses.extend(descriptors.iter().map(|_| DescriptorStatus::unlimited()));
        for (n, ((i, _), &decision)) in live.spans.iter().zip(&decisions).enumerate() {
            // Moved out: the plan is done with once its decisions are known.
            let limit = live.limits[*i].take();
            let denied = decision.verdict != Verdict::Allowed;
            let mode = limit.as_ref().map_or(RuleMode::Enforce, mode_of);
            let degraded = postures.as_ref().and_then(|p| p.get(n).copied().flatten());
            if let (true, Some(rule)) = (commit, limit.as_ref().and_then(AppliedLimit::rule)) {
                if let Some(posture) = degraded {
                    snapshot.counters.record_degraded(rule.index, posture);
                }
                // Outcomes and throttled keys are the limit's: an answer of the open or closed
                // posture, which decided nothing about the key, is counted as degraded only.
                if matches!(degraded, None | Some(Posture::Local)) {
                    record_outcome(&snapshot, rule, &descriptors[*i], Outcome::of(denied, mode));
                }
            }
            let code = if denied && mode == RuleMode::Enforce {
                Code::OverLimit
            } else {
                Code::Ok
            };
            if code == Code::OverLimit {
                response.overall = Code::OverLimit;
            }
            statuses[*i] = DescriptorStatus {
                code,
                limit,
                decision: Some(decision),
                shadow_would_deny: denied && mode == RuleMode::Shadow,
                soft_exceeded: denied && mode == RuleMode::Soft,
                degraded,
            };
        }
        // A caller's limit of 0: over it, with no counter and no store asked.
        for (status, limit) in statuses.iter_mut().zip(live.limits.iter_mut()) {
            if let Some(AppliedLimit::Blocked(params)) = limit {
                let decision = AppliedLimit::blocked_decision(params, now);
                *status = DescriptorStatus {
                    code: Code::OverLimit,
                    limit: limit.take(),
                    decision: Some(decision),
                    ..DescriptorStatus::unlimited()
                };
                response.overall = Code::OverLimit;
            }
        }
        // Any limit the open posture let through counts, whatever other postures answered.
        if commit
            && response.allowed()
            && response
                .statuses
                .iter()
                .any(|s| s.degraded == Some(Posture::Open))
        {
            self.fail_open.fetch_add(1, Ordering::Relaxed);
        }
        Ok(response)
    }

    /// Matches the request's descriptors against `policy` and builds their counter keys into
    /// `plan`, which is empty.
    ///
    /// For the live policy, a limit sent with a descriptor and the runtime overrides apply. A
    /// candidate is its policy alone: runtime overrides are ignored, and a descriptor carrying
    /// its own limit is skipped, since that limit decides it whatever policy runs.
    fn plan(
        &self,
        policy: &Policy,
        request: &CheckRequest,
        now: Timestamp,
        side: Side<'_>,
        plan: &mut Plan,
    ) -> Result<(), LimitError> {
        let descriptors = request.descriptors();
        let Plan {
            limits,
            key_buf,
            spans,
        } = plan;
        // An unlimited rule applies no limit but still replaces others, as in envoyproxy/ratelimit
        // (the "this premium key skips the per-IP limit" pattern).
        let mut replaced_by_unlimited: SmallVec<[&str; INLINE_CHARGES]> = SmallVec::new();
        for d in descriptors {
            limits.push(match (d.limit_override(), side) {
                // As in envoyproxy/ratelimit, a domain the policy does not know limits nothing,
                // not even with limits the caller sent.
                (Some(_), Side::Live) if !policy.has_domain(request.domain()) => None,
                (Some(o), Side::Live) => {
                    // Configured rules were checked against the store at load time; a limit
                    // sent by the caller is checked here.
                    self.store.supports(&o.params).map_err(InvalidRequest)?;
                    Some(if o.blocks {
                        AppliedLimit::Blocked(o.params)
                    } else {
                        AppliedLimit::Override(o.params)
                    })
                }
                (Some(_), Side::Candidate(_)) => None,
                (None, _) => policy
                    .find(request.domain(), d.entries())
                    .filter(|rule| {
                        if rule.limit.is_none() {
                            replaced_by_unlimited.extend(rule.replaces.iter().map(String::as_str));
                        }
                        rule.limit.is_some()
                    })
                    .map(|rule| {
                        let runtime = match side {
                            Side::Live => {
                                self.overrides
                                    .find(request.domain(), rule, d.entries(), now)
                            }
                            Side::Candidate(_) => None,
                        };
                        match runtime {
                            Some(params) if self.store.supports(&params).is_ok() => {
                                AppliedLimit::Overridden(rule.clone(), params)
                            }
                            _ => AppliedLimit::Rule(rule.clone()),
                        }
                    }),
            });
        }
        drop_replaced(limits, &replaced_by_unlimited);

        // Build every key into one buffer; the charges borrow slices of it.
        for (i, (descriptor, limit)) in descriptors.iter().zip(limits.iter()).enumerate() {
            let start = key_buf.len();
            match (limit, side) {
                (Some(AppliedLimit::Override(params)), _) => {
                    keys::override_key(key_buf, request.domain(), descriptor, params)
                }
                // Decided without a counter: see the end of `decide`.
                (Some(AppliedLimit::Blocked(_)), _) => continue,
                (
                    Some(AppliedLimit::Rule(rule) | AppliedLimit::Overridden(rule, _)),
                    Side::Live,
                ) => keys::rule_key(key_buf, &rule.identity, rule.shared_levels, descriptor),
                (
                    Some(AppliedLimit::Rule(rule) | AppliedLimit::Overridden(rule, _)),
                    Side::Candidate(hash),
                ) => keys::candidate_rule_key(
                    key_buf,
                    hash,
                    &rule.identity,
                    rule.shared_levels,
                    descriptor,
                ),
                (None, _) => continue,
            }
            spans.push((i, start..key_buf.len()));
        }
        Ok(())
    }

    /// The failure posture that answers for `limit` when the store cannot: its rule's
    /// `on_store_error`, else the default.
    pub fn posture_of(&self, limit: Option<&AppliedLimit>) -> Posture {
        limit
            .and_then(AppliedLimit::rule)
            .and_then(|rule| rule.on_store_error)
            .unwrap_or(self.fallback.settings.posture)
    }

    /// Per charge of `plan`: its failure posture and its `local` share.
    fn postures_and_shares(
        &self,
        plan: &Plan,
    ) -> (
        SmallVec<[Posture; INLINE_CHARGES]>,
        SmallVec<[f64; INLINE_CHARGES]>,
    ) {
        let of = |i: &usize| plan.limits[*i].as_ref();
        let postures = plan.spans.iter().map(|(i, _)| self.posture_of(of(i)));
        let shares = plan.spans.iter().map(|(i, _)| self.share_of(of(i)));
        (postures.collect(), shares.collect())
    }

    fn share_of(&self, limit: Option<&AppliedLimit>) -> f64 {
        limit
            .and_then(AppliedLimit::rule)
            .and_then(|rule| rule.local_share)
            .unwrap_or(self.fallback.settings.local_share)
    }

    /// The runtime overrides.
    pub fn overrides(&self) -> &Overrides {
        &self.overrides
    }

    /// The clock decisions are made with.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    fn note_store_error(&self, error: &StoreError) {
        let errors = self.store_errors.fetch_add(1, Ordering::Relaxed) + 1;
        if self.log_due(&self.last_error_log) {
            // The total since the start, as `tollgate_store_errors_total` counts it.
            warn!(error = %error, errors_total = errors, "Store could not decide; failure postures answer");
        }
    }

    /// Counts a request refused as invalid (`400`, `INVALID_ARGUMENT`), which the decision
    /// counters never see, and logs it at most once a second: a caller whose every request is
    /// malformed (a misconfigured Envoy, which then fails open) shows in the metrics and the log.
    pub fn note_invalid(&self, over: Transport, why: &dyn std::fmt::Display) {
        let invalid = self.invalid[over as usize].fetch_add(1, Ordering::Relaxed) + 1;
        if self.log_due(&self.last_invalid_log) {
            warn!(transport = over.name(), error = %why, invalid_total = invalid, "Invalid request refused");
        }
    }

    /// Whether a line rate-limited by `last` (when it was last written, in microseconds) is due:
    /// at most one a second, however many events call for it.
    fn log_due(&self, last: &AtomicU64) -> bool {
        let now = self.clock.now().as_micros();
        let then = last.load(Ordering::Relaxed);
        now.saturating_sub(then) >= 1_000_000
            && last
                .compare_exchange(then, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Asks the store, timing the call in `tollgate_store_operation_duration_seconds` unless
    /// it never reached the store (refused by an open breaker, the in-flight cap...).
    async fn store_decide(
        &self,
        charges: &[Charge<'_>],
        commit: bool,
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        let histogram = &self.store_latency[usize::from(!commit)];
        timed_store_call(histogram, self.store.decide(charges, commit, decisions)).await
    }

    /// Prometheus text for the decision counters and store gauges.
    pub async fn render_metrics(&self) -> String {
        let snapshot = self.snapshot.load();
        let mut out = String::new();
        snapshot.counters.render(&snapshot.policy, &mut out);
        if let Some(candidate) = self.candidate.load_full() {
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
                &self.local_admissions,
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
        if let Some(prefilter) = self.prefilter() {
            let name = "tollgate_prefilter_entries";
            let _ = writeln!(
                out,
                "# HELP {name} Store denials remembered by the prefilter.\n# TYPE {name} gauge\n{name} {}",
                prefilter.len()
            );
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
        let decision = "tollgate_decision_duration_seconds";
        Histogram::render_header(
            decision,
            "Time to decide a check request, store included.",
            &mut out,
        );
        self.decision_latency.render(decision, "", &mut out);
        let store = "tollgate_store_operation_duration_seconds";
        Histogram::render_header(store, "Store calls by backend and operation.", &mut out);
        let kind = self.store.kind();
        let leases =
            matches!(self.store, StoreBackend::Redis(_)).then(|| self.leases.store_latency());
        let ops = ["apply", "peek"].into_iter().zip(&self.store_latency);
        for (op, histogram) in ops.chain(leases.into_iter().flatten()) {
            histogram.render(store, &format!("store=\"{kind}\",op=\"{op}\""), &mut out);
        }
        if matches!(self.store, StoreBackend::Redis(_)) {
            let name = "tollgate_local_budget_store_failures_total";
            let _ = writeln!(
                out,
                "# HELP {name} Local-budget store calls that failed: a reservation that timed out after Redis ran it strands its units, a failed give-back leaves them charged (under the limit until the counter resets).\n# TYPE {name} counter"
            );
            for (op, failures) in self.leases.store_failures() {
                let _ = writeln!(out, "{name}{{op=\"{op}\"}} {failures}");
            }
        }
        if let StoreBackend::Redis(redis) = &self.store
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

/// Whether `charges[i]` takes its counter past what it can ever hold, with the charges before
/// it in the request on the same counter (see [`Limiter::decide`]). A check counts as the one
/// unit it is decided as; a limit that charges up to itself, or that does not enforce, denies
/// nothing for it.
fn exceeds_with_earlier(charges: &[Charge<'_>], i: usize) -> bool {
    let charge = &charges[i];
    if !charge.enforce || charge.params.charges_up_to_limit() {
        return false;
    }
    let earlier = charges[..i]
        .iter()
        .filter(|c| c.key == charge.key)
        .fold(0u64, |sum, c| sum.saturating_add(c.cost));
    earlier > 0 && earlier.saturating_add(charge.cost.max(1)) > charge.params.capacity()
}

/// Whether `charges[i]` can never be admitted: its cost alone, or with the charges before it
/// on the same counter, is more than the counter can ever hold.
fn never_admitted(charges: &[Charge<'_>], i: usize) -> bool {
    let charge = &charges[i];
    exceeds_with_earlier(charges, i)
        || (charge.enforce
            && !charge.params.charges_up_to_limit()
            && charge.cost > charge.params.capacity())
}

/// Awaits a store call, timing it in `histogram` unless it never reached the store (refused by
/// an open breaker, the in-flight cap...).
async fn timed_store_call<T>(
    histogram: &Histogram,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = tokio::time::Instant::now();
    let answer = call.await;
    if !matches!(answer, Err(StoreError::NotCalled(_))) {
        histogram.observe(started.elapsed());
    }
    answer
}

/// Whose limits a [`Plan`] holds.
#[derive(Debug, Clone, Copy)]
enum Side<'a> {
    /// The live policy.
    Live,
    /// The shadow candidate with this hash, which names its counters' key space.
    Candidate(&'a str),
}

/// Per request descriptor: the limit applied, if any.
type Limits = SmallVec<[Option<AppliedLimit>; INLINE_CHARGES]>;
/// Per charged descriptor: its index and the range of its key in the key buffer.
type Spans = SmallVec<[(usize, Range<usize>); INLINE_CHARGES]>;

/// The limits one policy applies to a request's descriptors, and their counter keys. Inline
/// up to four descriptors: planning a request allocates nothing.
#[derive(Debug, Default)]
struct Plan {
    /// Per request descriptor: the limit applied, if any.
    limits: Limits,
    /// Every counter key, back to back.
    key_buf: KeyBuf,
    /// Per charged descriptor: its index and the range of its key in `key_buf`.
    spans: Spans,
}

impl Plan {
    /// Appends one charge per span, in order. With `may_enforce` false every charge only
    /// counts, whatever the rule's mode (a candidate never denies).
    fn push_charges<'a>(
        &'a self,
        descriptors: &[RequestDescriptor],
        may_enforce: bool,
        charges: &mut impl Extend<Charge<'a>>,
    ) {
        charges.extend(self.spans.iter().filter_map(|(i, span)| {
            let limit = self.limits[*i].as_ref()?;
            Some(Charge {
                key: &self.key_buf[span.clone()],
                params: limit.params()?,
                cost: descriptors[*i].cost(),
                enforce: may_enforce && mode_of(limit) == RuleMode::Enforce,
            })
        }));
    }
}

/// One table of top denied keys per rule of `policy` (a shadow candidate's).
fn top_keys_per_rule(policy: &Policy) -> Box<[TopKeys]> {
    policy.rules().iter().map(|_| top_keys()).collect()
}

/// An empty table of one rule's top denied keys.
fn top_keys() -> TopKeys {
    TopKeys::new(TOP_KEYS_PER_RULE)
}

/// The mode of the rule behind `limit`; a caller-supplied limit enforces.
fn mode_of(limit: &AppliedLimit) -> RuleMode {
    limit.rule().map_or(RuleMode::Enforce, |r| r.mode)
}

/// Counts `outcome` of `rule` for `descriptor`: in the rule's counters (its checks' for a
/// check), per descriptor when the rule has `detailed_metric` and this is not a check, and
/// among its top keys when it is not an admission (a denied check throttles as much as a
/// denied charge).
fn record_outcome(
    snapshot: &Snapshot,
    rule: &Rule,
    descriptor: &RequestDescriptor,
    outcome: Outcome,
) {
    let check = descriptor.cost() == 0;
    if check {
        snapshot.counters.record_check(rule.index, outcome);
    } else {
        snapshot.counters.record(rule.index, outcome);
    }
    let detailed = rule.detailed_metric && !check;
    let top = snapshot
        .top
        .get(rule.index)
        .filter(|_| outcome != Outcome::Allowed);
    if !detailed && top.is_none() {
        return;
    }
    let text = descriptor_text(descriptor);
    if detailed {
        snapshot
            .counters
            .record_value(rule.index, text.as_str(), outcome);
    }
    if let Some(top) = top {
        // One per denial, whatever its cost: the listing ranks who was denied most often.
        top.record(text.as_str(), 1);
    }
}

/// Counts a denial of `descriptor` in `top`: one per denial, whatever its cost, since the
/// listing ranks who was denied most often.
fn record_top_key(top: &TopKeys, descriptor: &RequestDescriptor) {
    top.record(descriptor_text(descriptor).as_str(), 1);
}

/// `descriptor` as top keys and per-value counters show it (see [`describe_entries`]).
fn descriptor_text(descriptor: &RequestDescriptor) -> TopKeyText {
    let mut text = TopKeyText::default();
    describe_entries(descriptor, &mut text);
    text
}

/// `key=value,key=value`: how a descriptor is shown in top-key listings. In keys and values,
/// `\`, `,` and `=` are escaped with a `\` and control characters (and the bidirectional
/// formatting ones, which could show a key reversed) as `\u{..}`, so two descriptors never
/// read the same and a value cannot put escape codes on an operator's terminal.
fn describe_entries(descriptor: &RequestDescriptor, out: &mut impl Write) {
    fn escaped(text: &str, out: &mut impl Write) -> std::fmt::Result {
        for c in text.chars() {
            match c {
                '\\' | ',' | '=' => write!(out, "\\{c}")?,
                c if c.is_control() || crate::policy::is_bidi_control(c) => {
                    write!(out, "{}", c.escape_unicode())?;
                }
                c => out.write_char(c)?,
            }
        }
        Ok(())
    }
    for (n, (key, value)) in descriptor.entries().iter().enumerate() {
        let written = (if n > 0 { out.write_char(',') } else { Ok(()) })
            .and_then(|()| escaped(key, out))
            .and_then(|()| out.write_char('='))
            .and_then(|()| escaped(value, out));
        if written.is_err() {
            break;
        }
    }
}

/// A top-key description on the stack: the top-keys table keeps at most
/// [`MAX_KEY_BYTES`](crate::observe::MAX_KEY_BYTES) bytes of a key, so nothing longer is ever
/// built, and recording a denial allocates nothing unless the key is new to the table.
struct TopKeyText {
    bytes: [u8; crate::observe::MAX_KEY_BYTES],
    len: usize,
}

impl Default for TopKeyText {
    fn default() -> Self {
        TopKeyText {
            bytes: [0; crate::observe::MAX_KEY_BYTES],
            len: 0,
        }
    }
}

impl TopKeyText {
    fn as_str(&self) -> &str {
        // Only whole chars are ever copied in, so this is always valid UTF-8.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl Write for TopKeyText {
    /// Appends whole chars while they fit; errs once the buffer is full (the text is cut at the
    /// last char boundary that fits, as `TopKeys` would cut it).
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for c in s.chars() {
            let end = self.len + c.len_utf8();
            let Some(slot) = self.bytes.get_mut(self.len..end) else {
                return Err(std::fmt::Error);
            };
            c.encode_utf8(slot);
            self.len = end;
        }
        Ok(())
    }
}

// `drop_replaced` keeps one bit per descriptor in a u64.
const _: () = assert!(MAX_DESCRIPTORS <= 64);

/// Drops the limits replaced by another limit matched in the same request (envoyproxy/ratelimit's
/// `replaces`), or by a matched unlimited rule (`by_unlimited`): a replaced descriptor is
/// answered OK without a limit.
fn drop_replaced(limits: &mut [Option<AppliedLimit>], by_unlimited: &[&str]) {
    let replaced = |name: &str, limits: &[Option<AppliedLimit>]| {
        by_unlimited.contains(&name)
            || limits
                .iter()
                .flatten()
                .filter_map(AppliedLimit::rule)
                .any(|rule| rule.replaces.iter().any(|r| r == name))
    };
    // At most MAX_DESCRIPTORS (64) limits: one bit each, decided before any is dropped.
    let drop = limits.iter().enumerate().fold(0u64, |drop, (n, l)| {
        let replaced = l
            .as_ref()
            .and_then(AppliedLimit::rule)
            .is_some_and(|rule| replaced(&rule.name, limits));
        drop | (u64::from(replaced) << (n % 64))
    });
    for (n, limit) in limits.iter_mut().enumerate() {
        if drop & (1 << (n % 64)) != 0 {
            *limit = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(entries: &[(&str, &str)]) -> String {
        let entries = entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let descriptor = RequestDescriptor::new(entries, 1, None).unwrap_or_else(|e| panic!("{e}"));
        let mut text = TopKeyText::default();
        describe_entries(&descriptor, &mut text);
        text.as_str().to_owned()
    }

    /// Two descriptors never read the same in a top-keys listing, and a value cannot put
    /// control characters on the terminal of whoever runs `tollgate top`.
    #[test]
    fn top_key_texts_are_unambiguous_and_printable() {
        let one = described(&[("tenant", "acme,user=x"), ("user", "y")]);
        let other = described(&[("tenant", "acme"), ("user", "x,user=y")]);
        assert_ne!(one, other);
        assert_eq!(one, "tenant=acme\\,user\\=x,user=y");
        assert_eq!(described(&[("k", "a\\b")]), "k=a\\\\b");
        assert_eq!(described(&[("k", "\u{1b}[31mred")]), "k=\\u{1b}[31mred");
        // A right-to-left override would show the rest of the line reversed.
        assert_eq!(described(&[("k", "\u{202e}gpj.exe")]), "k=\\u{202e}gpj.exe");
        assert_eq!(described(&[("k", "café")]), "k=café", "other text is kept");
    }
}
