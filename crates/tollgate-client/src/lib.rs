//! Call tollgate from Rust: an [`Embedded`] limiter (the service's own limiter, in your
//! process, on the memory store or a Redis shared with tollgate services) and a tower
//! [`RateLimitLayer`] that protects an axum or hyper service with it. The same layer works
//! over [`Remote`], a client of a tollgate service's HTTP API, or [`RemoteGrpc`], its Envoy
//! RLS gRPC API, each with a caller-side [`Posture`] for when the service cannot be reached.
//!
//! ```
//! use axum::{Router, routing::get};
//! use tollgate::policy::Policy;
//! use tollgate::store::StoreUrl;
//! use tollgate_client::{Descriptors, Embedded, Options, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let policy = Policy::from_yaml("inline.yaml", "
//! domain: api
//! descriptors:
//!   - key: api_key
//!     rate_limit: {name: per_key, unit: minute, requests_per_unit: 1}
//! ").unwrap();
//! let limiter = Embedded::with_policy(policy, &StoreUrl::Memory, Options::default()).await.unwrap();
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(limiter, Descriptors::new("api").header("x-api-key", "api_key")));
//!
//! let request = || http::Request::get("/").header("x-api-key", "k1").body(axum::body::Body::empty()).unwrap();
//! let first = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(first.status(), 200);
//! assert_eq!(first.headers()["x-ratelimit-remaining"], "0");
//! let second = app.oneshot(request()).await.unwrap();
//! assert_eq!(second.status(), 429);
//! assert!(second.headers().contains_key("retry-after"));
//! # });
//! ```
//!
//! # Features
//!
//! Each way of deciding is a Cargo feature, three of them on by default; the middleware
//! ([`RateLimitLayer`], [`Descriptors`], the [`Backend`] trait) is always there. Turn the
//! default off to compile only what you use: `tollgate-client = { version = "0.1",
//! default-features = false, features = ["embedded"] }` builds no gRPC or HTTP client, and
//! `features = ["embedded-memory"]` no Redis client either.
//!
//! | feature | default | brings | extra dependencies |
//! |---|---|---|---|
//! | `embedded` | on | `Embedded`, `Options`, `OpenError`, `verdict`: the limiter in-process, on the memory store or Redis (`redis://`, `redis+cluster://`) | `redis` (tollgate's `redis` feature) |
//! | `embedded-memory` | with `embedded` | the same on the memory store alone: a Redis URL is refused with `InvalidStoreUrl::RedisNotBuilt` | none |
//! | `remote-http` | on | `Remote`, `Posture`: a client of the service's HTTP API | `reqwest`, `serde`, `url` |
//! | `remote-grpc` | on | `RemoteGrpc`, `Posture`, `tls`: a client of its gRPC API | `tonic`, `envoy-types`, `url` |
//!
//! Every feature depends on the `tollgate` crate (the request and response types, and the
//! limiter itself), without its Redis stores unless `embedded` is on; the doc example above
//! needs `embedded-memory`.

mod backend;
mod describe;
#[cfg(feature = "embedded-memory")]
mod embedded;
mod layer;
#[cfg(feature = "remote-grpc")]
mod quota_headers;
#[cfg(any(feature = "remote-http", feature = "remote-grpc"))]
mod remote;
#[cfg(feature = "remote-grpc")]
mod remote_grpc;
#[cfg(feature = "remote-http")]
mod remote_http;

pub use backend::{Backend, BackendError, Outcome, Verdict};
pub use describe::{AuthenticatedUser, Describe, Descriptors};
#[cfg(feature = "embedded-memory")]
pub use embedded::{DEFAULT_POLICY_SYNC, Embedded, OpenError, Options, verdict};
pub use layer::{Cost, RateLimit, RateLimitLayer, refused_charges};
#[cfg(any(feature = "remote-http", feature = "remote-grpc"))]
pub use remote::Posture;
#[cfg(feature = "remote-grpc")]
pub use remote_grpc::RemoteGrpc;
#[cfg(feature = "remote-http")]
pub use remote_http::Remote;

/// TLS settings of [`RemoteGrpc::with_tls`] (tonic's, re-exported so that callers need not
/// depend on the same tonic version).
#[cfg(feature = "remote-grpc")]
pub mod tls {
    pub use tonic::transport::{Certificate, ClientTlsConfig, Identity};
}
