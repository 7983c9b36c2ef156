//! A connection closed when it has waited too long since its last sign of progress.
//!
//! [`Progress`] is the last instant a request's headers came in or its answer was ready (the
//! connection's service marks it), or a write went through after one had to wait (the socket
//! marks it). [`IdleDeadline`] wraps the socket: a read or a write that is still waiting
//! `limit` after that instant asks the connection to close gracefully
//! ([`Progress::idle_expired`]: an HTTP/2 client gets its GOAWAY), and fails with `TimedOut`
//! [`STOPPING_GRACE`] later if it is still waiting; hyper then closes the connection. So a
//! client gets `limit` to send a request's headers after it connects or after its previous
//! answer (an idle keep-alive connection is closed too), then `limit` again for the body (and
//! the answer to be ready; half a second more while a request is in flight, for its `408`),
//! and `limit` between two writes of an answer it must read for (as
//! nginx's `send_timeout`: a large answer read steadily is never cut). Once the connection is
//! told to stop ([`Progress::stop`]) and has no request in flight, it is closed
//! [`STOPPING_GRACE`] after its last progress: half a request's headers do not hold a
//! shutdown, and a last answer still goes out.
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

use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

use super::watched::{Watch, Watched};

/// When a connection last made progress, how many of its requests are in flight, and whether
/// it is closing; shared by its socket, its service and its task.
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
    /// Set once the listener stops.
    stopping: AtomicBool,
    /// Told once the connection has been idle past its limit.
    idle_expired: Notify,
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

impl Progress {
    /// A connection that opened now.
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
    pub fn request(&self) -> InFlightRequest {
        self.mark();
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlightRequest(self.clone())
    }

    /// The listener is stopping: once no request is in flight, the connection gets
    /// [`STOPPING_GRACE`] from its last progress.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
    }

    /// Done once the connection has waited on its client past the limit with no request in
    /// flight: time to close it gracefully, which it has [`STOPPING_GRACE`] to do.
    pub async fn idle_expired(&self) {
        self.shared.idle_expired.notified().await;
    }

    fn stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::Relaxed)
    }

    fn idle(&self) -> bool {
        self.in_flight() == 0
    }

    /// The connection's requests whose answer is not ready yet.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
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
pub struct InFlightRequest(Progress);

impl Drop for InFlightRequest {
    fn drop(&mut self) {
        self.0.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.mark();
    }
}

/// `io`, whose reads and writes ask the connection to close once waiting past `limit` after the
/// last [`Progress`], and fail with `TimedOut` [`STOPPING_GRACE`] later.
pub type IdleDeadline<IO> = Watched<IO, Idle>;

/// What an [`IdleDeadline`] keeps: the connection's progress, its limit and its one timer.
#[derive(Debug)]
pub struct Idle {
    progress: Progress,
    limit: Duration,
    timer: Pin<Box<Sleep>>,
    /// Whether the connection has been asked to close for being idle.
    asked_to_close: bool,
    /// Whether a write had to wait since the last that went through.
    write_waited: bool,
}

/// Once the listener stops, how long a connection with no request in flight stays after its
/// last progress; how much longer than the limit one with a request in flight waits, so that
/// the request's own `408` goes out before the connection closes; and how long an idle one has
/// to close gracefully.
pub const STOPPING_GRACE: Duration = Duration::from_millis(500);

impl<IO> IdleDeadline<IO> {
    /// `io`, closed once it has waited `limit` past `progress`'s last mark.
    pub fn new(io: IO, progress: Progress, limit: Duration) -> Self {
        let timer = Box::pin(tokio::time::sleep_until(progress.deadline(limit)));
        Watched::around(
            io,
            Idle {
                progress,
                limit,
                timer,
                asked_to_close: false,
                write_waited: false,
            },
        )
    }
}

impl Idle {
    /// For an operation that would wait: `TimedOut` if the deadline has passed, else
    /// `Pending` with the timer set to wake the task at the deadline. An idle connection is
    /// asked to close at the limit and has [`STOPPING_GRACE`] more to do it. Once the listener
    /// stops, a connection with no request in flight gets [`STOPPING_GRACE`] from its last
    /// progress (its last answer's bytes still go out).
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let idle = self.progress.idle();
        let stopping = idle && self.progress.stopping();
        let limit = if stopping {
            self.limit.min(STOPPING_GRACE)
        } else if idle && !self.asked_to_close {
            self.limit
        } else {
            // A request in flight answers its own lateness (`408`) at the limit: the
            // connection gives its answer time to go out first. An idle connection asked to
            // close gets the same time to say goodbye.
            self.limit.saturating_add(STOPPING_GRACE)
        };
        let deadline = self.progress.deadline(limit);
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) if stopping => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the server is stopping and no request is in flight",
            ))),
            Poll::Ready(()) if idle && !self.asked_to_close => {
                self.asked_to_close = true;
                self.progress.shared.idle_expired.notify_one();
                self.waiting(cx)
            }
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

    /// For a write that would wait.
    fn write_waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        self.write_waited = true;
        self.waiting(cx)
    }
}

