//! Runtime overrides set many at once (`PUT /v1/admin/overrides/bulk`), all or none, and the
//! cap on how many may be in force (`--max-overrides`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use support::Server;

const POLICY: &str = "domain: api
descriptors:
  - key: tenant
    rate_limit: {name: per_tenant, unit: day, requests_per_unit: 3}
";

fn tenant(value: &str, limit: u64) -> Value {
    json!({"domain": "api", "rule": "per_tenant", "entries": [{"key": "tenant", "value": value}],
           "requests_per_unit": limit})
}

/// The tenants the overrides in force are for, sorted.
async fn tenants(server: &Server) -> Vec<String> {
    let list = server.admin_json("/v1/admin/overrides").await;
    let mut all: Vec<String> = list["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["entries"][0]["value"].as_str().unwrap().to_owned())
        .collect();
    all.sort();
    all
}

/// Sends `body` (as JSON, `Content-Type: application/json`); the status and the body read.
async fn send(server: &Server, method: Method, path: &str, body: &Value) -> (u16, Value) {
    let r = server.admin_send(method, path, body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// A bulk set with one bad element is refused whole, naming the element and the problem; one
/// that would pass the cap is refused whole with 409 naming the cap; a good one sets them all
/// and answers each as listed, in order. The single set is capped too, but replacing an
/// override at the cap is no addition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_sets_are_all_or_nothing_and_capped() {
    let server = Server::start_with_args(POLICY, &["--max-overrides", "3"]);
    let bulk = "/v1/admin/overrides/bulk";

    let mut no_rule = tenant("b", 10);
    no_rule["rule"] = json!("nope");
    for (body, why) in [
        (
            json!({"overrides": [tenant("a", 10), no_rule]}),
            "invalid override 1: no rule `nope` in domain `api`",
        ),
        (
            json!({"overrides": [tenant("a", 10), tenant("b", 10), {"domain": "api", "colour": "red"}]}),
            "override 2: unknown field `colour`",
        ),
        (
            json!({"overrides": [tenant("a", 10), [1, 2]]}),
            "override 1:",
        ),
        (json!({"overrides": {"a": 1}}), "an array of overrides"),
    ] {
        let (status, answer) = send(&server, Method::PUT, bulk, &body).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer.to_string().contains(why), "{why}: {answer}");
    }
    assert!(tenants(&server).await.is_empty(), "nothing set");

    let four: Vec<Value> = ["a", "b", "c", "d"].iter().map(|t| tenant(t, 10)).collect();
    let (status, answer) = send(&server, Method::PUT, bulk, &json!({ "overrides": four })).await;
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer.to_string().contains("at most 3 runtime overrides"),
        "{answer}"
    );
    assert_eq!(answer["max_overrides"], 3, "{answer}");
    assert!(tenants(&server).await.is_empty(), "nothing set");

    let two = json!({"overrides": [tenant("a", 10), tenant("b", 20)]});
    let (status, answer) = send(&server, Method::PUT, bulk, &two).await;
    assert_eq!(status, 200, "{answer}");
    let set = answer["overrides"].as_array().unwrap();
    assert_eq!(set.len(), 2);
    assert_eq!(set[1]["requests_per_unit"], 20);
    assert_ne!(set[0]["id"], set[1]["id"]);
    assert_eq!(tenants(&server).await, ["a", "b"]);

    let single = "/v1/admin/overrides";
    assert_eq!(
        send(&server, Method::PUT, single, &tenant("c", 10)).await.0,
        200
    );
    let (status, answer) = send(&server, Method::PUT, single, &tenant("d", 10)).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer.to_string().contains("at most 3"), "{answer}");
    let (status, _) = send(&server, Method::PUT, single, &tenant("a", 30)).await;
    assert_eq!(status, 200, "replacing one at the cap adds none");
    assert_eq!(tenants(&server).await, ["a", "b", "c"]);
    let response = server.check("tenant", "b").await;
    assert_eq!(response.status(), 200);
}
