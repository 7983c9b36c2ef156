//! The overrides in force, indexed: by target (domain, rule and entries) for the decisions, by
//! id for deletes, by expiry for the sweep and by the order they were set in for listing.
//!
//! Every map is persistent (`imbl`): a copy shares everything but the path a change copies, so
//! a set or a delete costs O(log n) whatever the number in force, and a reader keeps the
//! snapshot it loaded while a writer makes the next one.

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use equivalent::Equivalent;
use tollgate_core::Timestamp;

use super::filter::{self, Filter};
use super::target::Override;

/// An override, hashed and compared by its target.
#[derive(Debug, Clone)]
struct ByTarget(Arc<Override>);

/// Hashes a target; a stored override and a lookup hash alike.
fn hash_target<H: Hasher>(domain: &str, rule: &str, entries: &[(String, String)], state: &mut H) {
    domain.hash(state);
    rule.hash(state);
    entries.hash(state);
}

impl Hash for ByTarget {
    fn hash<H: Hasher>(&self, state: &mut H) {
        hash_target(&self.0.domain, &self.0.rule, &self.0.entries, state);
    }
}

impl PartialEq for ByTarget {
    fn eq(&self, other: &Self) -> bool {
        self.0.same_target(&other.0)
    }
}

impl Eq for ByTarget {}

/// A target borrowed from a request, counting the stored overrides it is compared with (those
/// whose hash matches it: none, or the one it finds, whatever the number in force).
struct Lookup<'a> {
    domain: &'a str,
    rule: &'a str,
    entries: &'a [(String, String)],
    compared: Cell<usize>,
}

impl Hash for Lookup<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        hash_target(self.domain, self.rule, self.entries, state);
    }
}

impl Equivalent<ByTarget> for Lookup<'_> {
    fn equivalent(&self, key: &ByTarget) -> bool {
        self.compared.set(self.compared.get() + 1);
        key.0.is_for(self.domain, self.rule, self.entries)
    }
}

/// The overrides in force: cheap to clone (the copies share their nodes and their filter).
#[derive(Debug, Clone)]
pub(super) struct Index {
    /// Passes every target held (and a few others): see [`filter`].
    filter: Arc<Filter>,
    /// Targets marked in `filter` since it was built.
    marked: usize,
    /// Each override, with its place in `by_order`.
    by_target: imbl::HashMap<ByTarget, u64>,
    by_id: imbl::HashMap<u64, (Arc<Override>, u64)>,
    by_order: imbl::OrdMap<u64, Arc<Override>>,
    /// `(expires_at in µs, place)` of each override that expires.
    expiries: imbl::OrdSet<(u64, u64)>,
    next_order: u64,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            filter: Arc::new(Filter::for_targets(0)),
            marked: 0,
            by_target: imbl::HashMap::default(),
            by_id: imbl::HashMap::default(),
            by_order: imbl::OrdMap::default(),
            expiries: imbl::OrdSet::default(),
            next_order: 0,
        }
    }
}

impl Index {
    /// An index of `list`, in its order (of two for one target, the later stays).
    pub fn of(list: Vec<Override>) -> Self {
        let mut index = Index::default();
        for o in list {
            index.insert(o);
        }
        index
    }

    /// How many overrides it holds.
    pub fn len(&self) -> usize {
        self.by_order.len()
    }

    /// The override for this target, if any (expired or not), and how many stored overrides
    /// the lookup compared it with.
    pub fn find(
        &self,
        domain: &str,
        rule: &str,
        entries: &[(String, String)],
    ) -> (Option<&Arc<Override>>, usize) {
        if self.by_target.is_empty() || !self.filter.may_hold(filter::hash(domain, rule, entries)) {
            return (None, 0);
        }
        let lookup = Lookup {
            domain,
            rule,
            entries,
            compared: Cell::new(0),
        };
        let found = self.by_target.get_key_value(&lookup).map(|(key, _)| &key.0);
        (found, lookup.compared.get())
    }

    /// The override with this id.
    pub fn get(&self, id: u64) -> Option<&Arc<Override>> {
        self.by_id.get(&id).map(|(o, _)| o)
    }

    /// Whether a set of `o` would replace one held (same target) rather than add one.
    pub fn holds_target(&self, o: &Override) -> bool {
        self.find(&o.domain, &o.rule, &o.entries).0.is_some()
    }

