//! envoyproxy/ratelimit's response headers (its `LIMIT_RESPONSE_HEADERS_ENABLED`), sent in
//! place of tollgate's own when asked for.
//!
//! Upstream reports one descriptor: among the statuses that carry a `current_limit`, the one
//! with the least `limit_remaining` (the first of equals), except that a descriptor over its
//! limit takes the place (the last one over, as upstream walks them in order). The three
//! values are its `requests_per_unit`, its `limit_remaining` and the whole seconds until its
//! window resets; they are sent on OK answers as well as OVER_LIMIT ones, and not at all when
//! no descriptor matched a limit.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as WireCode, DescriptorStatus as WireStatus,
};

/// The three header names (upstream's defaults: `RateLimit-Limit`, `RateLimit-Remaining`,
/// `RateLimit-Reset`; its `LIMIT_LIMIT_HEADER` etc. rename them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamHeaders {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl Default for UpstreamHeaders {
    fn default() -> Self {
        UpstreamHeaders {
            limit: "RateLimit-Limit".to_owned(),
            remaining: "RateLimit-Remaining".to_owned(),
            reset: "RateLimit-Reset".to_owned(),
        }
    }
}

impl UpstreamHeaders {
    /// The headers for an answer with these statuses; empty when none carries a limit.
    pub fn for_statuses(&self, statuses: &[WireStatus]) -> Vec<HeaderValue> {
        let mut reported: Option<&WireStatus> = None;
        let mut least = u32::MAX;
        for status in statuses {
            if status.current_limit.is_some() && status.limit_remaining < least {
                reported = Some(status);
                least = status.limit_remaining;
            }
            if status.code == WireCode::OverLimit as i32 && status.current_limit.is_some() {
                reported = Some(status);
                least = 0;
            }
        }
        let Some(status) = reported else {
            return Vec::new();
        };
        let limit = status
            .current_limit
            .as_ref()
            .map_or(0, |limit| limit.requests_per_unit);
        let reset = status
            .duration_until_reset
            .as_ref()
            .map_or(0, |reset| reset.seconds.max(0));
        [
            (&self.limit, limit.to_string()),
            (&self.remaining, status.limit_remaining.to_string()),
            (&self.reset, reset.to_string()),
        ]
        .into_iter()
        .map(|(key, value)| HeaderValue {
            key: key.clone(),
            value,
            ..Default::default()
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
    use envoy_types::pb::google::protobuf::Duration;

    use super::*;

    fn status(code: WireCode, limit: Option<u32>, remaining: u32, reset: i64) -> WireStatus {
        WireStatus {
            code: code as i32,
            current_limit: limit.map(|requests_per_unit| RateLimit {
                requests_per_unit,
                unit: 2,
                name: String::new(),
            }),
            limit_remaining: remaining,
            duration_until_reset: Some(Duration {
                seconds: reset,
                nanos: 0,
            }),
            ..Default::default()
        }
    }

    fn pairs(headers: &[HeaderValue]) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect()
    }

    fn named(limit: &str, remaining: &str, reset: &str) -> Vec<(String, String)> {
        vec![
            ("RateLimit-Limit".to_owned(), limit.to_owned()),
            ("RateLimit-Remaining".to_owned(), remaining.to_owned()),
            ("RateLimit-Reset".to_owned(), reset.to_owned()),
        ]
    }

    #[test]
    fn the_descriptor_closest_to_its_limit_is_reported_on_ok() {
        let statuses = [
            status(WireCode::Ok, Some(10), 7, 30),
            status(WireCode::Ok, Some(5), 2, 50),
            status(WireCode::Ok, None, u32::MAX, 0),
        ];
        let headers = UpstreamHeaders::default().for_statuses(&statuses);
        assert_eq!(pairs(&headers), named("5", "2", "50"));
    }

    #[test]
    fn a_descriptor_over_its_limit_wins_over_one_with_less_remaining_before_it() {
        let statuses = [
            status(WireCode::Ok, Some(3), 0, 10),
            status(WireCode::OverLimit, Some(100), 0, 40),
        ];
        let headers = UpstreamHeaders::default().for_statuses(&statuses);
        assert_eq!(pairs(&headers), named("100", "0", "40"));
    }

    #[test]
    fn no_limit_matched_sends_no_header_and_names_are_renamable() {
        let none = [status(WireCode::Ok, None, 0, 0)];
        assert!(UpstreamHeaders::default().for_statuses(&none).is_empty());
        let names = UpstreamHeaders {
            limit: "X-RateLimit-Limit".to_owned(),
            remaining: "X-RateLimit-Remaining".to_owned(),
            reset: "X-RateLimit-Reset".to_owned(),
        };
        let headers = names.for_statuses(&[status(WireCode::Ok, Some(4), 3, 9)]);
        let keys: Vec<String> = headers.into_iter().map(|h| h.key).collect();
        assert_eq!(
            keys,
            [
                "X-RateLimit-Limit",
                "X-RateLimit-Remaining",
                "X-RateLimit-Reset"
            ]
        );
    }
}
