//! The limits one policy applies to a request's descriptors, and their counter keys.

use std::ops::Range;
use std::sync::Arc;

use smallvec::SmallVec;
use tollgate_core::Timestamp;

use super::keys::{self, KeyBuf};
use super::overrides::Overrides;
use super::request::{CheckRequest, InvalidRequest, MAX_DESCRIPTORS, RequestDescriptor};
use super::response::AppliedLimit;
use crate::policy::{self, LocalBudget, Policy, Rule, RuleMode};
use crate::resilience::{FailureSettings, Posture};
use crate::store::{Charge, INLINE_CHARGES, Store, StoreBackend};

/// Whose limits a [`Plan`] holds.
#[derive(Debug, Clone, Copy)]
pub(super) enum Side<'a> {
    /// The live policy.
    Live,
    /// The shadow candidate with this hash, which names its counters' key space.
    Candidate(&'a str),
}

/// Per request descriptor: the limit applied, if any.
pub(super) type Limits = SmallVec<[Option<AppliedLimit>; INLINE_CHARGES]>;
/// Per charged descriptor: its index and the range of its key in the key buffer.
pub(super) type Spans = SmallVec<[(usize, Range<usize>); INLINE_CHARGES]>;

/// The limits one policy applies to a request's descriptors, and their counter keys. Inline
/// up to four descriptors: planning a request allocates nothing.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Per request descriptor: the limit applied, if any.
    pub limits: Limits,
    /// Every counter key, back to back.
    pub key_buf: KeyBuf,
    /// Per charged descriptor: its index and the range of its key in `key_buf`.
    pub spans: Spans,
}

/// What planning reads besides the policy: the store (to check a limit the caller sent) and
/// the runtime overrides.
pub(super) struct Planner<'a> {
    pub store: &'a StoreBackend,
    pub overrides: &'a Overrides,
}

impl Planner<'_> {
    /// Matches the request's descriptors against `policy` and builds their counter keys into
    /// `plan`, which is empty.
    ///
    /// For the live policy, a limit sent with a descriptor and the runtime overrides apply. A
    /// candidate is its policy alone: runtime overrides are ignored, and a descriptor carrying
    /// its own limit is skipped, since that limit decides it whatever policy runs.
    pub fn plan(
        &self,
        policy: &Policy,
        request: &CheckRequest,
        now: Timestamp,
        side: Side<'_>,
        plan: &mut Plan,
    ) -> Result<(), InvalidRequest> {
        let descriptors = request.descriptors();
        let Plan {
            limits,
            key_buf,
            spans,
        } = plan;
        // An unlimited rule applies no limit but still replaces others, as in envoyproxy/ratelimit
        // (the "this premium key skips the per-IP limit" pattern).
        let mut replaced_by_unlimited: SmallVec<[&str; INLINE_CHARGES]> = SmallVec::new();
        for d in descriptors {
            limits.push(match (d.limit_override(), side) {
                // As in envoyproxy/ratelimit, a domain the policy does not know limits nothing,
                // not even with limits the caller sent.
                (Some(_), Side::Live) if !policy.has_domain(request.domain()) => None,
                (Some(o), Side::Live) => {
                    // Configured rules were checked against the store at load time; a limit
                    // sent by the caller is checked here.
                    self.store
                        .supports(&o.params)
                        .map_err(|why| InvalidRequest(why.to_string()))?;
                    Some(if o.blocks {
                        AppliedLimit::Blocked(o.params, None)
                    } else {
                        AppliedLimit::Override(o.params)
                    })
                }
                (Some(_), Side::Candidate(_)) => None,
                (None, _) => policy
                    .find(request.domain(), d.entries())
                    .filter(|rule| {
                        if rule.limit.is_none() {
                            replaced_by_unlimited.extend(rule.replaces.iter().map(String::as_str));
                        }
                        rule.limit.is_some()
                    })
                    .map(|rule| self.limit_of(request.domain(), rule, d, now, side)),
            });
        }
        drop_replaced(limits, &replaced_by_unlimited);

        // Build every key into one buffer; the charges borrow slices of it.
        for (i, (descriptor, limit)) in descriptors.iter().zip(limits.iter()).enumerate() {
            let start = key_buf.len();
            match (limit, side) {
                (Some(AppliedLimit::Override(params)), _) => {
                    keys::override_key(key_buf, request.domain(), descriptor, params)
                }
                // Decided without a counter: see the answer's builder.
                (Some(AppliedLimit::Blocked(..)), _) => continue,
                (
                    Some(AppliedLimit::Rule(rule) | AppliedLimit::Overridden(rule, _)),
                    Side::Live,
                ) => keys::rule_key(key_buf, &rule.identity, rule.shared_levels, descriptor),
                (
                    Some(AppliedLimit::Rule(rule) | AppliedLimit::Overridden(rule, _)),
                    Side::Candidate(hash),
                ) => keys::candidate_rule_key(
                    key_buf,
                    hash,
                    &rule.identity,
                    rule.shared_levels,
                    descriptor,
                ),
                (None, _) => continue,
            }
            spans.push((i, start..key_buf.len()));
        }
        Ok(())
    }

    /// The limit `rule` (which has one) applies to `descriptor` of `domain` at `now`: for the
    /// live policy, a runtime override's if one is in force (and the store supports it), else
    /// the rule's, or a block for its `requests_per_unit: 0`.
    pub fn limit_of(
        &self,
        domain: &str,
        rule: &Arc<Rule>,
        descriptor: &RequestDescriptor,
        now: Timestamp,
        side: Side<'_>,
    ) -> AppliedLimit {
        let runtime = match side {
            Side::Live => self.overrides.find(domain, rule, descriptor.entries(), now),
            Side::Candidate(_) => None,
        };
        match runtime {
            Some(params) if self.store.supports(&params).is_ok() => {
                AppliedLimit::Overridden(rule.clone(), params)
            }
            // `requests_per_unit: 0`, decided like a caller's limit of 0.
            _ => match (rule.blocked, rule.limit) {
                (true, Some(params)) => AppliedLimit::Blocked(params, Some(rule.clone())),
                _ => AppliedLimit::Rule(rule.clone()),
            },
        }
    }
}

