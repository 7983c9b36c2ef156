//! The `X-RateLimit-Limit`, `-Remaining` and `-Reset` headers of a gRPC answer that left them
//! out: a service started with `--no-rls-x-ratelimit-headers` (for an Envoy that adds its own)
//! still sends the rest of the contract (see `tollgate::limiter::headers`), and the tower layer's
//! responses should carry the same three as over the HTTP API.
//!
//! Where they come from, best first:
//!
//! 1. `RateLimit-Policy: "name";q=Q;w=W` and `RateLimit: "name";r=R;t=T`, which tollgate writes
//!    from the same binding limit and numbers as the three: `Q`, `R` and `T` are exactly their
//!    values (a bucket whose burst is not its limit included, which the statuses would report
//!    as its configured rate).
//! 2. Without those (another Envoy RLS service), the descriptor statuses, the binding one
//!    picked as the HTTP path picks it: when denied, the over-limit status whose reset is the
//!    furthest; when allowed, the one with the least remaining.
//!
//! An answer the service gave as unavailable (`X-Tollgate-Degraded: closed`) gets none, as over
//! HTTP: it is not a real limit.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use tollgate::limiter::headers;

use crate::remote::FORWARDED;

/// `forwarded` (in [`FORWARDED`]'s order) with the three added when the service left them out
/// and `response` says what they are.
pub(crate) fn completed(
    forwarded: Vec<(&'static str, String)>,
    response: &RateLimitResponse,
) -> Vec<(&'static str, String)> {
    let has = |name: &str| forwarded.iter().any(|(n, _)| *n == name);
    let unavailable = forwarded
        .iter()
        .any(|(n, v)| *n == headers::DEGRADED && v == "closed");
    if has(headers::LIMIT) || unavailable {
        return forwarded;
    }
    let Some([limit, remaining, reset]) =
        from_structured(&forwarded).or_else(|| from_statuses(response))
    else {
        return forwarded;
    };
    let rebuilt = [
        (headers::LIMIT, limit.to_string()),
        (headers::REMAINING, remaining.to_string()),
        (headers::RESET, reset.to_string()),
    ];
    FORWARDED
        .iter()
        .filter_map(|name| {
            forwarded
                .iter()
                .chain(&rebuilt)
                .find(|(n, _)| n == name)
                .cloned()
        })
        .collect()
}

/// Limit, remaining and reset from `RateLimit-Policy`'s `q` and `RateLimit`'s `r` and `t`.
fn from_structured(forwarded: &[(&'static str, String)]) -> Option<[u64; 3]> {
    let value = |name: &str| {
        forwarded
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    };
    let policy = value(headers::POLICY)?;
    let ratelimit = value(headers::RATELIMIT)?;
    Some([
        parameter(policy, "q")?,
        parameter(ratelimit, "r")?,
        parameter(ratelimit, "t")?,
    ])
}

/// The integer parameter `key` of a structured-field item whose bare item is a string:
/// `"na;me";q=5;w=60` has `q` 5 (the `;` inside the quotes is part of the name).
fn parameter(item: &str, key: &str) -> Option<u64> {
    let rest = item.strip_prefix('"')?;
    let mut escaped = false;
    let end = rest.char_indices().find_map(|(i, c)| {
        let closes = c == '"' && !escaped;
        escaped = c == '\\' && !escaped;
        closes.then_some(i)
    })?;
    rest[end + 1..]
        .split(';')
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
}

/// Limit, remaining and reset from the binding status (see the module documentation).
fn from_statuses(response: &RateLimitResponse) -> Option<[u64; 3]> {
    let limited = response
        .statuses
        .iter()
        .filter(|s| s.current_limit.is_some());
    let reset = |s: &DescriptorStatus| {
        s.duration_until_reset
            .as_ref()
            .map_or(0, |d| u64::try_from(d.seconds).unwrap_or(0))
    };
    let binding = if response.overall_code == Code::OverLimit as i32 {
        limited
            .filter(|s| s.code == Code::OverLimit as i32)
            .max_by_key(|s| reset(s))
    } else {
        limited.min_by_key(|s| s.limit_remaining)
    }?;
    let limit = binding.current_limit.as_ref()?.requests_per_unit;
    Some([
        u64::from(limit),
        u64::from(binding.limit_remaining),
        reset(binding),
    ])
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
    use envoy_types::pb::google::protobuf::Duration as WireDuration;

    use super::*;

    fn status(code: Code, limit: u32, remaining: u32, reset: i64) -> DescriptorStatus {
        DescriptorStatus {
            code: code as i32,
            current_limit: Some(RateLimit {
                name: String::new(),
                requests_per_unit: limit,
                unit: 0,
            }),
            limit_remaining: remaining,
            duration_until_reset: Some(WireDuration {
                seconds: reset,
                nanos: 0,
            }),
            ..Default::default()
        }
    }

    fn answer(code: Code, statuses: Vec<DescriptorStatus>) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: code as i32,
            statuses,
            ..Default::default()
        }
    }

    fn owned(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        pairs.iter().map(|(n, v)| (*n, (*v).to_owned())).collect()
    }

    #[test]
    fn parameters_are_read_after_the_quoted_name() {
        assert_eq!(parameter(r#""per_key";q=20;w=4"#, "q"), Some(20));
        assert_eq!(parameter(r#""per_key";q=20;w=4"#, "w"), Some(4));
        assert_eq!(parameter(r#""a;q=1 \"x\"";q=7"#, "q"), Some(7));
        assert_eq!(parameter(r#""n";r=0;t=3"#, "q"), None);
        assert_eq!(parameter("unquoted;q=1", "q"), None);
    }

    /// The structured headers give the three, in the forwarded order, over the statuses.
    #[test]
    fn the_three_come_from_the_structured_headers_first() {
        let forwarded = owned(&[
            (headers::POLICY, r#""bursty";q=20;w=4"#),
            (headers::RATELIMIT, r#""bursty";r=19;t=1"#),
        ]);
        let response = answer(Code::Ok, vec![status(Code::Ok, 5, 19, 1)]);
        assert_eq!(
            completed(forwarded, &response),
            owned(&[
                (headers::LIMIT, "20"),
                (headers::REMAINING, "19"),
                (headers::RESET, "1"),
                (headers::POLICY, r#""bursty";q=20;w=4"#),
                (headers::RATELIMIT, r#""bursty";r=19;t=1"#),
            ])
        );
    }

    #[test]
    fn without_them_the_binding_status_gives_the_three() {
        let allowed = answer(
            Code::Ok,
            vec![status(Code::Ok, 10, 7, 30), status(Code::Ok, 3, 2, 3600)],
        );
        assert_eq!(
            completed(Vec::new(), &allowed),
            owned(&[
                (headers::LIMIT, "3"),
                (headers::REMAINING, "2"),
                (headers::RESET, "3600")
            ])
        );
        let denied = answer(
            Code::OverLimit,
            vec![
                status(Code::OverLimit, 10, 0, 30),
                status(Code::Ok, 3, 0, 90000),
                status(Code::OverLimit, 100, 0, 3600),
            ],
        );
        let retry = owned(&[(headers::RETRY_AFTER, "3600")]);
        assert_eq!(
            completed(retry, &denied),
            owned(&[
                (headers::LIMIT, "100"),
                (headers::REMAINING, "0"),
                (headers::RESET, "3600"),
                (headers::RETRY_AFTER, "3600"),
            ])
        );
    }

    #[test]
    fn present_unavailable_or_unknown_leaves_them_as_they_are() {
        let response = answer(Code::Ok, vec![status(Code::Ok, 3, 2, 60)]);
        let present = owned(&[(headers::LIMIT, "9")]);
        assert_eq!(completed(present.clone(), &response), present);
        let closed = owned(&[(headers::DEGRADED, "closed"), (headers::RETRY_AFTER, "1")]);
        assert_eq!(completed(closed.clone(), &response), closed);
        let unlimited = answer(Code::Ok, vec![DescriptorStatus::default()]);
        assert_eq!(completed(Vec::new(), &unlimited), Vec::new());
    }
}
