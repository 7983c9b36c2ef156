//! Lookup tables built once per load; matching borrows the request and never allocates.

use std::collections::HashMap;

/// How a descriptor's `value` matches a request value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum ValueMatch {
    /// No value: any value, lowest precedence.
    Any,
    /// `value: text`: exactly this value, highest precedence.
    Exact(String),
    /// `value: prefix*`: any value starting with the prefix; the longest prefix wins.
    Prefix(String),
}

impl ValueMatch {
    /// Classifies a `value` as written; absent or empty means any value, as in envoyproxy/ratelimit.
    pub fn from_written(value: Option<&str>) -> ValueMatch {
        match value {
            None | Some("") => ValueMatch::Any,
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) => ValueMatch::Prefix(prefix.to_owned()),
                None => ValueMatch::Exact(v.to_owned()),
            },
        }
    }
}

/// The children of one node (or the top-level descriptors of a domain), by key.
#[derive(Debug, Default)]
pub(super) struct Level {
    keys: HashMap<String, KeyChildren>,
}

#[derive(Debug, Default)]
struct KeyChildren {
    exact: HashMap<String, Node>,
    /// Sorted by prefix length, longest first, so the first match is the longest prefix.
    prefixes: Vec<(String, Node)>,
    any: Option<Box<Node>>,
}

/// One descriptor: its rule (an index into the policy's rules) and its children.
#[derive(Debug, Default)]
pub(super) struct Node {
    pub rule: Option<usize>,
    pub children: Level,
}

impl Level {
    /// The child for `key` and `how`, created empty if absent. Callers reject duplicates before.
    pub fn insert(&mut self, key: &str, how: ValueMatch) -> &mut Node {
        let entry = self.keys.entry(key.to_owned()).or_default();
        match how {
            ValueMatch::Any => entry.any.get_or_insert_with(Box::default),
            ValueMatch::Exact(value) => entry.exact.entry(value).or_default(),
            ValueMatch::Prefix(prefix) => {
                let at = match entry.prefixes.iter().position(|(p, _)| *p == prefix) {
                    Some(at) => at,
                    None => {
                        // Keep longest-first order; equal lengths keep file order.
                        let at = entry
                            .prefixes
                            .iter()
                            .position(|(p, _)| p.len() < prefix.len())
                            .unwrap_or(entry.prefixes.len());
                        entry.prefixes.insert(at, (prefix, Node::default()));
                        at
                    }
                };
                // `at` is in bounds: found or just inserted there.
                &mut entry.prefixes[at].1
            }
        }
    }

    /// The child matching one request entry: exact value, else longest matching prefix, else
    /// key-only.
    pub fn child(&self, key: &str, value: &str) -> Option<&Node> {
        let children = self.keys.get(key)?;
        if let Some(node) = children.exact.get(value) {
            return Some(node);
        }
        if let Some((_, node)) = children
            .prefixes
            .iter()
            .find(|(p, _)| value.starts_with(p.as_str()))
        {
            return Some(node);
        }
        children.any.as_deref()
    }

    /// The node reached by walking all `entries`; `None` when some entry has no matching child
    /// or there are no entries.
    pub fn walk<K: AsRef<str>, V: AsRef<str>>(&self, entries: &[(K, V)]) -> Option<&Node> {
        let (first, rest) = entries.split_first()?;
        let mut node = self.child(first.0.as_ref(), first.1.as_ref())?;
        for (key, value) in rest {
            node = node.children.child(key.as_ref(), value.as_ref())?;
        }
        Some(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level() -> Level {
        let mut level = Level::default();
        level.insert("ip", ValueMatch::from_written(None)).rule = Some(0);
        level
            .insert("ip", ValueMatch::from_written(Some("10.*")))
            .rule = Some(1);
        level
            .insert("ip", ValueMatch::from_written(Some("10.1.*")))
            .rule = Some(2);
        level
            .insert("ip", ValueMatch::from_written(Some("10.1.2.3")))
            .rule = Some(3);
        level
            .insert("ip", ValueMatch::from_written(Some("1*")))
            .rule = Some(4);
        level
    }

    fn rule(level: &Level, value: &str) -> Option<usize> {
        level.child("ip", value).and_then(|n| n.rule)
    }

    #[test]
    fn exact_then_longest_prefix_then_any() {
        let level = level();
        assert_eq!(rule(&level, "10.1.2.3"), Some(3));
        assert_eq!(rule(&level, "10.1.2.4"), Some(2));
        assert_eq!(rule(&level, "10.2.0.1"), Some(1));
        assert_eq!(rule(&level, "11.0.0.1"), Some(4));
        assert_eq!(rule(&level, "192.168.0.1"), Some(4));
        assert_eq!(rule(&level, "8.8.8.8"), Some(0));
        assert_eq!(rule(&level, ""), Some(0));
        assert!(level.child("other", "10.1.2.3").is_none());
    }

    #[test]
    fn empty_value_means_any_and_star_alone_is_an_empty_prefix() {
        assert_eq!(ValueMatch::from_written(Some("")), ValueMatch::Any);
        assert_eq!(
            ValueMatch::from_written(Some("*")),
            ValueMatch::Prefix(String::new())
        );
        assert_eq!(
            ValueMatch::from_written(Some("a*")),
            ValueMatch::Prefix("a".into())
        );
        assert_eq!(
            ValueMatch::from_written(Some("a*b")),
            ValueMatch::Exact("a*b".into())
        );
    }

    #[test]
    fn walking_requires_every_entry_to_match() {
        let mut level = Level::default();
        let a = level.insert("a", ValueMatch::Any);
        a.children.insert("b", ValueMatch::Exact("x".into())).rule = Some(7);
        assert_eq!(
            level.walk(&[("a", "1"), ("b", "x")]).and_then(|n| n.rule),
            Some(7)
        );
        assert!(level.walk(&[("a", "1"), ("b", "y")]).is_none());
        assert!(level.walk(&[("a", "1"), ("b", "x"), ("c", "z")]).is_none());
        assert!(level.walk::<&str, &str>(&[]).is_none());
    }
}
