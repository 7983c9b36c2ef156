//! `tollgate serve`'s arguments: each flag, its environment variable and default, and the
//! checks clap runs on its value.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tollgate::policy::ChargeMode;
use tollgate::resilience::Posture;
use tollgate::store::CoalesceOptions;
use tollgate_server::http::authorize::DescriptorMapping;

use crate::arg_values::{
    any_duration, domain_name, header_name, humantime_duration, positive, share, watch_duration,
};
use crate::grpc_limits::GrpcLimitArgs;
use crate::grpc_tls::GrpcTlsArgs;
use crate::xds_args::XdsArgs;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Policy file, or a directory of `*.yaml` / `*.yml` files. Required unless
    /// `--config-source` is given (then it is not read).
    // Checked in `run`, not by clap: upstream's RUNTIME_ROOT sets it as a default, which clap's
    // required check does not count.
    #[arg(long, env = "TOLLGATE_CONFIG", value_name = "PATH")]
    pub(crate) config: Option<PathBuf>,
    /// Address of the HTTP/JSON API (`/v1/check`, `/v1/explain`, `/json`, `/v1/authorize`,
    /// `/healthz`, `/readyz`, `/healthcheck`, `/metrics`).
    #[arg(
        long,
        env = "TOLLGATE_HTTP_ADDR",
        default_value = "127.0.0.1:8080",
        value_name = "ADDR"
    )]
    pub(crate) http_addr: SocketAddr,
    /// Address of the Envoy RLS v3 gRPC service.
    #[arg(
        long,
        env = "TOLLGATE_GRPC_ADDR",
        default_value = "127.0.0.1:8081",
        value_name = "ADDR"
    )]
    pub(crate) grpc_addr: SocketAddr,
    /// Where counters live: `memory` (embedded, the default), `redis://[user:pass@]host:port[/db]`,
    /// `rediss://...` (TLS), or `redis+cluster://host:port[,host:port...]`.
    // Read as text and parsed after start-up, not by clap, and the variable's value kept out
    // of `--help`: clap would show a password in either.
    #[arg(
        long,
        default_value = "memory",
        value_name = "URL",
        env = "TOLLGATE_STORE",
        hide_env_values = true
    )]
    pub(crate) store: StoreText,
    /// Deadline of every Redis call from when it is sent; keep it well under Envoy's 20 ms
    /// request timeout. A call past it fails (the failure posture answers) unless Redis is
    /// answering other calls meanwhile: then it is busy, not failing, and the call waits on.
    #[arg(long, env = "TOLLGATE_STORE_TIMEOUT", default_value = "10ms", value_parser = humantime_duration, value_name = "DURATION")]
    pub(crate) store_timeout: Duration,
    /// The most a decision waits for Redis in all (tollgate's queue, the in-flight cap, a busy
    /// Redis); past it the failure posture answers for load (tollgate_store_shed_total).
    #[arg(long, env = "TOLLGATE_STORE_MAX_WAIT", default_value = "5s", value_parser = humantime_duration, value_name = "DURATION")]
    pub(crate) store_max_wait: Duration,
    /// Time allowed to open a Redis connection.
    #[arg(long, env = "TOLLGATE_STORE_CONNECT_TIMEOUT", default_value = "1s", value_parser = humantime_duration, value_name = "DURATION")]
    pub(crate) store_connect_timeout: Duration,
    /// Decisions sent to Redis at once; more wait their turn (on one server, joining larger
    /// batches), up to --store-max-wait.
    #[arg(long, env = "TOLLGATE_STORE_MAX_IN_FLIGHT", default_value_t = 1024, value_parser = positive::<usize>, value_name = "N")]
    pub(crate) store_max_in_flight: usize,
    /// Single Redis server: most concurrent decisions sent in one script call (coalescing);
    /// 0 sends one call per decision.
    #[arg(long, env = "TOLLGATE_STORE_BATCH", default_value_t = CoalesceOptions::default().max_batch, value_name = "N")]
    pub(crate) store_batch: usize,
    /// How long a decision waits for others to share its script call; 0 sends at once what is
    /// queued (batches still form while earlier ones are out). Timers tick in milliseconds.
    #[arg(long, env = "TOLLGATE_STORE_BATCH_WINDOW", default_value = "0s", value_parser = any_duration, value_name = "DURATION")]
    pub(crate) store_batch_window: Duration,
    /// Batched script calls outstanding at once per Redis server.
    #[arg(long, env = "TOLLGATE_STORE_BATCHES_IN_FLIGHT", default_value_t = CoalesceOptions::default().in_flight, value_parser = positive::<usize>, value_name = "N")]
    pub(crate) store_batches_in_flight: usize,
    /// Failure posture of limits without `on_store_error`: open (allow, marked degraded),
    /// closed (deny as unavailable, HTTP 503) or local (in-process with `--local-share`).
    #[arg(
        long,
        env = "TOLLGATE_ON_STORE_ERROR",
        default_value = "open",
        value_name = "POSTURE"
    )]
    pub(crate) on_store_error: Posture,
    /// `charge` of rules that do not set one: whole (a cost that does not fit is denied) or
    /// up_to_limit (admitted while a unit is left, charged what is left). For policies that
    /// cannot say it, such as those xDS sends; a rule with `local_budget` stays whole.
    #[arg(
        long,
        default_value = "whole",
        value_name = "CHARGE",
        env = "TOLLGATE_DEFAULT_CHARGE"
    )]
    pub(crate) default_charge: ChargeMode,
    /// Share of each limit enforced in-process by the `local` posture, for limits without
    /// `local_share` (e.g. 0.25 with four replicas).
    #[arg(long, env = "TOLLGATE_LOCAL_SHARE", default_value_t = 1.0, value_parser = share, value_name = "FRACTION")]
    pub(crate) local_share: f64,
    /// Consecutive store failures that open a node's circuit breaker.
    #[arg(long, env = "TOLLGATE_BREAKER_FAILURES", default_value_t = 5, value_parser = positive::<u32>, value_name = "N")]
    pub(crate) breaker_failures: u32,
    /// How long an open breaker refuses calls before it lets a probe through.
    #[arg(long, env = "TOLLGATE_BREAKER_OPEN_FOR", default_value = "500ms", value_parser = humantime_duration, value_name = "DURATION")]
    pub(crate) breaker_open_for: Duration,
    /// Address of the admin API (policy versions, push, rollback, reload, overrides). Loopback
    /// by default; any other address requires a token.
    #[arg(
        long,
        env = "TOLLGATE_ADMIN_ADDR",
        default_value = "127.0.0.1:9090",
        value_name = "ADDR"
    )]
    pub(crate) admin_addr: SocketAddr,
    /// File holding the admin bearer token (or set `TOLLGATE_ADMIN_TOKEN`). When set, every
    /// admin request needs `Authorization: Bearer TOKEN`.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN_FILE", value_name = "PATH")]
    pub(crate) admin_token_file: Option<PathBuf>,
    /// File holding a read-only token for the dashboard (or set `TOLLGATE_ADMIN_READ_TOKEN`):
    /// it reads the dashboard's data, never changes anything. Needs `--admin-token-file`.
    #[arg(long, env = "TOLLGATE_ADMIN_READ_TOKEN_FILE", value_name = "PATH")]
    pub(crate) admin_read_token_file: Option<PathBuf>,
    /// How often the config path (and the gRPC TLS files) are checked for changes (content
    /// hash; survives editors' rename-and-replace and Kubernetes ConfigMap symlink swaps). `0s`
    /// disables watching; SIGHUP and `POST /v1/admin/reload` still reload the policy. At least
    /// 100ms.
    #[arg(long, env = "TOLLGATE_WATCH_INTERVAL", default_value = "1s", value_parser = watch_duration, value_name = "DURATION")]
    pub(crate) watch_interval: Duration,
    /// With a Redis store: how often a replica checks for a policy another replica published.
    #[arg(long, env = "TOLLGATE_POLICY_SYNC_INTERVAL", default_value = "500ms", value_parser = humantime_duration, value_name = "DURATION")]
    pub(crate) policy_sync_interval: Duration,
    /// Most bytes of policy source texts (file names and texts) the kept versions hold, besides
    /// the 50 versions kept at most: past it the oldest go first, never the running version or
    /// the one `tollgate policy rollback` goes to. `64MiB`, `1GiB` or a number of bytes.
    #[arg(long, env = "TOLLGATE_POLICY_HISTORY_MAX_BYTES", default_value = "64MiB", value_parser = crate::grpc_limits::bytes, value_name = "BYTES")]
    pub(crate) policy_history_max_bytes: usize,
    /// Log format: `text` or `json`.
    #[arg(long, env = "TOLLGATE_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"], value_name = "FORMAT")]
    pub(crate) log_format: String,
    /// Least severe log level written: `trace`, `debug`, `info`, `warn` or `error`. `RUST_LOG`,
    /// when set, takes its place (it can also set levels per module).
    #[arg(long, env = "TOLLGATE_LOG_LEVEL", default_value = "info", value_parser = ["trace", "debug", "info", "warn", "error"], value_name = "LEVEL")]
    pub(crate) log_level: String,
    /// Enables forward auth for nginx `auth_request` on the HTTP listener (`/v1/authorize`):
    /// every forwarded request is checked in this domain. Without it the endpoint answers 404.
    /// Needs at least one `--authorize-descriptor` (without one it would allow everything).
    #[arg(long, env = "TOLLGATE_AUTHORIZE_DOMAIN", value_name = "DOMAIN", requires = "authorize_descriptor", value_parser = domain_name)]
    pub(crate) authorize_domain: Option<String>,
    /// One descriptor built from each `/v1/authorize` request (repeatable; all go in ONE check):
    /// comma-separated `descriptor_key=SOURCE` entries, SOURCE being `header:NAME`, `client_ip`
    /// (first `X-Forwarded-For` address, else `X-Real-IP`), `method` (`X-Original-Method`) or
    /// `path` (path of `X-Original-URI`). A descriptor with a missing source is skipped; with
    /// none left the request is allowed. Example: `api_key=header:x-api-key,path=path`.
    #[arg(
        long,
        env = "TOLLGATE_AUTHORIZE_DESCRIPTOR",
        value_name = "KEY=SOURCE,...",
        requires = "authorize_domain"
    )]
    pub(crate) authorize_descriptor: Vec<DescriptorMapping>,
    /// Most runtime overrides in force (set through the admin API): a set that would pass it is
    /// refused with 409 naming the cap, and a bulk set that would is refused whole.
    #[arg(long, env = "TOLLGATE_MAX_OVERRIDES", default_value_t = tollgate::limiter::DEFAULT_MAX_OVERRIDES, value_parser = positive::<usize>, value_name = "N")]
    pub(crate) max_overrides: usize,
    /// Do not remember the shared store's denials (the prefilter answers a key denied until
    /// its retry-after without calling Redis; see the README).
    #[arg(long, env = "TOLLGATE_NO_PREFILTER")]
    pub(crate) no_prefilter: bool,
    /// Leave X-RateLimit-Limit, -Remaining and -Reset out of gRPC answers'
    /// `response_headers_to_add`, for an Envoy that adds its own (`enable_x_ratelimit_headers`,
    /// as Envoy Gateway sets it); RateLimit, RateLimit-Policy and Retry-After are still sent.
    #[arg(long, env = "TOLLGATE_NO_RLS_X_RATELIMIT_HEADERS")]
    pub(crate) no_rls_x_ratelimit_headers: bool,
    /// Send `dynamic_metadata` in gRPC answers, as envoyproxy/ratelimit does with
    /// `RESPONSE_DYNAMIC_METADATA=true`: the request's domain, descriptors and hits, and the
    /// merged policy `metadata` of every limit that admitted. Off by default.
    #[arg(long, env = "TOLLGATE_RLS_DYNAMIC_METADATA")]
    pub(crate) rls_dynamic_metadata: bool,
    /// Answer gRPC checks with envoyproxy/ratelimit's three response headers instead of
    /// tollgate's (as its `LIMIT_RESPONSE_HEADERS_ENABLED=true`): the limit, remaining count and
    /// seconds to reset of the descriptor closest to its limit (an over-limit one first), on OK
    /// and OVER_LIMIT answers alike; named by `--rls-header-limit`, `-remaining`, `-reset`.
    #[arg(long, env = "TOLLGATE_RLS_UPSTREAM_HEADERS")]
    pub(crate) rls_upstream_headers: bool,
    /// Name of the limit header `--rls-upstream-headers` sends.
    #[arg(long, env = "TOLLGATE_RLS_HEADER_LIMIT", default_value = "RateLimit-Limit", value_parser = header_name, value_name = "NAME")]
    pub(crate) rls_header_limit: String,
    /// Name of the remaining-count header `--rls-upstream-headers` sends.
    #[arg(long, env = "TOLLGATE_RLS_HEADER_REMAINING", default_value = "RateLimit-Remaining", value_parser = header_name, value_name = "NAME")]
    pub(crate) rls_header_remaining: String,
    /// Name of the reset header (whole seconds) `--rls-upstream-headers` sends.
    #[arg(long, env = "TOLLGATE_RLS_HEADER_RESET", default_value = "RateLimit-Reset", value_parser = header_name, value_name = "NAME")]
    pub(crate) rls_header_reset: String,
    /// Address of a read-only debug listener, as envoyproxy/ratelimit's `DEBUG_PORT`: `GET
    /// /rlconfig` answers the loaded limits as text, one line each; nothing else is served
    /// (never the admin API). Off unless given.
    #[arg(long, env = "TOLLGATE_DEBUG_ADDR", value_name = "ADDR")]
    pub(crate) debug_addr: Option<SocketAddr>,
    /// Address of a listener serving only `GET /metrics` (the HTTP port's exposition), as
    /// envoyproxy/ratelimit's `PROMETHEUS_ADDR`. Off unless given; `/metrics` on the HTTP port
    /// stays either way.
    #[arg(long, env = "TOLLGATE_METRICS_ADDR", value_name = "ADDR")]
    pub(crate) metrics_addr: Option<SocketAddr>,
    /// How often expired counters are dropped from the in-memory store.
    #[arg(long, env = "TOLLGATE_SWEEP_INTERVAL", default_value = "1s", value_parser = humantime_duration, value_name = "DURATION")]
    pub(crate) sweep_interval: Duration,
    /// Most keys the in-memory store holds (about 150 bytes each, more for a sliding log's):
    /// past it a request that needs a new key takes its failure posture, so a flood of new
    /// keys cannot grow the process until it is killed. The `local` posture's store holds as
    /// many at most; past that, a new key is allowed uncounted.
    #[arg(long, env = "TOLLGATE_MEMORY_MAX_KEYS", default_value_t = DEFAULT_MEMORY_MAX_KEYS, value_parser = positive::<usize>, value_name = "N")]
    pub(crate) memory_max_keys: usize,
    /// Most bytes the in-memory store's keys are estimated to hold (144 each, a longer key's
    /// buffer, a sliding log's entries at 16 bytes each): past it a request that needs a new
    /// key takes its failure posture, as past `--memory-max-keys`; keys held keep deciding.
    /// The `local` posture's store has the same bound. Off unless given. `4GiB`, `512MB` or a
    /// number of bytes.
    #[arg(long, env = "TOLLGATE_MEMORY_MAX_BYTES", value_parser = crate::grpc_limits::bytes, value_name = "BYTES")]
    pub(crate) memory_max_bytes: Option<usize>,
    /// On SIGTERM or Ctrl-C, how long requests in flight may take to finish before the
    /// connections still open are closed (a client that never answers the server's goodbye
    /// would otherwise hold the shutdown forever). A second signal stops at once. The exit
    /// status is 0 after a complete drain, 3 after one cut short either way.
    #[arg(long, env = "TOLLGATE_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = any_duration, value_name = "DURATION")]
    pub(crate) shutdown_timeout: Duration,
    /// gRPC connections idle this long get an HTTP/2 ping, and are closed when it goes
    /// unanswered for `--grpc-keepalive-timeout`: a client that vanished (a partition, a NAT
    /// that forgot the connection) does not hold one forever. `0s` disables the pings.
    #[arg(long, env = "TOLLGATE_GRPC_KEEPALIVE", default_value = "60s", value_parser = any_duration, value_name = "DURATION")]
    pub(crate) grpc_keepalive: Duration,
    /// How long a gRPC keepalive ping may go unanswered; also how long a new gRPC connection
    /// may take to send HTTP/2's preface, after its TLS handshake if any (the pings start only
    /// after the preface).
    #[arg(long, env = "TOLLGATE_GRPC_KEEPALIVE_TIMEOUT", default_value = "20s", value_parser = humantime_duration, value_name = "DURATION")]
    pub(crate) grpc_keepalive_timeout: Duration,
    /// How long an HTTP connection (API and admin) waits for its client: for a request's
    /// headers after it opens or after its previous answer (so a keep-alive connection idle
    /// this long is closed), then again for the body (`408` after it), and for the client to
    /// take its answer. A client sending half a request, or a byte at a time, is closed.
    #[arg(long, env = "TOLLGATE_HTTP_READ_TIMEOUT", default_value = "60s", value_parser = humantime_duration, value_name = "DURATION")]
    pub(crate) http_read_timeout: Duration,
    #[command(flatten)]
    pub(crate) grpc_tls: GrpcTlsArgs,
    #[command(flatten)]
    pub(crate) xds: XdsArgs,
    #[command(flatten)]
    pub(crate) grpc_limits: GrpcLimitArgs,
}

/// `--memory-max-keys`' default: about 1.5 GB of GCRA or fixed-window counters.
const DEFAULT_MEMORY_MAX_KEYS: usize = 10_000_000;

/// `--store` as given, read by clap without a check (its error would echo a password): shown,
/// it is redacted, so no log line can print the password by mistake.
#[derive(Clone)]
pub(crate) struct StoreText(pub(crate) String);

impl std::fmt::Debug for StoreText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for StoreText {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(StoreText(s.to_owned()))
    }
}

impl std::fmt::Display for StoreText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&tollgate::store::redact(&self.0))
    }
}

impl ServeArgs {
    /// Whether the logs are JSON (`--log-format json`).
    pub fn logs_json(&self) -> bool {
        self.log_format == "json"
    }
}
