//! `RemoteGrpc` under the layer against a real service (in this process, on loopback sockets)
//! that leaves the `X-RateLimit-*` three out of its gRPC answers, as `serve
//! --no-rls-x-ratelimit-headers` does for an Envoy that adds its own: the layer's responses
//! still carry them, with the values the HTTP API gives.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http::{Request, Response, StatusCode};
use tollgate::clock::SystemClock;
use tollgate::lifecycle::Lifecycle;
use tollgate::limiter::{CheckRequest, Limiter, RequestDescriptor};
use tollgate::policy::Policy;
use tollgate::store::{MemoryStore, StoreBackend};
use tollgate_client::{Backend, Descriptors, Posture, RateLimitLayer, Remote, RemoteGrpc};
use tollgate_server::grpc::RlsService;
use tower::ServiceExt;

const POLICY: &str = "
domain: api
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: hour, requests_per_unit: 3}
  - key: bursty
    rate_limit: {name: bursty, unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 20}
";

const TIMEOUT: Duration = Duration::from_secs(5);

/// The service's gRPC (without the three) and HTTP listeners, over one limiter.
async fn service() -> (SocketAddr, SocketAddr) {
    let policy = Policy::from_yaml("inline.yaml", POLICY).unwrap();
    let store = StoreBackend::Memory(MemoryStore::new(Arc::new(SystemClock::new())));
    let limiter = Arc::new(Limiter::new(policy, store));
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc.local_addr().unwrap();
    let rls = RlsService::new(limiter.clone()).without_x_ratelimit_headers();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(rls.into_server())
            .serve_with_incoming(tollgate_server::listen::grpc_accepted(grpc)),
    );
    let sources = vec![("inline.yaml".to_owned(), POLICY.to_owned())];
    let lifecycle = Arc::new(Lifecycle::new(limiter, None, sources));
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_addr = http.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(http, tollgate_server::http::router(lifecycle))
            .await
            .unwrap();
    });
    (grpc_addr, http_addr)
}

fn app(remote: RemoteGrpc) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(
            remote,
            Descriptors::new("api")
                .header("x-api-key", "api_key")
                .header("x-bursty", "bursty"),
        ))
}

async fn call(app: &Router, header: &str, value: &str) -> Response<Body> {
    let request = Request::get("/")
        .header(header, value)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(request).await.unwrap()
}

fn header<'a>(response: &'a Response<Body>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

fn request(key: &str, value: &str) -> CheckRequest {
    let d = RequestDescriptor::new(vec![(key.into(), value.into())], 1, None).unwrap();
    CheckRequest::new("api".into(), vec![d]).unwrap()
}

/// `t` of a `RateLimit: "name";r=..;t=..` value.
fn t_of(ratelimit: &str) -> &str {
    ratelimit.rsplit_once(";t=").unwrap().1
}

#[tokio::test]
async fn the_layer_over_grpc_gives_the_x_ratelimit_headers_the_service_left_out() {
    let (grpc, http) = service().await;
    let url = format!("http://{grpc}");

    // The service does leave them out.
    let mut raw = RateLimitServiceClient::connect(url.clone()).await.unwrap();
    let answer = raw
        .should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "api_key".into(),
                    value: "raw".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        })
        .await
        .unwrap()
        .into_inner();
    let sent: Vec<&str> = answer
        .response_headers_to_add
        .iter()
        .map(|h| h.key.as_str())
        .collect();
    assert!(!sent.contains(&"x-ratelimit-limit"), "{sent:?}");
    assert!(sent.contains(&"ratelimit-policy"), "{sent:?}");

    let app = app(RemoteGrpc::new(&url, TIMEOUT, Posture::Closed).unwrap());
    let over_http = Remote::http(&format!("http://{http}"), TIMEOUT, Posture::Closed).unwrap();
    for remaining in ["2", "1", "0"] {
        let response = call(&app, "x-api-key", "grpc-side").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(&response, "x-ratelimit-limit"), Some("3"));
        assert_eq!(header(&response, "x-ratelimit-remaining"), Some(remaining));
        let ratelimit = header(&response, "ratelimit").unwrap();
        assert_eq!(
            header(&response, "x-ratelimit-reset"),
            Some(t_of(ratelimit))
        );
        // The HTTP API, asked the same for another key, says the same.
        let verdict = over_http
            .check(&request("api_key", "http-side"))
            .await
            .unwrap();
        assert_eq!(verdict.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(verdict.header("x-ratelimit-remaining"), Some(remaining));
    }
    let denied = call(&app, "x-api-key", "grpc-side").await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "x-ratelimit-limit"), Some("3"));
    assert_eq!(header(&denied, "x-ratelimit-remaining"), Some("0"));
    let ratelimit = header(&denied, "ratelimit").unwrap();
    assert_eq!(header(&denied, "x-ratelimit-reset"), Some(t_of(ratelimit)));
    assert!(header(&denied, "retry-after").is_some());

    // A bucket whose burst is not its rate announces its capacity, as over HTTP (the gRPC
    // statuses carry the configured 5 a second).
    let response = call(&app, "x-bursty", "grpc-side").await;
    assert_eq!(header(&response, "x-ratelimit-limit"), Some("20"));
    assert_eq!(header(&response, "x-ratelimit-remaining"), Some("19"));
    let verdict = over_http
        .check(&request("bursty", "http-side"))
        .await
        .unwrap();
    assert_eq!(verdict.header("x-ratelimit-limit"), Some("20"));
}
