//! Runtime overrides: a different limit for one descriptor value of one rule, set through the
//! admin API without a policy push (for example tenant `acme` gets ten times the limit), with an
//! optional expiry. They live beside the policy, so they survive reloads and rollbacks; the
//! counter stays the rule's, so the count carries over when an override starts or ends (except
//! for a fixed window or sliding counter whose `period` the override changes: see
//! `tollgate_core`'s notes on changed params).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tollgate_core::{Params, Timestamp};
use tracing::{info, warn};

use crate::policy::{Policy, Rule};

mod filter;
mod index;
mod target;

use index::Index;
pub use target::{Override, UnfitOverride};

/// The most overrides in force by default (`--max-overrides`).
pub const DEFAULT_MAX_OVERRIDES: usize = 100_000;

/// An override's target: its domain, rule and entries.
pub type Target = (String, String, Vec<(String, String)>);

/// Why overrides were not set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverrideError {
    /// Setting them would pass the cap; none was set.
    #[error(
        "at most {max} runtime overrides may be in force (--max-overrides); {held} are, and this would add {adding}: nothing was set"
    )]
    TooMany {
        /// The cap.
        max: usize,
        /// How many are in force.
        held: usize,
        /// How many new targets the set would add.
        adding: usize,
    },
}

/// A change made on this replica, kept until the other replicas have it (see
/// [`Overrides::take_pending`]).
#[derive(Debug, Clone, PartialEq)]
pub enum OverrideChange {
    /// This override was set (replacing any with the same domain, rule and entries).
    Set(Override),
    /// This override was deleted, at this time.
    Deleted(Override, Timestamp),
}

impl OverrideChange {
    fn apply(&self, index: &mut Index) {
        match self {
            OverrideChange::Set(o) => index.insert(o.clone()),
            OverrideChange::Deleted(o, _) => {
                index.remove_id(o.id);
            }
        }
    }
}

/// Every override in force, indexed (see [`index`]); a change swaps in a new index, which
/// shares all but what changed with the one before, so lookups take no lock.
#[derive(Debug)]
pub struct Overrides {
    index: ArcSwap<Index>,
    /// Most overrides in force that sets may reach (adoptions from other replicas are not
    /// refused: they are the fleet's).
    max: usize,
    /// Local changes the other replicas may not have yet, oldest first. Its lock also orders
    /// every write to `index`.
    pending: Mutex<Vec<OverrideChange>>,
    /// Told after every local change (set, delete), for sharing with other replicas.
    changed: Mutex<Option<UnboundedSender<()>>>,
    /// Counts every change, local or adopted.
    generation: AtomicU64,
    /// Whether `index` holds any override, written after it (under `pending`) and before
    /// `generation` moves: a decision with none in force (nearly all of them) reads this
    /// instead of loading the index (about 50 instructions). One that read the new generation
    /// sees it; one that sees `false` stale decides as if before the change.
    held: AtomicBool,
}

impl Default for Overrides {
    fn default() -> Self {
        Overrides::with_max(DEFAULT_MAX_OVERRIDES)
    }
}

/// A new override id: random below 2^53 (exact as a JSON number everywhere), so replicas that
/// set overrides at the same time never hand out the same one.
fn fresh_id() -> u64 {
    (crate::random::random_u64() & ((1 << 53) - 1)).max(1)
}

impl Overrides {
    /// None in force; sets may bring at most `max` in force.
    pub fn with_max(max: usize) -> Self {
        Overrides {
            index: ArcSwap::default(),
            max,
            pending: Mutex::default(),
            changed: Mutex::default(),
            generation: AtomicU64::new(0),
            held: AtomicBool::new(false),
        }
    }

    /// Makes `index` the one in force. Called with `pending` locked.
    fn publish(&self, index: Index) {
        let held = index.len() > 0;
        self.index.store(Arc::new(index));
        self.held.store(held, Ordering::Release);
    }

    /// The most overrides sets may bring in force.
    pub fn max(&self) -> usize {
        self.max
    }

