//! `GET /healthcheck`, answered as envoyproxy/ratelimit answers it: Envoy Gateway uses it as
//! the rate-limit Deployment's startup, readiness and liveness probe.
//!
//! `200 OK` while the service runs, whether or not the store answers (upstream's default: its
//! Redis check only counts with `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`); `500` with an empty
//! body once the shutdown has begun, so that the endpoints drop the replica while it drains.
//! A config source that delivers the first policy later (xDS) can hold it at `500` until then
//! with [`Healthcheck::awaiting_first_config`]. `/readyz` keeps tollgate's own, detailed answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;

/// What `/healthcheck` answers; cheap to clone, every clone the same state.
#[derive(Debug, Clone)]
pub struct Healthcheck {
    stopping: Option<watch::Receiver<bool>>,
    awaiting: Arc<AtomicBool>,
}

impl Healthcheck {
    /// Healthy until `stopping` says true (the shutdown began) or its sender is gone.
    pub fn new(stopping: watch::Receiver<bool>) -> Self {
        Healthcheck {
            stopping: Some(stopping),
            awaiting: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Healthy until the process ends: for routers built without a shutdown signal.
    pub fn always() -> Self {
        Healthcheck {
            stopping: None,
            awaiting: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The hook for a config source that delivers the first policy after the start (xDS):
    /// answer `500` until [`Healthcheck::first_config_arrived`]. Upstream's
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG=true` means not calling it (healthy at once).
    pub fn awaiting_first_config(&self) {
        self.awaiting.store(true, Ordering::Relaxed);
    }

    /// The first policy has arrived: healthy from now on (until the shutdown).
    pub fn first_config_arrived(&self) {
        self.awaiting.store(false, Ordering::Relaxed);
    }

    /// Whether `/healthcheck` answers 200.
    pub fn healthy(&self) -> bool {
        let stopping = self
            .stopping
            .as_ref()
            .is_some_and(|s| *s.borrow() || s.has_changed().is_err());
        !stopping && !self.awaiting.load(Ordering::Relaxed)
    }

    /// The `/healthcheck` route over this state.
    pub fn router(self) -> Router {
        Router::new()
            .route("/healthcheck", get(answer))
            .with_state(self)
    }
}

async fn answer(State(health): State<Healthcheck>) -> impl IntoResponse {
    if health.healthy() {
        (StatusCode::OK, "OK")
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_until_the_shutdown_or_while_awaiting_the_first_config() {
        let (stop, stopping) = watch::channel(false);
        let health = Healthcheck::new(stopping);
        assert!(health.healthy());
        health.awaiting_first_config();
        assert!(!health.healthy());
        health.first_config_arrived();
        assert!(health.healthy());
        let _ = stop.send(true);
        assert!(!health.healthy());
        assert!(Healthcheck::always().healthy());
    }
}
