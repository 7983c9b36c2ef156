//! The HTTP/JSON API.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/check` | tollgate's JSON API: `200` allowed, `429` denied, `503` denied by a `closed` failure posture, `400` invalid |
//! | `POST /v1/explain` | the same body; charges nothing; which rules match and bind, current counters |
//! | `POST /json` | envoyproxy/ratelimit's proto3-JSON endpoint, for drop-in users |
//! | `ANY /v1/authorize` | forward auth for nginx `auth_request`: `200` allowed, `403` denied (see [`authorize`]) |
//! | `GET /healthz` | the process is up |
//! | `GET /readyz` | a policy is loaded (`ready`, or `ready (degraded)` while the store does not answer and the failure postures do) |
//! | `GET /healthcheck` | the same as `/readyz`, at envoyproxy/ratelimit's path |
//! | `GET /metrics` | Prometheus text |

pub mod authorize;
mod check;
mod envoy_json;
mod explain;
mod ops;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use tollgate::lifecycle::Lifecycle;
use tollgate::limiter::{CheckResponse, Limiter};

use crate::headers::each_rate_limit_header;
use crate::{AllowAll, ApiError};

/// Largest accepted request body (defined beside the request it carries, so that the remote
/// client checks it before sending without depending on this crate).
pub use tollgate::limiter::MAX_BODY;

use self::authorize::{AuthorizeMapping, AuthorizeState};

/// The decision routes over the limiter that `lifecycle` manages, with `/v1/authorize` disabled
/// (it answers 404 saying how to enable it).
pub fn router(lifecycle: Arc<Lifecycle>) -> Router {
    router_with_authorize(lifecycle, None)
}

/// The decision routes; `/v1/authorize` checks requests through `authorize` when given.
pub fn router_with_authorize(
    lifecycle: Arc<Lifecycle>,
    authorize: Option<AuthorizeMapping>,
) -> Router {
    let limiter = lifecycle.limiter().clone();
    let metrics = Router::new()
        .route("/metrics", get(ops::metrics))
        .with_state(lifecycle);
    let forward_auth = Router::new()
        .route("/v1/authorize", any(authorize::authorize))
        .with_state(AuthorizeState {
            limiter: limiter.clone(),
            mapping: authorize.map(Arc::new),
        });
    let router = Router::new()
        .route("/v1/check", post(check::check::<Limiter>))
        .route("/v1/explain", post(explain::explain))
        .route("/json", post(envoy_json::check))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/healthcheck", get(ops::readyz))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(limiter)
        .merge(metrics)
        .merge(forward_auth);
    json_fallbacks(router)
}

/// The no-op ceiling router: `POST /v1/check` through the same decoder, validation, encoder and
/// body limit as [`router`], answered by [`AllowAll`]; `GET /healthz`. Nothing is counted. For
/// `tollgate bench-server` only, never for production.
pub fn allow_all_router() -> Router {
    let router = Router::new()
        .route("/v1/check", post(check::check::<AllowAll>))
        .route("/healthz", get(ops::healthz))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(Arc::new(AllowAll::default()));
    json_fallbacks(router)
}

/// A request body of at most `LIMIT` bytes (the router's `DefaultBodyLimit`, which enforces it
/// while the body streams in), its rejections answered as JSON errors with their status, like
/// every other error of the API, instead of axum's plain text: `413` over the limit (before the
/// body is sent when the client waits for `100 Continue`), `415` compressed, `501` in a transfer
/// coding other than chunked, `408` too slow.
#[derive(Debug)]
pub(crate) struct Body<const LIMIT: usize = MAX_BODY>(pub axum::body::Bytes);

