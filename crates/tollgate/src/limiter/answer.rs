//! The answer to a request: one builder for what the store, the failure postures and the
//! prefilter decided, which also records each limit's outcome.

use tollgate_core::{Decision, Timestamp, Verdict};

use super::candidate::Candidate;
use super::plan::{Plan, enforces, mode_of};
use super::request::{CheckRequest, RequestDescriptor};
use super::response::{AppliedLimit, CheckResponse, Code, DescriptorStatus, Statuses};
use super::snapshot::Snapshot;
use crate::metrics::Outcome;
use crate::policy::{Policy, RuleMode};
use crate::resilience::Posture;

/// What was decided for one charged limit of the live plan.
#[derive(Debug, Clone, Copy)]
pub(super) struct Told {
    /// Its decision; `None` for a limit not evaluated (the prefilter denied the request at
    /// another limit: nothing would have been charged), which reports no counters.
    pub decision: Option<Decision>,
    /// The failure posture that answered for it; `None` where the store decided.
    pub degraded: Option<Posture>,
}

/// A response with no statuses yet, for [`build`] to fill.
pub(super) fn empty() -> CheckResponse {
    CheckResponse {
        overall: Code::Ok,
        statuses: Statuses::new(),
    }
}

/// Fills `response` ([`empty`]) with the answer to a request whose live plan `live` got
/// `told`, one per span, in order (the limits move out of the plan). With `commit`, each
/// limit's outcome is recorded in `snapshot`'s counters and top keys.
///
/// Filled where the caller keeps it: each return by value through the frames above cost a copy
/// of the response (a status inline, 128 bytes). A request of more descriptors allocates its
/// statuses here, once (`extend` reserves them all).
pub(super) fn build(
    snapshot: &Snapshot,
    descriptors: &[RequestDescriptor],
    live: &mut Plan,
    told: impl IntoIterator<Item = Told>,
    commit: bool,
    now: Timestamp,
    response: &mut CheckResponse,
) {
    let statuses = &mut response.statuses;
    statuses.extend(descriptors.iter().map(|_| DescriptorStatus::unlimited()));
    for ((i, _), told) in live.spans.iter().zip(told) {
        // Moved out: the plan is done with once its decisions are known.
        let limit = live.limits[*i].take();
        let Some(decision) = told.decision else {
            statuses[*i] = DescriptorStatus {
                limit,
                ..DescriptorStatus::unlimited()
            };
            continue;
        };
        let status = &mut statuses[*i];
        decided(
            snapshot,
            &descriptors[*i],
            limit,
            decision,
            told.degraded,
            commit,
            status,
        );
    }
    // A limit of 0 (a caller's, or a rule's `requests_per_unit: 0`): over it, with no counter
    // and no store asked.
    for (status, limit) in statuses.iter_mut().zip(live.limits.iter_mut()) {
        if let Some(AppliedLimit::Blocked(params, rule)) = limit {
            let decision = AppliedLimit::blocked_decision(params, now);
            // A shadow rule's block is reported as the denial it would have been.
            let enforced = enforces(rule);
            *status = DescriptorStatus {
                code: if enforced { Code::OverLimit } else { Code::Ok },
                limit: limit.take(),
                decision: Some(decision),
                shadow_would_deny: !enforced,
                ..DescriptorStatus::unlimited()
            };
        }
    }
    response.overall = overall(&response.statuses);
}

/// Writes over `status` (an unlimited one) what `decision` on `limit` answers for
/// `descriptor`, `degraded` the posture that answered for the store, if one did. With
/// `commit`, the limit's outcome is recorded in `snapshot`'s counters and top keys.
pub(super) fn decided(
    snapshot: &Snapshot,
    descriptor: &RequestDescriptor,
    limit: Option<AppliedLimit>,
    decision: Decision,
    degraded: Option<Posture>,
    commit: bool,
    status: &mut DescriptorStatus,
) {
    let denied = decision.verdict != Verdict::Allowed;
    let mode = limit.as_ref().map_or(RuleMode::Enforce, mode_of);
    if let (true, Some(rule)) = (commit, limit.as_ref().and_then(AppliedLimit::rule)) {
        if let Some(posture) = degraded {
            snapshot.counters.record_degraded(rule.index, posture);
        }
        // Outcomes and throttled keys are the limit's: an answer of the open or closed
        // posture, which decided nothing about the key, is counted as degraded only.
        if matches!(degraded, None | Some(Posture::Local)) {
            snapshot.record_outcome(rule, descriptor, Outcome::of(denied, mode));
        }
    }
    let code = if denied && mode == RuleMode::Enforce {
        Code::OverLimit
    } else {
        Code::Ok
    };
    // Written field by field over the unlimited status: a whole status built aside and
    // copied in costs a copy of its 128 bytes per limit.
    status.code = code;
    status.limit = limit;
    status.decision = Some(decision);
    status.shadow_would_deny = denied && mode == RuleMode::Shadow;
    status.soft_exceeded = denied && mode == RuleMode::Soft;
    status.degraded = degraded;
}

/// The request's code from its descriptors' (as envoyproxy/ratelimit decides it):
/// `OVER_LIMIT` when a limit without quota mode is over, or when the request has quota-mode
/// limits and every one of them is over.
pub(super) fn overall(statuses: &[DescriptorStatus]) -> Code {
    let (mut quotas, mut quota_passes) = (false, false);
    for status in statuses {
        let quota = status
            .limit
            .as_ref()
            .and_then(AppliedLimit::rule)
            .is_some_and(|rule| rule.quota_mode);
        let over = status.code == Code::OverLimit;
        if quota {
            quotas = true;
            quota_passes |= !over;
        } else if over {
            return Code::OverLimit;
        }
    }
    if quotas && !quota_passes {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// Marks the statuses of descriptors that matched an `unlimited: true` rule (the plan keeps no
/// limit for them), which envoyproxy/ratelimit answers with a `limit_remaining` of `u32::MAX`.
pub(super) fn mark_unlimited(
    policy: &Policy,
    request: &CheckRequest,
    response: &mut CheckResponse,
) {
    for (status, descriptor) in response.statuses.iter_mut().zip(request.descriptors()) {
        status.unlimited_rule = status.limit.is_none()
            && descriptor.limit_override().is_none()
            && policy
                .find(request.domain(), descriptor.entries())
                .is_some_and(|rule| rule.is_unlimited());
    }
}

/// What the prefilter answers a request it denies at span `n` with `denial`: that limit
/// denies; the others were not evaluated.
pub(super) fn prefiltered(n: usize, denial: Decision) -> impl Iterator<Item = Told> {
    (0..).map(move |m| Told {
        decision: (m == n).then_some(denial),
        degraded: None,
    })
}

/// Records in `candidate` what its plan's charges got (`shadowed`, in order): whether each of
/// its rules would have denied the request.
pub(super) fn record_candidate(
    candidate: &Candidate,
    plan: &Plan,
    descriptors: &[RequestDescriptor],
    shadowed: &[Decision],
) {
    for ((i, _), decision) in plan.spans.iter().zip(shadowed) {
        if let Some(rule) = plan.limits[*i].as_ref().and_then(AppliedLimit::rule) {
            let denied = decision.verdict != Verdict::Allowed;
            candidate.record(rule, &descriptors[*i], denied);
        }
    }
}
