//! Rate-limit response headers, shared by the HTTP API and gRPC `response_headers_to_add`. The
//! contract itself (names, values, their order) is [`tollgate::limiter::headers`], re-exported
//! here; this module adds what takes axum's types.

pub use tollgate::limiter::headers::{
    DEGRADED, LIMIT, POLICY, RATELIMIT, REMAINING, RESET, RETRY_AFTER, SOFT_EXCEEDED,
    append_rate_limit_headers, ceil_ms, ceil_secs, descriptor_value, each_rate_limit_header,
    rate_limit_headers,
};

/// A request header's value as a descriptor value (see [`descriptor_value`]): `None` when
/// missing or empty, read lossily otherwise.
pub fn header_text(
    headers: &axum::http::HeaderMap,
    name: impl axum::http::header::AsHeaderName,
) -> Option<String> {
    descriptor_value(headers.get(name).map(axum::http::HeaderValue::as_bytes))
}
