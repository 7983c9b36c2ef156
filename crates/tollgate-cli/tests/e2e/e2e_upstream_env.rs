//! The binary started with envoyproxy/ratelimit's environment variables only (its
//! Deployment unchanged): the config from `RUNTIME_ROOT`'s layout, reloaded on the symlink swap,
//! the ports, Redis, upstream's response headers over gRPC, `/rlconfig` on the debug port,
//! `/healthcheck` with Redis stopped, and the environments it refuses with exit status 2.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use support::{binary, descriptor, eventually, listening};
use tollgate_testkit::RedisServer;

fn limits(requests: u32) -> String {
    format!(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: {requests}}}\n"
    )
}

/// `ROOT/VERSION/ratelimit/config/limits.yaml`, as a runtime directory upstream loads with
/// `RUNTIME_SUBDIRECTORY=ratelimit` (and the default `RUNTIME_APPDIRECTORY=config`).
fn version(root: &Path, name: &str, requests: u32) {
    let dir = root.join(name).join("ratelimit").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("limits.yaml"), limits(requests)).unwrap();
}

/// Points `ROOT/current` at `ROOT/VERSION` in one rename, as a deploy's symlink swap does.
fn swap(root: &Path, name: &str) {
    let next = root.join("current.next");
    let _ = std::fs::remove_file(&next);
    std::os::unix::fs::symlink(root.join(name), &next).unwrap();
    std::fs::rename(&next, root.join("current")).unwrap();
}

/// `tollgate serve` with no argument but `serve`, in an environment of `vars` only (and the
/// admin API on a free port: upstream has none, and tollgate's default port is shared).
fn serve_with(vars: &[(&str, &str)]) -> Command {
    let mut command = Command::new(binary());
    command
        .arg("serve")
        .env_clear()
        .env("TOLLGATE_ADMIN_ADDR", "127.0.0.1:0")
        .envs(vars.iter().copied())
        .stderr(Stdio::null());
    command
}

struct Running {
    child: Child,
    http: std::net::SocketAddr,
    grpc: std::net::SocketAddr,
    debug: std::net::SocketAddr,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(vars: &[(&str, &str)]) -> Running {
    let (child, [http, grpc, _admin, debug]) =
        listening(serve_with(vars), ["http", "grpc", "admin", "debug"]);
    Running {
        child,
        http,
        grpc,
        debug,
    }
}

async fn check(grpc: std::net::SocketAddr, user: &str) -> RateLimitResponse {
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    client
        .should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![descriptor(&[("user", user)])],
            hits_addend: 1,
        })
        .await
        .unwrap()
        .into_inner()
}

fn headers(response: &RateLimitResponse) -> Vec<(String, String)> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

