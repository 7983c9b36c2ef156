//! Rate-limit response headers, shared by the HTTP API and gRPC `response_headers_to_add`.
//!
//! For the binding limit (see [`CheckResponse::binding`]): `X-RateLimit-Limit`,
//! `X-RateLimit-Remaining`, `X-RateLimit-Reset` (delta seconds), and the IETF
//! draft-ietf-httpapi-ratelimit-headers structured fields `RateLimit-Policy: "name";q=..;w=..` and
//! `RateLimit: "name";r=..;t=..`. A denial that can clear also gets `Retry-After` (whole
//! seconds, rounded up, at least 1).

use std::fmt::{self, Write};
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

/// A request header's value as a descriptor value: `None` when missing or empty (an empty
/// value would be one key every such client shares, and could exhaust for the others); bytes
/// that are not visible ASCII read lossily, so a client cannot slip past its limit by sending a
/// value nobody can read.
pub fn header_text(
    headers: &axum::http::HeaderMap,
    name: impl axum::http::header::AsHeaderName,
) -> Option<String> {
    headers
        .get(name)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

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
    each_rate_limit_header(response, |name, value| {
        headers.push((name, value.to_owned()));
    });
    headers
}

/// Calls `emit(name, value)` for each header of [`rate_limit_headers`], in the same order. Every
/// value is formatted into one buffer reused across headers: this runs on every decision, and a
/// `String` per header was a visible share of a request's cost.
pub fn each_rate_limit_header(response: &CheckResponse, mut emit: impl FnMut(&'static str, &str)) {
    let mut buffer = String::with_capacity(64);
    let mut put = |name: &'static str, value: fmt::Arguments<'_>| {
        buffer.clear();
        // Writing into a String cannot fail.
        let _ = buffer.write_fmt(value);
        emit(name, &buffer);
    };
    if let Some(posture) = response.degraded() {
        put(DEGRADED, format_args!("{}", posture.name()));
    }
    if let Some(delay) = response.soft_delay() {
        put(SOFT_EXCEEDED, format_args!("{}", ceil_ms(delay)));
    }
    if response.unavailable() {
        // Not a real limit: no quota headers, only when to try again.
        if let Some(retry) = response.retry_after() {
            put(RETRY_AFTER, format_args!("{}", ceil_secs(retry).max(1)));
        }
        return;
    }
    let Some(status) = response.binding() else {
        return;
    };
    let (Some(limit), Some(decision)) = (&status.limit, status.decision) else {
        return;
    };
    let Some(params) = limit.params() else {
        return;
    };
    let reset = ceil_secs(decision.reset_after);
    let name = SfString(limit.name());
    put(LIMIT, format_args!("{}", decision.limit));
    put(REMAINING, format_args!("{}", decision.remaining));
    put(RESET, format_args!("{reset}"));
    put(
        POLICY,
        format_args!(
            "{name};q={};w={}",
            // The decision's limit, like X-RateLimit-Limit: under the `local` posture it is
            // this replica's share, not the configured limit.
            decision.limit,
            ceil_secs(params.period())
        ),
    );
    put(
        RATELIMIT,
        format_args!("{name};r={};t={reset}", decision.remaining),
    );
    if let Some(retry) = response.retry_after() {
        put(RETRY_AFTER, format_args!("{}", ceil_secs(retry).max(1)));
    }
}

/// A structured-field string (RFC 8941) when displayed: quoted, with `\` and `"` escaped;
/// characters outside printable ASCII are replaced by `?` since sf-strings cannot carry them.
struct SfString<'a>(&'a str);

impl fmt::Display for SfString<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' | '\\' => {
                    f.write_char('\\')?;
                    f.write_char(c)?;
                }
                ' '..='~' => f.write_char(c)?,
                _ => f.write_char('?')?,
            }
        }
        f.write_char('"')
    }
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
        assert_eq!(SfString(r#"a"b\c"#).to_string(), r#""a\"b\\c""#);
        assert_eq!(SfString("é").to_string(), "\"?\"");
    }
}
