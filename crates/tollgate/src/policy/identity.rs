//! Injective encoding of a rule's place in the policy, used as the stable part of counter keys.
//!
//! envoyproxy/ratelimit joins keys and values with a raw `_` and `.`, so key `a_b` with value `c`
//! and key `a` with value `b_c` share counters. Here every component is length-prefixed and
//! tagged, so the encoding can be decoded back and two different paths never collide.

use std::fmt::Write as _;

/// One level of a rule's path: the descriptor `key` and, unless the descriptor matches any
/// value, its `value` (as written, so a wildcard keeps its trailing `*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PathStep<'a> {
    pub key: &'a str,
    pub value: Option<&'a str>,
    /// `share_threshold: true`: the values this step's wildcard matches share one counter.
    pub shared: bool,
}

/// Encodes `domain` and `path` as `d<len>:<domain>` followed by `k<len>:<key>` and, for a
/// descriptor with a value, `v<len>:<value>` per level. Lengths are in bytes.
pub(super) fn encode(domain: &str, path: &[PathStep<'_>]) -> String {
    let mut out = String::with_capacity(
        8 + domain.len()
            + path
                .iter()
                .map(|s| 16 + s.key.len() + s.value.map_or(0, str::len))
                .sum::<usize>(),
    );
    push(&mut out, 'd', domain);
    for step in path {
        push(&mut out, 'k', step.key);
        if let Some(value) = step.value {
            push(&mut out, 'v', value);
        }
    }
    out
}

fn push(out: &mut String, tag: char, text: &str) {
    // Writing to a String cannot fail.
    let _ = write!(out, "{tag}{}:{text}", text.len());
}

/// The derived rule name envoyproxy/ratelimit users know: `key` or `key_value` per level,
/// joined by `.` (not injective; only used for display and `replaces`).
pub(super) fn display_name(path: &[PathStep<'_>]) -> String {
    let mut out = String::new();
    for (i, step) in path.iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(step.key);
        if let Some(value) = step.value {
            out.push('_');
            out.push_str(value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A domain and its path of (key, value) steps.
    type Decoded = (String, Vec<(String, Option<String>)>);

    /// Decodes an identity back into (domain, path), proving the encoding is injective.
    fn decode(mut s: &str) -> Option<Decoded> {
        fn part<'a>(s: &mut &'a str) -> Option<(char, &'a str)> {
            let tag = s.chars().next()?;
            let rest = &s[tag.len_utf8()..];
            let colon = rest.find(':')?;
            let len: usize = rest[..colon].parse().ok()?;
            let text = rest.get(colon + 1..colon + 1 + len)?;
            *s = &rest[colon + 1 + len..];
            Some((tag, text))
        }
        let (tag, domain) = part(&mut s)?;
        if tag != 'd' {
            return None;
        }
        let mut path: Vec<(String, Option<String>)> = Vec::new();
        while !s.is_empty() {
            match part(&mut s)? {
                ('k', key) => path.push((key.to_owned(), None)),
                ('v', value) => path.last_mut()?.1 = Some(value.to_owned()),
                _ => return None,
            }
        }
        Some((domain.to_owned(), path))
    }

    fn step<'a>(key: &'a str, value: Option<&'a str>) -> PathStep<'a> {
        PathStep {
            key,
            value,
            shared: false,
        }
    }

    #[test]
    fn underscore_joins_that_collide_in_envoy_get_distinct_identities() {
        let a = encode("api", &[step("a_b", Some("c"))]);
        let b = encode("api", &[step("a", Some("b_c"))]);
        assert_ne!(a, b);
        assert_eq!(
            display_name(&[step("a_b", Some("c"))]),
            display_name(&[step("a", Some("b_c"))])
        );
    }

    #[test]
    fn key_only_differs_from_an_empty_looking_value_and_from_a_deeper_level() {
        let cases = [
            encode("api", &[step("a", None)]),
            encode("api", &[step("a", Some(""))]),
            encode("api", &[step("a", None), step("b", None)]),
            encode("api", &[step("a", Some("k1:b"))]),
            encode("api.a", &[]),
            encode("ap", &[step("ia", None)]),
            encode("api", &[step("a", Some("*"))]),
        ];
        for (i, x) in cases.iter().enumerate() {
            for y in &cases[i + 1..] {
                assert_ne!(x, y);
            }
        }
    }

    #[test]
    fn identities_decode_back_to_their_path() {
        let path = [
            step("tenant", None),
            step("path", Some("/lo:gin")),
            step("ü:k9", Some("v3:x")),
        ];
        let id = encode("dom:1", &path);
        assert_eq!(id, "d5:dom:1k6:tenantk4:pathv7:/lo:gink5:ü:k9v4:v3:x");
        let (domain, decoded) = decode(&id).unwrap();
        assert_eq!(domain, "dom:1");
        let expected: Vec<(String, Option<String>)> = path
            .iter()
            .map(|s| (s.key.to_owned(), s.value.map(str::to_owned)))
            .collect();
        assert_eq!(decoded, expected);
    }

    #[test]
    fn display_name_is_envoy_style() {
        assert_eq!(
            display_name(&[step("tenant", None), step("path", Some("/login"))]),
            "tenant.path_/login"
        );
    }
}
