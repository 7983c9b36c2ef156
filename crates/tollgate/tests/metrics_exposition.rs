//! `/metrics` stays the same Prometheus text (format 0.0.4) whatever code writes it: a fixed
//! scenario on the memory store and a manual clock (denials, shadow and soft rules, checks,
//! per-value counts, a shadow candidate, an override, invalid requests, reloads accepted and
//! rejected, a rollback, a supervised task that panicked) renders the sample set in
//! `fixtures/metrics.golden`.
//!
//! The set is compared parsed, not as text: each family's `# HELP` and `# TYPE`, and each sample
//! as its name, its labels sorted and its value. Latency histograms depend on timing, so their
//! `_bucket` and `_sum` samples are compared by name and labels only, and their `_count` by
//! value. Run with `TOLLGATE_BLESS=1` to write the file again after a deliberate change.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tollgate::clock::{Clock, ManualClock};
use tollgate::lifecycle::{Lifecycle, Origin};
use tollgate::limiter::{
    CheckRequest, FailureSettings, Limiter, Override, RequestDescriptor, Transport,
};
use tollgate::policy::Policy;
use tollgate::store::{MemoryStore, StoreBackend};
use tollgate_core::Timestamp;

/// The running policy: an enforced rule, a shadow, a soft, a per-value (`detailed_metric`) rule,
/// an unlimited one, and a rule whose name needs escaping in a label.
const LIVE: &str = r#"domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 1, mode: shadow}
  - key: burst
    rate_limit: {name: soft_burst, unit: minute, requests_per_unit: 1, mode: soft}
  - key: path
    detailed_metric: true
    rate_limit: {name: per_path, unit: minute, requests_per_unit: 1}
  - key: api_key
    value: internal
    rate_limit: {unlimited: true}
  - key: odd
    rate_limit: {name: 'odd "quoted" \back', unit: minute, requests_per_unit: 1}
"#;

/// What a reload brings: `per_user` loosened, `per_tenant` gone (and a second file, [`WEB`]).
const RELOADED: &str = r#"domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 3}
  - key: burst
    rate_limit: {name: soft_burst, unit: minute, requests_per_unit: 1, mode: soft}
  - key: path
    detailed_metric: true
    rate_limit: {name: per_path, unit: minute, requests_per_unit: 1}
  - key: odd
    rate_limit: {name: 'odd "quoted" \back', unit: minute, requests_per_unit: 1}
"#;

/// The second file of the reload: a second domain.
const WEB: &str = "domain: web
descriptors:
  - key: ip
    rate_limit: {name: per_ip, unit: second, requests_per_unit: 1}
";

/// The files of the reload.
fn reloaded() -> Vec<(String, String)> {
    vec![
        ("conf/policy.yaml".to_owned(), RELOADED.to_owned()),
        ("conf/web.yaml".to_owned(), WEB.to_owned()),
    ]
}

/// The shadow candidate: stricter than the live policy.
const CANDIDATE: &str = r#"domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 1}
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 1, mode: shadow}
"#;

fn sources(name: &str, text: &str) -> Vec<(String, String)> {
    vec![(name.to_owned(), text.to_owned())]
}

fn descriptor(entries: &[(&str, &str)], cost: u64) -> RequestDescriptor {
    let entries = entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    RequestDescriptor::new(entries, cost, None).unwrap()
}

fn request(domain: &str, descriptors: Vec<RequestDescriptor>) -> CheckRequest {
    CheckRequest::new(domain.to_owned(), descriptors).unwrap()
}

/// Sends `times` requests of one descriptor each.
async fn send(limiter: &Limiter, domain: &str, entries: &[(&str, &str)], cost: u64, times: u32) {
    for _ in 0..times {
        limiter
            .check(&request(domain, vec![descriptor(entries, cost)]))
            .await
            .unwrap();
    }
}

