//! envoyproxy/ratelimit configurations load unchanged, and tollgate's extensions on top.

// Helpers outside `#[test]` functions are test code too; the workspace lints aim at library code.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use tollgate::core::Algorithm;
use tollgate::policy::{Policy, Rule, Unit};

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/policies")
        .join(name)
}

fn load(name: &str) -> Policy {
    match Policy::load(&example(name)) {
        Ok(policy) => policy,
        Err(errors) => panic!("{name} should load:\n{errors}"),
    }
}

/// (name, requests per period, period, line, column) of a limited rule.
fn summary(rule: &Rule) -> (String, Option<(u64, Duration)>, usize, usize) {
    let limit = rule.limit.map(|p| (p.limit(), p.period()));
    (
        rule.name.clone(),
        limit,
        rule.location.line,
        rule.location.column,
    )
}

const SEC: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn an_unmodified_envoy_config_loads_with_every_rule_in_file_order() {
    let policy = load("envoy.yaml");
    assert_eq!(policy.domains().collect::<Vec<_>>(), ["edge"]);

    let rules: Vec<_> = policy.rules().iter().map(|r| summary(r)).collect();
    let s = |name: &str, limit: Option<(u64, Duration)>, line, column| {
        (name.to_owned(), limit, line, column)
    };
    assert_eq!(
        rules,
        [
            s("remote_address", Some((10, SEC)), 9, 7),
            s("remote_address_10.0.*", Some((5000, HOUR)), 16, 7),
            s("remote_address_10.*", Some((1000, HOUR)), 23, 7),
            s("remote_address_10.0.0.1", None, 30, 7),
            s(
                "message_type_marketing.to_number",
                Some((5, 86_400 * SEC)),
                39,
                11
            ),
            s("specific_limit", Some((5, SEC)), 48, 11),
            s("key_2_value_2.user_bkthomps", Some((10, SEC)), 58, 11),
            s("service.user_user-a", Some((10, 60 * SEC)), 68, 11),
            s("service.user_user-b", Some((20, 7 * 86_400 * SEC)), 74, 11),
            s("database_users", Some((500, 30 * 86_400 * SEC)), 79, 17),
            s(
                "database_default",
                Some((100_000, 365 * 86_400 * SEC)),
                82,
                17
            ),
        ]
    );
    for (i, rule) in policy.rules().iter().enumerate() {
        assert_eq!(rule.index, i);
        assert_eq!(rule.domain, "edge");
        assert!(
            rule.location.file.ends_with("envoy.yaml"),
            "{}",
            rule.location
        );
        if let Some(params) = rule.limit {
            assert_eq!(params.algorithm(), Algorithm::FixedWindow, "{}", rule.name);
        }
    }
}

#[test]
fn envoy_flags_units_and_replaces_are_kept() {
    let policy = load("envoy.yaml");
    let rules = policy.rules();
    let shadowed: Vec<&str> = rules
        .iter()
        .filter(|r| r.is_shadow())
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(shadowed, ["remote_address_10.*", "service.user_user-a"]);
    let detailed: Vec<&str> = rules
        .iter()
        .filter(|r| r.detailed_metric)
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(detailed, ["message_type_marketing.to_number"]);
    assert!(rules[3].is_unlimited());
    assert_eq!(rules[3].unit, None);
    assert_eq!(rules[0].unit, Some(Unit::Second));
    assert_eq!(rules[7].unit, Some(Unit::Minute));
    assert_eq!(rules[9].unit, Some(Unit::Month));
    assert_eq!(rules[6].replaces, ["specific_limit"]);
    assert!(
        rules
            .iter()
            .filter(|r| r.index != 6)
            .all(|r| r.replaces.is_empty())
    );
}

