//! Naive reference models, written for clarity rather than speed.
//!
//! Each model keeps the whole history it needs and recomputes everything from it; retry and
//! reset times are found by searching forward in time with the model's own admission test
//! (linearly where the search is short, by bisection where the test is obviously monotone in
//! time). Time only moves forward in these models. A model commits a request when it admits it.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tollgate_core::{Decision, Params, Verdict};

/// A reference model of one algorithm for one key.
pub trait Model {
    /// Decides, and charges the request if it is admitted.
    fn decide(&mut self, now: u64, cost: u64) -> Decision;
}

fn decision(
    params: &Params,
    verdict: Verdict,
    remaining: u64,
    reset_after: u64,
    retry_after: Option<u64>,
    delay: u64,
) -> Decision {
    Decision {
        verdict,
        limit: params.limit(),
        remaining,
        reset_after: Duration::from_micros(reset_after),
        retry_after: retry_after.map(Duration::from_micros),
        delay: Duration::from_micros(delay),
    }
}

/// The verdict for a request that fits (`fits`) or not, given the capacity.
fn verdict(params: &Params, cost: u64, fits: bool) -> Verdict {
    if cost > params.capacity() {
        Verdict::CostExceedsCapacity
    } else if fits {
        Verdict::Allowed
    } else {
        Verdict::Denied
    }
}

/// The least `t` in `lo..=hi` with `ok(t)`, for `ok` false-then-true on that range.
fn bisect(mut lo: u64, mut hi: u64, ok: impl Fn(u64) -> bool) -> u64 {
    assert!(
        ok(hi),
        "bisect: the upper bound {hi} does not satisfy the predicate"
    );
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) { hi = mid } else { lo = mid + 1 }
    }
    lo
}

/// Fixed window: a map from window index to the cost admitted in it.
pub struct FixedWindowModel {
    params: Params,
    admitted: HashMap<u64, u64>,
}

impl FixedWindowModel {
    pub fn new(params: Params) -> Self {
        FixedWindowModel {
            params,
            admitted: HashMap::new(),
        }
    }
}

impl Model for FixedWindowModel {
    fn decide(&mut self, now: u64, cost: u64) -> Decision {
        let period = self.params.period_micros();
        let window = now / period;
        let window_end = (window + 1) * period;
        let count = self.admitted.get(&window).copied().unwrap_or(0);
        let v = verdict(&self.params, cost, count + cost <= self.params.limit());
        let count_after = if v == Verdict::Allowed {
            count + cost
        } else {
            count
        };
        if v == Verdict::Allowed {
            self.admitted.insert(window, count_after);
        }
        let reset = if count_after == 0 {
            0
        } else {
            window_end - now
        };
        let retry = (v == Verdict::Denied).then_some(window_end - now);
        decision(
            &self.params,
            v,
            self.params.limit() - count_after,
            reset,
            retry,
            0,
        )
    }
}

/// Sliding log: every admitted event ever; use is the sum over the trailing period.
pub struct SlidingLogModel {
    params: Params,
    events: Vec<(u64, u64)>,
}

impl SlidingLogModel {
    pub fn new(params: Params) -> Self {
        SlidingLogModel {
            params,
            events: Vec::new(),
        }
    }

    /// Cost admitted in `(t - period, t]`.
    fn used(&self, t: u64) -> u64 {
        let period = self.params.period_micros();
        self.events
            .iter()
            .filter(|&&(at, _)| at <= t && t < at + period)
            .map(|&(_, c)| c)
            .sum()
    }
}

impl Model for SlidingLogModel {
    fn decide(&mut self, now: u64, cost: u64) -> Decision {
        let limit = self.params.limit();
        let period = self.params.period_micros();
        let used = self.used(now);
        let v = verdict(&self.params, cost, used + cost <= limit);
        let mut retry = None;
        if v == Verdict::Allowed {
            self.events.push((now, cost));
        } else if v == Verdict::Denied {
            // Use only drops when an event expires: try those instants in order.
            let mut expiries: Vec<u64> = self.events.iter().map(|&(at, _)| at + period).collect();
            expiries.sort_unstable();
            let at = expiries
                .into_iter()
                .find(|&t| t > now && self.used(t) + cost <= limit);
            retry = Some(at.expect("some expiry admits the request") - now);
        }
        let used_after = self.used(now);
        let last_expiry = self
            .events
            .iter()
            .filter(|&&(at, c)| c > 0 && at + period > now)
            .map(|&(at, _)| at + period)
            .max();
        let reset = last_expiry.map_or(0, |t| t - now);
        decision(
            &self.params,
            v,
            limit.saturating_sub(used_after),
            reset,
            retry,
            0,
        )
    }
}

/// Sliding counter: a map from window index to cost admitted; the estimate rounds the weighted
/// previous window up.
pub struct SlidingCounterModel {
    params: Params,
    admitted: HashMap<u64, u64>,
}

impl SlidingCounterModel {
    pub fn new(params: Params) -> Self {
        SlidingCounterModel {
            params,
            admitted: HashMap::new(),
        }
    }

    /// `current + ceil(previous * (period - elapsed) / period)` at `t`.
    fn estimate(&self, t: u64) -> u64 {
        let period = self.params.period_micros();
        let window = t / period;
        let elapsed = t % period;
        let current = self.admitted.get(&window).copied().unwrap_or(0);
        let previous = if window == 0 {
            0
        } else {
            self.admitted.get(&(window - 1)).copied().unwrap_or(0)
        };
        let weighted =
            (u128::from(previous) * u128::from(period - elapsed)).div_ceil(u128::from(period));
        current + u64::try_from(weighted).unwrap()
    }
}