/// The scenario: what `/metrics` shows at its end (the same three parts, in the same order, as
/// `tollgate-server`'s handler).
async fn scenario() -> String {
    // Aligned to a minute, so that no window rolls over in the scenario.
    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
        1_700_000_040_000_000,
    )));
    let store = StoreBackend::Memory(MemoryStore::new(clock.clone()));
    let policy = Policy::from_sources(&sources("policy.yaml", LIVE)).unwrap();
    let limiter = Arc::new(Limiter::with_failure_settings(
        policy,
        store,
        FailureSettings::default(),
        clock.clone(),
    ));
    let lifecycle = Lifecycle::new(limiter.clone(), None, sources("policy.yaml", LIVE));

    // Live traffic: allowed and denied, shadow and soft denials, checks, per-value counts.
    send(&limiter, "api", &[("user", "alice")], 1, 3).await;
    send(&limiter, "api", &[("tenant", "acme")], 1, 2).await;
    send(&limiter, "api", &[("burst", "b")], 1, 3).await;
    send(&limiter, "api", &[("user", "carol")], 0, 1).await;
    send(&limiter, "api", &[("path", "/a")], 1, 2).await;
    send(
        &limiter,
        "api",
        &[("path", "/with \"quote\" \\ and\nline")],
        1,
        1,
    )
    .await;
    send(&limiter, "api", &[("api_key", "internal")], 1, 2).await;
    send(&limiter, "api", &[("odd", "x")], 1, 2).await;
    limiter
        .explain(&request("api", vec![descriptor(&[("user", "dave")], 1)]))
        .await
        .unwrap();
    limiter
        .check(&request(
            "api",
            vec![
                descriptor(&[("user", "erin")], 1),
                descriptor(&[("tenant", "initech")], 1),
            ],
        ))
        .await
        .unwrap();
    limiter.note_invalid(Transport::Http, &"no descriptors");
    limiter.note_invalid(Transport::Http, &"no domain");
    limiter.note_invalid(Transport::Grpc, &"no domain");

    // An override for one user: a higher limit, then past it.
    limiter
        .overrides()
        .set(Override {
            id: 0,
            domain: "api".into(),
            rule: "per_user".into(),
            entries: vec![("user".into(), "bob".into())],
            requests_per_unit: 4,
            period: None,
            expires_at: None,
            set_at: clock.now(),
            reason: "golden".into(),
        })
        .unwrap();
    send(&limiter, "api", &[("user", "bob")], 1, 5).await;

    // A shadow candidate decided beside the live policy.
    lifecycle
        .set_candidate(sources("candidate.yaml", CANDIDATE))
        .unwrap();
    send(&limiter, "api", &[("user", "frank")], 1, 2).await;
    send(&limiter, "api", &[("tenant", "globex")], 1, 2).await;

    // Reloads: one accepted, one unchanged, one rejected; then a rollback and a reload again.
    lifecycle.activate(reloaded(), Origin::Push).unwrap();
    lifecycle.activate(reloaded(), Origin::Push).unwrap();
    assert!(
        lifecycle
            .activate(sources("policy.yaml", "domain: [\n"), Origin::Push)
            .is_err()
    );
    send(&limiter, "api", &[("user", "alice")], 1, 2).await;
    send(&limiter, "web", &[("ip", "10.0.0.1")], 1, 3).await;
    lifecycle.rollback(None).unwrap();
    send(&limiter, "api", &[("user", "alice")], 1, 1).await;
    lifecycle.activate(reloaded(), Origin::Push).unwrap();
    send(&limiter, "web", &[("ip", "10.0.0.2")], 1, 1).await;
    assert!(
        lifecycle
            .activate(sources("other.yaml", "domain: x\nnope: 1\n"), Origin::File)
            .is_err(),
        "the last attempt was rejected"
    );

    // Supervised tasks: one panicked once and was started again, one ended while wanted.
    let runs = Arc::new(AtomicU32::new(0));
    let counted = runs.clone();
    let restarted = tollgate::background::supervise(
        "golden_panicking",
        move || runs.load(Ordering::Relaxed) < 2,
        move || {
            let run = counted.fetch_add(1, Ordering::Relaxed);
            async move {
                if run == 0 {
                    panic!("the first run panics");
                }
            }
        },
    );
    restarted.await.unwrap();
    tollgate::background::supervise("golden_quiet", || false, || async {})
        .await
        .unwrap();

    let mut text = lifecycle.limiter().render_metrics().await;
    lifecycle.render_metrics(&mut text);
    tollgate::background::render_metrics(&mut text);
    text
}

/// Splits `name{labels} value` into its name, its labels as written, and its value.
fn split_sample(line: &str) -> (&str, &str, &str) {
    let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
    match series.split_once('{') {
        Some((name, labels)) => (
            name,
            labels.strip_suffix('}').expect("labels end with }"),
            value,
        ),
        None => (series, "", value),
    }
}

