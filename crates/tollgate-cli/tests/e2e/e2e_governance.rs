//! Governing a running server: hot reload, versions and rollback, explain, soft mode, runtime
//! overrides and the admin token — against the built binary over real sockets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::{Server, binary, eventually};

const V1: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: day, requests_per_unit: 5}
  - key: tenant
    rate_limit: {name: per_tenant, unit: day, requests_per_unit: 3}
  - key: burst
    rate_limit: {name: soft_burst, unit: day, requests_per_unit: 2, mode: soft}
";

fn check_body(key: &str, value: &str) -> Value {
    json!({"domain": "api", "descriptors": [{"entries": [{"key": key, "value": value}]}]})
}

async fn remaining(server: &Server, key: &str, value: &str) -> Value {
    let r = server.check(key, value).await;
    let body: Value = r.json().await.unwrap();
    body["statuses"][0]["remaining"].clone()
}

/// Writes the policy file the way editors do: a new file renamed over the old one.
fn replace_file(server: &Server, text: &str) {
    let tmp = server.config.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &server.config).unwrap();
}

/// Waits (5 s at most) until the server's metrics have `line`; panics saying `what` did not
/// happen if they never do.
async fn metrics_show(server: &Server, line: &str, what: &str) {
    eventually(Duration::from_secs(5), what, async || {
        server.metrics().await.contains(line)
    })
    .await;
}