impl Model for SlidingCounterModel {
    fn decide(&mut self, now: u64, cost: u64) -> Decision {
        let limit = self.params.limit();
        let period = self.params.period_micros();
        let v = verdict(&self.params, cost, self.estimate(now) + cost <= limit);
        let mut retry = None;
        if v == Verdict::Allowed {
            *self.admitted.entry(now / period).or_default() += cost;
        } else if v == Verdict::Denied {
            // Linear search: everything has aged out after two periods.
            let t = (now + 1..=now + 2 * period)
                .find(|&t| self.estimate(t) + cost <= limit)
                .expect("admitted within two periods");
            retry = Some(t - now);
        }
        let reset_at = (now..=now + 2 * period)
            .find(|&t| self.estimate(t) == 0)
            .unwrap();
        decision(
            &self.params,
            v,
            limit.saturating_sub(self.estimate(now)),
            reset_at - now,
            retry,
            0,
        )
    }
}

/// Token bucket from its history: the tokens missing at `t` are the largest excess of admitted
/// cost over refill, over every suffix of the admitted events (Reich's formula), all scaled by
/// `period` so that the arithmetic is exact.
pub struct TokenBucketModel {
    params: Params,
    events: Vec<(u64, u64)>,
}

impl TokenBucketModel {
    pub fn new(params: Params) -> Self {
        TokenBucketModel {
            params,
            events: Vec::new(),
        }
    }

    /// Missing tokens at `t` times `period`, with `extra` charged at `t` too.
    fn missing_scaled(&self, t: u64, extra: u64) -> i128 {
        let period = i128::from(self.params.period_micros());
        let rate = i128::from(self.params.limit());
        let mut worst = 0i128;
        let mut suffix = i128::from(extra) * period;
        worst = worst.max(suffix);
        for &(at, cost) in self.events.iter().rev() {
            suffix += i128::from(cost) * period;
            worst = worst.max(suffix - rate * i128::from(t - at));
        }
        worst
    }

    fn fits(&self, t: u64, cost: u64) -> bool {
        self.missing_scaled(t, cost)
            <= i128::from(self.params.burst()) * i128::from(self.params.period_micros())
    }

    fn tokens(&self, t: u64) -> u64 {
        let capacity = i128::from(self.params.burst()) * i128::from(self.params.period_micros());
        let left = capacity - self.missing_scaled(t, 0);
        u64::try_from(left / i128::from(self.params.period_micros())).unwrap()
    }

    /// Longest wait that can matter: refilling a whole bucket, plus one.
    fn horizon(&self) -> u64 {
        (self.params.burst() * self.params.period_micros()).div_ceil(self.params.limit()) + 1
    }
}

impl Model for TokenBucketModel {
    fn decide(&mut self, now: u64, cost: u64) -> Decision {
        let v = verdict(&self.params, cost, self.fits(now, cost));
        let mut retry = None;
        if v == Verdict::Allowed {
            self.events.push((now, cost));
        } else if v == Verdict::Denied {
            retry = Some(bisect(now + 1, now + self.horizon(), |t| self.fits(t, cost)) - now);
        }
        let full_at = bisect(now, now + self.horizon(), |t| {
            self.missing_scaled(t, 0) == 0
        });
        decision(&self.params, v, self.tokens(now), full_at - now, retry, 0)
    }
}

/// Leaky bucket as an explicit queue: each admitted request is a job of `cost * period` scaled
/// units; the head job drains `limit` scaled units per microsecond.
pub struct LeakyQueueModel {
    params: Params,
    jobs: VecDeque<u128>,
    clock: u64,
}

impl LeakyQueueModel {
    pub fn new(params: Params) -> Self {
        LeakyQueueModel {
            params,
            jobs: VecDeque::new(),
            clock: 0,
        }
    }

    fn drain(jobs: &mut VecDeque<u128>, micros: u64, rate: u64) {
        let mut budget = u128::from(micros) * u128::from(rate);
        while let Some(head) = jobs.front_mut() {
            if *head <= budget {
                budget -= *head;
                jobs.pop_front();
            } else {
                *head -= budget;
                break;
            }
        }
    }

    /// Work queued at `t >= self.clock`, scaled.
    fn backlog_at(&self, t: u64) -> u128 {
        let mut jobs = self.jobs.clone();
        Self::drain(&mut jobs, t - self.clock, self.params.limit());
        jobs.iter().sum()
    }
}

impl Model for LeakyQueueModel {
    fn decide(&mut self, now: u64, cost: u64) -> Decision {
        let period = u128::from(self.params.period_micros());
        let limit = self.params.limit();
        let size = u128::from(self.params.burst()) * period;
        Self::drain(&mut self.jobs, now - self.clock, limit);
        self.clock = now;
        let ahead: u128 = self.jobs.iter().sum();
        let job = u128::from(cost) * period;
        let v = verdict(&self.params, cost, ahead + job <= size);
        let (mut retry, mut delay) = (None, 0);
        if v == Verdict::Allowed {
            self.jobs.push_back(job);
            delay = u64::try_from(ahead.div_ceil(u128::from(limit))).unwrap();
        } else if v == Verdict::Denied {
            let horizon = now + u64::try_from(size.div_ceil(u128::from(limit))).unwrap() + 1;
            retry = Some(bisect(now + 1, horizon, |t| self.backlog_at(t) + job <= size) - now);
        }
        let queued: u128 = self.jobs.iter().sum();
        let horizon = now + u64::try_from(size.div_ceil(u128::from(limit))).unwrap() + 1;
        let empty_at = bisect(now, horizon, |t| self.backlog_at(t) == 0);
        let free = u64::try_from((size - queued) / period).unwrap();
        decision(&self.params, v, free, empty_at - now, retry, delay)
    }
}
