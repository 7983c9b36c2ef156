//! The limiter over the memory store: matching, replaces, unlimited, overrides, metrics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::{Clock, ManualClock};
use tollgate::limiter::{
    CheckRequest, Code, FailureSettings, LimitOverride, Limiter, Override, RequestDescriptor,
};
use tollgate::metrics::Outcome;
use tollgate::policy::Policy;
use tollgate::store::{MemoryStore, StoreBackend};
use tollgate_core::{Timestamp, Verdict};

const POLICY: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
  - key: user
    value: vip
    rate_limit: {name: vip, unit: minute, requests_per_unit: 5, replaces: [{name: per_ip}]}
  - key: ip
    rate_limit: {name: per_ip, unit: minute, requests_per_unit: 1}
  - key: api_key
    value: internal
    rate_limit: {unlimited: true}
"#;

fn limiter() -> (Arc<ManualClock>, Limiter) {
    limiter_with(Policy::from_yaml("test.yaml", POLICY).unwrap())
}

/// A limiter on the memory store running `policy`, with its clock.
fn limiter_with(policy: Policy) -> (Arc<ManualClock>, Limiter) {
    // Aligned to a minute so the window does not roll over during a test.
    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
        1_700_000_040_000_000,
    )));
    let store = StoreBackend::Memory(MemoryStore::new(clock.clone()));
    let settings = FailureSettings::default();
    let limiter = Limiter::with_failure_settings(policy, store, settings, clock.clone());
    (clock, limiter)
}

fn request(descriptors: &[&[(&str, &str)]]) -> CheckRequest {
    let descriptors = descriptors
        .iter()
        .map(|entries| {
            let entries = entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            RequestDescriptor::new(entries, 1, None).unwrap()
        })
        .collect();
    CheckRequest::new("api".into(), descriptors).unwrap()
}

#[tokio::test]
async fn distinct_values_of_a_key_only_rule_have_distinct_counters() {
    let (_clock, limiter) = limiter();
    for _ in 0..2 {
        assert!(
            limiter
                .check(&request(&[&[("user", "alice")]]))
                .await
                .unwrap()
                .allowed()
        );
    }
    assert!(
        !limiter
            .check(&request(&[&[("user", "alice")]]))
            .await
            .unwrap()
            .allowed()
    );
    assert!(
        limiter
            .check(&request(&[&[("user", "bob")]]))
            .await
            .unwrap()
            .allowed()
    );
}

#[tokio::test]
async fn a_limit_replaced_by_another_matched_limit_is_skipped() {
    let (_clock, limiter) = limiter();
    // per_ip alone: 1 per minute.
    assert!(
        limiter
            .check(&request(&[&[("ip", "1.2.3.4")]]))
            .await
            .unwrap()
            .allowed()
    );
    assert!(
        !limiter
            .check(&request(&[&[("ip", "1.2.3.4")]]))
            .await
            .unwrap()
            .allowed()
    );
    // With the vip rule matched in the same request, per_ip no longer applies.
    let r = limiter
        .check(&request(&[&[("user", "vip")], &[("ip", "1.2.3.4")]]))
        .await
        .unwrap();
    assert!(r.allowed());
    assert!(r.statuses[1].limit.is_none(), "replaced");
    assert_eq!(r.statuses[0].limit.as_ref().unwrap().name(), "vip");
}

#[tokio::test]
async fn unlimited_rules_and_unknown_domains_always_allow() {
    let (_clock, limiter) = limiter();
    for _ in 0..10 {
        let r = limiter
            .check(&request(&[&[("api_key", "internal")]]))
            .await
            .unwrap();
        assert!(r.allowed());
        assert!(r.statuses[0].limit.is_none());
    }
    let d = RequestDescriptor::new(vec![("user".into(), "x".into())], 1, None).unwrap();
    let other = CheckRequest::new("elsewhere".into(), vec![d]).unwrap();
    for _ in 0..5 {
        assert!(limiter.check(&other).await.unwrap().allowed());
    }
    assert_eq!(
        tollgate::store::Store::key_count(limiter.store())
            .await
            .unwrap(),
        0,
        "nothing was stored"
    );
}

#[tokio::test]
async fn windows_reset_on_the_clock() {
    let (clock, limiter) = limiter();
    let alice = request(&[&[("user", "alice")]]);
    limiter.check(&alice).await.unwrap();
    limiter.check(&alice).await.unwrap();
    let denied = limiter.check(&alice).await.unwrap();
    assert_eq!(denied.overall, Code::OverLimit);
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(60)));
    clock.advance(Duration::from_secs(59));
    assert!(!limiter.check(&alice).await.unwrap().allowed());
    clock.advance(Duration::from_secs(1));
    assert!(limiter.check(&alice).await.unwrap().allowed());
}

