//! Free loopback ports, handed out at most once at a time within this process.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpListener};

use parking_lot::Mutex;

/// Offset of a cluster node's bus port from its client port (fixed by Redis).
pub(crate) const CLUSTER_BUS_OFFSET: u16 = 10_000;

/// Node ports stay below this so that `port + 10000` is still a valid port.
const MAX_NODE_PORT: u16 = u16::MAX - CLUSTER_BUS_OFFSET;

/// How many candidate ports to try before giving up.
const PICK_ATTEMPTS: usize = 1_000;

/// Ports (client and cluster bus) leased to live servers of this process. A port stays leased while
/// its server is stopped, so a later `restart` can have it back.
static LEASED: Mutex<BTreeSet<u16>> = parking_lot::const_mutex(BTreeSet::new());

/// A port (and, for a cluster node, its bus port) reserved for one server until dropped.
#[derive(Debug)]
pub(crate) struct PortLease {
    port: u16,
    bus: bool,
}

impl PortLease {
    /// Picks a port that the kernel reports free and no other lease of this process holds; with
    /// `bus`, `port + 10000` must be free and unleased too.
    ///
    /// Another process can still take the port before the server binds it: callers retry on
    /// "address in use".
    pub(crate) fn acquire(bus: bool) -> Self {
        let mut leased = LEASED.lock();
        for _ in 0..PICK_ATTEMPTS {
            let Some(port) = kernel_free_port() else {
                continue;
            };
            if port >= MAX_NODE_PORT || leased.contains(&port) {
                continue;
            }
            let bus_port = port + CLUSTER_BUS_OFFSET;
            if bus && (leased.contains(&bus_port) || !is_free(bus_port)) {
                continue;
            }
            leased.insert(port);
            if bus {
                leased.insert(bus_port);
            }
            return Self { port, bus };
        }
        panic!("no free loopback port below {MAX_NODE_PORT} after {PICK_ATTEMPTS} attempts");
    }

    /// The leased client port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PortLease {
    fn drop(&mut self) {
        let mut leased = LEASED.lock();
        leased.remove(&self.port);
        if self.bus {
            leased.remove(&(self.port + CLUSTER_BUS_OFFSET));
        }
    }
}

/// A port the kernel picks for `127.0.0.1:0`, released again at once.
fn kernel_free_port() -> Option<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).ok()?;
    listener.local_addr().ok().map(|addr| addr.port())
}

fn is_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_distinct_below_the_limit_and_released_on_drop() {
        let leases: Vec<PortLease> = (0..20).map(|i| PortLease::acquire(i % 2 == 0)).collect();
        let mut taken = BTreeSet::new();
        for lease in &leases {
            assert!(lease.port() < MAX_NODE_PORT);
            assert!(
                taken.insert(lease.port()),
                "port {} handed out twice",
                lease.port()
            );
            if lease.bus {
                let bus = lease.port() + CLUSTER_BUS_OFFSET;
                assert!(taken.insert(bus), "bus port {bus} overlaps another lease");
            }
        }
        let first = leases[0].port();
        assert!(LEASED.lock().contains(&first));
        drop(leases);
        assert!(!LEASED.lock().contains(&first));
        assert!(!LEASED.lock().contains(&(first + CLUSTER_BUS_OFFSET)));
    }
}
