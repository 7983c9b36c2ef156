//! The `now` a DECIDE call is made at, and the guard that keeps a late call from writing.
//!
//! Decisions use the Redis server's `TIME`, so that replicas agree. A call that Redis runs long
//! after the caller gave up (the server was paused, a partition healed and delivered what the
//! socket held) would still charge: the caller was answered by its failure posture, and a
//! `closed` limit would have refused the request and charged it all the same. So each call
//! carries the latest instant, in the server's clock, at which it may still write: the store's
//! deadline counted from when the call is sent (a batch: from when its longest-waiting decision
//! was queued), plus [`LATE_SLACK`]. Run later, the script writes nothing and answers an error.
//!
//! The server's clock is learnt from the `now` every DECIDE reply carries, against this
//! process's monotonic clock (see [`ServerClock`]). Until the first reply (and after a call was refused as late while its caller still
//! waited, which means the estimate went wrong, say the server's clock stepped) calls carry no
//! guard, and the next reply sets it again.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use crate::clock::SharedClock;
use crate::store::{Failure, StoreError};

/// How long after its caller's deadline a call may still write. Longer than any reply's trip
/// over a working network; shorter than the pauses that leave calls stranded (a failover, a
/// `CLIENT PAUSE`, a stopped process).
pub const LATE_SLACK: Duration = Duration::from_millis(250);

/// The text of the script's refusal of a late call.
const LATE_MARK: &str = "tollgate: late";

/// Where a DECIDE call's `now` comes from.
#[derive(Debug, Clone)]
pub(super) enum NowSource {
    /// Tests: this clock's time, passed to the script (no guard: the test owns time).
    Pinned(SharedClock),
    /// The server's `TIME`, guarded.
    Server(std::sync::Arc<ServerClock>),
}

impl NowSource {
    /// The argument for a call sent now.
    #[cfg(test)]
    pub fn argument(&self) -> NowArg {
        self.argument_since(real_now())
    }

    /// The argument for a call whose decisions began waiting at `since` (a batch: when its
    /// first decision was queued), so that time spent queued counts against the allowance.
    pub fn argument_since(&self, since: Instant) -> NowArg {
        match self {
            NowSource::Pinned(clock) => NowArg::Micros(clock.now().as_micros()),
            NowSource::Server(server) => server
                .not_after(since)
                .map_or(NowArg::Server, NowArg::NotAfter),
        }
    }

    /// Takes in a reply's `now` (server microseconds).
    pub fn learn(&self, server_now_micros: i64) {
        if let NowSource::Server(server) = self {
            server.learn(server_now_micros);
        }
    }

    /// Takes in a failed call: a late refusal received while waiting means the estimate of the
    /// server's clock is wrong, and it is dropped.
    pub fn failed(&self, error: &StoreError) {
        if let (NowSource::Server(server), StoreError::Unavailable(Failure::Redis(answer))) =
            (self, error)
            && answer.says(LATE_MARK)
        {
            server.forget();
        }
    }
}

/// A DECIDE call's `now` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NowArg {
    /// This instant, in microseconds (tests).
    Micros(u64),
    /// The server's `TIME`, unguarded: `""`.
    Server,
    /// The server's `TIME`, and nothing written after this server instant: `"<micros"`.
    NotAfter(i64),
}

impl redis::ToRedisArgs for NowArg {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self {
            NowArg::Micros(micros) => out.write_arg_fmt(micros),
            NowArg::Server => out.write_arg(b""),
            NowArg::NotAfter(micros) => out.write_arg_fmt(format_args!("<{micros}")),
        }
    }
}

/// The estimate of one Redis deployment's clock.
///
/// Each reply gives `server now - local now`, short of the true offset by the reply's trip;
/// the estimate is the largest of them over the last one to two minutes. So it tracks the
/// fastest clock among a cluster's nodes (a call to a node whose clock runs ahead is never
/// refused for it; one to a node behind it gets that much more leeway), and a clock drifting
/// slower is followed within two minutes.
#[derive(Debug)]
pub(super) struct ServerClock {
    /// The largest offset (server microseconds minus local monotonic microseconds) seen in the
    /// previous window and in the current one; [`UNKNOWN`] when none.
    previous: AtomicI64,
    current: AtomicI64,
    /// When the current window began (local microseconds).
    window_start: AtomicI64,
    /// Local monotonic origin.
    origin: Instant,
    /// The caller's deadline plus the slack, in microseconds.
    allowance: i64,
}

const UNKNOWN: i64 = i64::MIN;

/// Real monotonic time: Redis's clock runs in real time, so a paused or driven test clock
/// (tokio's, or `tollgate::clock`'s) would make every call look late, or never.
#[allow(clippy::disallowed_methods)]
pub(super) fn real_now() -> Instant {
    Instant::now()
}

/// How long one window of offsets lasts, in microseconds.
const WINDOW_MICROS: i64 = 60_000_000;

