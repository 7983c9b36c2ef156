//! Lookup tables built once per load; matching borrows the request and never allocates.

use std::collections::HashMap;

use foldhash::fast::RandomState;

/// The most wildcard values (`value`s with a `*`) one `descriptors` list may hold: a request
/// entry that matches no exact value is tried against each of its key's wildcards in turn, so
/// this bounds the scan at one level.
pub const MAX_WILDCARDS_PER_LEVEL: usize = 64;

/// Up to this many names (domains, keys at one level) are looked up by comparing each in
/// turn rather than by hashing: a decision looks up a few, and hashing a short string costs
/// more than comparing it with a few others (names are unique, so both find the same).
pub(super) const SCANNED: usize = 8;

/// How a descriptor's `value` matches a request value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum ValueMatch {
    /// No value: any value, lowest precedence.
    Any,
    /// `value: text`: exactly this value, highest precedence.
    Exact(String),
    /// A value with `*` in it: each `*` matches zero or more characters.
    Wildcard(Pattern),
}

impl ValueMatch {
    /// Classifies a `value` as written; absent or empty means any value, as in envoyproxy/ratelimit.
    pub fn from_written(value: Option<&str>) -> ValueMatch {
        match value {
            None | Some("") => ValueMatch::Any,
            Some(v) if v.contains('*') => ValueMatch::Wildcard(Pattern::new(v)),
            Some(v) => ValueMatch::Exact(v.to_owned()),
        }
    }
}

/// A wildcard value, split at its `*`s once at load time: `a*b*c` is `["a", "b", "c"]`, and a
/// value matches when it starts with the first part, ends with the last, and holds the middle
/// ones in order between them, without overlaps (each `*` matches zero or more characters).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Pattern {
    /// At least two parts (the value has at least one `*`); parts may be empty.
    parts: Vec<String>,
    /// The bytes the parts need together: a shorter value cannot match.
    fixed: usize,
}

impl Pattern {
    fn new(written: &str) -> Pattern {
        let parts: Vec<String> = written.split('*').map(str::to_owned).collect();
        let fixed = parts.iter().map(String::len).sum();
        Pattern { parts, fixed }
    }

    /// Whether `value` matches; allocates nothing. The middle parts are each taken at their
    /// first occurrence, which finds a match whenever there is one (a later occurrence only
    /// leaves less room for the parts after it).
    pub fn matches(&self, value: &str) -> bool {
        let (Some((first, rest)), true) = (self.parts.split_first(), value.len() >= self.fixed)
        else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            return value == first;
        };
        let Some(inner) = value
            .strip_prefix(first.as_str())
            .and_then(|v| v.strip_suffix(last.as_str()))
        else {
            return false;
        };
        let mut remaining = inner;
        for part in middle {
            match remaining.find(part.as_str()) {
                Some(at) => remaining = &remaining[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// The children of one node (or the top-level descriptors of a domain), by key.
///
/// Its maps hash with foldhash, seeded per map, rather than std's SipHash: a decision looks up
/// each entry's value among its level's exact values, and SipHash cost 132 instructions more a
/// decision for `path=/login` (the `limiter/nested` path of the instructions harness). The
/// tables hold the policy's values only: a caller's value is looked up, never inserted, so it
/// cannot lengthen a probe for anyone else.
#[derive(Debug, Default)]
pub(super) struct Level {
    keys: HashMap<String, KeyChildren, RandomState>,
}

#[derive(Debug, Default)]
struct KeyChildren {
    exact: HashMap<String, Node, RandomState>,
    /// In file order: the first that matches wins, as in envoyproxy/ratelimit.
    wildcards: Vec<(Pattern, Node)>,
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
            ValueMatch::Wildcard(pattern) => {
                let at = match entry.wildcards.iter().position(|(p, _)| *p == pattern) {
                    Some(at) => at,
                    None => {
                        entry.wildcards.push((pattern, Node::default()));
                        entry.wildcards.len() - 1
                    }
                };
                // `at` is in bounds: found or just pushed there.
                &mut entry.wildcards[at].1
            }
        }
    }

    /// The child matching one request entry: exact value, else the first matching wildcard in
    /// file order, else key-only.
    pub fn child(&self, key: &str, value: &str) -> Option<&Node> {
        let children = if self.keys.len() <= SCANNED {
            self.keys
                .iter()
                .find_map(|(k, c)| (k == key).then_some(c))?
        } else {
            self.keys.get(key)?
        };
        if let Some(node) = children.exact.get(value) {
            return Some(node);
        }
        if let Some((_, node)) = children.wildcards.iter().find(|(p, _)| p.matches(value)) {
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
    fn exact_then_wildcards_in_file_order_then_any() {
        let level = level();
        assert_eq!(rule(&level, "10.1.2.3"), Some(3));
        // `10.*` is before `10.1.*` in the file: it wins, as in envoyproxy/ratelimit.
        assert_eq!(rule(&level, "10.1.2.4"), Some(1));
        assert_eq!(rule(&level, "10.2.0.1"), Some(1));
        assert_eq!(rule(&level, "11.0.0.1"), Some(4));
        assert_eq!(rule(&level, "192.168.0.1"), Some(4));
        assert_eq!(rule(&level, "8.8.8.8"), Some(0));
        assert_eq!(rule(&level, ""), Some(0));
        assert!(level.child("other", "10.1.2.3").is_none());
    }

    #[test]
    fn empty_value_means_any_and_a_star_anywhere_is_a_wildcard() {
        assert_eq!(ValueMatch::from_written(Some("")), ValueMatch::Any);
        assert_eq!(
            ValueMatch::from_written(Some("ab")),
            ValueMatch::Exact("ab".into())
        );
        for written in ["*", "a*", "*b", "a*b", "a**b"] {
            assert!(
                matches!(
                    ValueMatch::from_written(Some(written)),
                    ValueMatch::Wildcard(_)
                ),
                "{written}"
            );
        }
    }

    fn matches(pattern: &str, value: &str) -> bool {
        Pattern::new(pattern).matches(value)
    }

    /// envoyproxy/ratelimit's own cases (test/config/wildcard.yaml and its share_threshold
    /// tests), and the edges of each `*` matching zero or more characters.
    #[test]
    fn each_star_matches_zero_or_more_characters_in_order() {
        for (pattern, value) in [
            ("foo*", "foo1"),
            ("foo*", "foo"),
            ("*", ""),
            ("*", "anything"),
            ("bar*b", "barxb"),
            ("bar*b", "barb"),
            ("foo*bar*baz", "foo123bar456baz"),
            ("foo*bar*baz", "foobarbaz"),
            ("/api*v1", "/api-beta-v1"),
            ("svc*ep*rpc", "svceprpc"),
            ("*end", "the end"),
            ("a*a*a", "aaa"),
            ("a**b", "ab"),
            ("x*y*x", "xyyx"),
        ] {
            assert!(matches(pattern, value), "{pattern} should match {value}");
        }
        for (pattern, value) in [
            ("bar*b", "bara"),
            ("bar*b", "xbarb"),
            ("foo*bar*baz", "foo123baz"),
            ("foo*bar*baz", "bar456baz"),
            ("foo*bar*baz", "foobazbar"),
            ("/api*v1", "/api/v2"),
            // The prefix and the suffix may not overlap.
            ("a*a", "a"),
            ("ab*ba", "aba"),
            ("a*a*a", "aa"),
            ("*end", "ending"),
        ] {
            assert!(
                !matches(pattern, value),
                "{pattern} should not match {value}"
            );
        }
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
