//! The [`Limiter`]: matches a request against the policy, charges the store, builds the answer.

mod answer;
mod build;
mod candidate;
mod decide;
mod decimal;
mod describe;
pub mod headers;
mod keys;
mod overrides;
mod plan;
mod request;
mod response;
mod shadow;
mod single;
mod snapshot;
mod stack;
mod telemetry;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate_core::Timestamp;

pub use crate::resilience::FailureSettings;
pub use candidate::{CANDIDATE_DECISIONS, Candidate, RuleReport};
pub use keys::{override_key_bytes, rule_key_bytes};
pub use overrides::{
    DEFAULT_MAX_OVERRIDES, Override, OverrideChange, OverrideError, Overrides, Target,
    UnfitOverride,
};
pub use request::{
    CheckRequest, InvalidRequest, LimitError, LimitOverride, MAX_BODY, MAX_COST, MAX_DESCRIPTORS,
    MAX_ENTRIES, MAX_FIELD_LEN, RequestDescriptor, check_cost, normalized_path,
};
pub use response::{AppliedLimit, CheckResponse, Code, DescriptorStatus, Statuses};
pub use telemetry::Transport;

use self::decide::Pipeline;
use self::shadow::CandidateSlot;
use self::snapshot::Snapshot;
use self::stack::Stack;
use self::telemetry::Telemetry;
use crate::clock::SharedClock;
use crate::metrics::Outcome;
use crate::observe::TopEntry;
use crate::observe::history::Metrics;
use crate::observe::shares::ValueShares;
use crate::policy::{Policy, Rule};
use crate::resilience::Posture;
use crate::store::{Mode, StoreBackend};

/// Decides requests against the current policy using one store.
#[derive(Debug)]
pub struct Limiter {
    snapshot: ArcSwap<Snapshot>,
    /// A policy decided beside the live one and never enforced (see [`Candidate`]).
    candidate: CandidateSlot,
    /// The store under its layers.
    stack: Stack,
    overrides: Overrides,
    clock: SharedClock,
    telemetry: Telemetry,
    /// Counts policy replacements, for [`Limiter::epoch`].
    policy_epoch: AtomicU64,
}

impl Limiter {
    /// The server-wide failure settings.
    pub fn failure_settings(&self) -> &FailureSettings {
        &self.stack.settings
    }

    /// The in-process store of the `local` posture (for sweeping and tests).
    pub fn local_store(&self) -> &crate::store::MemoryStore {
        self.stack.local_store()
    }

    /// Drops expired counters from the in-process stores: the memory store, if that is the
    /// store, and the `local` posture's (Redis expires its keys itself: every key has a TTL);
    /// and the runtime overrides that expired, each logged once.
    pub fn sweep_expired(&self) {
        if let Some(m) = self.store().memory() {
            m.sweep_now();
        }
        self.local_store().sweep_now();
        self.overrides.drop_expired(self.clock().now());
    }

    /// The `n` keys `rule` (by domain and name) denied most often since the process started
    /// (or since a policy change brought the rule in), or `None` if no such rule runs.
    pub fn top_keys(&self, domain: &str, rule: &str, n: usize) -> Option<Vec<TopEntry>> {
        self.snapshot.load().top_keys(domain, rule, n)
    }