/// Parses a label list (`a="x",b="y\"z"`) into its pairs, values unescaped.
fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"").expect("a label is name=\"value\"");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().expect("a label value ends with a quote") {
                (_, '\\') => match chars.next().expect("an escape has a character") {
                    (_, 'n') => value.push('\n'),
                    (_, c @ ('\\' | '"')) => value.push(c),
                    (_, c) => panic!("unknown escape \\{c} in {text}"),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        labels.push((name.to_owned(), value));
        rest = after[end + 1..]
            .strip_prefix(',')
            .unwrap_or(&after[end + 1..]);
    }
    labels.sort();
    labels
}

/// The exposition's sample set, one normalised line each, sorted: `# HELP` and `# TYPE` as
/// written, samples as `name{sorted labels} value` with histogram buckets and sums as `*`.
fn sample_set(text: &str) -> Vec<String> {
    let mut types = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_owned(), kind.to_owned());
        }
    }
    let histogram = |name: &str, suffix: &str| {
        name.strip_suffix(suffix)
            .is_some_and(|family| types.get(family).is_some_and(|t| t == "histogram"))
    };
    // Each sample follows its family's `# TYPE` line, before the next family's.
    let mut family = String::new();
    let mut set: Vec<String> = text
        .lines()
        .map(|line| {
            assert!(!line.is_empty(), "no blank lines in the text format");
            if line.starts_with('#') {
                if let Some(rest) = line.strip_prefix("# TYPE ") {
                    family = rest.split(' ').next().unwrap_or_default().to_owned();
                }
                return line.to_owned();
            }
            let (name, labels, value) = split_sample(line);
            let of_family = name == family
                || (types.get(&family).is_some_and(|t| t == "histogram")
                    && ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|suffix| name.strip_suffix(suffix) == Some(family.as_str())));
            assert!(of_family, "{line} is not of the family above it, {family}");
            let labels: Vec<String> = parse_labels(labels)
                .into_iter()
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect();
            let value = if histogram(name, "_bucket") || histogram(name, "_sum") {
                "*"
            } else {
                value
            };
            format!("{name}{{{}}} {value}", labels.join(","))
        })
        .collect();
    set.sort();
    let before = set.len();
    set.dedup();
    assert_eq!(set.len(), before, "a line appears twice:\n{text}");
    set
}

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/metrics.golden")
}

#[tokio::test(start_paused = true)]
async fn metrics_render_the_golden_sample_set() {
    let text = scenario().await;
    // One valid exposition: no family twice, each with HELP and TYPE, no series twice.
    tollgate_testkit::prometheus::parse(&text);
    let set = sample_set(&text);
    let rendered = set.join("\n") + "\n";
    if std::env::var_os("TOLLGATE_BLESS").is_some() {
        std::fs::write(golden_path(), &rendered).unwrap();
    }
    let golden = std::fs::read_to_string(golden_path()).unwrap();
    let golden: Vec<&str> = golden.lines().collect();
    let rendered: Vec<&str> = rendered.lines().collect();
    let missing: Vec<&&str> = golden.iter().filter(|l| !rendered.contains(l)).collect();
    let extra: Vec<&&str> = rendered.iter().filter(|l| !golden.contains(l)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing from /metrics: {missing:#?}\nnew in /metrics: {extra:#?}\nwhole text:\n{text}"
    );
}

/// The parser the comparison relies on reads escapes, sorts labels and blanks timings.
#[test]
fn the_sample_set_is_parsed_as_the_text_format_says() {
    let text = "# HELP h_seconds Time.\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"+Inf\",b=\"1\"} 3\nh_seconds_sum{b=\"1\"} 0.25\nh_seconds_count{b=\"1\"} 3\n# TYPE c_total counter\nc_total{z=\"a\\\"b\",a=\"x\\\\y\\nz\"} 7\n";
    assert_eq!(
        sample_set(text),
        [
            "# HELP h_seconds Time.",
            "# TYPE c_total counter",
            "# TYPE h_seconds histogram",
            "c_total{a=\"x\\\\y\\nz\",z=\"a\\\"b\"} 7",
            "h_seconds_bucket{b=\"1\",le=\"+Inf\"} *",
            "h_seconds_count{b=\"1\"} 3",
            "h_seconds_sum{b=\"1\"} *",
        ]
    );
}
