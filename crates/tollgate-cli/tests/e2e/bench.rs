//! `tollgate bench` against a real `tollgate serve` (memory store) over both protocols.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::process::{Command, Output};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde_json::Value;
use support::{BenchServer, Server, binary, descriptor};

const POLICY: &str = r#"
domain: bench
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: second, requests_per_unit: 1000000}
  - key: daily
    rate_limit: {name: daily, unit: day, requests_per_unit: 100}
"#;

fn bench(args: &[&str]) -> Output {
    Command::new(binary())
        .arg("bench")
        .args(args)
        .output()
        .unwrap()
}

fn bench_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = bench(&all);
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `bench --json` against `target`, domain `bench`, descriptor `user=u{key}`, then `rest`.
fn bench_users(target: &str, rest: &[&str]) -> Value {
    let mut args = vec![
        "--target",
        target,
        "--domain",
        "bench",
        "--descriptor",
        "user=u{key}",
    ];
    args.extend_from_slice(rest);
    bench_json(&args)
}

fn n(v: &Value, path: &[&str]) -> f64 {
    let mut at = v;
    for p in path {
        at = &at[*p];
    }
    at.as_f64()
        .unwrap_or_else(|| panic!("{path:?} missing in {v}"))
}

fn assert_consistent(report: &Value) {
    let requests = n(report, &["requests"]);
    assert!(requests > 0.0, "{report}");
    assert_eq!(
        n(report, &["ok"]) + n(report, &["over_limit"]) + n(report, &["errors"]),
        requests,
        "{report}"
    );
    assert_eq!(n(report, &["errors"]), 0.0, "{report}");
    let p50 = n(report, &["latency_us", "p50"]);
    let p90 = n(report, &["latency_us", "p90"]);
    let p99 = n(report, &["latency_us", "p99"]);
    let p999 = n(report, &["latency_us", "p99_9"]);
    let max = n(report, &["latency_us", "max"]);
    assert!(
        0.0 < p50 && p50 <= p90 && p90 <= p99 && p99 <= p999 && p999 <= max,
        "{report}"
    );
    assert!(n(report, &["throughput_rps"]) > 0.0, "{report}");
}

#[test]
fn grpc_and_http_runs_report_consistent_json() {
    let server = Server::start(POLICY);
    for target in [
        format!("grpc://{}", server.grpc),
        format!("http://{}", server.http),
    ] {
        let report = bench_users(
            &target,
            &[
                "--keys",
                "1000",
                "--zipf",
                "1.1",
                "--concurrency",
                "8",
                "--connections",
                "2",
                "--duration",
                "1s",
            ],
        );
        assert_consistent(&report);
        assert_eq!(report["over_limit"], 0, "{report}");
        let elapsed = n(&report, &["elapsed_s"]);
        assert!((0.9..3.0).contains(&elapsed), "{report}");
    }
}

/// The server closes a keep-alive socket idle for its `--http-read-timeout` (500 ms here, the
/// requests 1 s apart): the next request opens a new socket. Before, every later request on
/// that connection failed at once with `channel closed`, for the rest of the run.
#[test]
fn http_reconnects_a_socket_the_server_closed() {
    let server = Server::start_with_args(POLICY, &["--http-read-timeout", "500ms"]);
    let report = bench_users(
        &format!("http://{}", server.http),
        &["--concurrency", "1", "--rate", "1", "--duration", "3s"],
    );
    assert_consistent(&report);
    assert_eq!(report["ok"], 3, "{report}");
}

