//! What a decision answers over HTTP: its status and its rate-limit headers.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tollgate::limiter::CheckResponse;

use crate::headers::each_rate_limit_header;

/// Adds the rate-limit headers of `decided` to `headers`.
pub(super) fn add_rate_limit_headers(headers: &mut HeaderMap, decided: &CheckResponse) {
    headers.reserve(7);
    each_rate_limit_header(decided, |name, value| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    });
}

/// 200 when allowed, 429 when denied by a limit, 503 when denied because the limiter is
/// unavailable (a `closed` failure posture).
pub(super) fn decision_status(decided: &CheckResponse) -> StatusCode {
    if decided.allowed() {
        StatusCode::OK
    } else if decided.unavailable() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}
