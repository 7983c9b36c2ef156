//! The rate-limit header contract, as `(name, value)` pairs with no HTTP library: written by
//! the HTTP API and gRPC `response_headers_to_add`, read back by the clients.
//!
//! For the binding limit (see [`CheckResponse::binding`]): `X-RateLimit-Limit`,
//! `X-RateLimit-Remaining`, `X-RateLimit-Reset` (delta seconds), and the IETF
//! draft-ietf-httpapi-ratelimit-headers structured fields `RateLimit-Policy: "name";q=..;w=..` and
//! `RateLimit: "name";r=..;t=..`. A denial that can clear also gets `Retry-After` (whole
//! seconds, rounded up, at least 1).

use std::time::Duration;

use tollgate_core::Params;

use super::decimal;
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
///
/// Written byte by byte, not with `write!`: formatting machinery (`fmt::write`, padding, a
/// `Display` call per piece) was half of the no-op HTTP answer's header cost.
pub fn append_rate_limit_headers(
    response: &CheckResponse,
    buffer: &mut String,
    mut emit: impl FnMut(&'static str, &str),
) {
    let mut put = |name: &'static str, write: &dyn Fn(&mut String)| {
        let start = buffer.len();
        write(buffer);
        emit(name, &buffer[start..]);
    };
    if let Some(posture) = response.degraded() {
        put(DEGRADED, &|b| b.push_str(posture.name()));
    }
    if let Some(delay) = response.soft_delay() {
        put(SOFT_EXCEEDED, &|b| push_decimal(b, ceil_ms(delay)));
    }
    // Whole seconds, at least 1; read only by the answers that send it.
    let retry_after = || response.retry_after().map(|retry| ceil_secs(retry).max(1));
    if response.unavailable() {
        // Not a real limit: no quota headers, only when to try again.
        if let Some(retry) = retry_after() {
            put(RETRY_AFTER, &|b| push_decimal(b, retry));
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
    let name = limit.name();
    let (quota, window) = quota_and_window(decision.limit, params);
    put(LIMIT, &|b| push_decimal(b, quota));
    put(REMAINING, &|b| push_decimal(b, decision.remaining));
    put(RESET, &|b| push_decimal(b, reset));
    put(POLICY, &|b| {
        push_sf_string(b, name);
        b.push_str(";q=");
        push_decimal(b, quota);
        b.push_str(";w=");
        push_decimal(b, ceil_secs(window));
    });
    put(RATELIMIT, &|b| {
        push_sf_string(b, name);
        b.push_str(";r=");
        push_decimal(b, decision.remaining);
        b.push_str(";t=");
        push_decimal(b, reset);
    });
    if let Some(retry) = retry_after() {
        put(RETRY_AFTER, &|b| push_decimal(b, retry));
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

/// Appends `n` in decimal.
fn push_decimal(buffer: &mut String, n: u64) {
    for &digit in decimal::digits(n, &mut [0; 20]) {
        buffer.push(char::from(digit));
    }
}

/// Appends `s` as a structured-field string (RFC 8941): quoted, with `\` and `"` escaped;
/// characters outside printable ASCII are replaced by `?` since sf-strings cannot carry them.
fn push_sf_string(buffer: &mut String, s: &str) {
    buffer.push('"');
    // A rule's name is almost always plain: copied whole.
    if s.bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        buffer.push_str(s);
    } else {
        for c in s.chars() {
            match c {
                '"' | '\\' => {
                    buffer.push('\\');
                    buffer.push(c);
                }
                ' '..='~' => buffer.push(c),
                _ => buffer.push('?'),
            }
        }
    }
    buffer.push('"');
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
        let sf = |s: &str| {
            let mut buffer = String::from("x");
            push_sf_string(&mut buffer, s);
            buffer
        };
        assert_eq!(sf(r#"a"b\c"#), r#"x"a\"b\\c""#);
        assert_eq!(sf("é"), "x\"?\"");
        assert_eq!(sf("per-user ~1"), "x\"per-user ~1\"");
        assert_eq!(sf("tab\there"), "x\"tab?here\"");
        assert_eq!(sf(""), "x\"\"");
    }

    #[test]
    fn decimals_are_appended() {
        let mut buffer = String::from("x");
        push_decimal(&mut buffer, 0);
        push_decimal(&mut buffer, u64::MAX);
        assert_eq!(buffer, "x018446744073709551615");
    }
}
