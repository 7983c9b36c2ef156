//! Leases, as local budgets use them: this replica's lease per counter key, reserved from the
//! shared store in one charge, admitted from without calling the store, and given back when it
//! lapses (after `local_budget_ttl`, or at the end of the window for a fixed window). The
//! bounds this gives are stated in the [`super`] module. Leaky buckets are refused (each request
//! must get its own delay from the store), as are shadow and soft rules.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};
use tollgate_core::{Algorithm, Decision, Params, Timestamp, Verdict};
use tracing::debug;

use super::keyed_shards::KeyedShards;
use crate::observe::Histogram;
use crate::policy::LocalBudget;
use crate::store::{Charge, Grants, StoreError, timed_store_call};

/// One key's lease on this replica: the holder is this replica, the counter its key and
/// `params`, the grant the `units` left of those reserved, until `expires`; what is left
/// is given back as a refund at `charged_at`.
#[derive(Debug, Default)]
struct Lease {
    /// Units reserved and not yet used.
    units: u64,
    /// When the lease lapses (this replica's clock).
    expires: Timestamp,
    /// The store's instant of the reservation (µs), for giving back.
    charged_at: i64,
    /// The params and epoch it was reserved under.
    params: Option<Params>,
    epoch: u64,
    /// Counts reservations, so units taken from one lease never go back into the next.
    serial: u64,
    /// The store's answer to the reservation and when it came (this replica's clock).
    reserved: Option<(Decision, Timestamp)>,
    /// Until when no new reservation is tried: the store had less than a lease left.
    backoff_until: Timestamp,
    /// Swept out of the map: a request still holding it goes to the store instead.
    retired: bool,
}

/// What a lease can do for a request.
enum Attempt {
    Taken(Decision),
    /// The store refused a lease lately: decide this request at the store.
    BackingOff,
    /// Reserve a new lease (or, retired, give up).
    Renew,
}

/// Units to give back: the params, the number, and the store's instant of their charge.
type Unused = (Params, u64, i64);

impl Lease {
    /// Whether this lease, reserved under `params` in `epoch`, still holds `cost` at `now`
    /// (a check, of cost 0, needs a unit it does not take).
    fn can_serve(&self, params: &Params, cost: u64, now: Timestamp, epoch: u64) -> bool {
        !self.retired
            && self.params.as_ref() == Some(params)
            && self.epoch == epoch
            && now < self.expires
            && self.units >= cost.max(1)
    }

    fn attempt(&mut self, params: &Params, cost: u64, now: Timestamp, epoch: u64) -> Attempt {
        if self.retired {
            return Attempt::BackingOff;
        }
        if self.can_serve(params, cost, now, epoch) {
            self.units -= cost;
            if let Some(decision) = self.served(now) {
                return Attempt::Taken(decision);
            }
        }
        if now < self.backoff_until {
            return Attempt::BackingOff;
        }
        Attempt::Renew
    }

    /// The answer a request of `cost` would get from this lease at `now`, taking nothing;
    /// `None` when the lease could not serve it.
    fn would_serve(
        &self,
        params: &Params,
        cost: u64,
        now: Timestamp,
        epoch: u64,
    ) -> Option<Decision> {
        if !self.can_serve(params, cost, now, epoch) {
            return None;
        }
        let mut decision = self.served(now)?;
        decision.remaining = decision.remaining.saturating_sub(cost);
        Some(decision)
    }

    /// Empties the lease; returns what must be given back to the store.
    fn empty(&mut self) -> Option<Unused> {
        let tokens = std::mem::take(&mut self.units);
        let params = self.params.take()?;
        self.reserved = None;
        (tokens > 0).then_some((params, tokens, self.charged_at))
    }

