//! Rate-limit response headers, shared by the HTTP API and gRPC `response_headers_to_add`.
//!
//! For the binding limit (see [`CheckResponse::binding`]): `X-RateLimit-Limit`,
//! `X-RateLimit-Remaining`, `X-RateLimit-Reset` (delta seconds), and the IETF
//! draft-ietf-httpapi-ratelimit-headers structured fields `RateLimit-Policy: "name";q=..;w=..` and
//! `RateLimit: "name";r=..;t=..`. A denial that can clear also gets `Retry-After` (whole
//! seconds, rounded up, at least 1).

use std::time::Duration;

use tollgate::limiter::CheckResponse;

/// Header names, as written on the wire.
pub const LIMIT: &str = "x-ratelimit-limit";
pub const REMAINING: &str = "x-ratelimit-remaining";
pub const RESET: &str = "x-ratelimit-reset";
pub const POLICY: &str = "ratelimit-policy";
pub const RATELIMIT: &str = "ratelimit";
pub const RETRY_AFTER: &str = "retry-after";
/// Set when the store could not decide and a failure posture answered: `open`, `local` or
/// `closed`.
pub const DEGRADED: &str = "x-tollgate-degraded";
/// Set when a `mode: soft` limit was exceeded: the suggested delay in milliseconds.
pub const SOFT_EXCEEDED: &str = "x-tollgate-soft-exceeded";

/// Whole milliseconds, rounded up so a caller waiting that long is never early.
pub fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.as_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// Whole seconds, rounded up.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The headers for a response, in a fixed order.
pub fn rate_limit_headers(response: &CheckResponse) -> Vec<(&'static str, String)> {
    let mut headers = Vec::with_capacity(7);
    if let Some(posture) = response.degraded() {
        headers.push((DEGRADED, posture.name().to_owned()));
    }
    if let Some(delay) = response.soft_delay() {
        headers.push((SOFT_EXCEEDED, ceil_ms(delay).to_string()));
    }
    if response.unavailable() {
        // Not a real limit: no quota headers, only when to try again.
        if let Some(retry) = response.retry_after() {
            headers.push((RETRY_AFTER, ceil_secs(retry).max(1).to_string()));
        }
        return headers;
    }
    let Some(status) = response.binding() else {
        return headers;
    };
    let (Some(limit), Some(decision)) = (&status.limit, status.decision) else {
        return headers;
    };
    let Some(params) = limit.params() else {
        return headers;
    };
    let reset = ceil_secs(decision.reset_after);
    let name = sf_string(limit.name());
    headers.push((LIMIT, decision.limit.to_string()));
    headers.push((REMAINING, decision.remaining.to_string()));
    headers.push((RESET, reset.to_string()));
    headers.push((
        POLICY,
        format!(
            "{name};q={};w={}",
            params.limit(),
            ceil_secs(params.period())
        ),
    ));
    headers.push((
        RATELIMIT,
        format!("{name};r={};t={reset}", decision.remaining),
    ));
    if let Some(retry) = response.retry_after() {
        headers.push((RETRY_AFTER, ceil_secs(retry).max(1).to_string()));
    }
    headers
}

/// A structured-field string (RFC 8941): quoted, with `\` and `"` escaped; characters outside
/// printable ASCII are replaced by `?` since sf-strings cannot carry them.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }

    #[test]
    fn structured_field_strings_escape_quotes() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("é"), "\"?\"");
    }
}
