//! The proxy's handle: start, switch modes, read counters, stop.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::link::Close;
use super::listener;
use super::mode::Mode;
use super::shared::Shared;
use crate::deadline::Deadline;
use crate::port::PortLease;

/// Fresh ports to try when another process takes the picked one before the proxy binds it.
const BIND_ATTEMPTS: usize = 5;

/// How long [`FaultProxy::set_mode`] waits for connections to close and the listener to close or
/// bind again (binding gives up after 5 s; connecting to the upstream takes at most 2 s).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bound on the connection that wakes the accept thread.
const WAKE_TIMEOUT: Duration = Duration::from_secs(1);

/// A TCP proxy on a free loopback port that forwards every connection to one upstream, byte for
/// byte, and injects the fault its [`Mode`] names, switched at run time.
///
/// The proxy runs on its own threads with blocking `std::net` sockets, so it works the same from
/// `#[test]` and `#[tokio::test]` and needs no runtime; its methods block the calling thread
/// briefly. Each client connection costs four threads, named `proxy-PORT-…`. Dropping the proxy
/// closes every connection (with a FIN), closes the listener, joins every thread and releases the
/// port, also when the test panics.
///
/// # With the `redis` crate
///
/// What `redis` 1.8 (tokio, default timeouts) does through the proxy, as measured on loopback:
///
/// - `Latency(d)`: every command takes 2·d more, and so does opening a connection (its `HELLO`
///   handshake is one round trip).
/// - `Blackhole` and `CutReplies`: a command fails after the response timeout (500 ms) with an
///   error whose `is_timeout()` is true and `is_connection_dropped()` false; the connection stays
///   open. Back in `Pass` the same connection answers correctly at once (the late replies are
///   matched to the abandoned requests and discarded). Opening a connection fails with "timed
///   out" after the connection timeout (1 s).
/// - `Reset` and `Refuse`: the next command fails with "broken pipe" (`is_connection_dropped()`).
///   A `MultiplexedConnection` stays broken for good; a `ConnectionManager` reconnects, but while
///   the fault lasts a command can wait about 9.5 s for its default retries: shorten them
///   (`ConnectionManagerConfig::set_number_of_retries`) in tests. After `Pass` it reconnects
///   within one backoff step.
///
/// ```
/// use std::io::ErrorKind;
/// use std::net::TcpStream;
///
/// use tollgate_testkit::{FaultProxy, Mode, RedisServer};
///
/// let redis = RedisServer::start();
/// let proxy = FaultProxy::start(redis.addr());
/// assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
///
/// proxy.set_mode(Mode::Refuse);
/// let refused = TcpStream::connect(proxy.addr()).unwrap_err();
/// assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
///
/// proxy.set_mode(Mode::Pass); // the same port again
/// assert!(TcpStream::connect(proxy.addr()).is_ok());
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    // Field order is drop order: `Drop` stops the threads, then the lease releases the port.
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    lease: PortLease,
}

