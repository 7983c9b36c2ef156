//! The binary on shared Redis state: several replicas, one quota.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::{Server, descriptor};
use tollgate_core::Algorithm;
use tollgate_testkit::{FaultProxy, Mode, RedisCluster, RedisServer};

fn race_policy() -> String {
    let mut policy = String::from("domain: race\ndescriptors:\n");
    for algorithm in Algorithm::ALL {
        policy.push_str(&format!(
            "  - key: {algorithm}\n    rate_limit: {{algorithm: {algorithm}, unit: day, requests_per_unit: 100}}\n"
        ));
    }
    policy
}

fn replicas(store: &str, count: usize) -> Vec<Server> {
    let policy = race_policy();
    (0..count)
        .map(|_| Server::start_with_args(&policy, &["--store", store, "--store-timeout", "2s"]))
        .collect()
}

/// 64 concurrent callers spread over the replicas, 4 requests each, on one key per algorithm
/// with a limit of 100: exactly 100 are admitted.
async fn exactly_the_limit_across(servers: &[Server], key_value: &str) {
    for algorithm in Algorithm::ALL {
        let allowed = Arc::new(AtomicU64::new(0));
        let mut callers = Vec::new();
        for caller in 0..64 {
            let mut client = servers[caller % servers.len()].grpc_client().await;
            let allowed = allowed.clone();
            let value = key_value.to_owned();
            callers.push(tokio::spawn(async move {
                for _ in 0..4 {
                    let req = RateLimitRequest {
                        domain: "race".into(),
                        descriptors: vec![descriptor(&[(algorithm.name(), &value)])],
                        hits_addend: 1,
                    };
                    let r = client
                        .should_rate_limit(req)
                        .await
                        .expect("decided")
                        .into_inner();
                    if r.overall_code == Code::Ok as i32 {
                        allowed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        for c in callers {
            c.await.unwrap();
        }
        assert_eq!(
            allowed.load(Ordering::SeqCst),
            100,
            "{algorithm}: 256 requests over {} replicas",
            servers.len()
        );
    }
}

/// `count` replicas on one Redis that check for shared policy and overrides every 100 ms.
fn syncing_replicas(redis: &RedisServer, policy: &str, count: usize) -> Vec<Server> {
    let url = redis.url();
    let args = [
        "--store",
        &url,
        "--store-timeout",
        "2s",
        "--policy-sync-interval",
        "100ms",
    ];
    (0..count)
        .map(|_| Server::start_with_args(policy, &args))
        .collect()
}

fn keys_without_ttl(cli: impl Fn(&[&str]) -> String) -> Vec<String> {
    cli(&["--scan"])
        .lines()
        .filter(|k| !k.is_empty())
        .filter(|k| cli(&["PTTL", k]).trim() == "-1")
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let servers = replicas(&redis.url(), 3);
    exactly_the_limit_across(&servers, "hot").await;
    assert!(
        keys_without_ttl(|args| redis.cli(args)).is_empty(),
        "every key has a TTL"
    );
    assert!(
        !redis.cli(&["--scan"]).trim().is_empty(),
        "the counters live in Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_a_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start(3, 1);
    let servers = replicas(&cluster.store_url(), 3);
    exactly_the_limit_across(&servers, "hot").await;
    for port in cluster.primary_ports() {
        assert!(
            keys_without_ttl(|args| cluster.cli(port, args)).is_empty(),
            "node {port}"
        );
    }
    let ready = reqwest::get(servers[0].url("/readyz")).await.unwrap();
    let text = ready.text().await.unwrap();
    assert!(text.contains("store: redis cluster, "), "{text}");
    // The slot map's upkeep too is supervised; a cluster does not batch decisions.
    assert_eq!(
        support::supervised_tasks(&servers[0].metrics().await),
        [
            "counter_sweep",
            "dashboard_sampler",
            "hot_key_sweep",
            "policy_sync",
            "policy_watcher",
            "redis_cluster_upkeep"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_is_reloaded_without_a_failed_decision() {
    let redis = RedisServer::start();
    let servers = replicas(&redis.url(), 1);
    let mut client = servers[0].grpc_client().await;
    let req = || RateLimitRequest {
        domain: "race".into(),
        descriptors: vec![descriptor(&[("gcra", "flush")])],
        hits_addend: 1,
    };
    for round in 0..3 {
        let r = client
            .should_rate_limit(req())
            .await
            .expect("decided before the flush");
        assert_eq!(r.get_ref().statuses[0].limit_remaining, 99 - 2 * round);
        assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
        let r = client
            .should_rate_limit(req())
            .await
            .expect("NOSCRIPT is absorbed");
        assert_eq!(r.get_ref().statuses[0].limit_remaining, 98 - 2 * round);
    }
    // On a single Redis, the decisions' batcher is supervised beside `serve`'s own tasks.
    assert_eq!(
        support::supervised_tasks(&servers[0].metrics().await),
        [
            "counter_sweep",
            "dashboard_sampler",
            "hot_key_sweep",
            "policy_sync",
            "policy_watcher",
            "redis_batcher"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_redis_is_reconnected_and_its_scripts_reloaded() {
    let redis = RedisServer::start();
    let servers = replicas(&redis.url(), 1);
    let mut client = servers[0].grpc_client().await;
    let req = || RateLimitRequest {
        domain: "race".into(),
        descriptors: vec![descriptor(&[("token_bucket", "restart")])],
        hits_addend: 1,
    };
    client.should_rate_limit(req()).await.expect("decided");
    redis.restart();
    // While Redis is away the `open` posture answers; once it is back, Redis decides again.
    let degraded = |r: &tonic::Response<_>| r.metadata().get("x-tollgate-degraded").is_some();
    let mut attempts = 0;
    loop {
        let r = client
            .should_rate_limit(req())
            .await
            .expect("always answered");
        if !degraded(&r) {
            // Data did not survive the restart (no persistence): a fresh bucket.
            assert_eq!(r.get_ref().statuses[0].limit_remaining, 99);
            break;
        }
        attempts += 1;
        assert!(attempts < 50, "Redis not deciding again within 5 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..20 {
        let r = client.should_rate_limit(req()).await.expect("decided");
        assert!(
            !degraded(&r),
            "every decision after reconnecting is Redis's"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_value_at_our_key_takes_the_posture_for_that_request_only() {
    let redis = RedisServer::start();
    let servers = replicas(&redis.url(), 1);
    let mut client = servers[0].grpc_client().await;
    let req = |value: &str| RateLimitRequest {
        domain: "race".into(),
        descriptors: vec![descriptor(&[("gcra", value)])],
        hits_addend: 1,
    };
    client
        .should_rate_limit(req("victim"))
        .await
        .expect("decided");
    let keys = redis.cli(&["--scan"]);
    let key = keys
        .lines()
        .find(|k| k.contains("victim"))
        .expect("the counter key")
        .to_owned();
    assert_eq!(redis.cli(&["SET", &key, "hand-written"]), "OK");
    // The default posture (`open`) answers for that counter, and says so.
    let r = client
        .should_rate_limit(req("victim"))
        .await
        .expect("answered by the posture");
    let posture = r
        .metadata()
        .get("x-tollgate-degraded")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(posture.as_deref(), Some("open"));
    assert_eq!(r.get_ref().overall_code, Code::Ok as i32);
    assert_eq!(
        redis.cli(&["GET", &key]),
        "hand-written",
        "the foreign value is left alone"
    );
    let other = client
        .should_rate_limit(req("bystander"))
        .await
        .expect("other keys still work");
    assert_eq!(other.get_ref().statuses[0].limit_remaining, 99);
    assert!(
        other.metadata().get("x-tollgate-degraded").is_none(),
        "decided by Redis"
    );
}

/// Started while Redis is down: the service serves from the start, with the postures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_with_redis_down_the_postures_answer_over_http() {
    // A Redis address that resets every connection. (A port bound and let go could be taken
    // by a Redis another test starts meanwhile, which then answered.)
    let nowhere = FaultProxy::start("127.0.0.1:9".parse().unwrap());
    nowhere.set_mode(Mode::Reset);
    let store = nowhere.url();
    let policy = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 5}\n  - key: soft\n    rate_limit: {unit: day, requests_per_unit: 5, on_store_error: open}\n  - key: shared\n    rate_limit: {name: shared, unit: hour, requests_per_unit: 4, on_store_error: local, local_share: 0.5}\n  - key: trial\n    rate_limit: {name: trial, unit: hour, requests_per_unit: 4, mode: shadow}\n";
    let server = Server::start_with_args(
        policy,
        &[
            "--store",
            &store,
            "--store-connect-timeout",
            "200ms",
            "--on-store-error",
            "closed",
        ],
    );
    let http = reqwest::Client::new();
    let check = |key: &str| {
        let body = serde_json::json!({"domain": "d", "descriptors": [{"entries": [{"key": key, "value": "a"}]}]});
        http.post(server.url("/v1/check")).json(&body).send()
    };

    let r = check("user").await.unwrap();
    assert_eq!(r.status(), 503, "closed: unavailable, never a 429");
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.headers()["x-tollgate-degraded"], "closed");
    assert!(
        r.headers().get("x-ratelimit-remaining").is_none(),
        "no made-up quota"
    );
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["statuses"][0]["reason"], "store_unavailable");
    assert_eq!(body["degraded"], "closed");
    let cli = std::process::Command::new(support::binary())
        .args(["check", "--domain", "d", "--descriptor", "user=a", "--addr"])
        .arg(server.url(""))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&cli.stdout);
    assert_eq!(
        cli.status.code(),
        Some(3),
        "`check` tells could-not-decide apart: {stdout}"
    );
    assert!(
        stdout.contains("answered by the `closed` posture"),
        "{stdout}"
    );
    assert!(
        stdout.contains("quota unknown") && !stdout.contains("remaining"),
        "no made-up quota: {stdout}"
    );

    let r = check("soft").await.unwrap();
    assert_eq!(r.status(), 200, "this rule's own posture is open");
    assert_eq!(r.headers()["x-tollgate-degraded"], "open");

    // `local`: this replica's half of the limit, and every header says so.
    let r = check("shared").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-tollgate-degraded"], "local");
    assert_eq!(r.headers()["x-ratelimit-limit"], "2");
    assert_eq!(r.headers()["ratelimit-policy"], "\"shared\";q=2;w=3600");
    let ratelimit = r.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert!(ratelimit.starts_with("\"shared\";r=1;t="), "{ratelimit}");
    assert_eq!(check("shared").await.unwrap().status(), 200);
    assert_eq!(check("shared").await.unwrap().status(), 429);
    // Denied by the local share beside a shadow rule whose posture (the default, closed) did
    // not matter: a real limit, said so, not "unavailable".
    let body = serde_json::json!({"domain": "d", "descriptors": [
        {"entries": [{"key": "shared", "value": "a"}]},
        {"entries": [{"key": "trial", "value": "a"}]},
    ]});
    let r = http
        .post(server.url("/v1/check"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-tollgate-degraded"], "local");

    let ready = reqwest::get(server.url("/readyz")).await.unwrap();
    assert_eq!(
        ready.status(),
        200,
        "degraded is still ready: the postures answer"
    );
    let text = ready.text().await.unwrap();
    assert!(text.starts_with("ready (degraded)"), "{text}");
    assert!(text.contains("default posture: closed"), "{text}");

    let metrics = server.metrics().await;
    assert!(
        metrics.contains(
            // The first request and the CLI's.
            r#"tollgate_degraded_decisions_total{domain="d",rule="user",posture="closed"} 2"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains("tollgate_fail_open_total 1"), "{metrics}");
}

#[test]
fn a_rule_the_scripts_cannot_decide_exactly_is_refused_at_startup() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    // Refilling a bucket of 10^12 at one per 400 days takes longer than the script can count.
    std::fs::write(
        &path,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: gcra, period: 400d, requests_per_unit: 1, burst: 1000000000000}\n",
    )
    .unwrap();
    let out = std::process::Command::new(support::binary())
        .args([
            "serve",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--store",
        ])
        .arg(redis.url())
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:4:", path.display())),
        "{stderr}"
    );
    assert!(stderr.contains("cannot run on the redis store"), "{stderr}");
}

/// With Redis, the policy is shared: a push to one replica reaches the others within a second,
/// and a rollback on any replica returns all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_and_a_rollback_reach_every_replica_sharing_redis() {
    let redis = RedisServer::start();
    let policy = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {name: per_user, unit: day, requests_per_unit: 5}\n";
    let servers = syncing_replicas(&redis, policy, 3);
    let http = reqwest::Client::new();
    let limit_of = |server: &Server, user: &str| {
        let body = serde_json::json!({"domain": "d", "descriptors": [{"entries": [{"key": "user", "value": user}]}]});
        let request = http.post(server.url("/v1/explain")).json(&body);
        async move {
            let e: serde_json::Value = request.send().await.unwrap().json().await.unwrap();
            e["statuses"][0]["limit"].as_u64().unwrap()
        }
    };
    let wait_all = |want: u64| {
        let servers = &servers;
        async move {
            for _ in 0..40 {
                let mut limits = Vec::new();
                for s in servers {
                    limits.push(limit_of(s, "x").await);
                }
                if limits.iter().all(|l| *l == want) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("not every replica runs a limit of {want} within 2 s");
        }
    };
    wait_all(5).await;

    // Pushes the policy with `limit` to `server`.
    let push_limit = |server: &Server, limit: u64| {
        let text = policy.replace(
            "requests_per_unit: 5",
            &format!("requests_per_unit: {limit}"),
        );
        let push = serde_json::json!({"sources": [{"name": "pushed.yaml", "text": text}]});
        let request = http.post(server.admin_url("/v1/admin/policy")).json(&push);
        async move { assert_eq!(request.send().await.unwrap().status(), 200) }
    };

    push_limit(&servers[0], 50).await;
    wait_all(50).await;

    // Roll back on replica 2: everyone returns to 5.
    let r = http
        .post(servers[2].admin_url("/v1/admin/policy/rollback"))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    wait_all(5).await;

    // The shared key exists and has a TTL like every other key.
    let ttl: i64 = redis
        .cli(&["PTTL", tollgate::store::redis::POLICY_KEY])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 0, "PTTL of the shared policy: {ttl}");
    assert!(keys_without_ttl(|args| redis.cli(args)).is_empty());

    // Redis loses the shared policy (a restart without persistence, say): sharing starts over
    // with sequence numbers below the ones the replicas saw, and a push still reaches them all.
    redis.cli(&["DEL", tollgate::store::redis::POLICY_KEY]);
    support::eventually(
        Duration::from_secs(2),
        "a replica shared its policy again",
        async || {
            redis
                .cli(&["EXISTS", tollgate::store::redis::POLICY_KEY])
                .trim()
                == "1"
        },
    )
    .await;
    push_limit(&servers[1], 7).await;
    wait_all(7).await;
}

/// With Redis, runtime overrides are shared too: set on one replica, in force on the others
/// within a second; deleted on another, gone everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_reach_every_replica_sharing_redis() {
    let redis = RedisServer::start();
    let policy = "domain: d\ndescriptors:\n  - key: tenant\n    rate_limit: {name: per_tenant, unit: day, requests_per_unit: 5}\n";
    let servers = syncing_replicas(&redis, policy, 2);
    let http = reqwest::Client::new();
    let limit_on = |server: &Server| {
        let body = serde_json::json!({"domain": "d", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}]});
        let request = http.post(server.url("/v1/explain")).json(&body);
        async move {
            let e: serde_json::Value = request.send().await.unwrap().json().await.unwrap();
            e["statuses"][0]["limit"].as_u64().unwrap()
        }
    };
    let set = serde_json::json!({"domain": "d", "rule": "per_tenant", "entries": [{"key": "tenant", "value": "acme"}], "requests_per_unit": 500});
    let r = http
        .put(servers[0].admin_url("/v1/admin/overrides"))
        .json(&set)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = r.json::<serde_json::Value>().await.unwrap()["id"]
        .as_u64()
        .unwrap();
    support::eventually(
        Duration::from_secs(2),
        "the override reached the other replica",
        async || limit_on(&servers[1]).await == 500,
    )
    .await;

    let r = http
        .delete(servers[1].admin_url(&format!("/v1/admin/overrides/{id}")))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    support::eventually(
        Duration::from_secs(2),
        "the deletion reached the first replica",
        async || limit_on(&servers[0]).await == 5,
    )
    .await;
}

/// `tollgate serve` with a local budget: two replicas admit exactly the limit of a hot key,
/// most of it from their leases; what they still hold goes back to Redis when they stop, so a
/// third replica started afterwards sees every unused unit. The prefilter answers the denials
/// that follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_budgets_and_the_prefilter_through_the_binary() {
    let redis = RedisServer::start();
    let policy = "domain: hot
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 200, local_budget: 30, local_budget_ttl: 60s}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 5}
";
    let args = ["--store", &redis.url(), "--store-timeout", "2s"];
    let servers: Vec<Server> = (0..2)
        .map(|_| Server::start_with_args(policy, &args))
        .collect();
    let check = |server: usize, key: &'static str| {
        let server = &servers[server];
        async move {
            let mut client = server.grpc_client().await;
            let req = RateLimitRequest {
                domain: "hot".into(),
                descriptors: vec![descriptor(&[(key, "v")])],
                hits_addend: 1,
            };
            let code = client
                .should_rate_limit(req)
                .await
                .unwrap()
                .into_inner()
                .overall_code;
            code == Code::Ok as i32
        }
    };
    // 50 requests, alternating replicas: each reserves a lease of 30 and serves from it.
    let mut admitted = 0;
    for i in 0..50 {
        admitted += usize::from(check(i % 2, "k").await);
    }
    assert_eq!(admitted, 50);
    let local: u64 = {
        let mut sum = 0;
        for server in &servers {
            sum += tollgate_testkit::metric_sample(
                &server.metrics().await,
                "tollgate_local_budget_admissions_total",
            );
        }
        sum
    };
    // Two reservations (one per replica) took 60 units; 48 requests were served from them.
    assert_eq!(local, 48);
    // A plain rule: 5 admitted, then denials the prefilter answers.
    for i in 0..10 {
        assert_eq!(check(0, "plain").await, i < 5, "request {i}");
    }
    let prefiltered = tollgate_testkit::metric_sample(
        &servers[0].metrics().await,
        "tollgate_prefilter_denials_total",
    );
    assert_eq!(
        prefiltered, 4,
        "the first denial came from Redis, the next four from memory"
    );

    // Stopping gives the 10 unused units back: 150 remain for anyone.
    for server in servers {
        assert!(server.stop().success());
    }
    let after = Server::start_with_args(
        policy,
        &[
            "--store",
            &redis.url(),
            "--store-timeout",
            "2s",
            "--no-prefilter",
        ],
    );
    let mut client = after.grpc_client().await;
    let mut more = 0;
    for _ in 0..160 {
        let req = RateLimitRequest {
            domain: "hot".into(),
            descriptors: vec![descriptor(&[("k", "v")])],
            hits_addend: 1,
        };
        let r = client.should_rate_limit(req).await.unwrap().into_inner();
        more += usize::from(r.overall_code == Code::Ok as i32);
    }
    assert_eq!(more, 150);
}

/// A Redis that stops answering does not hold an idle replica's shutdown: the policy-sync
/// calls waiting on it are cut short (they used to hold the process for minutes, and then
/// until `--shutdown-timeout`), so it stops at once however long the drain may last.
#[tokio::test]
async fn a_hung_redis_does_not_hold_the_shutdown() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let policy = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 5}\n";
    let store = proxy.url();
    let args = [
        "--store",
        store.as_str(),
        "--store-timeout",
        "5s",
        "--policy-sync-interval",
        "20ms",
        "--shutdown-timeout",
        "1h",
    ];
    let server = Server::start_with_args(policy, &args);
    proxy.set_mode(Mode::Blackhole);
    // The replica's sync calls are now waiting on the partition.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let began = tokio::time::Instant::now();
    let status = server.stop();
    assert!(status.success(), "exit status {status:?}");
    assert!(
        began.elapsed() < Duration::from_secs(2),
        "stopped after {:?}",
        began.elapsed()
    );
}

/// Redis flushed under running replicas (as when it restarts empty): each notices its shared
/// policy gone at its next sync and drops what described the lost counters. A remembered denial
/// goes, so a key Redis would now admit is admitted again; a local budget reserved before is
/// dropped, not given back against the counts made since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_forget_hot_key_state_when_redis_loses_its_data() {
    let redis = RedisServer::start();
    let policy = "domain: hot
descriptors:
  - key: plain
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 100, local_budget: 50, local_budget_ttl: 1s}
";
    let replicas = syncing_replicas(&redis, policy, 2);
    let http = reqwest::Client::new();
    let ask = async |server: &Server, path: &str, key: &str| {
        let body = serde_json::json!({"domain": "hot", "descriptors": [{"entries": [{"key": key, "value": "v"}]}]});
        let r = http
            .post(server.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        (
            r.status().as_u16(),
            r.json::<serde_json::Value>().await.unwrap(),
        )
    };
    let admitted = async |server: &Server, key: &str| ask(server, "/v1/check", key).await.0 == 200;

    for i in 0..4 {
        assert_eq!(admitted(&replicas[0], "plain").await, i < 2, "request {i}");
    }
    for _ in 0..2 {
        assert!(!admitted(&replicas[1], "plain").await);
    }
    for replica in &replicas {
        let remembered = tollgate_testkit::metric_sample(
            &replica.metrics().await,
            "tollgate_prefilter_denials_total",
        );
        assert!(remembered >= 1, "the prefilter answered a denial");
    }
    for _ in 0..5 {
        assert!(
            admitted(&replicas[0], "k").await,
            "served from a lease of 50"
        );
    }

    assert_eq!(redis.cli(&["FLUSHALL"]), "OK");
    // Each replica notices at its own next sync (the new counter takes one from each).
    for replica in &replicas {
        support::eventually(
            Duration::from_secs(3),
            "the denial is forgotten",
            async || admitted(replica, "plain").await,
        )
        .await;
    }
    for _ in 0..10 {
        assert!(admitted(&replicas[1], "k").await);
    }
    // Both leases lapse (1 s): replica 1 gives back its 40 unused units; replica 0's lease was
    // reserved from the lost counter and gives back nothing. 10 were admitted since the flush.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (_, explained) = ask(&replicas[1], "/v1/explain", "k").await;
    // (Explain answers for one more request: 100 - 10 - 1.)
    assert_eq!(explained["statuses"][0]["remaining"], 89, "{explained}");
}

/// A `rediss://` URL pointed at a plaintext Redis only ever times out (the TLS client waits for
/// an answer the server never sends): the startup warning says to check that the server speaks
/// TLS, where it used to say "deadline exceeded" alone.
#[test]
fn a_tls_url_to_a_plaintext_redis_is_named_at_startup() {
    let redis = RedisServer::start();
    let url = redis.url().replace("redis://", "rediss://");
    let server = Server::start_logged(
        "domain: api\ndescriptors: []\n",
        &["--store", &url, "--store-connect-timeout", "300ms"],
    );
    let log = server.log();
    assert!(log.contains("Store not ready yet"), "{log}");
    assert!(log.contains("does the server speak it?"), "{log}");
}

/// A Redis that stops answering opens its breaker through timeouts, the commonest way, and the
/// log says so (a warning; its closing is an `info` line). Before, a call cut by its deadline
/// counted against the breaker without a word: the log had a "closed" line with no "open"
/// before it.
#[tokio::test]
async fn a_breaker_opened_by_timeouts_is_logged() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let policy = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 500}\n";
    let store = proxy.url();
    let server = Server::start_logged(policy, &["--store", store.as_str()]);
    let check = || async {
        let body = serde_json::json!({
            "domain": "d",
            "descriptors": [{"entries": [{"key": "user", "value": "a"}]}],
        });
        let r = reqwest::Client::new()
            .post(server.url("/v1/check"))
            .json(&body)
            .send()
            .await
            .unwrap();
        r.headers().contains_key("x-tollgate-degraded")
    };
    assert!(!check().await, "Redis answers");
    let breaker = |state: u8| {
        format!(
            "tollgate_breaker_state{{node=\"{}\"}} {state}",
            proxy.addr()
        )
    };
    proxy.set_mode(Mode::Blackhole);
    for _ in 0..20 {
        assert!(check().await, "the posture answers");
    }
    assert!(server.metrics().await.contains(&breaker(2)), "open");
    let opened = |log: &str| {
        log.lines()
            .any(|l| l.contains("Circuit breaker changed state") && l.contains("state=\"open\""))
    };
    assert!(opened(&server.log()), "{}", server.log());

    proxy.set_mode(Mode::Pass);
    let closed = async {
        while check().await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("answers again");
    assert!(server.metrics().await.contains(&breaker(0)), "closed");
}

/// A replica that cannot read what the others share says so (at most every 10 s): pushes and
/// overrides made elsewhere do not reach it meanwhile. Before, the failed reads were silent.
#[tokio::test]
async fn a_replica_that_cannot_read_the_shared_policy_says_so() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let policy = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 5}\n";
    let store = proxy.url();
    let args = ["--store", store.as_str(), "--policy-sync-interval", "50ms"];
    let server = Server::start_logged(policy, &args);
    proxy.set_mode(Mode::Refuse);
    support::eventually(
        Duration::from_secs(5),
        "the failed read logged",
        async || {
            server
                .log()
                .contains("Could not read what the other replicas share")
        },
    )
    .await;
}

