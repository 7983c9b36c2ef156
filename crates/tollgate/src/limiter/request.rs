//! A validated check request. Transports decode their wire format into [`CheckRequest`]; past
//! this point nothing is re-validated.

use std::time::Duration;

use tollgate_core::{Algorithm, Params};

mod path;

pub use path::normalized_path;

/// Largest request body, in bytes, the service's HTTP API accepts for one decision (a remote
/// client checks it before sending).
pub const MAX_BODY: usize = 64 * 1024;

/// Largest cost (`hits_addend`) one descriptor may carry.
pub const MAX_COST: u64 = 1_000_000_000;
/// Most descriptors in one request.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries in one descriptor.
pub const MAX_ENTRIES: usize = 32;
/// Longest domain or key, in bytes (defined with the policy, which refuses longer names).
pub use crate::policy::MAX_FIELD_LEN;

/// Why a request could not be decided. A store failure is not one of them: the failure
/// postures answer instead (see [`crate::resilience::FailureSettings`]).
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The request is malformed; nothing was counted.
    #[error("invalid request: {0}")]
    Invalid(#[from] InvalidRequest),
}

/// Why a request was refused before anything was counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRequest(pub String);

/// A limit sent by the caller instead of the configured one (Envoy's per-descriptor `limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// The limit as fixed-window parameters (a limit of 1 when it `blocks`).
    pub params: Params,
    /// `requests_per_unit` 0: the descriptor is always over its limit, as envoyproxy/ratelimit
    /// answers it.
    pub blocks: bool,
}

impl LimitOverride {
    /// Validates `requests_per_unit` per `period`; 0 blocks the descriptor.
    pub fn new(requests_per_unit: u64, period: Duration) -> Result<Self, InvalidRequest> {
        let blocks = requests_per_unit == 0;
        Params::new(
            Algorithm::FixedWindow,
            requests_per_unit.max(1),
            period,
            None,
        )
        .map(|params| LimitOverride { params, blocks })
        .map_err(|e| InvalidRequest(format!("invalid limit override: {e}")))
    }
}

/// One descriptor: ordered entries, its cost and an optional limit override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestDescriptor {
    entries: Vec<(String, String)>,
    cost: u64,
    limit_override: Option<LimitOverride>,
}

impl RequestDescriptor {
    /// Validates one descriptor. `cost` must be in `0..=MAX_COST`; 0 checks the descriptor's
    /// limit without charging it, as Envoy's per-descriptor `hits_addend: 0` does (transports
    /// resolve protocol defaults such as a request's "0 means 1" before calling this; see
    /// [`tollgate_core::check`]). Values of any length are
    /// accepted, and matched against the policy as they are: they come from clients (a path,
    /// a token), and refusing the request would let Envoy, which fails open on an error, pass
    /// it unlimited on every descriptor. For the same reason a descriptor without entries is
    /// accepted and matches no rule (Envoy sends one when a `request_headers` action with
    /// `skip_if_absent` finds no header; envoyproxy/ratelimit answers it `OK`).
    pub fn new(
        entries: Vec<(String, String)>,
        cost: u64,
        limit_override: Option<LimitOverride>,
    ) -> Result<Self, InvalidRequest> {
        if entries.len() > MAX_ENTRIES {
            return Err(InvalidRequest(format!(
                "descriptor has {} entries, at most {MAX_ENTRIES} are allowed",
                entries.len()
            )));
        }
        for (key, _) in &entries {
            if key.is_empty() {
                return Err(InvalidRequest("descriptor entry has an empty key".into()));
            }
            if key.len() > MAX_FIELD_LEN {
                return Err(InvalidRequest(format!(
                    "descriptor key `{}` is longer than {MAX_FIELD_LEN} bytes",
                    truncate(key)
                )));
            }
        }
        if cost > 0 {
            check_cost(cost)?;
        }
        Ok(RequestDescriptor {
            entries,
            cost,
            limit_override,
        })
    }

