//! One decision, flowing down: plan the request (the live policy and a candidate), ask the
//! prefilter, then the store through its layers (hot keys, the failure postures), and build
//! the answer.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arc_swap::{ArcSwapOption, Guard};
use smallvec::SmallVec;
use tollgate_core::Timestamp;

use super::answer::{self, Told};
use super::candidate::Candidate;
use super::capacity::{
    answer_never_fits, cost_exceeds_capacity, exceeds_with_earlier, never_admitted,
};
use super::overrides::Overrides;
use super::plan::{Plan, Planner, Side};
use super::request::{CheckRequest, InvalidRequest};
use super::response::CheckResponse;
use super::snapshot::Snapshot;
use super::telemetry::Telemetry;
use crate::leases::{HotKeys, has_budgets};
use crate::resilience::{Degraded, Postures};
use crate::store::{Charge, Decisions, INLINE_CHARGES, MemoryStore, StoreBackend, StoreError};

/// What one decision reads of the limiter, borrowed for the request.
pub(super) struct Pipeline<'a> {
    pub snapshot: Guard<Arc<Snapshot>>,
    pub candidate: &'a ArcSwapOption<Candidate>,
    pub store: &'a StoreBackend,
    pub postures: &'a Postures,
    pub hot_keys: &'a HotKeys,
    pub overrides: &'a Overrides,
    pub telemetry: &'a Telemetry,
    /// When the decision is made, and the epoch its remembered denials and leases are valid
    /// in (read before the policy and overrides were).
    pub at: (Timestamp, u64),
}

/// A request's plans: the live policy's and, for a charged request while a candidate shadows,
/// the candidate's (boxed: a candidate is rare, and inline it would grow every decision).
#[derive(Default)]
struct Planned {
    live: Plan,
    candidate: Option<(Arc<Candidate>, Box<Plan>)>,
    /// Whether the request is charged.
    commit: bool,
}

type Charges<'p> = SmallVec<[Charge<'p>; INLINE_CHARGES]>;

