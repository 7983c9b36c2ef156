//! A request the store could decide only in part: its counters span Redis Cluster primaries,
//! some of which could not answer, or the memory store is full and some of its counters are
//! new. The failure postures answer for those limits alone, and the store decides the others.
//!
//! The request is still all-or-nothing: it is admitted only when every enforced limit allows
//! it, whether the store decided the limit or a posture did; then the limits the store decided
//! are charged in one more call within the request's deadline, and the `local` postures'
//! shares after it. Otherwise nothing is charged anywhere.

use smallvec::SmallVec;
use tokio::time::Instant;
use tollgate_core::{Decision, Timestamp, Verdict};

use super::Limiter;
use super::fallback::Degraded;
use super::hot_keys::has_budgets;
use super::telemetry::timed_store_call;
use crate::store::{Charge, Decisions, INLINE_CHARGES, Store, StoreError};

impl Limiter {
    /// Decides `charges` (the live plan's) from `decided`, the store's answer where its node
    /// answered (see [`StoreError::Partly`]), and the postures elsewhere; charges them when
    /// `commit` and the request is admitted. Fills `decisions`. An error when the charging call
    /// fails: the postures then answer for the whole request.
    pub(super) async fn decide_partly(
        &self,
        charges: &[Charge<'_>],
        (decided, deadline): (Vec<Option<Decision>>, Instant),
        commit: bool,
        decisions: &mut Decisions,
    ) -> Result<Degraded, StoreError> {
        let failed_charges: SmallVec<[Charge<'_>; INLINE_CHARGES]> = (0..charges.len())
            .filter(|&i| decided[i].is_none())
            .map(|i| charges[i])
            .collect();
        let posture = |commit| self.fallback.decide(&failed_charges, commit);
        let denies = |c: &Charge<'_>, d: &Decision| c.enforce && d.verdict != Verdict::Allowed;

        // What the postures would answer, charging nothing yet.
        let mut answered = posture(false);
        let admitted = charges
            .iter()
            .zip(&decided)
            .all(|(c, d)| d.as_ref().is_none_or(|d| !denies(c, d)))
            && failed_charges
                .iter()
                .zip(&answered)
                .all(|(c, d)| !denies(c, d));
        let mut charged = None;
        if admitted && commit {
            let healthy: SmallVec<[Charge<'_>; INLINE_CHARGES]> = (0..charges.len())
                .filter(|&i| decided[i].is_some())
                .map(|i| charges[i])
                .collect();
            let call = Store::apply_before(&self.store, &healthy, deadline);
            let answer = timed_store_call(&self.telemetry.store_latency[0], call).await?;
            // A concurrent request may have taken the last of a quota since the first look. (The
            // `local` shares are charged after Redis: one taken meanwhile on this replica leaves
            // Redis's charges standing for a denied request, under the limit, never over.)
            if healthy.iter().zip(&answer).all(|(c, d)| !denies(c, d)) {
                answered = posture(true);
            }
            charged = Some(answer);
        }

        let mut charged = charged.into_iter().flatten();
        let mut answered = answered.into_iter();
        let mut degraded = Degraded::new();
        decisions.clear();
        for (i, looked) in decided.into_iter().enumerate() {
            let decision = match looked {
                Some(looked) => charged.next().unwrap_or(looked),
                None => answered.next().ok_or_else(|| {
                    StoreError::InvalidData("the postures answered too few decisions".into())
                })?,
            };
            decisions.push(decision);
            degraded.push(looked.is_none().then(|| charges[i].posture));
        }
        Ok(degraded)
    }
}

impl Limiter {
    /// Settles the store's `answer` to the request's charges (the first `live` of them the
    /// live plan's, `shadowed` when a candidate's follow): on success, remembers the live
    /// denials for the prefilter when `commit`; on a failure the postures answer, for the
    /// limits the store could not decide (a partial answer) or for the whole request. Returns,
    /// per live charge, the posture that answered, or `None` when the store decided it all.
    pub(super) async fn settle(
        &self,
        answer: Result<(), StoreError>,
        (charges, live): (&[Charge<'_>], usize),
        shadowed: bool,
        (now, epoch): (Timestamp, u64),
        commit: bool,
        decisions: &mut Decisions,
    ) -> Option<Degraded> {
        // A cluster primary down under part of the request, or a full memory store and a
        // limit on a key it does not hold: the postures answer for those limits alone (not
        // with a candidate or local budgets in the call: they take the postures for the whole
        // request, as any other store failure).
        let answer = match answer {
            Err(StoreError::Partly {
                decided,
                cause,
                deadline,
            }) if !shadowed && decided.len() == charges.len() && !has_budgets(&charges[..live]) => {
                let partly = (decided, deadline);
                let answer = self.decide_partly(charges, partly, commit, decisions).await;
                if commit && answer.is_ok() {
                    self.telemetry.note_store_error(&cause, now);
                }
                answer.map(Some)
            }
            answer => answer.map(|()| None),
        };
        match answer {
            Ok(Some(degraded)) => Some(degraded),
            Ok(None) => {
                if commit {
                    let live_decisions = decisions.get(..live).unwrap_or_default();
                    self.remember_denials(charges, live_decisions, now, epoch);
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
                let (answered, degraded) = self.fallback.answer_all(live_only, commit);
                *decisions = answered;
                Some(degraded)
            }
        }
    }
}
