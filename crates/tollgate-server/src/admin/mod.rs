//! The admin API, on its own listener (loopback by default): policy versions, push, reload,
//! rollback and diff; shadow candidates; runtime overrides; top throttled keys.
//!
//! | route | what |
//! |---|---|
//! | `GET /v1/admin/policy` | kept versions, the running one marked |
//! | `GET /v1/admin/policy/{seq}` | one version's source texts |
//! | `GET /v1/admin/policy/diff?from=A&to=B` | line diff of two versions |
//! | `POST /v1/admin/policy` | push `{"sources": [{"name": ..., "text": ...}]}`: validated, then activated |
//! | `POST /v1/admin/policy/rollback` | `{"to": seq}` or `{}` for the previous version |
//! | `POST /v1/admin/policy/candidate` | the push body: validated, then shadowed beside the running policy, never enforced |
//! | `GET /v1/admin/policy/candidate` | per candidate rule: allowed, would deny, top keys |
//! | `DELETE /v1/admin/policy/candidate` | stop shadowing |
//! | `POST /v1/admin/policy/promote` | the candidate becomes the running policy |
//! | `POST /v1/admin/reload` | re-read the config path |
//! | `GET /v1/admin/overrides` | overrides in force |
//! | `PUT /v1/admin/overrides` | set one: `domain`, `rule`, `entries`, `requests_per_unit`, optional `period`, `expires_in`, `reason` |
//! | `PUT /v1/admin/overrides/bulk` | set many, all or none: `{"overrides": [...]}`, each as above |
//! | `DELETE /v1/admin/overrides/{id}` | remove one |
//! | `GET /v1/admin/top?domain=D&rule=R&n=10` | the keys a rule denied most often |
//!
//! With xDS as the policy's source, pushes, reloads, rollbacks and candidates answer `409`
//! ("policy is managed by xDS"); the versions stay readable.
//!
//! When a token is configured every request needs `Authorization: Bearer TOKEN`; a missing or
//! wrong token gets `401` and changes nothing, on any path: an unknown path is `404` (a known
//! one asked with another method `405`) only for a caller with the token.
//!
//! Every write (`POST`, `PUT`, `PATCH`, `DELETE`, here and on the dashboard) also needs
//! `Content-Type: application/json`, a loopback `Host` when no token is configured, and an
//! `Origin`, when sent, that agrees with the `Host`: see [`writes`].

mod candidate;
pub mod dashboard;
mod managed;
mod overrides;
mod policy;
mod top;
mod writes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tollgate::lifecycle::Lifecycle;
use tollgate::observe::Throttle;
use tollgate::policy::MAX_POLICY_FILE;
use tracing::{Instrument, warn};

use crate::ApiError;
use crate::http::json_fallbacks;

/// What admin handlers share.
#[derive(Debug, Clone)]
pub struct AdminState {
    lifecycle: Arc<Lifecycle>,
    token: Option<Arc<str>>,
    /// Requests refused for their token, logged at most once per [`REFUSALS_LOGGED_EVERY`].
    refusals: Arc<Throttle>,
}

/// Requests refused for their token are logged at most once per this long: a flood of them
/// must not flood the log.
const REFUSALS_LOGGED_EVERY: Duration = Duration::from_secs(1);

