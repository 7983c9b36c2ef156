//! Who may read the dashboard's data and who may change something through it.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;
use tracing::warn;

use super::DashboardState;
use crate::ApiError;

/// The admin tokens: `full` changes things (as on the whole admin API), `read` only looks.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    /// `--admin-token-file`: every admin request needs it.
    pub full: Option<Arc<str>>,
    /// `--admin-read-token-file`: the dashboard's reads take it too.
    pub read: Option<Arc<str>>,
}

impl Tokens {
    /// The tokens given, empty ones as none.
    pub fn new(full: Option<String>, read: Option<String>) -> Tokens {
        let keep = |t: Option<String>| t.filter(|t| !t.is_empty()).map(Into::into);
        Tokens {
            full: keep(full),
            read: keep(read),
        }
    }
}

/// What a request's token lets it do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Nothing: the token is missing or wrong.
    None,
    /// Read the snapshot and diffs.
    Read,
    /// Also roll back, promote and drop.
    Write,
}

fn token_of(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(super::super::bearer_token)
}

fn same(given: Option<&str>, expected: &str) -> bool {
    given.is_some_and(|g| super::super::constant_time_eq(g.as_bytes(), expected.as_bytes()))
}

/// The role the request's `Authorization` gives it under `tokens`.
pub(super) fn role(tokens: &Tokens, headers: &HeaderMap) -> Role {
    let given = token_of(headers);
    match (&tokens.full, &tokens.read) {
        (None, _) => Role::Write,
        (Some(full), _) if same(given, full) => Role::Write,
        (Some(_), Some(read)) if same(given, read) => Role::Read,
        _ => Role::None,
    }
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

/// Why a request's `Host` is refused, if it is: with no token configured, anything but a
/// loopback name (a rebinding attacker's own name resolving to 127.0.0.1 is refused).
fn host_refused(tokens: &Tokens, headers: &HeaderMap) -> Option<&'static str> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    match host {
        None => Some("a request without Host is refused"),
        Some(h) if tokens.full.is_none() && !loopback_host(h) => Some(
            "with no admin token configured, the dashboard answers only a loopback Host \
             (127.0.0.1, [::1] or localhost)",
        ),
        Some(_) => None,
    }
}

/// Why a write is refused for its headers, if it is.
fn write_refused(headers: &HeaderMap) -> Option<&'static str> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Some("a dashboard write needs Content-Type: application/json");
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let origin_host = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        if origin_host.is_none() || origin_host != host {
            return Some("the request's Origin is not this listener's Host");
        }
    }
    None
}

fn unauthorized(state: &DashboardState, request: &Request) -> Response {
    if let Some(suppressed) = state.admin.refusals.note(Instant::now()) {
        warn!(method = %request.method(), path = request.uri().path(), suppressed,
            "Dashboard request refused: missing or wrong token");
    }
    ApiError::unauthorized("missing or wrong admin token").into_response()
}

/// Reads: either token, and a loopback `Host` when there is no token.
pub(super) async fn reads(
    State(state): State<DashboardState>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(why) = host_refused(&state.tokens, request.headers()) {
        return ApiError::forbidden(why).into_response();
    }
    let role = role(&state.tokens, request.headers());
    if role == Role::None {
        return unauthorized(&state, &request);
    }
    let mut request = request;
    request.extensions_mut().insert(role);
    next.run(request).await
}

/// Writes: the full token, a JSON body and a `Host` the `Origin` agrees with.
pub(super) async fn writes(
    State(state): State<DashboardState>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(why) = host_refused(&state.tokens, request.headers()) {
        return ApiError::forbidden(why).into_response();
    }
    match role(&state.tokens, request.headers()) {
        Role::None => return unauthorized(&state, &request),
        Role::Read => {
            return ApiError::forbidden("the read-only token may look, not change").into_response();
        }
        Role::Write => {}
    }
    if let Some(why) = write_refused(request.headers()) {
        return ApiError::forbidden(why).into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(name.clone(), HeaderValue::from_str(value).expect("header"));
        }
        h
    }

    #[test]
    fn each_token_gets_its_role() {
        let tokens = Tokens::new(Some("full".into()), Some("look".into()));
        let with = |t: &str| headers(&[(header::AUTHORIZATION, &format!("Bearer {t}"))]);
        assert_eq!(role(&tokens, &with("full")), Role::Write);
        assert_eq!(role(&tokens, &with("look")), Role::Read);
        assert_eq!(role(&tokens, &with("nope")), Role::None);
        assert_eq!(role(&tokens, &HeaderMap::new()), Role::None);
        assert_eq!(role(&Tokens::default(), &HeaderMap::new()), Role::Write);
    }

    #[test]
    fn without_a_token_only_a_loopback_host_is_answered() {
        let open = Tokens::default();
        for host in [
            "127.0.0.1:9090",
            "[::1]:9090",
            "localhost:9090",
            "LOCALHOST",
        ] {
            assert_eq!(
                host_refused(&open, &headers(&[(header::HOST, host)])),
                None,
                "{host}"
            );
        }
        for host in ["evil.example:9090", "10.0.0.1:9090"] {
            assert!(host_refused(&open, &headers(&[(header::HOST, host)])).is_some());
        }
        let closed = Tokens::new(Some("t".into()), None);
        assert_eq!(
            host_refused(&closed, &headers(&[(header::HOST, "tollgate.internal")])),
            None
        );
    }

    #[test]
    fn a_write_needs_json_and_an_origin_matching_the_host() {
        let json = (header::CONTENT_TYPE, "application/json; charset=utf-8");
        let host = (header::HOST, "127.0.0.1:9090");
        assert_eq!(write_refused(&headers(&[json.clone(), host.clone()])), None);
        let same = (header::ORIGIN, "http://127.0.0.1:9090");
        assert_eq!(
            write_refused(&headers(&[json.clone(), host.clone(), same])),
            None
        );
        let other = (header::ORIGIN, "http://evil.example");
        assert!(write_refused(&headers(&[json, host.clone(), other])).is_some());
        let form = (header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        assert!(write_refused(&headers(&[form, host])).is_some());
    }
}
