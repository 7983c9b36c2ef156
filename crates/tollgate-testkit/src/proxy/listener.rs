//! The accept thread: listens while the mode is not `Refuse`, and turns each accepted client into a
//! [`Link`] to the upstream.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::link::{self, Link};
use super::mode::Mode;
use super::shared::{Control, Shared};
use crate::deadline::Deadline;

/// How long connecting to the upstream may take before the client is reset.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long binding the port again may keep failing (another process took it) before giving up.
const REBIND_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause between tries at binding, and after a failed `accept` (out of file descriptors).
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Runs the accept thread until the proxy stops, starting with the already bound `listener`.
pub(super) fn run(shared: &Arc<Shared>, listener: TcpListener) {
    let mut listener = Some(listener);
    loop {
        if let Some(bound) = listener.take() {
            serve(shared, &bound);
            drop(bound);
            let mut control = shared.control.lock();
            control.listening = false;
            shared.changed.notify_all();
        }
        if !wait_to_listen(shared) {
            return;
        }
        listener = bind_again(shared);
    }
}

/// Accepts clients until the mode turns to `Refuse` or the proxy stops.
fn serve(shared: &Arc<Shared>, listener: &TcpListener) {
    for incoming in listener.incoming() {
        match incoming {
            Ok(client) => {
                if !admit(shared, client) {
                    return;
                }
            }
            Err(_) => {
                if refusing(shared) {
                    return;
                }
                thread::sleep(RETRY_PAUSE);
            }
        }
    }
}

/// What to do with a client that was just accepted.
enum Admission {
    Forward,
    Reset,
    /// Close it and stop listening (`Refuse`, or the proxy stops).
    StopListening,
}

/// Handles one accepted client; `false` when the listener must close.
fn admit(shared: &Arc<Shared>, client: TcpStream) -> bool {
    let first = admission(&shared.control.lock());
    match first {
        Admission::StopListening => return false,
        Admission::Reset => {
            link::reset(client);
            return true;
        }
        Admission::Forward => {}
    }
    let upstream = TcpStream::connect_timeout(&shared.upstream, UPSTREAM_CONNECT_TIMEOUT)
        .and_then(|upstream| link::configure(&upstream).map(|()| upstream));
    let Ok(upstream) = upstream else {
        // The closest a proxy that already accepted can come to the refused connect the client
        // would have had without it.
        link::reset(client);
        return true;
    };
    if link::configure(&client).is_err() {
        return true;
    }
    let link = {
        let mut control = shared.control.lock();
        // The mode may have changed while connecting to the upstream.
        match admission(&control) {
            Admission::StopListening => return false,
            Admission::Reset => {
                drop(control);
                link::reset(client);
                return true;
            }
            Admission::Forward => {}
        }
        let id = control.next_link;
        control.next_link += 1;
        let link = Arc::new(Link::new(id, client, upstream, control.mode));
        control.links.insert(id, Arc::clone(&link));
        link
    };
    let handles = link::spawn(&link, shared);
    let mut control = shared.control.lock();
    control.threads.retain(|thread| !thread.is_finished());
    control.threads.extend(handles);
    true
}

fn admission(control: &Control) -> Admission {
    match control.mode {
        _ if control.stopping => Admission::StopListening,
        Mode::Refuse => Admission::StopListening,
        Mode::Reset => Admission::Reset,
        _ => Admission::Forward,
    }
}

/// Whether the listener must close: the mode is `Refuse` or the proxy stops.
fn refusing(shared: &Shared) -> bool {
    let control = shared.control.lock();
    control.stopping || control.mode == Mode::Refuse
}

/// Waits until the proxy may listen again: the mode left `Refuse` and, if binding failed, the mode
/// changed since. `false` when the proxy stops instead.
fn wait_to_listen(shared: &Shared) -> bool {
    let mut control = shared.control.lock();
    loop {
        if control.stopping {
            return false;
        }
        let failed_now = control
            .bind_failure
            .as_ref()
            .is_some_and(|(epoch, _)| *epoch == control.epoch);
        if control.mode != Mode::Refuse && !failed_now {
            return true;
        }
        shared.changed.wait(&mut control);
    }
}

/// Binds the proxy's port again and reports it as listening; `None` when the mode went back to
/// `Refuse` meanwhile, or the port stayed taken (recorded for `set_mode` to report).
fn bind_again(shared: &Shared) -> Option<TcpListener> {
    let deadline = Deadline::after(REBIND_TIMEOUT);
    loop {
        match TcpListener::bind((Ipv4Addr::LOCALHOST, shared.port)) {
            Ok(listener) => {
                let mut control = shared.control.lock();
                // Checked under the lock: a later switch to `Refuse` wakes `accept` by connecting.
                if control.stopping || control.mode == Mode::Refuse {
                    return None;
                }
                control.listening = true;
                shared.changed.notify_all();
                return Some(listener);
            }
            Err(error) if deadline.expired() => {
                let mut control = shared.control.lock();
                let epoch = control.epoch;
                control.bind_failure = Some((epoch, error.to_string()));
                shared.changed.notify_all();
                return None;
            }
            Err(_) => {
                if refusing(shared) {
                    return None;
                }
                thread::sleep(RETRY_PAUSE);
            }
        }
    }
}
