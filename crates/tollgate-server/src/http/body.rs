//! Request bodies: at most a limit, refused as JSON errors with their status.

use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};

use crate::ApiError;
use tollgate::limiter::MAX_BODY;

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
