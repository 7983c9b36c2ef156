//! envoyproxy/ratelimit's `quota_mode` on a descriptor, and the policy-wide default `charge`
//! (`serve --default-charge`) for rules that leave it out.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use tollgate::policy::{ChargeMode, Policy, PolicyDefaults};

/// One descriptor `k` with `fields` beside its `rate_limit` (`fields` on line 4).
fn descriptor(fields: &str, rate_limit: &str) -> String {
    format!(
        "domain: a\ndescriptors:\n  - key: k\n    {fields}\n    rate_limit: {{unit: second, requests_per_unit: 10{rate_limit}}}\n"
    )
}

fn only_error(yaml: &str) -> String {
    match Policy::from_yaml("t.yaml", yaml) {
        Ok(policy) => panic!("expected an error, got {policy:?}"),
        Err(errors) => {
            assert_eq!(errors.0.len(), 1, "{errors}");
            errors.to_string()
        }
    }
}

#[test]
fn quota_mode_is_read_from_the_descriptor() {
    let quota = |fields: &str| {
        let policy = Policy::from_yaml("t.yaml", &descriptor(fields, "")).unwrap();
        policy.rules()[0].quota_mode
    };
    assert!(quota("quota_mode: true"));
    assert!(!quota("quota_mode: false"));
    assert!(!quota("detailed_metric: true"));
    // With shadow mode too, as upstream's files combine them.
    let policy = Policy::from_yaml(
        "t.yaml",
        &descriptor("quota_mode: true\n    shadow_mode: true", ""),
    )
    .unwrap();
    assert!(policy.rules()[0].quota_mode);
    assert!(policy.rules()[0].is_shadow());
}

#[test]
fn a_bad_quota_mode_is_an_error_with_its_line() {
    let error = only_error(&descriptor("quota_mode: sometimes", ""));
    assert!(error.starts_with("t.yaml:4:"), "{error}");
    let error = only_error(&descriptor("quota_mode: true", ", local_budget: 5"));
    assert_eq!(
        error,
        "t.yaml:4:17: `quota_mode: true` cannot be used with `local_budget`: whether an over \
         quota denies depends on the request's other quota limits, which a replica's \
         reservation does not see"
    );
    // Misspelled, it is an unknown field, as before.
    let error = only_error(&descriptor("quota: true", ""));
    assert!(error.starts_with("t.yaml:4:5:"), "{error}");
}

#[test]
fn the_default_charge_applies_to_rules_without_one() {
    let up_to_limit = PolicyDefaults {
        charge: ChargeMode::UpToLimit,
    };
    let charges_up_to_limit = |rate_limit: &str, defaults: PolicyDefaults| {
        let sources = [(
            "t.yaml".to_owned(),
            descriptor("detailed_metric: false", rate_limit),
        )];
        let policy = Policy::from_sources_with(&sources, defaults).unwrap();
        policy.rules()[0].limit.unwrap().charges_up_to_limit()
    };
    assert!(charges_up_to_limit("", up_to_limit));
    assert!(!charges_up_to_limit("", PolicyDefaults::default()));
    // A rule's own `charge` wins.
    assert!(!charges_up_to_limit(", charge: whole", up_to_limit));
    assert!(charges_up_to_limit(
        ", charge: up_to_limit",
        PolicyDefaults::default()
    ));
    // A local budget serves only what fits whole: the default leaves it so, without an error.
    assert!(!charges_up_to_limit(", local_budget: 5", up_to_limit));
    // An unlimited rule has nothing to charge.
    let unlimited = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n";
    let sources = [("t.yaml".to_owned(), unlimited.to_owned())];
    let policy = Policy::from_sources_with(&sources, up_to_limit).unwrap();
    assert!(policy.rules()[0].limit.is_none());
    assert_eq!(
        "up_to_limit".parse::<ChargeMode>(),
        Ok(ChargeMode::UpToLimit)
    );
    assert_eq!(
        "all".parse::<ChargeMode>().unwrap_err().to_string(),
        "unknown charge `all`, expected whole or up_to_limit"
    );
}