/// `POST /v1/explain` with `body`: the answer, which must be a `200`.
async fn explain(server: &Server, body: &Value) -> Value {
    let r = reqwest::Client::new()
        .post(server.url("/v1/explain"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// Sends `request` and checks it is refused with a `400` that says `why`.
async fn refused(request: reqwest::RequestBuilder, why: &str) {
    let r = request.send().await.unwrap();
    assert_eq!(r.status(), 400);
    let text = r.text().await.unwrap();
    assert!(text.contains(why), "{text}");
}

async fn policy_version(server: &Server) -> u64 {
    let text = server.metrics().await;
    let line = text
        .lines()
        .find(|l| l.starts_with("tollgate_policy_version{"))
        .unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

async fn wait_for_version(server: &Server, seq: u64) {
    let what = format!("version {seq} became active");
    eventually(Duration::from_secs(5), &what, async || {
        policy_version(server).await == seq
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn file_changes_reload_under_load_without_failures_and_keep_counters() {
    let server = Arc::new(Server::start(V1));
    for _ in 0..2 {
        server.check("user", "alice").await;
    }
    // Load from 16 callers while the file changes twice (one valid, one broken).
    let failures = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut callers = Vec::new();
    for i in 0..16 {
        let (server, failures, sent, stop) =
            (server.clone(), failures.clone(), sent.clone(), stop.clone());
        callers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            while !stop.load(Ordering::SeqCst) {
                let r = client
                    .post(server.url("/v1/check"))
                    .json(&check_body("user", &format!("load{i}")))
                    .send()
                    .await;
                sent.fetch_add(1, Ordering::SeqCst);
                match r {
                    Ok(r) if r.status() == 200 || r.status() == 429 => {}
                    _ => {
                        failures.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }
    // per_user goes from 5 to 50 a day; per_tenant is unchanged.
    replace_file(
        &server,
        &V1.replace("requests_per_unit: 5}", "requests_per_unit: 50}"),
    );
    wait_for_version(&server, 2).await;
    replace_file(
        &server,
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    let rejected = "tollgate_policy_reloads_total{result=\"rejected\"} 1";
    metrics_show(&server, rejected, "the broken file was rejected").await;
    stop.store(true, Ordering::SeqCst);
    for c in callers {
        c.await.unwrap();
    }
    assert!(sent.load(Ordering::SeqCst) > 100, "the load ran");
    assert_eq!(
        failures.load(Ordering::SeqCst),
        0,
        "no request failed across the reloads"
    );

    let text = server.metrics().await;
    assert_eq!(
        policy_version(&server).await,
        2,
        "the broken file left version 2 running"
    );
    assert!(
        text.contains("tollgate_policy_reloads_total{result=\"rejected\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_policy_last_reload_successful 0"),
        "{text}"
    );
    // alice used 2 of her quota before the change; the count carried over to the new limit.
    assert_eq!(remaining(&server, "user", "alice").await, 47);

    // A good file again, then none at all (a ConfigMap gone): a rejection in the metrics too,
    // once, not once per check, and version 3 keeps running.
    replace_file(&server, V1);
    wait_for_version(&server, 3).await;
    let successful = "tollgate_policy_last_reload_successful 1";
    metrics_show(
        &server,
        successful,
        "the good file was counted as a success",
    )
    .await;
    std::fs::remove_file(&server.config).unwrap();
    let rejected = "tollgate_policy_reloads_total{result=\"rejected\"} 2";
    metrics_show(
        &server,
        rejected,
        "the missing file was counted as rejected",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let text = server.metrics().await;
    assert!(text.contains(rejected), "counted once: {text}");
    assert!(
        text.contains("tollgate_policy_last_reload_successful 0"),
        "{text}"
    );
    assert_eq!(policy_version(&server).await, 3);

    // The same file back: nothing to activate, and the gauge says what it said of it before.
    replace_file(&server, V1);
    metrics_show(
        &server,
        successful,
        "the file back was counted as readable again",
    )
    .await;
    assert_eq!(policy_version(&server).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_policy() {
    // No file watcher: only the signal can bring version 2.
    let server = Server::start_with_args(V1, &["--watch-interval", "0s"]);
    std::fs::write(
        &server.config,
        V1.replace("requests_per_unit: 3}", "requests_per_unit: 30}"),
    )
    .unwrap();
    server.signal("HUP");
    wait_for_version(&server, 2).await;
    assert_eq!(remaining(&server, "tenant", "t").await, 29);
}

/// Files read by a SIGHUP count as seen: the watcher's next look at them must not undo a push
/// made in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_after_a_sighup_survives_the_file_watcher() {
    let server = Server::start_with_args(V1, &["--watch-interval", "2s"]);
    // After the watcher's first look (at start), well before its second (at 2 s).
    tokio::time::sleep(Duration::from_millis(300)).await;
    replace_file(
        &server,
        &V1.replace("requests_per_unit: 3}", "requests_per_unit: 30}"),
    );
    server.signal("HUP");
    wait_for_version(&server, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let pushed = dir.path().join("pushed.yaml");
    std::fs::write(
        &pushed,
        V1.replace("requests_per_unit: 3}", "requests_per_unit: 1}"),
    )
    .unwrap();
    let (code, out, err) = server.policy_cli(&["push", pushed.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    wait_for_version(&server, 3).await;
    // Past the watcher's next look: the push still runs.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(policy_version(&server).await, 3);
    assert_eq!(
        remaining(&server, "tenant", "t").await,
        0,
        "the pushed limit of 1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_list_diff_and_rollback_from_the_cli() {
    let server = Server::start_with_args(V1, &["--watch-interval", "0s"]);
    let dir = tempfile::tempdir().unwrap();
    let candidate = dir.path().join("candidate.yaml");
    std::fs::write(
        &candidate,
        V1.replace("requests_per_unit: 3}", "requests_per_unit: 1}"),
    )
    .unwrap();

    // The running file pushed again, by another spelling of its path: the same policy.
    let config = server.config.to_str().unwrap();
    let (dir_of_config, file) = config.rsplit_once('/').unwrap();
    let respelt = format!("{dir_of_config}/./{file}");
    let (code, out, err) = server.policy_cli(&["push", &respelt]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("unchanged: version 1-"), "{out}");

    let (code, out, err) = server.policy_cli(&["push", candidate.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("activated: version 2-"), "{out}");
    server.check("tenant", "t").await;
    assert_eq!(
        server.check("tenant", "t").await.status(),
        429,
        "the pushed limit of 1 applies"
    );

    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "domain: api\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: -1}}]\n",
    )
    .unwrap();
    let (code, _, err) = server.policy_cli(&["push", broken.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(
        err.contains("broken.yaml:2:") && err.contains("nothing pushed"),
        "{err}"
    );

    let (_, list, _) = server.policy_cli(&["list"]);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 2, "{list}");
    assert!(
        lines[1].starts_with("*    2") && lines[1].contains("push"),
        "{list}"
    );

    let (_, diff, _) = server.policy_cli(&["diff", "1", "2"]);
    assert!(
        diff.contains("-    rate_limit: {name: per_tenant, unit: day, requests_per_unit: 3}"),
        "{diff}"
    );
    assert!(
        diff.contains("+    rate_limit: {name: per_tenant, unit: day, requests_per_unit: 1}"),
        "{diff}"
    );

    let (code, out, _) = server.policy_cli(&["rollback"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("activated: version 3-"), "{out}");
    // The counter (1 used) carried over; back at 3 a day, two more are allowed, then none.
    assert_eq!(server.check("tenant", "t").await.status(), 200);
    assert_eq!(server.check("tenant", "t").await.status(), 200);
    assert_eq!(server.check("tenant", "t").await.status(), 429);
    let (_, show, _) = server.policy_cli(&["show", "3"]);
    assert!(show.contains("requests_per_unit: 3}"), "{show}");
    let (code, _, err) = server.policy_cli(&["rollback", "--to", "99"]);
    assert_ne!(code, 0);
    assert!(err.contains("no kept version 99"), "{err}");
    // Over the API, a version that is not kept is not found, as `show` answers it.
    let missing = reqwest::Client::new()
        .post(format!("http://{}/v1/admin/policy/rollback", server.admin))
        .header("content-type", "application/json")
        .body(r#"{"to": 99}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    // The version that is missing is named, and the server's error is not shown as raw JSON.
    let (code, _, err) = server.policy_cli(&["diff", "1", "999"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("no kept version 999") && !err.contains('{'),
        "{err}"
    );
}

/// Two plain rollbacks sent at once go back two versions, as two sent one after the other do:
/// both chose the version before the running one, so the second undid the first (or, racing
/// closer, failed with a `409`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_rollbacks_at_once_step_back_one_version_each() {
    let server = Server::start_with_args(V1, &["--watch-interval", "0s"]);
    let first = server.admin_json("/v1/admin/policy").await["versions"][0]["hash"].clone();
    let mut hashes = vec![first];
    for n in 6..=9 {
        let text = V1.replace(
            "requests_per_unit: 5}",
            &format!("requests_per_unit: {n}}}"),
        );
        let push = json!({"sources": [{"name": "policy.yaml", "text": text}]});
        let r = server
            .admin_send(reqwest::Method::POST, "/v1/admin/policy", &push)
            .await;
        assert_eq!(r.status(), 200);
        hashes.push(r.json::<Value>().await.unwrap()["version"]["hash"].clone());
    }
    let plain = json!({});
    let rollback = || server.admin_send(reqwest::Method::POST, "/v1/admin/policy/rollback", &plain);
    let running = async || {
        let list = server.admin_json("/v1/admin/policy").await;
        let current = list["current"].clone();
        let versions = list["versions"].as_array().unwrap().clone();
        versions.into_iter().find(|v| v["seq"] == current).unwrap()["hash"].clone()
    };
    assert_eq!(running().await, hashes[4]);

    let (a, b) = tokio::join!(rollback(), rollback());
    for r in [a, b] {
        assert_eq!(r.status(), 200);
        assert_eq!(r.json::<Value>().await.unwrap()["result"], "activated");
    }
    assert_eq!(running().await, hashes[2], "two versions back");
    assert_eq!(
        remaining(&server, "user", "u").await,
        6,
        "version 3's 7 a day"
    );

    for _ in 0..2 {
        assert_eq!(rollback().await.status(), 200);
    }
    assert_eq!(
        running().await,
        hashes[0],
        "two more in a row: the first version"
    );
    let r = rollback().await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("no earlier version"));
}

/// `--policy-history-max-bytes`: past it the listing keeps only the newest versions, and a
/// rollback still goes to the version before the running one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_history_keeps_its_bytes_and_still_rolls_back() {
    let args = [
        "--watch-interval",
        "0s",
        "--policy-history-max-bytes",
        "5KB",
    ];
    let server = Server::start_with_args(V1, &args);
    // 2000 bytes each with its name: two fit in 5000 bytes, three do not.
    let sized = |n: u32| {
        let mut text = V1.replace(
            "requests_per_unit: 5}",
            &format!("requests_per_unit: {n}}}"),
        );
        let pad = 2000 - "policy.yaml".len() - text.len() - 2;
        text.push_str(&format!("#{}\n", "x".repeat(pad)));
        json!({"sources": [{"name": "policy.yaml", "text": text}]})
    };
    for n in 6..=9 {
        let r = server
            .admin_send(reqwest::Method::POST, "/v1/admin/policy", &sized(n))
            .await;
        assert_eq!(r.status(), 200);
    }
    let kept = async || {
        let list = server.admin_json("/v1/admin/policy").await;
        let versions = list["versions"].as_array().unwrap().clone();
        versions
            .iter()
            .map(|v| v["seq"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(kept().await, [4, 5], "the oldest went first");

    let plain = json!({});
    let rollback = || server.admin_send(reqwest::Method::POST, "/v1/admin/policy/rollback", &plain);
    let r = rollback().await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["result"], "activated");
    assert_eq!(
        remaining(&server, "user", "u").await,
        7,
        "version 4's 8 a day"
    );
    assert_eq!(kept().await, [5, 6]);
    let r = rollback().await;
    assert_eq!(r.status(), 400, "nothing before version 4 is kept");
    let (code, _, err) = server.policy_cli(&["rollback", "--to", "2"]);
    assert_ne!(code, 0);
    assert!(err.contains("no kept version 2"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_the_binding_rule_and_charges_nothing() {
    let server = Server::start(V1);
    server.check("tenant", "t").await;
    let body = json!({"domain": "api", "descriptors": [
        {"entries": [{"key": "user", "value": "u"}]},
        {"entries": [{"key": "tenant", "value": "t"}]},
        {"entries": [{"key": "nope", "value": "x"}]}
    ]});
    for _ in 0..3 {
        let e = explain(&server, &body).await;
        assert_eq!(e["would_allow"], true);
        let s = &e["statuses"];
        assert_eq!(s[0]["limit_name"], "per_user");
        assert_eq!(s[0]["remaining"], 4);
        assert_eq!(s[1]["limit_name"], "per_tenant");
        assert_eq!(
            s[1]["remaining"], 1,
            "2 used: the earlier check and this would-be one"
        );
        assert_eq!(s[1]["binding"], true, "the least remaining binds");
        assert_eq!(s[0]["binding"], false);
        assert_eq!(s[1]["mode"], "enforce");
        assert!(
            s[1]["rule_location"].as_str().unwrap().ends_with(":6:17"),
            "{}",
            s[1]
        );
        assert_eq!(s[2]["matched"], false);
    }
    assert_eq!(
        remaining(&server, "tenant", "t").await,
        1,
        "explain charged nothing"
    );
}

/// A rule that matches but limits nothing is shown as matched: an unlimited rule, and one a
/// matched rule's `replaces` set aside, each with its name and place in the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_unlimited_and_replaced_rules_as_matched() {
    let server = Server::start(
        "domain: api
descriptors:
  - key: api_key
    value: internal
    rate_limit: {unlimited: true}
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 5}
  - key: vip
    rate_limit: {name: vip, unit: minute, requests_per_unit: 100, replaces: [{name: per_user}]}
",
    );
    let body = json!({"domain": "api", "descriptors": [
        {"entries": [{"key": "api_key", "value": "internal"}]},
        {"entries": [{"key": "user", "value": "u"}]},
        {"entries": [{"key": "vip", "value": "v"}]}
    ]});
    let e = explain(&server, &body).await;
    let s = &e["statuses"];
    assert_eq!(s[0]["matched"], true, "{e}");
    assert_eq!(s[0]["unlimited"], true, "{e}");
    assert!(
        s[0]["rule_location"].as_str().unwrap().ends_with(":5:17"),
        "{e}"
    );
    assert_eq!(s[1]["matched"], true, "{e}");
    assert_eq!(s[1]["replaced"], true, "{e}");
    assert_eq!(s[1]["limit_name"], "per_user", "{e}");
    assert!(s[1].get("remaining").is_none(), "no limit applies: {e}");
    assert_eq!(s[2]["limit_name"], "vip", "{e}");
    assert_eq!(s[2]["binding"], true, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_limit_allows_and_marks_the_overage() {
    let server = Server::start(V1);
    for _ in 0..2 {
        let r = server.check("burst", "b").await;
        assert!(r.headers().get("x-tollgate-soft-exceeded").is_none());
    }
    let r = server.check("burst", "b").await;
    assert_eq!(r.status(), 200, "soft: allowed");
    let delay: u64 = r.headers()["x-tollgate-soft-exceeded"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(delay > 0);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["statuses"][0]["soft_exceeded"], true);
    assert_eq!(body["soft_delay_ms"], delay);
    // A cost above the limit never fits: no wait is suggested, even on a used-up key.
    let over = json!({"domain": "api", "descriptors": [
        {"entries": [{"key": "burst", "value": "b"}], "hits_addend": 1000}
    ]});
    let r = reqwest::Client::new()
        .post(server.url("/v1/check"))
        .json(&over)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-tollgate-soft-exceeded"], "0");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["statuses"][0]["reason"], "cost_exceeds_capacity");
    assert_eq!(body["soft_delay_ms"], 0, "{body}");
    let text = server.metrics().await;
    assert!(
        text.contains(
            r#"tollgate_decisions_total{domain="api",rule="soft_burst",outcome="soft_exceeded"} 2"#
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_change_one_value_expire_and_survive_reloads() {
    let server = Server::start(V1);
    let admin = reqwest::Client::new();
    // The overrides in force, as the admin API lists them.
    let overrides = || server.admin_json("/v1/admin/overrides");
    let set = json!({"domain": "api", "rule": "per_tenant", "entries": [{"key": "tenant", "value": "acme"}],
                     "requests_per_unit": 30, "expires_in": "6s", "reason": "launch"});
    // Six seconds: the reload below must happen well before it expires, even on a busy machine.
    let set_at = tokio::time::Instant::now();
    let r = admin
        .put(server.admin_url("/v1/admin/overrides"))
        .json(&set)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = r.json::<Value>().await.unwrap()["id"].as_u64().unwrap();
    assert_eq!(
        remaining(&server, "tenant", "acme").await,
        29,
        "acme gets 10x"
    );
    assert_eq!(
        remaining(&server, "tenant", "other").await,
        2,
        "others keep the rule"
    );

    // A reload does not drop it.
    std::fs::write(&server.config, format!("{V1}\n# touched\n")).unwrap();
    server.signal("HUP");
    wait_for_version(&server, 2).await;
    assert_eq!(remaining(&server, "tenant", "acme").await, 28);
    let list = overrides().await;
    assert_eq!(list["overrides"][0]["id"], id);
    assert_eq!(list["overrides"][0]["reason"], "launch");

    // Bad overrides are refused with the reason, and nothing is set.
    let expired = json!({"domain": "api", "rule": "per_tenant", "entries": [{"key": "tenant", "value": "acme"}],
                         "requests_per_unit": 1, "expires_in": "0s"});
    for (bad, why) in [
        (
            json!({"domain": "api", "rule": "nope", "entries": [], "requests_per_unit": 1}),
            "no rule `nope`",
        ),
        (expired, "`expires_in` must be longer than zero"),
        (
            json!({"domain": "api", "rule": "per_tenant", "entries": [{"key": "tenant", "value": "acme"}],
                   "requests_per_unit": 1, "reason": "launch\n2026-11-30T23:59:59Z INFO Override deleted id=1"}),
            "holds a control character",
        ),
        (
            json!({"domain": "api", "rule": "per_tenant", "entries": [{"key": "tenant", "value": "acme"}],
                   "requests_per_unit": 1, "expires_in": "1000000years"}),
            "`expires_in` may be at most 366 days",
        ),
    ] {
        let put = admin.put(server.admin_url("/v1/admin/overrides"));
        refused(put.json(&bad), why).await;
    }
    let list = overrides().await;
    assert_eq!(list["overrides"].as_array().unwrap().len(), 1, "{list}");

    // It expires: back to the rule's 3 a day with the count (2 used) carried over.
    tokio::time::sleep_until(set_at + Duration::from_millis(6100)).await;
    assert_eq!(server.check("tenant", "acme").await.status(), 200);
    assert_eq!(server.check("tenant", "acme").await.status(), 429);
    let list = overrides().await;
    assert_eq!(list["overrides"].as_array().unwrap().len(), 0);
    let r = admin
        .delete(server.admin_url(&format!("/v1/admin/overrides/{id}")))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// An override's audit line says when it expires, and an override that expires is logged once
/// (`Override expired`), however many requests and listings come after: it used to go
/// without a word, and its set line did not say it would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_that_expires_is_logged_once() {
    let server = Server::start_logged_at("info", V1, &["--sweep-interval", "100ms"]);
    let set = async |value: &str, expiry: Value| {
        let mut set = json!({"domain": "api", "rule": "per_tenant", "entries": [{"key": "tenant", "value": value}],
                             "requests_per_unit": 30, "reason": "launch"});
        if !expiry.is_null() {
            set["expires_in"] = expiry;
        }
        server
            .admin_send(reqwest::Method::PUT, "/v1/admin/overrides", &set)
            .await
    };
    let r = set("acme", json!("1s")).await;
    assert_eq!(r.status(), 200);
    let id = r.json::<Value>().await.unwrap()["id"].as_u64().unwrap();
    assert_eq!(set("globex", Value::Null).await.status(), 200);
    let log = server.log();
    let set_line = |value: &str| {
        log.lines()
            .find(|l| l.contains("Override set") && l.contains(value))
            .unwrap_or_else(|| panic!("no set line for {value}:\n{log}"))
            .to_owned()
    };
    let acme = set_line("acme");
    assert!(acme.contains("expires_in=1s expires_at=20"), "{acme}");
    let globex = set_line("globex");
    assert!(
        globex.contains("expires_in=never expires_at=never"),
        "{globex}"
    );

    // Requests across the expiry (which pass over an expired override without a word): the
    // sweeper notices it. Then more requests and listings.
    let expired_line = format!("Override expired id={id}");
    eventually(Duration::from_secs(5), "the expiry is logged", async || {
        server.check("tenant", "acme").await;
        server.log().contains(&expired_line)
    })
    .await;
    for _ in 0..20 {
        server.check("tenant", "acme").await;
        server.admin_json("/v1/admin/overrides").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = server.log();
    let expired: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Override expired"))
        .collect();
    assert_eq!(expired.len(), 1, "{log}");
    assert!(expired[0].contains("rule=per_tenant"), "{log}");
    let list = server.admin_json("/v1/admin/overrides").await;
    assert_eq!(list["overrides"].as_array().unwrap().len(), 1, "{list}");
}

/// Two rules whose derived names collide are named `a_b_c` and `a_b_c#2` in file order: swapping
/// them hands an override's rule name to the other rule. The override is kept, listed as
/// applying to nothing and logged; swapped back, it applies again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_whose_rule_goes_is_listed_and_logged() {
    let rule = |key: &str, value: &str, n: u32| {
        format!(
            "  - key: {key}\n    value: {value}\n    rate_limit: {{unit: hour, requests_per_unit: {n}}}\n"
        )
    };
    let policy = |first: &str, second: &str| format!("domain: api\ndescriptors:\n{first}{second}");
    let (ab_c, a_bc) = (rule("a_b", "c", 1), rule("a", "b_c", 2));
    let server = Server::start_logged(&policy(&ab_c, &a_bc), &[]);
    let set = json!({"domain": "api", "rule": "a_b_c#2", "entries": [{"key": "a", "value": "b_c"}],
                     "requests_per_unit": 50});
    let r = server
        .admin_send(reqwest::Method::PUT, "/v1/admin/overrides", &set)
        .await;
    assert_eq!(r.status(), 200);
    let applies =
        async || server.admin_json("/v1/admin/overrides").await["overrides"][0]["applies"].clone();
    assert_eq!(applies().await, true);
    assert_eq!(remaining(&server, "a", "b_c").await, 49);

    std::fs::write(&server.config, policy(&a_bc, &ab_c)).unwrap();
    server.signal("HUP");
    wait_for_version(&server, 2).await;
    assert_eq!(applies().await, false);
    assert_eq!(
        remaining(&server, "a", "b_c").await,
        0,
        "the rule's own 2 an hour"
    );
    let log = server.log();
    assert!(
        log.contains("A runtime override applies to nothing under the new policy"),
        "{log}"
    );

    std::fs::write(&server.config, policy(&ab_c, &a_bc)).unwrap();
    server.signal("HUP");
    wait_for_version(&server, 3).await;
    assert_eq!(applies().await, true);
    assert_eq!(remaining(&server, "a", "b_c").await, 47);
}

/// Whether a line of `log` holds every one of `parts` and names `client` as the client.
fn logged_from(log: &str, parts: &[&str], client: SocketAddr) -> bool {
    let named = format!("client={client}");
    log.lines().any(|line| {
        parts.iter().all(|part| line.contains(part))
            && line
                .split(&named)
                .nth(1)
                .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// Every audit line of the admin API (push, rollback, reload, the candidate's set, promote and
/// drop, an override's set and delete) names the client that made the change: the address of
/// the admin connection it came on. They named no one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_audit_lines_name_the_client() {
    let server = Server::start_logged_at("info", V1, &["--watch-interval", "0s"]);
    let push = |n: u32| {
        let text = V1.replace(
            "requests_per_unit: 5}",
            &format!("requests_per_unit: {n}}}"),
        );
        json!({"sources": [{"name": "policy.yaml", "text": text}]}).to_string()
    };
    let ok = |(status, answer, client): (u16, String, SocketAddr)| {
        assert!((200..300).contains(&status), "{answer}");
        (answer, client)
    };
    let mut made = Vec::new();
    let (_, client) = ok(server.admin_raw("POST", "/v1/admin/policy", &push(6), None));
    made.push((vec!["Policy activated", "origin=\"push\""], client));
    let (_, client) = ok(server.admin_raw("POST", "/v1/admin/policy/rollback", "", None));
    made.push((vec!["Policy activated", "origin=\"rollback\""], client));
    std::fs::write(&server.config, V1.replace("5}", "9}")).unwrap();
    let (_, client) = ok(server.admin_raw("POST", "/v1/admin/reload", "", None));
    made.push((vec!["Policy activated", "origin=\"file\""], client));
    let candidate = "/v1/admin/policy/candidate";
    let (_, client) = ok(server.admin_raw("POST", candidate, &push(7), None));
    made.push((vec!["Policy candidate shadowing"], client));
    let (_, client) = ok(server.admin_raw("POST", "/v1/admin/policy/promote", "", None));
    made.push((vec!["Policy candidate promoted"], client));
    ok(server.admin_raw("POST", candidate, &push(8), None));
    let (_, client) = ok(server.admin_raw("DELETE", candidate, "", None));
    made.push((vec!["Policy candidate dropped"], client));
    let set = json!({"domain": "api", "rule": "per_tenant", "entries": [{"key": "tenant", "value": "acme"}],
                     "requests_per_unit": 30});
    let (answer, client) =
        ok(server.admin_raw("PUT", "/v1/admin/overrides", &set.to_string(), None));
    made.push((vec!["Override set"], client));
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    let id = serde_json::from_str::<Value>(body).unwrap()["id"]
        .as_u64()
        .unwrap();
    let (_, client) =
        ok(server.admin_raw("DELETE", &format!("/v1/admin/overrides/{id}"), "", None));
    made.push((vec!["Override deleted"], client));

    let log = server.log();
    for (parts, client) in made {
        assert!(
            logged_from(&log, &parts, client),
            "{parts:?} from {client}:\n{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_a_missing_or_wrong_token_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let server = Server::start_with_args(V1, &["--admin-token-file", token_file.to_str().unwrap()]);
    let admin = reqwest::Client::new();
    let push = json!({"sources": [{"name": "x.yaml", "text": "domain: x\ndescriptors: []\n"}]});
    for token in [None, Some("wrong")] {
        let mut r = admin.post(server.admin_url("/v1/admin/policy")).json(&push);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        assert_eq!(r.send().await.unwrap().status(), 401);
        let r = admin.post(server.admin_url("/v1/admin/policy/rollback"));
        assert_eq!(r.send().await.unwrap().status(), 401);
    }
    let list = admin
        .get(server.admin_url("/v1/admin/policy"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), 200);
    let list: Value = list.json().await.unwrap();
    assert_eq!(
        list["versions"].as_array().unwrap().len(),
        1,
        "nothing was pushed"
    );
    // The CLI reads the token like the server: a padded environment value is the same token,
    // an empty one is none.
    let cli = |token: &str| {
        Command::new(binary())
            .args(["policy", "list", "--admin", &server.admin_url("")])
            .env("TOLLGATE_ADMIN_TOKEN", token)
            .output()
            .unwrap()
    };
    let padded = cli(" s3cret\n");
    assert!(
        padded.status.success(),
        "{}",
        String::from_utf8_lossy(&padded.stderr)
    );
    // Refused, and said so: `policy list` once printed nothing and exited 0 on a 401.
    let empty = cli("  ");
    assert!(!empty.status.success());
    assert!(
        String::from_utf8_lossy(&empty.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&empty.stderr)
    );

    // Nor does serve start on a non-loopback admin address without a token, or with an empty
    // token file: it exits with 2 at once (a server that started anyway is killed and fails
    // the test instead of hanging it).
    let config = server.config.to_str().unwrap();
    let refused = |admin_args: &[&str]| {
        let mut args = vec!["--config", config];
        args.extend_from_slice(admin_args);
        support::serve_refused(&args)
    };
    let (code, stderr) = refused(&["--admin-addr", "0.0.0.0:0"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("give a token"), "{stderr}");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let (code, stderr) = refused(&[
        "--admin-addr",
        "127.0.0.1:0",
        "--admin-token-file",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("is empty"), "{stderr}");
    // A token no Bearer header can carry would lock every client out: refused at start too.
    for (name, text) in [("accented", "p\u{e4}ss\n"), ("two_lines", "line1\nline2\n")] {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        let (code, stderr) = refused(&[
            "--admin-addr",
            "127.0.0.1:0",
            "--admin-token-file",
            file.to_str().unwrap(),
        ]);
        assert_eq!(code, Some(2), "{name}");
        assert!(stderr.contains("visible ASCII only"), "{name}: {stderr}");
    }
}

/// With a token, a request without it gets `401` on any path, routed or not: an unknown path
/// answered `404` and a known one asked with another method `405` before the token was
/// checked, which mapped the API for anyone. With the token, those answers are as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_is_checked_before_routing() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let server = Server::start_with_args(V1, &["--admin-token-file", token_file.to_str().unwrap()]);
    let requests = [
        ("GET", "/nope", 404),
        ("GET", "/v1/admin/nope", 404),
        ("GET", "/v1/admin/dashboard/snapshot", 200),
        ("GET", "/v1/admin/dashboard/nope", 404),
        ("POST", "/v1/admin/policy/7/extra", 404),
        ("DELETE", "/v1/admin/policy/rollback", 405),
        ("PUT", "/v1/admin/policy", 405),
        ("GET", "/v1/admin/policy", 200),
    ];
    for (method, path, authorized) in requests {
        for token in [None, Some("wrong")] {
            let (status, answer, _) = server.admin_raw(method, path, "", token);
            assert_eq!(status, 401, "{method} {path} with {token:?}: {answer}");
            assert!(answer.contains("missing or wrong admin token"), "{answer}");
        }
        let (status, answer, _) = server.admin_raw(method, path, "", Some("s3cret"));
        assert_eq!(status, authorized, "{method} {path}: {answer}");
    }
    // The one exception: the dashboard's page, which holds no data (its script asks the
    // snapshot above for it, with the token).
    let (status, page, _) = server.admin_raw("GET", "/", "", None);
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("<title>tollgate</title>"), "{page}");
}

/// Requests refused for their token are logged at warn with the client, method and path, never
/// the token, and at most once a second: the next line counts those left out, so the lines
/// account for every refusal. They were not logged at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_admin_requests_are_logged_at_most_once_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let server = Server::start_logged(V1, &["--admin-token-file", token_file.to_str().unwrap()]);
    let began = tokio::time::Instant::now();
    let (status, _, first) = server.admin_raw("GET", "/v1/admin/probe/0?token=hunter2", "", None);
    assert_eq!(status, 401);
    const FLOOD: u64 = 200;
    for i in 1..FLOOD {
        let token = (i % 2 == 0).then_some("hunter2-wrong");
        let (status, _, _) = server.admin_raw("POST", &format!("/v1/admin/probe/{i}"), "", token);
        assert_eq!(status, 401);
    }
    let flooded_for = began.elapsed();
    let lines_at_most = flooded_for.as_secs() + 1;
    // A second later, one more: logged, with the count of those before it left out.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, _, last) = server.admin_raw("DELETE", "/v1/admin/policy", "", Some("wrong"));
    assert_eq!(status, 401);

    let log = server.log();
    assert!(
        !log.contains("hunter2"),
        "the token is never logged:\n{log}"
    );
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Admin request refused"))
        .collect();
    assert!(
        (2..=lines_at_most + 1).contains(&(lines.len() as u64)),
        "{} lines for {FLOOD} refusals in {flooded_for:?}, then one:\n{log}",
        lines.len()
    );
    assert!(lines[0].contains(&format!("client={first}")), "{log}");
    assert!(
        lines[0].contains(r#"method=GET path="/v1/admin/probe/0" suppressed=0"#),
        "{log}"
    );
    let last_line = lines[lines.len() - 1];
    assert!(last_line.contains(&format!("client={last}")), "{log}");
    assert!(
        last_line.contains(r#"method=DELETE path="/v1/admin/policy""#),
        "{log}"
    );
    let suppressed: u64 = lines
        .iter()
        .map(|l| {
            let count = l.split("suppressed=").nth(1).unwrap();
            count
                .split_whitespace()
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(lines.len() as u64 + suppressed, FLOOD + 1, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_throttled_keys_and_the_metrics_families() {
    let server = Server::start(V1);
    for (user, tries) in [("noisy", 12), ("mild", 7), ("quiet", 5)] {
        for _ in 0..tries {
            server.check("user", user).await;
        }
    }
    let out = Command::new(binary())
        .args([
            "top",
            "--domain",
            "api",
            "--rule",
            "per_user",
            "--admin",
            &server.admin_url(""),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        ["         7  user=noisy", "         2  user=mild"],
        "{stdout}"
    );
    let out = Command::new(binary())
        .args([
            "top",
            "--domain",
            "api",
            "--rule",
            "nope",
            "--admin",
            &server.admin_url(""),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());

    let text = server.metrics().await;
    for expected in [
        r#"tollgate_decisions_total{domain="api",rule="per_user",outcome="denied"} 9"#,
        r#"tollgate_decision_duration_seconds_count 24"#,
        r#"tollgate_store_operation_duration_seconds_count{store="memory",op="apply"} 24"#,
        r#"tollgate_degraded_decisions_total{domain="api",rule="per_user",posture="open"} 0"#,
        r#"tollgate_policy_reloads_total{result="rejected"} 0"#,
        "tollgate_store_keys{store=\"memory\"} 3",
    ] {
        assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
    }
    assert!(
        !text.contains("noisy"),
        "client values never become metric labels"
    );
}

/// A malformed path segment or query string gets the admin API's usual error: `400` with a JSON
/// `error` naming the problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_admin_paths_and_queries_answer_json_errors() {
    let server = Server::start(V1);
    for path in [
        "/v1/admin/policy/latest",
        "/v1/admin/policy/diff?from=one",
        "/v1/admin/top?domain=api&rule=per_user&n=ten",
    ] {
        let r = reqwest::get(server.admin_url(path)).await.unwrap();
        assert_eq!(r.status(), 400, "{path}");
        let body: Value = r.json().await.unwrap();
        assert!(
            !body["error"].as_str().unwrap().is_empty(),
            "{path}: {body}"
        );
    }
    let r = reqwest::Client::new()
        .delete(server.admin_url("/v1/admin/overrides/x"))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"].is_string(), "{body}");
}

/// A push's source names tell its files apart in errors, listings, diffs and log lines: an
/// empty or a repeated one, or one with a control character (a newline would forge a log
/// line), is refused, and nothing is activated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_with_unusable_source_names_is_refused() {
    let server = Server::start(V1);
    let admin = reqwest::Client::new();
    let source = |name: &str, domain: &str| json!({"name": name, "text": format!("domain: {domain}\ndescriptors: []\n")});
    for (sources, why) in [
        (
            json!([source("a.yaml", "q"), source("a.yaml", "r")]),
            "two sources are named `a.yaml`",
        ),
        (json!([source(" ", "q")]), "source 0 has an empty name"),
        (
            json!([source("a.yaml", "q"), source("b\nINFO forged: line", "r")]),
            "holds a control character",
        ),
    ] {
        let push = admin.post(server.admin_url("/v1/admin/policy"));
        refused(push.json(&json!({ "sources": sources })), why).await;
    }
    let list = server.admin_json("/v1/admin/policy").await;
    assert_eq!(list["versions"].as_array().unwrap().len(), 1, "{list}");
}

/// A pushed policy may be as large as a policy file `serve` reads (16 MiB): one of 2 MiB (a
/// long comment here) is activated, where the admin API used to refuse anything over 1 MiB.
/// The CLI refuses a larger file as `serve` would, and a body past the admin API's 32 MiB gets
/// `413`; neither activates anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_policy_can_be_pushed_up_to_the_admin_limit() {
    let server = Server::start(V1);
    let dir = tempfile::tempdir().unwrap();
    let large = dir.path().join("large.yaml");
    let padded = |bytes: usize| format!("# {}\n{}", "x".repeat(bytes), V1.replace("5}", "6}"));
    std::fs::write(&large, padded(2 << 20)).unwrap();
    let (code, out, err) = server.policy_cli(&["push", large.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        remaining(&server, "user", "big").await,
        5,
        "the pushed limit of 6 applies"
    );

    std::fs::write(&large, padded(17 << 20)).unwrap();
    let (code, out, err) = server.policy_cli(&["push", large.to_str().unwrap()]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("larger than 16 MiB"), "{err}");
    // One byte over the admin API's limit: the server reads all of it before answering, so
    // no unread tail resets the connection under the client still writing it.
    let limit = tollgate_server::admin::MAX_BODY;
    let huge = |pad: usize| json!({"sources": [{"name": "huge.yaml", "text": padded(pad)}]});
    let pad = limit + 1 - huge(0).to_string().len();
    let body = huge(pad).to_string();
    assert_eq!(body.len(), limit + 1);
    let answer = reqwest::Client::new()
        .post(server.admin_url("/v1/admin/policy"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("answered, the whole body read");
    assert_eq!(answer.status(), 413);
    // A source over 16 MiB inside a body the admin API takes is refused like the file.
    let body = json!({"sources": [{"name": "big.yaml", "text": padded(17 << 20)}]});
    let answer = server
        .admin_send(reqwest::Method::POST, "/v1/admin/policy", &body)
        .await;
    assert_eq!(answer.status(), 400);
    let error = answer.text().await.unwrap();
    assert!(error.contains("larger than 16 MiB"), "{error}");
    let list = server.admin_json("/v1/admin/policy").await;
    assert_eq!(list["versions"].as_array().unwrap().len(), 2, "{list}");
}

/// Lifting a stricter override from a GCRA rule (1 a day on a rule of 10 a minute) leaves a
/// key that used its day with the rule's 10 less the one it used, not the rest of the day to
/// wait: a changed limit keeps the key's units used, and the rule meters them at its own rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifting_a_stricter_gcra_override_does_not_keep_its_wait() {
    let server = Server::start(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {name: paced, algorithm: gcra, unit: minute, requests_per_unit: 10}\n",
    );
    let admin = reqwest::Client::new();
    let set = json!({"domain": "api", "rule": "paced", "entries": [{"key": "user", "value": "ann"}],
                     "requests_per_unit": 1, "period": "1d"});
    let r = admin
        .put(server.admin_url("/v1/admin/overrides"))
        .json(&set)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let id = r.json::<Value>().await.unwrap()["id"].as_u64().unwrap();
    let retry_ms = async || {
        let r = server.check("user", "ann").await;
        let body: Value = r.json().await.unwrap();
        body["retry_after_ms"].as_u64()
    };
    assert_eq!(retry_ms().await, None, "the day's one request");
    assert!(retry_ms().await.unwrap() > 86_000_000, "then a day's wait");

    let r = admin
        .delete(server.admin_url(&format!("/v1/admin/overrides/{id}")))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    for i in 0..9 {
        assert_eq!(retry_ms().await, None, "request {i} of the 9 left");
    }
    let wait = retry_ms().await.expect("the minute's 10 used");
    assert!(wait <= 6_000, "{wait} ms");
}
