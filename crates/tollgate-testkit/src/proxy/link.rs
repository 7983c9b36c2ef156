//! One proxied connection: a client socket, its upstream socket and four threads.
//!
//! Each direction has a reader thread, which reads as fast as its source sends (until
//! [`QUEUE_LIMIT`] bytes wait), and a writer thread, which forwards what is queued when the mode
//! lets it. Reading apart from writing is what lets the proxy keep reading in a blackhole, stamp
//! each chunk on arrival so that latency is one-way latency rather than a queue that grows, and
//! hold a cut reply without losing a byte.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use rustix::net::sockopt::set_socket_linger;

use super::mode::Mode;
use crate::deadline::Deadline;

/// The most one read takes from a socket.
const CHUNK: usize = 16 * 1024;

/// Bytes that may wait in one direction before its reader stops reading (and the sender's own
/// buffers fill up, as TCP flow control would make them).
const QUEUE_LIMIT: usize = 4 * 1024 * 1024;

/// How long one blocked write waits before the writer checks whether its link is closing.
const WRITE_POLL: Duration = Duration::from_millis(50);

/// What a link tells the proxy that holds it (the proxy's shared state, which imports this
/// module for its map of links: the dependency runs one way).
pub(super) trait Owner: Send + Sync + 'static {
    /// The port the proxy listens on, for the names of the link's threads.
    fn port(&self) -> u16;
    /// Counts `bytes` forwarded, in either direction.
    fn forwarded(&self, bytes: u64);
    /// Removes the link `id`, whose threads have all ended; dropping it closes its sockets.
    fn forget(&self, id: u64);
}

/// How a link's sockets are closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Close {
    /// `SO_LINGER` 0: both peers get a TCP RST.
    Reset,
    /// A FIN each way: both peers read end-of-file.
    Fin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToUpstream,
    ToClient,
}

/// What a reader saw, stamped with when it saw it.
#[derive(Debug)]
struct Item {
    /// Started when the item was read: its `elapsed()` is the item's age.
    received: Deadline,
    event: Event,
}

#[derive(Debug)]
enum Event {
    Data(Vec<u8>),
    /// The source closed its side: forwarded as a FIN on the other side.
    Eof,
    /// Reading the source failed (reset by the peer): forwarded as a reset of both sides.
    Failed,
}

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Item>,
    /// Bytes of data in `items`.
    bytes: usize,
}

/// What a writer does next.
enum Next {
    Forward(Item),
    /// Wait for a change, or at most this long (an item becomes old enough).
    Wait(Option<Duration>),
}

#[derive(Debug)]
struct LinkState {
    mode: Mode,
    /// Reply bytes still allowed through in `CutReplies`.
    reply_budget: usize,
    closing: bool,
    to_upstream: Queue,
    to_client: Queue,
    /// Threads holding this link, including the one setting it up.
    threads: usize,
}

/// One client connection and its upstream connection.
#[derive(Debug)]
pub(super) struct Link {
    id: u64,
    client: TcpStream,
    upstream: TcpStream,
    state: Mutex<LinkState>,
    /// Signalled on every change of `state`.
    changed: Condvar,
}

impl Link {
    pub(super) fn new(id: u64, client: TcpStream, upstream: TcpStream, mode: Mode) -> Self {
        let reply_budget = match mode {
            Mode::CutReplies { after_bytes } => after_bytes,
            _ => 0,
        };
        Self {
            id,
            client,
            upstream,
            state: Mutex::new(LinkState {
                mode,
                reply_budget,
                closing: false,
                to_upstream: Queue::default(),
                to_client: Queue::default(),
                threads: 0,
            }),
            changed: Condvar::new(),
        }
    }

    /// Applies a new proxy mode; `Reset` and `Refuse` close the link.
    pub(super) fn set_mode(&self, mode: Mode) {
        match mode {
            Mode::Reset => self.close(Close::Reset),
            Mode::Refuse => self.close(Close::Fin),
            _ => {
                let mut state = self.state.lock();
                state.mode = mode;
                if let Mode::CutReplies { after_bytes } = mode {
                    state.reply_budget = after_bytes;
                }
                drop(state);
                self.changed.notify_all();
            }
        }
    }