/// The admin routes. `token`, when given, is required on every request.
pub fn router(lifecycle: Arc<Lifecycle>, token: Option<String>) -> Router {
    let state = AdminState {
        lifecycle,
        token: token.map(Into::into),
        refusals: Arc::new(Throttle::new(REFUSALS_LOGGED_EVERY)),
    };
    let guard = writes::WriteGuard {
        token_configured: state.token.is_some(),
    };
    let router = Router::new()
        .route("/v1/admin/policy", get(policy::list).post(policy::push))
        .route("/v1/admin/policy/diff", get(policy::diff))
        .route("/v1/admin/policy/rollback", post(policy::rollback))
        .route(
            "/v1/admin/policy/candidate",
            get(candidate::show)
                .post(candidate::set)
                .delete(candidate::remove),
        )
        .route("/v1/admin/policy/promote", post(candidate::promote))
        .route("/v1/admin/policy/{seq}", get(policy::show))
        .route("/v1/admin/reload", post(policy::reload))
        .route(
            "/v1/admin/overrides",
            get(overrides::list).put(overrides::set),
        )
        .route("/v1/admin/overrides/bulk", put(overrides::set_bulk))
        .route("/v1/admin/overrides/{id}", delete(overrides::delete))
        .route("/v1/admin/top", get(top::top))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(state.clone());
    // The token is checked before routing: a `404` or `405` to a caller without it would
    // map the API for them. Then every write's headers, before any handler reads a body.
    json_fallbacks(router)
        .layer(middleware::from_fn_with_state(guard, writes::guard))
        .layer(middleware::from_fn_with_state(state, require_token))
        .layer(middleware::from_fn(in_client_span))
}

/// Handles an admin request inside a span naming its client (the peer address the listener
/// put in the request, see [`ConnectInfo`]), so every line logged meanwhile — the audit lines
/// of a push, a rollback, an override — says who made the change: `admin{client=ADDR}` in the
/// text format, `"span": {"client": ADDR, ..}` in JSON.
async fn in_client_span(request: Request, next: Next) -> Response {
    // At warn, though it marks info lines too: a span is kept only where its own level is
    // enabled, and a filter like `warn,tollgate::lifecycle=info` must still name the client.
    let span = tracing::warn_span!("admin", client = tracing::field::Empty);
    if let Some(ConnectInfo(client)) = request.extensions().get::<ConnectInfo<SocketAddr>>() {
        span.record("client", tracing::field::display(client));
    }
    next.run(request).instrument(span).await
}

/// Largest admin request: a push of a policy file as large as `serve` reads
/// ([`MAX_POLICY_FILE`]), with room for its JSON escaping.
pub const MAX_BODY: usize = 2 * MAX_POLICY_FILE as usize;

/// [`Path`](axum::extract::Path) whose rejection (a malformed segment) is answered like every
/// other admin error: `400` with a JSON `error`, not axum's plain text, which clients that
/// expect JSON cannot read.
pub(super) struct AdminPath<T>(pub T);

/// [`Query`](axum::extract::Query), rejections answered as for [`AdminPath`].
pub(super) struct AdminQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for AdminPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(AdminPath(value)),
            Err(e) => Err(ApiError::invalid(e.body_text())),
        }
    }
}

impl<S, T> FromRequestParts<S> for AdminQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(AdminQuery(value)),
            Err(e) => Err(ApiError::invalid(e.body_text())),
        }
    }
}

async fn require_token(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    if let Some(expected) = &state.token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), expected.as_bytes())) {
            let due = state.refusals.note(Instant::now());
            // The path without its query, which may hold anything (a token, even); the client
            // is in the span around this request.
            if let Some(suppressed) = due {
                warn!(method = %request.method(), path = request.uri().path(), suppressed,
                    "Admin request refused: missing or wrong token");
            }
            return ApiError::unauthorized("missing or wrong admin token").into_response();
        }
    }
    next.run(request).await
}

/// The token of an `Authorization: Bearer TOKEN` value; the scheme's name is case-insensitive
/// (RFC 9110).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

/// Compares without stopping at the first difference, so timing does not reveal the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_comparison() {
        assert!(super::constant_time_eq(b"secret", b"secret"));
        assert!(!super::constant_time_eq(b"secret", b"secreT"));
        assert!(!super::constant_time_eq(b"secret", b"secret2"));
    }

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        for value in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret"] {
            assert_eq!(super::bearer_token(value), Some("s3cret"), "{value}");
        }
        assert_eq!(super::bearer_token("Basic s3cret"), None);
        assert_eq!(super::bearer_token("Bearers3cret"), None);
    }
}
