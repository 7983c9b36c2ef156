//! The standard gRPC health service (`grpc.health.v1.Health`), beside the RLS service on the
//! same port: Envoy's gRPC health checks, Kubernetes' `grpc` probes and `grpc_health_probe` ask
//! it, as they ask envoyproxy/ratelimit's.
//!
//! The server (`""`), `envoy.service.ratelimit.v3.RateLimitService` and `ratelimit` (the name
//! envoyproxy/ratelimit registers) are `SERVING` until the
//! process is told to stop, then `NOT_SERVING`. A `Watch` stream then sends that last status
//! and ends, so that a watcher never holds up a graceful shutdown.

use std::pin::Pin;

use futures_util::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// The health service; `stopping` turns `true` when the process starts its shutdown.
#[derive(Debug, Clone)]
pub struct HealthService {
    stopping: watch::Receiver<bool>,
}

impl HealthService {
    /// Answers `SERVING` until `stopping` says `true`.
    pub fn new(stopping: watch::Receiver<bool>) -> Self {
        HealthService { stopping }
    }

    /// The tonic server wrapper, ready to add to a router.
    pub fn into_server(self) -> HealthServer<Self> {
        HealthServer::new(self)
    }
}

/// The name envoyproxy/ratelimit registers its health under: health checks, probes and
/// `grpc_health_probe -service=ratelimit` set up for it must find tollgate serving too.
const ENVOY_RATELIMIT_HEALTH: &str = "ratelimit";

/// The RLS service's gRPC name (its generated server's `NamedService::NAME`, which a test holds
/// this to: the server type is not named here, so that this file needs nothing of the RLS one).
const RLS: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// Whether `name` is a service this port serves: the whole server (`""`), the RLS service, or
/// envoyproxy/ratelimit's health name for it.
fn known(name: &str) -> bool {
    name.is_empty() || name == ENVOY_RATELIMIT_HEALTH || name == RLS
}

fn status(known: bool, stopping: bool) -> HealthCheckResponse {
    let status = match (known, stopping) {
        (false, _) => ServingStatus::ServiceUnknown,
        (true, false) => ServingStatus::Serving,
        (true, true) => ServingStatus::NotServing,
    };
    HealthCheckResponse {
        status: status.into(),
    }
}

type Statuses = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let name = request.into_inner().service;
        if !known(&name) {
            return Err(Status::not_found(format!("unknown service `{name}`")));
        }
        Ok(Response::new(status(true, *self.stopping.borrow())))
    }

    type WatchStream = Statuses;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Statuses>, Status> {
        let known = known(&request.into_inner().service);
        // The status now, then (unless already stopping) the status once stopping, then the end.
        let stream = futures_util::stream::unfold(
            (Some(true), self.stopping.clone()),
            move |(step, mut stopping)| async move {
                let first = step?;
                if !first {
                    // A dropped sender means the process is going away too.
                    let _ = stopping.wait_for(|stop| *stop).await;
                    return Some((Ok(status(known, true)), (None, stopping)));
                }
                let now = *stopping.borrow();
                let next = (!now).then_some(false);
                Some((Ok(status(known, now)), (next, stopping)))
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod name {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
    use tonic::server::NamedService;

    use super::RLS;
    use crate::AllowAll;
    use crate::grpc::RlsService;

    #[test]
    fn the_rls_name_is_the_generated_servers() {
        assert_eq!(
            RLS,
            <RateLimitServiceServer<RlsService<AllowAll>> as NamedService>::NAME
        );
    }
}
