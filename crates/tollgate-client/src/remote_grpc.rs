//! The remote client over Envoy RLS v3 gRPC (`ShouldRateLimit`): the protocol every Envoy-style
//! caller speaks, with one multiplexed HTTP/2 connection.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use tollgate::limiter::{CheckRequest, headers};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::backend::{Backend, BackendError, Outcome, Verdict};
use crate::quota_headers;
use crate::remote::{
    FORWARDED, Posture, binding_name, fallback, refuse_limit_overrides, service_url,
};

/// A client of a tollgate service's gRPC API. Cheap to clone; clones share one connection.
#[derive(Debug, Clone)]
pub struct RemoteGrpc {
    client: RateLimitServiceClient<Channel>,
    timeout: Duration,
    posture: Posture,
}

impl RemoteGrpc {
    /// A client of the service at `url` (e.g. `http://127.0.0.1:8081`), connected lazily. An
    /// `https://` URL (a service started with `--grpc-tls-cert`, or a proxy in front of it) is
    /// verified against the system's roots or the PEM file `SSL_CERT_FILE` names; see
    /// [`RemoteGrpc::with_tls`] for a private CA or a client certificate. Each decision waits at
    /// most `timeout`; past it, or when the service cannot be reached, `posture` answers. Call
    /// it inside a Tokio runtime: the channel starts its connection task there.
    pub fn new(url: &str, timeout: Duration, posture: Posture) -> Result<Self, BackendError> {
        let (url, https) = service_url(url)?;
        let tls = https.then(|| ClientTlsConfig::new().with_native_roots());
        Self::connect(&url, tls, timeout, posture)
    }

    /// A client over TLS configured by `tls`: e.g. `ClientTlsConfig::new()` with
    /// `.ca_certificate(..)` for a private CA, and `.identity(..)` for a service that asks for
    /// client certificates (`--grpc-tls-client-ca`).
    pub fn with_tls(
        url: &str,
        tls: ClientTlsConfig,
        timeout: Duration,
        posture: Posture,
    ) -> Result<Self, BackendError> {
        // Over any other scheme tonic would connect in plaintext and ignore `tls`.
        let (url, https) = service_url(url)?;
        if !https {
            return Err(BackendError::Invalid(format!(
                "`{url}`: TLS needs an https:// URL"
            )));
        }
        Self::connect(&url, Some(tls), timeout, posture)
    }

    fn connect(
        url: &str,
        tls: Option<ClientTlsConfig>,
        timeout: Duration,
        posture: Posture,
    ) -> Result<Self, BackendError> {
        let mut endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| BackendError::Invalid(format!("invalid service URL `{url}`: {e}")))?;
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| BackendError::Invalid(format!("unusable TLS settings: {e}")))?;
        }
        let channel = endpoint
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect_lazy();
        Ok(RemoteGrpc {
            client: RateLimitServiceClient::new(channel),
            timeout,
            posture,
        })
    }
}

fn wire_request(request: &CheckRequest) -> Result<RateLimitRequest, BackendError> {
    refuse_limit_overrides(request)?;
    let descriptors = request
        .descriptors()
        .iter()
        .map(|d| RateLimitDescriptor {
            entries: d
                .entries()
                .iter()
                .map(|(key, value)| Entry {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            hits_addend: Some(UInt64Value { value: d.cost() }),
            ..Default::default()
        })
        .collect();
    Ok(RateLimitRequest {
        domain: request.domain().to_owned(),
        descriptors,
        hits_addend: 1,
    })
}

impl Backend for RemoteGrpc {
    async fn check(&self, request: &CheckRequest) -> Result<Verdict, BackendError> {
        let wire = wire_request(request)?;
        let mut client = self.client.clone();
        // Its checks ask "would one more unit fit", as over HTTP: a check before the request
        // must see a limit that is exactly used up as reached.
        let mut wire = tonic::Request::new(wire);
        wire.metadata_mut().insert(
            headers::CHECKS,
            tonic::metadata::MetadataValue::from_static(headers::CHECKS_NEXT_UNIT),
        );
        let answer = tokio::time::timeout(self.timeout, client.should_rate_limit(wire)).await;
        let response = match answer {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => {
                return Err(BackendError::Invalid(status.message().to_owned()));
            }
            // Unreachable, failing or slower than the timeout.
            _ => return Ok(fallback(self.posture)),
        };
        let headers: Vec<(&'static str, String)> = FORWARDED
            .iter()
            .filter_map(|name| {
                let h = response
                    .response_headers_to_add
                    .iter()
                    .find(|h| h.key == *name)?;
                Some((*name, h.value.clone()))
            })
            .collect();
        let headers = quota_headers::completed(headers, &response);
        let degraded_closed = headers
            .iter()
            .any(|(n, v)| *n == headers::DEGRADED && v == "closed");
        let outcome = match Code::try_from(response.overall_code) {
            Ok(Code::Ok) => Outcome::Allowed,
            Ok(Code::OverLimit) if degraded_closed => Outcome::Unavailable,
            Ok(Code::OverLimit) => Outcome::Limited,
            _ => return Ok(fallback(self.posture)),
        };
        let limit_name = binding_name(&headers);
        Ok(Verdict {
            outcome,
            headers,
            limit_name,
        })
    }
}