    /// The answer for a request served from this lease at `now`.
    fn served(&self, now: Timestamp) -> Option<Decision> {
        let (reserved, at) = self.reserved?;
        Some(Decision {
            verdict: Verdict::Allowed,
            // The store's count when reserved, plus what this replica still holds of it.
            remaining: reserved.remaining.saturating_add(self.units),
            reset_after: reserved
                .reset_after
                .saturating_sub(now.saturating_since(at)),
            retry_after: None,
            delay: Duration::ZERO,
            ..reserved
        })
    }
}

/// Gives `unused` units of `key` back to the store. Refused before it was sent (the store's
/// breaker open, say), a window algorithm's give-back is kept in `unreturned` for the next
/// sweep to try again. Any other failure may have reached the store and been applied, and a
/// second give-back would take back units that were used; and a bucket's give-back is only
/// right soon after its charge (late, it would credit a bucket that has refilled since and
/// been charged again). Those units stay charged: under-admission until the counter resets,
/// never over (as they do with `unreturned` full).
async fn give_back<G: Grants>(store: &G, key: &[u8], unused: Unused, shared: &Shared) -> bool {
    let (params, tokens, at) = unused;
    let charge = Charge::new(key, &params, tokens);
    match timed_store_call(&shared.give_back_latency, store.give_back(charge, at)).await {
        Ok(()) => true,
        Err(e) => {
            shared.give_back_failures.fetch_add(1, Ordering::Relaxed);
            let kept = matches!(e, StoreError::NotCalled(_))
                && !params.algorithm().uses_burst()
                && shared.unreturned.keep(key, unused);
            debug!(error = %e, tokens, kept, "Could not give back an unused local budget");
            false
        }
    }
}

/// Window algorithms' give-backs the store refused before they were sent, to try again. Late
/// is safe for windows: the store takes back the units from the window the charge landed in
/// (or the log entries it made), and nothing once that window is gone.
#[derive(Debug, Default)]
struct Unreturned(parking_lot::Mutex<Vec<(Box<[u8]>, Unused)>>);

impl Unreturned {
    /// At most this many kept; past it, units stay charged.
    const CAPACITY: usize = 4096;

    fn keep(&self, key: &[u8], unused: Unused) -> bool {
        let mut kept = self.0.lock();
        let room = kept.len() < Self::CAPACITY;
        if room {
            kept.push((key.into(), unused));
        }
        room
    }

    fn take(&self) -> Vec<(Box<[u8]>, Unused)> {
        std::mem::take(&mut *self.0.lock())
    }
}

/// What [`Leases`] shares with its renewal tasks: the give-backs to try again, how long the
/// store took to answer reservations and give-backs, and how many failed.
#[derive(Debug)]
struct Shared {
    unreturned: Unreturned,
    reserve_latency: Histogram,
    give_back_latency: Histogram,
    /// A reservation that failed after Redis ran it (a timeout) strands its units, and a
    /// give-back that failed leaves them charged: under the limit until the counter resets,
    /// which nothing else would show.
    reserve_failures: AtomicU64,
    give_back_failures: AtomicU64,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            unreturned: Unreturned::default(),
            reserve_latency: Histogram::new(Histogram::LATENCY_SECONDS),
            give_back_latency: Histogram::new(Histogram::LATENCY_SECONDS),
            reserve_failures: AtomicU64::new(0),
            give_back_failures: AtomicU64::new(0),
        }
    }
}

/// Whether a key's lease decides a request, and from which serial: `None` to reserve a new
/// lease, `Some(None)` to send the request to the store.
fn decided_by_lease(
    lease: &mut Lease,
    params: &Params,
    cost: u64,
    now: Timestamp,
    epoch: u64,
) -> Option<Option<(Decision, u64)>> {
    match lease.attempt(params, cost, now, epoch) {
        Attempt::Taken(decision) => Some(Some((decision, lease.serial))),
        Attempt::BackingOff => Some(None),
        Attempt::Renew => None,
    }
}

/// What a renewal is for: one request's charge under its rule's budget.
#[derive(Debug, Clone, Copy)]
struct Request {
    params: Params,
    cost: u64,
    budget: LocalBudget,
    now: Timestamp,
    epoch: u64,
}