/// A burst is not a store failure: 3,000 simultaneous HTTP checks on one key limited to 50 an
/// hour, against `serve` at its default flags on a healthy store, admit exactly 50. Neither
/// the decisions past the in-flight cap nor those that wait their turn longer than
/// `--store-timeout` may be left to the failure posture (`open` by default). Prints the
/// latencies it cost (see docs/burst.md).
async fn a_burst_admits_exactly_the_limit(store: &str, what: &str) {
    const BURST: usize = 3_000;
    let policy = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 50}\n";
    let server = Server::start_logged(policy, &["--store", store]);
    // The store answers before the burst (connections open, scripts loaded).
    let warm = server.check("user", "warm").await;
    assert_eq!(warm.status(), 200);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(BURST)
        .build()
        .unwrap();
    let url = server.url("/v1/check");
    let body = serde_json::json!({
        "domain": "api",
        "descriptors": [{"entries": [{"key": "user", "value": "burst"}]}],
    });
    let start = Arc::new(tokio::sync::Barrier::new(BURST));
    let callers: Vec<_> = (0..BURST)
        .map(|_| {
            let (client, url, body, start) =
                (client.clone(), url.clone(), body.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let sent = tokio::time::Instant::now();
                let r = client.post(url).json(&body).send().await.expect("answered");
                let status = r.status().as_u16();
                let answer: serde_json::Value = r.json().await.expect("a JSON answer");
                (status, answer, sent.elapsed())
            })
        })
        .collect();
    let mut admitted = 0;
    let mut degraded = 0;
    let mut latencies = Vec::with_capacity(BURST);
    for caller in callers {
        let (status, answer, took) = caller.await.unwrap();
        admitted += usize::from(status == 200);
        degraded += usize::from(!answer["degraded"].is_null());
        latencies.push(took);
    }
    latencies.sort();
    let at = |q: usize| latencies[(latencies.len() * q / 100).min(latencies.len() - 1)];
    println!(
        "{what}: {BURST} at once: admitted {admitted}, degraded {degraded}; latency p50 {:?} p99 {:?} max {:?}",
        at(50),
        at(99),
        latencies[latencies.len() - 1]
    );
    let metrics = server.metrics().await;
    let store_lines: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("tollgate_store_") && !l.contains("_bucket"))
        .collect();
    println!("{what}: {store_lines:#?}");
    let log = server.log();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN")).take(5).collect();
    println!("{what}: {warnings:#?}");
    assert_eq!(degraded, 0, "{what}: no posture answered a healthy store");
    assert_eq!(admitted, 50, "{what}: exactly the limit");
    assert!(
        metrics.contains("tollgate_store_shed_total{reason=\"queue_full\"} 0")
            && metrics.contains("tollgate_store_shed_total{reason=\"waited_too_long\"} 0"),
        "{what}: nothing shed for load: {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_one_redis_admits_exactly_the_limit() {
    let redis = RedisServer::start();
    a_burst_admits_exactly_the_limit(&redis.url(), "one Redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_a_cluster_admits_exactly_the_limit() {
    let cluster = RedisCluster::start(3, 0);
    a_burst_admits_exactly_the_limit(&cluster.store_url(), "cluster").await;
}