/// A server that goes away fails every request at once (a refused connection); a worker pauses
/// 20 ms after an error, so an outage of about a second is not counted as thousands of
/// requests. Two workers can fail about 100 times in it.
#[test]
fn an_outage_is_not_a_flood_of_errors() {
    for scheme in ["grpc", "http"] {
        let server = Server::start(POLICY);
        let target = match scheme {
            "grpc" => format!("grpc://{}", server.grpc),
            _ => format!("http://{}", server.http),
        };
        let run = std::thread::spawn(move || {
            bench_users(&target, &["--concurrency", "2", "--duration", "1500ms"])
        });
        std::thread::sleep(std::time::Duration::from_millis(500));
        drop(server);
        let report = run.join().unwrap();
        let errors = n(&report, &["errors"]);
        assert!((1.0..=150.0).contains(&errors), "{scheme}: {report}");
        assert!(n(&report, &["ok"]) > 0.0, "{scheme}: {report}");
    }
}

#[test]
fn verify_admits_exactly_the_limit_of_a_single_key() {
    let server = Server::start(POLICY);
    for (target, value) in [
        (format!("grpc://{}", server.grpc), "g{key}"),
        (format!("http://{}", server.http), "h{key}"),
    ] {
        let descriptor = format!("daily={value}");
        let report = bench_json(&[
            "--target",
            &target,
            "--domain",
            "bench",
            "--descriptor",
            &descriptor,
            "--keys",
            "1",
            "--concurrency",
            "16",
            "--requests",
            "300",
            "--verify",
            "100",
        ]);
        assert_consistent(&report);
        assert_eq!(report["requests"], 300, "{report}");
        assert_eq!(report["ok"], 100, "{report}");
        assert_eq!(report["over_limit"], 200, "{report}");
        assert_eq!(report["verify"]["admitted"], 100, "{report}");
        assert_eq!(report["verify"]["passed"], true, "{report}");
    }
}

/// Several `--target`s: three replicas on one Redis, one with local budgets, share the
/// load and the quota; over both protocols exactly the limit is admitted.
#[test]
fn verify_across_replicas_on_one_redis() {
    let redis = tollgate_testkit::RedisServer::start();
    let policy = format!(
        "{POLICY}  - key: budgeted\n    rate_limit: {{unit: day, requests_per_unit: 100, local_budget: 8}}\n"
    );
    let args = ["--store", &redis.url(), "--store-timeout", "2s"];
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::start_with_args(&policy, &args))
        .collect();
    for (scheme, key) in [("grpc", "daily"), ("http", "daily"), ("grpc", "budgeted")] {
        let targets: Vec<String> = servers
            .iter()
            .map(|s| match scheme {
                "grpc" => format!("--target=grpc://{}", s.grpc),
                _ => format!("--target=http://{}", s.http),
            })
            .collect();
        let descriptor = format!("{key}={scheme}{{key}}");
        let mut args: Vec<&str> = targets.iter().map(String::as_str).collect();
        args.extend([
            "--domain",
            "bench",
            "--descriptor",
            &descriptor,
            "--keys",
            "1",
            "--concurrency",
            "24",
            "--requests",
            "300",
            "--verify",
            "100",
        ]);
        let report = bench_json(&args);
        assert_consistent(&report);
        assert_eq!(report["connections"], if scheme == "grpc" { 3 } else { 24 });
        // A budgeted key may leave up to three leases of 8 unused while they live.
        let admitted = report["verify"]["admitted"].as_u64().unwrap();
        let least = if key == "budgeted" { 100 - 3 * 8 } else { 100 };
        assert!(
            (least..=100).contains(&admitted),
            "{key} over {scheme}: {report}"
        );
        assert_eq!(report["errors"], 0, "{report}");
    }
    // No answer came from a failure posture.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for server in &servers {
        let metrics = runtime.block_on(server.metrics());
        assert_eq!(
            tollgate_testkit::metric_sample(&metrics, "tollgate_store_errors_total"),
            0
        );
    }
}

