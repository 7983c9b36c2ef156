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
use tollgate_core::{Decision, Verdict};

use super::{Limiter, Plan, timed_store_call};
use crate::resilience::Posture;
use crate::store::{Charge, Decisions, INLINE_CHARGES, StoreError};

/// Per charge: the posture that answered for it, `None` where the store decided.
pub(super) type Degraded = SmallVec<[Option<Posture>; INLINE_CHARGES]>;

impl Limiter {
    /// Decides `charges` (the live plan's) from `decided`, the store's answer where its node
    /// answered (see [`StoreError::Partly`]), and the postures elsewhere; charges them when
    /// `commit` and the request is admitted. Fills `decisions`. An error when the charging call
    /// fails: the postures then answer for the whole request.
    pub(super) async fn decide_partly(
        &self,
        live: &Plan,
        charges: &[Charge<'_>],
        (decided, deadline): (Vec<Option<Decision>>, Instant),
        commit: bool,
        decisions: &mut Decisions,
    ) -> Result<Degraded, StoreError> {
        let (postures, shares) = self.postures_and_shares(live);
        let failed: SmallVec<[usize; INLINE_CHARGES]> = (0..charges.len())
            .filter(|&i| decided[i].is_none())
            .collect();
        let failed_charges: SmallVec<[Charge<'_>; INLINE_CHARGES]> =
            failed.iter().map(|&i| charges[i]).collect();
        let failed_postures: SmallVec<[Posture; INLINE_CHARGES]> =
            failed.iter().map(|&i| postures[i]).collect();
        let failed_shares: SmallVec<[f64; INLINE_CHARGES]> =
            failed.iter().map(|&i| shares[i]).collect();
        let posture = |commit| {
            self.fallback
                .decide(&failed_charges, &failed_postures, &failed_shares, commit)
        };
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
            let call = self.store.apply_before(&healthy, deadline);
            let answer = timed_store_call(&self.store_latency[0], call).await?;
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
            degraded.push(looked.is_none().then(|| postures[i]));
        }
        Ok(degraded)
    }
}
