//! The translation table: given an environment, these `TOLLGATE_*` values (or this refusal).

use std::collections::HashMap;

use clap::{CommandFactory, FromArgMatches};

use super::*;

mod sources;

pub(super) fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name: &str| vars.get(name).cloned()
}

pub(super) fn settings(vars: &[(&str, &str)]) -> Vec<(&'static str, String)> {
    let translated = translate(&env(vars)).unwrap();
    translated
        .settings
        .into_iter()
        .map(|s| (s.target, s.value))
        .collect()
}

pub(super) fn refusal(vars: &[(&str, &str)]) -> String {
    translate(&env(vars)).unwrap_err().to_string()
}

pub(super) fn owned(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

#[test]
fn nothing_set_translates_to_nothing() {
    assert!(settings(&[]).is_empty());
    // Upstream variables tollgate does not know are ignored; empty ones count as unset.
    assert!(
        settings(&[
            ("REDIS_POOL_SIZE", "20"),
            ("NEAR_LIMIT_RATIO", "0.9"),
            ("PORT", "")
        ])
        .is_empty()
    );
}

#[test]
fn listeners_take_tollgates_default_for_the_part_not_given() {
    assert_eq!(
        settings(&[
            ("PORT", "9000"),
            ("GRPC_HOST", "0.0.0.0"),
            ("DEBUG_HOST", "::"),
            ("DEBUG_PORT", "6071")
        ]),
        owned(&[
            ("TOLLGATE_HTTP_ADDR", "127.0.0.1:9000"),
            ("TOLLGATE_GRPC_ADDR", "0.0.0.0:8081"),
            ("TOLLGATE_DEBUG_ADDR", "[::]:6071"),
        ])
    );
    assert!(refusal(&[("PORT", "http")]).starts_with("PORT=http: not a port number"));
    assert!(refusal(&[("HOST", "example.com")]).starts_with("HOST=example.com: not an IP address"));
}

#[test]
fn redis_variables_make_one_store_url() {
    let store = |vars: &[(&str, &str)]| settings(vars);
    assert_eq!(
        store(&[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis.ns:6379")]),
        owned(&[("TOLLGATE_STORE", "redis://redis.ns:6379")])
    );
    assert_eq!(
        store(&[
            ("REDIS_URL", "r:6379"),
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "app:p@ss w")
        ]),
        owned(&[("TOLLGATE_STORE", "rediss://app:p%40ss%20w@r:6379")])
    );
    assert_eq!(
        store(&[("REDIS_URL", "r:6379"), ("REDIS_AUTH", "secret")]),
        owned(&[("TOLLGATE_STORE", "redis://:secret@r:6379")])
    );
    assert_eq!(
        store(&[("REDIS_TYPE", "CLUSTER"), ("REDIS_URL", "a:7000, b:7001")]),
        owned(&[("TOLLGATE_STORE", "redis+cluster://a:7000,b:7001")])
    );
    // A full URL is kept as it is.
    assert_eq!(
        store(&[("REDIS_URL", "rediss://u:p@r:6380/2")]),
        owned(&[("TOLLGATE_STORE", "rediss://u:p@r:6380/2")])
    );
    // Without REDIS_URL, tollgate's default store stays.
    assert!(store(&[("REDIS_AUTH", "x"), ("REDIS_TLS", "true")]).is_empty());
}

#[test]
fn redis_variables_that_contradict_each_other_stop_naming_both() {
    let e = refusal(&[("REDIS_SOCKET_TYPE", "unix"), ("REDIS_URL", "redis:6379")]);
    assert_eq!(
        e,
        "REDIS_SOCKET_TYPE=unix and REDIS_URL=redis:6379 disagree: a unix socket type with a TCP address"
    );
    let e = refusal(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "/var/run/redis.sock"),
    ]);
    assert!(
        e.starts_with("REDIS_SOCKET_TYPE=tcp and REDIS_URL=/var/run/redis.sock disagree"),
        "{e}"
    );
    let e = refusal(&[("REDIS_TLS", "false"), ("REDIS_URL", "rediss://r:6379")]);
    assert!(
        e.starts_with("REDIS_TLS=false and REDIS_URL=rediss://r:6379 disagree"),
        "{e}"
    );
    let e = refusal(&[
        ("REDIS_AUTH", "hunter2"),
        ("REDIS_URL", "redis://u:pw@r:6379"),
    ]);
    assert!(
        e.contains("REDIS_URL=redis://u:***@r:6379 and REDIS_AUTH=*** disagree"),
        "{e}"
    );
    assert!(!e.contains("hunter2") && !e.contains(":pw@"), "{e}");
    let e = refusal(&[("REDIS_URL", "a:1,b:2")]);
    assert!(e.contains("several hosts need REDIS_TYPE=cluster"), "{e}");
}