    /// The would-deny shares per value of `rule` (a rule of the policy in force, a shadow rule
    /// among the first [`MAX_RULES`](crate::observe::shares::MAX_RULES)), or `None`.
    pub fn value_shares(&self, rule: &Rule) -> Option<Arc<ValueShares>> {
        self.snapshot.load().value_shares(rule)
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<Policy> {
        self.snapshot.load().policy.clone()
    }

    /// Replaces the policy atomically; requests in flight finish on the old one. A runtime
    /// override that applied and applies to nothing under the new policy is logged.
    pub fn replace_policy(&self, policy: Policy) {
        let previous = self.snapshot.load_full();
        self.overrides.warn_orphaned(&previous.policy, &policy);
        let next = Snapshot::new(policy, Some(&previous));
        self.snapshot.store(Arc::new(next));
        // After the store: a decision made under the old policy records the old epoch.
        self.policy_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The shared store lost its data (Redis restarted empty, was flushed, or failed over to an
    /// empty replica): the local budgets are forfeit (dropped, never given back), then a new
    /// epoch forgets the remembered denials. In that order: a lease of the old epoch seen after
    /// the new one begins is given back, and only leases reserved after the forfeit can be.
    pub fn store_data_lost(&self) {
        self.stack.hot_keys().forfeit();
        self.policy_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The store.
    pub fn store(&self) -> &StoreBackend {
        self.stack.store()
    }

    /// Sets (or with `None` clears) the shadow candidate; returns the one it replaces. Requests
    /// in flight finish with the candidate they started with.
    pub fn set_candidate(&self, candidate: Option<Arc<Candidate>>) -> Option<Arc<Candidate>> {
        self.candidate.swap(candidate)
    }

    /// Clears the candidate if it is still `expected`; returns whether it was.
    pub fn clear_candidate(&self, expected: &Arc<Candidate>) -> bool {
        self.candidate.clear(expected)
    }

    /// The shadow candidate, if one is set.
    pub fn candidate(&self) -> Option<Arc<Candidate>> {
        self.candidate.load()
    }

    /// Decides one request. A denial is `Ok` with `overall == OverLimit`; `Err` means the
    /// request is invalid (nothing was counted).
    pub async fn check(&self, request: &CheckRequest) -> Result<CheckResponse, LimitError> {
        let started = tokio::time::Instant::now();
        {
            // In a block: neither the answer nor the plan's borrows are kept in this future
            // across the await below. The answer is built in the `Result` returned, written out
            // here: a response moved into one, or made by a call and wrapped, was copied whole
            // before the copy that returns it.
            let mut answer: Result<CheckResponse, LimitError> = Ok(CheckResponse {
                overall: Code::Ok,
                statuses: Statuses::new(),
            });
            if let Ok(response) = &mut answer
                && let Some(decided) = self.decide_in_place(started, request, true, response)
            {
                // One clock read times both the decision and, in it, the store's call.
                let took = started.elapsed();
                let telemetry = &self.telemetry;
                match decided {
                    // The common case: one duration, observed once for both series.
                    Ok(Some(Mode::Apply)) => telemetry.in_place.observe(took),
                    Ok(called) => {
                        telemetry.decision_latency.observe(took);
                        self.time_in_place(called, took);
                    }
                    Err(invalid) => {
                        telemetry.decision_latency.observe(took);
                        answer = Err(invalid);
                    }
                }
                return answer;
            }
        }
        let answer = Box::pin(self.decide(started, request, true)).await;
        self.telemetry.decision_latency.observe(started.elapsed());
        answer
    }

    /// Decides one request without charging anything or counting it in the decision metrics
    /// (its store call is timed as `op="peek"`): which rules match, which binds, and the
    /// current counters.
    pub async fn explain(&self, request: &CheckRequest) -> Result<CheckResponse, LimitError> {
        let started = tokio::time::Instant::now();
        {
            let mut response = answer::empty();
            if let Some(decided) = self.decide_in_place(started, request, false, &mut response) {
                return match decided {
                    Ok(called) => {
                        self.time_in_place(called, started.elapsed());
                        Ok(response)
                    }
                    Err(invalid) => Err(invalid),
                };
            }
        }
        Box::pin(self.decide(started, request, false)).await
    }

    /// The decision on the memory store, made on this stack frame into `response`
    /// ([`answer::empty`]): the common request of one limited descriptor on a path of its own
    /// (`single`), any other on the general one; `None` on Redis, and for the rare request the
    /// memory store at its most keys decides only in part.
    ///
    /// A decision holds the plans and decisions inline (about 1.4 KB). In a future awaited by
    /// the caller, they would sit inside the caller's future, which the HTTP and gRPC servers
    /// box per request: above glibc's 1 KB per-thread cache, so every request took the
    /// allocator's shared arena lock and consolidated its free lists. The memory store answers
    /// in place, so its decision is a plain call that never outlives this one; Redis futures
    /// are boxed on their own instead.
    ///
    /// The response is filled where the caller returns it from: built in a frame below and
    /// returned through each, its inline status (128 bytes) was copied at every step.
    ///
    /// Returns the mode of the store's call, `None` when the request charged nothing.
    fn decide_in_place(
        &self,
        started: tokio::time::Instant,
        request: &CheckRequest,
        commit: bool,
        response: &mut CheckResponse,
    ) -> Option<Result<Option<Mode>, LimitError>> {
        let memory = self.store().memory()?;
        let pipeline = self.pipeline(started);
        // A memory store on this limiter's clock (as `serve` runs it) is charged at the
        // decision's own time, read once for both; one on a clock of its own reads that.
        let now = if memory.reads(&self.clock) {
            pipeline.at.0
        } else {
            memory.now()
        };
        let memory = (memory, now);
        if let Some(mode) = pipeline.decide_single(memory, request, commit, response) {
            return Some(Ok(Some(mode)));
        }
        let decided = pipeline.decide_now(memory, request, commit, response)?;
        Some(decided.map_err(LimitError::from))
    }

    /// The decision on any store, through the stack's layers, at the time of `started`.
    async fn decide(
        &self,
        started: tokio::time::Instant,
        request: &CheckRequest,
        commit: bool,
    ) -> Result<CheckResponse, LimitError> {
        Ok(self.pipeline(started).decide(request, commit).await?)
    }

    /// Times the memory store's call in place (`called`: its mode, if it was called) as the
    /// decision it was part of, which took `took`, as the stack's `Timed` layer would time it:
    /// in process both fall in the lowest latency bucket (10 µs), and two more clock reads
    /// (26–30 ns each on a virtual machine, more on a busy core) would cost a tenth of a
    /// decision.
    fn time_in_place(&self, called: Option<Mode>, took: Duration) {
        if let Some(mode) = called {
            self.stack.timed().latency_of(mode).observe(took);
        }
    }

    /// One decision's path through the limiter's parts, at the time of `started` (a reading of
    /// the monotonic clock just taken, which also times the decision: one read for both) and
    /// the current policy.
    fn pipeline(&self, started: tokio::time::Instant) -> Pipeline<'_> {
        // Before the policy and overrides are read: what is remembered under this epoch was
        // decided with them or newer ones.
        let epoch = self.epoch();
        Pipeline {
            snapshot: self.snapshot.load(),
            candidate: &self.candidate,
            stack: &self.stack,
            overrides: &self.overrides,
            telemetry: &self.telemetry,
            at: (self.clock.now_at(started.into_std()), epoch),
        }
    }

    /// The epoch denials and leases are valid in: it changes with the policy (a reload, a
    /// rollback) and with every runtime override set, deleted or adopted.
    fn epoch(&self) -> u64 {
        (self.policy_epoch.load(Ordering::Acquire) << 32)
            | (self.overrides.generation() & 0xffff_ffff)
    }

    /// How often [`Limiter::sweep_hot_keys`] should run: unused local budgets of keys gone
    /// quiet go back to the store within this.
    pub const HOT_KEY_SWEEP: Duration = Duration::from_millis(50);

    /// Gives back the unused units of lapsed leases and forgets cleared denials. Returns how
    /// many keys got units back.
    pub async fn sweep_hot_keys(&self) -> usize {
        let (now, epoch) = (self.clock.now(), self.epoch());
        self.stack.hot_keys().sweep(now, epoch).await
    }

    /// Gives back every local budget now (at shutdown). Returns how many keys got units back.
    pub async fn release_local_budgets(&self) -> usize {
        self.stack
            .hot_keys()
            .release(Timestamp::MAX, self.epoch())
            .await
    }

    /// The posture that answers for `limit` when the store cannot: its rule's, else the default.
    pub fn posture_of(&self, limit: Option<&AppliedLimit>) -> Posture {
        plan::posture_of(limit, &self.stack.settings)
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
        let (snapshot, candidate) = (self.snapshot.load(), self.candidate.load());
        let posture = self.stack.settings.posture;
        self.telemetry
            .render_metrics(
                &snapshot,
                posture,
                candidate.as_deref(),
                self.stack.hot_keys(),
            )
            .await
    }

    /// The counters the dashboard's history samples once a second, read without rendering.
    pub fn sample_metrics(&self) -> Metrics {
        let posture = self.stack.settings.posture;
        let latency = self.stack.timed().latency();
        self.telemetry
            .sample(&self.snapshot.load(), posture, latency)
    }

    /// Count of `outcome` for `rule` in the current policy (for tests and summaries).
    pub fn rule_count(&self, rule: &Rule, outcome: Outcome) -> u64 {
        self.snapshot.load().counters.get(rule.index, outcome)
    }
}
