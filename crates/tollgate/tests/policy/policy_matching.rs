//! Descriptor matching follows envoyproxy/ratelimit: per level exact value, then the first
//! matching wildcard in file order, then key-only; the rule is the one of the node the last
//! entry reaches.

// Helpers outside `#[test]` functions are test code too; the workspace lints aim at library code.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use tollgate::policy::Policy;

const POLICY: &str = "
domain: m
descriptors:
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 1, name: ip_any}
  - key: ip
    value: '10.*'
    rate_limit: {unit: second, requests_per_unit: 2, name: ip_10}
  - key: ip
    value: '10.1.*'
    rate_limit: {unit: second, requests_per_unit: 3, name: ip_10_1}
  - key: ip
    value: 10.1.2.3
    rate_limit: {unit: second, requests_per_unit: 4, name: ip_exact}
  - key: tenant
    value: '*'
    rate_limit: {unit: second, requests_per_unit: 5, name: tenant_star}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 6, name: tenant_any}
  - key: org
    descriptors:
      - key: team
        value: core
        rate_limit: {unit: second, requests_per_unit: 7, name: core_team}
        descriptors:
          - key: user
            rate_limit: {unit: second, requests_per_unit: 8, name: core_user}
      - key: team
        descriptors:
          - key: user
            value: admin*
            rate_limit: {unit: second, requests_per_unit: 9, name: team_admin}
";

fn policy() -> Policy {
    Policy::from_yaml("m.yaml", POLICY).unwrap_or_else(|e| panic!("{e}"))
}

fn name<'p>(policy: &'p Policy, entries: &[(&str, &str)]) -> Option<&'p str> {
    policy.find("m", entries).map(|rule| rule.name.as_str())
}

#[test]
fn exact_beats_wildcard_beats_key_only() {
    let p = policy();
    assert_eq!(name(&p, &[("ip", "10.1.2.3")]), Some("ip_exact"));
    assert_eq!(name(&p, &[("ip", "10.2.0.1")]), Some("ip_10"));
    assert_eq!(name(&p, &[("ip", "192.0.2.1")]), Some("ip_any"));
}

#[test]
fn the_first_matching_wildcard_in_file_order_wins() {
    let p = policy();
    // `10.*` comes first in the file, so `10.1.*` after it never matches: envoyproxy/ratelimit
    // tries a level's wildcards in file order.
    assert_eq!(name(&p, &[("ip", "10.1.2.4")]), Some("ip_10"));
    assert_eq!(name(&p, &[("ip", "10.1.")]), Some("ip_10"));
    assert_eq!(name(&p, &[("ip", "10.")]), Some("ip_10"));
    assert_eq!(name(&p, &[("ip", "10")]), Some("ip_any"));
    // A `*` in a request value is just a character the wildcard matches.
    assert_eq!(name(&p, &[("ip", "10.*")]), Some("ip_10"));
    // Listed the other way round, the more specific one is reached.
    let q = Policy::from_yaml(
        "q.yaml",
        "domain: m
descriptors:
  - key: ip
    value: '10.1.*'
    rate_limit: {unit: second, requests_per_unit: 3, name: ip_10_1}
  - key: ip
    value: '10.*'
    rate_limit: {unit: second, requests_per_unit: 2, name: ip_10}
",
    )
    .unwrap();
    assert_eq!(name(&q, &[("ip", "10.1.2.4")]), Some("ip_10_1"));
    assert_eq!(name(&q, &[("ip", "10.2.0.1")]), Some("ip_10"));
}

/// envoyproxy/ratelimit's test/config/wildcard.yaml, with its expectations.
#[test]
fn a_star_anywhere_matches_as_upstream_does() {
    let p = Policy::from_yaml(
        "wildcard.yaml",
        "domain: m
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20, name: wild}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20, name: mid}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 10, name: multi}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 20, name: nested}
",
    )
    .unwrap();
    assert_eq!(name(&p, &[("wild", "foo1")]), Some("wild"));
    assert_eq!(name(&p, &[("wild", "foo")]), Some("wild"));
    assert_eq!(
        name(&p, &[("nestedWild", "val1"), ("wild", "goo2")]),
        Some("nested")
    );
    assert_eq!(name(&p, &[("midWild", "barxxb")]), Some("mid"));
    assert_eq!(name(&p, &[("midWild", "barb")]), Some("mid"));
    assert_eq!(name(&p, &[("midWild", "bara")]), None);
    assert_eq!(name(&p, &[("midWild", "xbarb")]), None);
    assert_eq!(name(&p, &[("multiWild", "foo123bar456baz")]), Some("multi"));
    assert_eq!(name(&p, &[("multiWild", "foobarbaz")]), Some("multi"));
    assert_eq!(name(&p, &[("multiWild", "foo123baz")]), None);
    assert_eq!(name(&p, &[("multiWild", "bar456baz")]), None);
    // A wildcard matches its own key's values only.
    assert_eq!(name(&p, &[("midWild", "foo1")]), None);
}

#[test]
fn share_threshold_on_a_middle_wildcard_shares_that_level_only() {
    let p = Policy::from_yaml(
        "share.yaml",
        "domain: m
descriptors:
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100, name: shared}
  - key: route
    value: svc*ep*rpc
    rate_limit: {unit: minute, requests_per_unit: 50, name: apart}
",
    )
    .unwrap();
    let shared = p.find("m", &[("midpath", "/api-beta-v1")]).unwrap();
    assert_eq!(shared.name, "shared");
    assert_eq!(shared.shared_levels, 1);
    assert!(p.find("m", &[("midpath", "/api/v2")]).is_none());
    let apart = p.find("m", &[("route", "svcXepYrpc")]).unwrap();
    assert_eq!(apart.name, "apart");
    assert_eq!(apart.shared_levels, 0);
}