/// Gives back what the old lease left (`unused`), reserves a new lease on `key` for `request`
/// and records it in `slot`, whose renewal lock `renewing` is held throughout: the request's
/// decision and the lease's serial. Runs to the end even if the request's caller has gone; the
/// caller's units are then taken from the lease for nobody.
async fn renew<G: Grants>(
    store: Arc<G>,
    shared: Arc<Shared>,
    (slot, _renewing): (Arc<Slot>, OwnedMutexGuard<()>),
    key: Box<[u8]>,
    unused: Option<Unused>,
    request: Request,
) -> Option<(Decision, u64)> {
    let Request {
        params,
        cost,
        budget,
        now,
        epoch,
    } = request;
    if let Some(unused) = unused {
        give_back(&*store, &key, unused, &shared).await;
    }
    // Whole: a lease records `budget.size` units, so it must have been charged all of them.
    let whole = params.charging_up_to_limit(false);
    let charge = Charge::new(&key, &whole, budget.size);
    let reserved = timed_store_call(&shared.reserve_latency, store.reserve(charge)).await;
    if let Err(e) = &reserved {
        shared.reserve_failures.fetch_add(1, Ordering::Relaxed);
        debug!(error = %e, "Could not reserve a local budget");
    }
    let mut lease = slot.lease.lock();
    let (decision, charged_at) = match reserved {
        Ok((decision, at)) if decision.is_allowed() => (decision, at),
        // Less than a lease left, or the store failing: the requests waiting behind this
        // one (and the next TTL's) ask the store one by one instead of queueing here.
        _ => {
            lease.backoff_until = now.saturating_add(budget.ttl);
            return None;
        }
    };
    // A fixed window's lease ends with its window, so it never spends into the next one.
    let hold = match params.algorithm() {
        Algorithm::FixedWindow => budget.ttl.min(decision.reset_after),
        _ => budget.ttl,
    };
    *lease = Lease {
        units: budget.size - cost,
        expires: now.saturating_add(hold),
        charged_at,
        params: Some(params),
        epoch,
        serial: lease.serial + 1,
        reserved: Some((decision, now)),
        backoff_until: Timestamp::EPOCH,
        retired: false,
    };
    Some((lease.served(now)?, lease.serial))
}

/// A key's lease, and the lock that lets one request at a time reserve a new one. Taking
/// from a live lease only needs the short, synchronous lock.
#[derive(Debug, Default)]
struct Slot {
    lease: parking_lot::Mutex<Lease>,
    renewal: Arc<AsyncMutex<()>>,
}

/// A request admitted from a lease.
#[derive(Debug, Clone)]
pub struct Taken {
    pub decision: Decision,
    /// Served from a lease already held: the store was not called.
    pub spared_the_store: bool,
    /// The slot and lease it came from, for [`Taken::put_back`].
    slot: Arc<Slot>,
    serial: u64,
}

impl Taken {
    /// Returns the `cost` units taken, for a request another limit then denied. If that lease
    /// has been replaced, retired or emptied since, they stay charged (under-admission by
    /// `cost` until the counter resets, never over). Returns whether the units went back.
    pub fn put_back(&self, cost: u64) -> bool {
        let mut lease = self.slot.lease.lock();
        let back = lease.serial == self.serial && !lease.retired && lease.params.is_some();
        if back {
            lease.units += cost;
        }
        back
    }
}

/// A request admitted from `slot`'s lease.
fn taken(
    (decision, serial, spared_the_store): (Decision, u64, bool),
    slot: Arc<Slot>,
) -> Option<Taken> {
    Some(Taken {
        decision,
        spared_the_store,
        slot,
        serial,
    })
}

/// This replica's leases, by counter key.
#[derive(Debug, Default)]
pub struct Leases {
    slots: KeyedShards<Arc<Slot>>,
    shared: Arc<Shared>,
}

