//! The HTTP API over a real socket against the built binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Server, header};

const POLICY: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: day, requests_per_unit: 3}
  - key: backend
    rate_limit: {name: shaper, algorithm: leaky_bucket, unit: second, requests_per_unit: 2, burst: 4}
  - key: plan
    shadow_mode: true
    rate_limit: {name: candidate, unit: day, requests_per_unit: 1}
"#;

fn check_body(key: &str, value: &str, hits: Option<u64>) -> Value {
    let mut body =
        json!({"domain": "api", "descriptors": [{"entries": [{"key": key, "value": value}]}]});
    if let Some(h) = hits {
        body["hits_addend"] = json!(h);
    }
    body
}

#[tokio::test]
async fn allows_up_to_the_limit_then_answers_429_with_headers() {
    let server = Server::start(POLICY);
    for expected_remaining in ["2", "1", "0"] {
        let r = server
            .post("/v1/check", &check_body("user", "alice", None))
            .await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-limit"), Some("3"));
        assert_eq!(
            header(&r, "x-ratelimit-remaining"),
            Some(expected_remaining)
        );
        assert_eq!(
            header(&r, "ratelimit-policy"),
            Some("\"per_user\";q=3;w=86400")
        );
        assert!(header(&r, "retry-after").is_none());
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["allowed"], true);
        assert_eq!(body["overall_code"], "OK");
        assert_eq!(body["statuses"][0]["limit_name"], "per_user");
    }
    let r = server
        .post("/v1/check", &check_body("user", "alice", None))
        .await;
    assert_eq!(r.status(), 429);
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    let reset: u64 = header(&r, "x-ratelimit-reset").unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry), "retry-after {retry}");
    assert_eq!(retry, reset, "a fixed window clears when it resets");
    let rl = header(&r, "ratelimit").unwrap().to_owned();
    assert_eq!(rl, format!("\"per_user\";r=0;t={reset}"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["allowed"], false);
    assert_eq!(body["overall_code"], "OVER_LIMIT");
    assert_eq!(body["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(body["statuses"][0]["remaining"], 0);
    let retry_ms = body["statuses"][0]["retry_after_ms"].as_u64().unwrap();
    assert!(retry_ms <= retry * 1000 && retry_ms > (retry - 1) * 1000);

    // Another user has a counter of their own.
    let r = server
        .post("/v1/check", &check_body("user", "bob", None))
        .await;
    assert_eq!(r.status(), 200);
}

/// A descriptor's `hits_addend: 0` checks its limit without counting: a 200 while a unit is
/// left, a 429 with `Retry-After` once none is.
#[tokio::test]
async fn a_descriptor_hits_addend_of_zero_checks_without_counting() {
    let server = Server::start(POLICY);
    let check = json!({"domain": "api", "hits_addend": 2, "descriptors": [{"entries": [{"key": "user", "value": "carol"}], "hits_addend": 0}]});
    for _ in 0..2 {
        let r = server.post("/v1/check", &check).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some("3"));
    }
    let r = server
        .post("/v1/check", &check_body("user", "carol", Some(3)))
        .await;
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    let r = server.post("/v1/check", &check).await;
    assert_eq!(r.status(), 429);
    assert!(header(&r, "retry-after").is_some());
}

#[tokio::test]
async fn bad_input_is_a_400_that_names_the_problem_and_counts_nothing() {
    let server = Server::start(POLICY);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{not json".to_vec(), "invalid JSON"),
        (br#"{"domain": "", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}]}"#.to_vec(), "domain must not be empty"),
        (br#"{"domain": "api", "descriptors": [{"entries": [{"key": "", "value": "a"}]}]}"#.to_vec(), "empty key"),
        (br#"{"domain": "api", "descriptors": []}"#.to_vec(), "no descriptors"),
        (br#"{"domain": "api", "descriptors": [{"entries": []}]}"#.to_vec(), "no entries"),
        (br#"{"domain": "api", "hits_addend": 0, "descriptors": [{"entries": [{"key": "user", "value": "a"}]}]}"#.to_vec(), "at least 1"),
        (br#"{"domain": "api", "hits_addend": -5, "descriptors": [{"entries": [{"key": "user", "value": "a"}]}]}"#.to_vec(), "invalid value: integer `-5`"),
        (br#"{"domain": "api", "descriptors": [{"hits_addend": 99999999999, "entries": [{"key": "user", "value": "a"}]}]}"#.to_vec(), "above the maximum"),
        (br#"{"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}], "colour": "red"}"#.to_vec(), "unknown field `colour`"),
        // Arrays where objects belong (serde would read them as the fields in order).
        (br#"["api", [[[["user", "a"]]]]]"#.to_vec(), "expected a JSON object"),
        (br#"{"domain": "api", "descriptors": [[[["user", "a"]]]]}"#.to_vec(), "expected a JSON object"),
    ];
    for (body, expected) in cases {
        let r = reqwest::Client::new()
            .post(server.url("/v1/check"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "body {}", String::from_utf8_lossy(&body));
        let answer: Value = r.json().await.unwrap();
        let message = answer["error"].as_str().unwrap();
        assert!(
            message.contains(expected),
            "`{message}` should mention `{expected}`"
        );
    }
    // Nothing was charged: user `a` still has the full quota.
    let r = server
        .post("/v1/check", &check_body("user", "a", None))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
    // Each refusal is counted, and envoyproxy/ratelimit's `/json` counts too.
    let r = server
        .post("/json", &serde_json::json!({"domain": "api"}))
        .await;
    assert_eq!(r.status(), 400);
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("tollgate_invalid_requests_total{transport=\"http\"} 12\n"),
        "{metrics}"
    );
}

/// The errors axum answers itself (a body over the limit, an unknown path, a wrong method) and
/// a compressed body come as JSON too, with their status, like every other error of the API.
#[tokio::test]
async fn every_error_is_json() {
    let server = Server::start(POLICY);
    let client = reqwest::Client::new();
    let huge = vec![b' '; 70 * 1024];
    let valid = serde_json::to_vec(&check_body("user", "zip", None)).unwrap();
    let cases = [
        (client.post(server.url("/v1/check")).body(huge), 413),
        // A valid body, but announced as compressed: refused, not read as something else
        // (also behind an `identity` header).
        (
            client
                .post(server.url("/v1/check"))
                .header("content-encoding", "gzip")
                .body(valid.clone()),
            415,
        ),
        (
            client
                .post(server.url("/v1/check"))
                .header("content-encoding", "identity")
                .header("content-encoding", "gzip")
                .body(valid),
            415,
        ),
        (client.get(server.url("/v1/check")), 405),
        (client.get(server.url("/v2/nothing")), 404),
    ];
    for (request, status) in cases {
        let r = request.send().await.unwrap();
        assert_eq!(r.status(), status);
        let answer: Value = r.json().await.unwrap();
        assert!(
            answer["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{answer}"
        );
    }
    let r = server
        .post("/v1/check", &check_body("user", "zip", None))
        .await;
    assert_eq!(
        header(&r, "x-ratelimit-remaining"),
        Some("2"),
        "the refused request counted nothing"
    );
    // An empty Content-Encoding names no coding: the body is read as it is.
    let r = client
        .post(server.url("/v1/check"))
        .header("content-encoding", "")
        .json(&check_body("user", "zip", None))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("1"));
}

#[tokio::test]
async fn cost_above_capacity_is_a_distinct_denial_without_retry_after() {
    let server = Server::start(POLICY);
    let r = server
        .post("/v1/check", &check_body("user", "carol", Some(4)))
        .await;
    assert_eq!(r.status(), 429);
    assert!(
        header(&r, "retry-after").is_none(),
        "retrying can never help"
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["statuses"][0]["reason"], "cost_exceeds_capacity");
    assert!(body["statuses"][0]["retry_after_ms"].is_null());
    // Nothing was consumed: a cost of 3 still fits.
    let r = server
        .post("/v1/check", &check_body("user", "carol", Some(3)))
        .await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn leaky_bucket_answers_carry_the_shaping_delay() {
    let server = Server::start(POLICY);
    let (mut delays, mut spans) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        let sent = tokio::time::Instant::now();
        let r = server
            .post("/v1/check", &check_body("backend", "reports", None))
            .await;
        spans.push((sent, tokio::time::Instant::now()));
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.unwrap();
        delays.push(body["statuses"][0]["delay_ms"].as_u64().unwrap());
    }
    // Output spaced at 2 per second: each request waits 500 ms more than the one before, less
    // the time that passed between the two decisions. That time lies between the first
    // answer and the second request being sent, and the first being sent and the second
    // answered (a loaded machine only widens the bounds); 1 ms for the rounding of each delay.
    assert_eq!(delays[0], 0);
    for i in 1..delays.len() {
        let step = delays[i] as i64 - delays[i - 1] as i64;
        let ms = |d: std::time::Duration| d.as_millis() as i64;
        let least_between = ms(spans[i].0.saturating_duration_since(spans[i - 1].1));
        let most_between = ms(spans[i].1 - spans[i - 1].0);
        assert!(
            (500 - most_between - 2..=500 - least_between + 2).contains(&step),
            "delays {delays:?}, step {i}: {least_between}..{most_between} ms between"
        );
    }
    let r = server
        .post("/v1/check", &check_body("backend", "reports", None))
        .await;
    assert_eq!(r.status(), 429, "the queue of 4 is full");
}

#[tokio::test]
async fn shadow_rules_count_but_never_deny() {
    let server = Server::start(POLICY);
    for i in 0..3 {
        let r = server
            .post("/v1/check", &check_body("plan", "free", None))
            .await;
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            body["statuses"][0]["shadow_would_deny"]
                .as_bool()
                .unwrap_or(false),
            i > 0
        );
    }
    let metrics = server.metrics().await;
    assert!(
        metrics.contains(r#"tollgate_decisions_total{domain="api",rule="candidate",outcome="shadow_would_deny"} 2"#),
        "{metrics}"
    );
    assert!(metrics.contains(
        r#"tollgate_decisions_total{domain="api",rule="candidate",outcome="allowed"} 1"#
    ));

    // Beside an enforced rule, the shadow rule's exhausted quota is not what the caller is
    // told: the headers describe the enforced rule, with quota left.
    let both = json!({"domain": "api", "descriptors": [
        {"entries": [{"key": "user", "value": "u"}]},
        {"entries": [{"key": "plan", "value": "free"}]},
    ]});
    let r = server.post("/v1/check", &both).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some("\"per_user\";q=3;w=86400")
    );
}

#[tokio::test]
async fn unmatched_descriptors_are_allowed_without_rate_limit_headers() {
    let server = Server::start(POLICY);
    let r = server
        .post("/v1/check", &check_body("nothing", "here", None))
        .await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "x-ratelimit-limit").is_none());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["statuses"][0]["code"], "OK");
    assert!(body["statuses"][0].get("limit_name").is_none());
}

#[tokio::test]
async fn envoy_json_endpoint_speaks_proto3_json() {
    let server = Server::start(POLICY);
    let body = json!({
        "domain": "api",
        "descriptors": [
            {"entries": [{"key": "user", "value": "dave"}], "hitsAddend": "2"},
            {"entries": [{"key": "nothing", "value": "x"}]}
        ]
    });
    let r = server.post("/json", &body).await;
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["overallCode"], "OK");
    assert_eq!(answer["statuses"][0]["currentLimit"]["name"], "per_user");
    assert_eq!(answer["statuses"][0]["currentLimit"]["unit"], "DAY");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 1);
    assert!(
        answer["statuses"][0]["durationUntilReset"]
            .as_str()
            .unwrap()
            .ends_with('s')
    );
    assert!(answer["statuses"][1].get("currentLimit").is_none());
    for _ in 0..2 {
        let check = json!({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "dave"}], "hitsAddend": 0}]});
        let answer: Value = server.post("/json", &check).await.json().await.unwrap();
        assert_eq!(answer["overallCode"], "OK");
        assert_eq!(
            answer["statuses"][0]["limitRemaining"], 1,
            "a check counts nothing"
        );
    }
    let r = server.post("/json", &json!({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "dave"}], "hits_addend": 2}]})).await;
    assert_eq!(r.status(), 429);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["overallCode"], "OVER_LIMIT");
    let r = server.post("/json", &json!({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "x"}], "bogus": 1}]})).await;
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let server = Server::start(POLICY);
    let r = reqwest::get(server.url("/healthz")).await.unwrap();
    assert_eq!(r.status(), 200);
    let r = reqwest::get(server.url("/readyz")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("3 rules"));
    // envoyproxy/ratelimit's path, for probes carried over from it, answered as it answers.
    let r = reqwest::get(server.url("/healthcheck")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "OK");
    server
        .post("/v1/check", &check_body("user", "erin", None))
        .await;
    let metrics = server.metrics().await;
    assert!(
        metrics.contains(
            r#"tollgate_decisions_total{domain="api",rule="per_user",outcome="allowed"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"tollgate_decisions_total{domain="api",rule="per_user",outcome="denied"} 0"#
        )
    );
    assert!(
        metrics.contains("tollgate_store_keys{store=\"memory\"} 1"),
        "{metrics}"
    );
    // On the memory store, without gRPC TLS: no hot keys, no policy sync, no TLS files.
    assert_eq!(
        support::supervised_tasks(&metrics),
        ["counter_sweep", "dashboard_sampler", "policy_watcher"],
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "# TYPE tollgate_background_task_restarts_total counter\n\
             tollgate_background_task_restarts_total{task=\"counter_sweep\"} 0\n\
             tollgate_background_task_restarts_total{task=\"dashboard_sampler\"} 0\n\
             tollgate_background_task_restarts_total{task=\"policy_watcher\"} 0\n"
        ),
        "{metrics}"
    );
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let server = Server::start(POLICY);
    let status = server.stop();
    assert!(status.success(), "exit status {status:?}");
}