#[tokio::test]
async fn an_override_gets_its_own_counter() {
    let (_clock, limiter) = limiter();
    let o = LimitOverride::new(3, Duration::from_secs(60)).unwrap();
    let d = RequestDescriptor::new(vec![("user".into(), "carol".into())], 1, Some(o)).unwrap();
    let with_override = CheckRequest::new("api".into(), vec![d]).unwrap();
    for _ in 0..3 {
        assert!(limiter.check(&with_override).await.unwrap().allowed());
    }
    assert!(!limiter.check(&with_override).await.unwrap().allowed());
    // The configured per_user counter for carol was never touched.
    let r = limiter
        .check(&request(&[&[("user", "carol")]]))
        .await
        .unwrap();
    assert_eq!(r.statuses[0].decision.unwrap().remaining, 1);
}

/// A caller that changes the limit it sends for a descriptor (a tenant moved to another tier)
/// keeps the count, as in envoyproxy/ratelimit: the counter is keyed by the period, not the
/// limit.
#[tokio::test]
async fn an_override_keeps_its_count_when_its_limit_changes() {
    let (_clock, limiter) = limiter();
    let with_limit = |n: u64| {
        let o = LimitOverride::new(n, Duration::from_secs(60)).unwrap();
        let d = RequestDescriptor::new(vec![("user".into(), "gina".into())], 1, Some(o)).unwrap();
        CheckRequest::new("api".into(), vec![d]).unwrap()
    };
    for _ in 0..2 {
        assert!(limiter.check(&with_limit(3)).await.unwrap().allowed());
    }
    let raised = limiter.check(&with_limit(5)).await.unwrap();
    assert!(raised.allowed());
    assert_eq!(
        raised.statuses[0].decision.unwrap().remaining,
        2,
        "3 of 5 used"
    );
}

/// A caller's limit of 0 blocks its descriptor, as in envoyproxy/ratelimit (it used to be
/// refused as invalid, and Envoy, failing open, then let the request through unlimited); the
/// request's other limits are charged nothing.
#[tokio::test]
async fn an_override_of_zero_blocks() {
    let (clock, limiter) = limiter();
    let blocked = {
        let o = LimitOverride::new(0, Duration::from_secs(60)).unwrap();
        RequestDescriptor::new(vec![("user".into(), "hal".into())], 1, Some(o)).unwrap()
    };
    let ip = RequestDescriptor::new(vec![("ip".into(), "10.9.9.9".into())], 1, None).unwrap();
    let both = CheckRequest::new("api".into(), vec![blocked, ip]).unwrap();
    for _ in 0..2 {
        let r = limiter.check(&both).await.unwrap();
        assert!(!r.allowed());
        assert_eq!(r.statuses[0].code, Code::OverLimit);
        let d = r.statuses[0].decision.unwrap();
        assert_eq!((d.limit, d.remaining, d.retry_after), (0, 0, None));
    }
    // As envoyproxy/ratelimit reports it: reset at the end of the minute (the clock starts
    // on one).
    clock.advance(Duration::from_secs(15));
    let r = limiter.check(&both).await.unwrap();
    let reset = r.statuses[0].decision.unwrap().reset_after;
    assert_eq!(reset, Duration::from_secs(45));
    // per_ip allows 1 a minute: still there, the blocked requests took nothing.
    let alone = limiter
        .check(&request(&[&[("ip", "10.9.9.9")]]))
        .await
        .unwrap();
    assert!(alone.allowed());
}

/// As in envoyproxy/ratelimit, a domain the policy does not know limits nothing, even with a
/// limit sent by the caller.
#[tokio::test]
async fn an_override_in_an_unknown_domain_limits_nothing() {
    let (_clock, limiter) = limiter();
    let o = LimitOverride::new(1, Duration::from_secs(60)).unwrap();
    let d = RequestDescriptor::new(vec![("user".into(), "erin".into())], 1, Some(o)).unwrap();
    let unknown = CheckRequest::new("elsewhere".into(), vec![d]).unwrap();
    for _ in 0..3 {
        let r = limiter.check(&unknown).await.unwrap();
        assert!(r.allowed());
        assert!(r.statuses[0].limit.is_none(), "no limit applied");
    }
}

