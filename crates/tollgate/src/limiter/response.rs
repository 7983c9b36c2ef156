//! The answer to a [`super::CheckRequest`], independent of any wire format.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{Decision, Params, Timestamp, Verdict};

use crate::policy::{Rule, RuleMode};
use crate::resilience::Posture;

/// Outcome for one descriptor, or for the whole request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Allowed.
    Ok,
    /// Denied.
    OverLimit,
}

/// The limit a descriptor was checked against.
#[derive(Debug, Clone)]
pub enum AppliedLimit {
    /// A rule from the policy file.
    Rule(Arc<Rule>),
    /// A rule whose limit a runtime override replaces for this descriptor (same counter).
    Overridden(Arc<Rule>, Params),
    /// A limit the caller sent with the descriptor.
    Override(Params),
    /// A limit of 0: always over it, with no counter. The caller sent it (no rule), or it is a
    /// rule's `requests_per_unit: 0`. `Params` give the period; their limit of 1 is a stand-in.
    Blocked(Params, Option<Arc<Rule>>),
}

impl AppliedLimit {
    /// Name reported to callers (`current_limit.name`, `RateLimit-Policy`).
    pub fn name(&self) -> &str {
        match self {
            AppliedLimit::Rule(rule)
            | AppliedLimit::Overridden(rule, _)
            | AppliedLimit::Blocked(_, Some(rule)) => &rule.name,
            AppliedLimit::Override(_) | AppliedLimit::Blocked(_, None) => "override",
        }
    }

    /// The name envoyproxy/ratelimit reports as `current_limit.name`: a rule's `name` as
    /// given in the policy, or empty (a derived name, a limit the caller sent).
    pub fn configured_name(&self) -> &str {
        match self.rule() {
            Some(rule) if rule.name_given => &rule.name,
            _ => "",
        }
    }

    /// The limit's parameters.
    pub fn params(&self) -> Option<&Params> {
        match self {
            AppliedLimit::Rule(rule) => rule.limit.as_ref(),
            AppliedLimit::Overridden(_, params)
            | AppliedLimit::Override(params)
            | AppliedLimit::Blocked(params, _) => Some(params),
        }
    }

    /// The policy rule behind this limit, if any.
    pub fn rule(&self) -> Option<&Arc<Rule>> {
        match self {
            AppliedLimit::Rule(rule)
            | AppliedLimit::Overridden(rule, _)
            | AppliedLimit::Blocked(_, Some(rule)) => Some(rule),
            AppliedLimit::Override(_) | AppliedLimit::Blocked(_, None) => None,
        }
    }

    /// The answer at `now` for a descriptor a limit of 0 per `params`' period blocks: never
    /// admissible, so no retry-after; it resets, as envoyproxy/ratelimit reports it, at the
    /// end of the current (epoch-aligned) window.
    pub(crate) fn blocked_decision(params: &Params, now: Timestamp) -> Decision {
        let period = params.period_micros();
        Decision {
            verdict: Verdict::CostExceedsCapacity,
            limit: 0,
            remaining: 0,
            reset_after: Duration::from_micros(period - now.as_micros() % period),
            retry_after: None,
            delay: Duration::ZERO,
        }
    }
}

/// Result for one request descriptor.
#[derive(Debug, Clone)]
pub struct DescriptorStatus {
    /// OK or OVER_LIMIT. A shadow-mode rule that would deny reports OK.
    pub code: Code,
    /// The limit applied; `None` when nothing matched, the rule is unlimited or was replaced.
    pub limit: Option<AppliedLimit>,
    /// The algorithm's decision; present whenever `limit` is, except beside a prefilter denial,
    /// which answers without asking the store about the request's other limits.
    pub decision: Option<Decision>,
    /// A shadow-mode rule that would have denied this request.
    pub shadow_would_deny: bool,
    /// A soft rule over its limit: allowed, with [`CheckResponse::soft_delay`] suggested.
    pub soft_exceeded: bool,
    /// Set when the store could not decide and this limit's failure posture answered.
    pub degraded: Option<Posture>,
    /// The descriptor matched a rule with `unlimited: true` (its `limit` is then `None`).
    pub unlimited_rule: bool,
}

impl DescriptorStatus {
    pub(crate) fn unlimited() -> Self {
        DescriptorStatus {
            code: Code::Ok,
            limit: None,
            decision: None,
            shadow_would_deny: false,
            soft_exceeded: false,
            degraded: None,
            unlimited_rule: false,
        }
    }

    /// Whether its limit is a shadow-mode rule: counted and reported, invisible to the caller.
    pub fn is_shadow(&self) -> bool {
        self.limit
            .as_ref()
            .and_then(AppliedLimit::rule)
            .is_some_and(|rule| rule.mode == RuleMode::Shadow)
    }

    /// Whether a limit of 0 denied it: over its limit until the end of the unit, with no
    /// counter (see [`AppliedLimit::Blocked`]).
    pub fn is_blocked(&self) -> bool {
        self.code == Code::OverLimit && matches!(self.limit, Some(AppliedLimit::Blocked(..)))
    }

    /// Whether the cost can never be admitted by this limit.
    pub fn cost_exceeds_capacity(&self) -> bool {
        self.decision
            .is_some_and(|d| d.verdict == Verdict::CostExceedsCapacity)
    }
}

