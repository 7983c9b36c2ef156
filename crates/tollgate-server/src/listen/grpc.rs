//! The gRPC listener's socket settings and the wrappers each of its connections goes through:
//! `TCP_NODELAY`, bounds on streams and buffered bytes per connection, keepalive pings, HTTP/2's preface within a
//! deadline ([`FirstBytesWithin`]) and a count for the drain ([`Counted`]).

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::net::{TcpListener, TcpStream};

use tower::layer::util::{Identity, Stack};

use super::drain::{Counted, Gauge};
use super::first_bytes::FirstBytesWithin;
use super::grpc_bytes::ChargeLayer;

/// Requests in flight per gRPC connection (HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS`) by
/// default: a client with more opens another connection, as Envoy's connection pool does.
pub const GRPC_MAX_STREAMS: u32 = 256;

/// The HTTP/2 settings and bounds of the gRPC listener (`serve`'s `--grpc-*` flags; the
/// defaults are [`GrpcLimits::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcLimits {
    /// Keepalive pings every `keepalive` (none for 0)...
    pub keepalive: Duration,
    /// ... answered within this, which is also how long the preface may take.
    pub keepalive_timeout: Duration,
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`.
    pub max_streams: u32,
    /// `SETTINGS_INITIAL_WINDOW_SIZE`: bytes a stream may send before the server reads them.
    pub stream_window: u32,
    /// The connection's flow-control window: bytes all its streams may send before the server
    /// reads them.
    pub connection_window: u32,
    /// `SETTINGS_MAX_HEADER_LIST_SIZE`: a request's headers, decoded.
    pub max_header_list: u32,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        GrpcLimits {
            keepalive: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(20),
            max_streams: GRPC_MAX_STREAMS,
            stream_window: 64 * 1024,
            connection_window: 1024 * 1024,
            max_header_list: 16 * 1024,
        }
    }
}

/// The gRPC server's settings (shared with `bench-server`, so the ceiling runs the same
/// stack): keepalive pings, the HTTP/2 bounds of `limits`, and each request's body charged to
/// its connection's budget of request bytes ([`ChargeLayer`], for connections wrapped in
/// [`super::Metered`]): one connection opening streams it never finished held them all for as
/// long as it answered the pings (200 000 streams took 1.8 GB; 1,000 streams sending 200 KB of
/// a message each, 200 MB). (No per-request timeout: a timer per request costs the decision
/// path about a microsecond.)
pub fn grpc_server(limits: &GrpcLimits) -> tonic::transport::Server<Stack<ChargeLayer, Identity>> {
    let keepalive = limits.keepalive;
    tonic::transport::Server::builder()
        .http2_keepalive_interval((!keepalive.is_zero()).then_some(keepalive))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .max_concurrent_streams(limits.max_streams)
        .initial_stream_window_size(limits.stream_window)
        .initial_connection_window_size(limits.connection_window)
        .http2_max_header_list_size(limits.max_header_list)
        .layer(ChargeLayer)
}

/// The gRPC listener's connections, `TCP_NODELAY` set on each: without it an HTTP/2 answer
/// written in several small frames waits on Nagle's algorithm for the caller's delayed ACK
/// (gRPC latencies of 1-2 ms at low load and a 40 ms tail).
pub fn grpc_accepted(
    listener: TcpListener,
) -> impl Stream<Item = std::io::Result<TcpStream>> + Send + 'static {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// `connections`, each counted in `open` for as long as the server keeps it.
pub fn counted<IO, S>(
    connections: S,
    open: &Gauge,
) -> impl Stream<Item = std::io::Result<Counted<IO>>> + Send + 'static
where
    S: Stream<Item = std::io::Result<IO>> + Send + 'static,
{
    let open = open.clone();
    connections.map(move |accepted| accepted.map(|io| Counted::new(io, &open)))
}

/// `connections` (plaintext, or after their TLS handshake), each of which must send HTTP/2's
/// preface `within` (see [`FirstBytesWithin`]).
pub fn preface_within<IO, S>(
    connections: S,
    within: Duration,
) -> impl Stream<Item = std::io::Result<FirstBytesWithin<IO>>> + Send + 'static
where
    S: Stream<Item = std::io::Result<IO>> + Send + 'static,
{
    connections.map(move |accepted| accepted.map(|io| FirstBytesWithin::new(io, within)))
}