#[tokio::test]
async fn outcomes_are_counted_per_rule() {
    let (_clock, limiter) = limiter();
    for _ in 0..3 {
        limiter
            .check(&request(&[&[("user", "dave")]]))
            .await
            .unwrap();
    }
    let policy = limiter.policy();
    let per_user = policy
        .rules()
        .iter()
        .find(|r| r.name == "per_user")
        .unwrap();
    assert_eq!(limiter.rule_count(per_user, Outcome::Allowed), 2);
    assert_eq!(limiter.rule_count(per_user, Outcome::Denied), 1);
    let text = limiter.render_metrics().await;
    assert!(
        text.contains(
            r#"tollgate_decisions_total{domain="api",rule="per_user",outcome="denied"} 1"#
        )
    );
    // The prefilter works on a shared store only: no gauge for it here.
    assert!(!text.contains("tollgate_prefilter_entries"), "{text}");
}

/// On the memory store, which decides in place, each decision is timed once and its store call
/// with it: every check in the decision histogram, each one that charged in the store's
/// `apply`, each explain that read a counter in `peek`; a request that matched nothing asks
/// the store nothing.
#[tokio::test]
async fn memory_decisions_and_their_store_calls_are_each_timed_once() {
    let (_clock, limiter) = limiter();
    for _ in 0..3 {
        limiter
            .check(&request(&[&[("user", "erin")]]))
            .await
            .unwrap();
    }
    limiter
        .check(&request(&[&[("nobody", "x")]]))
        .await
        .unwrap();
    limiter
        .explain(&request(&[&[("user", "erin")]]))
        .await
        .unwrap();
    let text = limiter.render_metrics().await;
    let value = |series: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(series))
            .unwrap_or_else(|| panic!("no {series} in {text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let store = |part: &str, op: &str| {
        value(&format!(
            "tollgate_store_operation_duration_seconds_{part}{{store=\"memory\",op=\"{op}\"}}"
        ))
    };
    assert_eq!(value("tollgate_decision_duration_seconds_count "), 4.0);
    assert_eq!(store("count", "apply"), 3.0);
    assert_eq!(store("count", "peek"), 1.0);
    // The store's calls were timed within their decisions, never beyond them.
    assert!(store("sum", "apply") <= value("tollgate_decision_duration_seconds_sum "));
}

/// A clock that counts how often it is read.
#[derive(Debug, Default)]
struct CountedClock {
    inner: ManualClock,
    reads: std::sync::atomic::AtomicUsize,
}

impl Clock for CountedClock {
    fn now(&self) -> Timestamp {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.now()
    }
}

/// On the memory store, a decision reads the clock once: when the limiter and the store share
/// one (as `serve` runs them), the store charges at the decision's time; when the store has a
/// clock of its own, it reads that one, and decides by it.
#[tokio::test]
async fn a_memory_decision_reads_a_shared_clock_once() {
    let clock = Arc::new(CountedClock::default());
    let store = StoreBackend::Memory(MemoryStore::new(clock.clone()));
    let policy = Policy::from_yaml("test.yaml", POLICY).unwrap();
    let limiter =
        Limiter::with_failure_settings(policy, store, FailureSettings::default(), clock.clone());
    let reads = || clock.reads.load(std::sync::atomic::Ordering::Relaxed);
    // One descriptor (the path of its own), two (the general one), and an explain.
    let requests = [
        request(&[&[("user", "erin")]]),
        request(&[&[("user", "erin")], &[("ip", "10.0.0.1")]]),
    ];
    for r in &requests {
        let before = reads();
        limiter.check(r).await.unwrap();
        assert_eq!(reads() - before, 1, "{r:?}");
        let before = reads();
        limiter.explain(r).await.unwrap();
        assert_eq!(reads() - before, 1, "explain {r:?}");
    }

    // A store on a clock of its own, a day ahead: its keys expire by it.
    let own = Arc::new(ManualClock::new(Timestamp::from_micros(
        1_700_000_040_000_000 + 86_400_000_000,
    )));
    let store = StoreBackend::Memory(MemoryStore::new(own.clone()));
    let policy = Policy::from_yaml("test.yaml", POLICY).unwrap();
    let limiter =
        Limiter::with_failure_settings(policy, store, FailureSettings::default(), clock.clone());
    let erin = request(&[&[("user", "erin")]]);
    let first = limiter.check(&erin).await.unwrap();
    let reset = first.statuses[0].decision.unwrap().reset_after;
    own.advance(reset);
    let next = limiter.check(&erin).await.unwrap();
    assert_eq!(
        next.statuses[0].decision.unwrap().remaining,
        first.statuses[0].decision.unwrap().remaining,
        "a new window on the store's clock, the limiter's clock unmoved"
    );
}

