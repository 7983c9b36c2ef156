//! A connection that must send HTTP/2's connection preface within a deadline.
//!
//! HTTP/2 keepalive pings only start once a client has sent its preface, so a gRPC client that
//! connects (over TLS: completes its handshake) and then sends nothing, or only part of the
//! preface, would hold its connection (and a shutdown's drain) for as long as it likes.
//! Wrapped in [`FirstBytesWithin`], its read fails with `TimedOut` at the deadline unless the
//! preface's 24 bytes have come, and the server closes the connection.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

/// The length of HTTP/2's client connection preface (`PRI * HTTP/2.0...`).
const PREFACE: usize = 24;

/// `io`, whose first [`PREFACE`] bytes must come within the deadline.
#[derive(Debug)]
pub struct FirstBytesWithin<IO> {
    io: IO,
    /// `None` once the first bytes came.
    deadline: Option<Pin<Box<Sleep>>>,
    /// How many of them are still to come.
    awaited: usize,
}

impl<IO> FirstBytesWithin<IO> {
    pub fn new(io: IO, within: Duration) -> Self {
        FirstBytesWithin {
            io,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
            awaited: PREFACE,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for FirstBytesWithin<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        let Some(deadline) = self.deadline.as_mut() else {
            return read;
        };
        match read {
            Poll::Ready(Ok(())) => {
                let came = buf.filled().len() - before;
                self.awaited = self.awaited.saturating_sub(came);
                if self.awaited == 0 {
                    self.deadline = None;
                }
                read
            }
            Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client did not send HTTP/2's preface in time",
                )))
            }
            other => other,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FirstBytesWithin<IO> {
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

impl<IO: Connected> Connected for FirstBytesWithin<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}
