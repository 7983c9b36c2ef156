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

mod backend;
mod describe;
mod embedded;
mod layer;
mod remote;
mod remote_grpc;

pub use backend::{Backend, BackendError, Outcome, Verdict};
pub use describe::{AuthenticatedUser, Describe, Descriptors};
pub use embedded::{Embedded, OpenError, Options, verdict};
pub use layer::{Cost, RateLimit, RateLimitLayer};
pub use remote::{Posture, Remote};
pub use remote_grpc::RemoteGrpc;

/// TLS settings of [`RemoteGrpc::with_tls`] (tonic's, re-exported so that callers need not
/// depend on the same tonic version).
pub mod tls {
    pub use tonic::transport::{Certificate, ClientTlsConfig, Identity};
}
