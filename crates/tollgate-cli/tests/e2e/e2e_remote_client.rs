//! `tollgate-client`'s remote client against the real binary, directly and under the layer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use support::Server;
use tollgate::limiter::{CheckRequest, RequestDescriptor};
use tollgate_client::{Backend, Descriptors, Outcome, Posture, RateLimitLayer, Remote, RemoteGrpc};
use tower::ServiceExt;

const POLICY: &str = "
domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: hour, requests_per_unit: 2}
";

fn request(user: &str) -> CheckRequest {
    let d = RequestDescriptor::new(vec![("user".into(), user.into())], 1, None).unwrap();
    CheckRequest::new("api".into(), vec![d]).unwrap()
}

#[tokio::test]
async fn remote_client_is_allowed_then_denied() {
    let server = Server::start(POLICY);
    let remote = Remote::http(&server.url(""), Duration::from_secs(2), Posture::Closed).unwrap();
    for remaining in ["1", "0"] {
        let verdict = remote.check(&request("alice")).await.unwrap();
        assert_eq!(verdict.outcome, Outcome::Allowed);
        assert_eq!(verdict.header("x-ratelimit-limit"), Some("2"));
        assert_eq!(verdict.header("x-ratelimit-remaining"), Some(remaining));
        assert!(verdict.header("x-tollgate-degraded").is_none());
    }
    let denied = remote.check(&request("alice")).await.unwrap();
    assert_eq!(denied.outcome, Outcome::Limited);
    assert_eq!(denied.limit_name.as_deref(), Some("per_user"));
    assert!(denied.header("retry-after").is_some());
    // Another user has its own quota.
    let bob = remote.check(&request("bob")).await.unwrap();
    assert_eq!(bob.outcome, Outcome::Allowed);
}

#[tokio::test]
async fn layer_over_the_remote_client() {
    let server = Server::start(POLICY);
    let remote = Remote::http(&server.url(""), Duration::from_secs(2), Posture::Closed).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(
            remote,
            Descriptors::new("api").header("x-user", "user"),
        ));
    let get = || {
        http::Request::get("/")
            .header("x-user", "carol")
            .body(Body::empty())
            .unwrap()
    };
    for remaining in ["1", "0"] {
        let response = app.clone().oneshot(get()).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-ratelimit-remaining"], remaining);
    }
    let denied = app.oneshot(get()).await.unwrap();
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.headers()["content-type"], "application/problem+json");
    assert!(denied.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn grpc_remote_client_is_allowed_then_denied() {
    let server = Server::start(POLICY);
    let url = format!("http://{}", server.grpc);
    let remote = RemoteGrpc::new(&url, Duration::from_secs(2), Posture::Closed).unwrap();
    for remaining in ["1", "0"] {
        let verdict = remote.check(&request("dora")).await.unwrap();
        assert_eq!(verdict.outcome, Outcome::Allowed);
        assert_eq!(verdict.header("x-ratelimit-remaining"), Some(remaining));
    }
    let denied = remote.check(&request("dora")).await.unwrap();
    assert_eq!(denied.outcome, Outcome::Limited);
    assert_eq!(denied.limit_name.as_deref(), Some("per_user"));
    assert!(denied.header("retry-after").is_some());
}

#[tokio::test]
async fn grpc_remote_client_takes_its_posture_when_nobody_answers() {
    // Accepts connections, never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    for (posture, outcome) in [
        (Posture::Open, Outcome::Allowed),
        (Posture::Closed, Outcome::Unavailable),
    ] {
        let remote = RemoteGrpc::new(&url, Duration::from_millis(300), posture).unwrap();
        let started = tokio::time::Instant::now();
        let verdict = remote.check(&request("erin")).await.unwrap();
        let waited = started.elapsed();
        assert_eq!(verdict.outcome, outcome);
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_millis(900),
            "{waited:?}"
        );
    }
}

/// Over `https://` the gRPC client verifies the service's certificate: `with_tls` against a
/// given CA, presenting the client certificate a service started with `--grpc-tls-client-ca`
/// asks for; without one the service refuses the call, and the posture answers.
#[tokio::test]
async fn grpc_remote_client_over_mutual_tls() {
    use tollgate_client::tls::{Certificate, ClientTlsConfig, Identity};
    let dir = tempfile::tempdir().unwrap();
    let certs = support::certificates(dir.path());
    let server = Server::start_with_args(POLICY, &certs.serve_args(true));
    let url = format!("https://{}", server.grpc);
    let pem = |p: &std::path::Path| std::fs::read(p).unwrap();
    let trusting = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem(&certs.ca)));
    let identified = trusting.clone().identity(Identity::from_pem(
        pem(&certs.client_cert),
        pem(&certs.client_key),
    ));
    let timeout = Duration::from_secs(2);
    let with = |tls| RemoteGrpc::with_tls(&url, tls, timeout, Posture::Closed).unwrap();
    // TLS settings with a plaintext URL would be ignored: refused instead.
    let plaintext = format!("http://{}", server.grpc);
    let refused = RemoteGrpc::with_tls(&plaintext, trusting.clone(), timeout, Posture::Closed);
    assert!(refused.is_err(), "{refused:?}");

    let first = with(identified.clone())
        .check(&request("fay"))
        .await
        .unwrap();
    assert_eq!(first.outcome, Outcome::Allowed);
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));
    let refused = with(trusting).check(&request("fay")).await.unwrap();
    assert_eq!(refused.outcome, Outcome::Unavailable);
    let last = with(identified).check(&request("fay")).await.unwrap();
    assert_eq!(last.outcome, Outcome::Allowed);
    assert_eq!(
        last.header("x-ratelimit-remaining"),
        Some("0"),
        "the refused call counted nothing"
    );
}

