//! The gRPC listener's connections: at most so many at once (a new one past the cap is closed
//! at once, counted and logged at most once a second), each carrying its budget of request
//! bytes to its requests ([`Metered`]).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tollgate::observe::Throttle;
use tollgate::observe::prometheus::{Exposition, Kind};
use tonic::transport::server::Connected;
use tracing::warn;

use super::drain::{Counted, Gauge};
use super::grpc_bytes::{ConnectionBytes, HELD, REFUSED_REQUESTS, RequestBytes};

/// Connections refused past the cap since the process started.
static REFUSED_CONNECTIONS: AtomicU64 = AtomicU64::new(0);
static REFUSED_LOG: Throttle = Throttle::new(Duration::from_secs(1));

/// `accepted`, at most `cap` of them open at once (counted in `open` from their accept, TLS
/// handshake included): one past it is closed as it comes.
pub fn capped<IO, S>(
    accepted: S,
    cap: usize,
    open: &Gauge,
) -> impl Stream<Item = io::Result<Counted<IO>>> + Send + 'static
where
    IO: Send + 'static,
    S: Stream<Item = io::Result<IO>> + Send + 'static,
{
    let open = open.clone();
    accepted.filter_map(move |accepted| {
        let kept = match accepted {
            Ok(io) if open.get() >= cap => {
                drop(io);
                refused(cap);
                None
            }
            Ok(io) => Some(Ok(Counted::new(io, &open))),
            Err(e) => Some(Err(e)),
        };
        std::future::ready(kept)
    })
}

fn refused(cap: usize) {
    REFUSED_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
    if let Some(held_back) = REFUSED_LOG.note(tokio::time::Instant::now()) {
        warn!(
            cap,
            held_back,
            "gRPC connection refused: {cap} already open (--grpc-max-connections); \
             {held_back} more refused since the last line"
        );
    }
}

/// `connections`, each given a budget of request bytes from `budgets`.
pub fn metered<IO, S>(
    connections: S,
    budgets: &RequestBytes,
) -> impl Stream<Item = io::Result<Metered<IO>>> + Send + 'static
where
    S: Stream<Item = io::Result<IO>> + Send + 'static,
{
    let budgets = budgets.clone();
    connections.map(move |accepted| {
        accepted.map(|io| Metered {
            io,
            bytes: budgets.connection(),
        })
    })
}

/// A gRPC connection whose requests find its [`ConnectionBytes`] in their extensions (as its
/// `ConnectInfo`), for [`super::ChargeLayer`]; reads and writes pass straight through.
#[derive(Debug)]
pub struct Metered<IO> {
    io: IO,
    bytes: ConnectionBytes,
}

impl<IO> Connected for Metered<IO> {
    type ConnectInfo = ConnectionBytes;

    fn connect_info(&self) -> ConnectionBytes {
        self.bytes.clone()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Metered<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Metered<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, bytes)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Appends the gRPC listener's bounds in Prometheus text format: connections refused past the
/// cap, requests refused for the byte budgets, request bytes held now.
pub fn render_metrics(out: &mut String) {
    let mut text = Exposition::new(out);
    let counters = [
        (
            "tollgate_grpc_connections_refused_total",
            "gRPC connections closed on accept because --grpc-max-connections were open.",
            REFUSED_CONNECTIONS.load(Ordering::Relaxed),
        ),
        (
            "tollgate_grpc_requests_refused_total",
            "gRPC requests refused (RESOURCE_EXHAUSTED) because their connection or the server held too many request bytes.",
            REFUSED_REQUESTS.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, value) in counters {
        text.family(name, help, Kind::Counter).sample(&[], value);
    }
    text.family(
        "tollgate_grpc_request_bytes",
        "Bytes of gRPC request messages held while they arrive.",
        Kind::Gauge,
    )
    .sample(&[], HELD.load(Ordering::Relaxed) as u64);
}