/// Prometheus counters only go up: a new policy continues each rule's counts by domain and
/// name, whatever its limit now is; a rule under a new name starts from zero. Its top denied
/// keys carry over the same way: after a rollback, `tollgate top` still says who was denied.
#[tokio::test]
async fn counts_continue_across_a_policy_change() {
    let (_clock, limiter) = limiter();
    for _ in 0..3 {
        limiter
            .check(&request(&[&[("user", "frank")]]))
            .await
            .unwrap();
    }
    for _ in 0..2 {
        limiter
            .check(&request(&[&[("ip", "10.0.0.1")]]))
            .await
            .unwrap();
    }
    let top = |rule: &str| {
        limiter
            .top_keys("api", rule, 5)
            .unwrap()
            .into_iter()
            .map(|e| (e.key, e.count))
            .collect::<Vec<_>>()
    };
    assert_eq!(top("per_user"), [("user=frank".to_owned(), 1)]);
    assert_eq!(top("per_ip"), [("ip=10.0.0.1".to_owned(), 1)]);
    let changed = POLICY
        .replace("requests_per_unit: 2}", "requests_per_unit: 3}")
        .replace("name: per_ip,", "name: per_address,")
        .replace("{name: per_ip}", "{name: per_address}");
    limiter.replace_policy(Policy::from_yaml("test.yaml", &changed).unwrap());
    let r = limiter
        .check(&request(&[&[("user", "frank")], &[("ip", "10.0.0.9")]]))
        .await
        .unwrap();
    assert!(r.allowed(), "the third of 3");
    let policy = limiter.policy();
    let rule = |name: &str| policy.rules().iter().find(|r| r.name == name).unwrap();
    assert_eq!(limiter.rule_count(rule("per_user"), Outcome::Allowed), 3);
    assert_eq!(limiter.rule_count(rule("per_user"), Outcome::Denied), 1);
    assert_eq!(limiter.rule_count(rule("per_address"), Outcome::Allowed), 1);
    assert_eq!(top("per_user"), [("user=frank".to_owned(), 1)]);
    assert!(top("per_address").is_empty(), "a new name starts afresh");
}

/// The HTTP and gRPC servers box each request's handler future, and `check`'s future is part of
/// it: kept small, the box stays inside glibc's per-thread cache (blocks up to about 1 KB)
/// instead of taking the allocator's shared arena lock on every request. The decision's own
/// state (plans, decisions) must not be held across an await.
#[test]
fn a_check_future_holds_no_decision_state() {
    let (_clock, limiter) = limiter();
    let request = request(&[&[("user", "alice")], &[("ip", "10.0.0.1")]]);
    let check = limiter.check(&request);
    let size = std::mem::size_of_val(&check);
    assert!(size <= 128, "Limiter::check's future is {size} bytes");
    let explain = limiter.explain(&request);
    let size = std::mem::size_of_val(&explain);
    assert!(size <= 128, "Limiter::explain's future is {size} bytes");
}

/// Top keys rank who was denied most often: a denial counts once whatever its cost, so one
/// request of cost 1000 does not outrank three denials of cost 1.
#[tokio::test]
async fn top_keys_count_denials_not_cost() {
    let (_clock, limiter) = limiter();
    let ip = |value: &str, cost: u64| {
        let entries = vec![("ip".to_string(), value.to_string())];
        let descriptor = RequestDescriptor::new(entries, cost, None).unwrap();
        CheckRequest::new("api".into(), vec![descriptor]).unwrap()
    };
    assert!(!limiter.check(&ip("heavy", 1000)).await.unwrap().allowed());
    assert!(limiter.check(&ip("busy", 1)).await.unwrap().allowed());
    for _ in 0..3 {
        assert!(!limiter.check(&ip("busy", 1)).await.unwrap().allowed());
    }
    let top = limiter.top_keys("api", "per_ip", 10).unwrap();
    let counts: Vec<(&str, u64)> = top.iter().map(|e| (e.key.as_str(), e.count)).collect();
    assert_eq!(counts, [("ip=busy", 3), ("ip=heavy", 1)]);
}

/// An unlimited rule's `replaces` counts, as in envoyproxy/ratelimit: a premium key with an
/// unlimited rule that replaces the per-IP limit lifts that limit for its requests only.
#[tokio::test]
async fn an_unlimited_rule_still_replaces_other_limits() {
    let policy = r#"
domain: api
descriptors:
  - key: ip
    rate_limit: {name: per_ip, unit: minute, requests_per_unit: 1}
  - key: api_key
    value: premium
    rate_limit: {unlimited: true, replaces: [{name: per_ip}]}
"#;
    let (_clock, limiter) = limiter_with(Policy::from_yaml("replaces.yaml", policy).unwrap());
    let premium = request(&[&[("ip", "10.0.0.1")], &[("api_key", "premium")]]);
    for _ in 0..3 {
        assert!(limiter.check(&premium).await.unwrap().allowed());
    }
    let plain = request(&[&[("ip", "10.0.0.1")], &[("api_key", "basic")]]);
    assert!(limiter.check(&plain).await.unwrap().allowed());
    assert!(!limiter.check(&plain).await.unwrap().allowed());
}

