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

use tokio::time::Sleep;

use super::watched::{Watch, Watched};

/// The length of HTTP/2's client connection preface (`PRI * HTTP/2.0...`).
const PREFACE: usize = 24;

/// `io`, whose first [`PREFACE`] bytes must come within the deadline.
pub type FirstBytesWithin<IO> = Watched<IO, Preface>;

/// What a [`FirstBytesWithin`] keeps: the deadline, and how many bytes are still to come.
#[derive(Debug)]
pub struct Preface {
    /// `None` once the first bytes came.
    deadline: Option<Pin<Box<Sleep>>>,
    /// How many of them are still to come.
    awaited: usize,
}

impl<IO> FirstBytesWithin<IO> {
    /// `io`, whose client must send HTTP/2's preface `within`.
    pub fn new(io: IO, within: Duration) -> Self {
        Watched::around(
            io,
            Preface {
                deadline: Some(Box::pin(tokio::time::sleep(within))),
                awaited: PREFACE,
            },
        )
    }
}

impl Watch for Preface {
    fn read(
        &mut self,
        cx: &mut Context<'_>,
        read: Poll<io::Result<()>>,
        came: usize,
    ) -> Poll<io::Result<()>> {
        let Some(deadline) = self.deadline.as_mut() else {
            return read;
        };
        match read {
            Poll::Ready(Ok(())) => {
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