    /// The entries, in request order.
    pub fn entries(&self) -> &[(String, String)] {
        &self.entries
    }

    /// The cost of this descriptor; 0 for a check, which charges nothing.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The caller's limit override, if any.
    pub fn limit_override(&self) -> Option<&LimitOverride> {
        self.limit_override.as_ref()
    }
}

/// Checks that a cost is within `1..=MAX_COST`.
pub fn check_cost(cost: u64) -> Result<u64, InvalidRequest> {
    match cost {
        0 => Err(InvalidRequest("hits_addend must be at least 1".into())),
        c if c > MAX_COST => Err(InvalidRequest(format!(
            "hits_addend {c} is above the maximum of {MAX_COST}"
        ))),
        c => Ok(c),
    }
}

fn truncate(s: &str) -> &str {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A whole request: a domain and at least one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRequest {
    domain: String,
    descriptors: Vec<RequestDescriptor>,
    /// Whether a check (cost 0) answers as the counter stands (see
    /// [`CheckRequest::with_checks_as_is`]).
    checks_as_is: bool,
}

impl CheckRequest {
    /// Validates a request.
    pub fn new(
        domain: String,
        descriptors: Vec<RequestDescriptor>,
    ) -> Result<Self, InvalidRequest> {
        if domain.is_empty() {
            return Err(InvalidRequest("domain must not be empty".into()));
        }
        if domain.len() > MAX_FIELD_LEN {
            return Err(InvalidRequest(format!(
                "domain is longer than {MAX_FIELD_LEN} bytes"
            )));
        }
        if descriptors.is_empty() {
            return Err(InvalidRequest("request has no descriptors".into()));
        }
        if descriptors.len() > MAX_DESCRIPTORS {
            return Err(InvalidRequest(format!(
                "request has {} descriptors, at most {MAX_DESCRIPTORS} are allowed",
                descriptors.len()
            )));
        }
        Ok(CheckRequest {
            domain,
            descriptors,
            checks_as_is: false,
        })
    }

    /// This request with its checks (descriptors of cost 0) answered as envoyproxy/ratelimit
    /// answers `hits_addend: 0` when `on`: over only when the counter is already past its
    /// limit, so a limit exactly used up still admits. Limits with `charge: up_to_limit` keep
    /// tollgate's check, over once no unit is left: a charge there stops at the limit, so
    /// nothing else would ever answer over. Off, every check is tollgate's. The RLS transports
    /// turn it on.
    pub fn with_checks_as_is(mut self, on: bool) -> Self {
        self.checks_as_is = on;
        self
    }

    /// Whether checks answer as the counter stands (see [`CheckRequest::with_checks_as_is`]).
    pub fn checks_as_is(&self) -> bool {
        self.checks_as_is
    }

    /// The domain.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The descriptors, in request order.
    pub fn descriptors(&self) -> &[RequestDescriptor] {
        &self.descriptors
    }

    /// The same request with every descriptor costing `cost` (0: a check, which charges
    /// nothing), or why that cost is refused.
    pub fn with_cost(&self, cost: u64) -> Result<CheckRequest, InvalidRequest> {
        if cost > 0 {
            check_cost(cost)?;
        }
        let mut request = self.clone();
        for descriptor in &mut request.descriptors {
            descriptor.cost = cost;
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value over the length limit is accepted as it is (it is matched as it is; counter keys
    /// digest it); a key over it is an error (keys come from configuration, not from clients).
    #[test]
    fn long_values_are_kept_long_keys_refused() {
        let entry = |key: &str, value: &str| {
            RequestDescriptor::new(vec![(key.into(), value.into())], 1, None)
                .map(|d| d.entries()[0].1.clone())
        };
        let long = "v".repeat(MAX_FIELD_LEN + 1);
        assert_eq!(entry("path", &long).unwrap(), long);
        let error = entry(&"k".repeat(MAX_FIELD_LEN + 1), "v").unwrap_err();
        assert!(error.0.contains("is longer than 1024 bytes"), "{error}");
    }
}