/// envoyproxy/ratelimit's `share_threshold`: the values a wildcard matches share one counter
/// (without it, each value has its own); a neighbouring wildcard without it is unaffected.
#[tokio::test]
async fn a_shared_wildcard_counts_every_value_it_matches_together() {
    let policy = Policy::from_yaml(
        "shared.yaml",
        r#"
domain: api
descriptors:
  - key: path
    value: "/api/*"
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: "/files/*"
    rate_limit: {unit: minute, requests_per_unit: 2}
"#,
    )
    .unwrap();
    let (_clock, limiter) = limiter_with(policy);
    let allowed = |path: &'static str| {
        let limiter = &limiter;
        async move {
            limiter
                .check(&request(&[&[("path", path)]]))
                .await
                .unwrap()
                .allowed()
        }
    };
    assert!(allowed("/api/a").await);
    assert!(allowed("/api/b").await);
    assert!(
        !allowed("/api/c").await,
        "the third /api/ path in the minute"
    );
    for path in ["/files/a", "/files/a", "/files/b", "/files/b"] {
        assert!(allowed(path).await, "{path}: a counter per value");
    }
    assert!(!allowed("/files/a").await);
}

/// Two descriptor paths can read the same envoy-style name (`a_b` = `c`, `a` = `b_c`): the
/// second rule is named with `#2`, so each has its own metric series and top keys.
#[tokio::test]
async fn rules_whose_paths_read_alike_get_names_of_their_own() {
    let policy = Policy::from_yaml(
        "alike.yaml",
        "domain: api\ndescriptors:\n  - key: a_b\n    value: c\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: a\n    value: b_c\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .unwrap();
    let names: Vec<&str> = policy.rules().iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a_b_c", "a_b_c#2"]);
    let (_clock, limiter) = limiter_with(policy);
    for _ in 0..2 {
        let only = CheckRequest::new(
            "api".into(),
            vec![RequestDescriptor::new(vec![("a".into(), "b_c".into())], 1, None).unwrap()],
        )
        .unwrap();
        limiter.check(&only).await.unwrap();
    }
    let text = limiter.render_metrics().await;
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("tollgate_decisions_total{"))
        .map(|l| l.rsplit_once(' ').unwrap().0)
        .collect();
    let mut unique = series.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), series.len(), "{text}");
    assert_eq!(limiter.top_keys("api", "a_b_c#2", 5).unwrap().len(), 1);
    assert!(limiter.top_keys("api", "a_b_c", 5).unwrap().is_empty());
}

