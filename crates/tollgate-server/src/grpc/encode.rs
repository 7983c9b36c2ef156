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

/// `wait` in whole seconds, rounded up, as envoyproxy/ratelimit sends `duration_until_reset`
/// (its windows end on whole seconds).
fn whole_seconds(wait: std::time::Duration) -> WireDuration {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    WireDuration {
        seconds: i64::try_from(seconds).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

fn encode_status(status: &DescriptorStatus) -> WireStatus {
    let mut wire = WireStatus {
        code: wire_code(status.code),
        ..Default::default()
    };
    if status.unlimited_rule {
        // As envoyproxy/ratelimit answers an unlimited rule: OK, no current limit.
        wire.limit_remaining = u32::MAX;
    }
    if let (Some(limit), Some(decision)) = (&status.limit, status.decision) {
        let params = limit.params();
        wire.current_limit = Some(RateLimit {
            // envoyproxy/ratelimit's: the configured name or empty (tollgate's derived names
            // stay in its metrics, logs and headers).
            name: limit.configured_name().to_owned(),
            requests_per_unit: saturate_u32(decision.limit),
            // A period that is not one of Envoy's units (e.g. `30s`) is reported as UNKNOWN;
            // the name and duration_until_reset still describe it.
            unit: params.and_then(|p| unit_of_period(p.period())).unwrap_or(0),
        });
        wire.limit_remaining = saturate_u32(decision.remaining);
        wire.duration_until_reset = Some(whole_seconds(decision.reset_after));
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
                unlimited_rule: false,
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

    /// As envoyproxy/ratelimit: whole seconds, the wait rounded up, never fractions.
    #[test]
    fn duration_until_reset_is_whole_seconds_rounded_up() {
        let seconds = |d: Duration| {
            let wire = whole_seconds(d);
            assert_eq!(wire.nanos, 0);
            wire.seconds
        };
        assert_eq!(seconds(Duration::from_millis(44_300)), 45);
        assert_eq!(seconds(Duration::from_secs(45)), 45);
        assert_eq!(seconds(Duration::from_nanos(1)), 1);
        assert_eq!(seconds(Duration::ZERO), 0);
    }

    /// A descriptor that matched an unlimited rule: OK with `u32::MAX` remaining and no
    /// current limit; one that matched nothing keeps 0. A caller's limit has no name.
    #[test]
    fn unlimited_and_unnamed_limits_answer_as_upstream() {
        let status = |unlimited_rule: bool, limit: Option<AppliedLimit>| DescriptorStatus {
            code: Code::Ok,
            decision: limit.as_ref().map(|_| Decision {
                verdict: Verdict::Allowed,
                limit: 5,
                remaining: 4,
                reset_after: Duration::from_millis(1500),
                retry_after: None,
                delay: Duration::ZERO,
            }),
            limit,
            shadow_would_deny: false,
            soft_exceeded: false,
            degraded: None,
            unlimited_rule,
        };
        let unlimited = encode_status(&status(true, None));
        assert_eq!(unlimited.limit_remaining, u32::MAX);
        assert!(unlimited.current_limit.is_none() && unlimited.duration_until_reset.is_none());
        assert_eq!(encode_status(&status(false, None)).limit_remaining, 0);
        let params = Params::new(Algorithm::FixedWindow, 5, Duration::from_secs(60), None)
            .unwrap_or_else(|e| panic!("{e}"));
        let sent = encode_status(&status(false, Some(AppliedLimit::Override(params))));
        assert_eq!(sent.current_limit.map(|l| l.name), Some(String::new()));
        assert_eq!(sent.duration_until_reset.map(|d| d.seconds), Some(2));
    }
}
