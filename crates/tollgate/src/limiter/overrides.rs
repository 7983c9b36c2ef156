//! Runtime overrides: a different limit for one descriptor value of one rule, set through the
//! admin API without a policy push (for example tenant `acme` gets ten times the limit), with an
//! optional expiry. They live beside the policy, so they survive reloads and rollbacks; the
//! counter stays the rule's, so the count carries over when an override starts or ends (except
//! for a fixed window or sliding counter whose `period` the override changes: see
//! `tollgate_core`'s notes on changed params).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tollgate_core::{Params, Timestamp};
use tracing::{info, warn};

use crate::policy::{Policy, Rule};

/// One override, as set by an operator.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// Assigned when set; used to delete it.
    pub id: u64,
    /// The rule's domain.
    pub domain: String,
    /// The rule's name.
    pub rule: String,
    /// The request descriptor's entries the override applies to, exactly.
    pub entries: Vec<(String, String)>,
    /// The new limit per period.
    pub requests_per_unit: u64,
    /// The new period; `None` keeps the rule's.
    pub period: Option<Duration>,
    /// When it stops applying; `None` = until deleted.
    pub expires_at: Option<Timestamp>,
    /// When it was set: of two set for the same target on different replicas, the later wins.
    pub set_at: Timestamp,
    /// Free text for the audit log.
    pub reason: String,
}

impl Override {
    /// The parameters this override gives `rule` (its algorithm and way of charging; the burst
    /// scaled like the limit), or why they are impossible.
    pub fn params_for(&self, rule: &Rule) -> Result<Params, String> {
        let base = rule
            .limit
            .ok_or_else(|| format!("rule `{}` is unlimited", rule.name))?;
        base.rescaled(self.requests_per_unit, self.period.unwrap_or(base.period()))
            .map_err(|e| e.to_string())
    }

    /// Whether the rule named `self.rule` in `policy` is the one that `self.entries` match:
    /// else the override applies to nothing under `policy` (its rule is gone, or a rename or a
    /// reorder gave the name to another rule) until a policy where it does runs again.
    pub fn applies_under(&self, policy: &Policy) -> bool {
        policy
            .find(&self.domain, &self.entries)
            .is_some_and(|rule| rule.name == self.rule)
    }

    /// Whether it still applies at `now`.
    fn live(&self, now: Timestamp) -> bool {
        self.expires_at.is_none_or(|at| now < at)
    }

    /// Whether `other` is for the same domain, rule and entries (and so replaced by this one).
    pub fn same_target(&self, other: &Override) -> bool {
        self.domain == other.domain && self.rule == other.rule && self.entries == other.entries
    }

    fn matches(
        &self,
        domain: &str,
        rule: &Rule,
        entries: &[(String, String)],
        now: Timestamp,
    ) -> bool {
        self.domain == domain && self.rule == rule.name && self.entries == entries && self.live(now)
    }
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
    fn apply(&self, list: &mut Vec<Override>) {
        match self {
            OverrideChange::Set(o) => {
                list.retain(|x| x.id != o.id && !o.same_target(x));
                list.push(o.clone());
            }
            OverrideChange::Deleted(o, _) => list.retain(|x| x.id != o.id),
        }
    }
}

/// Every override in force, swapped as a whole so lookups take no lock.
#[derive(Debug, Default)]
pub struct Overrides {
    list: ArcSwap<Vec<Override>>,
    /// Local changes the other replicas may not have yet, oldest first. Its lock also orders
    /// every write to `list`.
    pending: Mutex<Vec<OverrideChange>>,
    /// Told after every local change (set, delete), for sharing with other replicas.
    changed: Mutex<Option<UnboundedSender<()>>>,
    /// Counts every change, local or adopted.
    generation: AtomicU64,
}

/// A new override id: random below 2^53 (exact as a JSON number everywhere), so replicas that
/// set overrides at the same time never hand out the same one.
fn fresh_id() -> u64 {
    (crate::random::random_u64() & ((1 << 53) - 1)).max(1)
}

