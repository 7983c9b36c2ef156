//! State shared by the [`FaultProxy`](super::FaultProxy) handle, its accept thread and its link
//! threads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use super::link::{Link, Owner};
use super::mode::Mode;

/// One proxy's state.
///
/// Lock order: `control` before a link's own lock, never the other way round.
#[derive(Debug)]
pub(super) struct Shared {
    /// Where every accepted connection is forwarded.
    pub(super) upstream: SocketAddr,
    /// The loopback port the proxy listens on, kept across `Refuse`.
    pub(super) port: u16,
    pub(super) control: Mutex<Control>,
    /// Signalled on every change of `control` that someone may wait for.
    pub(super) changed: Condvar,
    /// Bytes written to clients and to the upstream, both directions together.
    pub(super) forwarded: AtomicU64,
}

/// The mutable part of [`Shared`].
#[derive(Debug)]
pub(super) struct Control {
    pub(super) mode: Mode,
    /// Counts mode changes, so a waiter can tell that a newer change superseded its own.
    pub(super) epoch: u64,
    /// Set once by `Drop`: no new connection, every thread on its way out.
    pub(super) stopping: bool,
    /// Whether the accept thread holds a bound listening socket.
    pub(super) listening: bool,
    /// The epoch in which binding the port again failed, and why.
    pub(super) bind_failure: Option<(u64, String)>,
    /// Open client connections by id; a link removes itself when its last thread ends.
    pub(super) links: BTreeMap<u64, Arc<Link>>,
    pub(super) next_link: u64,
    /// Link threads not joined yet (finished ones are dropped as new ones arrive).
    pub(super) threads: Vec<JoinHandle<()>>,
}

impl Shared {
    pub(super) fn new(upstream: SocketAddr, port: u16) -> Self {
        Self {
            upstream,
            port,
            control: Mutex::new(Control {
                mode: Mode::Pass,
                epoch: 0,
                stopping: false,
                listening: true,
                bind_failure: None,
                links: BTreeMap::new(),
                next_link: 0,
                threads: Vec::new(),
            }),
            changed: Condvar::new(),
            forwarded: AtomicU64::new(0),
        }
    }
}

impl Owner for Shared {
    fn port(&self) -> u16 {
        self.port
    }

    fn forwarded(&self, bytes: u64) {
        self.forwarded.fetch_add(bytes, Ordering::Relaxed);
    }

    fn forget(&self, link: u64) {
        let removed = self.control.lock().links.remove(&link);
        self.changed.notify_all();
        drop(removed);
    }
}
