//! The rows for where the policy comes from (files or xDS) and gRPC TLS.

use super::{owned, refusal, settings};

#[test]
fn the_runtime_directories_give_the_config_path() {
    assert_eq!(
        settings(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
        ]),
        owned(&[("TOLLGATE_CONFIG", "/data/ratelimit/config")])
    );
    assert_eq!(
        settings(&[
            ("RUNTIME_ROOT", "/srv/current"),
            ("RUNTIME_APPDIRECTORY", "limits")
        ]),
        owned(&[("TOLLGATE_CONFIG", "/srv/current/limits")])
    );
    assert!(
        refusal(&[("RUNTIME_ROOT", "/d"), ("RUNTIME_WATCH_ROOT", "maybe")])
            .starts_with("RUNTIME_WATCH_ROOT=maybe: not a boolean")
    );
}

#[test]
fn grpc_tls_and_its_client_ca_under_either_name() {
    let base = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ];
    let tls = owned(&[
        ("TOLLGATE_GRPC_TLS_CERT", "/certs/tls.crt"),
        ("TOLLGATE_GRPC_TLS_KEY", "/certs/tls.key"),
    ]);
    assert_eq!(settings(&base), tls);
    for name in ["GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT"] {
        let mut vars = base.to_vec();
        vars.push((name, "/certs/ca.crt"));
        let mut want = tls.clone();
        want.push(("TOLLGATE_GRPC_TLS_CLIENT_CA", "/certs/ca.crt".to_owned()));
        assert_eq!(settings(&vars), want, "{name}");
    }
    let mut both = base.to_vec();
    both.extend([
        ("GRPC_CLIENT_TLS_CACERT", "/a.crt"),
        ("GRPC_SERVER_TLS_CA_CERT", "/b.crt"),
    ]);
    assert!(
        refusal(&both).starts_with(
            "GRPC_CLIENT_TLS_CACERT=/a.crt and GRPC_SERVER_TLS_CA_CERT=/b.crt disagree"
        )
    );
    let e = refusal(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "c"),
    ]);
    assert_eq!(e, "GRPC_SERVER_USE_TLS=true: needs GRPC_SERVER_TLS_KEY");
}

#[test]
fn envoy_gateways_environment_selects_xds_with_mtls() {
    let vars = [
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.redis.svc:6379"),
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
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":19001"),
        // The statsd exporter's mapping of upstream's metric names: not read by tollgate.
        ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
    ];
    assert_eq!(
        settings(&vars),
        owned(&[
            ("TOLLGATE_LOG_LEVEL", "info"),
            ("TOLLGATE_STORE", "redis://redis.redis.svc:6379"),
            ("TOLLGATE_GRPC_TLS_CERT", "/certs/tls.crt"),
            ("TOLLGATE_GRPC_TLS_KEY", "/certs/tls.key"),
            ("TOLLGATE_GRPC_TLS_CLIENT_CA", "/certs/ca.crt"),
            ("TOLLGATE_METRICS_ADDR", "127.0.0.1:19001"),
            ("TOLLGATE_CONFIG_SOURCE", "xds://envoy-gateway:18001"),
            ("TOLLGATE_XDS_NODE_ID", "envoy-ratelimit"),
            ("TOLLGATE_FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("TOLLGATE_XDS_TLS", "true"),
            ("TOLLGATE_XDS_CA_FILE", "/certs/ca.crt"),
            ("TOLLGATE_XDS_CERT_FILE", "/certs/tls.crt"),
            ("TOLLGATE_XDS_KEY_FILE", "/certs/tls.key"),
        ])
    );
}

#[test]
fn the_other_xds_rows() {
    assert_eq!(
        settings(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,broken,team=rl"),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "x-token:abc, x-tenant:t1"
            ),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "500ms"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1m30s"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.example"),
        ]),
        owned(&[
            ("TOLLGATE_CONFIG_SOURCE", "xds://localhost:18000"),
            ("TOLLGATE_XDS_NODE_METADATA", "zone=a,team=rl"),
            ("TOLLGATE_XDS_HEADERS", "x-token=abc,x-tenant=t1"),
            ("TOLLGATE_XDS_BACKOFF_INITIAL", "500ms"),
            ("TOLLGATE_XDS_BACKOFF_MAX", "1m30s"),
            ("TOLLGATE_XDS_TLS", "true"),
            ("TOLLGATE_XDS_SERVER_NAME", "xds.example"),
        ])
    );
    // Without CONFIG_TYPE=GRPC_XDS_SOTW upstream reads none of them, and neither does tollgate.
    assert!(
        settings(&[
            ("CONFIG_GRPC_XDS_NODE_ID", "n"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true")
        ])
        .is_empty()
    );
    assert!(
        refusal(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "soon")
        ])
        .starts_with("XDS_CLIENT_BACKOFF_MAX_INTERVAL=soon: not a duration")
    );
}