/// An HTTP connection waits `--http-read-timeout` for a request's headers, counted from when it
/// opened or its previous answer went out, then for its body: a client that sends nothing,
/// half its headers, or keeps a connection idle is disconnected, one that sends half a body
/// gets 408 (and counts nothing), on the API and the admin listener alike. With the default
/// (60 s) the same silent client is kept.
#[test]
fn slow_or_idle_http_clients_are_disconnected_after_the_read_timeout() {
    use support::{closed_within, read_until_closed, silent_client};
    let within = Duration::from_secs(5);
    let server = Server::start_with_args(POLICY, &["--http-read-timeout", "500ms"]);
    assert!(closed_within(&mut silent_client(server.http, b""), within));
    assert!(closed_within(&mut silent_client(server.admin, b""), within));
    let half_head = b"POST /v1/check HTTP/1.1\r\nHost: tollgate\r\n";
    assert!(closed_within(
        &mut silent_client(server.http, half_head),
        within
    ));

    let body = check_body("user", "slow", None).to_string();
    let head = format!(
        "POST /v1/check HTTP/1.1\r\nHost: tollgate\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let half_body = format!("{head}{}", &body[..body.len() / 2]);
    let answer = read_until_closed(
        &mut silent_client(server.http, half_body.as_bytes()),
        within,
    )
    .expect("closed after its 408");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("connection: close\r\n"), "{answer}");

    // Answered, then closed once idle: and the 408 before it counted nothing.
    let whole = format!("{head}{body}");
    let answer = read_until_closed(&mut silent_client(server.http, whole.as_bytes()), within)
        .expect("an idle keep-alive connection is closed");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("x-ratelimit-remaining: 2\r\n"), "{answer}");

    let patient = Server::start(POLICY);
    let mut silent = silent_client(patient.http, b"");
    assert!(!closed_within(&mut silent, Duration::from_millis(1500)));
}

