use std::time::Duration;

/// A point in time: whole microseconds since the Unix epoch.
///
/// Wall-clock based so that fixed windows align to the epoch (a minute resets at :00) and so that
/// the Redis twin, which reads `TIME` on the server, uses the same unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The epoch itself.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// The last representable instant; computations that would go past it saturate here.
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    /// A timestamp `micros` microseconds after the epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Timestamp(micros)
    }

    /// Microseconds since the epoch.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// This timestamp plus `d` (saturating, truncated to whole microseconds).
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(
            self.0
                .saturating_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
        )
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}