#[test]
fn known_variables_tollgate_cannot_honour_stop_saying_why() {
    for (vars, start) in [
        (
            &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "m,s:26379")][..],
            "REDIS_TYPE=sentinel: Redis Sentinel is not supported",
        ),
        (
            &[
                ("REDIS_SOCKET_TYPE", "unix"),
                ("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"),
            ][..],
            "REDIS_SOCKET_TYPE=unix: tollgate reaches Redis over TCP only",
        ),
        (
            &[("BACKEND_TYPE", "memcache")][..],
            "BACKEND_TYPE=memcache: ",
        ),
        (
            &[("MERGE_DOMAIN_CONFIG", "true")][..],
            "MERGE_DOMAIN_CONFIG=true: ",
        ),
        (
            &[("USE_STATSD", "true")][..],
            "USE_STATSD=true: tollgate sends no statsd",
        ),
        (&[("REDIS_PERSECOND", "1")][..], "REDIS_PERSECOND=1: "),
        (
            &[("GRPC_UDS", "/tmp/rl.sock")][..],
            "GRPC_UDS=/tmp/rl.sock: ",
        ),
        (
            &[("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", "9090")][..],
            "PROMETHEUS_ADDR=9090: not [HOST]:PORT",
        ),
        (
            &[
                ("REDIS_URL", "r:6379"),
                ("REDIS_TLS", "true"),
                ("REDIS_TLS_CLIENT_CERT", "/c.pem"),
            ][..],
            "REDIS_TLS_CLIENT_CERT=/c.pem: ",
        ),
        (
            &[
                ("REDIS_URL", "r:6379"),
                ("REDIS_TLS", "true"),
                ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
            ][..],
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true: ",
        ),
        (
            &[
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", "c"),
                ("GRPC_SERVER_TLS_KEY", "k"),
                ("GRPC_CLIENT_TLS_CACERT", "ca"),
                ("GRPC_CLIENT_TLS_SAN", "envoy"),
            ][..],
            "GRPC_CLIENT_TLS_SAN=envoy: ",
        ),
        (
            &[("CONFIG_TYPE", "GRPC_XDS_DELTA")][..],
            "CONFIG_TYPE=GRPC_XDS_DELTA: not a config type",
        ),
    ] {
        let e = refusal(vars);
        assert!(e.starts_with(start), "{vars:?}: {e}");
    }
    // The same variables at values tollgate does honour.
    assert!(
        settings(&[
            ("BACKEND_TYPE", "redis"),
            ("USE_STATSD", "false"),
            ("MERGE_DOMAIN_CONFIG", "false"),
            ("USE_PROMETHEUS", "true"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false")
        ])
        .is_empty()
    );
    // Their settings matter only with TLS on, as upstream reads them.
    assert!(settings(&[("GRPC_SERVER_TLS_CERT", "c"), ("REDIS_TLS_CACERT", "ca")]).is_empty());
}

#[test]
fn logs_and_response_headers() {
    assert_eq!(
        settings(&[
            ("LOG_LEVEL", "WARN"),
            ("LOG_FORMAT", "json"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "True"),
            ("LIMIT_LIMIT_HEADER", "X-RateLimit-Limit"),
            ("LIMIT_REMAINING_HEADER", "X-RateLimit-Remaining"),
            ("LIMIT_RESET_HEADER", "X-RateLimit-Reset"),
            ("RESPONSE_DYNAMIC_METADATA", "1"),
        ]),
        owned(&[
            ("TOLLGATE_LOG_LEVEL", "warn"),
            ("TOLLGATE_LOG_FORMAT", "json"),
            ("TOLLGATE_RLS_UPSTREAM_HEADERS", "true"),
            ("TOLLGATE_RLS_HEADER_LIMIT", "X-RateLimit-Limit"),
            ("TOLLGATE_RLS_HEADER_REMAINING", "X-RateLimit-Remaining"),
            ("TOLLGATE_RLS_HEADER_RESET", "X-RateLimit-Reset"),
            ("TOLLGATE_RLS_DYNAMIC_METADATA", "true"),
        ])
    );
    assert!(refusal(&[("LOG_LEVEL", "loud")]).starts_with("LOG_LEVEL=loud: not a log level"));
    assert!(
        refusal(&[("LIMIT_LIMIT_HEADER", "Rate Limit")])
            .starts_with("LIMIT_LIMIT_HEADER=Rate Limit: not a header name")
    );
}