#[test]
fn envoy_config_matches_like_envoy() {
    let policy = load("envoy.yaml");
    let name = |entries: &[(&str, &str)]| policy.find("edge", entries).map(|r| r.name.as_str());
    assert_eq!(
        name(&[("remote_address", "192.0.2.1")]),
        Some("remote_address")
    );
    assert_eq!(
        name(&[("remote_address", "10.9.9.9")]),
        Some("remote_address_10.*")
    );
    assert_eq!(
        name(&[("remote_address", "10.0.7.7")]),
        Some("remote_address_10.0.*")
    );
    assert_eq!(
        name(&[("remote_address", "10.0.0.1")]),
        Some("remote_address_10.0.0.1")
    );
    assert_eq!(
        name(&[("message_type", "marketing"), ("to_number", "2061111111")]),
        Some("message_type_marketing.to_number")
    );
    // README example 4: a request deeper or shallower than the configured rule does not match.
    assert_eq!(name(&[("message_type", "marketing")]), None);
    assert_eq!(
        name(&[
            ("message_type", "transactional"),
            ("to_number", "2061111111")
        ]),
        None
    );
    assert_eq!(
        name(&[("key_1", "value_1"), ("user", "bkthomps")]),
        Some("specific_limit")
    );
    assert_eq!(
        name(&[("service", "auth"), ("user", "user-b")]),
        Some("service.user_user-b")
    );
    assert_eq!(name(&[("service", "auth"), ("user", "user-c")]), None);
    assert_eq!(name(&[("database", "users")]), Some("database_users"));
    assert_eq!(name(&[("database", "orders")]), None);
}

#[test]
fn extensions_give_any_period_algorithm_and_burst() {
    let policy = load("api.yaml");
    let names: Vec<&str> = policy.rules().iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "tenant",
            "login_per_tenant",
            "remote_address_10.*",
            "api_key_internal",
            "per_user"
        ]
    );

    let per_user = &policy.rules()[4];
    let params = per_user.limit.expect("per_user is limited");
    assert_eq!(params.algorithm(), Algorithm::Gcra);
    assert_eq!(params.limit(), 10);
    assert_eq!(params.period(), Duration::from_secs(30));
    assert_eq!(params.burst(), 20);
    assert_eq!(per_user.unit, None);
    assert_eq!(per_user.replaces, ["login_per_tenant"]);
    assert_eq!((per_user.location.line, per_user.location.column), (21, 7));

    let wildcard = &policy.rules()[2];
    assert!(wildcard.is_shadow() && wildcard.detailed_metric);
    assert!(policy.rules()[3].is_unlimited());
    // Without `burst` the bucket is the limit.
    assert_eq!(policy.rules()[0].limit.map(|p| p.burst()), Some(100));
}

#[test]
fn periods_accept_humantime_spellings() {
    for (written, expected) in [
        ("30s", Duration::from_secs(30)),
        ("5m", Duration::from_secs(300)),
        ("1h30m", Duration::from_secs(5400)),
        ("500ms", Duration::from_millis(500)),
        ("2days", Duration::from_secs(172_800)),
    ] {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{period: {written}, requests_per_unit: 3, algorithm: token_bucket}}\n"
        );
        let policy =
            Policy::from_yaml("p.yaml", &yaml).unwrap_or_else(|e| panic!("{written}: {e}"));
        let params = policy.rules()[0].limit.unwrap();
        assert_eq!(params.period(), expected, "{written}");
        assert_eq!(params.algorithm(), Algorithm::TokenBucket);
    }
}

#[test]
fn unknown_domain_and_empty_descriptor_match_nothing() {
    let policy = load("api.yaml");
    assert!(policy.find("edge", &[("tenant", "acme")]).is_none());
    assert!(policy.find::<&str, &str>("api", &[]).is_none());
    assert_eq!(
        policy.find("api", &[("tenant", "acme")]).map(|r| r.index),
        Some(0)
    );
}

/// upstream's test/config/metadata.yaml loads; each rule keeps its descriptor's `metadata`
/// mapping (nested ones included). Anything but a mapping is refused with its position.
#[test]
fn descriptor_metadata_is_kept_on_its_rule() {
    let policy = Policy::from_yaml(
        "metadata.yaml",
        "domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: service_1
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota:
        name: service_2
        weights: [1, 2.5, true, null]
",
    )
    .unwrap();
    let metadata = |entries: &[(&str, &str)]| {
        policy
            .find("test-domain", entries)
            .unwrap()
            .metadata
            .clone()
            .map(serde_json::Value::Object)
    };
    assert_eq!(
        metadata(&[("key1", "value1"), ("subkey1", "x")]),
        Some(serde_json::json!({"name": "service_1"}))
    );
    assert_eq!(
        metadata(&[("key1", "value1"), ("subkey1", "subvalue1")]),
        None
    );
    assert_eq!(
        metadata(&[("key2", "k")]),
        Some(
            serde_json::json!({"service_with_quota": {"name": "service_2", "weights": [1, 2.5, true, null]}})
        )
    );
    let refused = Policy::from_yaml(
        "t.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    metadata: [1, 2]\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "t.yaml:4:15: `metadata` must be a mapping, such as `{name: service_1}`"
    );
}
