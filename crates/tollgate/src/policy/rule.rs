use std::time::Duration;

use tollgate_core::Params;

use super::posture::Posture;
use super::{Location, Unit};

/// One limit defined by a descriptor's `rate_limit` block, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Position in [`Policy::rules`](super::Policy::rules).
    pub index: usize,
    /// The domain the rule belongs to.
    pub domain: String,
    /// The `name` given in `rate_limit`, or else the envoy-style descriptor path
    /// (`tenant.path_/login`: `key` or `key_value` per level, joined by `.`; `#2`, `#3`... on
    /// a path that reads like an earlier rule's). Unique in a domain.
    pub name: String,
    /// Whether `name` was given in `rate_limit` (rather than derived): envoyproxy/ratelimit
    /// reports the given name as `current_limit.name`, and an empty one otherwise.
    pub name_given: bool,
    /// Stable, injective identity for counter keys: the domain and the path of keys and values,
    /// length-prefixed. Unchanged across reloads as long as the rule's path is unchanged; two
    /// different rules never share one.
    pub identity: String,
    /// Bit `i` set: the value of a request's entry `i` is left out of the counter key, because
    /// level `i` is a wildcard with `share_threshold: true` (every value it matches shares one
    /// counter).
    pub shared_levels: u64,
    /// The limit; `None` for `unlimited: true`. For a `blocked` rule, its limit of 1 is a
    /// stand-in that gives the period.
    pub limit: Option<Params>,
    /// `requests_per_unit: 0`: every request it matches is over the limit, and no counter is
    /// kept (the store is not asked). In shadow mode, reported as a denial it would have made.
    pub blocked: bool,
    /// The envoy unit the limit was written with; `None` when written with `period` or unlimited.
    pub unit: Option<Unit>,
    /// `enforce` (default), `shadow` (`shadow_mode: true`: count and report, never deny) or
    /// `soft` (allow, but mark the request as over its limit with a suggested delay).
    pub mode: RuleMode,
    /// `quota_mode: true`: over its limit, this rule denies the request only when every
    /// quota-mode rule the request matched is over its limit too; otherwise it charges nothing
    /// and reports OVER_LIMIT in its status while the request is admitted.
    pub quota_mode: bool,
    /// `detailed_metric: true`: its outcomes are also counted per descriptor value (see
    /// `metrics::MAX_DETAILED_VALUES`).
    pub detailed_metric: bool,
    /// The descriptor's `metadata` mapping, if it has a non-empty one: returned in the RLS
    /// response's `dynamic_metadata` when this rule admits (see `--rls-dynamic-metadata`).
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// Names of the rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// `on_store_error`; `None` means the server's default posture.
    pub on_store_error: Option<Posture>,
    /// `local_share`; `None` means the server's default share.
    pub local_share: Option<f64>,
    /// `local_budget` and `local_budget_ttl`; `None` means every decision goes to the store.
    pub local_budget: Option<LocalBudget>,
    /// Where the rule's `rate_limit` block is.
    pub location: Location,
}

/// A rule's `local_budget`: the units a replica reserves from the store at a time, and how
/// long a reservation lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalBudget {
    /// Units per reservation, at least 1 and at most the limit's capacity.
    pub size: u64,
    /// Lifetime of a reservation.
    pub ttl: Duration,
}

impl LocalBudget {
    /// The reservation lifetime when `local_budget_ttl` is not given.
    pub const DEFAULT_TTL: Duration = Duration::from_millis(100);
    /// The shortest and longest `local_budget_ttl` accepted.
    pub const TTL_RANGE: (Duration, Duration) = (Duration::from_millis(1), Duration::from_secs(60));
}

/// How a request whose cost does not fit is charged: the policy file's `charge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ChargeMode {
    /// `whole`: denied, charging nothing.
    #[default]
    Whole,
    /// `up_to_limit`: admitted while a unit is left, charging what is left.
    UpToLimit,
}

impl ChargeMode {
    /// The policy-file spelling.
    pub fn name(self) -> &'static str {
        match self {
            ChargeMode::Whole => "whole",
            ChargeMode::UpToLimit => "up_to_limit",
        }
    }
}

impl std::str::FromStr for ChargeMode {
    type Err = UnknownChargeMode;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "whole" => Ok(ChargeMode::Whole),
            "up_to_limit" => Ok(ChargeMode::UpToLimit),
            other => Err(UnknownChargeMode(other.to_owned())),
        }
    }
}

/// A `charge` that is neither `whole` nor `up_to_limit`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown charge `{0}`, expected whole or up_to_limit")]
pub struct UnknownChargeMode(pub String);

/// What the rules of a policy that leave a setting out get, set by the server rather than the
/// files (a policy that arrives over xDS carries none of tollgate's extensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PolicyDefaults {
    /// The `charge` of a rule without one (`serve --default-charge`). A rule with a
    /// `local_budget` stays `whole`, the only charge it can have.
    pub charge: ChargeMode,
}

/// How a rule acts on a request over its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RuleMode {
    /// Deny.
    #[default]
    Enforce,
    /// Count and report what would have been denied; never deny.
    Shadow,
    /// Allow, marked `soft_exceeded`, with a suggested delay that grows with the overage.
    Soft,
}

impl RuleMode {
    /// The policy-file spelling.
    pub fn name(self) -> &'static str {
        match self {
            RuleMode::Enforce => "enforce",
            RuleMode::Shadow => "shadow",
            RuleMode::Soft => "soft",
        }
    }
}

impl Rule {
    /// Whether the rule is in shadow mode.
    pub fn is_shadow(&self) -> bool {
        self.mode == RuleMode::Shadow
    }

    /// Whether the rule is `unlimited: true`.
    pub fn is_unlimited(&self) -> bool {
        self.limit.is_none()
    }
}

/// The failure posture that answers for a limit of `rule` when the store cannot decide it:
/// the rule's own `on_store_error`, else `default` (the server's), which also answers for a
/// limit of no rule (one the caller sent).
pub fn posture_of(rule: Option<&Rule>, default: Posture) -> Posture {
    rule.and_then(|rule| rule.on_store_error).unwrap_or(default)
}
