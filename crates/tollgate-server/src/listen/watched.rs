//! A connection's socket whose reads, writes and flushes one [`Watch`] sees on their way: the
//! one forwarding wrapper the listeners' hardening shares (the read deadline, the HTTP/2
//! preface's deadline, the drain's connection count), each saying only what it changes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// What a [`Watched`] socket asks of its watch after each operation: the default of each
/// method passes the result on unchanged.
pub trait Watch {
    /// A read's result; `came` is how many bytes it put in the buffer.
    fn read(
        &mut self,
        cx: &mut Context<'_>,
        read: Poll<io::Result<()>>,
        came: usize,
    ) -> Poll<io::Result<()>> {
        let _ = (cx, came);
        read
    }

    /// A write's result (vectored or not).
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        let _ = cx;
        written
    }

    /// A flush's result.
    fn flushed(
        &mut self,
        cx: &mut Context<'_>,
        flushed: Poll<io::Result<()>>,
    ) -> Poll<io::Result<()>> {
        let _ = cx;
        flushed
    }
}

/// `io`, each of whose operations `watch` sees (a shutdown passes straight through).
#[derive(Debug)]
pub struct Watched<IO, W> {
    io: IO,
    watch: W,
}

impl<IO, W> Watched<IO, W> {
    /// `io` watched by `watch`.
    pub(crate) fn around(io: IO, watch: W) -> Self {
        Watched { io, watch }
    }
}

impl<IO: AsyncRead + Unpin, W: Watch + Unpin> AsyncRead for Watched<IO, W> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        let came = buf.filled().len().saturating_sub(before);
        this.watch.read(cx, read, came)
    }
}

impl<IO: AsyncWrite + Unpin, W: Watch + Unpin> AsyncWrite for Watched<IO, W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.io).poll_write(cx, bytes);
        this.watch.wrote(cx, written)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let flushed = Pin::new(&mut this.io).poll_flush(cx);
        this.watch.flushed(cx, flushed)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch.wrote(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: Connected, W> Connected for Watched<IO, W> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}