    /// Starts closing both sockets and tells the threads to end; the sockets are released when the
    /// last thread lets go of the link. Does nothing if the link is already closing.
    pub(super) fn close(&self, how: Close) {
        {
            let mut state = self.state.lock();
            if state.closing {
                return;
            }
            state.closing = true;
        }
        for socket in [&self.client, &self.upstream] {
            // Errors mean the socket is already dead, which is what closing wants.
            match how {
                Close::Reset => {
                    // With a zero linger the last close sends RST instead of FIN. Shutting down
                    // only reading wakes the reader blocked on the socket without sending anything.
                    let _ = set_socket_linger(socket, Some(Duration::ZERO));
                    let _ = socket.shutdown(Shutdown::Read);
                }
                Close::Fin => {
                    let _ = socket.shutdown(Shutdown::Both);
                }
            }
        }
        self.changed.notify_all();
    }

    fn source(&self, direction: Direction) -> &TcpStream {
        match direction {
            Direction::ToUpstream => &self.client,
            Direction::ToClient => &self.upstream,
        }
    }

    fn destination(&self, direction: Direction) -> &TcpStream {
        match direction {
            Direction::ToUpstream => &self.upstream,
            Direction::ToClient => &self.client,
        }
    }

    /// Reads `direction`'s source into its queue until end-of-file, an error or the link closes.
    fn read_loop(&self, direction: Direction) {
        let mut source = self.source(direction);
        let mut buffer = vec![0; CHUNK];
        loop {
            let event = match source.read(&mut buffer) {
                Ok(0) => Event::Eof,
                Ok(n) => Event::Data(buffer[..n].to_vec()),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => Event::Failed,
            };
            let received = Deadline::after(Duration::ZERO);
            let last = !matches!(event, Event::Data(_));
            let mut state = self.state.lock();
            if state.closing {
                return;
            }
            state.queue(direction).push(Item { received, event });
            self.changed.notify_all();
            if last {
                return;
            }
            while state.queue(direction).bytes >= QUEUE_LIMIT && !state.closing {
                self.changed.wait(&mut state);
            }
        }
    }

    /// Forwards `direction`'s queue to its destination as the mode allows, until end-of-file, an
    /// error or the link closes.
    fn write_loop(&self, direction: Direction, owner: &impl Owner) {
        let destination = self.destination(direction);
        loop {
            let item = {
                let mut state = self.state.lock();
                loop {
                    if state.closing {
                        return;
                    }
                    match state.next(direction) {
                        Next::Forward(item) => break item,
                        Next::Wait(None) => self.changed.wait(&mut state),
                        Next::Wait(Some(timeout)) => {
                            self.changed.wait_for(&mut state, timeout);
                        }
                    }
                }
            };
            // The queue shrank: its reader may be waiting for room.
            self.changed.notify_all();
            match item.event {
                Event::Data(bytes) => {
                    if self.write_all(destination, &bytes, owner).is_err() {
                        self.close(Close::Reset);
                        return;
                    }
                }
                Event::Eof => {
                    let _ = destination.shutdown(Shutdown::Write);
                    return;
                }
                Event::Failed => {
                    self.close(Close::Reset);
                    return;
                }
            }
        }
    }

