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
use tollgate_core::Decision;

use super::postures::Postures;
use crate::store::{
    Charge, Decisions, Degraded, INLINE_CHARGES, Invalid, Store, StoreError, admitted,
};

/// The store's answer where its node answered (see [`StoreError::Partly`]): per charge, its
/// decision as it stands, `None` where it could not be decided; and the request's deadline.
pub type Partly = (Vec<Option<Decision>>, Instant);

/// What the postures answer for the charges the store could not decide, charging nothing yet,
/// and whether the request is admitted.
struct Look<'c> {
    failed: SmallVec<[Charge<'c>; INLINE_CHARGES]>,
    answered: Decisions,
    admitted: bool,
}

/// Whether the request is still admitted with the store's charged `answer` for `healthy` and
/// the postures' look at the others: the quota limits together.
fn admitted_with(look: &Look<'_>, healthy: &[Charge<'_>], answer: &[Decision]) -> bool {
    let failed: &[Charge<'_>] = &look.failed;
    let charges: SmallVec<[Charge<'_>; INLINE_CHARGES]> =
        healthy.iter().chain(failed).copied().collect();
    let decisions: Decisions = answer.iter().chain(&look.answered).copied().collect();
    admitted(&charges, &decisions)
}

impl<S: Store> Postures<S> {
    /// Decides `charges` from `partly` and the postures elsewhere; charges them through the
    /// store when `commit` and the request is admitted. Fills `decisions`. An error when the
    /// charging call fails: the postures then answer for the whole request.
    pub async fn decide_partly(
        &self,
        charges: &[Charge<'_>],
        (decided, deadline): Partly,
        commit: bool,
        decisions: &mut Decisions,
    ) -> Result<Degraded, StoreError> {
        let mut look = self.look(charges, &decided);
        let mut charged = None;
        if look.admitted && commit {
            let healthy = healthy(charges, &decided);
            // The request's quota limits are decided here, across both parts.
            let apart = apart(&healthy);
            let answer = self.inner().apply_before(&apart, deadline).await?;
            self.charged(&mut look, &healthy, &answer);
            charged = Some(answer);
        }
        finish(charges, decided, look, charged, decisions)
    }

    fn look<'c>(&self, charges: &[Charge<'c>], decided: &[Option<Decision>]) -> Look<'c> {
        let failed: SmallVec<[Charge<'c>; INLINE_CHARGES]> = (0..charges.len())
            .filter(|&i| decided[i].is_none())
            .map(|i| charges[i])
            .collect();
        // What the postures would answer, charging nothing yet.
        let answered = self.by_posture(&failed, false);
        // The store's decisions where it decided, the postures' elsewhere, in request order.
        let mut postured = answered.iter();
        let whole: Decisions = decided
            .iter()
            .filter_map(|d| d.or_else(|| postured.next().copied()))
            .collect();
        let admitted = whole.len() == charges.len() && admitted(charges, &whole);
        Look {
            failed,
            answered,
            admitted,
        }
    }

    /// The store charged `healthy` with `answer`: the postures charge their limits too, unless
    /// a concurrent request took the last of a quota since the first look. (The `local` shares
    /// are charged after the store: one taken meanwhile on this replica leaves the store's
    /// charges standing for a denied request, under the limit, never over.)
    fn charged(&self, look: &mut Look<'_>, healthy: &[Charge<'_>], answer: &[Decision]) {
        if admitted_with(look, healthy, answer) {
            look.answered = self.by_posture(&look.failed, true);
        }
    }
}

/// The charges the store decided.
fn healthy<'c>(
    charges: &[Charge<'c>],
    decided: &[Option<Decision>],
) -> SmallVec<[Charge<'c>; INLINE_CHARGES]> {
    (0..charges.len())
        .filter(|&i| decided[i].is_some())
        .map(|i| charges[i])
        .collect()
}

/// `charges` for a store call that decides them apart from the rest of their request: each
/// quota limit as one that does not enforce (see [`Charge::apart`]).
fn apart<'c>(charges: &[Charge<'c>]) -> SmallVec<[Charge<'c>; INLINE_CHARGES]> {
    charges.iter().map(Charge::apart).collect()
}

/// Fills `decisions`: the store's (as charged, else as they stood) where it decided, the
/// postures' elsewhere. Returns, per charge, the posture that answered.
fn finish(
    charges: &[Charge<'_>],
    decided: Vec<Option<Decision>>,
    look: Look<'_>,
    charged: Option<Vec<Decision>>,
    decisions: &mut Decisions,
) -> Result<Degraded, StoreError> {
    let mut charged = charged.into_iter().flatten();
    let mut answered = look.answered.into_iter();
    let mut degraded = Degraded::new();
    decisions.clear();
    for (i, looked) in decided.into_iter().enumerate() {
        let decision = match looked {
            Some(looked) => charged.next().unwrap_or(looked),
            None => answered
                .next()
                .ok_or(StoreError::InvalidData(Invalid::TooFewFromPostures))?,
        };
        decisions.push(decision);
        degraded.push(looked.is_none().then(|| charges[i].posture));
    }
    Ok(degraded)
}
