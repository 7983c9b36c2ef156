//! The [`Limiter`]: matches a request against the policy, charges the store, builds the answer.

mod answer;
mod candidate;
mod capacity;
mod describe;
mod fallback;
pub mod headers;
mod hot_keys;
mod keyed_shards;
mod keys;
mod local_budget;
mod overrides;
mod partial;
mod plan;
mod prefilter;
mod request;
mod response;
mod snapshot;
mod telemetry;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use arc_swap::{ArcSwap, ArcSwapOption};
use smallvec::SmallVec;
use tracing::warn;

pub use candidate::{CANDIDATE_DECISIONS, Candidate, RuleReport};
pub use fallback::FailureSettings;
pub use overrides::{Override, OverrideChange, Overrides};
pub use request::{
    CheckRequest, InvalidRequest, LimitOverride, MAX_BODY, MAX_COST, MAX_DESCRIPTORS, MAX_ENTRIES,
    MAX_FIELD_LEN, RequestDescriptor, check_cost, normalized_path,
};
pub use response::{AppliedLimit, CheckResponse, Code, DescriptorStatus, Statuses};
pub use telemetry::Transport;

use self::answer::Told;
use self::capacity::{answer_never_fits, exceeds_with_earlier};
use self::fallback::Fallback;
use self::plan::{Plan, Planner, Side};
use self::snapshot::Snapshot;
use self::telemetry::Telemetry;
use crate::clock::{SharedClock, SystemClock};
use crate::metrics::Outcome;
use crate::observe::TopEntry;
use crate::policy::{Policy, Rule};
use crate::resilience::Posture;
use crate::store::{Charge, Decisions, INLINE_CHARGES, StoreBackend};

/// Why a request could not be decided. A store failure is not one of them: the failure
/// postures answer instead (see [`FailureSettings`]).
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The request is malformed; nothing was counted.
    #[error("invalid request: {0}")]
    Invalid(#[from] InvalidRequest),
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
    telemetry: Telemetry,
    /// Remembered store denials (`None` when disabled); used with a Redis store only.
    prefilter: Option<prefilter::Prefilter>,
    /// Local budgets in use on this replica.
    leases: local_budget::Leases,
    /// Counts policy replacements, for [`Limiter::epoch`].
    policy_epoch: AtomicU64,
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
            snapshot: ArcSwap::from_pointee(Snapshot::new(policy, None)),
            candidate: ArcSwapOption::empty(),
            store,
            fallback: Fallback::new(settings, clock.clone()),
            overrides: Overrides::default(),
            clock,
            telemetry: Telemetry::default(),
            prefilter: Some(prefilter::Prefilter::default()),
            leases: local_budget::Leases::default(),
            policy_epoch: AtomicU64::new(0),
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
        let next = Snapshot::new(policy, Some(&previous));
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
        self.telemetry.requests.fetch_add(1, Ordering::Relaxed);
        let started = tokio::time::Instant::now();
        // Not a `match`: its scrutinee, a whole response, would be kept across the await.
        let answer = if let Some(answer) = self.decide_in_place(request, true) {
            answer
        } else {
            Box::pin(self.decide(request, true)).await
        };
        self.telemetry.decision_latency.observe(started.elapsed());
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
        let planner = Planner {
            store: &self.store,
            overrides: &self.overrides,
        };
        // Plans are filled in place: each holds a few hundred bytes inline.
        let mut live = Plan::default();
        planner.plan(&snapshot.policy, request, now, Side::Live, &mut live)?;
        // A caller's limit of 0 denies the request whatever else is asked: its other limits
        // are only looked at, as explain does, so nothing is charged anywhere (store, local
        // share, lease).
        let commit = commit && !live.blocks();
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
                let side = Side::Candidate(c.hash());
                planner.plan(c.policy(), request, now, side, &mut plan)?;
                Some(plan)
            }
            None => None,
        };

        // One store call for both: the candidate's charges go after the live ones.
        let mut charges: SmallVec<[Charge<'_>; INLINE_CHARGES]> = SmallVec::new();
        let settings = &self.fallback.settings;
        live.push_charges(descriptors, true, settings, &mut charges);
        let live_charges = charges.len();
        if let Some(plan) = &shadow {
            plan.push_charges(descriptors, false, settings, &mut charges);
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
            && let Some((n, denial)) = self.prefiltered(&charges[..live_charges], now, epoch)
        {
            drop(charges);
            self.telemetry
                .prefilter_denials
                .fetch_add(1, Ordering::Relaxed);
            let told = answer::prefiltered(n, denial);
            return Ok(answer::build(
                &snapshot,
                descriptors,
                &mut live,
                told,
                true,
                now,
            ));
        }

        // Filled in place, like the plans: a few hundred bytes not copied from frame to frame.
        let mut decisions = Decisions::new();
        let answer = if charges.is_empty() {
            Ok(())
        } else {
            self.decide_with_budgets(&charges, (now, epoch), charge, &mut decisions)
                .await
        };
        let (at, shadowed) = ((now, epoch), shadow.is_some());
        let postures = self
            .settle(
                answer,
                (&charges, live_charges),
                shadowed,
                at,
                charge,
                &mut decisions,
            )
            .await;
        if postures.is_none()
            && let (Some(candidate), Some(plan)) = (&candidate, &shadow)
        {
            let shadowed = decisions.get(live_charges..).unwrap_or_default();
            answer::record_candidate(candidate, plan, descriptors, shadowed);
            decisions.truncate(live_charges);
        }
        if never_fits && postures.is_none() {
            answer_never_fits(&charges, live_charges, &mut decisions);
        }

        // The charges borrow the plan's keys; the limits move out of it below.
        drop(charges);
        let degraded = |n: usize| postures.as_ref().and_then(|p| p.get(n).copied().flatten());
        let told = decisions.iter().enumerate().map(|(n, &decision)| Told {
            decision: Some(decision),
            degraded: degraded(n),
        });
        let response = answer::build(&snapshot, descriptors, &mut live, told, commit, now);
        self.telemetry.note_answer(&response, commit);
        Ok(response)
    }

    /// The failure posture that answers for `limit` when the store cannot: its rule's
    /// `on_store_error`, else the default.
    pub fn posture_of(&self, limit: Option<&AppliedLimit>) -> Posture {
        fallback::posture_of(limit, &self.fallback.settings)
    }

    /// The runtime overrides.
    pub fn overrides(&self) -> &Overrides {
        &self.overrides
    }

    /// The clock decisions are made with.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Counts a request refused as invalid (`400`, `INVALID_ARGUMENT`), which the decision
    /// counters never see, and logs it at most once a second: a caller whose every request is
    /// malformed (a misconfigured Envoy, which then fails open) shows in the metrics and the log.
    pub fn note_invalid(&self, over: Transport, why: &dyn std::fmt::Display) {
        self.telemetry.note_invalid(over, why, self.clock.now());
    }

    /// Prometheus text for the decision counters and store gauges.
    pub async fn render_metrics(&self) -> String {
        let snapshot = self.snapshot.load();
        let candidate = self.candidate.load_full();
        let (prefilter, leases, store) = (self.prefilter(), &self.leases, &self.store);
        self.telemetry
            .render_metrics(&snapshot, candidate.as_deref(), prefilter, leases, store)
            .await
    }

    /// Count of `outcome` for `rule` in the current policy (for tests and summaries).
    pub fn rule_count(&self, rule: &Rule, outcome: Outcome) -> u64 {
        self.snapshot.load().counters.get(rule.index, outcome)
    }
}
