//! The Grafana dashboard (`deploy/grafana/tollgate.json`) against a real Prometheus scraping a
//! real `tollgate serve` on Redis under traffic: every panel's query, with the dashboard's
//! variables substituted as Grafana would, parses and returns data.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use support::{Server, descriptor, eventually};
use tollgate_testkit::RedisServer;
use tonic::transport::Channel;

const DASHBOARD: &str = include_str!("../../../../deploy/grafana/tollgate.json");
const ALERTS: &str = include_str!("../../../../deploy/prometheus/alerts.yaml");

/// Grafana's `$__rate_interval`: the larger of `$__interval` plus the scrape interval and four
/// scrape intervals. With 1 s scrapes that is 4 s on the shortest ranges; 10 s here (a 9 s
/// step), so that a scrape a loaded machine delays still leaves two samples in each window.
const RATE_INTERVAL: &str = "10s";

/// An enforced rule counted per value, a shadow rule and a soft rule, each with a limit the
/// traffic below goes over.
const POLICY: &str = "\
domain: api
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 5}
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 3, mode: shadow}
  - key: plan
    rate_limit: {name: soft_plan, unit: minute, requests_per_unit: 2, mode: soft}
";

/// The shadow candidate: per_user at 2 a minute, so it would deny some of what the live policy
/// allows.
const CANDIDATE: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 3, mode: shadow}
  - key: plan
    rate_limit: {name: soft_plan, unit: minute, requests_per_unit: 2, mode: soft}
";

/// Debian's `prometheus` (scripts/test.sh installs it), or `TOLLGATE_PROMETHEUS`.
fn prometheus_binary() -> PathBuf {
    tollgate_testkit::installed_binary(
        "prometheus",
        "TOLLGATE_PROMETHEUS",
        "this test needs a real Prometheus (scripts/test.sh installs Debian's `prometheus` package)",
    )
}

