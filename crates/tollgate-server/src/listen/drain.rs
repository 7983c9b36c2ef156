//! What a shutdown's drain waits for, counted: the connections each listener still has open and
//! the HTTP requests still in flight, so that a drain cut short (`serve`'s `--shutdown-timeout`,
//! or a second signal) can say what it cut.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::idle_deadline::Progress;
use super::watched::{Watch, Watched};

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Everything finished within the timeout.
    Complete,
    /// The timeout ran out first.
    TimedOut,
    /// A second signal came first.
    SecondSignal,
}

/// How many of something are open now: each [`Held`] counts one until it is dropped.
#[derive(Debug, Clone, Default)]
pub struct Gauge(Arc<AtomicUsize>);

impl Gauge {
    /// Counts one more until the returned guard is dropped.
    pub fn hold(&self) -> Held {
        self.0.fetch_add(1, Ordering::Relaxed);
        Held(self.0.clone())
    }

    /// How many are held now.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// One counted in a [`Gauge`].
#[derive(Debug)]
pub struct Held(Arc<AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What one listener has open.
#[derive(Debug, Clone, Default)]
pub struct Open {
    /// Connections accepted and not closed yet.
    pub connections: Gauge,
    /// Requests whose answer is not ready yet (counted on the HTTP listeners only).
    pub requests: InFlight,
}

/// The HTTP requests in flight on a listener's connections, summed when asked from each open
/// connection's own count ([`Progress`]): a request pays for no counter shared between threads,
/// only a connection for its entry here.
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<parking_lot::Mutex<Connections>>);

#[derive(Debug, Default)]
struct Connections {
    next: u64,
    open: std::collections::HashMap<u64, Progress>,
}

impl InFlight {
    /// Counts `progress`'s requests until the returned guard is dropped (the connection ended).
    pub fn track(&self, progress: &Progress) -> Tracked {
        let mut connections = self.connections();
        let id = connections.next;
        connections.next += 1;
        connections.open.insert(id, progress.clone());
        Tracked(self.clone(), id)
    }

    /// How many requests are in flight now.
    pub fn get(&self) -> usize {
        self.connections()
            .open
            .values()
            .map(Progress::in_flight)
            .sum()
    }

    fn connections(&self) -> parking_lot::MutexGuard<'_, Connections> {
        self.0.lock()
    }
}

/// A connection counted in an [`InFlight`].
#[derive(Debug)]
pub struct Tracked(InFlight, u64);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.connections().open.remove(&self.1);
    }
}

/// `io`, counted in a [`Gauge`] for as long as the server keeps it.
pub type Counted<IO> = Watched<IO, Held>;

impl<IO> Counted<IO> {
    /// `io`, counted in `gauge` until it is dropped.
    pub fn new(io: IO, gauge: &Gauge) -> Self {
        Watched::around(io, gauge.hold())
    }
}

/// A counted connection passes everything through.
impl Watch for Held {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_counts_what_is_held() {
        let gauge = Gauge::default();
        let one = gauge.hold();
        let two = gauge.clone().hold();
        assert_eq!(gauge.get(), 2);
        drop(one);
        assert_eq!(gauge.get(), 1);
        drop(two);
        assert_eq!(gauge.get(), 0);
    }

    #[test]
    fn in_flight_sums_the_open_connections_requests() {
        let in_flight = InFlight::default();
        let (a, b) = (Progress::new(), Progress::new());
        let tracked = (in_flight.track(&a), in_flight.track(&b));
        let requests = (a.request(), b.request(), b.request());
        assert_eq!(in_flight.get(), 3);
        drop(requests.2);
        assert_eq!(in_flight.get(), 2);
        // A connection that ended counts no more, whatever it held.
        drop(tracked.1);
        assert_eq!(in_flight.get(), 1);
        drop(tracked.0);
        assert_eq!(in_flight.get(), 0);
    }
}