    /// How many are held (expired ones not dropped yet included).
    pub fn len(&self) -> usize {
        self.index.load().len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Logs each override that applied under `previous` and applies to nothing under `next`
    /// (its rule is gone, or its name now belongs to another rule).
    pub fn warn_orphaned(&self, previous: &Policy, next: &Policy) {
        for o in self.index.load().iter() {
            if o.applies_under(previous) && !o.applies_under(next) {
                warn!(id = o.id, domain = %o.domain, rule = %o.rule, entries = ?o.entries,
                    "A runtime override applies to nothing under the new policy (its rule is gone, or its name now belongs to another rule); it is kept, and applies again under a policy where its rule matches its entries");
            }
        }
    }

    /// A number that changes whenever an override is set, deleted or adopted from another
    /// replica (not when one expires).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The limit an override gives this rule and descriptor at `now`, if any: one lookup in
    /// the index, whatever the number in force.
    pub fn find(
        &self,
        domain: &str,
        rule: &Rule,
        entries: &[(String, String)],
        now: Timestamp,
    ) -> Option<Params> {
        if !self.held.load(Ordering::Acquire) {
            return None;
        }
        let index = self.index.load();
        let (found, _) = index.find(domain, &rule.name, entries);
        let found = found.filter(|o| o.live(now))?;
        found.params_for(rule).ok()
    }

    /// How many held overrides a lookup of this target compares with (see
    /// [`Overrides::find`]): at most one, whatever the number in force.
    pub fn probes(&self, domain: &str, rule: &str, entries: &[(String, String)]) -> usize {
        self.index.load().find(domain, rule, entries).1
    }

    /// Adds or replaces (same domain, rule and entries) an override; returns its id, or why
    /// not (the cap).
    pub fn set(&self, o: Override) -> Result<u64, OverrideError> {
        Ok(self.set_all(vec![o])?[0])
    }

    /// Adds or replaces every override of `list`, in order, or none of them if that would pass
    /// the cap; returns their ids, in order.
    pub fn set_all(&self, list: Vec<Override>) -> Result<Vec<u64>, OverrideError> {
        if list.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(now) = list.iter().map(|o| o.set_at).max() {
            self.drop_expired(now);
        }
        let mut ids = Vec::with_capacity(list.len());
        {
            let mut pending = self.pending.lock();
            let mut index = Index::clone(&self.index.load());
            let mut new_targets = HashSet::new();
            for o in &list {
                if !index.holds_target(o) {
                    new_targets.insert((&o.domain, &o.rule, &o.entries));
                }
            }
            let (held, adding) = (index.len(), new_targets.len());
            if adding > 0 && held + adding > self.max {
                return Err(OverrideError::TooMany {
                    max: self.max,
                    held,
                    adding,
                });
            }
            for mut o in list {
                o.id = fresh_id();
                ids.push(o.id);
                let change = OverrideChange::Set(o);
                change.apply(&mut index);
                pending.push(change);
            }
            self.publish(index);
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        self.tell();
        Ok(ids)
    }

    /// Deletes an override at `now`; returns it if it existed.
    pub fn delete(&self, id: u64, now: Timestamp) -> Option<Override> {
        let removed = {
            let mut pending = self.pending.lock();
            let mut index = Index::clone(&self.index.load());
            let held = index.remove_id(id)?;
            let removed = Override::clone(&held);
            self.publish(index);
            pending.push(OverrideChange::Deleted(removed.clone(), now));
            self.generation.fetch_add(1, Ordering::AcqRel);
            removed
        };
        self.tell();
        Some(removed)
    }

    /// Tells the subscriber a local change was made.
    fn tell(&self) {
        if let Some(tx) = self.changed.lock().as_ref() {
            let _ = tx.send(());
        }
    }

    /// A stream that receives `()` after every local set or delete (not after [`Overrides::adopt`]).
    pub fn subscribe(&self) -> UnboundedReceiver<()> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *self.changed.lock() = Some(tx);
        rx
    }

    /// Every override, expired or not, as stored, in the order set.
    pub fn all(&self) -> Vec<Override> {
        self.index
            .load()
            .iter()
            .map(|o| Override::clone(o))
            .collect()
    }

    /// Takes the local changes not yet shared, oldest first; give them back with
    /// [`Overrides::keep_pending`] if sharing them fails.
    pub fn take_pending(&self) -> Vec<OverrideChange> {
        std::mem::take(&mut *self.pending.lock())
    }

    /// Puts back `changes` that could not be shared, before any made since.
    pub fn keep_pending(&self, mut changes: Vec<OverrideChange>) {
        let mut pending = self.pending.lock();
        changes.append(&mut pending);
        *pending = changes;
    }

    /// Whether local changes wait to be shared.
    pub fn has_pending(&self) -> bool {
        !self.pending.lock().is_empty()
    }

    /// Adopts `list`, every replica's overrides as shared; the local changes not yet shared are
    /// applied over it, so none is lost. Overrides expired at `now` are left out, and those this
    /// replica held are logged as expired, as [`Overrides::drop_expired`] does.
    pub fn adopt(&self, list: Vec<Override>, now: Timestamp) {
        let pending = self.pending.lock();
        let mut index = Index::of(list);
        for change in pending.iter() {
            change.apply(&mut index);
        }
        index.drop_expired(now);
        let held = self.index.load_full();
        for o in held.expired(now) {
            log_expired(o);
        }
        if !held.same_as(&index) {
            self.publish(index);
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Adopts what the other replicas changed: for each target, the override now shared there,
    /// or `None` where there is none any more. The local changes not yet shared are applied
    /// over them, and overrides expired at `now` are dropped (and logged), as
    /// [`Overrides::adopt`] does. Returns how many targets changed here.
    pub fn adopt_changes(&self, changes: Vec<(Target, Option<Override>)>, now: Timestamp) -> usize {
        let pending = self.pending.lock();
        let held = self.index.load_full();
        let mut index = Index::clone(&held);
        let mut changed = 0;
        for ((domain, rule, entries), shared) in changes {
            let here = index.find(&domain, &rule, &entries).0;
            if here.map(|o| &**o) == shared.as_ref() {
                continue;
            }
            changed += 1;
            index.remove_target(&domain, &rule, &entries);
            if let Some(o) = shared.filter(|o| o.live(now)) {
                index.insert(o);
            }
        }
        for change in pending.iter() {
            change.apply(&mut index);
        }
        let expired = index.drop_expired(now);
        for o in &expired {
            log_expired(o);
        }
        // No pass over every override: what the changes did is known.
        if changed > 0 || !expired.is_empty() {
            self.publish(index);
        }
        if changed > 0 {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        changed
    }

    /// Drops the overrides expired at `now`, logging each (`Override expired`) as it goes: once
    /// per override, however many requests it stopped applying to (they skip an expired one
    /// without a word). The sweeper calls this every `--sweep-interval`.
    pub fn drop_expired(&self, now: Timestamp) {
        if !self.index.load().any_expired(now) {
            return;
        }
        let _writing = self.pending.lock();
        let mut index = Index::clone(&self.index.load());
        let expired = index.drop_expired(now);
        if expired.is_empty() {
            return;
        }
        self.publish(index);
        for o in &expired {
            log_expired(o);
        }
    }

    /// Every override still in force at `now` (expired ones are dropped, see
    /// [`Overrides::drop_expired`]), in the order set.
    pub fn list(&self, now: Timestamp) -> Vec<Override> {
        self.drop_expired(now);
        self.all()
    }
}

/// The audit line of an override that expired (set and delete are logged by the admin API).
fn log_expired(o: &Override) {
    info!(id = o.id, domain = %o.domain, rule = %o.rule, entries = ?o.entries,
        reason = %o.reason, "Override expired");
}

#[cfg(test)]
mod tests;
