//! Deciding a request's charges: one DECIDE call per slot they live in (or one entry of a
//! coalesced batch on one server), and reading what the script answered.

use std::ops::Range;
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;
use tollgate_core::{Decision, Verdict};

use super::coalesce::{Coalescer, Request};
use super::patience::Deadline;
use super::script::{self, decide_args};
use super::slot;
use super::store::{Connection, RedisStore};
use super::timeout::within;
use crate::store::{Charge, INLINE_CHARGES, Invalid, RedisCall, ShedReason, StoreError};

/// One script call's worth of charges: indexes into the request's charges, all on `slot`.
#[derive(Clone)]
pub(super) struct Group {
    pub(super) slot: u16,
    pub(super) indexes: Vec<usize>,
}

/// What one DECIDE call answered.
pub(super) struct Reply {
    pub(super) now_micros: i64,
    pub(super) admitted: bool,
    pub(super) decisions: Vec<Decision>,
    /// Per decision, the units it takes (see the DECIDE reply in [`script`]).
    pub(super) charged: SmallVec<[u64; INLINE_CHARGES]>,
}

impl RedisStore {
    pub(super) async fn run_decide(
        &self,
        charges: &[Charge<'_>],
        keys: &[u8],
        spans: &[Range<usize>],
        group: &Group,
        commit: bool,
        deadline: Deadline,
    ) -> Result<Reply, StoreError> {
        if let Some(coalescer) = &self.coalescer {
            let charges = group.indexes.iter().map(|&i| &charges[i]);
            return self.coalesced(coalescer, charges, commit, deadline).await;
        }
        let mut invocation = self.decide.prepare_invoke();
        for &i in &group.indexes {
            invocation.key(&keys[spans[i].clone()]);
        }
        invocation.arg(if commit { "1" } else { "0" });
        invocation.arg(self.now.argument_since(deadline.guard_since()));
        for &i in &group.indexes {
            invocation.arg(&decide_args(&charges[i])[..]);
        }
        let raw = self.invoke_on_slot(group.slot, &invocation, deadline).await;
        self.replied(raw, group.indexes.iter().map(|&i| &charges[i]))
    }

    /// Decides `charges` as one entry of a coalesced batch (one server only). The batch goes
    /// through the breaker and the store's deadline from when it is sent; the wait in the
    /// queue is bounded by `deadline`'s ceiling alone, and is no failure of the store.
    async fn coalesced<'a>(
        &self,
        coalescer: &Coalescer,
        charges: impl ExactSizeIterator<Item = &'a Charge<'a>> + Clone,
        commit: bool,
        deadline: Deadline,
    ) -> Result<Reply, StoreError> {
        let mut request = Request::new(commit, charges.len());
        for c in charges.clone() {
            request.push(c);
        }
        let place = coalescer
            .place()
            .ok_or_else(|| self.shed.shed(ShedReason::QueueFull))?;
        let raw = tokio::time::timeout_at(deadline.ceiling, place.decide(request))
            .await
            .unwrap_or_else(|_| Err(self.shed.shed(ShedReason::WaitedTooLong)));
        self.replied(raw, charges)
    }