impl Watch for Idle {
    fn read(
        &mut self,
        cx: &mut Context<'_>,
        read: Poll<io::Result<()>>,
        _came: usize,
    ) -> Poll<io::Result<()>> {
        match read {
            Poll::Pending => self.waiting(cx),
            ready => ready,
        }
    }

    /// A write's result. One that goes through after a write had to wait is progress: the
    /// client is reading an answer larger than the socket's buffers. Other writes are not (an
    /// HTTP/2 client's pings and settings would otherwise keep an idle connection forever).
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match written {
            Poll::Pending => self.write_waiting(cx),
            Poll::Ready(Ok(n)) if n > 0 && std::mem::take(&mut self.write_waited) => {
                self.progress.mark();
                written
            }
            ready => ready,
        }
    }

    fn flushed(
        &mut self,
        cx: &mut Context<'_>,
        flushed: Poll<io::Result<()>>,
    ) -> Poll<io::Result<()>> {
        match flushed {
            Poll::Pending => self.write_waiting(cx),
            ready => ready,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

    use super::*;

    const LIMIT: Duration = Duration::from_secs(10);

    struct Connection {
        server: IdleDeadline<DuplexStream>,
        client: DuplexStream,
        progress: Progress,
    }

    /// A connection whose socket buffers `buffer` bytes each way.
    fn connection(buffer: usize) -> Connection {
        let (server, client) = duplex(buffer);
        let progress = Progress::new();
        let server = IdleDeadline::new(server, progress.clone(), LIMIT);
        Connection {
            server,
            client,
            progress,
        }
    }

    /// How long a read on `server` waits before it fails, and that it fails with `TimedOut`.
    async fn read_fails_after(server: &mut IdleDeadline<DuplexStream>) -> Duration {
        let began = Instant::now();
        let error = server.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        began.elapsed()
    }

    /// Reads on `c.server` until it fails; answers when the connection was asked to close and
    /// when the read failed, both from now.
    async fn asked_then_cut(c: &mut Connection) -> (Duration, Duration) {
        let began = Instant::now();
        let progress = c.progress.clone();
        let asked = tokio::spawn(async move {
            progress.idle_expired().await;
            began.elapsed()
        });
        let cut = read_fails_after(&mut c.server).await;
        (asked.await.unwrap(), cut)
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_wait_asks_to_close_at_the_limit_after_the_last_progress_and_fails_after_the_grace()
     {
        let mut c = connection(64);
        assert_eq!(
            asked_then_cut(&mut c).await,
            (LIMIT, LIMIT + STOPPING_GRACE)
        );

        let mut c = connection(64);
        tokio::time::sleep(LIMIT / 2).await;
        c.progress.mark();
        assert_eq!(
            asked_then_cut(&mut c).await,
            (LIMIT, LIMIT + STOPPING_GRACE)
        );

        // Bytes that come in time are read; the deadline still runs from the last progress.
        let mut c = connection(64);
        c.client.write_all(b"GET").await.unwrap();
        let mut buffer = [0u8; 8];
        assert_eq!(c.server.read(&mut buffer).await.unwrap(), 3);
        assert_eq!(
            asked_then_cut(&mut c).await,
            (LIMIT, LIMIT + STOPPING_GRACE)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_write_that_had_to_wait_is_progress() {
        let mut c = connection(16);
        let deadline = || c.progress.deadline(LIMIT);
        let before = deadline();
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Fits the buffer (a ping's acknowledgement): the connection is no less idle.
        c.server.write_all(b"pong").await.unwrap();
        assert_eq!(c.progress.deadline(LIMIT), before);

        // An answer of 64 bytes through a 16-byte buffer, read 16 bytes every 8 s: 40 s in
        // all, more than the limit, and never 10 s without a write going through.
        let mut client = c.client;
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buffer = [0u8; 16];
            while got < 4 + 64 {
                tokio::time::sleep(Duration::from_secs(8)).await;
                got += client.read(&mut buffer).await.unwrap();
            }
            got
        });
        c.server.write_all(&[7u8; 64]).await.unwrap();
        assert!(c.progress.deadline(LIMIT) > before);
        assert_eq!(reader.await.unwrap(), 4 + 64);
    }

    #[tokio::test(start_paused = true)]
    async fn once_stopping_an_idle_connection_gets_the_grace_only() {
        let mut c = connection(64);
        c.progress.stop();
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Its last progress (the connection's opening) is older than the grace: at once.
        assert_eq!(read_fails_after(&mut c.server).await, Duration::ZERO);

        // An answer just ready: the grace, for its bytes to go out.
        let mut c = connection(64);
        c.progress.stop();
        drop(c.progress.request());
        assert_eq!(read_fails_after(&mut c.server).await, STOPPING_GRACE);

        // A request in flight keeps the whole limit, and the grace for its `408`.
        let mut c = connection(64);
        c.progress.stop();
        let _in_flight = c.progress.request();
        assert_eq!(
            read_fails_after(&mut c.server).await,
            LIMIT + STOPPING_GRACE
        );
    }
}