impl ServerClock {
    /// A clock for calls whose callers wait `deadline`.
    pub fn new(deadline: Duration) -> Self {
        let allowance = (deadline + LATE_SLACK).as_micros();
        ServerClock {
            previous: AtomicI64::new(UNKNOWN),
            current: AtomicI64::new(UNKNOWN),
            window_start: AtomicI64::new(0),
            origin: real_now(),
            allowance: i64::try_from(allowance).unwrap_or(i64::MAX / 2),
        }
    }

    fn local_micros(&self) -> i64 {
        self.micros_at(real_now())
    }

    fn micros_at(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.origin).as_micros()).unwrap_or(i64::MAX / 2)
    }

    /// The server instant after which a call whose wait began at `since` must not write;
    /// `None` while unknown.
    fn not_after(&self, since: Instant) -> Option<i64> {
        let offset = self
            .previous
            .load(Ordering::Relaxed)
            .max(self.current.load(Ordering::Relaxed));
        (offset != UNKNOWN).then(|| {
            self.micros_at(since)
                .saturating_add(offset)
                .saturating_add(self.allowance)
        })
    }

    fn learn(&self, server_now_micros: i64) {
        let local = self.local_micros();
        let offset = server_now_micros.saturating_sub(local).max(UNKNOWN + 1);
        let start = self.window_start.load(Ordering::Relaxed);
        let since = local.saturating_sub(start);
        if since >= WINDOW_MICROS
            && self
                .window_start
                .compare_exchange(start, local, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let ended = self.current.swap(offset, Ordering::Relaxed);
            // After a quiet spell the window that ended is older than one window: not kept.
            let kept = if since < 2 * WINDOW_MICROS {
                ended
            } else {
                UNKNOWN
            };
            self.previous.store(kept, Ordering::Relaxed);
            return;
        }
        // Most replies change nothing: read before writing the shared line.
        if offset > self.current.load(Ordering::Relaxed) {
            self.current.fetch_max(offset, Ordering::Relaxed);
        }
    }

    fn forget(&self) {
        self.previous.store(UNKNOWN, Ordering::Relaxed);
        self.current.store(UNKNOWN, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RedisFailure;

    #[test]
    fn a_call_may_write_until_its_deadline_and_the_slack_in_the_servers_clock() {
        let clock = ServerClock::new(Duration::from_millis(10));
        assert_eq!(
            clock.not_after(real_now()),
            None,
            "unknown until a reply says"
        );
        let server_now = 1_700_000_000_000_000;
        clock.learn(server_now);
        let limit = clock.not_after(real_now()).unwrap();
        let allowance =
            i64::try_from((Duration::from_millis(10) + LATE_SLACK).as_micros()).unwrap();
        // Between the learning and the reading, a little local time passes.
        assert!(
            (server_now + allowance..server_now + allowance + 100_000).contains(&limit),
            "{limit}"
        );
        clock.forget();
        assert_eq!(clock.not_after(real_now()), None);
    }

    /// Replies from nodes whose clocks differ: the estimate follows the one ahead, so a call to
    /// it is never refused for the difference.
    #[test]
    fn the_estimate_follows_the_clock_ahead() {
        let clock = ServerClock::new(Duration::ZERO);
        let base = 1_700_000_000_000_000;
        clock.learn(base + 300_000);
        clock.learn(base);
        let limit = clock.not_after(real_now()).unwrap();
        let slack = i64::try_from(LATE_SLACK.as_micros()).unwrap();
        assert!(limit >= base + 300_000 + slack, "{limit}");
    }

    /// A late refusal received while the caller still waited means the estimate is wrong: it
    /// is dropped (calls go unguarded until the next reply); other failures keep it.
    #[test]
    fn a_late_refusal_drops_the_estimate() {
        let clock = std::sync::Arc::new(ServerClock::new(Duration::from_millis(10)));
        let source = NowSource::Server(clock.clone());
        source.learn(1_700_000_000_000_000);
        let failed = |message: &str| {
            let answer = RedisFailure::Script(message.to_owned());
            StoreError::Unavailable(Failure::Redis(answer))
        };
        source.failed(&failed("connection refused"));
        assert!(matches!(source.argument(), NowArg::NotAfter(_)));
        source.failed(&failed(
            "ERR tollgate: late: the call reached Redis after its deadline",
        ));
        assert_eq!(source.argument(), NowArg::Server);
        source.learn(1_700_000_000_000_000);
        assert!(matches!(source.argument(), NowArg::NotAfter(_)));
    }

    #[test]
    fn the_argument_says_which_clock_and_guard() {
        let written = |arg: NowArg| {
            let args = redis::ToRedisArgs::to_redis_args(&arg);
            String::from_utf8(args[0].clone()).unwrap()
        };
        assert_eq!(written(NowArg::Server), "");
        assert_eq!(written(NowArg::Micros(42)), "42");
        assert_eq!(
            written(NowArg::NotAfter(1_700_000_000_250_000)),
            "<1700000000250000"
        );
    }
}
