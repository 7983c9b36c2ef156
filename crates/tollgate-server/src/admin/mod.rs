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
mod extract;
mod invalid;
mod managed;
mod overrides;
mod policy;
mod state;
mod token;
mod top;
mod writes;

pub use extract::MAX_BODY;
pub use invalid::{InvalidOverride, InvalidPush};
pub use state::AdminState;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{delete, get, post, put};
use tollgate::lifecycle::Lifecycle;
use tollgate::observe::Throttle;
use tracing::Instrument;

use crate::http::json_fallbacks;
use state::REFUSALS_LOGGED_EVERY;

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
        .layer(middleware::from_fn_with_state(state, token::require_token))
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
