use tollgate_core::Params;

use super::{Location, Unit};
use crate::resilience::Posture;

/// One limit defined by a descriptor's `rate_limit` block, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Position in [`Policy::rules`](super::Policy::rules).
    pub index: usize,
    /// The domain the rule belongs to.
    pub domain: String,
    /// The `name` given in `rate_limit`, or else the envoy-style descriptor path
    /// (`tenant.path_/login`: `key` or `key_value` per level, joined by `.`). Unique in a domain.
    pub name: String,
    /// Stable, injective identity for counter keys: the domain and the path of keys and values,
    /// length-prefixed. Unchanged across reloads as long as the rule's path is unchanged; two
    /// different rules never share one.
    pub identity: String,
    /// The limit; `None` for `unlimited: true`.
    pub limit: Option<Params>,
    /// The envoy unit the limit was written with; `None` when written with `period` or unlimited.
    pub unit: Option<Unit>,
    /// `shadow_mode: true`: count and report, never deny.
    pub shadow: bool,
    /// `detailed_metric: true`: metrics may carry the matched value.
    pub detailed_metric: bool,
    /// Names of the rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// `on_store_error`; `None` means the server's default posture.
    pub on_store_error: Option<Posture>,
    /// `local_share`; `None` means the server's default share.
    pub local_share: Option<f64>,
    /// Where the rule's `rate_limit` block is.
    pub location: Location,
}

impl Rule {
    /// Whether the rule is `unlimited: true`.
    pub fn is_unlimited(&self) -> bool {
        self.limit.is_none()
    }
}
