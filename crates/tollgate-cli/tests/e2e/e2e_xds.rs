//! The xDS config source against a real management server (`support::ads`, ADS state of the
//! world over gRPC on a loopback port): pushes applied and ACKed, an invalid one NACKed with
//! its reason while the policy stays, a restart of the server, mTLS, and the admin API's 409.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::value::Kind;
use support::ads::Ads;
use support::{Server, descriptor};
use tollgate_server::xds::proto::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// A key-only descriptor allowing `n` a day (a window no test run crosses, in practice).
fn limit(key: &str, n: u32) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        rate_limit: Some(RateLimitPolicy {
            unit: RateLimitUnit::Day as i32,
            requests_per_unit: n,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The limits of domain `api`.
fn config(descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
    RateLimitConfig {
        name: "api-limits".into(),
        domain: "api".into(),
        descriptors,
    }
}

/// `POST /v1/check` of `key=value` in domain `api`: the status.
async fn status(server: &Server, key: &str, value: &str) -> u16 {
    server.check(key, value).await.status().as_u16()
}

async fn text(url: String) -> (u16, String) {
    let response = reqwest::get(url).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// Starts `serve` with `args` off the test's runtime (it blocks until the server listens).
async fn serve(args: Vec<String>) -> Server {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Server::start_sourced(&args)
    })
    .await
    .unwrap()
}

fn source_args(ads: &Ads) -> Vec<String> {
    let args = [
        "--config-source",
        &format!("xds://{}", ads.addr),
        "--xds-backoff-initial",
        "100ms",
        "--xds-backoff-max",
        "400ms",
    ];
    args.iter().map(|a| a.to_string()).collect()
}

/// Before the first push the empty policy allows everything and `/readyz` says so; a push is
/// applied and ACKed; a change keeps the unchanged rule's counter and applies the new limit;
/// an invalid push is NACKed with its reason and the policy stays; while the management server
/// is down the last policy stays in force, and the client reconnects carrying its version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_pushes_are_applied_acked_or_nacked_and_survive_a_server_restart() {
    let ads = Ads::start("127.0.0.1:0".parse().unwrap(), None).await;
    let mut args = source_args(&ads);
    args.extend(
        [
            "--force-start-without-initial-config",
            "--xds-node-id",
            "rl-node",
            "--xds-node-metadata",
            "zone=a,team=edge",
            "--xds-headers",
            "x-token=abc",
        ]
        .map(String::from),
    );
    let server = serve(args).await;

    let (code, body) = text(server.url("/readyz")).await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.starts_with("ready (no xDS configuration yet)"),
        "{body}"
    );
    assert_eq!(
        status(&server, "user", "a").await,
        200,
        "unmatched: allowed"
    );
    let (code, _) = text(server.url("/healthcheck")).await;
    assert_eq!(code, 200);

    // The subscription, as envoyproxy/ratelimit's client sends it.
    let subscription = ads.subscription().await;
    let request = &subscription.request;
    assert_eq!(
        request.type_url,
        "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
    );
    assert_eq!(request.version_info, "");
    let node = request.node.as_ref().unwrap();
    assert_eq!(node.id, "rl-node");
    let zone = node.metadata.as_ref().unwrap().fields.get("zone").unwrap();
    assert_eq!(zone.kind, Some(Kind::StringValue("a".into())));
    assert_eq!(subscription.headers.get("x-token").unwrap(), "abc");

    ads.push(
        "1",
        "n1",
        &[config(vec![limit("user", 2), limit("other", 100)])],
    );
    let ack = ads.reply_to("n1").await;
    assert_eq!((ack.version_info.as_str(), ack.error_detail), ("1", None));
    let (_, body) = text(server.url("/readyz")).await;
    assert!(body.starts_with("ready\n"), "{body}");
    assert!(
        body.contains("policy source: xDS, configuration received"),
        "{body}"
    );
    assert_eq!(status(&server, "user", "a").await, 200);
    assert_eq!(status(&server, "user", "a").await, 200);
    assert_eq!(
        status(&server, "user", "a").await,
        429,
        "limit 2 from the push"
    );

    // The admin API no longer writes the policy; it still shows the versions.
    let push = serde_json::json!({"sources": [{"name": "p.yaml", "text": "domain: api\ndescriptors: []\n"}]});
    for (method, path, body) in [
        (reqwest::Method::POST, "/v1/admin/policy", push.clone()),
        (
            reqwest::Method::POST,
            "/v1/admin/policy/rollback",
            serde_json::json!({}),
        ),
        (reqwest::Method::POST, "/v1/admin/policy/candidate", push),
        (
            reqwest::Method::POST,
            "/v1/admin/reload",
            serde_json::json!({}),
        ),
    ] {
        let response = server.admin_send(method, path, &body).await;
        assert_eq!(response.status().as_u16(), 409, "{path}");
        let text = response.text().await.unwrap();
        assert!(text.contains("policy is managed by xDS"), "{path}: {text}");
    }
    let versions = server.admin_json("/v1/admin/policy").await;
    let origins: Vec<_> = versions["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["origin"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(origins, ["xds", "xds"], "{versions}");
    assert_eq!(versions["current"], 2);

    // A change: `other` tightened, `user` unchanged (its counter kept).
    ads.push(
        "2",
        "n2",
        &[config(vec![limit("user", 2), limit("other", 1)])],
    );
    let ack = ads.reply_to("n2").await;
    assert_eq!((ack.version_info.as_str(), ack.error_detail), ("2", None));
    assert_eq!(
        status(&server, "user", "a").await,
        429,
        "the counter was kept"
    );
    assert_eq!(status(&server, "other", "x").await, 200);
    assert_eq!(status(&server, "other", "x").await, 429, "the new limit");

    // An invalid push: NACKed as a whole with the reason, the last accepted version kept.
    let mut unitless = limit("other", 50);
    unitless.rate_limit.as_mut().unwrap().unit = RateLimitUnit::Unknown as i32;
    ads.push("3", "n3", &[config(vec![limit("user", 100), unitless])]);
    let nack = ads.reply_to("n3").await;
    assert_eq!(
        nack.version_info, "2",
        "a NACK carries the last accepted version"
    );
    let reason = nack.error_detail.expect("a NACK has error_detail").message;
    assert!(reason.contains("UNKNOWN"), "{reason}");
    assert_eq!(
        status(&server, "user", "a").await,
        429,
        "the running policy stayed"
    );
    assert_eq!(status(&server, "other", "y").await, 200);
    assert_eq!(status(&server, "other", "y").await, 429);

    // The management server goes away: the last policy stays in force meanwhile.
    let addr = ads.addr;
    ads.stop().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(status(&server, "user", "a").await, 429);
    assert_eq!(status(&server, "other", "z").await, 200);
    assert_eq!(status(&server, "other", "z").await, 429);

    // Back on the same port: the client subscribes again with the version it runs.
    let ads = Ads::start(addr, None).await;
    let again = ads.subscription().await;
    assert_eq!(again.request.version_info, "2");
    ads.push(
        "4",
        "n4",
        &[config(vec![
            limit("user", 2),
            limit("other", 1),
            limit("fresh", 1),
        ])],
    );
    let ack = ads.reply_to("n4").await;
    assert_eq!((ack.version_info.as_str(), ack.error_detail), ("4", None));
    assert_eq!(status(&server, "fresh", "f").await, 200);
    assert_eq!(status(&server, "fresh", "f").await, 429);
    assert_eq!(status(&server, "user", "a").await, 429, "still counted");
    let log = server.log();
    assert!(
        log.contains("the last accepted policy stays in force"),
        "{log}"
    );
    ads.stop().await;
}

