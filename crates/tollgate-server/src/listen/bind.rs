//! Binding a listener's address, with a backlog sized for many clients connecting at once.

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// How many connections the kernel may hold for a listener before it is accepting them (it
/// caps this at `net.core.somaxconn`). std's 128 overflowed when a few hundred clients
/// connected at once, and a client whose SYN was dropped waited a second to try again.
const LISTEN_BACKLOG: u32 = 4096;

/// An address that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} for {what}")]
pub struct BindError {
    /// The address.
    pub addr: SocketAddr,
    /// What was to listen there (`HTTP`, `gRPC`, `the admin API`).
    pub what: String,
    /// Why not.
    #[source]
    pub source: std::io::Error,
}

/// Binds `addr` for `what`; the error names both.
pub fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, BindError> {
    let bound = || {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        }?;
        // As std's bind does: a restarted server may take its port back at once.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(LISTEN_BACKLOG)
    };
    bound().map_err(|source| BindError {
        addr,
        what: what.to_owned(),
        source,
    })
}
