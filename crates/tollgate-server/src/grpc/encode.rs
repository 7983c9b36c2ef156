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