/// A value longer than 1 KiB (a path with a long query) is matched as it is, so a wildcard
/// rule limits it, and each such value keeps a counter of its own.
#[tokio::test]
async fn long_values_match_wildcards_and_are_limited() {
    let policy = Policy::from_yaml(
        "long.yaml",
        "domain: api\ndescriptors:\n  - key: path\n    value: \"/api/*\"\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .unwrap();
    let (_clock, limiter) = limiter_with(policy);
    let long = format!("/api/{}", "x".repeat(2048));
    let other = format!("{long}y");
    let check = |path: &str| {
        let request = request(&[&[("path", path)]]);
        let limiter = &limiter;
        async move { limiter.check(&request).await.unwrap().allowed() }
    };
    assert!(check(&long).await);
    assert!(!check(&long).await, "the second in the minute");
    assert!(check(&other).await, "another long value, another counter");
}

/// A runtime override changes a `charge: up_to_limit` rule's limit, not the way it charges:
/// a cost above the new limit still counts what is left of it.
#[tokio::test]
async fn a_runtime_override_keeps_charging_up_to_the_limit() {
    let yaml = "domain: api\ndescriptors:\n  - key: llm_user\n    rate_limit: {name: tokens, unit: minute, requests_per_unit: 100, charge: up_to_limit}\n";
    let (clock, limiter) = limiter_with(Policy::from_yaml("t.yaml", yaml).unwrap());
    limiter
        .overrides()
        .set(Override {
            id: 0,
            domain: "api".into(),
            rule: "tokens".into(),
            entries: vec![("llm_user".into(), "ada".into())],
            requests_per_unit: 5,
            period: None,
            expires_at: None,
            set_at: clock.now(),
            reason: "test".into(),
        })
        .unwrap();
    let tokens = |cost: u64| {
        let d = RequestDescriptor::new(vec![("llm_user".into(), "ada".into())], cost, None);
        CheckRequest::new("api".into(), vec![d.unwrap()]).unwrap()
    };
    let r = limiter.check(&tokens(8)).await.unwrap();
    assert!(r.allowed(), "the 5 of the override are charged");
    assert_eq!(r.statuses[0].decision.unwrap().limit, 5);
    assert_eq!(r.statuses[0].decision.unwrap().remaining, 0);
    assert!(!limiter.check(&tokens(0)).await.unwrap().allowed());
}

/// With 20,000 runtime overrides in force, a decision's lookup compares its descriptor with at
/// most the one override it finds (it scanned all 20,000), and decides as before: an unrelated
/// user gets the rule's limit, an overridden one its override.
#[tokio::test]
async fn twenty_thousand_overrides_cost_a_decision_one_lookup() {
    let (clock, limiter) = limiter();
    let user = |name: String, limit: u64| Override {
        id: 0,
        domain: "api".into(),
        rule: "per_user".into(),
        entries: vec![("user".into(), name)],
        requests_per_unit: limit,
        period: None,
        expires_at: None,
        set_at: clock.now(),
        reason: String::new(),
    };
    let list = (0..20_000)
        .map(|i| user(format!("tenant-{i}"), 4))
        .collect();
    limiter.overrides().set_all(list).unwrap();
    let entries = |v: &str| vec![("user".to_owned(), v.to_owned())];
    let probes = |v: &str| limiter.overrides().probes("api", "per_user", &entries(v));
    assert!(probes("unrelated") <= 1, "{}", probes("unrelated"));
    assert!(probes("tenant-12345") <= 2, "{}", probes("tenant-12345"));

    let allowed = async |v: &str| {
        let r = limiter.check(&request(&[&[("user", v)]])).await.unwrap();
        (r.allowed(), r.statuses[0].decision.unwrap().limit)
    };
    assert_eq!(allowed("unrelated").await, (true, 2));
    assert_eq!(allowed("unrelated").await, (true, 2));
    assert_eq!(allowed("unrelated").await, (false, 2));
    for _ in 0..4 {
        assert_eq!(allowed("tenant-12345").await, (true, 4));
    }
    assert_eq!(allowed("tenant-12345").await, (false, 4));
}

/// `detailed_metric: true` (envoyproxy/ratelimit's per-value statistics) counts a rule's
/// outcomes per descriptor value as well, for the first 1000 values; the later ones are
/// counted together. Rules without it get no per-value series.
#[tokio::test]
async fn detailed_metric_rules_are_counted_per_descriptor_value() {
    let yaml = "domain: api\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {name: per_user, unit: minute, requests_per_unit: 1}\n  - key: ip\n    rate_limit: {name: per_ip, unit: minute, requests_per_unit: 5}\n";
    let (_clock, limiter) = limiter_with(Policy::from_yaml("t.yaml", yaml).unwrap());
    for (key, value) in [
        ("user", "alice"),
        ("user", "alice"),
        ("user", "bob"),
        ("ip", "1"),
    ] {
        limiter.check(&request(&[&[(key, value)]])).await.unwrap();
    }
    let series = |descriptor: &str, outcome: &str| {
        format!(
            "tollgate_detailed_decisions_total{{domain=\"api\",rule=\"per_user\",descriptor=\"{descriptor}\",outcome=\"{outcome}\"}} "
        )
    };
    let count = |text: &str, line: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(line))
            .map(|n| n.parse::<u64>().unwrap())
    };
    let text = limiter.render_metrics().await;
    assert_eq!(
        count(&text, &series("user=alice", "allowed")),
        Some(1),
        "{text}"
    );
    assert_eq!(count(&text, &series("user=alice", "denied")), Some(1));
    assert_eq!(count(&text, &series("user=bob", "allowed")), Some(1));
    assert_eq!(
        count(&text, &series("user=bob", "denied")),
        None,
        "no zero series"
    );
    assert!(!text.contains("rule=\"per_ip\",descriptor="), "{text}");

    // Two values are counted already: 998 more get series of their own, the last 2 share one.
    for n in 0..1000 {
        let user = format!("u{n}");
        limiter
            .check(&request(&[&[("user", &user)]]))
            .await
            .unwrap();
    }
    let text = limiter.render_metrics().await;
    assert_eq!(count(&text, &series("user=u997", "allowed")), Some(1));
    assert_eq!(count(&text, &series("user=u998", "allowed")), None);
    assert_eq!(count(&text, &series("_other", "allowed")), Some(2));

    // Continued across a reload, like the rule's own counters.
    limiter.replace_policy(Policy::from_yaml("t.yaml", yaml).unwrap());
    limiter
        .check(&request(&[&[("user", "alice")]]))
        .await
        .unwrap();
    let text = limiter.render_metrics().await;
    assert_eq!(count(&text, &series("user=alice", "denied")), Some(2));

    // A check is no decision: not counted per value either.
    let entries = vec![("user".to_string(), "alice".to_string())];
    let check = RequestDescriptor::new(entries, 0, None).unwrap();
    let check = CheckRequest::new("api".into(), vec![check]).unwrap();
    assert!(!limiter.check(&check).await.unwrap().allowed());
    let text = limiter.render_metrics().await;
    assert_eq!(count(&text, &series("user=alice", "denied")), Some(2));
}

