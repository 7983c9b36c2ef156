//! A connection closed when it has waited too long since its last sign of progress.
//!
//! [`Progress`] is the last instant a request's headers came in, its answer was ready, or a
//! write to the client went through; the connection's service and socket mark it.
//! [`IdleDeadline`] wraps the socket: a read or a write that is still waiting `limit` after
//! that instant fails with `TimedOut`, and hyper closes the connection. So a client gets
//! `limit` to send a request's headers after it connects or after its previous answer (an idle
//! keep-alive connection is closed too), then `limit` again for the body, and `limit` between
//! two writes of its answer that it must read for (as nginx's `send_timeout`: a large answer
//! read steadily is never cut). Once the listener stops, a connection with no request in
//! flight is closed at its next wait: half a request's headers do not hold a shutdown.
//!
//! One timer per connection, armed only when the socket would wait, and pushed forward rather
//! than made anew (tokio extends a later deadline without touching its timer wheel): hyper's
//! own `header_read_timeout` makes a timer for every request, which cost a measurable share of
//! the HTTP path.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// When a connection last made progress, and how many of its requests are in flight; shared
/// by its socket and its service.
#[derive(Debug, Clone)]
pub struct Progress {
    opened: Instant,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Nanoseconds from `opened`.
    last: AtomicU64,
    in_flight: AtomicUsize,
}

impl Progress {
    pub fn new() -> Self {
        Progress {
            opened: Instant::now(),
            shared: Arc::default(),
        }
    }

    /// Marks progress now.
    pub fn mark(&self) {
        let since = u64::try_from(self.opened.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.shared.last.fetch_max(since, Ordering::Relaxed);
    }

    /// A request whose headers just came in: progress, and in flight until the returned guard
    /// is dropped (its answer ready, or the request abandoned), which marks progress again.
    pub fn request(&self) -> InFlight {
        self.mark();
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    fn idle(&self) -> bool {
        self.shared.in_flight.load(Ordering::Relaxed) == 0
    }

    fn deadline(&self, limit: Duration) -> Instant {
        let last = Duration::from_nanos(self.shared.last.load(Ordering::Relaxed));
        // A limit that overflows an instant is as good as none.
        self.opened
            .checked_add(last.saturating_add(limit))
            .unwrap_or_else(|| self.opened + Duration::from_secs(u64::from(u32::MAX)))
    }
}

/// A request in flight on a connection (see [`Progress::request`]).
#[derive(Debug)]
pub struct InFlight(Progress);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.mark();
    }
}

/// `io`, whose reads and writes fail with `TimedOut` once waiting past `limit` after the last
/// [`Progress`].
#[derive(Debug)]
pub struct IdleDeadline<IO> {
    io: IO,
    progress: Progress,
    limit: Duration,
    timer: Pin<Box<Sleep>>,
    /// Set once the listener stops.
    stopping: Arc<AtomicBool>,
}

impl<IO> IdleDeadline<IO> {
    pub fn new(io: IO, progress: Progress, limit: Duration, stopping: Arc<AtomicBool>) -> Self {
        let timer = Box::pin(tokio::time::sleep_until(progress.deadline(limit)));
        IdleDeadline {
            io,
            progress,
            limit,
            timer,
            stopping,
        }
    }

    /// For an operation that would wait: `TimedOut` if the deadline has passed, else
    /// `Pending` with the timer set to wake the task at the deadline.
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if self.stopping.load(Ordering::Relaxed) && self.progress.idle() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the server is stopping and no request is in flight",
            )));
        }
        let deadline = self.progress.deadline(self.limit);
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client sent nothing for {}",
                    humantime::format_duration(self.limit)
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO> IdleDeadline<IO> {
    /// A write's result; one that went through is progress.
    fn wrote(&self, written: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = written
            && n > 0
        {
            self.progress.mark();
        }
        written
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for IdleDeadline<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Pending => self.waiting(cx),
            ready => ready,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for IdleDeadline<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, bytes) {
            Poll::Pending => self.waiting(cx),
            ready => self.wrote(ready),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Pending => self.waiting(cx),
            ready => ready,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.waiting(cx),
            ready => self.wrote(ready),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
