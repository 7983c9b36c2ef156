//! `tollgate serve`: load the policy, start both transports, stop cleanly on SIGTERM/Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::sync::watch;
use tollgate::background::supervise;
use tollgate::limiter::FailureSettings;
use tollgate::policy::{ChargeMode, Policy, PolicyDefaults};
use tollgate::resilience::{BreakerConfig, Posture};
use tollgate::service::{BuildError, Service, Upkeep};
use tollgate::store::{CoalesceOptions, RedisOptions, StoreUrl};
use tollgate_server::grpc::{HealthService, RlsService, UpstreamHeaders};
use tollgate_server::http::authorize::{AuthorizeMapping, DescriptorMapping};
use tollgate_server::listen::{
    Drained, Gauge, Open, Peer, bind, capped, counted, grpc_accepted, grpc_server, metered,
    preface_within, serve_http, stopped,
};
use tracing::{info, warn};

use crate::grpc_limits::GrpcLimitArgs;
use crate::grpc_tls::GrpcTlsArgs;
use crate::xds_args::XdsArgs;

/// How `serve` exits when the drain was cut: connections (or a give-back to a hung store) were
/// still open when `--shutdown-timeout` ran out or a second signal came. A complete drain exits
/// 0; 1 and 2 are taken by a refused start (an invalid policy, other errors).
const CUT_EXIT_CODE: u8 = 3;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Policy file, or a directory of `*.yaml` / `*.yml` files. Required unless
    /// `--config-source` is given (then it is not read).
    // Checked in `run`, not by clap: upstream's RUNTIME_ROOT sets it as a default, which clap's
    // required check does not count.
    #[arg(long, env = "TOLLGATE_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    /// Address of the HTTP/JSON API (`/v1/check`, `/v1/explain`, `/json`, `/v1/authorize`,
    /// `/healthz`, `/readyz`, `/healthcheck`, `/metrics`).
    #[arg(
        long,
        env = "TOLLGATE_HTTP_ADDR",
        default_value = "127.0.0.1:8080",
        value_name = "ADDR"
    )]
    http_addr: SocketAddr,
    /// Address of the Envoy RLS v3 gRPC service.
    #[arg(
        long,
        env = "TOLLGATE_GRPC_ADDR",
        default_value = "127.0.0.1:8081",
        value_name = "ADDR"
    )]
    grpc_addr: SocketAddr,
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
    store: StoreText,
    /// Deadline of every Redis call from when it is sent; keep it well under Envoy's 20 ms
    /// request timeout. A call past it fails (the failure posture answers) unless Redis is
    /// answering other calls meanwhile: then it is busy, not failing, and the call waits on.
    #[arg(long, env = "TOLLGATE_STORE_TIMEOUT", default_value = "10ms", value_parser = humantime_duration, value_name = "DURATION")]
    store_timeout: Duration,
    /// The most a decision waits for Redis in all (tollgate's queue, the in-flight cap, a busy
    /// Redis); past it the failure posture answers for load (tollgate_store_shed_total).
    #[arg(long, env = "TOLLGATE_STORE_MAX_WAIT", default_value = "5s", value_parser = humantime_duration, value_name = "DURATION")]
    store_max_wait: Duration,
    /// Time allowed to open a Redis connection.
    #[arg(long, env = "TOLLGATE_STORE_CONNECT_TIMEOUT", default_value = "1s", value_parser = humantime_duration, value_name = "DURATION")]
    store_connect_timeout: Duration,
    /// Decisions sent to Redis at once; more wait their turn (on one server, joining larger
    /// batches), up to --store-max-wait.
    #[arg(long, env = "TOLLGATE_STORE_MAX_IN_FLIGHT", default_value_t = 1024, value_parser = positive::<usize>, value_name = "N")]
    store_max_in_flight: usize,
    /// Single Redis server: most concurrent decisions sent in one script call (coalescing);
    /// 0 sends one call per decision.
    #[arg(long, env = "TOLLGATE_STORE_BATCH", default_value_t = CoalesceOptions::default().max_batch, value_name = "N")]
    store_batch: usize,
    /// How long a decision waits for others to share its script call; 0 sends at once what is
    /// queued (batches still form while earlier ones are out). Timers tick in milliseconds.
    #[arg(long, env = "TOLLGATE_STORE_BATCH_WINDOW", default_value = "0s", value_parser = any_duration, value_name = "DURATION")]
    store_batch_window: Duration,
    /// Batched script calls outstanding at once per Redis server.
    #[arg(long, env = "TOLLGATE_STORE_BATCHES_IN_FLIGHT", default_value_t = CoalesceOptions::default().in_flight, value_parser = positive::<usize>, value_name = "N")]
    store_batches_in_flight: usize,
    /// Failure posture of limits without `on_store_error`: open (allow, marked degraded),
    /// closed (deny as unavailable, HTTP 503) or local (in-process with `--local-share`).
    #[arg(
        long,
        env = "TOLLGATE_ON_STORE_ERROR",
        default_value = "open",
        value_name = "POSTURE"
    )]
    on_store_error: Posture,
    /// `charge` of rules that do not set one: whole (a cost that does not fit is denied) or
    /// up_to_limit (admitted while a unit is left, charged what is left). For policies that
    /// cannot say it, such as those xDS sends; a rule with `local_budget` stays whole.
    #[arg(
        long,
        default_value = "whole",
        value_name = "CHARGE",
        env = "TOLLGATE_DEFAULT_CHARGE"
    )]
    default_charge: ChargeMode,
    /// Share of each limit enforced in-process by the `local` posture, for limits without
    /// `local_share` (e.g. 0.25 with four replicas).
    #[arg(long, env = "TOLLGATE_LOCAL_SHARE", default_value_t = 1.0, value_parser = share, value_name = "FRACTION")]
    local_share: f64,
    /// Consecutive store failures that open a node's circuit breaker.
    #[arg(long, env = "TOLLGATE_BREAKER_FAILURES", default_value_t = 5, value_parser = positive::<u32>, value_name = "N")]
    breaker_failures: u32,
    /// How long an open breaker refuses calls before it lets a probe through.
    #[arg(long, env = "TOLLGATE_BREAKER_OPEN_FOR", default_value = "500ms", value_parser = humantime_duration, value_name = "DURATION")]
    breaker_open_for: Duration,
    /// Address of the admin API (policy versions, push, rollback, reload, overrides). Loopback
    /// by default; any other address requires a token.
    #[arg(
        long,
        env = "TOLLGATE_ADMIN_ADDR",
        default_value = "127.0.0.1:9090",
        value_name = "ADDR"
    )]
    admin_addr: SocketAddr,
    /// File holding the admin bearer token (or set `TOLLGATE_ADMIN_TOKEN`). When set, every
    /// admin request needs `Authorization: Bearer TOKEN`.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN_FILE", value_name = "PATH")]
    admin_token_file: Option<PathBuf>,
    /// File holding a read-only token for the dashboard (or set `TOLLGATE_ADMIN_READ_TOKEN`):
    /// it reads the dashboard's data, never changes anything. Needs `--admin-token-file`.
    #[arg(long, env = "TOLLGATE_ADMIN_READ_TOKEN_FILE", value_name = "PATH")]
    admin_read_token_file: Option<PathBuf>,
    /// How often the config path (and the gRPC TLS files) are checked for changes (content
    /// hash; survives editors' rename-and-replace and Kubernetes ConfigMap symlink swaps). `0s`
    /// disables watching; SIGHUP and `POST /v1/admin/reload` still reload the policy. At least
    /// 100ms.
    #[arg(long, env = "TOLLGATE_WATCH_INTERVAL", default_value = "1s", value_parser = watch_duration, value_name = "DURATION")]
    watch_interval: Duration,
    /// With a Redis store: how often a replica checks for a policy another replica published.
    #[arg(long, env = "TOLLGATE_POLICY_SYNC_INTERVAL", default_value = "500ms", value_parser = humantime_duration, value_name = "DURATION")]
    policy_sync_interval: Duration,
    /// Most bytes of policy source texts (file names and texts) the kept versions hold, besides
    /// the 50 versions kept at most: past it the oldest go first, never the running version or
    /// the one `tollgate policy rollback` goes to. `64MiB`, `1GiB` or a number of bytes.
    #[arg(long, env = "TOLLGATE_POLICY_HISTORY_MAX_BYTES", default_value = "64MiB", value_parser = crate::grpc_limits::bytes, value_name = "BYTES")]
    policy_history_max_bytes: usize,
    /// Log format: `text` or `json`.
    #[arg(long, env = "TOLLGATE_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"], value_name = "FORMAT")]
    log_format: String,
    /// Least severe log level written: `trace`, `debug`, `info`, `warn` or `error`. `RUST_LOG`,
    /// when set, takes its place (it can also set levels per module).
    #[arg(long, env = "TOLLGATE_LOG_LEVEL", default_value = "info", value_parser = ["trace", "debug", "info", "warn", "error"], value_name = "LEVEL")]
    log_level: String,
    /// Enables forward auth for nginx `auth_request` on the HTTP listener (`/v1/authorize`):
    /// every forwarded request is checked in this domain. Without it the endpoint answers 404.
    /// Needs at least one `--authorize-descriptor` (without one it would allow everything).
    #[arg(long, env = "TOLLGATE_AUTHORIZE_DOMAIN", value_name = "DOMAIN", requires = "authorize_descriptor", value_parser = domain_name)]
    authorize_domain: Option<String>,
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
    authorize_descriptor: Vec<DescriptorMapping>,
    /// Most runtime overrides in force (set through the admin API): a set that would pass it is
    /// refused with 409 naming the cap, and a bulk set that would is refused whole.
    #[arg(long, env = "TOLLGATE_MAX_OVERRIDES", default_value_t = tollgate::limiter::DEFAULT_MAX_OVERRIDES, value_parser = positive::<usize>, value_name = "N")]
    max_overrides: usize,
    /// Do not remember the shared store's denials (the prefilter answers a key denied until
    /// its retry-after without calling Redis; see the README).
    #[arg(long, env = "TOLLGATE_NO_PREFILTER")]
    no_prefilter: bool,
    /// Leave X-RateLimit-Limit, -Remaining and -Reset out of gRPC answers'
    /// `response_headers_to_add`, for an Envoy that adds its own (`enable_x_ratelimit_headers`,
    /// as Envoy Gateway sets it); RateLimit, RateLimit-Policy and Retry-After are still sent.
    #[arg(long, env = "TOLLGATE_NO_RLS_X_RATELIMIT_HEADERS")]
    no_rls_x_ratelimit_headers: bool,
    /// Send `dynamic_metadata` in gRPC answers, as envoyproxy/ratelimit does with
    /// `RESPONSE_DYNAMIC_METADATA=true`: the request's domain, descriptors and hits, and the
    /// merged policy `metadata` of every limit that admitted. Off by default.
    #[arg(long, env = "TOLLGATE_RLS_DYNAMIC_METADATA")]
    rls_dynamic_metadata: bool,
    /// Answer gRPC checks with envoyproxy/ratelimit's three response headers instead of
    /// tollgate's (as its `LIMIT_RESPONSE_HEADERS_ENABLED=true`): the limit, remaining count and
    /// seconds to reset of the descriptor closest to its limit (an over-limit one first), on OK
    /// and OVER_LIMIT answers alike; named by `--rls-header-limit`, `-remaining`, `-reset`.
    #[arg(long, env = "TOLLGATE_RLS_UPSTREAM_HEADERS")]
    rls_upstream_headers: bool,
    /// Name of the limit header `--rls-upstream-headers` sends.
    #[arg(long, env = "TOLLGATE_RLS_HEADER_LIMIT", default_value = "RateLimit-Limit", value_parser = header_name, value_name = "NAME")]
    rls_header_limit: String,
    /// Name of the remaining-count header `--rls-upstream-headers` sends.
    #[arg(long, env = "TOLLGATE_RLS_HEADER_REMAINING", default_value = "RateLimit-Remaining", value_parser = header_name, value_name = "NAME")]
    rls_header_remaining: String,
    /// Name of the reset header (whole seconds) `--rls-upstream-headers` sends.
    #[arg(long, env = "TOLLGATE_RLS_HEADER_RESET", default_value = "RateLimit-Reset", value_parser = header_name, value_name = "NAME")]
    rls_header_reset: String,
    /// Address of a read-only debug listener, as envoyproxy/ratelimit's `DEBUG_PORT`: `GET
    /// /rlconfig` answers the loaded limits as text, one line each; nothing else is served
    /// (never the admin API). Off unless given.
    #[arg(long, env = "TOLLGATE_DEBUG_ADDR", value_name = "ADDR")]
    debug_addr: Option<SocketAddr>,
    /// Address of a listener serving only `GET /metrics` (the HTTP port's exposition), as
    /// envoyproxy/ratelimit's `PROMETHEUS_ADDR`. Off unless given; `/metrics` on the HTTP port
    /// stays either way.
    #[arg(long, env = "TOLLGATE_METRICS_ADDR", value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// How often expired counters are dropped from the in-memory store.
    #[arg(long, env = "TOLLGATE_SWEEP_INTERVAL", default_value = "1s", value_parser = humantime_duration, value_name = "DURATION")]
    sweep_interval: Duration,
    /// Most keys the in-memory store holds (about 150 bytes each, more for a sliding log's):
    /// past it a request that needs a new key takes its failure posture, so a flood of new
    /// keys cannot grow the process until it is killed. The `local` posture's store holds as
    /// many at most; past that, a new key is allowed uncounted.
    #[arg(long, env = "TOLLGATE_MEMORY_MAX_KEYS", default_value_t = DEFAULT_MEMORY_MAX_KEYS, value_parser = positive::<usize>, value_name = "N")]
    memory_max_keys: usize,
    /// Most bytes the in-memory store's keys are estimated to hold (144 each, a longer key's
    /// buffer, a sliding log's entries at 16 bytes each): past it a request that needs a new
    /// key takes its failure posture, as past `--memory-max-keys`; keys held keep deciding.
    /// The `local` posture's store has the same bound. Off unless given. `4GiB`, `512MB` or a
    /// number of bytes.
    #[arg(long, env = "TOLLGATE_MEMORY_MAX_BYTES", value_parser = crate::grpc_limits::bytes, value_name = "BYTES")]
    memory_max_bytes: Option<usize>,
    /// On SIGTERM or Ctrl-C, how long requests in flight may take to finish before the
    /// connections still open are closed (a client that never answers the server's goodbye
    /// would otherwise hold the shutdown forever). A second signal stops at once. The exit
    /// status is 0 after a complete drain, 3 after one cut short either way.
    #[arg(long, env = "TOLLGATE_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = any_duration, value_name = "DURATION")]
    shutdown_timeout: Duration,
    /// gRPC connections idle this long get an HTTP/2 ping, and are closed when it goes
    /// unanswered for `--grpc-keepalive-timeout`: a client that vanished (a partition, a NAT
    /// that forgot the connection) does not hold one forever. `0s` disables the pings.
    #[arg(long, env = "TOLLGATE_GRPC_KEEPALIVE", default_value = "60s", value_parser = any_duration, value_name = "DURATION")]
    grpc_keepalive: Duration,
    /// How long a gRPC keepalive ping may go unanswered; also how long a new gRPC connection
    /// may take to send HTTP/2's preface, after its TLS handshake if any (the pings start only
    /// after the preface).
    #[arg(long, env = "TOLLGATE_GRPC_KEEPALIVE_TIMEOUT", default_value = "20s", value_parser = humantime_duration, value_name = "DURATION")]
    grpc_keepalive_timeout: Duration,
    /// How long an HTTP connection (API and admin) waits for its client: for a request's
    /// headers after it opens or after its previous answer (so a keep-alive connection idle
    /// this long is closed), then again for the body (`408` after it), and for the client to
    /// take its answer. A client sending half a request, or a byte at a time, is closed.
    #[arg(long, env = "TOLLGATE_HTTP_READ_TIMEOUT", default_value = "60s", value_parser = humantime_duration, value_name = "DURATION")]
    http_read_timeout: Duration,
    #[command(flatten)]
    grpc_tls: GrpcTlsArgs,
    #[command(flatten)]
    xds: XdsArgs,
    #[command(flatten)]
    grpc_limits: GrpcLimitArgs,
}

fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("`{s}` is not a share above 0 and at most 1")),
    }
}

/// A duration of at most a day: no setting of `serve` is meant to be longer, and a longer one
/// (up to `u64::MAX` seconds parses) would overflow the deadlines computed from it.
fn any_duration(s: &str) -> Result<Duration, String> {
    let parsed = humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration such as 500ms or 2s: {e}"))?;
    if parsed > tollgate::store::MAX_SETTING {
        return Err(format!(
            "`{s}` is more than a day (24h), the most this setting takes"
        ));
    }
    Ok(parsed)
}

/// `--watch-interval`: `0s` (no watching) or at least 100 ms: each check reads and hashes every
/// policy and TLS file, and `1ns` kept most of a core busy doing it.
fn watch_duration(s: &str) -> Result<Duration, String> {
    let parsed = any_duration(s)?;
    if !parsed.is_zero() && parsed < MIN_WATCH_INTERVAL {
        return Err(format!(
            "`{s}` is shorter than {MIN_WATCH_INTERVAL:?}: each check reads every watched file (0s turns watching off)"
        ));
    }
    Ok(parsed)
}

const MIN_WATCH_INTERVAL: Duration = Duration::from_millis(100);

pub(crate) fn humantime_duration(s: &str) -> Result<Duration, String> {
    let parsed = any_duration(s)?;
    if parsed.is_zero() {
        return Err("the interval must be greater than zero".into());
    }
    Ok(parsed)
}

