//! `/metrics` has, for each rule, only the series the rule can produce, each at 0 from the
//! policy's load: its mode's two outcomes among decisions and among checks, and its failure
//! posture's degraded decisions; none for a rule without a limit. A reload that changes a rule's
//! mode or posture continues its counters, so that no series Prometheus sees ever goes down.
//!
//! The whole text is read with the test kit's parser, which fails on a family without HELP or
//! TYPE, a family twice, or a series twice.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::sync::Arc;

use tollgate::clock::ManualClock;
use tollgate::lifecycle::{Lifecycle, Origin};
use tollgate::limiter::{CheckRequest, FailureSettings, Limiter, RequestDescriptor};
use tollgate::policy::Policy;
use tollgate::resilience::Posture;
use tollgate::store::{MemoryStore, StoreBackend};
use tollgate_core::Timestamp;
use tollgate_testkit::prometheus::{Exposition, parse};

/// The per-rule families.
const DECISIONS: &str = "tollgate_decisions_total";
const CHECKS: &str = "tollgate_checks_total";
const DEGRADED: &str = "tollgate_degraded_decisions_total";

/// A limiter on the memory store whose rules without `on_store_error` take `posture`.
fn limiter(policy: &str, posture: Posture) -> Arc<Limiter> {
    // Aligned to a minute, so that no window rolls over in a test.
    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
        1_700_000_040_000_000,
    )));
    let store = StoreBackend::Memory(MemoryStore::new(clock.clone()));
    let settings = FailureSettings {
        posture,
        ..FailureSettings::default()
    };
    let policy = Policy::from_yaml("policy.yaml", policy).unwrap();
    Arc::new(Limiter::with_failure_settings(
        policy, store, settings, clock,
    ))
}

/// Sends one descriptor `key=value` of cost `cost` in domain `api`, `times` times.
async fn send(limiter: &Limiter, key: &str, value: &str, cost: u64, times: usize) {
    for _ in 0..times {
        let entries = vec![(key.to_owned(), value.to_owned())];
        let descriptor = RequestDescriptor::new(entries, cost, None).unwrap();
        let request = CheckRequest::new("api".into(), vec![descriptor]).unwrap();
        limiter.check(&request).await.unwrap();
    }
}

/// Family `name`'s series as `rule/label` (`label` the outcome, or the posture), with values.
fn series(text: &Exposition, name: &str, label: &str) -> BTreeMap<String, f64> {
    let family = text
        .family(name)
        .unwrap_or_else(|| panic!("no family {name}"));
    family
        .samples
        .iter()
        .map(|s| {
            let rule = s.label("rule").unwrap();
            (format!("{rule}/{}", s.label(label).unwrap()), s.value)
        })
        .collect()
}

fn names(series: &BTreeMap<String, f64>) -> BTreeSet<&str> {
    series.keys().map(String::as_str).collect()
}

/// One rule of each mode and posture (the server's posture, `closed` here, where the rule sets
/// none), a rule without a limit, and a rule of limit 0.
const EVERY_KIND: &str = "domain: api
descriptors:
  - key: e
    rate_limit: {name: enforce_default, unit: minute, requests_per_unit: 1}
  - key: eo
    rate_limit: {name: enforce_open, unit: minute, requests_per_unit: 1, on_store_error: open}
  - key: s
    rate_limit: {name: shadow_local, unit: minute, requests_per_unit: 1, mode: shadow, on_store_error: local}
  - key: sc
    rate_limit: {name: shadow_closed, unit: minute, requests_per_unit: 1, mode: shadow, on_store_error: closed}
  - key: f
    rate_limit: {name: soft_open, unit: minute, requests_per_unit: 1, mode: soft, on_store_error: open}
  - key: fl
    rate_limit: {name: soft_default, unit: minute, requests_per_unit: 1, mode: soft}
  - key: z
    rate_limit: {name: blocked, unit: minute, requests_per_unit: 0}
  - key: internal
    rate_limit: {unlimited: true}
";

#[tokio::test]
async fn each_rule_has_the_series_its_mode_and_posture_can_produce() {
    let limiter = limiter(EVERY_KIND, Posture::Closed);
    let text = parse(&limiter.render_metrics().await);
    let outcomes = [
        ("enforce_default", "denied"),
        ("enforce_open", "denied"),
        ("shadow_local", "shadow_would_deny"),
        ("shadow_closed", "shadow_would_deny"),
        ("soft_open", "soft_exceeded"),
        ("soft_default", "soft_exceeded"),
        ("blocked", "denied"),
    ];
    let expected: BTreeSet<String> = outcomes
        .iter()
        .flat_map(|(rule, over)| [format!("{rule}/allowed"), format!("{rule}/{over}")])
        .collect();
    let expected: BTreeSet<&str> = expected.iter().map(String::as_str).collect();
    for family in [DECISIONS, CHECKS] {
        let found = series(&text, family, "outcome");
        assert_eq!(names(&found), expected, "{family}");
        assert!(found.values().all(|v| *v == 0.0), "at 0 before any traffic");
    }
    let degraded = series(&text, DEGRADED, "posture");
    assert_eq!(
        names(&degraded),
        BTreeSet::from([
            "blocked/closed",
            "enforce_default/closed",
            "enforce_open/open",
            "shadow_closed/closed",
            "shadow_local/local",
            "soft_default/closed",
            "soft_open/open",
        ])
    );
    // Five series a rule with a limit, none for the unlimited one.
    let per_rule: usize = [DECISIONS, CHECKS, DEGRADED]
        .iter()
        .map(|f| text.family(f).unwrap().samples.len())
        .sum();
    assert_eq!(per_rule, 7 * 5);

    // Traffic lands in those series: over each limit once, and a check.
    for key in ["e", "eo", "s", "sc", "f", "fl"] {
        send(&limiter, key, "x", 1, 2).await;
    }
    send(&limiter, "s", "y", 0, 1).await;
    let text = parse(&limiter.render_metrics().await);
    let decisions = series(&text, DECISIONS, "outcome");
    for (rule, over) in &outcomes[..6] {
        assert_eq!(decisions[&format!("{rule}/allowed")], 1.0, "{rule}");
        assert_eq!(decisions[&format!("{rule}/{over}")], 1.0, "{rule}");
    }
    assert_eq!(
        series(&text, CHECKS, "outcome")["shadow_local/allowed"],
        1.0
    );
    assert_eq!(names(&decisions), expected, "no series appeared");
}

