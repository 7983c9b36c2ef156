//! Health, readiness and metrics.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use tollgate::lifecycle::Lifecycle;
use tollgate::limiter::Limiter;
use tollgate::store::Store;

pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready when a policy is loaded: every decision gets an answer, from the store or, while it
/// is unreachable, from the failure postures (reported as `degraded`). The body details the
/// store's health and each circuit breaker. A policy from xDS that has not arrived yet is the
/// empty one (every request allowed), said in the first line; still `200`, as
/// envoyproxy/ratelimit's `/healthcheck` answers when started without its first config.
pub async fn readyz(State(lifecycle): State<Arc<Lifecycle>>) -> impl IntoResponse {
    let limiter: &Limiter = lifecycle.limiter();
    let policy = limiter.policy();
    let mut body = String::new();
    let store = limiter.store();
    let (headline, health) = match store.key_count().await {
        Ok(keys) => ("ready", format!("ok, {keys} keys")),
        Err(e) => (
            "ready (degraded)",
            format!("degraded ({e}); failure postures answer"),
        ),
    };
    let waiting = lifecycle.awaiting_first_push();
    let headline = match (headline, waiting) {
        (_, false) => headline.to_owned(),
        ("ready", true) => "ready (no xDS configuration yet)".to_owned(),
        (_, true) => "ready (degraded, no xDS configuration yet)".to_owned(),
    };
    let _ = writeln!(body, "{headline}");
    if let Some(source) = lifecycle.managed_by() {
        let state = if waiting {
            "waiting for the first configuration; every descriptor is unmatched (allowed)"
        } else {
            "configuration received"
        };
        let _ = writeln!(body, "policy source: {source}, {state}");
    }
    let _ = writeln!(
        body,
        "policy: {} domains, {} rules",
        policy.domains().count(),
        policy.rules().len()
    );
    let _ = writeln!(body, "store: {}, {health}", store.description());
    let _ = writeln!(
        body,
        "default posture: {}",
        limiter.failure_settings().posture
    );
    for (node, state) in store.breakers() {
        let _ = writeln!(body, "breaker {node}: {}", state.name());
    }
    (StatusCode::OK, body)
}

pub async fn metrics(State(lifecycle): State<Arc<Lifecycle>>) -> impl IntoResponse {
    let mut text = lifecycle.limiter().render_metrics().await;
    lifecycle.limiter().store().render_metrics(&mut text);
    lifecycle.render_metrics(&mut text);
    tollgate::background::render_metrics(&mut text);
    crate::listen::render_metrics(&mut text);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}
