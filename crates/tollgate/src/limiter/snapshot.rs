//! The policy in force together with its per-rule counters and top denied keys, swapped as
//! one unit, and how an outcome is recorded in them.

use std::sync::Arc;

use super::describe::descriptor_text;
use super::request::RequestDescriptor;
use crate::metrics::{Outcome, RuleCounters};
use crate::observe::shares::{self, ValueShares};
use crate::observe::{TopEntry, TopKeys};
use crate::policy::{Policy, Rule, RuleMode};

/// Distinct keys remembered per rule for "top throttled keys".
const TOP_KEYS_PER_RULE: usize = 64;

/// A policy together with its per-rule counters, swapped as one unit.
#[derive(Debug)]
pub(super) struct Snapshot {
    pub policy: Arc<Policy>,
    pub counters: RuleCounters,
    /// Per rule: the keys it denied (or would have, in shadow and soft mode) most often, since
    /// the process started (carried over policy changes that keep the rule, as the counters).
    pub top: Box<[Arc<TopKeys>]>,
    /// Per rule: the would-deny share of each of its most frequent values, for shadow rules
    /// (carried over as the top keys).
    pub shares: Box<[Option<Arc<ValueShares>>]>,
}

impl Snapshot {
    /// The snapshot of `policy`, its counters continuing those of `previous`.
    pub fn new(policy: Policy, previous: Option<&Snapshot>) -> Snapshot {
        let counters = match previous {
            Some(p) => RuleCounters::continuing(&policy, &p.policy, &p.counters),
            None => RuleCounters::for_policy(&policy),
        };
        let fresh = || Arc::new(top_keys());
        let top = match previous {
            Some(p) => policy.carry_over(&p.policy, &p.top, fresh),
            None => policy.rules().iter().map(|_| fresh()).collect(),
        };
        let carried = match previous {
            Some(p) => policy.carry_over(&p.policy, &p.shares, || None),
            None => policy.rules().iter().map(|_| None).collect(),
        };
        let shadow = policy.rules().iter().map(|r| r.mode == RuleMode::Shadow);
        let shares = shares::tables(carried, shadow);
        Snapshot {
            policy: Arc::new(policy),
            counters,
            top,
            shares,
        }
    }

    /// The `n` keys the rule named `rule` of `domain` denied most often, or `None` if no such
    /// rule runs.
    pub fn top_keys(&self, domain: &str, rule: &str, n: usize) -> Option<Vec<TopEntry>> {
        let rules = self.policy.rules();
        let rule = rules
            .iter()
            .find(|r| r.domain == domain && r.name == rule)?;
        Some(self.top.get(rule.index)?.top(n))
    }

    /// The value shares of `rule` (one of this snapshot's rules), if it has a table.
    pub fn value_shares(&self, rule: &Rule) -> Option<Arc<ValueShares>> {
        let own = self.policy.rules().get(rule.index)?;
        (own.domain == rule.domain && own.name == rule.name)
            .then(|| self.shares.get(rule.index).cloned().flatten())
            .flatten()
    }

    /// Counts `outcome` of `rule` for `descriptor`: in the rule's counters (its checks' for a
    /// check), per descriptor when the rule has `detailed_metric` and this is not a check, and
    /// among its top keys when it is not an admission (a denied check throttles as much as a
    /// denied charge), and in its value shares when it has a table and this is not a check.
    pub fn record_outcome(&self, rule: &Rule, descriptor: &RequestDescriptor, outcome: Outcome) {
        let check = descriptor.cost() == 0;
        if check {
            self.counters.record_check(rule.index, outcome);
        } else {
            self.counters.record(rule.index, outcome);
        }
        let shares = self
            .shares
            .get(rule.index)
            .and_then(Option::as_ref)
            .filter(|_| !check);
        let detailed = rule.detailed_metric && !check;
        let top = self
            .top
            .get(rule.index)
            .filter(|_| outcome != Outcome::Allowed);
        if shares.is_none() && !detailed && top.is_none() {
            return;
        }
        let text = descriptor_text(descriptor);
        if let Some(shares) = shares {
            shares.record(text.as_str(), outcome != Outcome::Allowed);
        }
        if detailed {
            self.counters
                .record_value(rule.index, text.as_str(), outcome);
        }
        if let Some(top) = top {
            // One per denial, whatever its cost: the listing ranks who was denied most often.
            top.record(text.as_str(), 1);
        }
    }
}

/// One table of top denied keys per rule of `policy` (a shadow candidate's).
pub(super) fn top_keys_per_rule(policy: &Policy) -> Box<[TopKeys]> {
    policy.rules().iter().map(|_| top_keys()).collect()
}

/// An empty table of one rule's top denied keys.
fn top_keys() -> TopKeys {
    TopKeys::new(TOP_KEYS_PER_RULE)
}
