//! What a write to the admin listener must carry, against cross-site requests and DNS
//! rebinding: every `POST`, `PUT`, `PATCH` and `DELETE`, of the admin API and of the dashboard.
//!
//! - `Content-Type: application/json`, even with no body: a cross-site form or a `text/plain`
//!   `fetch` can be sent from any page without asking the listener first; a JSON one needs a
//!   CORS preflight this listener never answers. Otherwise `415`.
//! - With no admin token configured (a loopback admin listener), a loopback `Host`
//!   (`127.0.0.1`, `[::1]` or `localhost`): a page from another name that resolves to 127.0.0.1
//!   is refused. Otherwise `403`.
//! - When the request carries an `Origin`, one whose host is the `Host`. Otherwise `403`.
//!
//! The checks look only at the method and the headers, and run before the body is read: a
//! refused write changes nothing.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::ApiError;

/// What the checks depend on: whether an admin token is configured.
#[derive(Debug, Clone, Copy)]
pub(super) struct WriteGuard {
    /// `--admin-token-file` was given: every request is authenticated, so any `Host` will do.
    pub token_configured: bool,
}

/// Whether `method` changes something (everything but `GET`, `HEAD`, `OPTIONS` and `TRACE`).
fn is_write(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// The host part of a `Host` value (`[::1]:9090` → `::1`, `localhost:9090` → `localhost`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

/// Whether `host` (a `Host` value) names this machine's loopback: an IP literal on loopback,
/// or `localhost`.
fn loopback_host(host: &str) -> bool {
    let name = host_name(host);
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The host a request is for: its `Host`, or over HTTP/2 (which has none) its URI's authority.
pub(super) fn request_host<'a>(headers: &'a HeaderMap, uri: &'a Uri) -> Option<&'a str> {
    match headers.get(header::HOST) {
        Some(host) => host.to_str().ok(),
        None => uri.authority().map(|a| a.as_str()),
    }
}

/// Why a request for `host` (see [`request_host`]) is refused, if it is: with no token
/// configured, anything but a loopback name (a rebinding attacker's own name resolving to
/// 127.0.0.1 is refused).
pub(super) fn host_refused(token_configured: bool, host: Option<&str>) -> Option<&'static str> {
    match host {
        None => Some("a request without Host is refused"),
        Some(h) if !token_configured && !loopback_host(h) => Some(
            "with no admin token configured, the admin listener answers only a loopback Host \
             (127.0.0.1, [::1] or localhost)",
        ),
        Some(_) => None,
    }
}

/// Whether the request says its body is JSON (`application/json`, parameters allowed).
fn json_content_type(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// Why a request's `Origin` is refused, if it is: present, and not `http(s)://` the `host`.
fn origin_refused(host: Option<&str>, headers: &HeaderMap) -> Option<&'static str> {
    let origin = headers.get(header::ORIGIN)?;
    let origin = origin.to_str().unwrap_or("");
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    (origin_host.is_none() || origin_host != host)
        .then_some("the request's Origin is not this listener's Host")
}

/// Why a write for `host` with `headers` is refused, if it is, as the answer to give.
pub(super) fn write_refused(
    token_configured: bool,
    host: Option<&str>,
    headers: &HeaderMap,
) -> Option<ApiError> {
    if !json_content_type(headers) {
        return Some(ApiError::unsupported_encoding(
            "an admin write needs Content-Type: application/json, even with an empty body \
             (e.g. curl -H 'Content-Type: application/json')",
        ));
    }
    host_refused(token_configured, host)
        .or_else(|| origin_refused(host, headers))
        .map(ApiError::forbidden)
}

/// The middleware: refuses a write that [`write_refused`] refuses, before any handler runs.
pub(super) async fn guard(
    State(guard): State<WriteGuard>,
    request: Request,
    next: Next,
) -> Response {
    if is_write(request.method()) {
        let host = request_host(request.headers(), request.uri());
        if let Some(error) = write_refused(guard.token_configured, host, request.headers()) {
            return error.into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use axum::http::StatusCode;

    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(name.clone(), HeaderValue::from_str(value).expect("header"));
        }
        h
    }

    fn status(token_configured: bool, pairs: &[(header::HeaderName, &str)]) -> Option<StatusCode> {
        let headers = headers(pairs);
        let uri = Uri::from_static("/v1/admin/reload");
        let host = request_host(&headers, &uri);
        write_refused(token_configured, host, &headers).map(|e| e.kind().http_status())
    }

    #[test]
    fn only_reads_pass_unchecked() {
        for read in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert!(!is_write(&read), "{read}");
        }
        for write in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(is_write(&write), "{write}");
        }
    }

    #[test]
    fn without_a_token_only_a_loopback_host_is_answered() {
        for host in [
            "127.0.0.1:9090",
            "[::1]:9090",
            "localhost:9090",
            "LOCALHOST",
        ] {
            assert_eq!(host_refused(false, Some(host)), None, "{host}");
        }
        for host in ["evil.example:9090", "10.0.0.1:9090"] {
            assert!(host_refused(false, Some(host)).is_some(), "{host}");
        }
        assert!(host_refused(false, None).is_some());
        assert!(host_refused(true, None).is_some());
        assert_eq!(host_refused(true, Some("tollgate.internal")), None);
    }

    /// HTTP/2 has no `Host`: the URI's authority stands for it.
    #[test]
    fn the_host_is_the_header_else_the_authority() {
        let h2 = Uri::from_static("http://127.0.0.1:9090/v1/admin/reload");
        assert_eq!(request_host(&HeaderMap::new(), &h2), Some("127.0.0.1:9090"));
        let both = headers(&[(header::HOST, "localhost:1")]);
        assert_eq!(request_host(&both, &h2), Some("localhost:1"));
        let path = Uri::from_static("/v1/admin/reload");
        assert_eq!(request_host(&HeaderMap::new(), &path), None);
    }

    #[test]
    fn a_write_needs_json_and_an_origin_matching_the_host() {
        let json = (header::CONTENT_TYPE, "application/json; charset=utf-8");
        let host = (header::HOST, "127.0.0.1:9090");
        assert_eq!(status(false, &[json.clone(), host.clone()]), None);
        let same = (header::ORIGIN, "http://127.0.0.1:9090");
        assert_eq!(status(false, &[json.clone(), host.clone(), same]), None);
        let other = (header::ORIGIN, "http://evil.example");
        assert_eq!(
            status(true, &[json.clone(), host.clone(), other]),
            Some(StatusCode::FORBIDDEN)
        );
        let null = (header::ORIGIN, "null");
        assert_eq!(
            status(true, &[json.clone(), host.clone(), null]),
            Some(StatusCode::FORBIDDEN)
        );
        let rebound = (header::HOST, "evil.example:9090");
        assert_eq!(
            status(false, &[json.clone(), rebound.clone()]),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(status(true, &[json, rebound]), None);
        for other in [
            "application/x-www-form-urlencoded",
            "text/plain",
            "multipart/form-data; boundary=x",
        ] {
            let form = (header::CONTENT_TYPE, other);
            assert_eq!(
                status(true, &[form, host.clone()]),
                Some(StatusCode::UNSUPPORTED_MEDIA_TYPE),
                "{other}"
            );
        }
        assert_eq!(
            status(true, &[host]),
            Some(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
    }
}