/// A body announced larger than the endpoint accepts, by a client that waits for `100
/// Continue` before sending it (curl, for large bodies), is refused with `413` as soon as the
/// headers are in, not after waiting `--http-read-timeout` for bytes that are never sent; a
/// transfer coding other than chunked gets `501`. Both close the connection, since the body is
/// left unread, and charge nothing. The admin API's limit is its own (2 × the policy file's).
/// (A client that sends a body too large anyway is read up to the limit and answered `413`:
/// `every_error_is_json`, and the admin API's in `e2e_governance`.)
#[tokio::test]
async fn a_body_that_cannot_be_read_is_refused_before_reading_it() {
    use support::{read_until_closed, silent_client};
    let within = Duration::from_secs(5);
    let server = Server::start(POLICY);
    // A loopback `Host`: the admin listener, without a token, takes a write for no other.
    let head = |path: &str, framing: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n{framing}\r\n\r\n"
        )
    };
    let cases = [
        (
            server.http,
            head("/v1/check", "Content-Length: 65537"),
            "413",
            "at most 65536",
        ),
        (
            server.http,
            head("/json", "Content-Length: 99999999999"),
            "413",
            "99999999999 bytes",
        ),
        (
            server.admin,
            head("/v1/admin/policy", "Content-Length: 40000000"),
            "413",
            "40000000 bytes",
        ),
        (
            server.http,
            head("/v1/check", "Transfer-Encoding: gzip, chunked"),
            "501",
            "`gzip`",
        ),
    ];
    for (addr, head, status, says) in cases {
        let answer = read_until_closed(&mut silent_client(addr, head.as_bytes()), within)
            .unwrap_or_else(|| panic!("no answer within {within:?} to {head}"));
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{head}: {answer}"
        );
        assert!(answer.contains("connection: close\r\n"), "{answer}");
        assert!(answer.contains(says), "{head}: `{says}` in {answer}");
    }

    // Within the admin API's limit, a body over the decision API's is read: this one is
    // malformed JSON, so 400.
    let r = reqwest::Client::new()
        .post(server.admin_url("/v1/admin/policy"))
        .header("content-type", "application/json")
        .body(vec![b'x'; 100_000])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = server
        .post("/v1/check", &check_body("user", "a", None))
        .await;
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
}