async fn get(url: String) -> (u16, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn upstreams_environment_alone_starts_and_serves() {
    let redis = RedisServer::start();
    let root = tempfile::tempdir().unwrap();
    version(root.path(), "v1", 2);
    swap(root.path(), "v1");
    let runtime_root = root.path().join("current").display().to_string();
    let redis_url = format!("127.0.0.1:{}", redis.port());
    let server = start(&[
        ("RUNTIME_ROOT", runtime_root.as_str()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "true"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_PORT", "0"),
        ("DEBUG_PORT", "0"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", redis_url.as_str()),
        ("USE_STATSD", "false"),
        ("LOG_LEVEL", "WARN"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
    ]);

    // Upstream's three headers, on OK as on OVER_LIMIT, and none of tollgate's own.
    let first = check(server.grpc, "alice").await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    let first = headers(&first);
    assert_eq!(
        first[..2],
        [
            ("RateLimit-Limit".to_owned(), "2".to_owned()),
            ("RateLimit-Remaining".to_owned(), "1".to_owned()),
        ]
    );
    assert_eq!(first[2].0, "RateLimit-Reset");
    let reset: u64 = first[2].1.parse().unwrap();
    assert!((1..=60).contains(&reset), "{first:?}");
    assert_eq!(first.len(), 3, "{first:?}");
    check(server.grpc, "alice").await;
    let over = check(server.grpc, "alice").await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    assert_eq!(
        headers(&over)[1],
        ("RateLimit-Remaining".to_owned(), "0".to_owned())
    );
    // The counters are in REDIS_URL's Redis.
    assert_ne!(redis.cli(&["DBSIZE"]).trim(), "0");

    // The debug port: /rlconfig and nothing else, nothing that writes.
    let rlconfig = format!("http://{}/rlconfig", server.debug);
    let (status, text) = get(rlconfig.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(
        text,
        "api.user: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n"
    );
    let (status, _) = get(format!("http://{}/v1/admin/versions", server.debug)).await;
    assert_eq!(status, 404);
    let posted = reqwest::Client::new()
        .post(&rlconfig)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 405);

    // A deploy swaps RUNTIME_ROOT's symlink: the new limits are loaded.
    version(root.path(), "v2", 5);
    swap(root.path(), "v2");
    eventually(
        Duration::from_secs(15),
        "the swapped config is loaded",
        async || {
            get(rlconfig.clone())
                .await
                .1
                .contains("requests_per_unit=5,")
        },
    )
    .await;
    let after = check(server.grpc, "bob").await;
    assert_eq!(
        headers(&after)[0],
        ("RateLimit-Limit".to_owned(), "5".to_owned())
    );

    // Envoy Gateway's probe: 200 while Redis is down, answered as upstream answers it.
    redis.stop();
    let (status, body) = get(format!("http://{}/healthcheck", server.http)).await;
    assert_eq!((status, body.as_str()), (200, "OK"));
}

/// Runs `serve` in `vars` expecting a refusal: its exit status and standard error.
fn refused(vars: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = serve_with(vars);
    let output = command
        .args(["--config", "/nonexistent.yaml"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn environments_tollgate_cannot_honour_exit_2_naming_the_variables() {
    for (vars, message) in [
        (
            &[
                ("REDIS_TYPE", "sentinel"),
                ("REDIS_URL", "mymaster,127.0.0.1:26379"),
            ][..],
            "error: REDIS_TYPE=sentinel: Redis Sentinel is not supported",
        ),
        (
            &[("BACKEND_TYPE", "memcache")][..],
            "error: BACKEND_TYPE=memcache: ",
        ),
        (
            &[("MERGE_DOMAIN_CONFIG", "true")][..],
            "error: MERGE_DOMAIN_CONFIG=true: ",
        ),
        (&[("USE_STATSD", "true")][..], "error: USE_STATSD=true: "),
        (
            &[
                ("REDIS_SOCKET_TYPE", "unix"),
                ("REDIS_URL", "127.0.0.1:6379"),
            ][..],
            "error: REDIS_SOCKET_TYPE=unix and REDIS_URL=127.0.0.1:6379 disagree",
        ),
        (
            &[("PORT", "8080"), ("TOLLGATE_HTTP_ADDR", "127.0.0.1:0")][..],
            "error: TOLLGATE_HTTP_ADDR=127.0.0.1:0 and PORT=8080 disagree",
        ),
    ] {
        let (code, stderr) = refused(vars);
        assert_eq!(code, Some(2), "{vars:?}: {stderr}");
        assert!(stderr.starts_with(message), "{vars:?}: {stderr}");
    }
}

#[test]
fn every_serve_flag_has_its_tollgate_variable_in_help() {
    let output = Command::new(binary())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(output.stdout).unwrap();
    let flags: Vec<&str> = help
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("--"))
        .map(|rest| rest.split([' ', '=']).next().unwrap())
        .filter(|flag| *flag != "help")
        .collect();
    assert!(flags.len() > 30, "{help}");
    // A default an upstream variable gave is shown, but never a store URL's.
    let upstream = serve_with(&[("PORT", "9999"), ("REDIS_URL", "redis://:hunter2@r:1")])
        .arg("--help")
        .output()
        .unwrap();
    let upstream = String::from_utf8(upstream.stdout).unwrap();
    assert!(upstream.contains("[default: 127.0.0.1:9999]"), "{upstream}");
    assert!(!upstream.contains("hunter2"), "{upstream}");
    for flag in flags {
        let env = format!("[env: TOLLGATE_{}", flag.to_uppercase().replace('-', "_"));
        assert!(help.contains(&env), "--{flag} has no {env}]");
    }
}

/// A flag beats the upstream variable (here one that could not even be bound); an upstream
/// variable is otherwise the flag's default.
#[tokio::test]
async fn a_flag_beats_the_upstream_variable() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.yaml");
    std::fs::write(&config, limits(1)).unwrap();
    let config = config.display().to_string();
    let mut command = serve_with(&[("PORT", "1"), ("GRPC_PORT", "0"), ("DEBUG_PORT", "0")]);
    command.args(["--config", config.as_str(), "--http-addr", "127.0.0.1:0"]);
    let (mut child, [http, _grpc, _admin, _debug]) =
        listening(command, ["http", "grpc", "admin", "debug"]);
    assert_ne!(http.port(), 1);
    let (status, _) = get(format!("http://{http}/healthcheck")).await;
    assert_eq!(status, 200);
    let _ = child.kill();
    let _ = child.wait();
}

/// gRPC mTLS from upstream's variables, the client CA under the name Envoy Gateway's
/// Deployment gives it (`GRPC_SERVER_TLS_CA_CERT`): a client with a certificate the CA signed is
/// answered, one without is refused.
#[tokio::test]
async fn grpc_mutual_tls_from_upstreams_variables() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let dir = tempfile::tempdir().unwrap();
    let certs = support::certificates(dir.path());
    let config = dir.path().join("limits.yaml");
    std::fs::write(&config, limits(3)).unwrap();
    let path = |p: &Path| p.display().to_string();
    let (config, cert, key, ca) = (
        path(&config),
        path(&certs.cert),
        path(&certs.key),
        path(&certs.ca),
    );
    let server = start(&[
        ("TOLLGATE_CONFIG", config.as_str()),
        ("PORT", "0"),
        ("GRPC_PORT", "0"),
        ("DEBUG_PORT", "0"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", cert.as_str()),
        ("GRPC_SERVER_TLS_KEY", key.as_str()),
        ("GRPC_SERVER_TLS_CA_CERT", ca.as_str()),
    ]);
    let pem = |p: &Path| std::fs::read(p).unwrap();
    let trusting = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem(&certs.ca)));
    let with_certificate = trusting.clone().identity(Identity::from_pem(
        pem(&certs.client_cert),
        pem(&certs.client_key),
    ));
    let ask = async |tls: ClientTlsConfig| {
        let endpoint = Endpoint::from_shared(format!("https://{}", server.grpc))
            .unwrap()
            .tls_config(tls)
            .unwrap();
        RateLimitServiceClient::new(endpoint.connect_lazy())
            .should_rate_limit(RateLimitRequest {
                domain: "api".into(),
                descriptors: vec![descriptor(&[("user", "tls")])],
                hits_addend: 1,
            })
            .await
    };
    let answered = ask(with_certificate).await.unwrap().into_inner();
    assert_eq!(answered.statuses[0].limit_remaining, 2);
    let refused = ask(trusting).await;
    assert!(refused.is_err(), "{refused:?}");
}

/// What a third-party RLS client (Python grpcio with `envoy-data-plane`) receives with
/// `LIMIT_RESPONSE_HEADERS_ENABLED` and the headers renamed: upstream's three, on OK and
/// OVER_LIMIT alike. `$TOLLGATE_PYTHON` as in `e2e_python_grpcio`.
#[test]
fn upstreams_headers_reach_a_grpcio_client() {
    let root = tempfile::tempdir().unwrap();
    version(root.path(), "data", 2);
    let runtime_root = root.path().join("data").display().to_string();
    let server = start(&[
        ("RUNTIME_ROOT", runtime_root.as_str()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("PORT", "0"),
        ("GRPC_PORT", "0"),
        ("DEBUG_PORT", "0"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_LIMIT_HEADER", "X-RateLimit-Limit"),
        ("LIMIT_REMAINING_HEADER", "X-RateLimit-Remaining"),
        ("LIMIT_RESET_HEADER", "X-RateLimit-Reset"),
    ]);
    let python = std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/rls_headers_client.py");
    let output = Command::new(&python)
        .arg(&script)
        .args([server.grpc.to_string().as_str(), "api", "user", "py", "3"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<Vec<&str>> = stdout.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for (line, (code, remaining)) in
        lines
            .iter()
            .zip([("OK", "1"), ("OK", "0"), ("OVER_LIMIT", "0")])
    {
        assert_eq!(
            line[..3],
            [
                code,
                "X-RateLimit-Limit=2",
                &format!("X-RateLimit-Remaining={remaining}")
            ],
            "{stdout}"
        );
        let reset: u64 = line[3]
            .strip_prefix("X-RateLimit-Reset=")
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&reset), "{stdout}");
        assert_eq!(line.len(), 4, "{stdout}");
    }
}
