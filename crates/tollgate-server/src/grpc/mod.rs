//! Envoy RLS v3: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

mod decode;
mod encode;

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate::limiter::Limiter;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::{Request, Response, Status};

use crate::ErrorClass;
use crate::headers::{DEGRADED, SOFT_EXCEEDED};

pub use decode::decode_request;
pub use encode::encode_response;

/// The RLS service over a shared [`Limiter`].
#[derive(Debug, Clone)]
pub struct RlsService {
    limiter: Arc<Limiter>,
}

impl RlsService {
    /// A service deciding with `limiter`.
    pub fn new(limiter: Arc<Limiter>) -> Self {
        RlsService { limiter }
    }

    /// The tonic server wrapper, ready to add to a router.
    pub fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self)
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let check = decode_request(request.get_ref())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        match self.limiter.check(&check).await {
            Ok(decided) => {
                let encoded = encode_response(&decided);
                // tollgate's own markers also travel as gRPC metadata, for callers that read it
                // rather than `response_headers_to_add`.
                let markers: Vec<(&'static str, MetadataValue<Ascii>)> = encoded
                    .response_headers_to_add
                    .iter()
                    .filter_map(|h| {
                        let name = [DEGRADED, SOFT_EXCEEDED]
                            .into_iter()
                            .find(|n| *n == h.key)?;
                        Some((name, h.value.parse().ok()?))
                    })
                    .collect();
                let mut response = Response::new(encoded);
                for (name, value) in markers {
                    response.metadata_mut().insert(name, value);
                }
                Ok(response)
            }
            Err(e) => Err(Status::new(ErrorClass::of(&e).grpc_code(), e.to_string())),
        }
    }
}