/// A check (`hits_addend: 0`) is counted in `tollgate_checks_total`, not as a decision: Envoy's
/// check before a request and charge after it count one decision. A denied check still throttles
/// its caller, so it is among the top keys.
#[tokio::test]
async fn checks_are_counted_apart_from_decisions() {
    let (_clock, limiter) = limiter();
    let user = |cost: u64| {
        let entries = vec![("user".to_string(), "carol".to_string())];
        let descriptor = RequestDescriptor::new(entries, cost, None).unwrap();
        CheckRequest::new("api".into(), vec![descriptor]).unwrap()
    };
    assert!(limiter.check(&user(0)).await.unwrap().allowed());
    assert!(limiter.check(&user(2)).await.unwrap().allowed());
    assert!(!limiter.check(&user(0)).await.unwrap().allowed());
    let series = |name: &str, outcome: &str| {
        format!("{name}{{domain=\"api\",rule=\"per_user\",outcome=\"{outcome}\"}} ")
    };
    let text = limiter.render_metrics().await;
    let count = |line: String| {
        text.lines()
            .find_map(|l| l.strip_prefix(&line))
            .map(|n| n.parse::<u64>().unwrap())
    };
    assert_eq!(
        count(series("tollgate_decisions_total", "allowed")),
        Some(1)
    );
    assert_eq!(count(series("tollgate_decisions_total", "denied")), Some(0));
    assert_eq!(count(series("tollgate_checks_total", "allowed")), Some(1));
    assert_eq!(count(series("tollgate_checks_total", "denied")), Some(1));
    let top = limiter.top_keys("api", "per_user", 10).unwrap();
    let counts: Vec<(&str, u64)> = top.iter().map(|e| (e.key.as_str(), e.count)).collect();
    assert_eq!(counts, [("user=carol", 1)]);
}

/// Descriptors of one request on one counter (a repeated descriptor, two values of a shared
/// wildcard) are charged in order, each on top of the ones before it. When their costs add up
/// past what the counter can ever hold, the request is a `cost_exceeds_capacity` denial with no
/// retry, charging nothing: as a plain denial it carried a retry-after that never came true,
/// and figures as if the first charge had been made.
#[tokio::test]
async fn costs_on_one_counter_that_never_fit_together_are_no_plain_denial() {
    let policy = Policy::from_yaml(
        "sum.yaml",
        r#"
domain: api
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: g
    value: "grp*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 5}
"#,
    )
    .unwrap();
    let (_clock, limiter) = limiter_with(policy);
    let costs = |descriptors: &[(&str, &str, u64)]| {
        let descriptors = descriptors
            .iter()
            .map(|(k, v, cost)| {
                RequestDescriptor::new(vec![(k.to_string(), v.to_string())], *cost, None).unwrap()
            })
            .collect();
        CheckRequest::new("api".into(), descriptors).unwrap()
    };
    // Explain answers as if for one more unit: 4 on an unused counter.
    let left = async |key: &str, value: &str| {
        let answer = limiter.explain(&costs(&[(key, value, 1)])).await.unwrap();
        answer.statuses[0].decision.unwrap().remaining
    };

    for request in [
        costs(&[("k", "a", 3), ("k", "a", 3)]),
        costs(&[("g", "grpA", 3), ("g", "grpB", 3)]),
        // A check after a charge that takes the whole limit: it is decided on top of it.
        costs(&[("k", "a", 5), ("k", "a", 0)]),
    ] {
        let answer = limiter.check(&request).await.unwrap();
        assert!(!answer.allowed(), "{answer:?}");
        let second = answer.statuses[1].decision.unwrap();
        assert_eq!(second.verdict, Verdict::CostExceedsCapacity, "{answer:?}");
        assert_eq!(second.retry_after, None);
        assert_eq!(second.remaining, 5, "the counter as it stands");
        assert_eq!(answer.retry_after(), None);
    }
    assert_eq!(left("k", "a").await, 4, "nothing was charged");
    assert_eq!(left("g", "grpA").await, 4);

    // Costs that fit together are charged together.
    let fits = limiter
        .check(&costs(&[("k", "a", 3), ("k", "a", 2)]))
        .await
        .unwrap();
    assert!(fits.allowed(), "{fits:?}");
    assert!(
        !limiter
            .check(&costs(&[("k", "a", 1)]))
            .await
            .unwrap()
            .allowed()
    );
}

