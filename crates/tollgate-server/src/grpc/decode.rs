//! Wire request → [`CheckRequest`].

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate::limiter::{
    CheckRequest, InvalidRequest, LimitOverride, RequestDescriptor, check_cost,
};

use crate::units::period_of_unit;

/// Validates an RLS request. It takes the request by value so that the domain and every entry
/// move into the [`CheckRequest`] instead of being copied.
pub fn decode_request(request: RateLimitRequest) -> Result<CheckRequest, InvalidRequest> {
    // proto3 cannot tell 0 from unset: Envoy documents 0 as "1 hit". Checked even when every
    // descriptor has its own (the limit holds on every API), and its error is the request's.
    let request_cost = check_cost(u64::from(request.hits_addend.max(1)))?;
    let mut descriptors = Vec::with_capacity(request.descriptors.len());
    for (i, d) in request.descriptors.into_iter().enumerate() {
        if d.is_negative_hits {
            // Refunds from callers are not supported; refusing is better than silently charging.
            return Err(InvalidRequest(format!(
                "descriptor {i}: is_negative_hits is not supported"
            )));
        }
        // A per-descriptor hits_addend overrides the request's. Being a wrapper, it can say 0,
        // which means "check without counting", answered as envoyproxy/ratelimit answers it
        // (see `with_checks_as_is` below).
        let cost = match d.hits_addend {
            Some(v) => v.value,
            None => request_cost,
        };
        let limit_override = match d.limit {
            None => None,
            Some(l) => {
                let period = period_of_unit(l.unit).ok_or_else(|| {
                    InvalidRequest(format!(
                        "descriptor {i}: limit override has unknown unit {}",
                        l.unit
                    ))
                })?;
                Some(
                    LimitOverride::new(u64::from(l.requests_per_unit), period)
                        .map_err(|e| InvalidRequest(format!("descriptor {i}: {e}")))?,
                )
            }
        };
        let entries = d.entries.into_iter().map(|e| (e.key, e.value)).collect();
        descriptors.push(
            RequestDescriptor::new(entries, cost, limit_override)
                .map_err(|e| InvalidRequest(format!("descriptor {i}: {e}")))?,
        );
    }
    // A check is over only past the limit, as envoyproxy/ratelimit answers it; rules with
    // `charge: up_to_limit` keep "would one more unit fit" (token budgets need it).
    CheckRequest::new(request.domain, descriptors).map(|r| r.with_checks_as_is(true))
}