/// Envoy Gateway's own Deployment environment (its `internal/infrastructure/kubernetes/
/// ratelimit`), mTLS both ways: xDS as the source, the RUNTIME_* directories ignored with it.
#[test]
fn a_tollgate_variable_that_agrees_wins_and_one_that_disagrees_stops() {
    // Agreeing (in any spelling of the same value): nothing left to apply.
    assert!(settings(&[("PORT", "8080"), ("TOLLGATE_HTTP_ADDR", "127.0.0.1:8080")]).is_empty());
    assert!(
        settings(&[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("TOLLGATE_RLS_UPSTREAM_HEADERS", "yes")
        ])
        .is_empty()
    );
    let e = refusal(&[("PORT", "8080"), ("TOLLGATE_HTTP_ADDR", "0.0.0.0:9000")]);
    assert_eq!(
        e,
        "TOLLGATE_HTTP_ADDR=0.0.0.0:9000 and PORT=8080 disagree: the upstream variable means TOLLGATE_HTTP_ADDR=127.0.0.1:8080; unset one of them"
    );
    let e = refusal(&[
        ("REDIS_URL", "redis://:hunter2@r:1"),
        ("TOLLGATE_STORE", "redis://:other@r:2"),
    ]);
    assert!(!e.contains("hunter2") && !e.contains("other@"), "{e}");
    assert!(
        e.starts_with("TOLLGATE_STORE=redis://:***@r:2 and REDIS_URL disagree"),
        "{e}"
    );
}

/// Flag, then `TOLLGATE_*` (clap reads it before any default), then the upstream variable,
/// which `onto` makes the flag's default.
#[test]
fn a_flag_beats_the_upstream_variable_which_beats_tollgates_default() {
    let translated = translate(&env(&[("PORT", "9100"), ("RUNTIME_ROOT", "/rt")])).unwrap();
    let parse = |args: &[&str]| {
        let command = onto(crate::Cli::command(), &translated).unwrap();
        let matches = command.try_get_matches_from(args).unwrap();
        let cli = crate::Cli::from_arg_matches(&matches).unwrap();
        let crate::Command::Serve(serve) = cli.command else {
            unreachable!()
        };
        format!("{serve:?}")
    };
    let upstream = parse(&["tollgate", "serve"]);
    assert!(upstream.contains("http_addr: 127.0.0.1:9100"), "{upstream}");
    assert!(
        upstream.contains("config: Some(\"/rt/config\")"),
        "{upstream}"
    );
    let flagged = parse(&[
        "tollgate",
        "serve",
        "--http-addr",
        "127.0.0.2:7000",
        "--config",
        "/p.yaml",
    ]);
    assert!(flagged.contains("http_addr: 127.0.0.2:7000"), "{flagged}");
    assert!(flagged.contains("config: Some(\"/p.yaml\")"), "{flagged}");
    let plain = crate::Cli::command()
        .try_get_matches_from(["tollgate", "serve", "--config", "/p"])
        .unwrap();
    let plain = format!("{:?}", crate::Cli::from_arg_matches(&plain).unwrap());
    assert!(plain.contains("http_addr: 127.0.0.1:8080"), "{plain}");
}

#[test]
fn a_setting_this_build_lacks_is_named() {
    let translated = Translated {
        settings: vec![apply::Setting {
            target: "TOLLGATE_NO_SUCH_THING",
            value: "1".to_owned(),
            from: "SOMETHING=1".to_owned(),
        }],
    };
    let e = onto(crate::Cli::command(), &translated).unwrap_err();
    assert_eq!(
        e.to_string(),
        "SOMETHING=1 sets TOLLGATE_NO_SUCH_THING, which this build of tollgate does not have"
    );
}