/// Over mutual TLS with certificates made by `openssl`: without
/// `--force-start-without-initial-config`, `serve` listens once the first push is applied, and
/// that push limits over gRPC; a client without a certificate gets no stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_over_mutual_tls_applies_the_first_push_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    let certs = support::certificates(dir.path());
    let pem = |p: &std::path::Path| std::fs::read(p).unwrap();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(pem(&certs.cert), pem(&certs.key)))
        .client_ca_root(Certificate::from_pem(pem(&certs.ca)));
    let ads = Ads::start("127.0.0.1:0".parse().unwrap(), Some(tls)).await;
    ads.push("v1", "n1", &[config(vec![limit("user", 1)])]);
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let tls_args = |cert: bool| {
        let mut args = source_args(&ads);
        args.extend(["--xds-tls".into(), "--xds-ca-file".into(), path(&certs.ca)]);
        args.extend(["--xds-server-name".into(), "127.0.0.1".into()]);
        if cert {
            args.extend(["--xds-cert-file".into(), path(&certs.client_cert)]);
            args.extend(["--xds-key-file".into(), path(&certs.client_key)]);
        }
        args
    };

    let server = serve(tls_args(true)).await;
    let (_, body) = text(server.url("/readyz")).await;
    assert!(
        body.starts_with("ready\n"),
        "listening only once the push runs: {body}"
    );
    let ack = ads.reply_to("n1").await;
    assert_eq!((ack.version_info.as_str(), ack.error_detail), ("v1", None));
    let mut client = server.grpc_client().await;
    let request = RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![descriptor(&[("user", "a")])],
        hits_addend: 1,
    };
    let first = client.should_rate_limit(request.clone()).await.unwrap();
    assert_eq!(first.get_ref().overall_code, Code::Ok as i32);
    let second = client.should_rate_limit(request).await.unwrap();
    assert_eq!(second.get_ref().overall_code, Code::OverLimit as i32);

    let before = ads.seen().len();
    let mut args = tls_args(false);
    args.push("--force-start-without-initial-config".into());
    let anonymous = serve(args).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        ads.seen().len(),
        before,
        "no stream without a client certificate"
    );
    let (_, body) = text(anonymous.url("/readyz")).await;
    assert!(
        body.starts_with("ready (no xDS configuration yet)"),
        "{body}"
    );
    assert!(
        anonymous
            .log()
            .contains("xDS: no stream to the management server"),
        "{}",
        anonymous.log()
    );
    ads.stop().await;
}

/// Settings that cannot work stop the start with exit 2, naming what is wrong: a source that
/// is not `xds://HOST:PORT`, a client certificate without its key, a CA file that cannot be
/// read, a malformed header list; and `serve` needs `--config` or `--config-source`.
#[test]
fn xds_settings_that_cannot_work_stop_the_start() {
    let source = ["--config-source", "xds://127.0.0.1:1"];
    let cases: [(Vec<&str>, &str); 5] = [
        (
            vec!["--config-source", "http://cp:18000"],
            "is not a config source such as xds://HOST:PORT",
        ),
        (
            [&source[..], &["--xds-tls", "--xds-cert-file", "c.pem"]].concat(),
            "--xds-cert-file and --xds-key-file go together",
        ),
        (
            [
                &source[..],
                &["--xds-tls", "--xds-ca-file", "/nonexistent/ca.pem"],
            ]
            .concat(),
            "cannot read --xds-ca-file /nonexistent/ca.pem",
        ),
        (
            [&source[..], &["--xds-headers", "x-token"]].concat(),
            "`x-token` in --xds-headers is not KEY=VALUE",
        ),
        (vec![], "--config"),
    ];
    for (args, expected) in cases {
        let (code, stderr) = support::serve_refused(&args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
