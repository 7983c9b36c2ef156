//! Health, readiness and metrics.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use tollgate::limiter::Limiter;
use tollgate::store::Store;

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn readyz(State(limiter): State<Arc<Limiter>>) -> impl IntoResponse {
    let policy = limiter.policy();
    let body = format!(
        "ready\npolicy: {} domains, {} rules\nstore: memory, {} keys\n",
        policy.domains().count(),
        policy.rules().len(),
        limiter.store().key_count()
    );
    (StatusCode::OK, body)
}

pub async fn metrics(State(limiter): State<Arc<Limiter>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        limiter.render_metrics(),
    )
}
