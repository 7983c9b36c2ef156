//! What the proxy does to the traffic it carries.

use std::time::Duration;

/// The fault a [`FaultProxy`](super::FaultProxy) injects. A new mode applies at once, to open
/// connections as well as new ones.
///
/// Bytes are never dropped or reordered: a mode that stops forwarding (`Blackhole`, a cut reply)
/// holds what it has read, and a later `Pass` delivers it in order, so a RESP stream stays
/// well-formed across a fault that heals, as TCP's retransmissions keep it across a healed
/// partition. Only `Reset` and `Refuse` end connections, and only they lose held bytes.
///
/// ```
/// use std::io::{Read, Write};
/// use std::net::TcpStream;
/// use std::time::Duration;
///
/// use tollgate_testkit::{FaultProxy, Mode, RedisServer};
///
/// let redis = RedisServer::start();
/// let proxy = FaultProxy::start(redis.addr());
/// let mut client = TcpStream::connect(proxy.addr()).unwrap();
/// client.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
///
/// client.write_all(b"PING\r\n").unwrap();
/// let mut reply = [0; 7];
/// client.read_exact(&mut reply).unwrap();
/// assert_eq!(&reply, b"+PONG\r\n");
///
/// proxy.set_mode(Mode::Blackhole); // the open connection stalls, without closing
/// client.write_all(b"PING\r\n").unwrap();
/// assert!(client.read(&mut reply).is_err()); // timed out
///
/// proxy.set_mode(Mode::Pass); // the held request and its reply flow again
/// client.read_exact(&mut reply).unwrap();
/// assert_eq!(&reply, b"+PONG\r\n");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Forwards every byte both ways as soon as it arrives.
    #[default]
    Pass,
    /// Forwards each chunk, in either direction, once it is this old: an added one-way latency.
    ///
    /// A request/reply round trip takes at least twice the delay (the request waits once, the
    /// reply once). Chunks keep their order and do not wait for each other: pipelined commands
    /// all arrive one delay late, not one delay after the previous one. Connecting is not
    /// delayed. Leaving the mode forwards what is waiting at once.
    Latency(Duration),
    /// Accepts connections and reads what clients send, but forwards nothing in either direction
    /// and never closes: a network partition. Open connections stall the same way.
    ///
    /// A client sees its connect succeed and its writes succeed, then no reply: reads time out
    /// and never return end-of-file or an error. What was read is held (up to a bound, then the
    /// client's own writes block) and forwarded in order when the mode goes back to `Pass`, so
    /// late replies then arrive for requests the client may have given up on.
    Blackhole,
    /// Resets every connection: open ones at once, new ones as soon as they are accepted (the
    /// socket is closed with `SO_LINGER` 0, so the client gets a TCP RST, not a FIN).
    ///
    /// A client sees its connect succeed, then its next read fail with `ConnectionReset` (a write
    /// may fail with `BrokenPipe` or `ConnectionReset`). [`FaultProxy::set_mode`] returns once
    /// every open connection is gone.
    ///
    /// [`FaultProxy::set_mode`]: super::FaultProxy::set_mode
    Reset,
    /// Closes the listening socket, so connects fail with `ConnectionRefused`, and closes open
    /// connections with a FIN (their reads return end-of-file), like a server that went away.
    ///
    /// Leaving the mode listens on the same port again. [`FaultProxy::set_mode`] returns once the
    /// socket is closed (or bound again) and every open connection is gone.
    ///
    /// [`FaultProxy::set_mode`]: super::FaultProxy::set_mode
    Refuse,
    /// Forwards requests, but on each connection forwards only the first `after_bytes` bytes the
    /// upstream sends from the moment the mode is set (or the connection opens), then holds the
    /// rest: a reply cut mid-stream that never completes and never closes.
    ///
    /// A client reads a truncated reply, then its reads time out. Setting the mode again, even
    /// with the same value, gives every connection a fresh allowance; `Pass` delivers the rest.
    /// An upstream close is held too, so the client is never told the server went away.
    CutReplies {
        /// How many reply bytes each connection still gets.
        after_bytes: usize,
    },
}
