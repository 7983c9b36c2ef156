//! The listeners, and the hardening every connection gets: mount [`crate::http`]'s,
//! [`crate::admin`]'s or [`crate::grpc`]'s routers through them, not through a bare
//! `axum::serve` or tonic `serve`, which leave a slow or silent client holding a connection
//! (and a shutdown) for as long as it likes.
//!
//! - HTTP ([`serve_http`]): a read deadline per connection ([`IdleDeadline`]), graceful close on
//!   stop or idleness, a `408` for a stalled HTTP/2 stream, `TCP_NODELAY`.
//! - gRPC ([`grpc_server`], [`grpc_accepted`], [`preface_within`]): keepalive pings, a bound on
//!   streams and request bytes per connection ([`RequestBytes`], [`metered`]) and of connections
//!   ([`capped`]), HTTP/2's preface within a deadline, `TCP_NODELAY`; TLS with files reloaded
//!   while serving ([`ServingTls`]).
//! - Both: a backlog sized for bursts of new clients ([`bind`]), and counts of what a shutdown's
//!   drain waits for ([`Open`], [`counted`]).

mod bind;
mod cert_validity;
mod drain;
mod first_bytes;
mod grpc;
mod grpc_bytes;
mod grpc_connections;
mod grpc_tls;
mod http_listener;
mod idle_deadline;
mod stop;
mod watched;

pub use bind::{BindError, bind};
pub use cert_validity::Validity;
pub use drain::{Counted, Drained, Gauge, Held, InFlight, Open, Tracked};
pub use first_bytes::{FirstBytesWithin, Preface};
pub use grpc::{GRPC_MAX_STREAMS, GrpcLimits, counted, grpc_accepted, grpc_server, preface_within};
pub use grpc_bytes::{
    CONNECTION_REQUEST_BYTES, Charge, ChargeLayer, Charged, ConnectionBytes, REQUEST_BYTES,
    RequestBytes,
};
pub use grpc_connections::{Metered, capped, metered, render_metrics};
pub use grpc_tls::{ServingTls, TlsError, TlsFile, TlsFiles};
pub use http_listener::{Peer, serve as serve_http};
pub use idle_deadline::{Idle, IdleDeadline, Progress, STOPPING_GRACE};
pub use stop::stopped;
pub use watched::{Watch, Watched};
