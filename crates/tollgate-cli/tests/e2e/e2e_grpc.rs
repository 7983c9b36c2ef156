//! Envoy RLS v3 over a real gRPC socket against the built binary, with tonic's client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use support::{Server, descriptor};
use tollgate_core::Algorithm;

const POLICY: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: day, requests_per_unit: 5}
  - key: tenant
    rate_limit: {name: per_tenant, unit: hour, requests_per_unit: 100}
    descriptors:
      - key: path
        rate_limit: {name: tenant_path, unit: week, requests_per_unit: 2}
  - key: plan
    shadow_mode: true
    rate_limit: {name: candidate, unit: day, requests_per_unit: 1}
  - key: llm_user
    rate_limit: {name: tokens, unit: hour, requests_per_unit: 10, charge: up_to_limit}
"#;

/// A descriptor's entries and its optional `hits_addend`.
type Desc<'a> = (&'a [(&'a str, &'a str)], Option<u64>);

fn request(descriptors: Vec<Desc<'_>>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: descriptors
            .into_iter()
            .map(|(entries, hits)| {
                let mut d = descriptor(entries);
                d.hits_addend = hits.map(|value| UInt64Value { value });
                d
            })
            .collect(),
        hits_addend: hits,
    }
}

#[tokio::test]
async fn statuses_come_back_in_order_with_limits_filled() {
    let server = Server::start(POLICY);
    let mut client = server.grpc_client().await;
    let r = client
        .should_rate_limit(request(
            vec![
                (&[("nothing", "x")], None),
                (&[("tenant", "acme"), ("path", "/a")], None),
                (&[("user", "u1")], None),
            ],
            0,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 3);
    assert!(r.statuses[0].current_limit.is_none());
    let tenant_path = r.statuses[1].current_limit.as_ref().unwrap();
    assert_eq!(tenant_path.name, "tenant_path");
    assert_eq!(tenant_path.requests_per_unit, 2);
    assert_eq!(tenant_path.unit, 7, "WEEK is 7 in Envoy's enum");
    assert_eq!(r.statuses[1].limit_remaining, 1);
    let user = r.statuses[2].current_limit.as_ref().unwrap();
    assert_eq!((user.name.as_str(), user.unit), ("per_user", 4));
    assert_eq!(r.statuses[2].limit_remaining, 4);
    let reset = r.statuses[2].duration_until_reset.unwrap();
    assert!((0..=86_400).contains(&reset.seconds));
    // Headers for the binding limit: the one with the least remaining (tenant_path, 1 left).
    let headers: Vec<(String, String)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert!(
        headers.contains(&("x-ratelimit-limit".into(), "2".into())),
        "{headers:?}"
    );
    assert!(headers.contains(&("x-ratelimit-remaining".into(), "1".into())));
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "ratelimit-policy" && v == "\"tenant_path\";q=2;w=604800")
    );
}

/// `--no-rls-x-ratelimit-headers` leaves the X-RateLimit-* three to an Envoy that adds its own
/// (Envoy Gateway does), and still sends the IETF headers and Retry-After.
#[tokio::test]
async fn x_ratelimit_headers_can_be_left_to_envoy() {
    let server = Server::start_with_args(POLICY, &["--no-rls-x-ratelimit-headers"]);
    let mut client = server.grpc_client().await;
    let mut last = None;
    for _ in 0..6 {
        let r = client
            .should_rate_limit(request(vec![(&[("user", "lee")], None)], 0))
            .await
            .unwrap()
            .into_inner();
        last = Some(r);
    }
    let r = last.unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let keys: Vec<&str> = r
        .response_headers_to_add
        .iter()
        .map(|h| h.key.as_str())
        .collect();
    assert!(
        !keys.iter().any(|k| k.starts_with("x-ratelimit-")),
        "{keys:?}"
    );
    for kept in ["ratelimit", "ratelimit-policy", "retry-after"] {
        assert!(keys.contains(&kept), "{kept}: {keys:?}");
    }
}

