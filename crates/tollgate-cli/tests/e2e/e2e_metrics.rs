//! The whole `/metrics` text of `tollgate serve` on Redis, every part of it (the limiter's, the
//! store's, the policy's, the background tasks', the gRPC listener's), as a scraper reads it:
//! the test kit's parser and `promtool check metrics` find no family twice, none without HELP
//! or TYPE, no series twice; and each rule has only the series it can produce.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use support::Server;
use tollgate_testkit::RedisServer;
use tollgate_testkit::prometheus::parse;

/// One rule of each mode, two postures, per-value counts, an unlimited rule.
const POLICY: &str = "\
domain: api
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 1, mode: shadow, on_store_error: closed}
  - key: plan
    rate_limit: {name: soft_plan, unit: minute, requests_per_unit: 1, mode: soft, on_store_error: local}
  - key: internal
    rate_limit: {unlimited: true}
";

/// A shadow candidate beside it.
const CANDIDATE: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 1}
";

/// Debian's `promtool` (scripts/test.sh installs it with `prometheus`), or `TOLLGATE_PROMTOOL`.
fn promtool() -> PathBuf {
    tollgate_testkit::installed_binary(
        "promtool",
        "TOLLGATE_PROMTOOL",
        "this test checks /metrics with it (scripts/test.sh installs Debian's `prometheus` package)",
    )
}

/// `promtool check metrics` on `text`: its exit status and what it printed.
fn promtool_check(text: &str) -> (bool, String) {
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), said)
}

/// One descriptor `key=value` charged `hits` in domain `api`.
fn check(key: &str, value: &str, hits: u64) -> Value {
    json!({"domain": "api", "descriptors": [
        {"entries": [{"key": key, "value": value}], "hits_addend": hits}
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_metrics_text_is_one_valid_exposition_on_redis() {
    let redis = RedisServer::start();
    let server = Server::start_with_args(POLICY, &["--store", &redis.url()]);
    server.push_candidate(CANDIDATE).await;

    // Before any traffic, and after some: allowed and over each limit, a check, an invalid
    // request.
    let before = server.metrics().await;
    for (key, value) in [
        ("user", "a"),
        ("tenant", "t"),
        ("plan", "p"),
        ("internal", "i"),
    ] {
        for _ in 0..3 {
            server.post("/json", &check(key, value, 1)).await;
        }
    }
    server.post("/json", &check("user", "b", 0)).await;
    assert_eq!(
        server
            .post("/v1/check", &json!({"domain": "api"}))
            .await
            .status(),
        400
    );
    let after = server.metrics().await;

    for (when, text) in [("before traffic", &before), ("after traffic", &after)] {
        let parsed = parse(text);
        let (ok, said) = promtool_check(text);
        assert!(
            ok && said.trim().is_empty(),
            "promtool, {when}: {said}\n{text}"
        );
        let families: BTreeSet<&str> = parsed.families.iter().map(|f| f.name.as_str()).collect();
        // One family of each part of the text.
        for family in [
            "tollgate_decisions_total",
            "tollgate_candidate_decisions_total",
            "tollgate_store_operation_duration_seconds",
            "tollgate_store_batches_total",
            "tollgate_store_shed_total",
            "tollgate_policy_version",
            "tollgate_background_task_panics_total",
            "tollgate_grpc_requests_refused_total",
        ] {
            assert!(families.contains(family), "{when}: no {family} in\n{text}");
        }
        // Each rule's series: its mode's outcomes, its posture; none for `internal`.
        let series = |name: &str, label: &str| -> BTreeSet<String> {
            parsed
                .family(name)
                .unwrap()
                .samples
                .iter()
                .map(|s| format!("{}/{}", s.label("rule").unwrap(), s.label(label).unwrap()))
                .collect()
        };
        let outcomes: BTreeSet<String> = [
            "per_user/allowed",
            "per_user/denied",
            "per_tenant/allowed",
            "per_tenant/shadow_would_deny",
            "soft_plan/allowed",
            "soft_plan/soft_exceeded",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            series("tollgate_decisions_total", "outcome"),
            outcomes,
            "{when}"
        );
        assert_eq!(
            series("tollgate_checks_total", "outcome"),
            outcomes,
            "{when}"
        );
        assert_eq!(
            series("tollgate_degraded_decisions_total", "posture"),
            ["per_user/open", "per_tenant/closed", "soft_plan/local"]
                .map(String::from)
                .into(),
            "{when}"
        );
        assert_eq!(
            series("tollgate_candidate_decisions_total", "outcome"),
            ["per_user/allowed", "per_user/denied"]
                .map(String::from)
                .into(),
            "{when}"
        );
    }

    // The traffic counted where it should, the text read back by the parser.
    let after = parse(&after);
    let value = |family: &str, rule: &str, outcome: &str| {
        after
            .family(family)
            .unwrap()
            .samples
            .iter()
            .find(|s| s.label("rule") == Some(rule) && s.label("outcome") == Some(outcome))
            .map(|s| s.value)
    };
    let decisions = "tollgate_decisions_total";
    assert_eq!(value(decisions, "per_user", "allowed"), Some(2.0));
    assert_eq!(value(decisions, "per_user", "denied"), Some(1.0));
    assert_eq!(
        value(decisions, "per_tenant", "shadow_would_deny"),
        Some(2.0)
    );
    assert_eq!(value(decisions, "soft_plan", "soft_exceeded"), Some(2.0));
    assert_eq!(
        value("tollgate_checks_total", "per_user", "allowed"),
        Some(1.0)
    );
    let invalid = after.family("tollgate_invalid_requests_total").unwrap();
    assert!(
        invalid
            .samples
            .iter()
            .any(|s| s.label("transport") == Some("http") && s.value == 1.0),
        "{invalid:?}"
    );
}