/// A switch set by an upstream variable is on without its flag.
#[test]
fn an_upstream_switch_turns_its_flag_on() {
    let parse = |vars: &[(&str, &str)]| {
        let translated = translate(&env(vars)).unwrap();
        let command = onto(crate::Cli::command(), &translated).unwrap();
        let matches = command
            .try_get_matches_from(["tollgate", "serve", "--config", "/p"])
            .unwrap();
        format!("{:?}", crate::Cli::from_arg_matches(&matches).unwrap())
    };
    assert!(parse(&[]).contains("rls_upstream_headers: false"));
    let on = parse(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]);
    assert!(on.contains("rls_upstream_headers: true"), "{on}");
    let off = parse(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "false")]);
    assert!(off.contains("rls_upstream_headers: false"), "{off}");
}

/// `PROMETHEUS_ADDR` (with `USE_PROMETHEUS=true`) is a listener of its own; an empty host takes
/// the default host, as `PORT` without `HOST` does.
#[test]
fn prometheus_addr_gives_a_metrics_listener() {
    assert_eq!(
        settings(&[("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", ":19001")]),
        owned(&[("TOLLGATE_METRICS_ADDR", "127.0.0.1:19001")])
    );
    assert_eq!(
        settings(&[("USE_PROMETHEUS", "1"), ("PROMETHEUS_ADDR", "[::1]:9100")]),
        owned(&[("TOLLGATE_METRICS_ADDR", "[::1]:9100")])
    );
    // Upstream reads the address only with USE_PROMETHEUS on.
    assert!(settings(&[("USE_PROMETHEUS", "false"), ("PROMETHEUS_ADDR", ":19001")]).is_empty());
    assert!(settings(&[("PROMETHEUS_ADDR", ":19001")]).is_empty());
    assert!(
        refusal(&[("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", ":http")])
            .starts_with("PROMETHEUS_ADDR=http: not a port number")
    );
}

/// Run as `ratelimit`, the listeners take upstream's defaults: every interface, and all three
/// of them even when no variable names one.
#[test]
fn as_ratelimit_the_listeners_take_upstreams_defaults() {
    let upstream = |vars: &[(&str, &str)]| {
        let translated = translate_with(&env(vars), Defaults::Upstream).unwrap();
        translated
            .settings
            .into_iter()
            .map(|s| (s.target, s.value))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        upstream(&[]),
        owned(&[
            ("TOLLGATE_HTTP_ADDR", "0.0.0.0:8080"),
            ("TOLLGATE_GRPC_ADDR", "0.0.0.0:8081"),
            ("TOLLGATE_DEBUG_ADDR", "0.0.0.0:6070"),
        ])
    );
    assert_eq!(
        upstream(&[
            ("PORT", "9000"),
            ("GRPC_HOST", "127.0.0.1"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001")
        ]),
        owned(&[
            ("TOLLGATE_HTTP_ADDR", "0.0.0.0:9000"),
            ("TOLLGATE_GRPC_ADDR", "127.0.0.1:8081"),
            ("TOLLGATE_METRICS_ADDR", "0.0.0.0:19001"),
            // Defaults come last.
            ("TOLLGATE_DEBUG_ADDR", "0.0.0.0:6070"),
        ])
    );
    // A TOLLGATE_* variable comes first, and an upstream default is no conflict with it.
    let translated = translate_with(
        &env(&[("TOLLGATE_HTTP_ADDR", "127.0.0.1:9000")]),
        Defaults::Upstream,
    )
    .unwrap();
    let targets: Vec<_> = translated.settings.iter().map(|s| s.target).collect();
    assert_eq!(targets, ["TOLLGATE_GRPC_ADDR", "TOLLGATE_DEBUG_ADDR"]);
    // An upstream variable that names the address still conflicts with one that differs.
    assert!(
        translate_with(
            &env(&[("PORT", "8080"), ("TOLLGATE_HTTP_ADDR", "127.0.0.1:9000")]),
            Defaults::Upstream,
        )
        .is_err()
    );
}