#[tokio::test]
async fn hits_addend_zero_means_one_and_descriptor_hits_override_the_request() {
    let server = Server::start(POLICY);
    let mut client = server.grpc_client().await;
    let remaining = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.statuses[0].limit_remaining
    };
    let r = client
        .should_rate_limit(request(vec![(&[("user", "h")], None)], 0))
        .await
        .unwrap();
    assert_eq!(remaining(r.get_ref()), 4, "0 means 1");
    let r = client
        .should_rate_limit(request(vec![(&[("user", "h")], None)], 2))
        .await
        .unwrap();
    assert_eq!(remaining(r.get_ref()), 2, "request-level hits_addend");
    let r = client
        .should_rate_limit(request(vec![(&[("user", "h")], Some(1))], 2))
        .await
        .unwrap();
    assert_eq!(remaining(r.get_ref()), 1, "descriptor hits_addend wins");
    let r = client
        .should_rate_limit(request(vec![(&[("user", "h")], Some(2))], 0))
        .await
        .unwrap();
    assert_eq!(r.get_ref().overall_code, Code::OverLimit as i32);
    assert_eq!(remaining(r.get_ref()), 1, "a denial consumes nothing");
}

/// Envoy's per-descriptor `hits_addend: 0` (the request-time check of a limit whose cost is
/// only known when the response is done) checks without counting, as in envoyproxy/ratelimit,
/// and, as there, is OK on a limit exactly used up (a rule charged whole).
#[tokio::test]
async fn a_descriptor_hits_addend_of_zero_checks_without_counting() {
    let server = Server::start(POLICY);
    let mut client = server.grpc_client().await;
    let mut ask = async |hits: u64| {
        let r = client
            .should_rate_limit(request(vec![(&[("user", "c")], Some(hits))], 3))
            .await
            .unwrap()
            .into_inner();
        (
            Code::try_from(r.overall_code).unwrap(),
            r.statuses[0].limit_remaining,
        )
    };
    assert_eq!(ask(0).await, (Code::Ok, 5), "a check counts nothing");
    assert_eq!(ask(0).await, (Code::Ok, 5));
    assert_eq!(ask(4).await, (Code::Ok, 1));
    assert_eq!(ask(0).await, (Code::Ok, 1), "one unit is left");
    assert_eq!(ask(1).await, (Code::Ok, 0));
    assert_eq!(ask(0).await, (Code::Ok, 0), "used up, not past it");
    assert_eq!(ask(1).await, (Code::OverLimit, 0));
}

/// A token budget as Envoy drives it: a check (`hits_addend: 0`) before the request, the
/// tokens used sent after the response (`apply_on_stream_done`). With `charge: up_to_limit`
/// the tokens that overshoot still use up what was left, so the next check is denied; a
/// limit charged whole records nothing of a charge that does not fit.
#[tokio::test]
async fn tokens_counted_after_the_response_count_up_to_the_limit() {
    let server = Server::start(POLICY);
    let mut client = server.grpc_client().await;
    let mut ask = async |key: &str, hits: u64| {
        let r = client
            .should_rate_limit(request(vec![(&[(key, "ada")], Some(hits))], 0))
            .await
            .unwrap()
            .into_inner();
        (
            Code::try_from(r.overall_code).unwrap(),
            r.statuses[0].limit_remaining,
        )
    };
    assert_eq!(ask("llm_user", 0).await, (Code::Ok, 10));
    assert_eq!(ask("llm_user", 4).await, (Code::Ok, 6));
    assert_eq!(ask("llm_user", 0).await, (Code::Ok, 6));
    assert_eq!(ask("llm_user", 8).await, (Code::Ok, 0), "6 of the 8 fit");
    assert_eq!(ask("llm_user", 0).await, (Code::OverLimit, 0));

    assert_eq!(ask("user", 3).await, (Code::Ok, 2));
    assert_eq!(
        ask("user", 4).await,
        (Code::OverLimit, 2),
        "charged whole or not at all"
    );
    assert_eq!(ask("user", 0).await, (Code::Ok, 2));
}