/// `--memory-max-keys`: past it, a request for a new key takes its failure posture (`open`
/// here: allowed, marked degraded, counted as a store error) while the keys held are decided
/// as before, so a flood of new keys cannot grow the process without end.
#[tokio::test]
async fn a_full_memory_store_answers_new_keys_by_the_posture() {
    let server = Server::start_with_args(POLICY, &["--memory-max-keys", "2"]);
    for user in ["a", "b"] {
        let r = server
            .post("/v1/check", &check_body("user", user, None))
            .await;
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"), "{user}");
    }
    let r = server
        .post("/v1/check", &check_body("user", "c", None))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-tollgate-degraded"), Some("open"));
    let r = server
        .post("/v1/check", &check_body("user", "a", None))
        .await;
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("1"));
    assert_eq!(header(&r, "x-tollgate-degraded"), None);
    // Beside a new key, a held one is still counted, and still denies: a client rotating
    // the value of one descriptor does not lift the limit of another.
    let both = |user: &str| {
        json!({"domain": "api", "descriptors": [
            {"entries": [{"key": "user", "value": "a"}]},
            {"entries": [{"key": "user", "value": user}]}
        ]})
    };
    let r = server.post("/v1/check", &both("y")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-tollgate-degraded"), Some("open"));
    let r = server.post("/v1/check", &both("z")).await;
    assert_eq!(r.status(), 429, "user a has used its 3");
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("tollgate_store_keys{store=\"memory\"} 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_store_errors_total 2\n"),
        "{metrics}"
    );
}

