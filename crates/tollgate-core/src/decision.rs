use std::time::Duration;

/// What the limit says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Admitted and charged.
    Allowed,
    /// Over the limit now; a request of the same cost succeeds after `retry_after`.
    Denied,
    /// The cost is larger than this limit can ever admit (above `limit` for windows, above
    /// `burst` for buckets): retrying will never help.
    CostExceedsCapacity,
}

/// The full answer for one request against one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Allowed, denied, or never admissible.
    pub verdict: Verdict,
    /// The configured limit (requests per period).
    pub limit: u64,
    /// Quota left after this request (after charging it when allowed), in whole cost units:
    /// what the window or log still admits, or the whole tokens (free queue units) of a bucket,
    /// which can exceed `limit` when `burst` does.
    pub remaining: u64,
    /// Time until the quota is fully available again: from `now + reset_after` on, the key
    /// behaves as if it had never been charged. Zero when it already does.
    pub reset_after: Duration,
    /// When denied: the earliest time after which a request of the same cost succeeds if nothing
    /// else is charged meanwhile (admitted at `now + retry_after`, denied 1µs earlier).
    /// `None` when allowed or when the cost exceeds capacity.
    pub retry_after: Option<Duration>,
    /// Leaky bucket only: how long the caller should hold an admitted request so that output
    /// leaves at the constant rate. Zero for every other algorithm and for denials.
    pub delay: Duration,
}

impl Decision {
    /// Whether the request was admitted.
    pub fn is_allowed(&self) -> bool {
        self.verdict == Verdict::Allowed
    }

    /// An admitted request, with no delay.
    pub(crate) fn allowed(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        Decision {
            verdict: Verdict::Allowed,
            limit,
            remaining,
            reset_after,
            retry_after: None,
            delay: Duration::ZERO,
        }
    }

    /// A denied request that a request of the same cost can retry after `retry_after`.
    pub(crate) fn denied(
        limit: u64,
        remaining: u64,
        reset_after: Duration,
        retry_after: Duration,
    ) -> Self {
        Decision {
            verdict: Verdict::Denied,
            limit,
            remaining,
            reset_after,
            retry_after: Some(retry_after),
            delay: Duration::ZERO,
        }
    }

    /// The same answer given `by` earlier than the instant it was decided at: the durations
    /// that run (a non-zero reset, the retry) are longer by `by`.
    pub(crate) fn postponed(mut self, by: Duration) -> Self {
        if !self.reset_after.is_zero() {
            self.reset_after += by;
        }
        self.retry_after = self.retry_after.map(|r| r + by);
        self
    }

    /// A request whose cost the limit can never admit.
    pub(crate) fn cost_exceeds_capacity(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        Decision {
            verdict: Verdict::CostExceedsCapacity,
            limit,
            remaining,
            reset_after,
            retry_after: None,
            delay: Duration::ZERO,
        }
    }
}
