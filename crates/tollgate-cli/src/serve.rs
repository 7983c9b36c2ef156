//! `tollgate serve`: load the policy, start both transports, stop cleanly on SIGTERM/Ctrl-C.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tollgate::background::supervise;
use tollgate::limiter::FailureSettings;
use tollgate::policy::{Policy, PolicyDefaults};
use tollgate::resilience::BreakerConfig;
use tollgate::service::{BuildError, Service, Upkeep};
use tollgate::store::{CoalesceOptions, RedisOptions, StoreUrl};
use tollgate_server::grpc::{HealthService, RlsService, UpstreamHeaders};
use tollgate_server::http::authorize::AuthorizeMapping;
use tollgate_server::listen::{
    Drained, Gauge, Open, Peer, bind, capped, counted, grpc_accepted, grpc_server, metered,
    preface_within, serve_http, stopped,
};
use tracing::{info, warn};

use crate::serve_args::ServeArgs;

/// How `serve` exits when the drain was cut: connections (or a give-back to a hung store) were
/// still open when `--shutdown-timeout` ran out or a second signal came. A complete drain exits
/// 0; 1 and 2 are taken by a refused start (an invalid policy, other errors).
const CUT_EXIT_CODE: u8 = 3;

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
