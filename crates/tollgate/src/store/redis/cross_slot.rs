//! A request whose counters span several slots of a cluster: peek everywhere, then charge
//! everywhere, refunding the slots that charged when another lost a race or failed (see the
//! module docs of [`super`]: all-or-nothing on a cluster).

use std::ops::Range;
use std::time::Duration;

use futures_util::future::join_all;
use tollgate_core::Decision;
use tracing::warn;

use super::decide::{Group, Reply};
use super::patience::Deadline;
use super::script::charge_args;
use super::store::RedisStore;
use super::timeout::within;
use crate::store::{Charge, Failure, RedisCall, StoreError, admitted};

impl RedisStore {
    async fn run_refund(
        &self,
        charges: &[Charge<'_>],
        keys: &[u8],
        spans: &[Range<usize>],
        group: &Group,
        reply: &Reply,
        deadline: Deadline,
    ) -> Result<(), StoreError> {
        let mut invocation = self.refund.prepare_invoke();
        invocation.arg(reply.now_micros);
        let mut any = false;
        for (&i, &charged) in group.indexes.iter().zip(&reply.charged) {
            if charged == 0 {
                continue; // denials and checks wrote nothing
            }
            let c = &charges[i];
            any = true;
            invocation
                .key(&keys[spans[i].clone()])
                .arg(&charge_args(c.params, charged)[..]);
        }
        if any {
            self.invoke_on_slot::<i64>(group.slot, &invocation, deadline)
                .await?;
        }
        Ok(())
    }

    /// A request whose counters span several slots: peek everywhere, then (to `commit`)
    /// charge everywhere, refunding the slots that charged if another lost a race or failed
    /// (see the module docs).
    ///
    /// Every slot's call runs until it answers or the decision's deadline passes, even when
    /// another fails: cut short by another's failure, a call would count as a failure against
    /// its own node's breaker (a healthy node blamed for a dead one), and a charge it made would
    /// go unrefunded. A call the deadline cuts is that node's failure; a charge it made anyway
    /// stands. The refunds are sent at once when the charges are known, each with a deadline
    /// of its own; a caller that leaves before then (its own timeout shorter than the store's)
    /// leaves the charges standing.
    pub(super) async fn apply_across_slots(
        &self,
        charges: &[Charge<'_>],
        keys: &[u8],
        spans: &[Range<usize>],
        groups: &[Group],
        commit: bool,
        deadline: Deadline,
    ) -> Result<Vec<Decision>, StoreError> {
        // Quota limits deny together, across slots: each slot's script sees them as limits
        // that do not enforce (an allowed one charges, a denied one does not), and the
        // request's admission is decided here from every slot's decisions.
        let scripted: Vec<Charge<'_>> = charges.iter().map(Charge::apart).collect();
        let (whole, charges) = (charges, scripted.as_slice());
        let gather = |replies: &[Reply]| gather(charges.len(), groups, replies);
        let admits = |replies: &[Reply]| {
            replies.iter().all(|r| r.admitted) && admitted(whole, &gather(replies))
        };
        // Each call has the decision's deadline: one slow node fails its own call, and the
        // others' answers (charges to refund) are still known.
        let all = |commit: bool| {
            join_all(groups.iter().map(move |g| {
                within(
                    deadline.ceiling,
                    RedisCall::Scripts,
                    self.run_decide(charges, keys, spans, g, commit, deadline),
                )
            }))
        };
        let peeks = all(false).await;
        if peeks.iter().any(Result::is_err) {
            return Err(self
                .partly(charges, keys, spans, groups, peeks, deadline)
                .await);
        }
        let mut peeks: Vec<Reply> = peeks.into_iter().flatten().collect();
        if !admits(&peeks) {
            self.as_they_stand(charges, keys, spans, groups, &mut peeks, deadline)
                .await;
            return Ok(gather(&peeks));
        }
        if !commit {
            return Ok(gather(&peeks));
        }
        let commits = all(true).await;
        if commits.iter().all(Result::is_ok) {
            let replies: Vec<Reply> = commits.into_iter().flatten().collect();
            if admits(&replies) {
                return Ok(gather(&replies));
            }
            let commits = replies.into_iter().map(Ok).collect();
            return self
                .refunded(charges, keys, spans, groups, commits, deadline)
                .await;
        }
        self.refunded(charges, keys, spans, groups, commits, deadline)
            .await
    }

    /// The second step denied the request (a slot lost a race or failed, or every quota limit
    /// turned out over): the slots that charged are refunded, and the decisions answer with the
    /// figures as they stand.
    async fn refunded(
        &self,
        charges: &[Charge<'_>],
        keys: &[u8],
        spans: &[Range<usize>],
        groups: &[Group],
        commits: Vec<Result<Reply, StoreError>>,
        deadline: Deadline,
    ) -> Result<Vec<Decision>, StoreError> {
        // Past the decision's deadline when a slow node used it up: each refund gets a deadline
        // of its own, or the charges it gives back would stand.
        let refunds = groups.iter().zip(&commits).filter_map(|(group, reply)| {
            let reply = reply.as_ref().ok().filter(|r| r.admitted)?;
            Some(async move {
                let own = self.deadline();
                let refund = self.run_refund(charges, keys, spans, group, reply, own);
                if let Err(e) = within(own.ceiling, RedisCall::Scripts, refund).await {
                    warn!(error = %e, "Refund of a cross-slot charge failed; the charge stays");
                }
            })
        });
        join_all(refunds).await;
        let mut commits = commits.into_iter().collect::<Result<Vec<_>, _>>()?;
        self.as_they_stand(charges, keys, spans, groups, &mut commits, deadline)
            .await;
        Ok(gather(charges.len(), groups, &commits))
    }

    /// A first step that some slots could not answer: the cause, with the other slots'
    /// decisions as they stand (nothing was charged) when there are any
    /// ([`StoreError::Partly`]), for the limiter to let the failure postures answer for the
    /// failed slots' limits alone.
    async fn partly(
        &self,
        charges: &[Charge<'_>],
        keys: &[u8],
        spans: &[Range<usize>],
        groups: &[Group],
        peeks: Vec<Result<Reply, StoreError>>,
        deadline: Deadline,
    ) -> StoreError {
        let mut cause = None;
        let mut answered = Vec::new();
        let mut replies = Vec::new();
        for (group, peek) in groups.iter().zip(peeks) {
            match peek {
                Ok(reply) => {
                    answered.push(group.clone());
                    replies.push(reply);
                }
                Err(e) => {
                    cause.get_or_insert(e);
                }
            }
        }
        let cause = cause.unwrap_or(StoreError::Unavailable(Failure::NoSlotFailed));
        if replies.is_empty() {
            return cause;
        }
        self.as_they_stand(charges, keys, spans, &answered, &mut replies, deadline)
            .await;
        let mut decided = vec![None; charges.len()];
        for (group, reply) in answered.iter().zip(&replies) {
            for (&i, decision) in group.indexes.iter().zip(&reply.decisions) {
                decided[i] = Some(*decision);
            }
        }
        StoreError::Partly {
            decided,
            cause: Box::new(cause),
            deadline: deadline.at,
        }
    }

    /// For a request denied across slots: the slots that admitted their part (in a peek, or
    /// in a charge since refunded) answer for each charge they allowed with its figures as
    /// they stand, as one slot's script does for a request it denies itself, not as after a
    /// charge that was never made. Read with one more call per such slot (a check: cost 0); a
    /// slot that cannot answer in time keeps the figures it gave.
    async fn as_they_stand(
        &self,
        charges: &[Charge<'_>],
        keys: &[u8],
        spans: &[Range<usize>],
        groups: &[Group],
        replies: &mut [Reply],
        deadline: Deadline,
    ) {
        let checks: Vec<Charge<'_>> = charges.iter().map(|c| Charge { cost: 0, ..*c }).collect();
        let stale = |r: &Reply| r.admitted && r.charged.iter().any(|&units| units > 0);
        let rereads = groups.iter().zip(replies.iter()).map(|(group, reply)| {
            let checks = &checks;
            async move {
                if !stale(reply) {
                    return None;
                }
                let read = self.run_decide(checks, keys, spans, group, false, deadline);
                within(deadline.ceiling, RedisCall::Scripts, read)
                    .await
                    .ok()
            }
        });
        let fresh = join_all(rereads).await;
        for (reply, fresh) in replies.iter_mut().zip(fresh) {
            let Some(fresh) = fresh else { continue };
            for ((decision, units), now) in reply
                .decisions
                .iter_mut()
                .zip(&reply.charged)
                .zip(fresh.decisions)
            {
                // A check says "denied" at a full counter; the figures are what is wanted.
                if *units > 0 {
                    *decision = Decision {
                        remaining: now.remaining,
                        reset_after: now.reset_after,
                        retry_after: None,
                        delay: Duration::ZERO,
                        ..*decision
                    };
                }
            }
        }
    }
}

/// The decisions of several groups' replies, in request order.
fn gather(charges: usize, groups: &[Group], replies: &[Reply]) -> Vec<Decision> {
    let mut decisions = vec![None; charges];
    for (group, reply) in groups.iter().zip(replies) {
        for (&i, d) in group.indexes.iter().zip(&reply.decisions) {
            decisions[i] = Some(*d);
        }
    }
    decisions.into_iter().flatten().collect()
}
