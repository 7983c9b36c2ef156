use std::collections::HashMap;
use std::sync::Arc;

use super::Rule;
use super::tree::Level;

/// A loaded, validated policy: every domain's descriptor tree compiled into lookup tables.
///
/// Immutable; share it in an `Arc` and swap the whole value on reload. Matching borrows the
/// request's entries and does not allocate.
///
/// ```
/// use tollgate::policy::Policy;
///
/// let policy = Policy::from_yaml("api.yaml", "
/// domain: api
/// descriptors:
///   - key: tenant
///     rate_limit: {unit: minute, requests_per_unit: 100}
///     descriptors:
///       - key: path
///         value: /login
///         rate_limit: {unit: second, requests_per_unit: 5, name: login_per_tenant}
/// ")?;
/// let rule = policy.find("api", &[("tenant", "acme"), ("path", "/login")]).unwrap();
/// assert_eq!(rule.name, "login_per_tenant");
/// assert_eq!(policy.find("api", &[("tenant", "acme")]).unwrap().name, "tenant");
/// assert!(policy.find("api", &[("path", "/login")]).is_none());
/// # Ok::<(), tollgate::policy::PolicyErrors>(())
/// ```
#[derive(Debug)]
pub struct Policy {
    rules: Vec<Arc<Rule>>,
    domains: Vec<DomainTable>,
    by_name: HashMap<String, usize>,
}

/// One domain's top-level descriptors.
#[derive(Debug)]
pub(super) struct DomainTable {
    pub name: String,
    pub root: Level,
}

impl Policy {
    pub(super) fn new(rules: Vec<Arc<Rule>>, domains: Vec<DomainTable>) -> Policy {
        let by_name = domains
            .iter()
            .enumerate()
            .map(|(i, d)| (d.name.clone(), i))
            .collect();
        Policy {
            rules,
            domains,
            by_name,
        }
    }

    /// The domains, in load order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.iter().map(|d| d.name.as_str())
    }

    /// Whether the policy has a domain named `domain`.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domain_index(domain).is_some()
    }

    /// Where `domain` is among the domains. A few names are compared in turn, which costs
    /// less than hashing the one looked up (every decision looks its domain up).
    fn domain_index(&self, domain: &str) -> Option<usize> {
        if self.domains.len() <= super::tree::SCANNED {
            self.domains.iter().position(|d| d.name == domain)
        } else {
            self.by_name.get(domain).copied()
        }
    }

    /// Every rule (each descriptor with a `rate_limit`), in file order; `rules()[i].index == i`.
    pub fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }

    /// One item per rule of this policy: the item `previous` held (one per rule of
    /// `previous_policy`) for the rule with the same domain and name, each taken at most once,
    /// or `fresh()` for a rule new to this policy. What a rule has counted so carries over a
    /// reload, a push or a rollback that keeps it.
    pub fn carry_over<T: Clone>(
        &self,
        previous_policy: &Policy,
        previous: &[T],
        mut fresh: impl FnMut() -> T,
    ) -> Box<[T]> {
        let mut carried: std::collections::HashMap<(&str, &str), &T> =
            std::collections::HashMap::new();
        for rule in previous_policy.rules() {
            if let Some(item) = previous.get(rule.index) {
                carried
                    .entry((rule.domain.as_str(), rule.name.as_str()))
                    .or_insert(item);
            }
        }
        self.rules
            .iter()
            .map(|rule| {
                // Taken, so two rules of this policy never share one item.
                carried
                    .remove(&(rule.domain.as_str(), rule.name.as_str()))
                    .cloned()
                    .unwrap_or_else(&mut fresh)
            })
            .collect()
    }

    /// The rule matched by one request descriptor, as envoyproxy/ratelimit matches it.
    ///
    /// Walks `entries` in order. At each level the child with the same key and exactly the
    /// entry's value is preferred, then the first wildcard child (a `value` with `*`s, each
    /// matching zero or more characters) in file order that matches it, then the key-only child. If no child matches there
    /// is no rule. The rule is the `rate_limit` of the node reached by the last entry; a node
    /// reached earlier is not used. An unknown domain or no entries give `None`.
    pub fn find<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: &[(K, V)],
    ) -> Option<&Arc<Rule>> {
        let table = self.domains.get(self.domain_index(domain)?)?;
        let index = table.root.walk(entries)?.rule?;
        self.rules.get(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_can_be_shared_across_threads() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<Policy>();
        shareable::<Arc<Rule>>();
    }
}
