//! The admin listener's dashboard against the built binary: who may read and change what, and
//! that its snapshot shows the traffic sent (history, per-value would-deny shares) and rolls
//! back. The page itself is driven in a real browser by `tests/dashboard/browser_test.py`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Server, eventually};

/// A shadow rule keyed on tenant then user, counted per value.
const POLICY: &str = "domain: api
descriptors:
  - key: tenant
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit:
          name: per_tenant_user
          unit: day
          requests_per_unit: 2
          mode: shadow
";

struct Dashboard {
    server: Server,
    client: reqwest::Client,
}

impl Dashboard {
    fn start() -> Dashboard {
        let dir = tempfile::tempdir().unwrap();
        let (full, read) = (dir.path().join("full"), dir.path().join("read"));
        std::fs::write(&full, "full-token\n").unwrap();
        std::fs::write(&read, "look-token\n").unwrap();
        let server = Server::start_with_args(
            POLICY,
            &[
                "--admin-token-file",
                full.to_str().unwrap(),
                "--admin-read-token-file",
                read.to_str().unwrap(),
            ],
        );
        Dashboard {
            server,
            client: reqwest::Client::new(),
        }
    }

    async fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        let mut request = self.client.get(self.server.admin_url(path));
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        let answer = request.send().await.unwrap();
        (answer.status().as_u16(), answer.text().await.unwrap())
    }

    async fn snapshot(&self) -> Value {
        let (status, text) = self
            .get("/v1/admin/dashboard/snapshot", Some("look-token"))
            .await;
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    }

    async fn post(
        &self,
        path: &str,
        token: &str,
        content_type: &str,
        origin: Option<&str>,
        body: &str,
    ) -> (u16, String) {
        let mut request = self
            .client
            .post(self.server.admin_url(path))
            .bearer_auth(token)
            .header("content-type", content_type)
            .body(body.to_owned());
        if let Some(o) = origin {
            request = request.header("origin", o);
        }
        let answer = request.send().await.unwrap();
        (answer.status().as_u16(), answer.text().await.unwrap())
    }

    /// `n` checks of tenant `tenant`, user `user`.
    async fn send(&self, tenant: &str, user: &str, n: usize) {
        let body = json!({"domain": "api", "descriptors": [{"entries": [
            {"key": "tenant", "value": tenant}, {"key": "user", "value": user}]}]});
        for _ in 0..n {
            let answer = self
                .client
                .post(self.server.url("/v1/check"))
                .json(&body)
                .send()
                .await
                .unwrap();
            // Shadow mode: never denied.
            assert_eq!(answer.status(), 200);
        }
    }
}

fn rule(snapshot: &Value) -> &Value {
    snapshot["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == "per_tenant_user")
        .unwrap()
}

fn share_of<'a>(list: &'a Value, value: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|v| v["value"] == value)
        .unwrap_or_else(|| panic!("no {value} in {list}"))
}

/// The page needs no token; the data takes either token; writes only the full one, with a
/// JSON body and an `Origin` that is the listener's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_token_may_do_what_it_is_for() {
    let d = Dashboard::start();
    let (status, page) = d.get("/", None).await;
    assert_eq!(status, 200);
    assert!(page.contains("/v1/admin/dashboard/snapshot"), "{page}");
    let path = "/v1/admin/dashboard/snapshot";
    assert_eq!(d.get(path, None).await.0, 401);
    assert_eq!(d.get(path, Some("wrong")).await.0, 401);
    let (status, text) = d.get(path, Some("full-token")).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["can_write"],
        true
    );
    assert_eq!(d.snapshot().await["can_write"], false);
    // The read-only token reaches the dashboard only, not the admin API.
    assert_eq!(d.get("/v1/admin/policy", Some("look-token")).await.0, 401);

    // A second version to roll back from.
    let push = json!({"sources": [{"name": "policy.yaml",
        "text": POLICY.replace("requests_per_unit: 2", "requests_per_unit: 3")}]});
    let (status, text) = d
        .post(
            "/v1/admin/policy",
            "full-token",
            "application/json",
            None,
            &push.to_string(),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(d.snapshot().await["policy"]["current"], 2);

    let rollback = "/v1/admin/dashboard/rollback";
    let body = r#"{"to": 1}"#;
    let json = "application/json";
    let own = format!("http://{}", d.server.admin);
    let refused = [
        ("look-token", json, None, 403),
        ("wrong", json, None, 401),
        ("full-token", "text/plain", None, 415),
        ("full-token", "application/x-www-form-urlencoded", None, 415),
        ("full-token", json, Some("http://evil.example"), 403),
    ];
    for (token, content_type, origin, expected) in refused {
        let (status, text) = d.post(rollback, token, content_type, origin, body).await;
        assert_eq!(
            status, expected,
            "{token} {content_type} {origin:?}: {text}"
        );
    }
    assert_eq!(
        d.snapshot().await["policy"]["current"],
        2,
        "a refused write changed nothing"
    );
    let (status, text) = d.post(rollback, "full-token", json, Some(&own), body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(d.snapshot().await["policy"]["current"], 3);
    let versions = &d.snapshot().await["policy"]["versions"];
    let current = versions
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["current"] == true)
        .unwrap();
    assert_eq!(current["origin"], "rollback", "{versions}");
}

