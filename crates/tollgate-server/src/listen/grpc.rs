//! The gRPC listener's socket settings and the wrappers each of its connections goes through:
//! `TCP_NODELAY`, a bound on streams per connection, keepalive pings, HTTP/2's preface within a
//! deadline ([`FirstBytesWithin`]) and a count for the drain ([`Counted`]).

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::net::{TcpListener, TcpStream};

use super::drain::{Counted, Gauge};
use super::first_bytes::FirstBytesWithin;

/// Requests in flight per gRPC connection (HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS`): a
/// client with more opens another connection, as Envoy's connection pool does.
pub const GRPC_MAX_STREAMS: u32 = 1024;

/// The gRPC server's settings (shared with `bench-server`, so the ceiling runs the same
/// stack): keepalive pings every `keepalive` (none for 0), answered within `timeout`, and at
/// most [`GRPC_MAX_STREAMS`] requests in flight per connection: one
/// connection opening streams it never finished held them all (about 8 KB each; 200 000 took
/// 1.8 GB in two seconds) for as long as it answered the pings. (No per-request timeout: a
/// timer per request costs the decision path about a microsecond.)
pub fn grpc_server(keepalive: Duration, timeout: Duration) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval((!keepalive.is_zero()).then_some(keepalive))
        .http2_keepalive_timeout(Some(timeout))
        .max_concurrent_streams(GRPC_MAX_STREAMS)
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