/// `--memory-max-keys`' default: about 1.5 GB of GCRA or fixed-window counters.
const DEFAULT_MEMORY_MAX_KEYS: usize = 10_000_000;

/// A count that must be at least 1.
pub(crate) fn positive<T: std::str::FromStr + PartialOrd + From<u8>>(s: &str) -> Result<T, String> {
    match s.parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        _ => Err(format!("`{s}` is not a whole number of at least 1")),
    }
}

/// A response header name: RFC 9110 token characters, not empty.
fn header_name(s: &str) -> Result<String, String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if s.is_empty() || !s.chars().all(token) {
        return Err(format!("`{s}` is not a header name"));
    }
    Ok(s.to_owned())
}

/// A domain given on the command line: not empty (every check in it would be refused).
fn domain_name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("the domain must not be empty".into());
    }
    Ok(s.to_owned())
}

pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    init_logging_at(&args.log_format, &args.log_level);
    // Parsed here rather than by clap, whose error would echo the URL, password and all.
    let store: StoreUrl = args.store.0.parse().context("--store")?;
    let defaults = PolicyDefaults {
        charge: args.default_charge,
    };
    let xds = args.xds.settings().context("--config-source")?;
    let (config, sources, policy) = match (&xds, &args.config) {
        (Some(xds), config) => {
            if let Some(path) = config {
                warn!(path = %path.display(), "--config is not read: the policy comes from --config-source");
            }
            info!(server = %xds.server, node = %xds.node_id, "The policy comes from an xDS management server");
            (
                None,
                Vec::new(),
                Policy::from_sources_with(&[], defaults).map_err(anyhow::Error::new)?,
            )
        }
        (None, Some(config)) => {
            let compiled = Policy::read_sources(config).and_then(|sources| {
                Policy::from_sources_with(&sources, defaults).map(|policy| (sources, policy))
            });
            let (sources, policy) = match compiled {
                Ok(found) => found,
                Err(errors) => {
                    let summary = format!(
                        "{}: {} problem(s); not starting",
                        config.display(),
                        errors.0.len()
                    );
                    return Ok(not_starting(args.logs_json(), &errors, &summary));
                }
            };
            for rule in policy.rules() {
                info!(domain = %rule.domain, rule = %rule.name, at = %rule.location, "Loaded rule");
            }
            info!(
                path = %config.display(),
                domains = policy.domains().count(),
                rules = policy.rules().len(),
                "Loaded policy"
            );
            (Some(config.clone()), sources, policy)
        }
        (None, None) => anyhow::bail!(
            "no policy: give --config PATH (or TOLLGATE_CONFIG, or upstream's RUNTIME_ROOT) or --config-source xds://HOST:PORT"
        ),
    };
    if let Some(domain) = args.authorize_domain.as_deref()
        && xds.is_none()
        && !policy.has_domain(domain)
    {
        warn!(
            domain,
            "The policy has no rules in the --authorize-domain: /v1/authorize allows everything until a policy that has them is loaded"
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let source = match (xds, config) {
        (Some(xds), _) => Source::Xds(Arc::new(xds)),
        (None, Some(path)) => Source::Files(path, sources),
        (None, None) => anyhow::bail!("give --config or --config-source"),
    };
    let stopped = runtime.block_on(serve(args, store, source, policy));
    // Whatever the drain left (a connection, a call to a hung store) is dropped, not awaited.
    runtime.shutdown_background();
    stopped
}

/// `--store` as given, read by clap without a check (its error would echo a password): shown,
/// it is redacted, so no log line can print the password by mistake.
#[derive(Clone)]
struct StoreText(String);

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

/// Says why the service does not start: `problems`, then `summary`, as plain lines on stderr,
/// or as one JSON log line under `--log-format json` (where every line is a JSON object).
fn not_starting(json: bool, problems: &dyn std::fmt::Display, summary: &str) -> ExitCode {
    if json {
        tracing::error!(problems = %problems, "{summary}");
    } else {
        crate::stdout::errln!("{problems}");
        crate::stdout::errln!("{summary}");
    }
    ExitCode::FAILURE
}

impl ServeArgs {
    /// Whether the logs are JSON (`--log-format json`).
    pub fn logs_json(&self) -> bool {
        self.log_format == "json"
    }
}

pub(crate) fn init_logging(format: &str) {
    init_logging_at(format, "info");
}

/// Logs at `level` and above, unless `RUST_LOG` says otherwise.
fn init_logging_at(format: &str, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    if format == "json" {
        logs.json().init();
    } else {
        logs.init();
    }
}

/// The admin token from `--admin-token-file` or `TOLLGATE_ADMIN_TOKEN`; required when the admin
/// API listens on anything but loopback.
fn admin_token(args: &ServeArgs) -> anyhow::Result<Option<String>> {
    let token = crate::admin_client::read_token(args.admin_token_file.as_deref())?;
    if token.is_none() && !args.admin_addr.ip().is_loopback() {
        anyhow::bail!(
            "the admin API on {} is reachable from other hosts: give a token with --admin-token-file or TOLLGATE_ADMIN_TOKEN",
            args.admin_addr
        );
    }
    Ok(token)
}

/// The dashboard's read-only token from `--admin-read-token-file` or
/// `TOLLGATE_ADMIN_READ_TOKEN`; only beside a full token (without one, everything is open).
fn admin_read_token(args: &ServeArgs, full: Option<&str>) -> anyhow::Result<Option<String>> {
    let read = crate::admin_client::read_token_or(
        args.admin_read_token_file.as_deref(),
        "TOLLGATE_ADMIN_READ_TOKEN",
    )?;
    match (&read, full) {
        (Some(_), None) => anyhow::bail!(
            "a read-only admin token needs a full one (--admin-token-file or TOLLGATE_ADMIN_TOKEN)"
        ),
        (Some(r), Some(f)) if r == f => {
            anyhow::bail!("the read-only admin token is the full one")
        }
        _ => Ok(read),
    }
}

/// Where the policy comes from.
enum Source {
    /// The config path and the sources read from it.
    Files(PathBuf, Vec<(String, String)>),
    /// An xDS management server.
    Xds(Arc<tollgate_server::xds::XdsSettings>),
}

async fn serve(
    args: ServeArgs,
    store_url: StoreUrl,
    source: Source,
    policy: Policy,
) -> anyhow::Result<ExitCode> {
    let token = admin_token(&args)?;
    let read_token = admin_read_token(&args, token.as_deref())?;
    let tls = args.grpc_tls.serving()?;
    if tls.is_some() {
        info!(
            client_certificates = args.grpc_tls.mutual(),
            "gRPC over TLS"
        );
    }
    // Before anything is announced: a SIGHUP must never find the default action (exit).
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let options = RedisOptions {
        connect_timeout: args.store_connect_timeout,
        command_timeout: args.store_timeout,
        max_in_flight: args.store_max_in_flight,
        max_wait: args.store_max_wait,
        breaker: BreakerConfig {
            consecutive_failures: args.breaker_failures,
            open_for: args.breaker_open_for,
            ..BreakerConfig::default()
        },
        coalesce: CoalesceOptions {
            max_batch: args.store_batch,
            window: args.store_batch_window,
            in_flight: args.store_batches_in_flight,
        },
    };
    if !options.coalesce.window_fits(options.command_timeout) {
        anyhow::bail!(
            "--store-batch-window {} is more than half of --store-timeout {}: decisions would miss their deadline waiting for their batch",
            humantime::format_duration(options.coalesce.window),
            humantime::format_duration(options.command_timeout)
        );
    }
    let settings = FailureSettings {
        posture: args.on_store_error,
        local_share: args.local_share,
        ..FailureSettings::default()
    };
    let builder = Service::builder(policy, store_url.clone())
        .redis(options)
        .failure(settings)
        .memory_max_keys(args.memory_max_keys)
        .prefilter(!args.no_prefilter)
        .policy_defaults(PolicyDefaults {
            charge: args.default_charge,
        })
        .max_overrides(args.max_overrides)
        .policy_history_max_bytes(args.policy_history_max_bytes)
        .ready_within(args.store_connect_timeout);
    let builder = match args.memory_max_bytes {
        Some(max) => builder.memory_max_bytes(max),
        None => builder,
    };
    let builder = match &source {
        Source::Files(path, sources) => builder.config(path.clone(), sources.clone()),
        Source::Xds(_) => builder.managed_by(tollgate_server::xds::SOURCE),
    };
    let built = builder.build().await;
    let service = match built {
        Ok(service) => service,
        Err(BuildError::Store { source, .. }) => {
            return Err(
                anyhow::Error::new(source).context(format!("cannot open the store {store_url}"))
            );
        }
        Err(BuildError::Unsupported { store, problems }) => {
            let summary = format!(
                "{} rule(s) cannot run on the {store} store; not starting",
                problems.0.len(),
            );
            return Ok(not_starting(args.logs_json(), &problems, &summary));
        }
    };
    let (limiter, lifecycle) = (service.limiter().clone(), service.lifecycle().clone());

    let (stop_tx, stop_rx) = watch::channel(false);
    // The background duties, each supervised: a panic is logged and counted, and the duty
    // starts again (see `tollgate::background`); each ends once the shutdown begins.
    let mut duties = Duties::new(&stop_rx);
    if let Source::Xds(xds) = &source {
        duties.start("xds_client", {
            let (lifecycle, xds, stop) = (lifecycle.clone(), xds.clone(), stop_rx.clone());
            move || tollgate_server::xds::subscribe(lifecycle.clone(), xds.clone(), stop.clone())
        });
        if !args.xds.force_start_without_initial_config
            && !first_push(&lifecycle, &mut terminate).await
        {
            let _ = stop_tx.send(true);
            duties.finish().await;
            info!("Stopped before the first xDS configuration arrived");
            return Ok(ExitCode::SUCCESS);
        }
    }

    let http = bind(args.http_addr, "HTTP")?;
    let grpc = bind(args.grpc_addr, "gRPC")?;
    let admin = bind(args.admin_addr, "the admin API")?;
    let debug = match args.debug_addr {
        Some(addr) => Some(bind(addr, "the debug listener")?),
        None => None,
    };
    let metrics = match args.metrics_addr {
        Some(addr) => Some(bind(addr, "the metrics listener")?),
        None => None,
    };
    // Printed on stdout, one line each, so scripts and tests can find ports chosen with `:0`.
    println!("http listening on {}", http.local_addr()?);
    println!("grpc listening on {}", grpc.local_addr()?);
    println!("admin listening on {}", admin.local_addr()?);
    if let Some(debug) = &debug {
        println!("debug listening on {}", debug.local_addr()?);
    }
    if let Some(metrics) = &metrics {
        println!("metrics listening on {}", metrics.local_addr()?);
    }

    let upkeep = Upkeep {
        sweep_every: args.sweep_interval,
        watch_every: (!args.watch_interval.is_zero()).then_some(args.watch_interval),
        // Shared by every run of the watcher: registered before anything was announced.
        reload_on: Some(Arc::new(tokio::sync::Mutex::new(hangup))),
        sync_every: Some(args.policy_sync_interval),
        sync_follows: false,
    };
    for duty in service.duties(&upkeep, &stop_rx) {
        duties.start(duty.name, duty.run);
    }
    // Kept across runs of the sampler: a restart keeps the history.
    let history = Arc::new(tollgate::observe::history::History::default());
    duties.start("dashboard_sampler", {
        let (lifecycle, history, stop) = (lifecycle.clone(), history.clone(), stop_rx.clone());
        let every = tollgate_server::admin::dashboard::SAMPLE_EVERY;
        move || {
            tollgate_server::admin::dashboard::sample_forever(
                lifecycle.clone(),
                history.clone(),
                every,
                stop.clone(),
            )
        }
    });
    if let Some(tls) = tls.clone().filter(|_| !args.watch_interval.is_zero()) {
        duties.start("grpc_tls_watcher", {
            let (stop, every) = (stop_rx.clone(), args.watch_interval);
            move || tls.clone().watch(every, stop.clone())
        });
    }

    let authorize = args
        .authorize_domain
        .clone()
        .map(|domain| AuthorizeMapping::new(domain, args.authorize_descriptor.clone()));
    let (http_open, admin_open, grpc_open) = (Open::default(), Open::default(), Open::default());
    let (debug_open, metrics_open) = (Open::default(), Open::default());
    // `/healthcheck`: 500 from the moment the shutdown begins, as upstream's.
    let health = tollgate_server::http::Healthcheck::new(stop_rx.clone());
    let http_server = serve_http(
        http,
        tollgate_server::http::router_with(lifecycle.clone(), authorize, health),
        Peer::Omitted,
        args.http_read_timeout,
        stop_rx.clone(),
        http_open.clone(),
    );
    let admin_server = serve_http(
        admin,
        tollgate_server::admin::dashboard::around(
            tollgate_server::admin::router(lifecycle.clone(), token.clone()),
            lifecycle.clone(),
            history,
            tollgate_server::admin::dashboard::Tokens::new(token, read_token),
        ),
        Peer::Given,
        args.http_read_timeout,
        stop_rx.clone(),
        admin_open.clone(),
    );
    let mut rls = RlsService::new(limiter.clone());
    if args.no_rls_x_ratelimit_headers {
        rls = rls.without_x_ratelimit_headers();
    }
    if args.rls_dynamic_metadata {
        rls = rls.with_dynamic_metadata();
    }
    if args.rls_upstream_headers {
        rls = rls.with_upstream_headers(UpstreamHeaders {
            limit: args.rls_header_limit.clone(),
            remaining: args.rls_header_remaining.clone(),
            reset: args.rls_header_reset.clone(),
        });
    }
    let limits = args
        .grpc_limits
        .limits(args.grpc_keepalive, args.grpc_keepalive_timeout);
    let grpc_router = grpc_server(&limits)
        .add_service(rls.into_server())
        .add_service(HealthService::new(stop_rx.clone()).into_server());
    // Capped from the accept, TLS handshakes included; each connection then gets its budget
    // of request bytes (see `tollgate_server::listen::grpc_server`).
    let accepted = capped(
        grpc_accepted(grpc),
        args.grpc_limits.grpc_max_connections,
        &Gauge::default(),
    );
    let request_bytes = args.grpc_limits.request_bytes();
    let within = args.grpc_keepalive_timeout;
    let grpc_task = match &tls {
        Some(tls) => tokio::spawn(grpc_router.serve_with_incoming_shutdown(
            metered(
                counted(
                    preface_within(tls.clone().handshakes(accepted), within),
                    &grpc_open.connections,
                ),
                &request_bytes,
            ),
            stopped(stop_rx.clone()),
        )),
        None => tokio::spawn(grpc_router.serve_with_incoming_shutdown(
            metered(
                counted(preface_within(accepted, within), &grpc_open.connections),
                &request_bytes,
            ),
            stopped(stop_rx.clone()),
        )),
    };

    let http_task = tokio::spawn(http_server);
    let admin_task = tokio::spawn(admin_server);
    let debug_server = debug.map(|listener| {
        let router = tollgate_server::debug::router(lifecycle.clone());
        let timeout = args.http_read_timeout;
        serve_http(
            listener,
            router,
            Peer::Omitted,
            timeout,
            stop_rx.clone(),
            debug_open.clone(),
        )
    });
    let debug_task = debug_server.map(tokio::spawn);
    let metrics_server = metrics.map(|listener| {
        let router = tollgate_server::http::metrics_router(lifecycle.clone());
        let timeout = args.http_read_timeout;
        serve_http(
            listener,
            router,
            Peer::Omitted,
            timeout,
            stop_rx.clone(),
            metrics_open.clone(),
        )
    });
    let metrics_task = metrics_server.map(tokio::spawn);

    shutdown_signal(&mut terminate).await;
    info!(
        "Shutting down: finishing requests in flight (at most {}; a second signal stops at once)",
        humantime::format_duration(args.shutdown_timeout)
    );
    let _ = stop_tx.send(true);
    // The background duties finish within the same deadline: on a hung Redis, giving local
    // budgets back waits as long as the store does (a policy sync is cut short at once).
    let finish = async {
        http_task.await?;
        join_server(grpc_task, "gRPC").await?;
        admin_task.await?;
        if let Some(debug_task) = debug_task {
            debug_task.await?;
        }
        if let Some(metrics_task) = metrics_task {
            metrics_task.await?;
        }
        duties.finish().await;
        Ok(())
    };
    let why = match drain(finish, args.shutdown_timeout, &mut terminate).await? {
        Drained::Complete => {
            info!("Stopped");
            return Ok(ExitCode::SUCCESS);
        }
        Drained::TimedOut => format!(
            "still finishing {} after it began",
            humantime::format_duration(args.shutdown_timeout)
        ),
        Drained::SecondSignal => "a second stop signal".to_owned(),
    };
    // Counted before anything is dropped: what the exit cuts.
    let unfinished = duties.unfinished();
    let tasks = if unfinished.is_empty() {
        String::new()
    } else {
        // A hung store holding the local budgets' give-back, mostly.
        format!(
            ", and the background tasks {} unfinished",
            unfinished.join(", ")
        )
    };
    let open = [
        &http_open,
        &admin_open,
        &grpc_open,
        &debug_open,
        &metrics_open,
    ];
    let connections: usize = open.iter().map(|o| o.connections.get()).sum();
    let requests: usize = open.iter().map(|o| o.requests.get()).sum();
    warn!(
        connections,
        requests,
        http_connections = http_open.connections.get(),
        http_requests = http_open.requests.get(),
        admin_connections = admin_open.connections.get(),
        admin_requests = admin_open.requests.get(),
        grpc_connections = grpc_open.connections.get(),
        exit_code = CUT_EXIT_CODE,
        "Shutdown drain cut ({why}): closing {connections} connection(s) still open, with {requests} HTTP request(s) in flight{tasks}; exiting with status {CUT_EXIT_CODE}"
    );
    Ok(ExitCode::from(CUT_EXIT_CODE))
}

/// Waits for the xDS source's first valid configuration (as envoyproxy/ratelimit does without
/// `FORCE_START_WITHOUT_INITIAL_CONFIG`); `false` when a stop signal came first.
async fn first_push(
    lifecycle: &tollgate::lifecycle::Lifecycle,
    terminate: &mut Option<tokio::signal::unix::Signal>,
) -> bool {
    info!(
        "Waiting for the first configuration from the xDS management server before listening (--force-start-without-initial-config serves the empty policy meanwhile)"
    );
    let arrived = async {
        while lifecycle.awaiting_first_push() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        () = arrived => true,
        () = shutdown_signal(terminate) => false,
    }
}

/// `serve`'s background duties, each started under `tollgate::background::supervise` and
/// wanted until the shutdown begins.
struct Duties {
    stop: watch::Receiver<bool>,
    started: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
}

impl Duties {
    fn new(stop: &watch::Receiver<bool>) -> Self {
        Duties {
            stop: stop.clone(),
            started: Vec::new(),
        }
    }

    /// Starts the duty `run` makes, named `name` in logs and metrics.
    fn start<R, F>(&mut self, name: &'static str, run: R)
    where
        R: FnMut() -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let stop = self.stop.clone();
        // Also done once `serve` is gone (its sender with it).
        let wanted = move || stop.has_changed().is_ok() && !*stop.borrow();
        self.started.push((name, supervise(name, wanted, run)));
    }

    /// Waits for every duty to end (the shutdown has begun).
    async fn finish(&mut self) {
        for (_, duty) in &mut self.started {
            let _ = duty.await;
        }
    }

    /// The duties that have not ended.
    fn unfinished(&self) -> Vec<&'static str> {
        self.started
            .iter()
            .filter(|(_, duty)| !duty.is_finished())
            .map(|(name, _)| *name)
            .collect()
    }
}