#[test]
fn verify_fails_when_more_than_the_limit_is_admitted() {
    let server = Server::start(POLICY);
    let out = bench(&[
        "--target",
        &format!("grpc://{}", server.grpc),
        "--domain",
        "bench",
        "--descriptor",
        "daily=x{key}",
        "--keys",
        "1",
        "--requests",
        "20",
        "--verify",
        "10",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("verify: admitted 20 of limit 10: OVER"),
        "{text}"
    );
}

/// Admissions the `open` posture made while the store did not answer are counted apart: they
/// are not the limiter's, so `--verify` does not hold them against the algorithm (before,
/// they read as an over-admission), and it says how many there were. (A `local` posture's
/// admissions are tollgate's own count, and held against it.)
#[test]
fn verify_counts_admissions_of_a_failure_posture_apart() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let store = format!("redis://{}", closed.local_addr().unwrap());
    drop(closed);
    let server = Server::start_with_args(POLICY, &["--store", &store]);
    for target in [
        format!("grpc://{}", server.grpc),
        format!("http://{}", server.http),
    ] {
        let args = [
            "--target",
            &target,
            "--domain",
            "bench",
            "--descriptor",
            "daily=d{key}",
            "--keys",
            "1",
            "--requests",
            "20",
            "--verify",
            "10",
        ];
        let report = bench_json(&args);
        assert_eq!(report["ok"], 20, "{report}");
        assert_eq!(report["degraded_ok"], 20, "{report}");
        assert_eq!(report["verify"]["admitted"], 0, "{report}");
        assert_eq!(report["verify"]["admitted_degraded"], 20, "{report}");
        assert_eq!(report["verify"]["passed"], true, "{report}");
        let out = bench(&args);
        assert_eq!(out.status.code(), Some(0));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("OK 20 (of which 20 degraded"), "{text}");
        assert!(
            text.contains("verify: 20 more admitted by the open posture"),
            "{text}"
        );
    }
}

#[test]
fn requests_bound_stops_after_exactly_that_many() {
    let server = Server::start(POLICY);
    let report = bench_users(
        &format!("http://{}", server.http),
        &["--keys", "10", "--concurrency", "7", "--requests", "50"],
    );
    assert_consistent(&report);
    assert_eq!(report["requests"], 50, "{report}");
}

#[test]
fn open_loop_rate_paces_the_requests() {
    let server = Server::start(POLICY);
    let report = bench_users(
        &format!("grpc://{}", server.grpc),
        &["--concurrency", "4", "--rate", "200", "--duration", "1s"],
    );
    assert_consistent(&report);
    let requests = n(&report, &["requests"]);
    assert!((150.0..=210.0).contains(&requests), "{report}");
}

/// A request budget with a rate ends with its last request: workers waiting for later slots
/// (16 workers, 4 requests at 2 a second) do not hold the run open until their turn.
#[test]
fn a_paced_request_budget_ends_with_its_last_request() {
    let server = Server::start(POLICY);
    let report = bench_users(
        &format!("http://{}", server.http),
        &["--concurrency", "16", "--requests", "4", "--rate", "2"],
    );
    assert_consistent(&report);
    assert_eq!(report["requests"], 4, "{report}");
    // Due at 0, 0.5, 1 and 1.5 s; the last of 16 workers' first slots would be at 7.5 s.
    let elapsed = n(&report, &["elapsed_s"]);
    assert!((1.4..4.0).contains(&elapsed), "{report}");
}

/// An open-loop run is reported as lasting at least its schedule: four requests at 2 a second
/// span 2 s, though the last is sent at 1.5 s and the run ends with its answer. Before, the
/// report said 4 requests in 1.5 s, 2.7 req/s (and `--rate 0.5 --duration 2s` 400 req/s).
#[test]
fn open_loop_throughput_is_the_rate() {
    let server = Server::start(POLICY);
    for (target, bound) in [
        (format!("grpc://{}", server.grpc), ["--duration", "2s"]),
        (format!("http://{}", server.http), ["--requests", "4"]),
    ] {
        let mut args = vec!["--concurrency", "2", "--rate", "2"];
        args.extend(bound);
        let report = bench_users(&target, &args);
        assert_consistent(&report);
        let elapsed = n(&report, &["elapsed_s"]);
        assert!((1.9..4.0).contains(&elapsed), "{report}");
        let throughput = n(&report, &["throughput_rps"]);
        assert!((1.5..=2.5).contains(&throughput), "{report}");
    }
}