/// `RemoteGrpc::new` with an `https://` URL is never answered by a service whose certificate
/// the system's roots do not vouch for (here one the test CA signed): its posture answers.
#[tokio::test]
async fn grpc_remote_client_refuses_a_certificate_it_cannot_verify() {
    let dir = tempfile::tempdir().unwrap();
    let certs = support::certificates(dir.path());
    let server = Server::start_with_args(POLICY, &certs.serve_args(false));
    let url = format!("https://{}", server.grpc);
    let remote = RemoteGrpc::new(&url, Duration::from_secs(2), Posture::Closed).unwrap();
    let verdict = remote.check(&request("gus")).await.unwrap();
    assert_eq!(verdict.outcome, Outcome::Unavailable);
}

/// Set in the copy of this test binary that
/// `grpc_remote_client_trusts_the_roots_ssl_cert_file_names` runs: the service's URL.
const HTTPS_URL: &str = "TOLLGATE_TEST_HTTPS_URL";

/// `RemoteGrpc::new` with an `https://` URL is answered when the roots it reads vouch for the
/// service: here the test CA, named by `SSL_CERT_FILE`. The environment is read once per
/// process and cannot be set in-process, so the test runs itself again, in a copy of this
/// binary with `SSL_CERT_FILE` set, and that copy makes the calls.
#[tokio::test]
async fn grpc_remote_client_trusts_the_roots_ssl_cert_file_names() {
    const NAME: &str = "grpc_remote_client_trusts_the_roots_ssl_cert_file_names";
    const DONE: &str = "two calls answered over https";
    if let Ok(url) = std::env::var(HTTPS_URL) {
        let remote = RemoteGrpc::new(&url, Duration::from_secs(2), Posture::Closed).unwrap();
        for remaining in ["1", "0"] {
            let verdict = remote.check(&request("hal")).await.unwrap();
            assert_eq!(verdict.outcome, Outcome::Allowed, "{verdict:?}");
            assert_eq!(verdict.header("x-ratelimit-remaining"), Some(remaining));
        }
        println!("{DONE}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let certs = support::certificates(dir.path());
    let server = Server::start_with_args(POLICY, &certs.serve_args(false));
    // Named as the test harness names it: its module path within the test binary.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let exact = format!("{module}::{NAME}");
    let copy = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &exact, "--nocapture"])
        .env(HTTPS_URL, format!("https://{}", server.grpc))
        .env("SSL_CERT_FILE", &certs.ca)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&copy.stdout);
    assert!(copy.status.success(), "{copy:?}");
    assert!(
        stdout.contains(DONE),
        "the copy did not run the test: {stdout}"
    );
}

/// A request larger than the service takes (its body limit) is refused as invalid, not
/// answered by the caller's posture: the service is there, and `Open` would let it through.
#[tokio::test]
async fn a_request_too_large_for_the_service_is_invalid_not_a_posture() {
    let server = Server::start(POLICY);
    let remote = Remote::http(&server.url(""), Duration::from_secs(2), Posture::Open).unwrap();
    let value = "v".repeat(1000);
    let descriptors = (0..64)
        .map(|n| {
            let entries = (0..32)
                .map(|e| (format!("k{n}-{e}"), value.clone()))
                .collect();
            RequestDescriptor::new(entries, 1, None).unwrap()
        })
        .collect();
    let huge = CheckRequest::new("api".into(), descriptors).unwrap();
    let answer = remote.check(&huge).await;
    assert!(
        matches!(&answer, Err(tollgate_client::BackendError::Invalid(why)) if why.contains("larger")),
        "{answer:?}"
    );
}

/// A check (cost 0) sent by either remote client counts nothing, and is refused once no unit
/// is left: the HTTP client sends it as a descriptor's `hits_addend: 0`, the gRPC client as an
/// empty `UInt64Value`.
#[tokio::test]
async fn remote_clients_send_checks_that_count_nothing() {
    let server = Server::start(POLICY);
    let grpc_url = format!("http://{}", server.grpc);
    let http = Remote::http(&server.url(""), Duration::from_secs(2), Posture::Closed).unwrap();
    let grpc = RemoteGrpc::new(&grpc_url, Duration::from_secs(2), Posture::Closed).unwrap();
    let check = request("frank").with_cost(0).unwrap();
    for _ in 0..2 {
        for verdict in [http.check(&check).await, grpc.check(&check).await] {
            let verdict = verdict.unwrap();
            assert_eq!(verdict.outcome, Outcome::Allowed);
            assert_eq!(verdict.header("x-ratelimit-remaining"), Some("2"));
        }
    }
    http.check(&request("frank").with_cost(2).unwrap())
        .await
        .unwrap();
    for verdict in [http.check(&check).await, grpc.check(&check).await] {
        assert_eq!(verdict.unwrap().outcome, Outcome::Limited);
    }
}