impl Overrides {
    /// Logs each override that applied under `previous` and applies to nothing under `next`
    /// (its rule is gone, or its name now belongs to another rule).
    pub fn warn_orphaned(&self, previous: &Policy, next: &Policy) {
        for o in self.all() {
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

    /// The limit an override gives this rule and descriptor at `now`, if any.
    pub fn find(
        &self,
        domain: &str,
        rule: &Rule,
        entries: &[(String, String)],
        now: Timestamp,
    ) -> Option<Params> {
        let list = self.list.load();
        if list.is_empty() {
            return None;
        }
        let found = list
            .iter()
            .find(|o| o.matches(domain, rule, entries, now))?;
        found.params_for(rule).ok()
    }

    /// Adds or replaces (same domain, rule and entries) an override; returns its id.
    pub fn set(&self, mut o: Override) -> u64 {
        o.id = fresh_id();
        let id = o.id;
        self.change(OverrideChange::Set(o));
        id
    }

    /// Deletes an override at `now`; returns it if it existed.
    pub fn delete(&self, id: u64, now: Timestamp) -> Option<Override> {
        let removed = self.list.load().iter().find(|o| o.id == id).cloned()?;
        self.change(OverrideChange::Deleted(removed.clone(), now));
        Some(removed)
    }

    /// Applies a local change and keeps it for the other replicas.
    fn change(&self, change: OverrideChange) {
        {
            let mut pending = self.pending.lock();
            let mut list = self.all();
            change.apply(&mut list);
            self.list.store(Arc::new(list));
            pending.push(change);
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
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

    /// Every override, expired or not, as stored.
    pub fn all(&self) -> Vec<Override> {
        self.list.load().iter().cloned().collect()
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
    pub fn adopt(&self, mut list: Vec<Override>, now: Timestamp) {
        let pending = self.pending.lock();
        for change in pending.iter() {
            change.apply(&mut list);
        }
        list.retain(|o| o.live(now));
        let held = self.list.load_full();
        for o in held.iter().filter(|o| !o.live(now)) {
            log_expired(o);
        }
        if *held != list {
            self.list.store(Arc::new(list));
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Drops the overrides expired at `now`, logging each (`Override expired`) as it goes: once
    /// per override, however many requests it stopped applying to (they skip an expired one
    /// without a word). The sweeper calls this every `--sweep-interval`.
    pub fn drop_expired(&self, now: Timestamp) {
        if self.list.load().iter().all(|o| o.live(now)) {
            return;
        }
        let _writing = self.pending.lock();
        let (kept, expired): (Vec<Override>, Vec<Override>) =
            self.list.load().iter().cloned().partition(|o| o.live(now));
        if expired.is_empty() {
            return;
        }
        self.list.store(Arc::new(kept));
        for o in &expired {
            log_expired(o);
        }
    }

    /// Every override still in force at `now` (expired ones are dropped, see
    /// [`Overrides::drop_expired`]).
    pub fn list(&self, now: Timestamp) -> Vec<Override> {
        self.drop_expired(now);
        self.list.load().iter().cloned().collect()
    }
}

/// The audit line of an override that expired (set and delete are logged by the admin API).
fn log_expired(o: &Override) {
    info!(id = o.id, domain = %o.domain, rule = %o.rule, entries = ?o.entries,
        reason = %o.reason, "Override expired");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An override that expires is logged once, whichever notices it first (the sweep, a
    /// listing, an adoption of the shared list that still holds it), and an adoption does not
    /// bring it back.
    #[test]
    fn an_expired_override_is_dropped_and_logged_once() {
        let at = |s: u64| Timestamp::from_micros(s * 1_000_000);
        let o = |value: &str, expires: Option<u64>| Override {
            id: 0,
            domain: "api".into(),
            rule: "per_tenant".into(),
            entries: vec![("tenant".into(), value.into())],
            requests_per_unit: 30,
            period: None,
            expires_at: expires.map(at),
            set_at: at(0),
            reason: String::new(),
        };
        let overrides = Overrides::default();
        let short = overrides.set(o("acme", Some(10)));
        overrides.set(o("globex", None));
        let shared = overrides.all();
        let logs = tollgate_testkit::CapturedLogs::default();
        let subscriber = logs.subscriber();
        tracing::subscriber::with_default(subscriber, || {
            overrides.drop_expired(at(9));
            assert_eq!(overrides.list(at(9)).len(), 2, "not expired yet");
            overrides.adopt(shared.clone(), at(11));
            overrides.drop_expired(at(12));
            assert_eq!(overrides.list(at(12)).len(), 1);
            overrides.adopt(shared.clone(), at(13));
            assert_eq!(
                overrides.all().len(),
                1,
                "an adoption does not bring it back"
            );
        });
        let text = logs.text();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("Override expired"))
            .collect();
        assert_eq!(lines.len(), 1, "{text}");
        assert!(lines[0].contains(&format!("id={short}")), "{text}");

        let sweeping = Overrides::default();
        sweeping.set(o("acme", Some(10)));
        sweeping.drop_expired(at(10));
        assert!(sweeping.all().is_empty(), "gone at its expiry");
    }
}
