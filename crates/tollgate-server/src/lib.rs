//! Transports for tollgate. Each decision handler is decode → [`tollgate::limiter::Limiter::check`]
//! → encode; protocol quirks live in the decoders.
//!
//! - [`grpc`]: serves `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
//! - [`http`]: serves `POST /v1/check`, `POST /json` (envoyproxy/ratelimit's proto3-JSON),
//!   `/v1/authorize` (nginx forward auth), `POST /v1/explain` (no charge), health and Prometheus
//!   metrics.
//! - [`debug`]: the read-only debug listener (`/rlconfig`).
//! - [`admin`]: the admin API (policy versions, candidates, overrides, top keys).
//! - [`listen`]: the listeners that serve them, with the connection hardening (read deadlines,
//!   keepalive, HTTP/2 preface deadline, TLS, drain counts).
//!
//! Both decision paths are generic over [`Decide`]: the [`tollgate::limiter::Limiter`] in
//! `tollgate serve`, [`AllowAll`] in the no-op `tollgate bench-server` that benchmarks compare
//! against.

pub mod admin;
mod api_error;
pub mod debug;
mod decide;
pub mod grpc;
pub mod headers;
pub mod http;
mod json_object;
pub mod listen;
mod units;
pub mod xds;

pub use api_error::{ApiError, ErrorKind};
pub use decide::{AllowAll, Decide};
