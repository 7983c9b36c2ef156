//! The HTTP/JSON API.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/check` | tollgate's JSON API: `200` allowed, `429` denied, `503` denied by a `closed` failure posture, `400` invalid |
//! | `POST /v1/explain` | the same body; charges nothing; which rules match and bind, current counters |
//! | `POST /json` | envoyproxy/ratelimit's proto3-JSON endpoint, for drop-in users |
//! | `ANY /v1/authorize` | forward auth for nginx `auth_request`: `200` allowed, `403` denied (see [`authorize`]) |
//! | `GET /healthz` | the process is up |
//! | `GET /readyz` | a policy is loaded (`ready`, or `ready (degraded)` while the store does not answer and the failure postures do; with xDS before its first configuration, `ready (no xDS configuration yet)`) |
//! | `GET /healthcheck` | envoyproxy/ratelimit's probe: `200 OK` while running (the store down too), `500` once the shutdown began (see [`Healthcheck`]) |
//! | `GET /metrics` | Prometheus text |

mod answer_json;
pub mod authorize;
mod body;
mod check;
mod envoy_json;
mod explain;
mod healthcheck;
mod invalid;
mod ops;
mod respond;

use std::sync::Arc;

use axum::Router;
use axum::routing::{any, get, post};
use tollgate::lifecycle::Lifecycle;
use tollgate::limiter::Limiter;

use crate::{AllowAll, ApiError};

/// Largest accepted request body (defined beside the request it carries, so that the remote
/// client checks it before sending without depending on this crate).
pub use tollgate::limiter::MAX_BODY;

pub(crate) use self::body::Body;
pub use self::body::body_too_slow;
pub use self::healthcheck::Healthcheck;
pub use self::invalid::{EnvoyJsonError, InvalidBody};

/// A `POST /v1/check` body as the request it asks for, or why it is refused (the `400`'s
/// message). The handler's own decoder, public for the fuzz targets (`fuzz/`).
#[doc(hidden)]
pub fn decode_check_body(body: &[u8]) -> Result<tollgate::limiter::CheckRequest, InvalidBody> {
    check::decode(body)
}

use self::authorize::{AuthorizeMapping, AuthorizeState};

/// The decision routes over the limiter that `lifecycle` manages, with `/v1/authorize` disabled
/// (it answers 404 saying how to enable it).
pub fn router(lifecycle: Arc<Lifecycle>) -> Router {
    router_with_authorize(lifecycle, None)
}

/// The decision routes; `/v1/authorize` checks requests through `authorize` when given.
/// `/healthcheck` stays healthy while the process runs (see [`router_with`]).
pub fn router_with_authorize(
    lifecycle: Arc<Lifecycle>,
    authorize: Option<AuthorizeMapping>,
) -> Router {
    router_with(lifecycle, authorize, Healthcheck::always())
}

/// The decision routes, with `/v1/authorize` through `authorize` when given and
/// `/healthcheck` answering what `health` says.
pub fn router_with(
    lifecycle: Arc<Lifecycle>,
    authorize: Option<AuthorizeMapping>,
    health: Healthcheck,
) -> Router {
    let limiter = lifecycle.limiter().clone();
    let metrics = Router::new()
        .route("/metrics", get(ops::metrics))
        .route("/readyz", get(ops::readyz))
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
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(limiter)
        .merge(health.router())
        .merge(metrics)
        .merge(forward_auth);
    json_fallbacks(router)
}

/// `GET /metrics` alone, for a listener of its own (`--metrics-addr`, envoyproxy/ratelimit's
/// `PROMETHEUS_ADDR`): the same exposition as the HTTP port's, and nothing else.
pub fn metrics_router(lifecycle: Arc<Lifecycle>) -> Router {
    let router = Router::new()
        .route("/metrics", get(ops::metrics))
        .with_state(lifecycle);
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

/// The JSON answers for an unknown path (`404`) and a method a path does not take (`405`).
pub(crate) fn json_fallbacks(router: Router) -> Router {
    router
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::method_not_allowed("this endpoint does not take that method")
        })
}
