//! The dashboard on the admin listener: one page at `/` (no data in it, the one path served
//! without a token) that polls one JSON snapshot and can roll the policy back or promote and
//! drop a shadow candidate.
//!
//! | route | who | what |
//! |---|---|---|
//! | `GET /` | anyone | the page: HTML, CSS and script built into the binary |
//! | `GET /v1/admin/dashboard/snapshot` | read or full token | rates, history, top keys, shares, health, versions |
//! | `GET /v1/admin/dashboard/diff?from=A&to=B` | read or full token | line diff of two versions |
//! | `POST /v1/admin/dashboard/rollback` | full token | `{"to": seq}` |
//! | `POST /v1/admin/dashboard/promote` | full token | the candidate becomes the running policy |
//! | `POST /v1/admin/dashboard/drop` | full token | stop shadowing the candidate |
//!
//! With no token configured (a loopback admin listener), a request must name a loopback host
//! in `Host` (an IP literal or `localhost`), so a page served from another name that resolves
//! to 127.0.0.1 (DNS rebinding) is refused. Every write also needs what every admin write
//! needs (see [`super::writes`]): `Content-Type: application/json` (which a cross-site form
//! cannot send without a preflight this listener never answers) and, when the browser sends
//! `Origin`, an origin whose host is the `Host`.

mod access;
mod page;
mod sampler;
mod snapshot;
mod state;

use std::sync::Arc;

use axum::Router;
use axum::middleware;
use axum::routing::{get, post};
use tollgate::lifecycle::Lifecycle;
use tollgate::observe::Throttle;
use tollgate::observe::history::History;

pub use sampler::{SAMPLE_EVERY, sample_forever};
pub use state::Tokens;

use super::state::{AdminState, REFUSALS_LOGGED_EVERY};
use super::writes::{self, WriteGuard};
use state::DashboardState;

/// `admin` (the router of [`super::router`]) with the dashboard's routes beside it, which
/// check `tokens` themselves: the page needs none, reads take either token, writes the full one.
pub fn around(
    admin: Router,
    lifecycle: Arc<Lifecycle>,
    history: Arc<History>,
    tokens: Tokens,
) -> Router {
    let state = DashboardState {
        admin: AdminState {
            lifecycle,
            token: tokens.full.clone(),
            refusals: Arc::new(Throttle::new(REFUSALS_LOGGED_EVERY)),
        },
        history,
        tokens,
    };
    let guard = WriteGuard {
        token_configured: state.tokens.full.is_some(),
    };
    let reads = Router::new()
        .route("/v1/admin/dashboard/snapshot", get(snapshot::snapshot))
        .route("/v1/admin/dashboard/diff", get(super::policy::diff))
        .layer(middleware::from_fn_with_state(state.clone(), access::reads));
    let writes = Router::new()
        .route(
            "/v1/admin/dashboard/rollback",
            post(super::policy::rollback),
        )
        .route(
            "/v1/admin/dashboard/promote",
            post(super::candidate::promote),
        )
        .route("/v1/admin/dashboard/drop", post(super::candidate::remove))
        .layer(middleware::from_fn_with_state(guard, writes::guard))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            access::writes,
        ));
    let dashboard = Router::new()
        .route("/", get(page::page))
        .merge(reads)
        .merge(writes)
        .layer(axum::extract::DefaultBodyLimit::max(super::MAX_BODY))
        .layer(middleware::from_fn(super::in_client_span))
        .with_state(state);
    dashboard.merge(admin)
}