/// `--memory-max-bytes`: a sliding log filled past it sends new keys to their failure posture
/// (`open`), while the keys held go on deciding; once the log expires and is swept its bytes
/// come back (`tollgate_store_bytes` returns to 0) and a new key is counted again.
#[tokio::test]
async fn a_memory_store_past_its_bytes_answers_new_keys_by_the_posture() {
    const LOG: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, algorithm: sliding_window_log, period: 5s, requests_per_unit: 1000}
";
    // A key is counted for 144 bytes, its log 48 more and 16 an entry of its buffer.
    let server = Server::start_with_args(LOG, &["--memory-max-bytes", "600B"]);
    // One entry per request (each at its own instant): past 8 live ones (a buffer of 16, 448
    // bytes) a new key's 192 no longer fit.
    for _ in 0..40 {
        let r = server
            .post("/v1/check", &check_body("user", "a", None))
            .await;
        assert_eq!(header(&r, "x-tollgate-degraded"), None);
    }
    let r = server
        .post("/v1/check", &check_body("user", "b", None))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-tollgate-degraded"), Some("open"));
    let r = server
        .post("/v1/check", &check_body("user", "a", None))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "x-tollgate-degraded"),
        None,
        "a held key decides"
    );
    let metrics = server.metrics().await;
    let bytes = |metrics: &str| -> u64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with("tollgate_store_bytes{store=\"memory\"} "))
            .unwrap_or_else(|| panic!("{metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(bytes(&metrics) + 192 > 600, "{metrics}");
    assert!(
        metrics.contains("tollgate_store_keys{store=\"memory\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_store_errors_total 1\n"),
        "{metrics}"
    );

    support::eventually(Duration::from_secs(15), "the log swept", async || {
        bytes(&server.metrics().await) == 0
    })
    .await;
    let r = server
        .post("/v1/check", &check_body("user", "b", None))
        .await;
    assert_eq!(header(&r, "x-tollgate-degraded"), None);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("999"));
}

/// The `local` posture's store has the same cap: a full store sends new keys to it, and it
/// must not then grow without end. Past its cap, a new key is allowed uncounted, as by `open`;
/// the keys it holds are still counted.
#[tokio::test]
async fn the_local_postures_store_is_capped_too() {
    let args = ["--memory-max-keys", "2", "--on-store-error", "local"];
    let server = Server::start_with_args(POLICY, &args);
    let check = |user: &'static str| {
        let body = check_body("user", user, None);
        let server = &server;
        async move { server.post("/v1/check", &body).await }
    };
    for user in ["a", "b"] {
        assert_eq!(header(&check(user).await, "x-tollgate-degraded"), None);
    }
    // Counted locally: 3 a day each.
    for user in ["c", "d"] {
        let r = check(user).await;
        assert_eq!(header(&r, "x-tollgate-degraded"), Some("local"));
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
    }
    // Past the local store's cap: never counted, never denied.
    for _ in 0..4 {
        let r = check("e").await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
    }
    // The held keys still are.
    assert_eq!(
        header(&check("c").await, "x-ratelimit-remaining"),
        Some("1")
    );
    assert_eq!(
        header(&check("c").await, "x-ratelimit-remaining"),
        Some("0")
    );
    assert_eq!(check("c").await.status(), 429);
}