/// A slow schedule is kept to the end of the run: once no slot is left before the deadline,
/// the workers stop instead of sending as fast as they can until it.
#[test]
fn a_slow_rate_is_kept_to_the_end_of_the_run() {
    let server = Server::start(POLICY);
    let report = bench_users(
        &format!("http://{}", server.http),
        &[
            "--keys",
            "100",
            "--concurrency",
            "2",
            "--rate",
            "4",
            "--duration",
            "2s",
        ],
    );
    assert_consistent(&report);
    // Slots at 0, 0.25 ... 1.75 s: eight (one fewer if a busy machine sends the last one
    // after the deadline). Before, the last quarter second ran closed-loop: hundreds.
    let requests = n(&report, &["requests"]);
    assert!((7.0..=8.0).contains(&requests), "{report}");
}

#[test]
fn a_rate_too_small_to_schedule_is_refused() {
    let out = bench(&[
        "--target",
        "http://127.0.0.1:1",
        "--domain",
        "bench",
        "--descriptor",
        "user=u",
        "--requests",
        "1",
        "--rate",
        "1e-30",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--rate must be") && err.contains("0.01"),
        "{err}"
    );
}

/// Each worker holds a histogram of about 15 KB and, over HTTP, a socket: `--concurrency 300000`
/// took 3.4 GB. Too many workers or connections are refused by name before anything is sent.
#[test]
fn too_many_workers_or_connections_are_refused() {
    for flag in ["--concurrency", "--connections"] {
        let out = bench(&[
            "--target",
            "http://127.0.0.1:1",
            "--domain",
            "bench",
            "--descriptor",
            "user=u",
            "--duration",
            "1s",
            flag,
            "10001",
        ]);
        assert_eq!(out.status.code(), Some(2), "{flag}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{flag} must be between 1 and 10000")),
            "{flag}: {err}"
        );
    }
}

#[test]
fn non_loopback_targets_are_refused_without_allow_remote() {
    let out = bench(&[
        "--target",
        "grpc://192.0.2.1:8081",
        "--domain",
        "bench",
        "--descriptor",
        "user=u",
        "--requests",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allow-remote"), "{err}");
}

#[test]
fn a_bound_is_required_and_long_runs_are_refused() {
    let base = [
        "--target",
        "grpc://127.0.0.1:1",
        "--domain",
        "d",
        "--descriptor",
        "k=v",
    ];
    let out = bench(&base);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--duration") && stderr.contains("--requests"),
        "{stderr}"
    );
    let mut long = base.to_vec();
    long.extend(["--duration", "11m"]);
    let out = bench(&long);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("10 minutes"));
}

