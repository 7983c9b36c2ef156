//! Envoy RLS v3: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

mod decode;
mod encode;
mod health;
mod metadata;
mod upstream_headers;

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate::limiter::Transport;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use crate::headers::{DEGRADED, SOFT_EXCEEDED, ceil_ms};
use crate::{ApiError, Decide};

pub use decode::decode_request;
pub use encode::encode_response;
pub use health::HealthService;
pub use upstream_headers::UpstreamHeaders;

/// The RLS service over a shared decider: a [`tollgate::limiter::Limiter`], or
/// [`crate::AllowAll`] for the no-op ceiling server.
#[derive(Debug)]
pub struct RlsService<D> {
    decider: Arc<D>,
    x_ratelimit: bool,
    dynamic_metadata: bool,
    upstream_headers: Option<Arc<UpstreamHeaders>>,
}

impl<D> Clone for RlsService<D> {
    fn clone(&self) -> Self {
        RlsService {
            decider: self.decider.clone(),
            x_ratelimit: self.x_ratelimit,
            dynamic_metadata: self.dynamic_metadata,
            upstream_headers: self.upstream_headers.clone(),
        }
    }
}

impl<D: Decide> RlsService<D> {
    /// A service deciding with `decider`.
    pub fn new(decider: Arc<D>) -> Self {
        RlsService {
            decider,
            x_ratelimit: true,
            dynamic_metadata: false,
            upstream_headers: None,
        }
    }

    /// Sends envoyproxy/ratelimit's three response headers, named `names`, in place of
    /// tollgate's rate-limit headers (see [`UpstreamHeaders`]); its degraded and soft-exceeded
    /// markers are still sent.
    pub fn with_upstream_headers(mut self, names: UpstreamHeaders) -> Self {
        self.upstream_headers = Some(Arc::new(names));
        self
    }

    /// Sends `dynamic_metadata` in every answer, shaped as envoyproxy/ratelimit's with
    /// `RESPONSE_DYNAMIC_METADATA` (see [`metadata`]): the request's domain and descriptors,
    /// and the policy `metadata` of the limits that admitted.
    pub fn with_dynamic_metadata(mut self) -> Self {
        self.dynamic_metadata = true;
        self
    }

    /// Leaves `X-RateLimit-Limit`, `-Remaining` and `-Reset` out of `response_headers_to_add`,
    /// for an Envoy that adds its own (`enable_x_ratelimit_headers`, which Envoy Gateway sets):
    /// each would otherwise reach the client twice.
    pub fn without_x_ratelimit_headers(mut self) -> Self {
        self.x_ratelimit = false;
        self
    }

    /// The tonic server wrapper, ready to add to a router.
    pub fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self).max_decoding_message_size(MAX_MESSAGE)
    }
}

/// Largest request message accepted (`OUT_OF_RANGE` past it). Envoy takes descriptor
/// values from requests whose headers it limits to 60 KiB by default, so this leaves room; and
/// a message of empty repeated fields decodes into about 64 times its size before any limit on
/// descriptors can be checked (4 MiB took 266 MB).
pub const MAX_MESSAGE: usize = 256 * 1024;

#[tonic::async_trait]
impl<D: Decide> RateLimitService for RlsService<D> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // A tollgate client's checks ask "would one more unit fit" (see `headers::CHECKS`).
        let next_unit = request
            .metadata()
            .get(tollgate::limiter::headers::CHECKS)
            .is_some_and(|v| v == tollgate::limiter::headers::CHECKS_NEXT_UNIT);
        let request = request.into_inner();
        let echo = self
            .dynamic_metadata
            .then(|| metadata::RequestEcho::of(&request));
        let check = decode_request(request)
            .map(|check| check.with_checks_as_is(!next_unit))
            .map_err(|e| {
                self.decider.refused(Transport::Grpc, &e);
                Status::from(ApiError::invalid(e.to_string()))
            })?;
        match self.decider.decide(&check).await {
            Ok(decided) => {
                let mut wire = encode_response(&decided, self.x_ratelimit);
                if let Some(names) = &self.upstream_headers {
                    // tollgate's markers stay; its rate-limit headers give way to upstream's.
                    wire.response_headers_to_add
                        .retain(|h| h.key == DEGRADED || h.key == SOFT_EXCEEDED);
                    let upstream = names.for_statuses(&wire.statuses);
                    wire.response_headers_to_add.extend(upstream);
                }
                wire.dynamic_metadata = echo.map(|echo| echo.into_metadata(&decided));
                let mut response = Response::new(wire);
                // tollgate's own markers also travel as gRPC metadata, for callers that read it
                // rather than `response_headers_to_add` (same values as those headers).
                let metadata = response.metadata_mut();
                if let Some(posture) = decided.degraded() {
                    metadata.insert(DEGRADED, MetadataValue::from_static(posture.name()));
                }
                if let Some(delay) = decided.soft_delay() {
                    metadata.insert(SOFT_EXCEEDED, MetadataValue::from(ceil_ms(delay)));
                }
                Ok(response)
            }
            Err(e) => {
                self.decider.refused(Transport::Grpc, &e);
                Err(ApiError::from(&e).into())
            }
        }
    }
}