/// On SIGTERM a connection with no request in flight closes at once, even one that sent half
/// a request's headers: it does not hold the shutdown for `--shutdown-timeout`.
#[test]
fn half_a_request_does_not_hold_the_shutdown() {
    let server = Server::start_with_args(POLICY, &["--shutdown-timeout", "30s"]);
    let _half = support::silent_client(server.http, b"POST /v1/check HTTP/1.1\r\nHo");
    let _admin = support::silent_client(server.admin, b"GET /v1/admin/pol");
    std::thread::sleep(Duration::from_millis(200));
    let began = tokio::time::Instant::now();
    let status = server.stop();
    assert!(status.success(), "{status:?}");
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "{:?}",
        began.elapsed()
    );
}

/// A request still in flight when `--shutdown-timeout` runs out is cut, and so is a gRPC caller
/// that never acknowledges the server's goodbye: the process exits 3, not 0 as after a complete
/// drain (see `requests_in_flight_at_sigterm_are_answered`), and its warning says what it cut.
#[test]
fn a_drain_cut_by_the_timeout_exits_3_and_says_what_it_cut() {
    let mut server = Server::start_logged(POLICY, &["--shutdown-timeout", "1s"]);
    // The preface and an empty SETTINGS frame, then nothing; served, not still in the accept
    // queue, once the server's SETTINGS frame came back.
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let mut grpc = support::silent_client(server.grpc, &hello);
    grpc.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::io::Read::read_exact(&mut grpc, &mut [0u8; 9]).unwrap();
    // Headers and half the body: in flight, its body awaited for `--http-read-timeout` (60 s).
    let body = check_body("user", "held", None).to_string();
    let request = format!(
        "POST /v1/check HTTP/1.1\r\nHost: tollgate\r\nContent-Length: {}\r\n\r\n{}",
        body.len(),
        &body[..body.len() / 2]
    );
    let _http = support::silent_client(server.http, request.as_bytes());
    std::thread::sleep(Duration::from_millis(500));
    let began = tokio::time::Instant::now();
    let status = server.terminate();
    let took = began.elapsed();
    assert_eq!(status.code(), Some(3), "{status:?}");
    assert!(
        took >= Duration::from_secs(1),
        "waited the timeout: {took:?}"
    );
    let log = server.log();
    let cut = log
        .lines()
        .find(|line| line.contains("Shutdown drain cut"))
        .unwrap_or_else(|| panic!("no warning of the cut in {log}"));
    for says in [
        "WARN",
        "connections=2 ",
        "http_connections=1 ",
        "http_requests=1 ",
        "admin_connections=0 ",
        "grpc_connections=1 ",
        "exit_code=3",
    ] {
        assert!(cut.contains(says), "`{says}` in {cut}");
    }
}

/// An HTTP/2 (prior knowledge) connection left idle past `--http-read-timeout` is closed with
/// a GOAWAY without error, not a bare close: the client learns that nothing it sent was left
/// unprocessed.
#[test]
fn an_idle_http2_connection_gets_a_goaway_before_it_closes() {
    let server = Server::start_with_args(POLICY, &["--http-read-timeout", "1s"]);
    let began = tokio::time::Instant::now();
    // The preface and an empty SETTINGS frame, then nothing.
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let mut client = support::silent_client(server.http, &hello);
    let received = support::read_bytes_until_closed(&mut client, Duration::from_secs(5))
        .expect("closed once idle");
    assert!(
        began.elapsed() >= Duration::from_secs(1),
        "{:?}",
        began.elapsed()
    );
    // Frames: a 24-bit length, a type, flags, a stream id, the payload.
    let mut goaways = Vec::new();
    let mut rest = received.as_slice();
    while let [a, b, c, kind, _, _, _, _, _, tail @ ..] = rest {
        let length = usize::from(*a) << 16 | usize::from(*b) << 8 | usize::from(*c);
        let (payload, after) = tail.split_at(length.min(tail.len()));
        if *kind == 7 {
            goaways.push(u32::from_be_bytes(payload[4..8].try_into().unwrap()));
        }
        rest = after;
    }
    assert!(rest.is_empty(), "a truncated frame in {received:?}");
    assert!(!goaways.is_empty(), "no GOAWAY in {received:?}");
    assert!(
        goaways.iter().all(|&code| code == 0),
        "error codes {goaways:?}"
    );
}