/// One status per request descriptor (it derefs to a slice), inline for one: the common request
/// answers without allocating, and every answer is small to move. Inline up to four, each answer
/// was 560 bytes, copied whole about four times on its way to the caller: about 200 more
/// instructions for a request of one descriptor (`limiter/*` in `scripts/bench-instructions.sh`)
/// than a request of two now pays for its one allocation (about 45, `limiter/pair`).
pub type Statuses = SmallVec<[DescriptorStatus; 1]>;

/// Result for a whole request.
#[derive(Debug, Clone)]
pub struct CheckResponse {
    /// OK when every enforced limit allowed.
    pub overall: Code,
    /// One per request descriptor, in request order.
    pub statuses: Statuses,
}

impl CheckResponse {
    /// Whether the request is admitted.
    pub fn allowed(&self) -> bool {
        self.overall == Code::Ok
    }

    /// The status whose limit binds: when denied, the denial that lasts longest; when allowed,
    /// the limit with the least remaining quota (what Envoy reports in `x-ratelimit-*`). A
    /// shadow-mode rule never binds: its quota is not the caller's business.
    pub fn binding(&self) -> Option<&DescriptorStatus> {
        self.binding_index().map(|i| &self.statuses[i])
    }

    /// The position of [`CheckResponse::binding`] among the statuses.
    pub fn binding_index(&self) -> Option<usize> {
        let limited = self
            .statuses
            .iter()
            .enumerate()
            .filter(|(_, s)| s.decision.is_some() && !s.is_shadow());
        let found = if self.allowed() {
            limited.min_by_key(|(_, s)| s.decision.map_or(u64::MAX, |d| d.remaining))
        } else {
            limited
                .filter(|(_, s)| s.code == Code::OverLimit)
                .max_by_key(|(_, s)| {
                    (
                        s.cost_exceeds_capacity(),
                        s.decision.and_then(|d| d.retry_after),
                    )
                })
        };
        found.map(|(i, _)| i)
    }

    /// The most severe posture (`closed` over `local` over `open`) among the limits that made
    /// the answer, or `None` when the store decided them: when denied, the limits that denied;
    /// when allowed, every limit but shadow ones. So it never names the posture of a rule that
    /// did not matter to the answer.
    pub fn degraded(&self) -> Option<Posture> {
        let severity = |p: &Posture| match p {
            Posture::Closed => 2,
            Posture::Local => 1,
            Posture::Open => 0,
        };
        let allowed = self.allowed();
        self.statuses
            .iter()
            .filter(|s| {
                if allowed {
                    !s.is_shadow()
                } else {
                    s.code == Code::OverLimit
                }
            })
            .filter_map(|s| s.degraded)
            .max_by_key(severity)
    }

    /// The statuses that denied the request.
    fn denials(&self) -> impl Iterator<Item = &DescriptorStatus> {
        self.statuses.iter().filter(|s| s.code == Code::OverLimit)
    }

    /// When a soft limit was exceeded: how long the caller should hold the request, the time
    /// after which it would fit within every exceeded soft limit. It grows with the request's
    /// cost and with how far the quota is used up; `None` when no soft limit was exceeded.
    pub fn soft_delay(&self) -> Option<Duration> {
        self.statuses
            .iter()
            .filter(|s| s.soft_exceeded)
            .map(|s| match s.decision {
                // No wait makes a cost larger than the limit fit.
                Some(d) if d.verdict == Verdict::CostExceedsCapacity => Duration::ZERO,
                Some(d) => d.retry_after.unwrap_or(d.reset_after),
                None => Duration::ZERO,
            })
            .max()
    }

    /// Denied because the limiter is unavailable (a `closed` posture), not by a real limit.
    pub fn unavailable(&self) -> bool {
        // A limit that decided (a real denial, a blocked descriptor) makes it a `429`, whatever
        // a `closed` posture said of another limit.
        !self.allowed()
            && self.denials().any(|s| s.degraded == Some(Posture::Closed))
            && self.denials().all(|s| s.degraded.is_some())
    }

    /// When denied and retrying can help: how long to wait (the longest retry-after among the
    /// denials, since all of them must clear).
    pub fn retry_after(&self) -> Option<Duration> {
        if self.allowed()
            || self
                .denials()
                .any(|s| s.cost_exceeds_capacity() && !s.is_blocked())
        {
            return None;
        }
        // A block is over until its unit ends, as envoyproxy/ratelimit's `duration_until_reset`.
        self.denials()
            .filter_map(|s| {
                s.decision.and_then(|d| match s.is_blocked() {
                    true => Some(d.reset_after),
                    false => d.retry_after,
                })
            })
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(degraded: Option<Posture>) -> DescriptorStatus {
        DescriptorStatus {
            code: Code::OverLimit,
            degraded,
            ..DescriptorStatus::unlimited()
        }
    }

    fn denied_by(statuses: impl IntoIterator<Item = DescriptorStatus>) -> CheckResponse {
        CheckResponse {
            overall: Code::OverLimit,
            statuses: statuses.into_iter().collect(),
        }
    }

    /// A `closed` posture's denial is "unavailable" (a 503) only when no limit denied the
    /// request by itself: beside a real denial, it is a 429.
    #[test]
    fn a_real_denial_beside_a_closed_posture_is_not_unavailable() {
        assert!(denied_by([denial(Some(Posture::Closed))]).unavailable());
        assert!(!denied_by([denial(Some(Posture::Closed)), denial(None)]).unavailable());
        assert!(!denied_by([denial(Some(Posture::Local))]).unavailable());
    }
}