/// Arguments that would run a meaningless benchmark are refused before anything is sent: an
/// empty domain, a limit of 0 to verify, a placeholder other than `{key}`, and a key space no
/// template uses.
#[test]
fn meaningless_runs_are_refused() {
    let run = |domain: &str, descriptor: &str, extra: &[&str]| {
        let mut args = vec!["--target", "grpc://127.0.0.1:1", "--requests", "1"];
        args.extend(["--domain", domain, "--descriptor", descriptor]);
        args.extend(extra);
        let out = bench(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run("", "k=v", &[]);
    assert!(err.contains("--domain must not be empty"), "{err}");
    let err = run("d", "k=v", &["--verify", "0"]);
    assert!(err.contains("--verify LIMIT must be at least 1"), "{err}");
    for template in ["k=v{key", "k=v{nope}"] {
        let err = run("d", template, &[]);
        assert!(
            err.contains("the only placeholder is {key}"),
            "{template}: {err}"
        );
    }
    let err = run("d", "k=v", &["--keys", "10"]);
    assert!(err.contains("no --descriptor value has {key}"), "{err}");
}

#[test]
fn bench_server_admits_what_serve_denies() {
    let ceiling = BenchServer::start();
    for target in [
        format!("grpc://{}", ceiling.grpc),
        format!("http://{}", ceiling.http),
    ] {
        // The same run that admits exactly 100 against `serve` (see above).
        let out = bench(&[
            "--target",
            &target,
            "--domain",
            "bench",
            "--descriptor",
            "daily=c{key}",
            "--keys",
            "1",
            "--concurrency",
            "16",
            "--requests",
            "300",
            "--verify",
            "100",
            "--json",
        ]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_consistent(&report);
        assert_eq!(report["ok"], 300, "{report}");
        assert_eq!(report["over_limit"], 0, "{report}");
        assert_eq!(report["verify"]["passed"], false, "{report}");
    }
}

/// Invalid HTTP bodies and gRPC requests get the same answer from `serve` and `bench-server`.
#[tokio::test]
async fn bench_server_rejects_malformed_requests_like_serve() {
    let real = Server::start(POLICY);
    let ceiling = BenchServer::start();
    let bodies = [
        "not json",
        r#"{"domain": "bench", "descriptors": []}"#,
        r#"{"domain": "", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}]}"#,
        r#"{"domain": "bench", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}], "hits_addend": 0}"#,
        r#"{"domain": "bench", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}], "extra": 1}"#,
    ];
    let http = reqwest::Client::new();
    for body in bodies {
        let mut answers = Vec::new();
        for addr in [real.http, ceiling.http] {
            let response = http
                .post(format!("http://{addr}/v1/check"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            answers.push((response.status().as_u16(), response.text().await.unwrap()));
        }
        assert_eq!(answers[0].0, 400, "{body}: {answers:?}");
        assert_eq!(answers[0], answers[1], "{body}");
    }
    let requests = [
        RateLimitRequest {
            domain: String::new(),
            descriptors: vec![descriptor(&[("user", "a")])],
            hits_addend: 1,
        },
        RateLimitRequest {
            domain: "bench".into(),
            descriptors: vec![],
            hits_addend: 1,
        },
        RateLimitRequest {
            domain: "bench".into(),
            descriptors: vec![descriptor(&[("", "a")])],
            hits_addend: 1,
        },
    ];
    let mut real_client = real.grpc_client().await;
    let mut ceiling_client =
        envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
            format!("http://{}", ceiling.grpc),
        )
        .await
        .unwrap();
    for request in requests {
        let a = real_client
            .should_rate_limit(request.clone())
            .await
            .unwrap_err();
        let b = ceiling_client
            .should_rate_limit(request.clone())
            .await
            .unwrap_err();
        assert_eq!(a.code(), tonic::Code::InvalidArgument, "{request:?}");
        assert_eq!(
            (a.code(), a.message()),
            (b.code(), b.message()),
            "{request:?}"
        );
    }
}

/// A loopback TCP proxy to `upstream` that counts the connections it accepts.
async fn counting_proxy(
    upstream: std::net::SocketAddr,
) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn connections_are_real_sockets_for_both_protocols() {
    let ceiling = BenchServer::start();
    for (scheme, upstream) in [("grpc", ceiling.grpc), ("http", ceiling.http)] {
        let (proxy, accepted) = counting_proxy(upstream).await;
        let target = format!("{scheme}://{proxy}");
        let report = tokio::task::spawn_blocking(move || {
            bench_users(
                &target,
                &[
                    "--keys",
                    "100",
                    "--concurrency",
                    "12",
                    "--connections",
                    "3",
                    "--requests",
                    "600",
                ],
            )
        })
        .await
        .unwrap();
        assert_consistent(&report);
        assert_eq!(report["ok"], 600, "{report}");
        assert_eq!(report["connections"], 3, "{report}");
        assert_eq!(accepted.load(Ordering::SeqCst), 3, "{scheme}: {report}");
    }
}