#[tokio::test]
async fn any_denied_descriptor_denies_the_request_and_charges_none() {
    let server = Server::start(POLICY);
    let mut client = server.grpc_client().await;
    // Exhaust tenant_path (2 per week) for acme:/x.
    for _ in 0..2 {
        client
            .should_rate_limit(request(
                vec![(&[("tenant", "acme"), ("path", "/x")], None)],
                1,
            ))
            .await
            .unwrap();
    }
    let r = client
        .should_rate_limit(request(
            vec![
                (&[("user", "all-or-nothing")], None),
                (&[("tenant", "acme"), ("path", "/x")], None),
            ],
            1,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(
        r.statuses[0].limit_remaining, 5,
        "the user limit as it stands, uncharged"
    );
    // The user limit was not charged by the denied request.
    let r = client
        .should_rate_limit(request(vec![(&[("user", "all-or-nothing")], None)], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 4);
}

#[tokio::test]
async fn shadow_mode_never_denies() {
    let server = Server::start(POLICY);
    let mut client = server.grpc_client().await;
    for _ in 0..3 {
        let r = client
            .should_rate_limit(request(vec![(&[("plan", "free")], None)], 1))
            .await
            .unwrap();
        assert_eq!(r.get_ref().overall_code, Code::Ok as i32);
        assert_eq!(r.get_ref().statuses[0].code, Code::Ok as i32);
    }
}

#[tokio::test]
async fn limit_overrides_from_the_request_apply() {
    let server = Server::start(POLICY);
    let mut client = server.grpc_client().await;
    let mut req = request(vec![(&[("user", "vip")], None)], 1);
    req.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 4,
    });
    let r = client
        .should_rate_limit(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (1, 4));
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // A limit of 0 blocks, as in envoyproxy/ratelimit (refused as invalid, Envoy would pass it).
    let mut blocked = request(vec![(&[("user", "zero")], None)], 1);
    blocked.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 0,
        unit: 2,
    });
    let r = client
        .should_rate_limit(blocked)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (0, 2));
    assert_eq!(r.statuses[0].limit_remaining, 0);
}

/// Every malformed request is refused with what was wrong, charges nothing, and is counted in
/// `tollgate_invalid_requests_total` and logged (at most once a second): with Envoy failing
/// open on errors, a caller whose every request is invalid must not look like a quiet limiter.
#[tokio::test]
async fn invalid_requests_are_invalid_argument() {
    let server = Server::start_logged(POLICY, &[]);
    let mut client = server.grpc_client().await;
    let cases = [
        (
            RateLimitRequest {
                domain: String::new(),
                ..request(vec![(&[("user", "a")], None)], 1)
            },
            "domain",
        ),
        (request(vec![], 1), "no descriptors"),
        (
            request(vec![(&[("", "a")], None)], 1),
            "descriptor 0: descriptor entry has an empty key",
        ),
        (
            request(vec![(&[("user", "a")], Some(5_000_000_000))], 1),
            "descriptor 0: hits_addend 5000000000 is above the maximum",
        ),
        // The request's own cost is the request's error, not its first descriptor's.
        (
            request(vec![(&[("user", "a")], None)], 4_000_000_000),
            "hits_addend 4000000000 is above the maximum",
        ),
        // Also when every descriptor has a cost of its own and the request's is not used.
        (
            request(vec![(&[("user", "a")], Some(1))], 4_000_000_000),
            "hits_addend 4000000000 is above the maximum",
        ),
    ];
    for (req, expected) in cases {
        let status = client.should_rate_limit(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(expected), "{}", status.message());
        assert_eq!(
            status.message().starts_with("descriptor"),
            expected.starts_with("descriptor"),
            "{}",
            status.message()
        );
    }
    let r = client
        .should_rate_limit(request(vec![(&[("user", "a")], None)], 1))
        .await
        .unwrap();
    assert_eq!(
        r.get_ref().statuses[0].limit_remaining,
        4,
        "nothing was charged before"
    );
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("tollgate_invalid_requests_total{transport=\"grpc\"} 6\n"),
        "{metrics}"
    );
    assert!(metrics.contains("tollgate_invalid_requests_total{transport=\"http\"} 0\n"));
    let log = server.log();
    assert!(
        log.contains("Invalid request refused") && log.contains("transport=\"grpc\""),
        "{log}"
    );
}