/// `requests_per_unit: 0` blocks, as in envoyproxy/ratelimit: over the limit every time,
/// reset at the end of the unit, no counter kept (the store holds no key) and the request's
/// other limits charged nothing. In shadow mode it reports the denial and lets the rest count.
#[tokio::test]
async fn a_rule_of_zero_blocks_without_a_counter() {
    use tollgate::store::Store as _;
    let policy = Policy::from_yaml(
        "zero.yaml",
        r#"
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: ip
    rate_limit: {name: per_ip, unit: minute, requests_per_unit: 1}
  - key: probe
    shadow_mode: true
    rate_limit: {name: shadow_block, unit: hour, requests_per_unit: 0}
"#,
    )
    .unwrap();
    let blocked_rule = &policy.rules()[1];
    assert!(blocked_rule.blocked && !blocked_rule.is_unlimited());
    let (clock, limiter) = limiter_with(policy);
    clock.advance(Duration::from_secs(15));
    let both = request(&[&[("remote_address", "50.0.0.5")], &[("ip", "1")]]);
    for _ in 0..3 {
        let r = limiter.check(&both).await.unwrap();
        assert!(!r.allowed());
        let s = &r.statuses[0];
        assert_eq!(s.code, Code::OverLimit);
        assert!(s.is_blocked());
        assert_eq!(
            s.limit.as_ref().map(|l| l.name()),
            Some("remote_address_50.0.0.5")
        );
        let d = s.decision.unwrap();
        assert_eq!((d.limit, d.remaining), (0, 0));
        assert_eq!(d.reset_after, Duration::from_secs(45));
        assert_eq!(r.retry_after(), Some(Duration::from_secs(45)));
    }
    assert_eq!(limiter.store().key_count().await.unwrap(), 0, "no counter");
    // Another address is limited as usual, and per_ip still has its one request.
    let other = limiter
        .check(&request(&[
            &[("remote_address", "50.0.0.6")],
            &[("ip", "1")],
        ]))
        .await
        .unwrap();
    assert!(other.allowed());
    assert_eq!(limiter.store().key_count().await.unwrap(), 2);

    // Shadow mode: reported as a denial it would make, the request allowed and charged.
    let shadowed = request(&[&[("probe", "x")], &[("ip", "2")]]);
    let r = limiter.check(&shadowed).await.unwrap();
    assert!(r.allowed());
    assert_eq!(r.statuses[0].code, Code::Ok);
    assert!(r.statuses[0].shadow_would_deny);
    assert!(
        !limiter.check(&shadowed).await.unwrap().allowed(),
        "per_ip was charged"
    );
}

const SHADOW: &str = r#"
domain: api
descriptors:
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 1}
    shadow_mode: true
"#;

/// A shadow rule's would-deny shares per value belong to the limiter that decided them (two
/// limiters in one process, as an embedded app beside tests, never mix their tables) and carry
/// over a reload that keeps the rule.
#[tokio::test]
async fn value_shares_are_the_limiters_own_and_survive_a_reload() {
    let (_, one) = limiter_with(Policy::from_yaml("a.yaml", SHADOW).unwrap());
    let (_, other) = limiter_with(Policy::from_yaml("a.yaml", SHADOW).unwrap());
    for _ in 0..4 {
        one.check(&request(&[&[("tenant", "acme")]])).await.unwrap();
    }
    let shares_of = |limiter: &Limiter| {
        let policy = limiter.policy();
        limiter.value_shares(&policy.rules()[0])
    };
    let acme = shares_of(&one).expect("a shadow rule has a table");
    let entry = acme.get("tenant=acme").expect("tracked");
    // One admitted, three that the rule would have denied.
    assert_eq!((entry.tracked(), entry.hits), (4, 3));
    assert_eq!(shares_of(&other).expect("its own table").total(), 0);

    one.replace_policy(Policy::from_yaml("a.yaml", SHADOW).unwrap());
    let kept = shares_of(&one).expect("kept");
    assert!(
        Arc::ptr_eq(&kept, &acme),
        "the reload keeps the rule's table"
    );
    let enforced = SHADOW.replace("    shadow_mode: true\n", "");
    one.replace_policy(Policy::from_yaml("a.yaml", &enforced).unwrap());
    assert!(
        shares_of(&one).is_none(),
        "an enforced rule keeps no shares"
    );
}
