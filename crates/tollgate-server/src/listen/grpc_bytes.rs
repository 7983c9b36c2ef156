//! The bytes of gRPC request messages the server holds while they arrive, bounded per
//! connection and in all: a stream whose message never finishes arriving holds what it sent
//! (and tonic reserves the whole length its prefix announces), so without a bound one
//! connection of unfinished streams held 200 MB.
//!
//! Each request's body is charged, message by message, the length its 5-byte prefix announces
//! (at most the message limit, past which tonic refuses it anyway) as soon as the prefix comes,
//! and gives it all back when the body is dropped (its request decoded, answered or reset). A
//! charge past the connection's budget or the listener's refuses that request with
//! `RESOURCE_EXHAUSTED`, which frees its bytes and resets its stream.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame};
use hyper::body::Bytes;
use tollgate::observe::Throttle;
use tracing::warn;

/// Requests refused for the byte budgets since the process started (see [`super::render_metrics`]).
pub(super) static REFUSED_REQUESTS: AtomicU64 = AtomicU64::new(0);
/// Bytes charged now, over every gRPC listener of the process.
pub(super) static HELD: AtomicUsize = AtomicUsize::new(0);
static REFUSED_LOG: Throttle = Throttle::new(Duration::from_secs(1));

/// `serve`'s default budget of request bytes per gRPC connection: four messages of the largest
/// size, or thousands of Envoy's (a few hundred bytes each).
pub const CONNECTION_REQUEST_BYTES: usize = 1 << 20;
/// `serve`'s default budget of request bytes over all gRPC connections.
pub const REQUEST_BYTES: usize = 64 << 20;

/// A budget of bytes, shared by what takes from it.
#[derive(Debug)]
struct Pool {
    used: AtomicUsize,
    limit: usize,
}

impl Pool {
    fn new(limit: usize) -> Arc<Pool> {
        Arc::new(Pool {
            used: AtomicUsize::new(0),
            limit,
        })
    }

