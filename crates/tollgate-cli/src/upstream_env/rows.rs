//! The table: each upstream variable tollgate reads one for one, the `TOLLGATE_*` variable it
//! sets and how its value is written; and the variables tollgate knows but cannot honour.

use super::UpstreamEnvError;
use super::values::{
    duration, header_name, log_format, log_level, node_metadata, pairs, switch, verbatim,
};

/// How an upstream value becomes a `TOLLGATE_*` one.
pub type Convert = fn(&'static str, &str) -> Result<String, UpstreamEnvError>;

/// One upstream variable read one for one.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub upstream: &'static str,
    pub target: &'static str,
    pub convert: Convert,
}

const fn row(upstream: &'static str, target: &'static str, convert: Convert) -> Row {
    Row {
        upstream,
        target,
        convert,
    }
}

/// Read whatever the config source.
pub const ALWAYS: &[Row] = &[
    row("LOG_LEVEL", "TOLLGATE_LOG_LEVEL", log_level),
    row("LOG_FORMAT", "TOLLGATE_LOG_FORMAT", log_format),
    row(
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        "TOLLGATE_RLS_UPSTREAM_HEADERS",
        switch,
    ),
    row(
        "LIMIT_LIMIT_HEADER",
        "TOLLGATE_RLS_HEADER_LIMIT",
        header_name,
    ),
    row(
        "LIMIT_REMAINING_HEADER",
        "TOLLGATE_RLS_HEADER_REMAINING",
        header_name,
    ),
    row(
        "LIMIT_RESET_HEADER",
        "TOLLGATE_RLS_HEADER_RESET",
        header_name,
    ),
    row(
        "RESPONSE_DYNAMIC_METADATA",
        "TOLLGATE_RLS_DYNAMIC_METADATA",
        switch,
    ),
];

/// Read only with `CONFIG_TYPE=GRPC_XDS_SOTW` (upstream ignores them otherwise).
pub const XDS: &[Row] = &[
    row("CONFIG_GRPC_XDS_NODE_ID", "TOLLGATE_XDS_NODE_ID", verbatim),
    row(
        "CONFIG_GRPC_XDS_NODE_METADATA",
        "TOLLGATE_XDS_NODE_METADATA",
        node_metadata,
    ),
    row(
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        "TOLLGATE_XDS_HEADERS",
        pairs,
    ),
    row(
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "TOLLGATE_XDS_BACKOFF_INITIAL",
        duration,
    ),
    row(
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        "TOLLGATE_XDS_BACKOFF_MAX",
        duration,
    ),
    row(
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "TOLLGATE_FORCE_START_WITHOUT_INITIAL_CONFIG",
        switch,
    ),
];

/// Read only with `CONFIG_TYPE=GRPC_XDS_SOTW` and `CONFIG_GRPC_XDS_SERVER_USE_TLS=true`.
pub const XDS_TLS: &[Row] = &[
    row(
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        "TOLLGATE_XDS_CA_FILE",
        verbatim,
    ),
    row(
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "TOLLGATE_XDS_CERT_FILE",
        verbatim,
    ),
    row(
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        "TOLLGATE_XDS_KEY_FILE",
        verbatim,
    ),
    row(
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        "TOLLGATE_XDS_SERVER_NAME",
        verbatim,
    ),
];

/// What a known variable's value must not be.
#[derive(Debug, Clone, Copy)]
pub enum Refused {
    /// Refused when it is a true boolean.
    True,
    /// Refused when set at all.
    Set,
    /// Refused unless it is this value (any case).
    Not(&'static str),
}

/// A known variable tollgate cannot honour (with the value that it cannot), and why.
#[derive(Debug, Clone, Copy)]
pub struct Unhonourable {
    pub var: &'static str,
    pub refused: Refused,
    pub why: &'static str,
}

const fn refuse(var: &'static str, refused: Refused, why: &'static str) -> Unhonourable {
    Unhonourable { var, refused, why }
}

pub const UNHONOURABLE: &[Unhonourable] = &[
    refuse(
        "BACKEND_TYPE",
        Refused::Not("redis"),
        "tollgate keeps counters in Redis (or in memory); memcache is not supported",
    ),
    refuse(
        "MERGE_DOMAIN_CONFIG",
        Refused::True,
        "a domain spread over several files is refused; keep each domain in one file",
    ),
    refuse(
        "USE_STATSD",
        Refused::True,
        "tollgate sends no statsd; it serves Prometheus metrics at /metrics on the HTTP port (set USE_STATSD=false)",
    ),
    refuse(
        "USE_DOG_STATSD",
        Refused::True,
        "tollgate sends no statsd; it serves Prometheus metrics at /metrics on the HTTP port",
    ),
    refuse(
        "REDIS_PERSECOND",
        Refused::True,
        "a second Redis for per-second limits is not supported; every limit uses REDIS_URL",
    ),
    refuse(
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        Refused::True,
        "/healthcheck answers 200 while Redis is down (the failure postures answer); /readyz reports the store",
    ),
    refuse(
        "GRPC_UDS",
        Refused::Set,
        "the gRPC service listens on TCP only (GRPC_HOST and GRPC_PORT)",
    ),
    refuse(
        "SHADOW_MODE",
        Refused::True,
        "there is no global shadow mode; set shadow_mode: true on the rules",
    ),
    refuse(
        "QUOTA_MODE",
        Refused::True,
        "there is no global quota mode; set quota_mode on the descriptors",
    ),
    refuse(
        "TRACING_ENABLED",
        Refused::True,
        "tollgate exports no OpenTelemetry traces",
    ),
];