/// What one gRPC client may hold: at most 256 requests in flight per connection by default
/// (HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS`; none was announced, and one connection held
/// 200 000 unfinished streams, 1.8 GB), and messages of at most 256 KiB, decided up to there.
#[tokio::test]
async fn a_grpc_client_is_bounded_in_streams_and_message_size() {
    let server = Server::start(POLICY);
    let tcp = tokio::net::TcpStream::connect(server.grpc).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut announced = usize::MAX;
    for _ in 0..100 {
        announced = client.current_max_send_streams();
        if announced != usize::MAX {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(announced, 256);

    let mut grpc = server.grpc_client().await;
    let with_value = |bytes: usize| {
        let value = "v".repeat(bytes);
        request(vec![(&[("user", value.as_str())], None)], 1)
    };
    let decided = grpc
        .should_rate_limit(with_value(200 * 1024))
        .await
        .unwrap();
    assert_eq!(decided.get_ref().statuses[0].limit_remaining, 4);
    let refused = grpc
        .should_rate_limit(with_value(300 * 1024))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
}

/// Envoy sends a descriptor without entries when a `request_headers` action with
/// `skip_if_absent` finds no header. It matches nothing and is answered `OK` (as by
/// envoyproxy/ratelimit); an error would make Envoy pass the request unlimited on every other
/// descriptor too.
#[tokio::test]
async fn a_descriptor_without_entries_matches_nothing_and_the_others_still_count() {
    let server = Server::start(POLICY);
    let mut client = server.grpc_client().await;
    let mut ask = async || {
        client
            .should_rate_limit(request(vec![(&[], None), (&[("user", "e")], Some(3))], 1))
            .await
            .unwrap()
            .into_inner()
    };
    let r = ask().await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 2);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none(), "no rule matched");
    assert_eq!(r.statuses[1].limit_remaining, 2);
    let r = ask().await;
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "the user's limit holds"
    );
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
}

/// 64 concurrent callers on one key with a limit of 100 get exactly 100 allowed, for every
/// algorithm, through the real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_the_limit_is_admitted_under_concurrency_for_every_algorithm() {
    let mut policy = String::from("domain: race\ndescriptors:\n");
    for algorithm in Algorithm::ALL {
        policy.push_str(&format!(
            "  - key: {algorithm}\n    rate_limit: {{algorithm: {algorithm}, unit: day, requests_per_unit: 100}}\n"
        ));
    }
    let server = Server::start(&policy);
    for algorithm in Algorithm::ALL {
        let allowed = Arc::new(AtomicU64::new(0));
        let mut callers = Vec::new();
        for _ in 0..64 {
            let mut client = server.grpc_client().await;
            let allowed = allowed.clone();
            let key = algorithm.name();
            callers.push(tokio::spawn(async move {
                for _ in 0..4 {
                    let req = RateLimitRequest {
                        domain: "race".into(),
                        descriptors: vec![descriptor(&[(key, "hot")])],
                        hits_addend: 1,
                    };
                    let r = client.should_rate_limit(req).await.unwrap().into_inner();
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
            "{algorithm}: 256 requests, limit 100"
        );
    }
}

/// The standard gRPC health service answers on the RLS port, as Envoy's gRPC health checks and
/// Kubernetes' `grpc` probes expect; on SIGTERM a watcher is told `NOT_SERVING` and its stream
/// ends, so it does not hold up the shutdown.
// Several threads: the client's connection must answer the server's goodbye while this test's
// thread waits for the exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_health_service_serves_until_shutdown() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let server = Server::start(POLICY);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let ask = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    // `ratelimit`: the name envoyproxy/ratelimit's health checks and probes ask for.
    for service in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "ratelimit",
    ] {
        let r = health.check(ask(service)).await.unwrap().into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "`{service}`");
    }
    let unknown = health.check(ask("no.such.Service")).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    let mut watch = health.watch(ask("")).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
    server.signal("TERM");
    let last = watch.message().await.unwrap().unwrap();
    assert_eq!(last.status(), ServingStatus::NotServing);
    assert!(watch.message().await.unwrap().is_none(), "the stream ends");
    // A complete drain: status 0.
    let status = server.exited();
    assert!(status.success(), "exit status {status:?}");
}

