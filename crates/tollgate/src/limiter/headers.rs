//! The rate-limit header contract, as `(name, value)` pairs with no HTTP library: written by
//! the HTTP API and gRPC `response_headers_to_add`, read back by the clients.
//!
//! For the binding limit (see [`CheckResponse::binding`]): `X-RateLimit-Limit`,
//! `X-RateLimit-Remaining`, `X-RateLimit-Reset` (delta seconds), and the IETF
//! draft-ietf-httpapi-ratelimit-headers structured fields `RateLimit-Policy: "name";q=..;w=..` and
//! `RateLimit: "name";r=..;t=..`. A denial that can clear also gets `Retry-After` (whole
//! seconds, rounded up, at least 1).

use std::fmt::{self, Write};
use std::time::Duration;

use tollgate_core::Params;

use super::response::CheckResponse;

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
/// gRPC request metadata a tollgate client sends so that its checks (`hits_addend: 0`) answer
/// "would one more unit fit", as `/v1/check` does, rather than envoyproxy/ratelimit's "is the
/// counter past the limit": a check before the request, charged after it, must see the limit
/// reached. Its one value is [`CHECKS_NEXT_UNIT`].
pub const CHECKS: &str = "x-tollgate-checks";
/// The value of [`CHECKS`].
pub const CHECKS_NEXT_UNIT: &str = "next-unit";

/// A request header's value as a descriptor value: `None` when missing or empty (an empty
/// value would be one key every such client shares, and could exhaust for the others); bytes
/// that are not visible ASCII read lossily, so a client cannot slip past its limit by sending a
/// value nobody can read. Transports call it with the header's raw bytes.
pub fn descriptor_value(header: Option<&[u8]>) -> Option<String> {
    header
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
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
/// value is formatted into one buffer: this runs on every decision, and a `String` per header
/// was a visible share of a request's cost.
pub fn each_rate_limit_header(response: &CheckResponse, emit: impl FnMut(&'static str, &str)) {
    append_rate_limit_headers(response, &mut String::with_capacity(160), emit);
}

/// [`each_rate_limit_header`] into the caller's `buffer`: each value is appended to it, one
/// after the other, and `emit` is given the value just appended. A caller that keeps the
/// buffer (the HTTP answer's header values, which are slices of it) allocates nothing more.
pub fn append_rate_limit_headers(
    response: &CheckResponse,
    buffer: &mut String,
    mut emit: impl FnMut(&'static str, &str),
) {
    let mut put = |name: &'static str, value: fmt::Arguments<'_>| {
        let start = buffer.len();
        // Writing into a String cannot fail.
        let _ = buffer.write_fmt(value);
        emit(name, &buffer[start..]);
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
    let (quota, window) = quota_and_window(decision.limit, params);
    put(LIMIT, format_args!("{quota}"));
    put(REMAINING, format_args!("{}", decision.remaining));
    put(RESET, format_args!("{reset}"));
    put(
        POLICY,
        format_args!("{name};q={quota};w={}", ceil_secs(window)),
    );
    put(
        RATELIMIT,
        format_args!("{name};r={};t={reset}", decision.remaining),
    );
    if let Some(retry) = response.retry_after() {
        put(RETRY_AFTER, format_args!("{}", ceil_secs(retry).max(1)));
    }
}

/// The quota the headers announce and the window it is for: the decision's limit per period
/// (under the `local` posture, this replica's share), or for a bucket whose burst differs from
/// its limit, its capacity and the time it takes to refill it, so that the remaining quota is
/// never above the announced one (a token bucket of 5 a second and a burst of 20: 20 per 4 s).
fn quota_and_window(decision_limit: u64, params: &Params) -> (u64, Duration) {
    let (limit, capacity) = (params.limit(), params.capacity());
    if capacity == limit {
        return (decision_limit, params.period());
    }
    let scaled = |n: u64| u128::from(n) * u128::from(capacity) / u128::from(limit);
    let quota = u64::try_from(scaled(decision_limit)).unwrap_or(u64::MAX);
    let window = u64::try_from(scaled(params.period_micros())).unwrap_or(u64::MAX);
    (quota, Duration::from_micros(window))
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
    fn an_empty_or_missing_header_is_no_value_and_others_read_lossily() {
        assert_eq!(descriptor_value(None), None);
        assert_eq!(descriptor_value(Some(b"")), None);
        assert_eq!(descriptor_value(Some(b"k1")).as_deref(), Some("k1"));
        assert_eq!(
            descriptor_value(Some(b"a\xffb")).as_deref(),
            Some("a\u{fffd}b")
        );
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }

    /// A bucket whose burst is not its limit announces its capacity, and the time to refill it,
    /// so that what remains is never more than the quota announced.
    #[test]
    fn a_bucket_announces_its_capacity_over_its_refill_time() {
        use tollgate_core::Algorithm;
        let second = Duration::from_secs(1);
        let bucket = Params::new(Algorithm::TokenBucket, 5, second, Some(20)).unwrap();
        assert_eq!(quota_and_window(5, &bucket), (20, Duration::from_secs(4)));
        // A local share of 2 of the 5: its share of the capacity.
        assert_eq!(quota_and_window(2, &bucket), (8, Duration::from_secs(4)));
        let small = Params::new(Algorithm::Gcra, 100, Duration::from_secs(60), Some(10)).unwrap();
        assert_eq!(quota_and_window(100, &small), (10, Duration::from_secs(6)));
        let window = Params::new(Algorithm::FixedWindow, 5, second, None).unwrap();
        assert_eq!(quota_and_window(5, &window), (5, second));
    }

    #[test]
    fn structured_field_strings_escape_quotes() {
        assert_eq!(SfString(r#"a"b\c"#).to_string(), r#""a\"b\\c""#);
        assert_eq!(SfString("é").to_string(), "\"?\"");
    }
}
