//! The common request, decided on a path of its own: one descriptor that a policy rule limits,
//! on the memory store, with no shadow candidate. It answers exactly as the general path
//! ([`Pipeline::decide_now`]) does, with none of its per-descriptor buffers (the plans, the
//! charges, the decisions, each inline for four descriptors): their set-up, copies and drops
//! were about a quarter of the decision's instructions.

use tollgate_core::Timestamp;

use super::answer;
use super::decide::Pipeline;
use super::keys::OneKey;
use super::plan::{self, Planner, Side};
use super::request::CheckRequest;
use super::response::{AppliedLimit, CheckResponse, DescriptorStatus};
use crate::store::{MemoryStore, Mode};

impl Pipeline<'_> {
    /// Decides `request` into `response` ([`answer::empty`]) when it has that shape (`memory`:
    /// the store and the time on its clock, as [`Pipeline::decide_now`] takes them), and
    /// returns the mode of the store's call; `None`, having charged nothing, for any other
    /// request, and for one whose new key the memory store at its most keys refuses: the
    /// general path decides those.
    ///
    /// Left to the general path: a limit the caller sent, a descriptor no rule limits (or an
    /// unlimited rule's), a limit of 0 (it may stop the request's charge), a runtime override
    /// in force on the key (rare; its limit replaces the rule's) and, for a charged request, a
    /// shadow candidate (it is charged beside the live policy). With one descriptor no
    /// `replaces` applies: the policy refuses a rule that replaces itself.
    pub fn decide_single(
        &self,
        (memory, store_now): (&MemoryStore, Timestamp),
        request: &CheckRequest,
        commit: bool,
        response: &mut CheckResponse,
    ) -> Option<Mode> {
        let [descriptor] = request.descriptors() else {
            return None;
        };
        if descriptor.limit_override().is_some() || (commit && self.candidate.is_set()) {
            return None;
        }
        let rule = self
            .snapshot
            .policy
            .find(request.domain(), descriptor.entries())?;
        // An unlimited rule (no limit) is the general path's to answer.
        rule.limit?;
        let (now, _) = self.at;
        let planner = Planner {
            store: self.stack.store(),
            overrides: self.overrides,
        };
        let limit = planner.limit_of(request.domain(), rule, descriptor, now, Side::Live);
        if !matches!(limit, AppliedLimit::Rule(_)) {
            return None;
        }
        let mut key = OneKey::new();
        let key = key.rule(&rule.identity, rule.shared_levels, descriptor);
        let settings = &self.stack.settings;
        let charge = plan::charge_of(&limit, key, request, descriptor, true, settings)?;
        // One charge always fits beside the others: there are none.
        let decision = memory.decide_one_at(store_now, &charge, commit).ok()?;
        let statuses = &mut response.statuses;
        statuses.push(DescriptorStatus::unlimited());
        let status = &mut statuses[0];
        answer::decided(
            &self.snapshot,
            descriptor,
            Some(limit),
            decision,
            None,
            commit,
            status,
        );
        response.overall = answer::overall(&response.statuses);
        Some(Mode::of(commit))
    }
}

#[cfg(test)]
mod tests;