    /// A DECIDE call's answer, its `now` taken in (or its late refusal: see [`now`](super::now)).
    fn replied<'a>(
        &self,
        raw: Result<Vec<i64>, StoreError>,
        charges: impl ExactSizeIterator<Item = &'a Charge<'a>>,
    ) -> Result<Reply, StoreError> {
        let raw = raw.inspect_err(|e| self.now.failed(e))?;
        let reply = parse_reply(&raw, charges)?;
        self.now.learn(reply.now_micros);
        Ok(reply)
    }

    /// Decides `charges` with one script call per slot they live in, each within `deadline`
    /// (see [`RedisStore::apply_across_slots`] for several).
    async fn apply_by_slot(
        &self,
        charges: &[Charge<'_>],
        keys: &[u8],
        spans: &[Range<usize>],
        slots: &[u16],
        commit: bool,
        deadline: Deadline,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut groups: Vec<Group> = Vec::new();
        // One server holds every slot (all 0 here): one call covers the whole request.
        for (i, &slot) in slots.iter().enumerate() {
            match groups.iter_mut().find(|g| g.slot == slot) {
                Some(g) => g.indexes.push(i),
                None => groups.push(Group {
                    slot,
                    indexes: vec![i],
                }),
            }
        }
        if let [only] = groups.as_slice() {
            let decide = self.run_decide(charges, keys, spans, only, commit, deadline);
            return Ok(within(deadline.ceiling, RedisCall::Scripts, decide)
                .await?
                .decisions);
        }
        self.apply_across_slots(charges, keys, spans, &groups, commit, deadline)
            .await
    }

    pub(super) async fn decide_all(
        &self,
        charges: &[Charge<'_>],
        commit: bool,
    ) -> Result<Vec<Decision>, StoreError> {
        for c in charges {
            script::fits_lua(c.params).map_err(|e| StoreError::InvalidData(e.into()))?;
        }
        if let Some(coalescer) = &self.coalescer {
            // One server: the whole request is one entry of a batch; the coalescer's queue
            // holds those past the in-flight cap.
            let decide = self.coalesced(coalescer, charges.iter(), commit, self.deadline());
            return decide.await.map(|reply| reply.decisions);
        }
        self.decide_by_slot(charges, commit, self.deadline()).await
    }

    /// Decides `charges` with one script call per slot they live in, within `deadline`.
    async fn decide_by_slot(
        &self,
        charges: &[Charge<'_>],
        commit: bool,
        deadline: Deadline,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut keys = Vec::with_capacity(charges.len() * 96);
        let mut spans = Vec::with_capacity(charges.len());
        let mut slots = Vec::with_capacity(charges.len());
        for c in charges {
            let start = keys.len();
            slots.push(self.key_and_slot(&mut keys, c.key));
            spans.push(start..keys.len());
        }
        let (_in_flight, deadline) = self.in_flight_place(deadline).await?;
        self.apply_by_slot(charges, &keys, &spans, &slots, commit, deadline)
            .await
    }

    /// [`Store::apply`] within `deadline`: the charges a request's [`StoreError::Partly`]
    /// answer left to make, inside that request's deadline.
    pub async fn apply_before(
        &self,
        charges: &[Charge<'_>],
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        for c in charges {
            script::fits_lua(c.params).map_err(|e| StoreError::InvalidData(e.into()))?;
        }
        let deadline = Deadline::until(
            deadline,
            self.options.command_timeout,
            self.options.max_wait,
        );
        self.decide_by_slot(charges, true, deadline).await
    }

    /// Appends `counter_key`'s Redis key to `buf`; returns the slot to call (0 on a single
    /// server, which holds every slot).
    pub(super) fn key_and_slot(&self, buf: &mut Vec<u8>, counter_key: &[u8]) -> u16 {
        let slot = slot::redis_key(buf, counter_key);
        match self.connection {
            Connection::Single(_) => 0,
            Connection::Cluster(_) => slot,
        }
    }
}

fn parse_reply<'a>(
    raw: &[i64],
    charges: impl ExactSizeIterator<Item = &'a Charge<'a>>,
) -> Result<Reply, StoreError> {
    let n = charges.len();
    if raw.len() != 2 + 6 * n {
        return Err(StoreError::InvalidData(Invalid::ReplyLength {
            numbers: raw.len(),
            charges: n,
        }));
    }
    let micros = |v: i64| Duration::from_micros(u64::try_from(v).unwrap_or(0));
    let per_charge = raw[2..].chunks_exact(6);
    let charged = per_charge
        .clone()
        .map(|r| u64::try_from(r[5]).unwrap_or(0))
        .collect();
    let decisions = charges
        .zip(per_charge)
        .map(|(charge, r)| {
            let verdict = match r[0] {
                0 => Verdict::Allowed,
                1 => Verdict::Denied,
                2 => Verdict::CostExceedsCapacity,
                other => {
                    return Err(StoreError::InvalidData(Invalid::Verdict(other)));
                }
            };
            Ok(Decision {
                verdict,
                limit: charge.params.limit(),
                remaining: u64::try_from(r[1]).unwrap_or(0),
                reset_after: micros(r[2]),
                retry_after: (r[3] >= 0).then(|| micros(r[3])),
                delay: micros(r[4]),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Reply {
        now_micros: raw[0],
        admitted: raw[1] == 1,
        decisions,
        charged,
    })
}