/// Waits for a server's task and logs an error it stopped with.
pub(crate) async fn join_server<E: std::fmt::Display>(
    task: tokio::task::JoinHandle<Result<(), E>>,
    what: &str,
) -> anyhow::Result<()> {
    if let Err(e) = task.await? {
        warn!(error = %e, "{what} server stopped with an error");
    }
    Ok(())
}

/// Waits for `work` (the servers finishing their requests in flight and closing their
/// connections, then the background tasks) for at most `limit` or until a second SIGTERM or
/// Ctrl-C. What is still open then is dropped when the process exits: a caller that never
/// answers HTTP/2's goodbye (or never finishes sending a request), or a hung store, must not
/// keep a replica from stopping. Says whether `work` finished, and what cut it if not (the
/// caller logs it).
pub(crate) async fn drain(
    work: impl Future<Output = anyhow::Result<()>>,
    limit: Duration,
    terminate: &mut Option<tokio::signal::unix::Signal>,
) -> anyhow::Result<Drained> {
    tokio::select! {
        done = work => done.map(|()| Drained::Complete),
        _ = tokio::time::sleep(limit) => Ok(Drained::TimedOut),
        _ = shutdown_signal(terminate) => Ok(Drained::SecondSignal),
    }
}

/// Waits for Ctrl-C or SIGTERM. `term` is registered at startup, before the listening lines are
/// printed, so an early SIGTERM is a clean shutdown rather than the default action.
pub(crate) async fn shutdown_signal(term: &mut Option<tokio::signal::unix::Signal>) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match term {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

#[cfg(test)]
mod tests {
    /// Every long-lived task `serve` starts beside its servers goes through
    /// `tollgate::background::supervise`, so that a panicking one is logged, counted and started
    /// again rather than silently gone: the only tasks spawned here directly are the servers
    /// (gRPC with or without TLS, HTTP, admin, debug, metrics), whose end the shutdown's drain waits for. The tasks
    /// themselves are listed by name in `/metrics` (see the e2e tests' `supervised_tasks`).
    #[test]
    fn serve_starts_its_background_tasks_only_through_the_supervisor() {
        let source = include_str!("serve.rs");
        let code = source.split("#[cfg(test)]").next().unwrap();
        let spawned: Vec<&str> = code
            .lines()
            .map(str::trim)
            .filter(|line| line.contains("spawn"))
            .collect();
        assert_eq!(
            spawned,
            [
                "Some(tls) => tokio::spawn(grpc_router.serve_with_incoming_shutdown(",
                "None => tokio::spawn(grpc_router.serve_with_incoming_shutdown(",
                "let http_task = tokio::spawn(http_server);",
                "let admin_task = tokio::spawn(admin_server);",
                "let debug_task = debug_server.map(tokio::spawn);",
                "let metrics_task = metrics_server.map(tokio::spawn);",
            ],
            "a task spawned without `supervise`"
        );
    }
}