impl<S: Send + Sync, const LIMIT: usize> axum::extract::FromRequest<S> for Body<LIMIT> {
    type Rejection = Response;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, Response> {
        let version = request.version();
        let headers = request.headers();
        // A compressed body would be read as JSON and fail there, with a misleading message.
        if let Some(encoding) = headers
            .get_all(axum::http::header::CONTENT_ENCODING)
            .iter()
            .find(|e| {
                // An empty value names no coding: the body is as it is.
                let coding = e.as_bytes().trim_ascii();
                !coding.is_empty() && !coding.eq_ignore_ascii_case(b"identity")
            })
        {
            return Err(ApiError::unsupported_encoding(format!(
                "Content-Encoding `{}` is not supported: send the body uncompressed",
                String::from_utf8_lossy(encoding.as_bytes())
            ))
            .into_response());
        }
        // hyper decodes the chunked framing and passes any other coding through (RFC 9112
        // 6.1: a server answers 501 to a transfer coding it does not understand).
        if let Some(coding) = headers
            .get_all(axum::http::header::TRANSFER_ENCODING)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .find(|c| !c.eq_ignore_ascii_case(b"chunked"))
        {
            return Err(with_body_unread(
                ApiError::not_implemented(format!(
                    "Transfer-Encoding `{}` is not supported: send the body uncompressed, \
                     with Content-Length or chunked",
                    String::from_utf8_lossy(coding)
                )),
                version,
            ));
        }
        // A client that waits for `100 Continue` before sending the body (curl does for large
        // ones) is refused before it sends it. One that sends it anyway is read up to the
        // limit: answered while it is still writing a body too large for the sockets' buffers,
        // it would meet a closed connection instead of the answer.
        let waits_to_send = headers
            .get(axum::http::header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        if let Some(length) = headers
            .get(axum::http::header::CONTENT_LENGTH)
            .filter(|_| waits_to_send)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&length| length > LIMIT as u64)
        {
            return Err(with_body_unread(
                ApiError::too_large(format!(
                    "the body is {length} bytes; at most {LIMIT} are accepted"
                )),
                version,
            ));
        }
        match axum::body::Bytes::from_request(request, state).await {
            Ok(bytes) => Ok(Body(bytes)),
            Err(e) if timed_out(&e) => Err(body_too_slow(version)),
            Err(e) => Err(ApiError::with_status(e.status(), e.body_text()).into_response()),
        }
    }
}

/// `response` with `Connection: close` over HTTP/1, for an answer given before the whole body
/// was read: the rest of it may still be on its way, so the connection cannot carry another
/// request (HTTP/2 does not allow the header; hyper resets the unread stream by itself).
fn with_body_unread(error: ApiError, version: axum::http::Version) -> Response {
    let mut response = error.into_response();
    if version <= axum::http::Version::HTTP_11 {
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            HeaderValue::from_static("close"),
        );
    }
    response
}

/// `408` for a body that did not arrive within the listener's read timeout (`serve
/// --http-read-timeout`); an HTTP/1 connection is closed after it.
pub fn body_too_slow(version: axum::http::Version) -> Response {
    with_body_unread(
        ApiError::too_slow("the request's body did not arrive in time (the server's read timeout)"),
        version,
    )
}

/// Whether reading a body failed because the connection's read deadline passed (the listener
/// closes a connection that waits too long: see `--http-read-timeout`).
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// The JSON answers for an unknown path (`404`) and a method a path does not take (`405`).
pub(crate) fn json_fallbacks(router: Router) -> Router {
    router
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::method_not_allowed("this endpoint does not take that method")
        })
}

/// Adds the rate-limit headers of `decided` to `headers`.
fn add_rate_limit_headers(headers: &mut HeaderMap, decided: &CheckResponse) {
    headers.reserve(7);
    each_rate_limit_header(decided, |name, value| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    });
}

/// 200 when allowed, 429 when denied by a limit, 503 when denied because the limiter is
/// unavailable (a `closed` failure posture).
fn decision_status(decided: &CheckResponse) -> StatusCode {
    if decided.allowed() {
        StatusCode::OK
    } else if decided.unavailable() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}