/// The HTTP/2 connection preface and an empty SETTINGS frame: a gRPC caller's first bytes.
const HTTP2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// A gRPC caller that opens an HTTP/2 connection and goes silent never acknowledges the
/// server's goodbye: on SIGTERM the server waits for it `--shutdown-timeout`, then closes it and
/// exits, instead of waiting forever; with status 3, since the drain was cut. (Half an HTTP
/// request no longer holds the shutdown: see `half_a_request_does_not_hold_the_shutdown` in
/// e2e_http.rs.)
#[tokio::test]
async fn silent_connections_hold_the_shutdown_for_its_timeout_only() {
    let server = Server::start_with_args(POLICY, &["--shutdown-timeout", "1500ms"]);
    let mut h2 = support::silent_client(server.grpc, HTTP2_HELLO);
    // Served, not still in the accept queue (a busy machine may take a while): the server's
    // SETTINGS frame came back.
    h2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::io::Read::read_exact(&mut h2, &mut [0u8; 9]).unwrap();
    let began = tokio::time::Instant::now();
    let status = server.stop();
    let took = began.elapsed();
    assert_eq!(status.code(), Some(3), "exit status {status:?}");
    assert!(
        took >= Duration::from_millis(1500),
        "the drain waited for the silent caller: {took:?}"
    );
}

/// A second SIGTERM ends the drain at once, whatever the timeout; the drain was cut, so the
/// exit status is 3.
#[tokio::test]
async fn a_second_signal_stops_without_waiting_for_the_drain() {
    let server = Server::start_with_args(POLICY, &["--shutdown-timeout", "1h"]);
    let mut h2 = support::silent_client(server.grpc, HTTP2_HELLO);
    // Served, not still in the accept queue: the server's SETTINGS frame came back.
    h2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::io::Read::read_exact(&mut h2, &mut [0u8; 9]).unwrap();
    server.begin_shutdown().await;
    let status = server.stop();
    assert_eq!(status.code(), Some(3), "exit status {status:?}");
}

/// `--grpc-tls-cert`/`--grpc-tls-key` serve gRPC over TLS, and `--grpc-tls-client-ca` asks every
/// client for a certificate that CA signed: a client that trusts the server's CA and presents
/// one is answered; one without a certificate, or speaking plaintext, is refused and counts
/// nothing.
#[tokio::test]
async fn grpc_over_mutual_tls_answers_only_clients_with_a_certificate() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let dir = tempfile::tempdir().unwrap();
    let certs = support::certificates(dir.path());
    let server = Server::start_with_args(POLICY, &certs.serve_args(true));
    let pem = |p: &std::path::Path| std::fs::read(p).unwrap();
    let trusting = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem(&certs.ca)));
    let with_certificate = trusting.clone().identity(Identity::from_pem(
        pem(&certs.client_cert),
        pem(&certs.client_key),
    ));
    let ask = async |scheme: &str, tls: Option<ClientTlsConfig>| {
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", server.grpc)).unwrap();
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls).unwrap();
        }
        let channel = endpoint.connect_lazy();
        RateLimitServiceClient::new(channel)
            .should_rate_limit(request(vec![(&[("user", "tls")], None)], 1))
            .await
    };
    let remaining =
        |r: tonic::Response<RateLimitResponse>| r.into_inner().statuses[0].limit_remaining;

    let first = ask("https", Some(with_certificate.clone())).await.unwrap();
    assert_eq!(remaining(first), 4);
    // Refused in the handshake (or, over TLS 1.3, right after it): a transport error.
    let no_certificate = ask("https", Some(trusting)).await;
    assert!(no_certificate.is_err(), "{no_certificate:?}");
    let plaintext = ask("http", None).await;
    assert!(plaintext.is_err(), "{plaintext:?}");
    let again = ask("https", Some(with_certificate)).await.unwrap();
    assert_eq!(remaining(again), 3, "the refused calls counted nothing");
    // The TLS files' watcher is supervised too.
    assert_eq!(
        support::supervised_tasks(&server.metrics().await),
        [
            "counter_sweep",
            "dashboard_sampler",
            "grpc_tls_watcher",
            "policy_watcher"
        ]
    );
}

