//! One runtime override, as set by an operator, and what it applies to.

use std::time::Duration;

use tollgate_core::{Params, ParamsError, Timestamp};

use crate::policy::{Policy, Rule};

/// One override, as set by an operator.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// Assigned when set; used to delete it.
    pub id: u64,
    /// The rule's domain.
    pub domain: String,
    /// The rule's name.
    pub rule: String,
    /// The request descriptor's entries the override applies to, exactly.
    pub entries: Vec<(String, String)>,
    /// The new limit per period.
    pub requests_per_unit: u64,
    /// The new period; `None` keeps the rule's.
    pub period: Option<Duration>,
    /// When it stops applying; `None` = until deleted.
    pub expires_at: Option<Timestamp>,
    /// When it was set: of two set for the same target on different replicas, the later wins.
    pub set_at: Timestamp,
    /// Free text for the audit log.
    pub reason: String,
}

/// Why an override cannot give its rule a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnfitOverride {
    /// The rule (named) has no limit to replace.
    #[error("rule `{0}` is unlimited")]
    Unlimited(String),
    /// The limit it asks for is impossible.
    #[error("{0}")]
    Limit(#[from] ParamsError),
}

impl Override {
    /// The parameters this override gives `rule` (its algorithm and way of charging; the burst
    /// scaled like the limit), or why they are impossible.
    pub fn params_for(&self, rule: &Rule) -> Result<Params, UnfitOverride> {
        let base = rule
            .limit
            .ok_or_else(|| UnfitOverride::Unlimited(rule.name.clone()))?;
        Ok(base.rescaled(self.requests_per_unit, self.period.unwrap_or(base.period()))?)
    }

    /// Whether the rule named `self.rule` in `policy` is the one that `self.entries` match:
    /// else the override applies to nothing under `policy` (its rule is gone, or a rename or a
    /// reorder gave the name to another rule) until a policy where it does runs again.
    pub fn applies_under(&self, policy: &Policy) -> bool {
        policy
            .find(&self.domain, &self.entries)
            .is_some_and(|rule| rule.name == self.rule)
    }

    /// Whether it still applies at `now`.
    pub(super) fn live(&self, now: Timestamp) -> bool {
        self.expires_at.is_none_or(|at| now < at)
    }

    /// Whether `other` is for the same domain, rule and entries (and so replaced by this one).
    pub fn same_target(&self, other: &Override) -> bool {
        self.is_for(&other.domain, &other.rule, &other.entries)
    }

    /// Whether it is for this domain, rule and entries.
    pub fn is_for(&self, domain: &str, rule: &str, entries: &[(String, String)]) -> bool {
        self.domain == domain && self.rule == rule && self.entries == entries
    }
}