/// The figure of issue 22: samples in the whole text for 15,000 rules before any traffic, a
/// third of them in each mode. Five a rule, where every rule had eleven.
#[tokio::test]
async fn fifteen_thousand_rules_render_five_series_each() {
    const RULES: usize = 15_000;
    let mut policy = String::from("domain: api\ndescriptors:\n");
    for i in 0..RULES {
        let mode = ["enforce", "shadow", "soft"][i % 3];
        writeln!(
            policy,
            "  - {{key: k, value: v{i}, rate_limit: {{name: r{i}, unit: minute, requests_per_unit: 10, mode: {mode}}}}}"
        )
        .unwrap();
    }
    let limiter = limiter(&policy, Posture::Open);
    let text = parse(&limiter.render_metrics().await);
    let per_rule: usize = [DECISIONS, CHECKS, DEGRADED]
        .iter()
        .map(|f| text.family(f).unwrap().samples.len())
        .sum();
    println!(
        "{RULES} rules: {} samples in all, {per_rule} in the per-rule families",
        text.sample_count()
    );
    assert_eq!(per_rule, 5 * RULES);
    assert!(
        text.sample_count() < 5 * RULES + 100,
        "{} samples",
        text.sample_count()
    );
}

const ENFORCED: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 1}
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 1, on_store_error: closed}
";

/// `per_user` in shadow mode, `per_tenant` with the `local` posture.
const SHADOWED: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 1, mode: shadow}
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 1, on_store_error: local}
";

/// Every scrape's series, by name and labels.
type Scrape = BTreeMap<String, f64>;

fn scrape(text: &Exposition) -> Scrape {
    let mut out = BTreeMap::new();
    for family in [DECISIONS, CHECKS, DEGRADED] {
        for sample in &text.family(family).unwrap().samples {
            let labels: Vec<String> = sample
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            out.insert(
                format!("{}{{{}}}", sample.name, labels.join(",")),
                sample.value,
            );
        }
    }
    out
}

/// Reloads that change a rule's mode and another's posture, there and back, with traffic
/// between: a series that is no longer produced disappears, and no series is ever seen lower
/// than it was before (Prometheus would read that as a counter reset).
#[tokio::test]
async fn a_reload_changing_mode_or_posture_keeps_every_series_monotonic() {
    let limiter = limiter(ENFORCED, Posture::Open);
    let sources = |text: &str| vec![("policy.yaml".to_owned(), text.to_owned())];
    let lifecycle = Lifecycle::new(limiter.clone(), None, sources(ENFORCED));
    let mut scrapes: Vec<Scrape> = Vec::new();
    let mut take = async |limiter: &Limiter| {
        let text = parse(&limiter.render_metrics().await);
        scrapes.push(scrape(&text));
        scrapes.last().unwrap().clone()
    };

    // Enforced: 1 allowed, 2 denied (windows of a minute on a clock that does not move).
    send(&limiter, "user", "a", 1, 3).await;
    let first = take(&limiter).await;
    let user = |outcome: &str| format!("{DECISIONS}{{domain=api,rule=per_user,outcome={outcome}}}");
    assert_eq!(first[&user("allowed")], 1.0);
    assert_eq!(first[&user("denied")], 2.0);
    assert!(!first.contains_key(&user("shadow_would_deny")));

    // Shadowed: `denied` disappears, `shadow_would_deny` appears at 0, `allowed` continues.
    lifecycle.activate(sources(SHADOWED), Origin::Push).unwrap();
    let second = take(&limiter).await;
    assert!(!second.contains_key(&user("denied")), "{second:#?}");
    assert_eq!(second[&user("shadow_would_deny")], 0.0);
    assert_eq!(second[&user("allowed")], 1.0, "continued, not reset");
    let tenant =
        |posture: &str| format!("{DEGRADED}{{domain=api,rule=per_tenant,posture={posture}}}");
    assert!(second.contains_key(&tenant("local")) && !second.contains_key(&tenant("closed")));
    send(&limiter, "user", "a", 1, 2).await;
    let third = take(&limiter).await;
    assert_eq!(third[&user("shadow_would_deny")], 2.0);

    // Enforced again: `denied` comes back at the 2 it had, not at 0.
    lifecycle.activate(sources(ENFORCED), Origin::Push).unwrap();
    let fourth = take(&limiter).await;
    assert_eq!(fourth[&user("denied")], 2.0);
    assert!(!fourth.contains_key(&user("shadow_would_deny")));
    send(&limiter, "user", "a", 1, 1).await;
    take(&limiter).await;
    lifecycle.rollback(None).unwrap();
    take(&limiter).await;

    let mut last: BTreeMap<&String, f64> = BTreeMap::new();
    for (n, scrape) in scrapes.iter().enumerate() {
        for (series, value) in scrape {
            if let Some(before) = last.insert(series, *value) {
                assert!(
                    *value >= before,
                    "scrape {n}: {series} went from {before} to {value}"
                );
            }
        }
    }
}
