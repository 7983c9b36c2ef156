//! A small xDS management server for the xDS tests: the aggregated discovery service (state
//! of the world) on a loopback port, sending whatever response the test set last and
//! recording every request (ACKs and NACKs) with the stream's headers.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use futures_util::Stream;
use prost::Message;
use tokio::sync::watch;
use tollgate_server::xds::proto::{RATE_LIMIT_CONFIG_TYPE_URL, RateLimitConfig};
use tonic::metadata::MetadataMap;
use tonic::transport::ServerTlsConfig;
use tonic::{Request, Response, Status, Streaming};

/// One request the server received, with the headers of its stream.
#[derive(Debug, Clone)]
pub struct Seen {
    pub request: DiscoveryRequest,
    pub headers: MetadataMap,
}

#[derive(Debug)]
struct Shared {
    current: watch::Sender<Option<DiscoveryResponse>>,
    /// Set by [`Ads::stop`]: every stream ends with UNAVAILABLE, as when the server goes away.
    killed: watch::Sender<bool>,
    seen: Mutex<Vec<Seen>>,
}

/// A running management server.
pub struct Ads {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Clone)]
struct Service(Arc<Shared>);

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaResponses = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let headers = request.metadata().clone();
        let mut incoming = request.into_inner();
        let shared = self.0.clone();
        tokio::spawn(async move {
            while let Ok(Some(request)) = incoming.message().await {
                let seen = Seen {
                    request,
                    headers: headers.clone(),
                };
                shared.seen.lock().unwrap().push(seen);
            }
        });
        let state = (self.0.current.subscribe(), self.0.killed.subscribe(), true);
        let responses =
            futures_util::stream::unfold(state, |(mut rx, mut killed, first)| async move {
                // `None` once the stream is done; a killed server ends it with UNAVAILABLE.
                if *killed.borrow() {
                    return None;
                }
                let mut wait = !first;
                loop {
                    if wait {
                        let gone = tokio::select! {
                            changed = rx.changed() => { changed.ok()?; false }
                            _ = killed.wait_for(|k| *k) => true,
                        };
                        if gone {
                            let error = Err(Status::unavailable("going away"));
                            return Some((error, (rx, killed, false)));
                        }
                    }
                    wait = true;
                    let current = rx.borrow_and_update().clone();
                    if let Some(response) = current {
                        return Some((Ok(response), (rx, killed, false)));
                    }
                }
            });
        Ok(Response::new(Box::pin(responses)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponses>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

impl Ads {
    /// Starts a server on `addr` (`127.0.0.1:0` for a free port), over TLS when given.
    pub async fn start(addr: SocketAddr, tls: Option<ServerTlsConfig>) -> Ads {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            current: watch::channel(None).0,
            killed: watch::channel(false).0,
            seen: Mutex::new(Vec::new()),
        });
        let (shutdown, mut stop) = watch::channel(false);
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).unwrap();
        }
        let router = builder.add_service(AggregatedDiscoveryServiceServer::new(Service(
            shared.clone(),
        )));
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            let _ = router.serve_with_incoming_shutdown(incoming, stopped).await;
        });
        Ads {
            addr,
            shared,
            shutdown,
            task,
        }
    }

    /// Sends `configs` as version `version` with nonce `nonce` on every stream (and to streams
    /// opened later).
    pub fn push(&self, version: &str, nonce: &str, configs: &[RateLimitConfig]) {
        let resources = configs
            .iter()
            .map(|c| Any {
                type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
                value: c.encode_to_vec(),
            })
            .collect();
        self.push_resources(version, nonce, resources);
    }

    /// [`Ads::push`] with any resources.
    pub fn push_resources(&self, version: &str, nonce: &str, resources: Vec<Any>) {
        self.shared.current.send_replace(Some(DiscoveryResponse {
            version_info: version.into(),
            resources,
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
            nonce: nonce.into(),
            ..Default::default()
        }));
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// Waits for the request answering the response with `nonce` (its ACK or NACK).
    pub async fn reply_to(&self, nonce: &str) -> DiscoveryRequest {
        for _ in 0..400 {
            let seen = self.seen();
            if let Some(s) = seen.iter().find(|s| s.request.response_nonce == nonce) {
                return s.request.clone();
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "no reply to nonce {nonce} within 10 s; seen: {:?}",
            self.seen()
        );
    }

    /// Waits for the first request of a stream (the subscription, with no nonce).
    pub async fn subscription(&self) -> Seen {
        for _ in 0..400 {
            if let Some(s) = self
                .seen()
                .into_iter()
                .find(|s| s.request.response_nonce.is_empty())
            {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("no subscription within 10 s");
    }

    /// Goes away: every stream fails, the listener closes and the port is free again.
    pub async fn stop(self) {
        self.shared.killed.send_replace(true);
        self.shutdown.send_replace(true);
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the management server stops")
            .unwrap();
    }
}
