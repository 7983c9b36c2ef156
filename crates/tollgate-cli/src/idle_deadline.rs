//! A connection closed when it has waited too long since its last sign of progress.
//!
//! [`Progress`] is the last instant a request's headers came in or its answer went out; the
//! connection's service marks it. [`IdleDeadline`] wraps the connection's socket: a read or a
//! write that is still waiting `limit` after that instant fails with `TimedOut`, and hyper
//! closes the connection. So a client gets `limit` to send a request's headers after it
//! connects or after its previous answer (an idle keep-alive connection is closed too), then
//! `limit` again for the body, and `limit` to take its answer.
//!
//! One timer per connection, armed only when the socket would wait, and pushed forward rather
//! than made anew (tokio extends a later deadline without touching its timer wheel): hyper's
//! own `header_read_timeout` makes a timer for every request, which cost a measurable share of
//! the HTTP path.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// When a connection last made progress; shared by its socket and its service.
#[derive(Debug, Clone)]
pub struct Progress {
    opened: Instant,
    /// Nanoseconds from `opened`.
    last: Arc<AtomicU64>,
}

impl Progress {
    pub fn new() -> Self {
        Progress {
            opened: Instant::now(),
            last: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Marks progress now: a request's headers came in, or its answer is ready.
    pub fn mark(&self) {
        let since = u64::try_from(self.opened.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.fetch_max(since, Ordering::Relaxed);
    }

    fn deadline(&self, limit: Duration) -> Instant {
        self.opened + Duration::from_nanos(self.last.load(Ordering::Relaxed)) + limit
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
}

impl<IO> IdleDeadline<IO> {
    pub fn new(io: IO, progress: Progress, limit: Duration) -> Self {
        let timer = Box::pin(tokio::time::sleep_until(progress.deadline(limit)));
        IdleDeadline {
            io,
            progress,
            limit,
            timer,
        }
    }

    /// For an operation that would wait: `TimedOut` if the deadline has passed, else
    /// `Pending` with the timer set to wake the task at the deadline.
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
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
            ready => ready,
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
            ready => ready,
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