    /// Writes all of `bytes`, giving up when the link starts closing while the peer is not reading.
    fn write_all(
        &self,
        mut destination: &TcpStream,
        bytes: &[u8],
        owner: &impl Owner,
    ) -> io::Result<()> {
        let mut rest = bytes;
        while !rest.is_empty() {
            match destination.write(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    rest = &rest[n..];
                    owner.forwarded(n as u64);
                }
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    if self.state.lock().closing {
                        return Err(error);
                    }
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
}

impl LinkState {
    fn queue(&mut self, direction: Direction) -> &mut Queue {
        match direction {
            Direction::ToUpstream => &mut self.to_upstream,
            Direction::ToClient => &mut self.to_client,
        }
    }

    /// What `direction`'s writer may do now under the current mode.
    fn next(&mut self, direction: Direction) -> Next {
        let mode = self.mode;
        let budget = &mut self.reply_budget;
        let queue = match direction {
            Direction::ToUpstream => &mut self.to_upstream,
            Direction::ToClient => &mut self.to_client,
        };
        let Some(front) = queue.items.front_mut() else {
            return Next::Wait(None);
        };
        match mode {
            Mode::Pass => {}
            Mode::Latency(delay) => {
                let age = front.received.elapsed();
                if age < delay {
                    return Next::Wait(Some(delay - age));
                }
            }
            // `Reset` and `Refuse` close the link; until the writer sees that, it forwards nothing.
            Mode::Blackhole | Mode::Reset | Mode::Refuse => return Next::Wait(None),
            Mode::CutReplies { .. } if direction == Direction::ToUpstream => {}
            Mode::CutReplies { .. } => match &mut front.event {
                Event::Data(bytes) if *budget == 0 || bytes.is_empty() => {
                    return Next::Wait(None);
                }
                Event::Data(bytes) if bytes.len() > *budget => {
                    let rest = bytes.split_off(*budget);
                    let head = std::mem::replace(bytes, rest);
                    queue.bytes -= head.len();
                    *budget = 0;
                    return Next::Forward(Item {
                        received: front.received,
                        event: Event::Data(head),
                    });
                }
                Event::Data(bytes) => *budget -= bytes.len(),
                // The reply never completes, so the client is not told that the upstream left.
                Event::Eof | Event::Failed => return Next::Wait(None),
            },
        }
        queue.pop().map_or(Next::Wait(None), Next::Forward)
    }
}

impl Queue {
    fn push(&mut self, item: Item) {
        if let Event::Data(bytes) = &item.event {
            self.bytes += bytes.len();
        }
        self.items.push_back(item);
    }

    fn pop(&mut self) -> Option<Item> {
        let item = self.items.pop_front()?;
        if let Event::Data(bytes) = &item.event {
            self.bytes -= bytes.len();
        }
        Some(item)
    }
}

/// Counts one thread holding a link; the last one to let go removes the link from the proxy, which
/// closes its sockets.
struct Holder<O: Owner> {
    link: Arc<Link>,
    owner: Arc<O>,
}

impl<O: Owner> Holder<O> {
    fn new(link: &Arc<Link>, owner: &Arc<O>) -> Self {
        link.state.lock().threads += 1;
        Self {
            link: Arc::clone(link),
            owner: Arc::clone(owner),
        }
    }
}

impl<O: Owner> Drop for Holder<O> {
    fn drop(&mut self) {
        let last = {
            let mut state = self.link.state.lock();
            state.threads -= 1;
            state.threads == 0
        };
        if last {
            self.owner.forget(self.link.id);
        }
    }
}

/// Starts the link's four threads, named `proxy-PORT-` and a role (`ru` reads towards the
/// upstream, `wu` writes to it, `rc` and `wc` likewise towards the client).
pub(super) fn spawn<O: Owner>(link: &Arc<Link>, owner: &Arc<O>) -> Vec<JoinHandle<()>> {
    // Holds the link while its threads start, so that one ending early does not remove it.
    let _setup = Holder::new(link, owner);
    let roles = [
        ("ru", Direction::ToUpstream, true),
        ("wu", Direction::ToUpstream, false),
        ("rc", Direction::ToClient, true),
        ("wc", Direction::ToClient, false),
    ];
    let mut handles = Vec::with_capacity(roles.len());
    for (role, direction, reads) in roles {
        let holder = Holder::new(link, owner);
        let spawned = thread::Builder::new()
            .name(format!("proxy-{}-{role}", owner.port()))
            .spawn(move || {
                if reads {
                    holder.link.read_loop(direction);
                } else {
                    holder.link.write_loop(direction, &*holder.owner);
                }
            });
        match spawned {
            Ok(handle) => handles.push(handle),
            // The unstarted closure is dropped with its holder; a link missing a thread is useless.
            Err(_) => link.close(Close::Reset),
        }
    }
    handles
}

/// Prepares an accepted or connected socket for forwarding.
pub(super) fn configure(socket: &TcpStream) -> io::Result<()> {
    // Chunks are forwarded as they come: Nagle's algorithm would add its own delays.
    socket.set_nodelay(true)?;
    socket.set_write_timeout(Some(WRITE_POLL))
}

/// Closes `socket` with a TCP RST.
pub(super) fn reset(socket: TcpStream) {
    let _ = set_socket_linger(&socket, Some(Duration::ZERO));
}
