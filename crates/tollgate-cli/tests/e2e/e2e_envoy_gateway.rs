//! Envoy Gateway's own Deployment of the rate limit service, as the test case of "swap the
//! image, keep the Deployment": the binary run as `ratelimit` (the image's `/bin/ratelimit`,
//! the Deployment's only command) with exactly the container environment Envoy Gateway writes
//! (its `internal/infrastructure/kubernetes/ratelimit`), certificates made by `openssl` in
//! the layout of its `envoy-rate-limit` secret, the limits pushed over xDS by the test's
//! management server with mutual TLS, and a real Redis.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::ads::Ads;
use support::{binary, descriptor};
use tollgate_server::xds::proto::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tollgate_testkit::RedisServer;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// The container's environment as Envoy Gateway writes it (`expectedRateLimitContainerEnv`,
/// Redis configured and Prometheus on, as in its golden `testdata/deployments/default.yaml`),
/// in its order. Tracing and Redis TLS are added only when configured, and are not here.
const ENVOY_GATEWAY: &[(&str, &str)] = &[
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "false"),
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
    ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
    ("GRPC_SERVER_USE_TLS", "true"),
    ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
    ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis.svc:6379"),
    ("USE_PROMETHEUS", "true"),
    ("PROMETHEUS_ADDR", ":19001"),
    ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
];

/// The `envoy-rate-limit` secret's files (`/certs/ca.crt`, `tls.crt`, `tls.key`: one
/// certificate that tollgate serves gRPC with and presents to the xDS server), and the
/// certificates of the two peers: Envoy calling gRPC, Envoy Gateway's xDS server.
struct Certs {
    dir: std::path::PathBuf,
}

impl Certs {
    fn make(dir: &Path) -> Certs {
        let leaves = [
            (
                "tls",
                "/CN=envoy-ratelimit",
                "subjectAltName=DNS:envoy-ratelimit,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth",
            ),
            ("envoy", "/CN=envoy", "extendedKeyUsage=clientAuth"),
            (
                "xds",
                "/CN=envoy-gateway",
                "subjectAltName=DNS:envoy-gateway,IP:127.0.0.1\nextendedKeyUsage=serverAuth",
            ),
        ];
        support::sign_with_openssl(dir, ".crt", "/CN=envoy-gateway-test-CA", &leaves);
        Certs {
            dir: dir.to_path_buf(),
        }
    }