#[test]
fn a_bare_star_matches_any_value_before_key_only() {
    let p = policy();
    assert_eq!(name(&p, &[("tenant", "acme")]), Some("tenant_star"));
    assert_eq!(name(&p, &[("tenant", "")]), Some("tenant_star"));
}

#[test]
fn the_rule_is_the_one_reached_by_the_last_entry() {
    let p = policy();
    assert_eq!(
        name(&p, &[("org", "o1"), ("team", "core")]),
        Some("core_team")
    );
    assert_eq!(
        name(&p, &[("org", "o1"), ("team", "core"), ("user", "bob")]),
        Some("core_user")
    );
    assert_eq!(
        name(&p, &[("org", "o1"), ("team", "infra"), ("user", "admin7")]),
        Some("team_admin")
    );
}

#[test]
fn partial_or_unmatched_descriptors_give_none() {
    let p = policy();
    // `org` has no rate_limit of its own: a node reached earlier is not used.
    assert_eq!(name(&p, &[("org", "o1")]), None);
    // Key-only `team` has no rate_limit either.
    assert_eq!(name(&p, &[("org", "o1"), ("team", "infra")]), None);
    // No key-only `user` under key-only `team`.
    assert_eq!(
        name(&p, &[("org", "o1"), ("team", "infra"), ("user", "bob")]),
        None
    );
    // No backtracking: `core` is chosen for `team`, and its `user` child is key-only, so the
    // wildcard `admin*` under the key-only `team` is never tried.
    assert_eq!(
        name(&p, &[("org", "o1"), ("team", "core"), ("user", "admin7")]),
        Some("core_user")
    );
    // More entries than the tree is deep.
    assert_eq!(name(&p, &[("ip", "10.1.2.3"), ("path", "/")]), None);
    // Entries out of order, unknown keys, and keys are case-sensitive.
    assert_eq!(name(&p, &[("team", "core"), ("org", "o1")]), None);
    assert_eq!(name(&p, &[("port", "443")]), None);
    assert_eq!(name(&p, &[("IP", "10.1.2.3")]), None);
    assert_eq!(name(&p, &[]), None);
}

#[test]
fn unknown_domain_gives_none() {
    let p = policy();
    assert_eq!(
        p.find("other", &[("ip", "10.1.2.3")]).map(|r| r.index),
        None
    );
    assert_eq!(p.find("M", &[("ip", "10.1.2.3")]).map(|r| r.index), None);
}

#[test]
fn owned_entries_match_like_borrowed_ones() {
    let p = policy();
    let entries: Vec<(String, String)> = vec![("ip".into(), "10.1.2.3".into())];
    assert_eq!(
        p.find("m", &entries).map(|r| r.name.as_str()),
        Some("ip_exact")
    );
}

#[test]
fn identities_are_injective_where_envoy_keys_collide() {
    // envoyproxy/ratelimit names both of these `a_b_c` and shares their counters.
    let p = Policy::from_yaml(
        "i.yaml",
        "domain: d
descriptors:
  - {key: a_b, value: c, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: a, value: b_c, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: a, descriptors: [{key: b, value: c, rate_limit: {unit: second, requests_per_unit: 1}}]}
  - {key: a.b, value: c, rate_limit: {unit: second, requests_per_unit: 1}}
",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let rules = p.rules();
    // Here they are told apart in names too.
    let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a_b_c", "a_b_c#2", "a.b_c", "a.b_c#2"]);
    let mut identities: Vec<&str> = rules.iter().map(|r| r.identity.as_str()).collect();
    identities.sort_unstable();
    identities.dedup();
    assert_eq!(identities.len(), 4, "{identities:?}");
    assert_eq!(p.find("d", &[("a_b", "c")]).map(|r| r.index), Some(0));
    assert_eq!(p.find("d", &[("a", "b_c")]).map(|r| r.index), Some(1));
}

#[test]
fn identities_depend_only_on_domain_and_path() {
    let v1 = Policy::from_yaml(
        "v1.yaml",
        "domain: d\ndescriptors:\n  - {key: k, value: v, rate_limit: {unit: second, requests_per_unit: 1}}\n",
    )
    .unwrap();
    // Reloaded with another limit, algorithm, name and position: same path, same identity.
    let v2 = Policy::from_yaml(
        "v2.yaml",
        "# edited\ndomain: d\ndescriptors:\n  - {key: x, rate_limit: {unlimited: true}}\n  - key: k\n    value: v\n    rate_limit: {name: renamed, period: 5m, requests_per_unit: 9, algorithm: gcra}\n",
    )
    .unwrap();
    assert_eq!(v1.rules()[0].identity, v2.rules()[1].identity);
    let other_domain = Policy::from_yaml(
        "v3.yaml",
        "domain: e\ndescriptors:\n  - {key: k, value: v, rate_limit: {unit: second, requests_per_unit: 1}}\n",
    )
    .unwrap();
    assert_ne!(v1.rules()[0].identity, other_domain.rules()[0].identity);
}