impl Leases {
    /// The store calls of leases, by operation, with their latency histograms.
    pub fn store_latency(&self) -> impl Iterator<Item = (&'static str, &Histogram)> {
        [
            ("reserve", &self.shared.reserve_latency),
            ("give_back", &self.shared.give_back_latency),
        ]
        .into_iter()
    }

    /// The store calls of leases that failed, by operation.
    pub fn store_failures(&self) -> [(&'static str, u64); 2] {
        let count = |n: &AtomicU64| n.load(Ordering::Relaxed);
        [
            ("reserve", count(&self.shared.reserve_failures)),
            ("give_back", count(&self.shared.give_back_failures)),
        ]
    }

    fn slot(&self, key: &[u8]) -> Arc<Slot> {
        self.slots.get_or_insert_with(key, Arc::default)
    }

    /// Admits `request` from this replica's lease on its key, reserving a new lease from
    /// `store` when needed. `None` means the store must decide this request itself: no lease
    /// could be had (the store has less than `budget.size` left, is failing, or the cost is
    /// larger than a lease), or it is a check the lease cannot answer (see `Leases::check`).
    pub async fn take<G: Grants>(
        &self,
        store: &Arc<G>,
        request: Charge<'_>,
        budget: LocalBudget,
        now: Timestamp,
        epoch: u64,
    ) -> Option<Taken> {
        let Charge {
            key, params, cost, ..
        } = request;
        if cost == 0 {
            return self.check(store, key, params, now, epoch).await;
        }
        if cost > budget.size {
            return None;
        }
        let slot = self.slot(key);
        let from_lease = |answer: Option<(Decision, u64)>| {
            answer.map(|(decision, serial)| (decision, serial, true))
        };
        let first = decided_by_lease(&mut slot.lease.lock(), params, cost, now, epoch);
        let (decision, serial, spared_the_store) = match first {
            Some(answer) => from_lease(answer)?,
            None => {
                // One renewal at a time; a caller that hangs up while waiting here has taken
                // nothing.
                let renewing = slot.renewal.clone().lock_owned().await;
                // Another request may have reserved a lease while this one waited.
                let (again, unused) = {
                    let mut lease = slot.lease.lock();
                    match decided_by_lease(&mut lease, params, cost, now, epoch) {
                        Some(answer) => (Some(answer), None),
                        None => (None, lease.empty()),
                    }
                };
                if let Some(answer) = again {
                    return taken(from_lease(answer)?, slot);
                }
                // The store work in a task of its own: a caller that hangs up mid-renewal (a
                // client reset, a proxy's timeout) must not leave a lease reserved in the store
                // and recorded nowhere, where neither this replica nor a sweep could use or
                // give back its units.
                tokio::spawn(renew(
                    store.clone(),
                    self.shared.clone(),
                    (slot.clone(), renewing),
                    key.into(),
                    unused,
                    Request {
                        params: *params,
                        cost,
                        budget,
                        now,
                        epoch,
                    },
                ))
                .await
                .ok()?
                .map(|(decision, serial)| (decision, serial, false))?
            }
        };
        taken((decision, serial, spared_the_store), slot)
    }

    /// A check (cost 0) on `key`: answered by a lease that holds a unit, taking nothing, else
    /// by the store (`None`). It reserves no lease; but a lease that still holds units it can
    /// no longer serve (it lapsed, or was reserved under another policy) gives them back first,
    /// as a request's renewal would, so that the store does not count them as used (the sweep
    /// would only do so within `Limiter::HOT_KEY_SWEEP`).
    async fn check<G: Grants>(
        &self,
        store: &Arc<G>,
        key: &[u8],
        params: &Params,
        now: Timestamp,
        epoch: u64,
    ) -> Option<Taken> {
        let slot = self.slots.get(key, Arc::clone)?;
        // What the lease settles without giving anything back: the answer it serves, or `None`
        // when it has nothing to give back (used up, or swept) and the store decides.
        let settled = |lease: &Lease| {
            let served = lease
                .served(now)
                .filter(|_| lease.can_serve(params, 0, now, epoch));
            match served {
                Some(decision) => Some(Some((decision, lease.serial, true))),
                None => (lease.retired || lease.units == 0).then_some(None),
            }
        };
        let answer = settled(&slot.lease.lock());
        if let Some(answer) = answer {
            return answer.and_then(|answer| taken(answer, slot));
        }
        let renewing = slot.renewal.clone().lock_owned().await;
        let unused = {
            let mut lease = slot.lease.lock();
            // Looked at again: it may have been renewed or swept meanwhile.
            if let Some(answer) = settled(&lease) {
                drop(lease);
                return answer.and_then(|answer| taken(answer, slot));
            }
            lease.empty()?
        };
        // A task of its own holding the renewal lock, as a renewal: a caller that hangs up must
        // neither strand the units nor let a reservation start before they are back.
        let (store, shared, key) = (store.clone(), self.shared.clone(), key.to_vec());
        let give = async move {
            give_back(&*store, &key, unused, &shared).await;
            drop(renewing);
        };
        let _ = tokio::spawn(give).await;
        None
    }

    /// What this replica's lease on `charge`'s key would answer it, taking nothing (for
    /// explain): `None` when no lease could serve it and the store would decide.
    pub fn would_serve(&self, charge: &Charge<'_>, now: Timestamp, epoch: u64) -> Option<Decision> {
        self.slots
            .get(charge.key, |slot| {
                slot.lease
                    .lock()
                    .would_serve(charge.params, charge.cost, now, epoch)
            })
            .flatten()
    }

    /// Drops every lease and every give-back still owed, returning nothing: the store lost
    /// the counters they were reserved from, and giving units back now would credit counts
    /// made since. A lease being renewed right now is left to the next sweep.
    pub fn forfeit(&self) {
        self.slots.retain(|_, slot| {
            let Ok(_renewing) = slot.renewal.try_lock() else {
                return true;
            };
            slot.lease.lock().retired = true;
            false
        });
        drop(self.shared.unreturned.take());
    }

    /// Gives back the unused units of every lease that has lapsed at `now` (or was reserved in
    /// another epoch) and forgets it, after trying again the give-backs that failed while the
    /// store was unavailable. Returns the keys that got units back.
    pub async fn sweep<G: Grants>(&self, store: &G, now: Timestamp, epoch: u64) -> Vec<Box<[u8]>> {
        let mut lapsed: Vec<(Box<[u8]>, Option<Unused>)> = Vec::new();
        self.slots.retain(|key, slot| {
            // A lease being renewed right now is not lapsing.
            let Ok(_renewing) = slot.renewal.try_lock() else {
                return true;
            };
            let mut lease = slot.lease.lock();
            let live = lease.epoch == epoch && now < lease.expires.max(lease.backoff_until);
            if !live {
                lease.retired = true;
                lapsed.push((key.into(), lease.empty()));
            }
            live
        });
        let mut credited = Vec::new();
        // Earlier failures first; after a new failure the store is still away: keep the rest
        // for the next sweep rather than wait out a deadline per key.
        let mut retries = self.shared.unreturned.take().into_iter();
        for (key, unused) in retries.by_ref() {
            if !give_back(store, &key, unused, &self.shared).await {
                break;
            }
            credited.push(key);
        }
        for (key, unused) in retries {
            self.shared.unreturned.keep(&key, unused);
        }
        for (key, unused) in lapsed {
            if let Some(unused) = unused
                && give_back(store, &key, unused, &self.shared).await
            {
                credited.push(key);
            }
        }
        credited
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tollgate_core::{Algorithm, Decision, Params, Timestamp};

    use super::{Leases, Unreturned};
    use crate::clock::{Clock, ManualClock};
    use crate::policy::LocalBudget;
    use crate::store::{Charge, MemoryStore, Store};

    /// What a request of 1 on `key` would get from `store`, charging nothing.
    async fn peeked(store: &MemoryStore, key: &[u8], params: &Params) -> Decision {
        let decisions = store.peek(&[Charge::new(key, params, 1)]).await;
        decisions.unwrap_or_else(|e| panic!("{e}"))[0]
    }

    /// The engine over the memory store: a lease is reserved in one charge, admits from its
    /// units without the store, and once lapsed gives the unused ones back, leaving the
    /// counter exactly as if only the units used had been charged, for every algorithm.
    #[tokio::test]
    async fn over_the_memory_store_a_lease_reserves_serves_and_gives_back() {
        let start = Timestamp::from_micros(1_700_000_000_000_000);
        let clock = Arc::new(ManualClock::new(start));
        let store = Arc::new(MemoryStore::new(clock.clone()));
        let budget = LocalBudget {
            size: 10,
            ttl: Duration::from_secs(1),
        };
        for algorithm in Algorithm::ALL {
            clock.set(start);
            let params = Params::new(algorithm, 100, Duration::from_secs(60), None)
                .unwrap_or_else(|e| panic!("{e}"));
            let (key, control) = (
                format!("leased {algorithm}"),
                format!("control {algorithm}"),
            );
            let (key, control) = (key.as_bytes(), control.as_bytes());
            let leases = Leases::default();
            let charge = Charge::new(key, &params, 1);
            let first = leases.take(&store, charge, budget, start, 0).await;
            let first = first.unwrap_or_else(|| panic!("{algorithm}: no lease"));
            assert!(
                !first.spared_the_store,
                "{algorithm}: the first request reserves"
            );
            assert_eq!(
                first.decision.remaining, 99,
                "{algorithm}: 90 left and 9 held"
            );
            let reserved = peeked(&store, key, &params).await;
            assert_eq!(reserved.remaining, 89, "{algorithm}: 10 charged");
            for n in 1..4 {
                let taken = leases.take(&store, charge, budget, start, 0).await;
                let taken = taken.unwrap_or_else(|| panic!("{algorithm}: not served"));
                assert!(taken.spared_the_store, "{algorithm}: request {n}");
                assert_eq!(taken.decision.remaining, 99 - n, "{algorithm}");
            }
            assert_eq!(
                peeked(&store, key, &params).await,
                reserved,
                "{algorithm}: no call"
            );
            // The 4 units used, charged to a control counter at the reservation's instant.
            let used = store.apply(&[Charge::new(control, &params, 4)]).await;
            used.unwrap_or_else(|e| panic!("{e}"));
            clock.advance(budget.ttl);
            let credited = leases.sweep(&*store, clock.now(), 0).await;
            assert_eq!(credited.len(), 1, "{algorithm}: 6 given back");
            assert_eq!(
                peeked(&store, key, &params).await,
                peeked(&store, control, &params).await,
                "{algorithm}: the counter as if the 4 used alone were charged"
            );
        }
    }

    /// Refused give-backs are kept up to the capacity (docs/hot-keys.md says 4096); past
    /// it they are dropped (their units stay charged), and a sweep takes them all.
    #[test]
    fn refused_give_backs_are_kept_up_to_4096() {
        let params = Params::new(Algorithm::FixedWindow, 10, Duration::from_secs(1), None)
            .unwrap_or_else(|e| panic!("{e}"));
        let kept = Unreturned::default();
        let accepted = (0..5000u32)
            .filter(|n| kept.keep(&n.to_be_bytes(), (params, 1, 0)))
            .count();
        assert_eq!(accepted, 4096);
        assert_eq!(kept.take().len(), 4096);
        assert!(kept.take().is_empty(), "taken once");
        assert!(
            kept.keep(b"again", (params, 1, 0)),
            "room again after a sweep"
        );
    }
}
