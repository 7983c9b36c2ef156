//! A one-shot timer with microsecond resolution that a task awaits on its runtime's own thread.
//!
//! Tokio's timers tick in whole milliseconds. A thread of its own sleeping until each instant
//! is precise but costs two context switches and a wake-up of the runtime per instant, which
//! at tens of thousands of instants a second cost the generator more than the requests did. A
//! timerfd is a file the runtime's event loop already polls: it wakes the loop at the instant
//! (the kernel applies no timer slack to it), or is found ready the next time the loop looks.

use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::io::Errno;
use rustix::time::{
    Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
    timerfd_settime,
};
use tokio::io::unix::AsyncFd;

#[derive(Debug)]
pub struct Timer {
    fd: AsyncFd<OwnedFd>,
}

impl Timer {
    /// A disarmed timer on the monotonic clock (`Instant`'s); must be made inside a runtime.
    pub fn new() -> io::Result<Self> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // Deprecated because a `T` whose `as_raw_fd` may change or close its descriptor makes it
        // unsound; an `OwnedFd` always answers the one it owns, open until it is dropped, which
        // is what its unsafe replacement `register` asks (and the workspace forbids unsafe).
        #[allow(deprecated)]
        let fd = AsyncFd::new(fd)?;
        Ok(Timer { fd })
    }

    /// Waits `wait` from now; at once for zero.
    pub async fn sleep(&self, wait: Duration) -> io::Result<()> {
        if wait.is_zero() {
            return Ok(());
        }
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let spec = Itimerspec {
            it_interval: zero,
            it_value: Timespec {
                // A wait of more than 2^63 s is not one a caller makes: saturate.
                tv_sec: i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(wait.subsec_nanos()),
            },
        };
        timerfd_settime(self.fd.get_ref(), TimerfdTimerFlags::empty(), &spec)?;
        loop {
            let mut ready = self.fd.readable().await?;
            // The expiry count: 8 bytes, read to disarm the readiness.
            let mut expirations = [0u8; 8];
            let read = rustix::io::read(self.fd.get_ref(), &mut expirations);
            // A one-shot timer just read (or not yet due) is not readable until armed again;
            // forgetting the readiness saves the next wait a read that could only fail.
            ready.clear_ready();
            match read {
                Ok(_) => return Ok(()),
                Err(Errno::AGAIN) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::clock::now;

    #[tokio::test]
    async fn it_waits_at_least_as_long_as_asked_and_can_be_rearmed() {
        let timer = Timer::new().unwrap();
        for wait in [Duration::from_micros(300), Duration::from_millis(20)] {
            let start = now();
            timer.sleep(wait).await.unwrap();
            assert!(now() - start >= wait, "woke before {wait:?}");
        }
        // Zero returns at once, leaving nothing armed behind: the next wait is its own.
        timer.sleep(Duration::ZERO).await.unwrap();
        let start = now();
        timer.sleep(Duration::from_millis(5)).await.unwrap();
        assert!(now() - start >= Duration::from_millis(5));
    }
}
