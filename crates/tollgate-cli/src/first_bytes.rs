//! A connection that must send its first bytes within a deadline.
//!
//! HTTP/2 keepalive pings only start once a client has sent its preface, so a plaintext gRPC
//! client that connects and sends nothing would hold its connection (and a shutdown's drain)
//! for as long as it likes. Wrapped in [`FirstBytesWithin`], its first read fails with
//! `TimedOut` at the deadline, and the server closes the connection.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

/// `io`, whose first read must bring bytes within the deadline.
#[derive(Debug)]
pub struct FirstBytesWithin<IO> {
    io: IO,
    /// `None` once the first bytes came.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<IO> FirstBytesWithin<IO> {
    pub fn new(io: IO, within: Duration) -> Self {
        FirstBytesWithin {
            io,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
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
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.deadline = None;
                read
            }
            Poll::Pending if deadline.as_mut().poll(cx).is_ready() => Poll::Ready(Err(
                io::Error::new(io::ErrorKind::TimedOut, "no bytes from the client in time"),
            )),
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