/// Every listener asks the kernel for a deep accept queue (4096, capped by
/// `net.core.somaxconn`): with std's 128, a few hundred clients connecting at once overflowed
/// it, and a client whose SYN was dropped waited a second to try again. Here the server is
/// stopped (SIGSTOP) so that it accepts nothing, and 300 connections must still complete.
#[test]
fn three_hundred_clients_connect_at_once_while_the_server_accepts_nothing() {
    // The kernel caps every backlog at somaxconn (4096 by default since Linux 5.4).
    let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let clients = somaxconn.min(300);
    let server = Server::start(POLICY);
    server.signal("STOP");
    let connected: Vec<_> = (0..clients)
        .map(|_| std::net::TcpStream::connect_timeout(&server.http, Duration::from_millis(500)))
        .collect();
    server.signal("CONT");
    let failed = connected.iter().filter(|c| c.is_err()).count();
    assert_eq!(failed, 0, "{failed} of {clients} connections timed out");
}

/// A request body for the HTTP/2 tests: any stream of chunks, boxed.
type H2Body = http_body_util::combinators::BoxBody<hyper::body::Bytes, std::convert::Infallible>;

/// An HTTP/2 (prior knowledge) connection to `addr`, driven in the background.
async fn h2_connection(
    addr: std::net::SocketAddr,
) -> hyper::client::conn::http2::SendRequest<H2Body> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    sender
}

/// A `POST /v1/check` to `addr` of `length` bytes whose body is `chunks`.
fn h2_check(
    addr: std::net::SocketAddr,
    length: usize,
    chunks: impl futures_util::Stream<Item = hyper::body::Bytes> + Send + Sync + 'static,
) -> http::Request<H2Body> {
    use futures_util::StreamExt;
    use http_body_util::{BodyExt, StreamBody};
    let frames = chunks.map(|chunk| Ok(hyper::body::Frame::data(chunk)));
    http::Request::post(format!("http://{addr}/v1/check"))
        .header("content-length", length)
        .body(BodyExt::boxed(StreamBody::new(frames)))
        .unwrap()
}

/// Five bytes of an 80-byte body, then nothing.
fn stalling_check(addr: std::net::SocketAddr) -> http::Request<H2Body> {
    use futures_util::StreamExt;
    let first = futures_util::stream::once(async { hyper::body::Bytes::from_static(b"{\"dom") });
    h2_check(addr, 80, first.chain(futures_util::stream::pending()))
}