/// A Prometheus scraping `target` every second and evaluating deploy/prometheus/alerts.yaml
/// every second, on a free loopback port and a data directory of its own; killed when dropped.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(target: std::net::SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(dir.path().join("alerts.yaml"), ALERTS).unwrap();
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 rule_files: [alerts.yaml]\n\
                 scrape_configs:\n  - job_name: tollgate\n    static_configs: [{{targets: [\"{target}\"]}}]\n"
            ),
        )
        .unwrap();
        // The port is free when asked; should another process take it before Prometheus
        // binds it, Prometheus exits and the next attempt picks another.
        for _ in 0..5 {
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut child = Command::new(prometheus_binary())
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--log.level=warn")
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
            let url = format!("http://127.0.0.1:{port}");
            if ready(&mut child, &url).await {
                return Prometheus {
                    child,
                    url,
                    _dir: dir,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("Prometheus did not start (see its log above)");
    }

    /// An instant query's `data`, or Prometheus's error.
    async fn query(&self, expr: &str) -> Result<Value, String> {
        let answer: Value = reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if answer["status"] == "success" {
            Ok(answer["data"].clone())
        } else {
            Err(format!("{}: {}", answer["errorType"], answer["error"]))
        }
    }

    /// Every alerting rule loaded: (name, state, health, last error).
    async fn alerts(&self) -> Vec<(String, String, String, String)> {
        let answer: Value = reqwest::get(format!("{}/api/v1/rules?type=alert", self.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["status"], "success", "{answer}");
        let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
        answer["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().iter())
            .map(|r| {
                (
                    text(&r["name"]),
                    text(&r["state"]),
                    text(&r["health"]),
                    text(&r["lastError"]),
                )
            })
            .collect()
    }

    /// The values of `label` on series matching `selector` (Grafana's `label_values`).
    async fn label_values(&self, label: &str, selector: &str) -> Vec<String> {
        let answer: Value = reqwest::Client::new()
            .get(format!("{}/api/v1/label/{label}/values", self.url))
            .query(&[("match[]", selector)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["status"], "success", "{answer}");
        serde_json::from_value(answer["data"].clone()).unwrap()
    }
}

/// Whether Prometheus at `url` answers ready within 30 s (false at once if it exited).
async fn ready(child: &mut Child, url: &str) -> bool {
    let client = reqwest::Client::new();
    for _ in 0..300 {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        if let Ok(r) = client.get(format!("{url}/-/ready")).send().await
            && r.status().is_success()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every query of the dashboard: (panel title, expression), the panels' targets then the
/// annotations'.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &[Value], out: &mut Vec<(String, String)>) {
        for panel in panels {
            let title = panel["title"].as_str().unwrap_or("?").to_owned();
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap_or_else(|| {
                    panic!("panel `{title}` has a target without a PromQL expr")
                });
                out.push((title.clone(), expr.to_owned()));
            }
            if let Some(nested) = panel["panels"].as_array() {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dashboard["panels"].as_array().unwrap(), &mut out);
    out
}

/// `expr` as Grafana sends it with `domain` and `rule` selected (already in regex form).
fn substitute(expr: &str, domain: &str, rule: &str) -> String {
    let expr = expr
        .replace("$__rate_interval", RATE_INTERVAL)
        .replace("$domain", domain)
        .replace("$rule", rule);
    assert!(
        !expr.contains('$'),
        "a variable left unsubstituted in {expr}"
    );
    expr
}

/// Sends a mix until `stop`: HTTP and gRPC checks of a new user every eight rounds (five of
/// its sixteen allowed), of three tenants and one plan (soon over their shadow and soft
/// limits), and invalid requests on both transports.
async fn traffic(server: &Server, stop: Arc<AtomicBool>) {
    let http = reqwest::Client::new();
    let mut grpc = server.grpc_client().await;
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let user = format!("u{}", round / 8);
        let tenant = format!("t{}", round % 3);
        let body = json!({
            "domain": "api",
            "descriptors": [
                {"entries": [{"key": "user", "value": user}]},
                {"entries": [{"key": "tenant", "value": tenant}]},
                {"entries": [{"key": "plan", "value": "free"}]},
            ],
        });
        let r = http
            .post(server.url("/v1/check"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(matches!(r.status().as_u16(), 200 | 429), "{}", r.status());
        let request = RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![descriptor(&[("user", &user)])],
            hits_addend: 1,
        };
        grpc.should_rate_limit(request).await.unwrap();
        if round.is_multiple_of(5) {
            invalid_requests(server, &http, &mut grpc).await;
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One invalid request on each transport (a body that is not JSON, a request without a
/// domain), each refused as invalid.
async fn invalid_requests(
    server: &Server,
    http: &reqwest::Client,
    grpc: &mut RateLimitServiceClient<Channel>,
) {
    let r = http
        .post(server.url("/v1/check"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let empty = RateLimitRequest {
        domain: String::new(),
        descriptors: vec![descriptor(&[("user", "x")])],
        hits_addend: 1,
    };
    let refused = grpc.should_rate_limit(empty).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
}

/// The value of each series of a vector result, by the value of `label`.
fn by_label(data: &Value, label: &str) -> Vec<(String, f64)> {
    data["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let name = s["metric"][label].as_str().unwrap_or("").to_owned();
            let value = s["value"][1].as_str().unwrap().parse().unwrap();
            (name, value)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("tollgate.json is JSON");
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 20, "only {} queries found", queries.len());

    let redis = RedisServer::start();
    let server =
        Server::start_with_args(POLICY, &["--store", &redis.url(), "--store-timeout", "1s"]);
    server.push_candidate(CANDIDATE).await;
    let prometheus = Prometheus::start(server.http).await;

    let server = Arc::new(server);
    let stop = Arc::new(AtomicBool::new(false));
    let sender = tokio::spawn({
        let (server, stop) = (server.clone(), stop.clone());
        async move { traffic(&server, stop).await }
    });

    // Fifteen scrapes of tollgate under traffic: more than a rate window.
    eventually(
        Duration::from_secs(90),
        "fifteen scrapes of tollgate with traffic",
        async || {
            let data = prometheus
                .query("count_over_time(tollgate_requests_total{job=\"tollgate\"}[30s])")
                .await
                .unwrap();
            by_label(&data, "job")
                .first()
                .is_some_and(|(_, n)| *n >= 15.0)
        },
    )
    .await;

    // The variables' own queries, as Grafana's label_values() asks them.
    let domains = prometheus
        .label_values("domain", "tollgate_decisions_total")
        .await;
    assert_eq!(domains, ["api"]);
    let rules = prometheus
        .label_values("rule", "tollgate_decisions_total{domain=~\"api\"}")
        .await;
    assert_eq!(rules, ["per_tenant", "per_user", "soft_plan"]);

    // Every query, with one domain and three rules selected (Grafana's regex form of a
    // multi-value variable), then with All (the dashboard's allValue).
    let mut failures = Vec::new();
    for (domain, rule) in [("api", "(per_user|per_tenant|soft_plan)"), (".*", ".*")] {
        for (title, expr) in &queries {
            let expr = substitute(expr, domain, rule);
            match prometheus.query(&expr).await {
                Err(e) => failures.push(format!("{title}: {e}\n  {expr}")),
                Ok(data) if data["result"].as_array().is_none_or(Vec::is_empty) => {
                    failures.push(format!("{title}: no data\n  {expr}"))
                }
                Ok(_) => {}
            }
        }
    }
    for annotation in dashboard["annotations"]["list"].as_array().unwrap() {
        let expr = substitute(annotation["expr"].as_str().unwrap(), "api", ".*");
        // No policy changed here: an annotation query must parse; it need not match.
        if let Err(e) = prometheus.query(&expr).await {
            failures.push(format!("annotation: {e}\n  {expr}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // And the data is the traffic's: every outcome, both transports' refusals, the candidate.
    let mut outcomes = Vec::new();
    for (_, expr) in queries
        .iter()
        .filter(|(t, _)| t == "Decisions per second by outcome")
    {
        let data = prometheus.query(&substitute(expr, "api", ".*")).await;
        outcomes.extend(by_label(&data.unwrap(), "outcome"));
    }
    for outcome in ["allowed", "denied", "shadow_would_deny", "soft_exceeded"] {
        assert!(
            outcomes.iter().any(|(o, v)| o == outcome && *v > 0.0),
            "no {outcome} decisions per second in {outcomes:?}"
        );
    }
    assert!(
        outcomes.iter().any(|(o, _)| o == "degraded"),
        "{outcomes:?}"
    );
    let invalid = prometheus
        .query(&format!(
            "sum by (transport) (rate(tollgate_invalid_requests_total[{RATE_INTERVAL}]))"
        ))
        .await
        .unwrap();
    let invalid = by_label(&invalid, "transport");
    for transport in ["grpc", "http"] {
        assert!(
            invalid.iter().any(|(t, v)| t == transport && *v > 0.0),
            "no invalid {transport} requests in {invalid:?}"
        );
    }
    let candidate = prometheus
        .query(&format!(
            "sum by (rule) (rate(tollgate_candidate_decisions_total{{rule=\"per_user\",outcome=\"denied\"}}[{RATE_INTERVAL}]))"
        ))
        .await
        .unwrap();
    assert!(
        by_label(&candidate, "rule").iter().any(|(_, v)| *v > 0.0),
        "the candidate, enforced, would deny per_user: {candidate}"
    );

    // The alerts, evaluated on the same scrapes: every rule evaluates without error, and on a
    // healthy store nothing about the store, breakers, fail-open or reloads is even pending.
    let alerts = prometheus.alerts().await;
    assert_eq!(alerts.len(), 9, "{alerts:?}");
    for (name, state, health, error) in &alerts {
        assert_eq!(health, "ok", "{name}: {error}");
        let quiet = [
            "TollgateStoreUnreachable",
            "TollgateBreakerOpen",
            "TollgateFailOpen",
            "TollgatePolicyReloadFailing",
            "TollgateDenyRateJumpAfterPolicyChange",
        ];
        if quiet.contains(&name.as_str()) {
            assert_eq!(state, "inactive", "{name} on a healthy tollgate");
        }
    }
    // Over 1 invalid request a second, counted over the alert's 5 minutes (Prometheus has
    // seen less than a minute: 500 on each transport make more than 1.5 a second on each),
    // and the alert is pending.
    let mut grpc = server.grpc_client().await;
    let http = reqwest::Client::new();
    for _ in 0..500 {
        invalid_requests(&server, &http, &mut grpc).await;
    }
    eventually(
        Duration::from_secs(30),
        "TollgateInvalidRequests pending",
        async || {
            prometheus
                .alerts()
                .await
                .iter()
                .any(|(name, state, _, _)| name == "TollgateInvalidRequests" && state == "pending")
        },
    )
    .await;

    stop.store(true, Ordering::Relaxed);
    sender.await.unwrap();
}

/// What Grafana needs of the file beyond the queries: unique panel ids, targets with distinct
/// refIds on the `$datasource` variable, panels inside the 24-column grid and not on top of
/// each other, and the variables the queries use.
#[test]
fn the_dashboard_is_laid_out_for_grafana() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("tollgate.json is JSON");
    let panels = dashboard["panels"].as_array().unwrap();
    let mut ids = std::collections::BTreeSet::new();
    let mut cells = std::collections::BTreeMap::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "{title}: id used twice"
        );
        let grid = &panel["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| grid[k].as_u64().unwrap());
        assert!(
            x + w <= 24 && w > 0 && h > 0,
            "{title}: outside the grid {grid}"
        );
        for cell in (x..x + w).flat_map(|cx| (y..y + h).map(move |cy| (cx, cy))) {
            if let Some(other) = cells.insert(cell, title) {
                panic!("{title} overlaps {other} at {cell:?}");
            }
        }
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        let refs: std::collections::BTreeSet<_> = targets
            .iter()
            .map(|t| t["refId"].as_str().unwrap())
            .collect();
        assert_eq!(refs.len(), targets.len(), "{title}: refIds repeat");
    }
    let variables: Vec<_> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["datasource", "domain", "rule"]);
}
