//! One decision, flowing down: plan the request (the live policy and a candidate), ask the
//! prefilter, then the store through its layers (hot keys, the failure postures), and build
//! the answer.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arc_swap::Guard;
use smallvec::SmallVec;
use tollgate_core::Timestamp;

use super::answer::{self, Told};
use super::candidate::Candidate;
use super::overrides::Overrides;
use super::plan::{Plan, Planner, Side};
use super::request::{CheckRequest, InvalidRequest};
use super::response::CheckResponse;
use super::shadow::CandidateSlot;
use super::snapshot::Snapshot;
use super::stack::Stack;
use super::telemetry::Telemetry;
use crate::store::{
    Answered, Call, Charge, Decisions, Degraded, INLINE_CHARGES, MemoryStore, Mode,
    answer_never_fits, exceeds_with_earlier,
};

/// What one decision reads of the limiter, borrowed for the request.
pub(super) struct Pipeline<'a> {
    pub snapshot: Guard<Arc<Snapshot>>,
    pub candidate: &'a CandidateSlot,
    /// The store under its layers.
    pub stack: &'a Stack,
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
    /// Decides `request`, charging it when `commit`, on any store: the plan's charges go down
    /// the stack in one call, and whatever answered them (the store, a remembered denial, the
    /// postures) comes back up into one answer.
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
        let call = self.call(planned.commit && fits, live);
        // Filled in place, like the plans: a few hundred bytes not copied from frame to frame.
        let mut decisions = Decisions::new();
        let answered = if charges.is_empty() {
            Answered::Store
        } else {
            let stack = self.stack.decide_or_answer(call, &charges, &mut decisions);
            stack.await
        };
        let postures = match answered {
            Answered::Store => None,
            Answered::Remembered { index, denial } => {
                self.telemetry
                    .prefilter_denials
                    .fetch_add(1, Ordering::Relaxed);
                drop(charges);
                let told = answer::prefiltered(index, denial);
                let mut response = answer::empty();
                self.answer(request, &mut planned.live, told, true, &mut response);
                return Ok(response);
            }
            Answered::Postures { degraded, cause } => {
                if call.mode.applies() {
                    self.telemetry.note_store_error(&cause, call.now);
                }
                Some(degraded)
            }
        };
        shadow_and_capacity(
            request,
            &planned,
            (&charges, live, fits),
            &postures,
            &mut decisions,
        );
        // The charges borrow the plan's keys; the limits move out of it below.
        drop(charges);
        let mut response = answer::empty();
        self.answer_decided(request, &mut planned, &decisions, postures, &mut response);
        Ok(response)
    }

    /// [`Pipeline::decide`] on the memory store, which answers in place: made on this stack
    /// frame, with nothing to wait for. The layers above it would change nothing (it grants no
    /// leases, so no denial is remembered; it fails only in part): it is called below them.
    /// `None` for a request the memory store could decide only in part (at its most keys,
    /// a limit on a new key): nothing was charged, and [`Pipeline::decide`] decides it again,
    /// letting the postures answer for the new keys.
    ///
    /// `memory` is the store and the time on its clock. The answer is filled into `response`
    /// ([`answer::empty`]), which the caller keeps. Returns the mode of the store's call, for
    /// the caller to time as the stack's `Timed` layer would; `None` when the request charged
    /// nothing, so the store was not called.
    pub fn decide_now(
        &self,
        (memory, now): (&MemoryStore, Timestamp),
        request: &CheckRequest,
        commit: bool,
        response: &mut CheckResponse,
    ) -> Option<Result<Option<Mode>, InvalidRequest>> {
        let mut planned = Planned::default();
        if let Err(invalid) = self.plan(request, commit, &mut planned) {
            return Some(Err(invalid));
        }
        let (charges, live) = self.charges(request, &planned);
        let fits = !never_fits(&charges, live);
        let charge = planned.commit && fits;
        let mut decisions = Decisions::new();
        let called = !charges.is_empty();
        if called {
            // Its one error is that partial answer, timed by the path that decides it again.
            memory
                .decide_at(now, &charges, charge, &mut decisions)
                .ok()?;
        }
        shadow_and_capacity(
            request,
            &planned,
            (&charges, live, fits),
            &None,
            &mut decisions,
        );
        drop(charges);
        self.answer_decided(request, &mut planned, &decisions, None, response);
        Some(Ok(called.then_some(Mode::of(charge))))
    }

    /// The call of a request's charges, the first `live` of them the live plan's.
    fn call(&self, commit: bool, live: usize) -> Call {
        let (now, epoch) = self.at;
        Call {
            mode: Mode::of(commit),
            now,
            epoch,
            live,
        }
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
            store: self.stack.store(),
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
            && let Some(c) = self.candidate.load()
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
        let settings = &self.stack.settings;
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

    /// The answer to `planned`'s request from `decisions` and the postures that answered,
    /// filled into `response` ([`answer::empty`]).
    fn answer_decided(
        &self,
        request: &CheckRequest,
        planned: &mut Planned,
        decisions: &Decisions,
        postures: Option<Degraded>,
        response: &mut CheckResponse,
    ) {
        let degraded = |n: usize| postures.as_ref().and_then(|p| p.get(n).copied().flatten());
        let told = decisions.iter().enumerate().map(|(n, &decision)| Told {
            decision: Some(decision),
            degraded: degraded(n),
        });
        let commit = planned.commit;
        self.answer(request, &mut planned.live, told, commit, response);
        self.telemetry.note_answer(response, commit);
    }

    fn answer(
        &self,
        request: &CheckRequest,
        live: &mut Plan,
        told: impl IntoIterator<Item = Told>,
        commit: bool,
        response: &mut CheckResponse,
    ) {
        let descriptors = request.descriptors();
        let now = self.at.0;
        answer::build(
            &self.snapshot,
            descriptors,
            live,
            told,
            commit,
            now,
            response,
        );
        answer::mark_unlimited(&self.snapshot.policy, request, response);
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
