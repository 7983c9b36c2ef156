//! What a decision answers over HTTP: its status and its rate-limit headers.

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use tollgate::limiter::CheckResponse;

use crate::headers::{
    DEGRADED, LIMIT, POLICY, RATELIMIT, REMAINING, RESET, RETRY_AFTER, SOFT_EXCEEDED,
    append_rate_limit_headers,
};

/// More headers than a decision ever has (at most eight: degraded, soft, the five quota
/// headers and `Retry-After`).
const MOST_HEADERS: usize = 10;

/// Adds the rate-limit headers of `decided` to `headers`.
///
/// Their values are written into one buffer, and each header's value is a slice of it: one
/// allocation for them all. Copied one by one (`HeaderValue::from_str`), five or more small
/// blocks were allocated and freed a response; beside the request's own, they overflowed
/// glibc's per-thread cache, and the connection's next read buffer then consolidated the
/// arena's free lists (1% of the no-op HTTP server's time).
pub(super) fn add_rate_limit_headers(headers: &mut HeaderMap, decided: &CheckResponse) {
    let mut values = String::with_capacity(160);
    let mut ends = [("", 0); MOST_HEADERS];
    let (mut count, mut written) = (0, 0);
    append_rate_limit_headers(decided, &mut values, |name, value| {
        written += value.len();
        match ends.get_mut(count) {
            Some(end) => {
                *end = (name, written);
                count += 1;
            }
            // Never reached (see MOST_HEADERS); copied rather than lost if it were.
            None => insert(headers, name, HeaderValue::from_str(value)),
        }
    });
    let values = Bytes::from(values.into_bytes());
    headers.reserve(count);
    let mut start = 0;
    for &(name, end) in ends.iter().take(count) {
        insert(
            headers,
            name,
            HeaderValue::from_maybe_shared(values.slice(start..end)),
        );
        start = end;
    }
}

fn insert<E>(headers: &mut HeaderMap, name: &'static str, value: Result<HeaderValue, E>) {
    // The values are ASCII by construction; one that is not would be left out, as before.
    if let Ok(value) = value {
        headers.insert(header_name(name), value);
    }
}

/// The header called `name`: made at compile time for the contract's names (parsed at run
/// time, `HeaderName::from_static` checked every byte of each, every answer).
fn header_name(name: &'static str) -> HeaderName {
    const NAMES: [HeaderName; 8] = [
        HeaderName::from_static(LIMIT),
        HeaderName::from_static(REMAINING),
        HeaderName::from_static(RESET),
        HeaderName::from_static(POLICY),
        HeaderName::from_static(RATELIMIT),
        HeaderName::from_static(RETRY_AFTER),
        HeaderName::from_static(DEGRADED),
        HeaderName::from_static(SOFT_EXCEEDED),
    ];
    NAMES
        .into_iter()
        .find(|known| known.as_str() == name)
        .unwrap_or_else(|| HeaderName::from_static(name))
}

/// The answer to a decision: its status, `content-type: application/json`, its rate-limit
/// headers and `body`, the headers in a map made for them all (axum's answer made one for the
/// content type, then grew it for the rest).
pub(super) fn decision_response(decided: &CheckResponse, body: Vec<u8>) -> Response {
    let mut headers = HeaderMap::with_capacity(MOST_HEADERS);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    add_rate_limit_headers(&mut headers, decided);
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = decision_status(decided);
    *response.headers_mut() = headers;
    response
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
