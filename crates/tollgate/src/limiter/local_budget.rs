//! Local budgets: for a rule with `local_budget: s`, a replica reserves `s` units of a key's
//! quota from the shared store in one charge (a lease) and admits requests from it without
//! calling the store; what it did not use is given back to the store when the lease lapses
//! (after `local_budget_ttl`, or at the end of the window for a fixed window).
//!
//! Every unit admitted locally was charged to the store before it was admitted, so the store's
//! own limit bounds the total. What a lease changes is *when* the store sees a unit: at the
//! reservation instant, up to one TTL `h` before it is used. With `R` replicas, per key:
//!
//! - fixed window: never over the limit (a lease ends with its window);
//! - sliding window log and counter: at most `min(R * s, units reserved in the h before the
//!   window)` over the limit in any window;
//! - token bucket and GCRA: in any interval of length `L`, at most `burst + rate * L` plus
//!   `min(R * s, rate * h)`;
//! - under the limit: at most `R * s` units sit reserved and unused, for at most `h`, then go
//!   back.
//!
//! `docs/local-budgets.md` derives these bounds and reports measured ones. Leaky buckets are
//! refused (each request must get its own delay from the store), as are shadow and soft rules.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;
use tollgate_core::{Algorithm, Decision, Params, Timestamp, Verdict};
use tracing::debug;

use crate::policy::LocalBudget;
use crate::store::{Charge, RedisStore};

const SHARDS: usize = 16;

/// One key's lease on this replica.
#[derive(Debug, Default)]
struct Lease {
    /// Units reserved and not yet used.
    tokens: u64,
    /// When the lease lapses (this replica's clock).
    expires: Timestamp,
    /// The store's instant of the reservation (µs), for giving back.
    charged_at: i64,
    /// The params and epoch it was reserved under.
    params: Option<Params>,
    epoch: u64,
    /// The store's answer to the reservation and when it came (this replica's clock).
    reserved: Option<(Decision, Timestamp)>,
    /// Until when no new reservation is tried: the store had less than a lease left.
    backoff_until: Timestamp,
    /// Swept out of the map: a request still holding it goes to the store instead.
    retired: bool,
}

impl Lease {
    /// Gives back what is left unused, and empties the lease.
    async fn release(&mut self, store: &RedisStore, key: &[u8]) {
        let tokens = std::mem::take(&mut self.tokens);
        let Some(params) = self.params.take() else {
            return;
        };
        self.reserved = None;
        if tokens == 0 {
            return;
        }
        let charge = Charge {
            key,
            params: &params,
            cost: tokens,
            enforce: true,
        };
        if let Err(e) = store.give_back(charge, self.charged_at).await {
            // The units stay charged: under-admission until the counter resets, never over.
            debug!(error = %e, tokens, "Could not give back an unused local budget");
        }
    }

    /// The answer for a request served from this lease at `now`.
    fn served(&self, now: Timestamp) -> Option<Decision> {
        let (reserved, at) = self.reserved?;
        Some(Decision {
            verdict: Verdict::Allowed,
            // The store's count when reserved, plus what this replica still holds of it.
            remaining: reserved.remaining.saturating_add(self.tokens),
            reset_after: reserved
                .reset_after
                .saturating_sub(now.saturating_since(at)),
            retry_after: None,
            delay: Duration::ZERO,
            ..reserved
        })
    }
}

type Shard = parking_lot::Mutex<HashMap<Box<[u8]>, Arc<AsyncMutex<Lease>>>>;

/// This replica's leases, by counter key.
#[derive(Debug)]
pub struct Leases {
    shards: Box<[Shard]>,
    hasher: RandomState,
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            shards: (0..SHARDS)
                .map(|_| parking_lot::Mutex::new(HashMap::new()))
                .collect(),
            hasher: RandomState::new(),
        }
    }
}

impl Leases {
    fn lease(&self, key: &[u8]) -> Arc<AsyncMutex<Lease>> {
        let shard = &self.shards[(self.hasher.hash_one(key) as usize) & (SHARDS - 1)];
        let mut map = shard.lock();
        match map.get(key) {
            Some(lease) => lease.clone(),
            None => map.entry(key.into()).or_default().clone(),
        }
    }

    /// Admits `request` from this replica's lease on its key, reserving a new lease from
    /// `store` when needed; with the answer, whether the store was left alone (no reservation
    /// was needed). `None` means the store must decide this request itself: no lease could be
    /// had (the store has less than `budget.size` left, is failing, or the cost is larger than
    /// a lease).
    pub async fn take(
        &self,
        store: &RedisStore,
        request: Charge<'_>,
        budget: LocalBudget,
        now: Timestamp,
        epoch: u64,
    ) -> Option<(Decision, bool)> {
        let Charge {
            key, params, cost, ..
        } = request;
        if cost > budget.size {
            return None;
        }
        let lease = self.lease(key);
        let mut lease = lease.lock().await;
        if lease.retired {
            return None;
        }
        let current = lease.params.as_ref() == Some(params) && lease.epoch == epoch;
        if current && now < lease.expires && lease.tokens >= cost {
            lease.tokens -= cost;
            return lease.served(now).map(|d| (d, true));
        }
        lease.release(store, key).await;
        if now < lease.backoff_until {
            return None;
        }
        let charge = Charge {
            key,
            params,
            cost: budget.size,
            enforce: true,
        };
        let (decision, charged_at) = store.reserve(charge).await.ok()?;
        if !decision.is_allowed() {
            lease.backoff_until = now.saturating_add(budget.ttl);
            return None;
        }
        // A fixed window's lease ends with its window, so it never spends into the next one.
        let hold = match params.algorithm() {
            Algorithm::FixedWindow => budget.ttl.min(decision.reset_after),
            _ => budget.ttl,
        };
        *lease = Lease {
            tokens: budget.size - cost,
            expires: now.saturating_add(hold),
            charged_at,
            params: Some(*params),
            epoch,
            reserved: Some((decision, now)),
            backoff_until: Timestamp::EPOCH,
            retired: false,
        };
        lease.served(now).map(|d| (d, false))
    }

    /// Returns `cost` taken by [`Leases::take`] for a request another limit then denied.
    pub async fn put_back(&self, key: &[u8], cost: u64) {
        let lease = self.lease(key);
        let mut lease = lease.lock().await;
        if lease.params.is_some() {
            lease.tokens += cost;
        }
    }

    /// Gives back the unused units of every lease that has lapsed at `now` (or was reserved in
    /// another epoch) and forgets it. Returns how many leases were released.
    pub async fn sweep(&self, store: &RedisStore, now: Timestamp, epoch: u64) -> usize {
        let mut lapsed = Vec::new();
        for shard in self.shards.iter() {
            let mut map = shard.lock();
            map.retain(|key, lease| {
                // A lease in use right now is not lapsing.
                let Ok(l) = lease.try_lock() else {
                    return true;
                };
                let live = l.epoch == epoch && now < l.expires.max(l.backoff_until);
                if !live {
                    lapsed.push((key.clone(), lease.clone()));
                }
                live
            });
        }
        let released = lapsed.len();
        for (key, lease) in lapsed {
            let mut lease = lease.lock().await;
            lease.retired = true;
            lease.release(store, &key).await;
        }
        released
    }
}