    /// Every override, in the order set.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Override>> {
        self.by_order.values()
    }

    /// Adds `o`, replacing the one with its id and the one with its target.
    pub fn insert(&mut self, o: Override) {
        self.remove_id(o.id);
        let o = Arc::new(o);
        if let Some(order) = self.by_target.get(&ByTarget(o.clone())).copied()
            && let Some(held) = self.by_order.get(&order).cloned()
        {
            self.remove(&held, order);
        }
        self.mark(&o);
        let order = self.next_order;
        self.next_order += 1;
        self.by_target.insert(ByTarget(o.clone()), order);
        self.by_id.insert(o.id, (o.clone(), order));
        if let Some(at) = o.expires_at {
            self.expiries.insert((at.as_micros(), order));
        }
        self.by_order.insert(order, o);
    }

    /// Removes the override with this id; returns it.
    pub fn remove_id(&mut self, id: u64) -> Option<Arc<Override>> {
        let (held, order) = self.by_id.get(&id).cloned()?;
        self.remove(&held, order);
        Some(held)
    }

    /// Removes the override at this target; returns it.
    pub fn remove_target(
        &mut self,
        domain: &str,
        rule: &str,
        entries: &[(String, String)],
    ) -> Option<Arc<Override>> {
        let held = self.find(domain, rule, entries).0?.clone();
        self.remove_id(held.id)
    }

    /// Marks `o`'s target in the filter (before the index holding it is published), first
    /// building a bigger filter from what is held when the targets marked outgrow this one.
    fn mark(&mut self, o: &Override) {
        if self.marked >= self.filter.capacity() {
            let filter = Filter::for_targets(self.len() + 1);
            for held in self.by_order.values() {
                filter.insert(filter::hash(&held.domain, &held.rule, &held.entries));
            }
            self.filter = Arc::new(filter);
            self.marked = self.len();
        }
        self.filter
            .insert(filter::hash(&o.domain, &o.rule, &o.entries));
        self.marked += 1;
    }

    fn remove(&mut self, held: &Arc<Override>, order: u64) {
        self.by_target.remove(&ByTarget(held.clone()));
        self.by_id.remove(&held.id);
        self.by_order.remove(&order);
        if let Some(at) = held.expires_at {
            self.expiries.remove(&(at.as_micros(), order));
        }
    }

    /// The overrides expired at `now`, soonest first.
    pub fn expired(&self, now: Timestamp) -> impl Iterator<Item = &Arc<Override>> {
        self.expiries
            .iter()
            .take_while(move |(at, _)| *at <= now.as_micros())
            .filter_map(|(_, order)| self.by_order.get(order))
    }

    /// Whether some override is expired at `now`.
    pub fn any_expired(&self, now: Timestamp) -> bool {
        self.expiries
            .get_min()
            .is_some_and(|(at, _)| *at <= now.as_micros())
    }

    /// Removes the overrides expired at `now`; returns them.
    pub fn drop_expired(&mut self, now: Timestamp) -> Vec<Arc<Override>> {
        let expired: Vec<Arc<Override>> = self.expired(now).cloned().collect();
        for o in &expired {
            self.remove_id(o.id);
        }
        expired
    }

    /// Whether it holds the same overrides as `other` (in any order).
    pub fn same_as(&self, other: &Index) -> bool {
        self.len() == other.len()
            && self
                .iter()
                .all(|o| other.get(o.id).is_some_and(|held| **held == **o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(id: u64, tenant: &str, expires: Option<u64>) -> Override {
        Override {
            id,
            domain: "api".into(),
            rule: "per_tenant".into(),
            entries: vec![("tenant".into(), tenant.into())],
            requests_per_unit: 30,
            period: None,
            expires_at: expires.map(Timestamp::from_micros),
            set_at: Timestamp::from_micros(0),
            reason: String::new(),
        }
    }

    fn entries(tenant: &str) -> Vec<(String, String)> {
        vec![("tenant".into(), tenant.into())]
    }

    /// With 20,000 overrides in force, a lookup compares its target with at most the one it
    /// finds: a linear scan compared every unrelated key with all 20,000.
    #[test]
    fn a_lookup_compares_a_bounded_number_of_overrides() {
        let index = Index::of((1..=20_000).map(|i| o(i, &format!("t{i}"), None)).collect());
        assert_eq!(index.len(), 20_000);
        let (found, compared) = index.find("api", "per_tenant", &entries("t777"));
        assert_eq!(found.map(|o| o.id), Some(777));
        assert!(compared <= 2, "compared {compared}");
        for unrelated in ["nobody", "t0", "t20001", "acme"] {
            let (found, compared) = index.find("api", "per_tenant", &entries(unrelated));
            assert!(found.is_none());
            assert!(compared <= 1, "{unrelated}: compared {compared}");
        }
        let (found, _) = index.find("api", "other_rule", &entries("t777"));
        assert!(found.is_none(), "the rule is part of the target");
    }

    /// A set replaces the one with its target and the one with its id; the listing keeps the
    /// order set; the expiry index follows replacements and deletes.
    #[test]
    fn sets_replace_by_target_and_id_and_expiries_follow() {
        let mut index = Index::of(vec![o(1, "a", Some(10)), o(2, "b", None)]);
        index.insert(o(3, "a", None));
        assert_eq!(index.len(), 2);
        assert!(!index.any_expired(Timestamp::from_micros(100)), "replaced");
        assert_eq!(index.iter().map(|o| o.id).collect::<Vec<_>>(), [2, 3]);
        index.insert(o(2, "c", Some(20)));
        assert!(index.find("api", "per_tenant", &entries("b")).0.is_none());
        assert_eq!(index.get(2).map(|o| o.entries[0].1.as_str()), Some("c"));
        assert!(!index.any_expired(Timestamp::from_micros(19)));
        assert!(index.any_expired(Timestamp::from_micros(20)));
        let copy = index.clone();
        assert_eq!(
            index
                .drop_expired(Timestamp::from_micros(20))
                .iter()
                .map(|o| o.id)
                .collect::<Vec<_>>(),
            [2]
        );
        assert_eq!(copy.len(), 2, "a copy is a snapshot");
        assert!(!copy.same_as(&index));
        assert_eq!(
            index
                .remove_target("api", "per_tenant", &entries("a"))
                .map(|o| o.id),
            Some(3)
        );
        assert_eq!(index.len(), 0);
    }
}