impl FaultProxy {
    /// Starts a proxy in [`Mode::Pass`] that forwards every connection it accepts to `upstream`.
    ///
    /// The upstream is connected to once per accepted client; when that fails, the client is
    /// reset.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound, or the accept thread cannot be started.
    pub fn start(upstream: SocketAddr) -> Self {
        let (lease, listener) = bind_fresh_port();
        let shared = Arc::new(Shared::new(upstream, lease.port()));
        let accept = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("proxy-{}-acc", lease.port()))
                .spawn(move || listener::run(&shared, listener))
                .expect("cannot start the fault proxy's accept thread")
        };
        Self {
            shared,
            accept: Some(accept),
            lease,
        }
    }

    /// The loopback port the proxy listens on; it stays the same across [`Mode::Refuse`].
    pub fn port(&self) -> u16 {
        self.lease.port()
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port()))
    }

    /// `redis://127.0.0.1:port`, for client libraries.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// Where connections are forwarded.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// The mode in force.
    pub fn mode(&self) -> Mode {
        self.shared.control.lock().mode
    }

    /// Switches the fault, for open connections and new ones alike (see [`Mode`] for what a
    /// client observes in each).
    ///
    /// Returns once the switch is in force: after [`Mode::Reset`] and [`Mode::Refuse`] no
    /// connection is open any more, after `Refuse` the port refuses connects, and after leaving
    /// `Refuse` it accepts them again.
    ///
    /// # Panics
    ///
    /// When leaving `Refuse` and the port stays taken by another process for 5 s, or when
    /// connections do not close within 10 s.
    pub fn set_mode(&self, mode: Mode) {
        let epoch = {
            let mut control = self.shared.control.lock();
            control.mode = mode;
            control.epoch += 1;
            for link in control.links.values() {
                link.set_mode(mode);
            }
            self.shared.changed.notify_all();
            control.epoch
        };
        if mode == Mode::Refuse {
            self.wake_accept();
        }
        self.settle(epoch, mode);
    }

    /// Client connections open now. A connection a client just closed may count for a few more
    /// milliseconds, until the proxy has closed its side.
    pub fn connections(&self) -> usize {
        self.shared.control.lock().links.len()
    }

    /// Bytes forwarded so far, to the upstream and to clients together.
    pub fn bytes_forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::Relaxed)
    }

    /// Waits until the switch to `mode` (the change numbered `epoch`) is in force, or a later
    /// change superseded it.
    fn settle(&self, epoch: u64, mode: Mode) {
        let deadline = Deadline::after(SETTLE_TIMEOUT);
        let mut control = self.shared.control.lock();
        loop {
            if control.epoch != epoch {
                return;
            }
            let failed = control
                .bind_failure
                .as_ref()
                .filter(|(failed, _)| *failed == epoch);
            if let Some((_, error)) = failed {
                panic!(
                    "fault proxy cannot listen on 127.0.0.1:{} again: {error}",
                    self.port()
                );
            }
            let settled = match mode {
                Mode::Reset => control.links.is_empty() && control.listening,
                Mode::Refuse => control.links.is_empty() && !control.listening,
                _ => control.listening,
            };
            if settled {
                return;
            }
            if deadline.expired() {
                panic!(
                    "fault proxy on 127.0.0.1:{} did not switch to {mode:?} within {SETTLE_TIMEOUT:?} \
                     ({} connections open, listening: {})",
                    self.port(),
                    control.links.len(),
                    control.listening
                );
            }
            self.shared
                .changed
                .wait_for(&mut control, deadline.remaining());
        }
    }

    /// Connects to the proxy's own port so that a blocked `accept` returns and the accept thread
    /// sees the new state. Fails harmlessly when nothing listens.
    fn wake_accept(&self) {
        let _ = TcpStream::connect_timeout(&self.addr(), WAKE_TIMEOUT);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        {
            let mut control = self.shared.control.lock();
            control.stopping = true;
            for link in control.links.values() {
                link.close(Close::Fin);
            }
            self.shared.changed.notify_all();
        }
        self.wake_accept();
        // A thread that panicked has nothing left to clean up: its error is not worth a second
        // panic here.
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        // The accept thread is gone, so no new link thread can appear after this.
        let threads = std::mem::take(&mut self.shared.control.lock().threads);
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// Binds a leased free loopback port, trying fresh ports when another process takes one first.
fn bind_fresh_port() -> (PortLease, TcpListener) {
    for _ in 0..BIND_ATTEMPTS {
        let lease = PortLease::acquire(false);
        match TcpListener::bind((Ipv4Addr::LOCALHOST, lease.port())) {
            Ok(listener) => return (lease, listener),
            Err(error) if error.kind() == io::ErrorKind::AddrInUse => continue,
            Err(error) => panic!(
                "fault proxy cannot listen on 127.0.0.1:{}: {error}",
                lease.port()
            ),
        }
    }
    panic!("fault proxy could not bind a free port in {BIND_ATTEMPTS} attempts");
}
