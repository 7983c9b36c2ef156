//! What a store is asked to decide: one [`Charge`] per limit of a request, and whether the
//! request they got their decisions for is [`admitted`].

use tollgate_core::{Decision, Params};

use crate::policy::{LocalBudget, Posture};

/// One limit to charge within a request.
#[derive(Debug, Clone, Copy)]
pub struct Charge<'a> {
    /// Counter key, already injective (see `limiter::keys`).
    pub key: &'a [u8],
    /// The limit.
    pub params: &'a Params,
    /// Weight of the request; 0 checks the limit without charging it (the decision of
    /// [`tollgate_core::check`]: a denial when a cost of 1 would be denied).
    pub cost: u64,
    /// Whether a denial of this charge denies the request (false for shadow-mode rules).
    pub enforce: bool,
    /// A live limit of a `quota_mode` rule: its denial denies the request only when every
    /// quota charge of the request is denied (see [`admitted`]).
    pub quota: bool,
    /// A check (`cost` 0) answers as the counter stands: over only when it is already past
    /// its limit, as envoyproxy/ratelimit answers `hits_addend: 0` ([`tollgate_core::check_as_is`]).
    /// Otherwise a check is over when a cost of 1 would be ([`tollgate_core::check`]).
    pub checks_as_is: bool,
    /// What answers for this charge when the store cannot decide it: its rule's
    /// `on_store_error`, else the server's default posture.
    pub posture: Posture,
    /// The fraction of the limit the `local` posture enforces on this replica: its rule's
    /// `local_share`, else the server's default.
    pub local_share: f64,
    /// Units a replica may reserve of this counter and admit from without the store: its
    /// rule's `local_budget` (a shared store only). Borrowed from the rule: a charge is
    /// copied from layer to layer, and held across the store call.
    pub local_budget: Option<&'a LocalBudget>,
    /// Whether the prefilter may remember a denial of this charge (a shared store only).
    pub prefilterable: bool,
}

impl<'a> Charge<'a> {
    /// An enforced charge of `cost` on `key` under `params`, with the settings of a limit that
    /// sets none: the `open` posture, the whole limit as its local share, no local budget, and
    /// never remembered by the prefilter.
    pub fn new(key: &'a [u8], params: &'a Params, cost: u64) -> Self {
        Charge {
            key,
            params,
            cost,
            enforce: true,
            quota: false,
            checks_as_is: false,
            posture: Posture::Open,
            local_share: 1.0,
            local_budget: None,
            prefilterable: false,
        }
    }
}

impl<'a> Charge<'a> {
    /// This charge in a store call that decides part of its request (one cluster slot, the
    /// slots a partial answer left): a quota limit as one that does not enforce, since whether
    /// its denial denies depends on quota limits outside the call. Allowed, it is charged;
    /// denied, it charges nothing; the caller decides the request with [`admitted`].
    pub fn apart(&self) -> Charge<'a> {
        if self.quota {
            Charge {
                enforce: false,
                quota: false,
                ..*self
            }
        } else {
            *self
        }
    }
}

/// Whether one of `charges` has a local budget.
pub fn has_budgets(charges: &[Charge<'_>]) -> bool {
    charges.iter().any(|c| c.local_budget.is_some())
}

/// Whether a request whose charges got `decisions` is admitted: every enforced charge
/// without [`Charge::quota`] is allowed, and so is at least one quota charge when there are
/// any, as envoyproxy/ratelimit's quota mode answers (a quota charge that does not enforce,
/// a shadow rule's, never counts as over). Then every allowed charge is committed; a denied
/// quota charge charges nothing.
pub fn admitted(charges: &[Charge<'_>], decisions: &[Decision]) -> bool {
    let mut quotas = Quotas::default();
    for (c, d) in charges.iter().zip(decisions) {
        if !quotas.admits(c, d.is_allowed()) {
            return false;
        }
    }
    quotas.satisfied()
}

/// The quota charges of one request seen so far (see [`admitted`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct Quotas {
    /// Whether there is one.
    any: bool,
    /// Whether one of them is allowed (or does not enforce).
    passes: bool,
}

impl Quotas {
    /// Takes in `charge`, allowed or not; false when it denies the request on its own (an
    /// enforced charge without quota mode, denied).
    pub fn admits(&mut self, charge: &Charge<'_>, allowed: bool) -> bool {
        if charge.quota {
            self.any = true;
            self.passes |= allowed || !charge.enforce;
            return true;
        }
        allowed || !charge.enforce
    }

    /// Whether the quota charges taken in let the request through: none, or one allowed.
    pub fn satisfied(self) -> bool {
        !self.any || self.passes
    }
}
