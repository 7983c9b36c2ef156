//! [`CheckResponse`] → wire response.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as WireCode, DescriptorStatus as WireStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::Duration as WireDuration;
use tollgate::limiter::{CheckResponse, Code, DescriptorStatus};

use crate::headers::{LIMIT, REMAINING, RESET, each_rate_limit_header};
use crate::units::unit_of_period;

fn wire_code(code: Code) -> i32 {
    match code {
        Code::Ok => WireCode::Ok as i32,
        Code::OverLimit => WireCode::OverLimit as i32,
    }
}

fn saturate_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn encode_status(status: &DescriptorStatus) -> WireStatus {
    let mut wire = WireStatus {
        code: wire_code(status.code),
        ..Default::default()
    };
    if let (Some(limit), Some(decision)) = (&status.limit, status.decision) {
        let params = limit.params();
        wire.current_limit = Some(RateLimit {
            name: limit.name().to_owned(),
            requests_per_unit: saturate_u32(decision.limit),
            // A period that is not one of Envoy's units (e.g. `30s`) is reported as UNKNOWN;
            // the name and duration_until_reset still describe it.
            unit: params.and_then(|p| unit_of_period(p.period())).unwrap_or(0),
        });
        wire.limit_remaining = saturate_u32(decision.remaining);
        let reset = decision.reset_after;
        wire.duration_until_reset = Some(WireDuration {
            seconds: i64::try_from(reset.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(reset.subsec_nanos()).unwrap_or(0),
        });
    }
    wire
}

/// Encodes a decision, with the rate-limit headers in `response_headers_to_add`; without the
/// `X-RateLimit-*` three when `x_ratelimit` is false (Envoy then adds its own).
pub fn encode_response(response: &CheckResponse, x_ratelimit: bool) -> RateLimitResponse {
    let mut headers = Vec::new();
    each_rate_limit_header(response, |key, value| {
        if !x_ratelimit && [LIMIT, REMAINING, RESET].contains(&key) {
            return;
        }
        headers.push(HeaderValue {
            key: key.to_owned(),
            value: value.to_owned(),
            ..Default::default()
        });
    });
    RateLimitResponse {
        overall_code: wire_code(response.overall),
        statuses: response.statuses.iter().map(encode_status).collect(),
        response_headers_to_add: headers,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate::limiter::AppliedLimit;
    use tollgate_core::{Algorithm, Decision, Params, Verdict};

    use super::*;

    /// Without `X-RateLimit-*` (`--no-rls-x-ratelimit-headers`), the other headers and
    /// tollgate's markers are still sent.
    #[test]
    fn leaving_x_ratelimit_to_envoy_keeps_the_rest() {
        let params = Params::new(Algorithm::FixedWindow, 5, Duration::from_secs(60), None)
            .unwrap_or_else(|e| panic!("{e}"));
        let decision = Decision {
            verdict: Verdict::Denied,
            limit: 5,
            remaining: 0,
            reset_after: Duration::from_secs(30),
            retry_after: Some(Duration::from_secs(30)),
            delay: Duration::ZERO,
        };
        let response = CheckResponse {
            overall: Code::Ok,
            statuses: [DescriptorStatus {
                code: Code::Ok,
                limit: Some(AppliedLimit::Override(params)),
                decision: Some(decision),
                shadow_would_deny: false,
                soft_exceeded: true,
                degraded: None,
            }]
            .into_iter()
            .collect(),
        };
        let keys = |x_ratelimit: bool| -> Vec<String> {
            encode_response(&response, x_ratelimit)
                .response_headers_to_add
                .into_iter()
                .map(|h| h.key)
                .collect()
        };
        let all = keys(true);
        assert!(all.iter().any(|k| k == LIMIT), "{all:?}");
        let left = keys(false);
        let expected: Vec<String> = all
            .into_iter()
            .filter(|k| ![LIMIT, REMAINING, RESET].contains(&k.as_str()))
            .collect();
        assert_eq!(left, expected);
        assert!(
            left.iter().any(|k| k == "x-tollgate-soft-exceeded"),
            "{left:?}"
        );
        assert!(left.iter().any(|k| k == "ratelimit-policy"), "{left:?}");
    }
}