    fn take(&self, bytes: usize) -> bool {
        let before = self.used.fetch_add(bytes, Ordering::Relaxed);
        if before.saturating_add(bytes) > self.limit {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn give(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// A gRPC listener's budgets of request bytes: `per_connection` for each connection, `in_all`
/// for all of them together.
#[derive(Debug, Clone)]
pub struct RequestBytes {
    all: Arc<Pool>,
    per_connection: usize,
    message_limit: usize,
}

impl RequestBytes {
    /// Budgets of `per_connection` and `in_all` bytes; a message is charged at most
    /// `message_limit` (plus its prefix), the most the server decodes.
    pub fn new(per_connection: usize, in_all: usize, message_limit: usize) -> Self {
        RequestBytes {
            all: Pool::new(in_all),
            per_connection,
            message_limit,
        }
    }

    /// A new connection's budget, drawing on this listener's too.
    pub fn connection(&self) -> ConnectionBytes {
        ConnectionBytes {
            connection: Pool::new(self.per_connection),
            all: self.all.clone(),
            message_limit: self.message_limit,
        }
    }

    /// Bytes charged now, over every connection.
    pub fn held(&self) -> usize {
        self.all.used.load(Ordering::Relaxed)
    }
}

/// One connection's budget of request bytes (and its listener's), found by each request in its
/// extensions (see [`super::Metered`]).
#[derive(Debug, Clone)]
pub struct ConnectionBytes {
    connection: Arc<Pool>,
    all: Arc<Pool>,
    message_limit: usize,
}

impl ConnectionBytes {
    fn take(&self, bytes: usize) -> bool {
        if !self.connection.take(bytes) {
            return false;
        }
        if !self.all.take(bytes) {
            self.connection.give(bytes);
            return false;
        }
        HELD.fetch_add(bytes, Ordering::Relaxed);
        true
    }

    fn give(&self, bytes: usize) {
        self.connection.give(bytes);
        self.all.give(bytes);
        HELD.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Bytes this connection holds now.
    pub fn held(&self) -> usize {
        self.connection.used.load(Ordering::Relaxed)
    }
}

/// Where a body stands in gRPC's framing: each message is a 1-byte flag, a 4-byte big-endian
/// length, then that many bytes.
#[derive(Debug, Default)]
struct Framing {
    prefix: [u8; 5],
    have: usize,
    left: usize,
}

impl Framing {
    /// The lengths announced by the prefixes that complete in `chunk`.
    fn announced(&mut self, mut chunk: &[u8], mut each: impl FnMut(usize)) {
        while !chunk.is_empty() {
            if self.left > 0 {
                let n = self.left.min(chunk.len());
                self.left -= n;
                chunk = &chunk[n..];
                continue;
            }
            let n = (5 - self.have).min(chunk.len());
            self.prefix[self.have..self.have + n].copy_from_slice(&chunk[..n]);
            self.have += n;
            chunk = &chunk[n..];
            if self.have == 5 {
                let [_, a, b, c, d] = self.prefix;
                let len = u32::from_be_bytes([a, b, c, d]) as usize;
                each(len);
                self.left = len;
                self.have = 0;
            }
        }
    }
}

/// A request body charged to its connection's [`ConnectionBytes`].
#[derive(Debug)]
pub struct Charged<B> {
    inner: B,
    bytes: ConnectionBytes,
    held: usize,
    framing: Framing,
    refused: bool,
}

impl<B> Charged<B> {
    /// `inner`, charged to `bytes`.
    pub fn new(inner: B, bytes: ConnectionBytes) -> Self {
        Charged {
            inner,
            bytes,
            held: 0,
            framing: Framing::default(),
            refused: false,
        }
    }

    /// Charges the messages whose prefixes `chunk` completes; false when a budget is spent.
    fn charge(&mut self, chunk: &[u8]) -> bool {
        let mut wanted = 0usize;
        let limit = self.bytes.message_limit;
        self.framing.announced(chunk, |len| {
            wanted = wanted.saturating_add(5 + len.min(limit))
        });
        if wanted == 0 {
            return true;
        }
        if self.bytes.take(wanted) {
            self.held += wanted;
            return true;
        }
        false
    }

    fn refuse(&mut self) -> tonic::Status {
        let (connection, all) = (
            self.bytes.held(),
            self.bytes.all.used.load(Ordering::Relaxed),
        );
        self.bytes.give(std::mem::take(&mut self.held));
        self.refused = true;
        REFUSED_REQUESTS.fetch_add(1, Ordering::Relaxed);
        if let Some(held_back) = REFUSED_LOG.note(tokio::time::Instant::now()) {
            warn!(
                connection_bytes = connection,
                listener_bytes = all,
                held_back,
                "gRPC request refused: its connection or the server holds too many request bytes \
                 already (--grpc-connection-request-bytes, --grpc-request-bytes); {held_back} more \
                 refused since the last line"
            );
        }
        tonic::Status::resource_exhausted(
            "too many request bytes held by this connection or the server; retry later",
        )
    }
}

impl<B> Drop for Charged<B> {
    fn drop(&mut self) {
        self.bytes.give(std::mem::take(&mut self.held));
    }
}

impl<B> Body for Charged<B>
where
    B: Body<Data = Bytes, Error = tonic::Status> + Unpin,
{
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        if this.refused {
            return Poll::Ready(None);
        }
        let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
            && !this.charge(data)
        {
            return Poll::Ready(Some(Err(this.refuse())));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.refused || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Charges each request's body to the connection budget in its extensions (requests without
/// one, from a server not wrapped in [`super::Metered`], pass as they are).
#[derive(Debug, Clone, Copy, Default)]
pub struct ChargeLayer;

impl<S> tower::Layer<S> for ChargeLayer {
    type Service = Charge<S>;

    fn layer(&self, inner: S) -> Charge<S> {
        Charge(inner)
    }
}

/// See [`ChargeLayer`].
#[derive(Debug, Clone)]
pub struct Charge<S>(S);

impl<S> tower::Service<http::Request<tonic::body::Body>> for Charge<S>
where
    S: tower::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> S::Future {
        let bytes = request.extensions().get::<ConnectionBytes>().cloned();
        let request = match bytes {
            Some(bytes) => request.map(|body| tonic::body::Body::new(Charged::new(body, bytes))),
            None => request,
        };
        self.0.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefixed(len: u32, sent: usize) -> Vec<u8> {
        let mut message = vec![0];
        message.extend_from_slice(&len.to_be_bytes());
        message.resize(5 + sent, b'x');
        message
    }

    #[test]
    fn framing_finds_each_prefix_across_chunks() {
        let mut framing = Framing::default();
        let mut seen = Vec::new();
        let mut stream = prefixed(3, 3);
        stream.extend(prefixed(70_000, 10));
        for chunk in stream.chunks(2) {
            framing.announced(chunk, |len| seen.push(len));
        }
        assert_eq!(seen, [3, 70_000]);
    }

    #[test]
    fn a_charge_past_either_budget_is_refused_and_changes_nothing() {
        let budgets = RequestBytes::new(100, 150, 1000);
        let (a, b) = (budgets.connection(), budgets.connection());
        assert!(a.take(90));
        assert!(!a.take(20), "past the connection's budget");
        assert!(b.take(60));
        assert!(!b.take(10), "past the listener's");
        assert_eq!((a.held(), b.held(), budgets.held()), (90, 60, 150));
        a.give(90);
        assert!(b.take(40));
        assert_eq!(budgets.held(), 100);
    }
}