/// Over TLS too, a client that completes its handshake and then sends nothing is disconnected
/// after `--grpc-keepalive-timeout` (the handshake's bytes are not HTTP/2's preface).
#[test]
fn a_silent_client_after_its_tls_handshake_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let certs = support::certificates(dir.path());
    let mut args = certs.serve_args(false);
    args.extend(["--grpc-keepalive-timeout", "300ms"]);
    let server = Server::start_with_args(POLICY, &args);
    // Completes the handshake, then waits on its standard input, which never comes; it exits
    // when the server closes the connection.
    let mut client = std::process::Command::new("openssl")
        .args(["s_client", "-alpn", "h2", "-verify_return_error", "-CAfile"])
        .arg(&certs.ca)
        .args(["-connect", &server.grpc.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut exited = None;
    for _ in 0..50 {
        exited = client.try_wait().unwrap();
        if exited.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = client.kill();
    let output = client.wait_with_output().unwrap();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(
        shown.contains("ALPN protocol: h2"),
        "handshake done: {shown}"
    );
    assert!(exited.is_some(), "closed within 5 s");
}

/// The TLS files are checked every `--watch-interval`: a renewed certificate (here signed by
/// another CA) is served to new connections without a restart, and files that do not load
/// leave the certificate in use serving.
#[tokio::test]
async fn a_renewed_grpc_certificate_is_served_without_a_restart() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    let dir = tempfile::tempdir().unwrap();
    let made = |name: &str| {
        let at = dir.path().join(name);
        std::fs::create_dir(&at).unwrap();
        support::certificates(&at)
    };
    let (first, second) = (made("first"), made("second"));
    let (cert, key) = (dir.path().join("tls.pem"), dir.path().join("tls.key"));
    let install = |from: &support::Certificates| {
        std::fs::copy(&from.cert, &cert).unwrap();
        std::fs::copy(&from.key, &key).unwrap();
    };
    install(&first);
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let server = Server::start_with_args(
        POLICY,
        &[
            "--grpc-tls-cert",
            &path(&cert),
            "--grpc-tls-key",
            &path(&key),
            "--watch-interval",
            "100ms",
        ],
    );
    // A new connection for each call, trusting `ca` only.
    let answered = async |ca: &std::path::Path| {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()))
            .domain_name("127.0.0.1");
        let endpoint = Endpoint::from_shared(format!("https://{}", server.grpc))
            .unwrap()
            .tls_config(tls)
            .unwrap();
        let Ok(channel) = endpoint.connect().await else {
            return false;
        };
        RateLimitServiceClient::new(channel)
            .should_rate_limit(request(vec![(&[("user", "renewed")], None)], 1))
            .await
            .is_ok()
    };
    assert!(answered(&first.ca).await);
    assert!(!answered(&second.ca).await);

    install(&second);
    support::eventually(
        Duration::from_secs(10),
        "the renewed certificate",
        async || answered(&second.ca).await,
    )
    .await;
    assert!(
        !answered(&first.ca).await,
        "the old one is no longer served"
    );

    // A key that is not the certificate's: refused, and the renewed pair still serves.
    std::fs::copy(&first.key, &key).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(answered(&second.ca).await);
}