/// Over HTTP/2 (prior knowledge) a stream whose body stalls gets 408 once the read timeout
/// has passed since its headers, while other streams keep the connection busy, and alone.
#[tokio::test]
async fn a_stalled_http2_stream_gets_408_while_others_are_answered() {
    use http_body_util::{BodyExt, Empty};
    let server = Server::start_with_args(POLICY, &["--http-read-timeout", "1s"]);
    let mut sender = h2_connection(server.http).await;
    let began = tokio::time::Instant::now();
    let stalled = tokio::spawn(sender.send_request(stalling_check(server.http)));
    while !stalled.is_finished() && began.elapsed() < Duration::from_secs(5) {
        let health = http::Request::get(format!("http://{}/healthz", server.http))
            .body(Empty::new().map_err(|never| match never {}).boxed())
            .unwrap();
        let answer = sender.send_request(health).await.unwrap();
        assert_eq!(answer.status(), 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let answer = tokio::time::timeout(Duration::from_secs(5), stalled)
        .await
        .expect("answered")
        .unwrap()
        .unwrap();
    assert_eq!(answer.status(), 408, "after {:?}", began.elapsed());
    assert!(began.elapsed() >= Duration::from_secs(1));

    // Alone on its connection too: its 408 goes out before the idle connection closes.
    let mut sender = h2_connection(server.http).await;
    let alone = sender.send_request(stalling_check(server.http));
    let answer = tokio::time::timeout(Duration::from_secs(5), alone)
        .await
        .expect("answered")
        .unwrap();
    assert_eq!(answer.status(), 408);
}

/// A request in flight when SIGTERM comes is answered, over HTTP/1 and HTTP/2 alike: its body
/// finishes arriving after the signal, and the answer still goes out before the connection
/// closes.
#[tokio::test]
async fn requests_in_flight_at_sigterm_are_answered() {
    use http_body_util::BodyExt;
    use hyper::body::Bytes;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start(POLICY);
    let body = check_body("user", "in-flight", None).to_string();
    let (first, rest) = body.split_at(body.len() / 2);

    let mut h1 = tokio::net::TcpStream::connect(server.http).await.unwrap();
    let head = format!(
        "POST /v1/check HTTP/1.1\r\nHost: tollgate\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    h1.write_all(format!("{head}{first}").as_bytes())
        .await
        .unwrap();

    let mut sender = h2_connection(server.http).await;
    let (chunks, received) = tokio::sync::mpsc::channel::<Bytes>(2);
    let streamed = futures_util::stream::unfold(received, async |mut received| {
        let chunk = received.recv().await?;
        Some((chunk, received))
    });
    let request = h2_check(server.http, body.len(), Box::pin(streamed));
    let h2 = tokio::spawn(sender.send_request(request));
    chunks.send(Bytes::from(first.to_owned())).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    server.begin_shutdown().await;
    h1.write_all(rest.as_bytes()).await.unwrap();
    chunks.send(Bytes::from(rest.to_owned())).await.unwrap();
    drop(chunks);

    let within = Duration::from_secs(5);
    let mut answer = String::new();
    tokio::time::timeout(within, h1.read_to_string(&mut answer))
        .await
        .expect("the HTTP/1 answer")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let answer = tokio::time::timeout(within, h2)
        .await
        .expect("the HTTP/2 answer")
        .unwrap()
        .unwrap();
    assert_eq!(answer.status(), 200);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    let decided: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(decided["allowed"], true, "{decided}");
    // Both answered: the drain completes, status 0.
    let status = server.exited();
    assert!(status.success(), "{status:?}");
}

/// `requests_per_unit: 0` blocks a value outright, as in envoyproxy/ratelimit: a `429` with
/// reason `blocked` and a `Retry-After` reaching the end of the unit (upstream's
/// `duration_until_reset`), every time.
#[tokio::test]
async fn a_rule_of_zero_answers_429_blocked_until_the_unit_ends() {
    let server = Server::start(
        "domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: minute, requests_per_unit: 0}
",
    );
    for _ in 0..2 {
        let r = server
            .post("/v1/check", &check_body("remote_address", "50.0.0.5", None))
            .await;
        assert_eq!(r.status(), 429);
        let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry), "{retry}");
        let body: Value = r.json().await.unwrap();
        let status = &body["statuses"][0];
        assert_eq!(status["reason"], "blocked", "{body}");
        assert_eq!(status["limit"], 0, "{body}");
        let retry_ms = status["retry_after_ms"].as_u64().unwrap();
        assert_eq!(retry_ms, status["reset_after_ms"].as_u64().unwrap());
        assert!(
            retry_ms <= 60_000 && retry_ms.div_ceil(1000) >= retry - 1,
            "{body}"
        );
    }
    let r = server
        .post("/v1/check", &check_body("remote_address", "50.0.0.6", None))
        .await;
    assert_eq!(r.status(), 200);
}

/// `/json` answers with the same fields as RLS, as envoyproxy/ratelimit's: an unnamed rule's
/// `currentLimit.name` empty, `durationUntilReset` whole seconds, and an unlimited rule's
/// `limitRemaining` 4294967295 without a current limit.
#[tokio::test]
async fn envoy_json_answers_names_resets_and_unlimited_as_upstream() {
    let server = Server::start(
        "domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: free
    rate_limit: {unlimited: true}
",
    );
    let body = json!({
        "domain": "api",
        "descriptors": [
            {"entries": [{"key": "user", "value": "u"}]},
            {"entries": [{"key": "free", "value": "f"}]},
            {"entries": [{"key": "nothing", "value": "x"}]}
        ]
    });
    let answer: Value = server.post("/json", &body).await.json().await.unwrap();
    let statuses = &answer["statuses"];
    assert_eq!(statuses[0]["currentLimit"]["name"], "", "{answer}");
    let reset = statuses[0]["durationUntilReset"].as_str().unwrap();
    let seconds: u64 = reset.strip_suffix('s').unwrap().parse().unwrap();
    assert!((1..=60).contains(&seconds), "{reset}");
    assert_eq!(statuses[1]["code"], "OK");
    assert_eq!(statuses[1]["limitRemaining"], 4_294_967_295_u64, "{answer}");
    assert!(statuses[1].get("currentLimit").is_none());
    assert!(statuses[2].get("limitRemaining").is_none(), "{answer}");
}