/// For a workload whose answer is known, the shadow rule's would-deny shares per full
/// descriptor and per tenant, and the per-second history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_shows_the_traffic_and_its_would_deny_shares() {
    let d = Dashboard::start();
    // Two samples (one rate) first, so that all the traffic falls after the first sample.
    eventually(Duration::from_secs(10), "two samples", async || {
        !d.snapshot().await["at_ms"].as_array().unwrap().is_empty()
    })
    .await;
    // Limit 2 a day per (tenant, user): acme/a 2 allowed, 8 would be denied; acme/b 2 allowed;
    // globex/c 1 allowed.
    d.send("acme", "a", 10).await;
    d.send("acme", "b", 2).await;
    d.send("globex", "c", 1).await;
    eventually(
        Duration::from_secs(10),
        "the traffic in the history",
        async || {
            let s = d.snapshot().await;
            let rates = &rule(&s)["rates"];
            let seconds = s["sample_every_ms"].as_f64().unwrap() / 1e3;
            let sum = |column: &str| {
                rates[column]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap() * seconds)
                    .sum::<f64>()
            };
            (sum("shadow_would_deny") - 8.0).abs() < 0.5 && (sum("allowed") - 5.0).abs() < 0.5
        },
    )
    .await;
    let s = d.snapshot().await;
    let r = rule(&s);
    assert_eq!(r["mode"], "shadow");
    assert_eq!(r["totals"]["shadow_would_deny"], 8);
    assert_eq!(r["totals"]["allowed"], 5);
    let a = share_of(&r["values"], "tenant=acme,user=a");
    assert_eq!(
        (a["total"].as_u64(), a["hits"].as_u64()),
        (Some(10), Some(8))
    );
    assert_eq!(a["share"], 0.8);
    let acme = share_of(&r["rollup"], "tenant=acme");
    assert_eq!(acme["total"], 12);
    assert_eq!(acme["hits"], 8);
    assert_eq!(share_of(&r["rollup"], "tenant=globex")["share"], 0.0);
    // The same from the bounded sketch, exact below its capacity: counted since tracking
    // began, which for each value here is its first request.
    let sketch = &r["sketch"];
    assert_eq!(sketch["total"], 13, "{sketch}");
    let a = share_of(&sketch["values"], "tenant=acme,user=a");
    assert_eq!(
        (a["total"].as_u64(), a["error"].as_u64()),
        (Some(10), Some(0))
    );
    assert_eq!(a["share"], 0.8);
    assert_eq!(
        share_of(&sketch["rollup"], "tenant=acme")["share"],
        8.0 / 12.0
    );
    assert_eq!(share_of(&sketch["rollup"], "tenant=globex")["share"], 0.0);
    // Top keys carry their share of their own traffic.
    let top = &r["top_keys"][0];
    assert_eq!(top["key"], "tenant=acme,user=a");
    assert_eq!(top["own_traffic"]["share"], 0.8);
    assert_eq!(s["health"]["store"], "memory");
    assert_eq!(s["health"]["reachable"], true);
    assert!(
        s["latency"]["decision"]["count"].as_u64().unwrap() >= 13,
        "{s}"
    );

    // A candidate that limits each (tenant, user) to 1 a day: per value, from its own sketch.
    let candidate = json!({"sources": [{"name": "candidate.yaml",
        "text": POLICY.replace("requests_per_unit: 2", "requests_per_unit: 1")
            .replace("mode: shadow", "mode: enforce")}]});
    let (status, text) = d
        .post(
            "/v1/admin/policy/candidate",
            "full-token",
            "application/json",
            None,
            &candidate.to_string(),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    d.send("acme", "a", 4).await;
    d.send("globex", "c", 1).await;
    let s = d.snapshot().await;
    let c = &s["candidate"]["rules"][0];
    assert_eq!(
        (c["allowed"].as_u64(), c["would_deny"].as_u64()),
        (Some(2), Some(3)),
        "{c}"
    );
    let sketch = &c["sketch"];
    assert_eq!(share_of(&sketch["rollup"], "tenant=acme")["share"], 0.75);
    assert_eq!(share_of(&sketch["rollup"], "tenant=globex")["share"], 0.0);
}