impl Plan {
    /// Appends one charge per span, in order ([`charge_of`]; `live` false for a candidate's).
    pub fn push_charges<'a>(
        &'a self,
        request: &CheckRequest,
        live: bool,
        settings: &FailureSettings,
        charges: &mut impl Extend<Charge<'a>>,
    ) {
        let descriptors = request.descriptors();
        charges.extend(self.spans.iter().filter_map(|(i, span)| {
            let limit = self.limits[*i].as_ref()?;
            charge_of(
                limit,
                &self.key_buf[span.clone()],
                request,
                &descriptors[*i],
                live,
                settings,
            )
        }));
    }

    /// Whether a limit of 0 (a caller's, or an enforced rule's) blocks the request: one
    /// without quota mode, or one with it when no other quota limit of the request could
    /// admit (every quota limit then is over: see [`crate::store::admitted`]).
    pub fn blocks(&self) -> bool {
        let blocked = |l: &Option<AppliedLimit>| match l {
            Some(AppliedLimit::Blocked(_, rule)) => enforces(rule),
            _ => false,
        };
        let quota = |l: &Option<AppliedLimit>| l.as_ref().is_some_and(quota_of);
        let blocked_quota = self.limits.iter().any(|l| blocked(l) && quota(l));
        let other_quota = self.limits.iter().any(|l| quota(l) && !blocked(l));
        self.limits.iter().any(|l| blocked(l) && !quota(l)) || (blocked_quota && !other_quota)
    }
}

/// The charge of `limit` on `key` for `descriptor` of `request`, with what the store layers
/// need about the limit (its rule's settings, else the defaults of `settings`); `None` for a
/// limit without params. With `live` false (a candidate, which never denies) it only counts,
/// whatever the rule's mode, and takes no local budget nor the prefilter.
pub(super) fn charge_of<'a>(
    limit: &'a AppliedLimit,
    key: &'a [u8],
    request: &CheckRequest,
    descriptor: &RequestDescriptor,
    live: bool,
    settings: &FailureSettings,
) -> Option<Charge<'a>> {
    let quota = live && quota_of(limit);
    let params = limit.params()?;
    Some(Charge {
        key,
        params,
        cost: descriptor.cost(),
        checks_as_is: request.checks_as_is() && !params.charges_up_to_limit(),
        enforce: live && mode_of(limit) == RuleMode::Enforce,
        quota,
        posture: posture_of(Some(limit), settings),
        local_share: share_of(Some(limit), settings),
        local_budget: budget_of(limit).filter(|_| live),
        // A quota limit's denial may not deny the request: nothing to remember.
        prefilterable: live && !quota && prefilterable(limit),
    })
}