/// `date -u` at `seconds` from the epoch in `format`.
fn utc(seconds: i64, format: &str) -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "-d", &format!("@{seconds}"), &format!("+{format}")])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A served gRPC certificate that has expired is a warning at the start, naming when, and so is
/// one that expires while served (once, not at every check of the files). Clients refuse such
/// a certificate; the log is where an operator looks first.
#[test]
fn an_expired_grpc_certificate_is_logged_at_the_start_and_when_it_expires() {
    let dir = tempfile::tempdir().unwrap();
    let made = support::certificates(dir.path());
    let (key, expired, expiring) = (
        made.key.to_str().unwrap(),
        dir.path().join("expired.pem"),
        dir.path().join("expiring.pem"),
    );
    let warning = "The gRPC TLS certificate chain served expired at";
    // Dates before the epoch are dates too.
    for (not_before, not_after, expected) in [
        ("200101000000Z", "200102000000Z", "2020-01-02T00:00:00Z"),
        ("19600101000000Z", "19691231235959Z", "1969-12-31T23:59:59Z"),
    ] {
        made.server_cert_valid(not_before, not_after, &expired);
        let tls = [
            "--grpc-tls-cert",
            expired.to_str().unwrap(),
            "--grpc-tls-key",
            key,
        ];
        let log = Server::start_logged(POLICY, &tls).log();
        assert!(log.contains(&format!("{warning} {expected}")), "{log}");
    }

    // Valid for 3 more seconds: nothing at the start, one warning once it has expired.
    let now = std::process::Command::new("date")
        .arg("+%s")
        .output()
        .unwrap();
    let until = String::from_utf8(now.stdout)
        .unwrap()
        .trim()
        .parse::<i64>()
        .unwrap()
        + 3;
    made.server_cert_valid("200101000000Z", &utc(until, "%y%m%d%H%M%SZ"), &expiring);
    let server = Server::start_logged(
        POLICY,
        &[
            "--grpc-tls-cert",
            expiring.to_str().unwrap(),
            "--grpc-tls-key",
            key,
            "--watch-interval",
            "100ms",
        ],
    );
    assert!(!server.log().contains(warning), "{}", server.log());
    let expected = format!("{warning} {}", utc(until, "%Y-%m-%dT%H:%M:%SZ"));
    let began = tokio::time::Instant::now();
    while !server.log().contains(&expected) {
        assert!(
            began.elapsed() < Duration::from_secs(15),
            "{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(server.log().matches(warning).count(), 1, "{}", server.log());
}

/// A TLS file that is missing, holds no PEM block of the right kind, a key that is not the
/// certificate's, or an encrypted key stops `serve` before it listens, naming the flag.
#[test]
fn unusable_grpc_tls_files_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let certs = support::certificates(dir.path());
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let other_key = dir.path().join("client.key");
    let missing = dir.path().join("missing.pem");
    let encrypted = dir.path().join("encrypted.key");
    let made = std::process::Command::new("openssl")
        .args(["pkcs8", "-topk8", "-passout", "pass:secret", "-in"])
        .arg(&certs.key)
        .arg("-out")
        .arg(&encrypted)
        .status()
        .unwrap();
    assert!(made.success());
    let cases = [
        (&missing, &certs.key, "--grpc-tls-cert: cannot read"),
        (&certs.cert, &certs.ca, "--grpc-tls-key: "),
        (&certs.cert, &other_key, "do not make a TLS identity"),
        (
            &certs.cert,
            &encrypted,
            "is encrypted; give the key unencrypted",
        ),
    ];
    for (cert, key, expected) in cases {
        let (code, stderr) = support::serve_refused(&[
            "--config",
            policy.to_str().unwrap(),
            "--grpc-tls-cert",
            cert.to_str().unwrap(),
            "--grpc-tls-key",
            key.to_str().unwrap(),
        ]);
        assert_ne!(code, Some(0), "{stderr}");
        assert!(
            stderr.contains(expected),
            "expected `{expected}` in: {stderr}"
        );
    }
}

/// A client that connects and then never answers (it vanished behind a partition, or a NAT
/// forgot the connection) is pinged after `--grpc-keepalive` and disconnected when the ping
/// goes unanswered for `--grpc-keepalive-timeout`; with the pings off it is kept.
#[test]
fn a_silent_grpc_connection_is_closed_after_an_unanswered_ping() {
    let pinging = Server::start_with_args(
        POLICY,
        &[
            "--grpc-keepalive",
            "300ms",
            "--grpc-keepalive-timeout",
            "300ms",
        ],
    );
    let mut silent = support::silent_client(pinging.grpc, HTTP2_HELLO);
    assert!(support::closed_within(&mut silent, Duration::from_secs(5)));

    let quiet = Server::start_with_args(POLICY, &["--grpc-keepalive", "0s"]);
    let mut silent = support::silent_client(quiet.grpc, HTTP2_HELLO);
    assert!(!support::closed_within(
        &mut silent,
        Duration::from_millis(1500)
    ));
}

/// A client that connects and sends nothing, or only part of HTTP/2's preface (which
/// keepalive pings wait for), is disconnected after `--grpc-keepalive-timeout`; one that sent
/// its preface is not held to it.
#[test]
fn a_grpc_connection_that_sends_nothing_is_closed() {
    let server = Server::start_with_args(POLICY, &["--grpc-keepalive-timeout", "300ms"]);
    let mut mute = support::silent_client(server.grpc, b"");
    assert!(support::closed_within(&mut mute, Duration::from_secs(5)));
    let mut halting = support::silent_client(server.grpc, &HTTP2_HELLO[..16]);
    assert!(support::closed_within(&mut halting, Duration::from_secs(5)));
    let mut greeted = support::silent_client(server.grpc, HTTP2_HELLO);
    assert!(!support::closed_within(
        &mut greeted,
        Duration::from_millis(1500)
    ));
}

/// upstream's test/config/metadata.yaml with `RESPONSE_DYNAMIC_METADATA`'s answer: the
/// request echoed, and the `metadata` of the limits that admitted merged (none of a denial).
/// Without `--rls-dynamic-metadata` (the default), no `dynamic_metadata` at all.
#[tokio::test]
async fn descriptor_metadata_comes_back_as_dynamic_metadata_when_enabled() {
    use envoy_types::pb::google::protobuf::value::Kind;
    use envoy_types::pb::google::protobuf::{Struct, Value};
    const METADATA: &str = r#"
domain: edge
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: service_1
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota:
        name: service_2
"#;
    let ask = || {
        let mut r = request(
            vec![
                (&[("key1", "value1"), ("subkey1", "x")], Some(2)),
                (&[("key2", "k")], None),
            ],
            0,
        );
        r.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
        r
    };
    let field = |s: &Struct, name: &str| s.fields.get(name).cloned().and_then(|v| v.kind);
    let text = |v: &Value| match &v.kind {
        Some(Kind::StringValue(s)) => s.clone(),
        other => panic!("not a string: {other:?}"),
    };

    let off = Server::start(METADATA);
    let r = off
        .grpc_client()
        .await
        .should_rate_limit(ask())
        .await
        .unwrap();
    assert!(r.into_inner().dynamic_metadata.is_none(), "off by default");

    let server = Server::start_with_args(METADATA, &["--rls-dynamic-metadata"]);
    let mut client = server.grpc_client().await;
    let first = client.should_rate_limit(ask()).await.unwrap().into_inner();
    assert_eq!(first.overall_code, Code::Ok as i32);
    let m = first.dynamic_metadata.unwrap();
    assert_eq!(field(&m, "domain"), Some(Kind::StringValue("edge".into())));
    assert!(
        field(&m, "hitsAddend").is_none(),
        "a request hits_addend of 0 is left out"
    );
    let Some(Kind::ListValue(descriptors)) = field(&m, "descriptors") else {
        panic!("{m:?}")
    };
    let Some(Kind::StructValue(d0)) = descriptors.values[0].kind.clone() else {
        panic!("{descriptors:?}")
    };
    let Some(Kind::ListValue(entries)) = field(&d0, "entries") else {
        panic!("{d0:?}")
    };
    let entries: Vec<String> = entries.values.iter().map(text).collect();
    assert_eq!(entries, ["key1=value1", "subkey1=x"]);
    assert_eq!(field(&d0, "hitsAddend"), Some(Kind::NumberValue(2.0)));
    let Some(Kind::StructValue(passed)) = field(&m, "metadata") else {
        panic!("{m:?}")
    };
    assert_eq!(
        field(&passed, "name"),
        Some(Kind::StringValue("service_1".into()))
    );
    let Some(Kind::StructValue(quota)) = field(&passed, "service_with_quota") else {
        panic!("{passed:?}")
    };
    assert_eq!(
        field(&quota, "name"),
        Some(Kind::StringValue("service_2".into()))
    );

    // key2 allows 1 a minute: now over, so only the first descriptor's metadata comes back.
    let second = client.should_rate_limit(ask()).await.unwrap().into_inner();
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    let m = second.dynamic_metadata.unwrap();
    let Some(Kind::StructValue(passed)) = field(&m, "metadata") else {
        panic!("{m:?}")
    };
    assert_eq!(passed.fields.len(), 1, "{passed:?}");
    assert!(passed.fields.contains_key("name"));
}