    fn pem(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(name)).unwrap()
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

/// A limit like the ones Envoy Gateway's translator writes for a `BackendTrafficPolicy` global
/// rule: the domain is the listener, the outer key and value the route, and the rule's match a
/// key of its own without a value (a distinct header: every value counted apart).
fn envoy_gateway_limits(per_hour: u32) -> RateLimitConfig {
    let route = "httproute/default/backend/rule/0";
    RateLimitConfig {
        name: "default/eg/http".into(),
        domain: "default/eg/http".into(),
        descriptors: vec![RateLimitDescriptor {
            key: route.into(),
            value: route.into(),
            descriptors: vec![RateLimitDescriptor {
                key: "rule-0-match-0".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Hour as i32,
                    requests_per_unit: per_hour,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Envoy's request for user `user` on that route.
fn request(user: &str) -> RateLimitRequest {
    let route = "httproute/default/backend/rule/0";
    RateLimitRequest {
        domain: "default/eg/http".into(),
        descriptors: vec![descriptor(&[(route, route), ("rule-0-match-0", user)])],
        hits_addend: 1,
    }
}

struct Running {
    child: Child,
    /// `http`, `grpc`, `admin`, `debug`, `metrics`, as the binary printed them.
    addrs: Vec<SocketAddr>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `ratelimit` (a symlink to the built binary) with `env` alone and no argument.
fn run_as_ratelimit(dir: &Path, env: &[(String, String)], log: &Path) -> Running {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let ratelimit = bin.join("ratelimit");
    std::os::unix::fs::symlink(binary(), &ratelimit).unwrap();
    let mut child = Command::new(&ratelimit)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addrs = ["http", "grpc", "admin", "debug", "metrics"]
        .iter()
        .map(|name| {
            let line = lines.next().unwrap_or_else(|| {
                panic!(
                    "exited before `{name} listening on`: {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                )
            });
            let line = line.unwrap();
            line.strip_prefix(&format!("{name} listening on "))
                .unwrap_or_else(|| panic!("unexpected line `{line}`"))
                .parse()
                .unwrap()
        })
        .collect();
    Running { child, addrs }
}

/// `addr` as reached from the test: a listener on every interface is reached on loopback.
fn local(addr: SocketAddr) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], addr.port()))
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let response = reqwest::get(format!("http://{}{path}", local(addr)))
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_deployment_starts_tollgate_and_it_serves() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::make(dir.path());
    let redis = RedisServer::start();
    // Envoy Gateway's xDS server, asking for the client certificate its CA signed.
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(
            certs.pem("xds.crt"),
            certs.pem("xds.key"),
        ))
        .client_ca_root(Certificate::from_pem(certs.pem("ca.crt")));
    let ads = Ads::start("127.0.0.1:0".parse().unwrap(), Some(tls)).await;

    // Envoy Gateway's environment, changed only where a test on a shared machine must: the
    // secret's mount point and the peers' addresses (no `/certs`, no cluster DNS here), and
    // the ports, kernel-chosen (`0`) rather than upstream's fixed defaults (8080, 8081, 6070)
    // and Envoy Gateway's 19001, which another test or service may hold. The hosts stay unset,
    // as Envoy Gateway leaves them: upstream's default, every interface.
    let mut env: Vec<(String, String)> = ENVOY_GATEWAY
        .iter()
        .map(|(name, value)| {
            let value = match (*name, *value) {
                (_, path) if path.starts_with("/certs/") => certs.path(&path["/certs/".len()..]),
                ("CONFIG_GRPC_XDS_SERVER_URL", _) => ads.addr.to_string(),
                ("REDIS_URL", _) => redis.addr().to_string(),
                ("PROMETHEUS_ADDR", _) => ":0".to_owned(),
                (_, value) => value.to_owned(),
            };
            (name.to_string(), value)
        })
        .collect();
    for port in ["PORT", "GRPC_PORT", "DEBUG_PORT"] {
        env.push((port.into(), "0".into()));
    }
    // tollgate's admin API (upstream has none) off its shared default port, on loopback.
    env.push(("TOLLGATE_ADMIN_ADDR".into(), "127.0.0.1:0".into()));
    let log = dir.path().join("ratelimit.log");
    let server = tokio::task::spawn_blocking({
        let (dir, log) = (dir.path().to_path_buf(), log.clone());
        move || run_as_ratelimit(&dir, &env, &log)
    })
    .await
    .unwrap();
    let [http, grpc, admin, debug, metrics] = server.addrs[..] else {
        unreachable!()
    };
    // As `ratelimit`: upstream's listeners on every interface; the admin API as told.
    for addr in [http, grpc, debug, metrics] {
        assert!(addr.ip().is_unspecified(), "{addr} on every interface");
    }
    assert!(admin.ip().is_loopback());

    // The probes' `/healthcheck` answers before the first push.
    assert_eq!(get(http, "/healthcheck").await.0, 200);

    // Subscribed over mutual TLS with the secret's certificate, as node `envoy-ratelimit`.
    let subscription = ads.subscription().await;
    assert_eq!(subscription.request.node.unwrap().id, "envoy-ratelimit");
    ads.push("1", "n1", &[envoy_gateway_limits(1)]);
    let ack = ads.reply_to("n1").await;
    assert_eq!((ack.version_info.as_str(), ack.error_detail), ("1", None));

    // Envoy, trusting the CA and presenting its certificate: limited.
    let trusting = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(certs.pem("ca.crt")))
        .domain_name("envoy-ratelimit");
    let envoy = trusting.clone().identity(Identity::from_pem(
        certs.pem("envoy.crt"),
        certs.pem("envoy.key"),
    ));
    let endpoint = |tls: ClientTlsConfig| {
        Endpoint::from_shared(format!("https://{}", local(grpc)))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect_lazy()
    };
    let mut client = RateLimitServiceClient::new(endpoint(envoy));
    let code = async |client: &mut RateLimitServiceClient<tonic::transport::Channel>,
                      user: &str| {
        let response = client.should_rate_limit(request(user)).await.unwrap();
        response.into_inner().overall_code
    };
    assert_eq!(code(&mut client, "alice").await, Code::Ok as i32);
    assert_eq!(code(&mut client, "alice").await, Code::OverLimit as i32);
    assert_eq!(
        code(&mut client, "bob").await,
        Code::Ok as i32,
        "each value apart"
    );

    // A caller without a certificate gets no answer.
    let anonymous = RateLimitServiceClient::new(endpoint(trusting))
        .should_rate_limit(request("carol"))
        .await;
    assert!(anonymous.is_err(), "{anonymous:?}");

    // The counters live in the Redis of REDIS_URL.
    let keys = Command::new(tollgate_testkit::redis_cli_binary())
        .args(["-p", &redis.port().to_string(), "dbsize"])
        .output()
        .unwrap();
    let keys: u64 = String::from_utf8_lossy(&keys.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(keys >= 2, "alice's and bob's counters in Redis: {keys}");

    // PROMETHEUS_ADDR's listener serves the metrics; the debug port the pushed limits.
    let (status, text) = get(metrics, "/metrics").await;
    assert_eq!(status, 200);
    assert!(text.contains("tollgate_"), "{text}");
    let (status, text) = get(debug, "/rlconfig").await;
    assert_eq!(status, 200);
    assert!(text.contains("default/eg/http."), "{text}");
    assert_eq!(get(http, "/healthcheck").await.0, 200);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains("ERROR"), "{log}");
    drop(server);
    ads.stop().await;
}
