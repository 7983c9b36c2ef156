//! The ADS stream (state of the world), as envoyproxy/ratelimit's client speaks it: one
//! request naming the node and the [`RATE_LIMIT_CONFIG_TYPE_URL`], then for every response
//! an ACK (its `version_info` and `nonce`) once the whole response is the running policy, or
//! a NACK (the last accepted `version_info`, its `nonce`, and `error_detail` with the reason)
//! while the running policy stays.

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};
use envoy_types::pb::google::rpc::Status;
use tokio::sync::mpsc;
use tollgate::lifecycle::{Activation, Lifecycle};
use tollgate::policy::{MAX_POLICY_FILE, PolicyErrors};
use tonic::metadata::{Ascii, MetadataKey, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tracing::{info, warn};

use super::convert::{ResourceError, sources};
use super::proto::RATE_LIMIT_CONFIG_TYPE_URL;
use super::settings::{SettingsError, XdsSettings};

/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
pub(super) enum StreamError {
    /// The TLS files could not be read.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// No connection to the management server.
    #[error("cannot connect to {server}: {reason}")]
    Connect {
        /// Its `HOST:PORT`.
        server: String,
        /// Why, with every cause.
        reason: String,
    },
    /// The stream failed.
    #[error("the stream failed: {0}")]
    Status(#[from] tonic::Status),
    /// The server ended the stream.
    #[error("the management server ended the stream")]
    Ended,
}

/// Why a response is refused (a NACK, its `error_detail` saying this); the running policy stays.
#[derive(Debug, thiserror::Error)]
enum Rejected {
    /// The response carries another type than rate limit configurations.
    #[error("the response has type {0}, not {RATE_LIMIT_CONFIG_TYPE_URL}")]
    WrongType(String),
    /// Its resources are not policy sources.
    #[error(transparent)]
    Resource(#[from] ResourceError),
    /// The policy they make is invalid.
    #[error(transparent)]
    Policy(#[from] PolicyErrors),
}

/// What survives a stream: the version last accepted (sent again when reconnecting).
#[derive(Debug, Default)]
pub(super) struct Accepted {
    pub version_info: String,
}

/// Runs one stream until it fails; `responded` is set once a response arrived on it.
pub(super) async fn stream(
    lifecycle: &Lifecycle,
    settings: &XdsSettings,
    accepted: &mut Accepted,
    responded: &mut bool,
) -> StreamError {
    match run_stream(lifecycle, settings, accepted, responded).await {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

async fn run_stream(
    lifecycle: &Lifecycle,
    settings: &XdsSettings,
    accepted: &mut Accepted,
    responded: &mut bool,
) -> Result<std::convert::Infallible, StreamError> {
    let channel = connect(settings).await?;
    let mut client = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(MAX_POLICY_FILE as usize);
    let node = node(settings);
    let (tx, rx) = mpsc::unbounded_channel();
    let request = |version_info: &str, nonce: &str, error: Option<String>| DiscoveryRequest {
        version_info: version_info.to_owned(),
        node: Some(node.clone()),
        type_url: RATE_LIMIT_CONFIG_TYPE_URL.to_owned(),
        response_nonce: nonce.to_owned(),
        error_detail: error.map(|message| Status {
            code: INVALID_ARGUMENT,
            message,
            details: Vec::new(),
        }),
        ..Default::default()
    };
    // The subscription, carrying the version this replica runs (empty at first).
    let _ = tx.send(request(&accepted.version_info, "", None));
    let outgoing = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|message| (message, rx))
    });
    let mut call = tonic::Request::new(outgoing);
    for (key, value) in &settings.headers {
        // Checked when the settings were parsed.
        let key = MetadataKey::<Ascii>::from_bytes(key.to_ascii_lowercase().as_bytes());
        let value = MetadataValue::<Ascii>::try_from(value.as_str());
        if let (Ok(key), Ok(value)) = (key, value) {
            call.metadata_mut().insert(key, value);
        }
    }
    let mut responses = client.stream_aggregated_resources(call).await?.into_inner();
    info!(server = %settings.server, node = %settings.node_id, "xDS: subscribed to rate limit configurations");
    loop {
        let response = responses.message().await?.ok_or(StreamError::Ended)?;
        *responded = true;
        let reply = match apply(lifecycle, &response) {
            Ok(()) => {
                accepted.version_info = response.version_info.clone();
                request(&response.version_info, &response.nonce, None)
            }
            Err(reason) => {
                warn!(version_info = %response.version_info, nonce = %response.nonce, reason = %reason, "xDS: configuration rejected (NACK); the running policy stays");
                request(
                    &accepted.version_info,
                    &response.nonce,
                    Some(reason.to_string()),
                )
            }
        };
        // The receiving half lives as long as the call.
        let _ = tx.send(reply);
    }
}

/// Validates a response completely and makes it the running policy; the reason it cannot be.
fn apply(lifecycle: &Lifecycle, response: &DiscoveryResponse) -> Result<(), Rejected> {
    if response.type_url != RATE_LIMIT_CONFIG_TYPE_URL {
        return Err(Rejected::WrongType(response.type_url.clone()));
    }
    let sources = sources(&response.resources)?;
    let configs = sources.len();
    match lifecycle.apply_managed(sources) {
        Ok(activation) => {
            let version = activation.version().label();
            let changed = matches!(activation, Activation::Activated(_));
            info!(version_info = %response.version_info, configs, policy = %version, changed, "xDS: configuration accepted (ACK)");
            Ok(())
        }
        Err(errors) => Err(errors.into()),
    }
}

/// The node this replica subscribes as.
fn node(settings: &XdsSettings) -> Node {
    let fields = settings.node_metadata.iter().map(|(k, v)| {
        let value = Value {
            kind: Some(Kind::StringValue(v.clone())),
        };
        (k.clone(), value)
    });
    Node {
        id: settings.node_id.clone(),
        metadata: Some(Struct {
            fields: fields.collect(),
        }),
        user_agent_name: "tollgate".to_owned(),
        ..Default::default()
    }
}

/// A channel to the management server, over TLS when set (its files read again each time).
async fn connect(settings: &XdsSettings) -> Result<Channel, StreamError> {
    let scheme = if settings.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let failed = |e: tonic::transport::Error| StreamError::Connect {
        server: settings.server.clone(),
        reason: with_causes(&e),
    };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", settings.server))
        .map_err(failed)?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT);
    if let Some(tls) = &settings.tls {
        let files = tls.read()?;
        let mut config = ClientTlsConfig::new();
        config = match files.ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = files.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &tls.server_name {
            config = config.domain_name(name.clone());
        }
        endpoint = endpoint.tls_config(config).map_err(failed)?;
    }
    endpoint.connect().await.map_err(failed)
}

/// How long a connection may take to open.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// An idle stream is pinged this often, so that a server that vanished is noticed.
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a ping may go unanswered.
const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// An error and its causes, `: `-separated (tonic's own text says only "transport error").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_carries_its_id_and_metadata() {
        let settings = XdsSettings {
            server: "cp:18000".into(),
            node_id: "ratelimit".into(),
            node_metadata: vec![("zone".into(), "a".into())],
            tls: None,
            headers: vec![],
            backoff_initial: std::time::Duration::from_secs(1),
            backoff_max: std::time::Duration::from_secs(2),
        };
        let node = node(&settings);
        assert_eq!(node.id, "ratelimit");
        let zone = node.metadata.as_ref().and_then(|m| m.fields.get("zone"));
        assert_eq!(
            zone.and_then(|v| v.kind.clone()),
            Some(Kind::StringValue("a".into()))
        );
    }
}
