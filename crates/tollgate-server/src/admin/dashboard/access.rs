//! Who may read the dashboard's data and who may change something through it.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;
use tracing::warn;

use super::state::{DashboardState, Tokens};
use crate::ApiError;
use crate::admin::writes::{host_refused, request_host};

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
        .and_then(super::super::token::bearer_token)
}

fn same(given: Option<&str>, expected: &str) -> bool {
    given.is_some_and(|g| super::super::token::constant_time_eq(g.as_bytes(), expected.as_bytes()))
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
    let host = request_host(request.headers(), request.uri());
    if let Some(why) = host_refused(state.tokens.full.is_some(), host) {
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

/// Writes: the full token. (What every admin write also needs, a JSON body and a `Host` the
/// `Origin` agrees with, is checked after this, by [`crate::admin::writes`].)
pub(super) async fn writes(
    State(state): State<DashboardState>,
    request: Request,
    next: Next,
) -> Response {
    match role(&state.tokens, request.headers()) {
        Role::None => return unauthorized(&state, &request),
        Role::Read => {
            return ApiError::forbidden("the read-only token may look, not change").into_response();
        }
        Role::Write => {}
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
}