impl Pipeline<'_> {
    /// Decides `request`, charging it when `commit`, on any store.
    pub async fn decide(
        &self,
        request: &CheckRequest,
        commit: bool,
    ) -> Result<CheckResponse, InvalidRequest> {
        // Plans are filled in place: each holds a few hundred bytes inline.
        let mut planned = Planned::default();
        self.plan(request, commit, &mut planned)?;
        let (charges, live) = self.charges(request, &planned);
        let fits = !never_fits(&charges, live);
        let charge = planned.commit && fits;
        if let Some(denial) = self.prefiltered(&planned, &charges[..live]) {
            drop(charges);
            return Ok(self.answer(
                request,
                &mut planned.live,
                answer::prefiltered(denial.0, denial.1),
                true,
            ));
        }
        // Filled in place, like the plans: a few hundred bytes not copied from frame to frame.
        let mut decisions = Decisions::new();
        let answer = if charges.is_empty() {
            Ok(())
        } else {
            let store = (self.store, &self.telemetry.store_latency);
            let call = self
                .hot_keys
                .decide(store, &charges, self.at, charge, &mut decisions);
            call.await
        };
        let answer = match answer {
            Err(StoreError::Partly {
                decided,
                cause,
                deadline,
            }) if partial_applies(&planned, &charges, live, &decided) => {
                let latency = &self.telemetry.store_latency[0];
                let partly = (decided, deadline);
                let postures = self.postures;
                let call = postures.decide_partly(
                    self.store,
                    latency,
                    &charges,
                    partly,
                    charge,
                    &mut decisions,
                );
                let answer = call.await;
                self.partly_decided(&answer, &cause, charge);
                answer.map(Some)
            }
            answer => answer.map(|()| None),
        };
        let postures = self.conclude(
            request,
            &planned,
            answer,
            (&charges, live, fits),
            &mut decisions,
        );
        // The charges borrow the plan's keys; the limits move out of it below.
        drop(charges);
        Ok(self.answer_decided(request, &mut planned, &decisions, postures))
    }

    /// [`Pipeline::decide`] on the memory store, which answers in place: made on this stack
    /// frame, with nothing to wait for (the hot-keys layer is inert on the memory store).
    /// `None` for a request the memory store could decide only in part (at its most keys,
    /// a limit on a new key): nothing was charged, and [`Pipeline::decide`] decides it again,
    /// letting the postures answer for the new keys.
    pub fn decide_now(
        &self,
        memory: &MemoryStore,
        request: &CheckRequest,
        commit: bool,
    ) -> Option<Result<CheckResponse, InvalidRequest>> {
        let mut planned = Planned::default();
        if let Err(invalid) = self.plan(request, commit, &mut planned) {
            return Some(Err(invalid));
        }
        let (charges, live) = self.charges(request, &planned);
        let fits = !never_fits(&charges, live);
        let charge = planned.commit && fits;
        let mut decisions = Decisions::new();
        if !charges.is_empty() {
            // Timed as `timed_store_call` times it; the memory store always reaches itself.
            let started = tokio::time::Instant::now();
            // Its one error is that partial answer, timed by the path that decides it again.
            memory.decide(&charges, charge, &mut decisions).ok()?;
            let latency = &self.telemetry.store_latency[usize::from(!charge)];
            latency.observe(started.elapsed());
        }
        let postures = self.conclude(
            request,
            &planned,
            Ok(None),
            (&charges, live, fits),
            &mut decisions,
        );
        drop(charges);
        Some(Ok(self.answer_decided(
            request,
            &mut planned,
            &decisions,
            postures,
        )))
    }

    /// What both paths do once the store answered (`answer`, with the postures that answered
    /// for part of the request, if any): settles it, and lets the candidate record its
    /// decisions. Returns the postures that answered, per live charge.
    fn conclude(
        &self,
        request: &CheckRequest,
        planned: &Planned,
        answer: Result<Option<Degraded>, StoreError>,
        (charges, live, fits): (&[Charge<'_>], usize, bool),
        decisions: &mut Decisions,
    ) -> Option<Degraded> {
        let charge = planned.commit && fits;
        let postures = self.settle(answer, (charges, live), charge, decisions);
        shadow_and_capacity(
            request,
            planned,
            (charges, live, fits),
            &postures,
            decisions,
        );
        postures
    }

    /// Plans `request` into `planned` (empty): the live policy, and a candidate's when the
    /// request is charged.
    fn plan(
        &self,
        request: &CheckRequest,
        commit: bool,
        planned: &mut Planned,
    ) -> Result<(), InvalidRequest> {
        let (now, _) = self.at;
        let planner = Planner {
            store: self.store,
            overrides: self.overrides,
        };
        let policy = &self.snapshot.policy;
        planner.plan(policy, request, now, Side::Live, &mut planned.live)?;
        // A caller's limit of 0 denies the request whatever else is asked: its other limits
        // are only looked at, as explain does, so nothing is charged anywhere (store, local
        // share, lease).
        planned.commit = commit && !planned.live.blocks();
        // Only charged decisions feed the candidate: explain shows the live policy alone.
        if planned.commit
            && let Some(c) = self.candidate.load_full()
        {
            let mut plan = Box::<Plan>::default();
            let side = Side::Candidate(c.hash());
            planner.plan(c.policy(), request, now, side, &mut plan)?;
            planned.candidate = Some((c, plan));
        }
        Ok(())
    }

    /// The charges of `planned`, and how many of them are the live policy's: one store call
    /// for both, the candidate's charges after the live ones.
    fn charges<'p>(&self, request: &CheckRequest, planned: &'p Planned) -> (Charges<'p>, usize) {
        let settings = &self.postures.settings;
        let mut charges = Charges::new();
        planned
            .live
            .push_charges(request, true, settings, &mut charges);
        let live = charges.len();
        if let Some((_, plan)) = &planned.candidate {
            plan.push_charges(request, false, settings, &mut charges);
        }
        (charges, live)
    }

    /// A live charge the prefilter denies, with its denial. Not while a candidate shadows: it
    /// must see every request the running policy decides.
    fn prefiltered(
        &self,
        planned: &Planned,
        live: &[Charge<'_>],
    ) -> Option<(usize, tollgate_core::Decision)> {
        if !planned.commit || planned.candidate.is_some() {
            return None;
        }
        let (now, epoch) = self.at;
        let denial = self.hot_keys.prefiltered(self.store, live, now, epoch)?;
        self.telemetry
            .prefilter_denials
            .fetch_add(1, Ordering::Relaxed);
        Some(denial)
    }

    /// Counts the cause of a partial answer the postures completed.
    fn partly_decided<T>(&self, answer: &Result<T, StoreError>, cause: &StoreError, commit: bool) {
        if commit && answer.is_ok() {
            self.telemetry.note_store_error(cause, self.at.0);
        }
    }

    /// Settles the store's `answer` to the request's charges (the first `live` of them the
    /// live plan's): decided by the store, remembers the live denials for the prefilter when
    /// `commit`; else the postures answer for the whole request. Returns, per live charge, the
    /// posture that answered, or `None` when the store decided it all.
    fn settle(
        &self,
        answer: Result<Option<Degraded>, StoreError>,
        (charges, live): (&[Charge<'_>], usize),
        commit: bool,
        decisions: &mut Decisions,
    ) -> Option<Degraded> {
        let (now, epoch) = self.at;
        match answer {
            Ok(Some(degraded)) => Some(degraded),
            Ok(None) => {
                if commit {
                    let live_decisions = decisions.get(..live).unwrap_or_default();
                    let (store, live) = (self.store, &charges[..live]);
                    self.hot_keys
                        .remember_denials(store, live, live_decisions, now, epoch);
                }
                None
            }
            Err(e) => {
                if commit {
                    self.telemetry.note_store_error(&e, now);
                }
                // The failure postures answer for the live policy only; the candidate skips
                // this request rather than report what a posture decided.
                let live_only = charges.get(..live).unwrap_or_default();
                // A cost its counter can never hold needs no store to be answered: refused as
                // such, not let through by `open` nor sent to retry by `closed`, and nothing is
                // charged to a `local` share for the request it denies.
                let hopeless = |i: &usize| never_admitted(live_only, *i);
                let any_hopeless = (0..live_only.len()).any(|i| hopeless(&i));
                let charge = commit && !any_hopeless;
                let (answered, mut degraded) = self.postures.answer_all(live_only, charge);
                *decisions = answered;
                for i in (0..live_only.len().min(decisions.len())).filter(hopeless) {
                    decisions[i] = cost_exceeds_capacity(decisions[i]);
                    degraded[i] = None;
                }
                Some(degraded)
            }
        }
    }

    /// The answer to `planned`'s request from `decisions` and the postures that answered.
    fn answer_decided(
        &self,
        request: &CheckRequest,
        planned: &mut Planned,
        decisions: &Decisions,
        postures: Option<Degraded>,
    ) -> CheckResponse {
        let degraded = |n: usize| postures.as_ref().and_then(|p| p.get(n).copied().flatten());
        let told = decisions.iter().enumerate().map(|(n, &decision)| Told {
            decision: Some(decision),
            degraded: degraded(n),
        });
        let commit = planned.commit;
        let response = self.answer(request, &mut planned.live, told, commit);
        self.telemetry.note_answer(&response, commit);
        response
    }

    fn answer(
        &self,
        request: &CheckRequest,
        live: &mut Plan,
        told: impl IntoIterator<Item = Told>,
        commit: bool,
    ) -> CheckResponse {
        let descriptors = request.descriptors();
        let mut response =
            answer::build(&self.snapshot, descriptors, live, told, commit, self.at.0);
        answer::mark_unlimited(&self.snapshot.policy, request, &mut response);
        response
    }
}

/// Once the store decided: the candidate records what its charges got, and a request whose
/// costs add up past what a counter can ever hold (`fits` false) is answered as such.
fn shadow_and_capacity(
    request: &CheckRequest,
    planned: &Planned,
    (charges, live, fits): (&[Charge<'_>], usize, bool),
    postures: &Option<Degraded>,
    decisions: &mut Decisions,
) {
    if postures.is_some() {
        return;
    }
    if let Some((candidate, plan)) = &planned.candidate {
        let shadowed = decisions.get(live..).unwrap_or_default();
        answer::record_candidate(candidate, plan, request.descriptors(), shadowed);
        decisions.truncate(live);
    }
    if !fits {
        answer_never_fits(charges, live, decisions);
    }
}

/// Charges of one request on one counter are decided in order, each on top of the ones before
/// it: costs that add up past what the counter can ever hold are never admitted together. Such
/// a request is looked at, charging nothing, and answered as a cost above the capacity, not as
/// a denial a retry would clear (it never would).
fn never_fits(charges: &[Charge<'_>], live: usize) -> bool {
    (0..live).any(|i| exceeds_with_earlier(charges, i))
}

/// Whether the postures answer for the limits a partial answer (`decided`) left alone: a
/// cluster primary down under part of the request, or a full memory store and a limit on a
/// key it does not hold. Not with a candidate or local budgets in the call: they take the
/// postures for the whole request, as any other store failure.
fn partial_applies(
    planned: &Planned,
    charges: &[Charge<'_>],
    live: usize,
    decided: &[Option<tollgate_core::Decision>],
) -> bool {
    planned.candidate.is_none() && decided.len() == charges.len() && !has_budgets(&charges[..live])
}
