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

use crate::policy::Rule;

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
    /// Free text for the audit log.
    pub reason: String,
}

impl Override {
    /// The parameters this override gives `rule` (its algorithm; the burst scaled like the
    /// limit), or why they are impossible.
    pub fn params_for(&self, rule: &Rule) -> Result<Params, String> {
        let base = rule
            .limit
            .ok_or_else(|| format!("rule `{}` is unlimited", rule.name))?;
        let burst = base.algorithm().uses_burst().then(|| {
            let scaled = u128::from(base.burst()) * u128::from(self.requests_per_unit)
                / u128::from(base.limit());
            u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
        });
        Params::new(
            base.algorithm(),
            self.requests_per_unit,
            self.period.unwrap_or(base.period()),
            burst,
        )
        .map_err(|e| e.to_string())
    }

    fn matches(
        &self,
        domain: &str,
        rule: &Rule,
        entries: &[(String, String)],
        now: Timestamp,
    ) -> bool {
        self.domain == domain
            && self.rule == rule.name
            && self.entries == entries
            && self.expires_at.is_none_or(|at| now < at)
    }
}

/// Every override in force, swapped as a whole so lookups take no lock.
#[derive(Debug, Default)]
pub struct Overrides {
    list: ArcSwap<Vec<Override>>,
    next_id: AtomicU64,
    /// Told after every local change (set, delete), for sharing with other replicas.
    changed: Mutex<Option<UnboundedSender<()>>>,
    /// Counts every change, local or adopted.
    generation: AtomicU64,
}

impl Overrides {
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
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        o.id = id;
        self.list.rcu(|list| {
            let mut list: Vec<Override> = list
                .iter()
                .filter(|x| !(x.domain == o.domain && x.rule == o.rule && x.entries == o.entries))
                .cloned()
                .collect();
            list.push(o.clone());
            Arc::new(list)
        });
        self.notify();
        id
    }

    /// Deletes an override; returns it if it existed.
    pub fn delete(&self, id: u64) -> Option<Override> {
        let mut removed = None;
        self.list.rcu(|list| {
            removed = list.iter().find(|o| o.id == id).cloned();
            Arc::new(
                list.iter()
                    .filter(|o| o.id != id)
                    .cloned()
                    .collect::<Vec<_>>(),
            )
        });
        if removed.is_some() {
            self.notify();
        }
        removed
    }

    fn notify(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(tx) = self.changed.lock().as_ref() {
            let _ = tx.send(());
        }
    }

    /// A stream that receives `()` after every local set or delete (not after [`Overrides::replace_all`]).
    pub fn subscribe(&self) -> UnboundedReceiver<()> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *self.changed.lock() = Some(tx);
        rx
    }

    /// Every override, expired or not, as stored.
    pub fn all(&self) -> Vec<Override> {
        self.list.load().iter().cloned().collect()
    }

    /// Replaces every override with `list` (adopted from another replica); ids stay unique.
    pub fn replace_all(&self, list: Vec<Override>) {
        let max = list.iter().map(|o| o.id).max().unwrap_or(0);
        self.next_id.fetch_max(max, Ordering::Relaxed);
        self.list.store(Arc::new(list));
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Every override still in force at `now` (expired ones are dropped).
    pub fn list(&self, now: Timestamp) -> Vec<Override> {
        let live = |o: &Override| o.expires_at.is_none_or(|at| now < at);
        if self.list.load().iter().any(|o| !live(o)) {
            self.list
                .rcu(|list| Arc::new(list.iter().filter(|o| live(o)).cloned().collect::<Vec<_>>()));
        }
        self.list.load().iter().cloned().collect()
    }
}
