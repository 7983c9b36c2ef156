//! Counter keys: two different descriptors of one rule never share a key (except in the levels
//! the rule shares, `shared_levels`), nor do two rules, two override domains or periods, or a
//! rule and an override.
//!
//! Input: one byte of `shared_levels` bits, then two descriptors separated by a NUL, each an
//! identity then entries, separated by `\x01`, each entry `key\x02value`.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tollgate::core::{Algorithm, Params};
use tollgate::limiter::{RequestDescriptor, override_key_bytes, rule_key_bytes};

fn parse(text: &str) -> Option<(&str, RequestDescriptor)> {
    let mut parts = text.split('\x01');
    let identity = parts.next()?;
    let entries = parts
        .map(|entry| {
            let (key, value) = entry.split_once('\x02').unwrap_or((entry, ""));
            (key.to_string(), value.to_string())
        })
        .collect();
    Some((identity, RequestDescriptor::new(entries, 1, None).ok()?))
}

/// Whether two descriptors are one counter of a rule that shares the levels in `shared`.
fn same_counter(a: &RequestDescriptor, b: &RequestDescriptor, shared: u64) -> bool {
    a.entries().len() == b.entries().len()
        && a.entries()
            .iter()
            .zip(b.entries())
            .enumerate()
            .all(|(i, (x, y))| x.0 == y.0 && (x.1 == y.1 || (i < 64 && shared & (1 << i) != 0)))
}

fuzz_target!(|data: &[u8]| {
    let Some((&shared, rest)) = data.split_first() else {
        return;
    };
    let shared = u64::from(shared);
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let Some((a, b)) = text.split_once('\0') else {
        return;
    };
    let (Some((id_a, a)), Some((id_b, b))) = (parse(a), parse(b)) else {
        return;
    };

    let (key_a, key_b) = (
        rule_key_bytes(id_a, shared, &a),
        rule_key_bytes(id_b, shared, &b),
    );
    let same = id_a == id_b && same_counter(&a, &b, shared);
    assert_eq!(
        key_a == key_b,
        same,
        "rules {id_a:?} {a:?} and {id_b:?} {b:?}"
    );
    // Without shared levels, a key is one descriptor's alone.
    let (full_a, full_b) = (rule_key_bytes(id_a, 0, &a), rule_key_bytes(id_b, 0, &b));
    assert_eq!(full_a == full_b, id_a == id_b && a == b);

    let minute = Params::new(Algorithm::FixedWindow, 5, Duration::from_secs(60), None).unwrap();
    let hour = Params::new(Algorithm::FixedWindow, 5, Duration::from_secs(3600), None).unwrap();
    let (over_a, over_b) = (
        override_key_bytes(id_a, &a, &minute),
        override_key_bytes(id_b, &b, &minute),
    );
    assert_eq!(over_a == over_b, id_a == id_b && a == b, "overrides");
    assert_ne!(
        over_a,
        override_key_bytes(id_a, &a, &hour),
        "two periods, one key"
    );
    for rule in [&key_a, &key_b, &full_a, &full_b] {
        assert_ne!(rule, &over_a, "a rule and an override share a key");
        assert_ne!(rule, &over_b, "a rule and an override share a key");
    }
});