/// The failure posture that answers for `limit` when the store cannot: its rule's
/// `on_store_error`, else the default of `settings`.
pub(super) fn posture_of(limit: Option<&AppliedLimit>, settings: &FailureSettings) -> Posture {
    let rule = limit.and_then(AppliedLimit::rule).map(Arc::as_ref);
    policy::posture_of(rule, settings.posture)
}

/// The `local` share of `limit`: its rule's `local_share`, else the default of `settings`.
fn share_of(limit: Option<&AppliedLimit>, settings: &FailureSettings) -> f64 {
    limit
        .and_then(AppliedLimit::rule)
        .and_then(|rule| rule.local_share)
        .unwrap_or(settings.local_share)
}

/// The local budget of `limit`. The policy only accepts a budget on an enforced rule; an
/// overridden limit has none.
fn budget_of(limit: &AppliedLimit) -> Option<&LocalBudget> {
    match limit {
        AppliedLimit::Rule(rule) => rule.local_budget.as_ref(),
        _ => None,
    }
}

/// Whether the prefilter may remember a denial by `limit`: an enforced limit of the policy, or
/// one the caller sent (its key names its params). Not a limit changed by a runtime override
/// (it may expire), nor one with a local budget (other replicas give units back early).
fn prefilterable(limit: &AppliedLimit) -> bool {
    match limit {
        AppliedLimit::Rule(rule) => rule.mode == RuleMode::Enforce && rule.local_budget.is_none(),
        AppliedLimit::Override(_) => true,
        // Nothing to remember: it is denied without the store's say.
        AppliedLimit::Overridden(..) | AppliedLimit::Blocked(..) => false,
    }
}

/// Whether a block denies: the caller's (no rule) always does, a rule's unless in shadow mode.
pub(super) fn enforces(rule: &Option<Arc<Rule>>) -> bool {
    rule.as_ref()
        .is_none_or(|rule| rule.mode != RuleMode::Shadow)
}

/// Whether the rule behind `limit` has `quota_mode: true`; a caller-supplied limit has not.
pub(super) fn quota_of(limit: &AppliedLimit) -> bool {
    limit.rule().is_some_and(|r| r.quota_mode)
}

/// The mode of the rule behind `limit`; a caller-supplied limit enforces.
pub(super) fn mode_of(limit: &AppliedLimit) -> RuleMode {
    limit.rule().map_or(RuleMode::Enforce, |r| r.mode)
}

// `drop_replaced` keeps one bit per descriptor in a u64.
const _: () = assert!(MAX_DESCRIPTORS <= 64);

/// Drops the limits replaced by another limit matched in the same request (envoyproxy/ratelimit's
/// `replaces`), or by a matched unlimited rule (`by_unlimited`): a replaced descriptor is
/// answered OK without a limit.
fn drop_replaced(limits: &mut [Option<AppliedLimit>], by_unlimited: &[&str]) {
    let replaced = |name: &str, limits: &[Option<AppliedLimit>]| {
        by_unlimited.contains(&name)
            || limits
                .iter()
                .flatten()
                .filter_map(AppliedLimit::rule)
                .any(|rule| rule.replaces.iter().any(|r| r == name))
    };
    // At most MAX_DESCRIPTORS (64) limits: one bit each, decided before any is dropped.
    let drop = limits.iter().enumerate().fold(0u64, |drop, (n, l)| {
        let replaced = l
            .as_ref()
            .and_then(AppliedLimit::rule)
            .is_some_and(|rule| replaced(&rule.name, limits));
        drop | (u64::from(replaced) << (n % 64))
    });
    for (n, limit) in limits.iter_mut().enumerate() {
        if drop & (1 << (n % 64)) != 0 {
            *limit = None;
        }
    }
}
