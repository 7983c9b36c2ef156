//! `tollgate bench`: a bounded load generator for Envoy RLS v3 gRPC and the HTTP API.
//!
//! Workers share `--connections` real connections (gRPC: HTTP/2 channels, requests multiplexed;
//! HTTP: HTTP/1.1 keep-alive sockets, one request in flight on each); each worker sends one
//! request at a time (closed loop), or follows a schedule with `--rate` (open loop). In open
//! loop a request sent late because the previous answer came late is measured from its
//! scheduled start, so a slow server is not hidden by the generator falling behind.

mod clock;
mod histogram;
mod keys;
mod pacer;
mod timer;

use self::clock::now;

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::net::{IpAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{ArgGroup, Args};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http::{StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tollgate_server::headers::DEGRADED;
use tonic::transport::{Channel, Endpoint};

use crate::stdout::{out, outln};
use histogram::Histogram;
use keys::{KeySpace, Rng};
use pacer::Schedule;

/// The longest run the tool agrees to.
const MAX_DURATION: Duration = Duration::from_secs(600);
/// The time bound when only `--requests` is given.
const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// The slowest `--rate`: one request every 100 s.
const MIN_RATE: f64 = 0.01;
/// A request slower than this counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// A worker waits this long after a failed request before its next one. A server that is down
/// fails requests at once (a refused connection, gRPC's UNAVAILABLE): without a pause an outage
/// would be counted as a flood of instant errors, swelling the requests and the throughput
/// reported, and would spin the generator against a closed port.
const ERROR_PAUSE: Duration = Duration::from_millis(20);
/// Bounds the Zipf table (8 bytes per key).
const MAX_KEYS: u64 = 10_000_000;
/// Bounds `--concurrency` and `--connections`: each worker holds a latency histogram of about
/// 15 KB and each HTTP connection a socket, so 300 000 workers took 3.4 GB and 7 s to start.
const MAX_WORKERS: usize = 10_000;

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("bound").required(true).multiple(true).args(["duration", "requests"])))]
pub struct BenchArgs {
    /// Server to load: `grpc://HOST:PORT` (Envoy RLS v3) or `http://HOST:PORT` (`POST /v1/check`).
    /// Repeat for several replicas (same scheme): connection `j` goes to target `j mod N`.
    #[arg(long = "target", required = true, value_name = "TARGET")]
    targets: Vec<String>,
    /// Domain of every request.
    #[arg(long)]
    domain: String,
    /// A descriptor as `key=VALUE_TEMPLATE[,key=...]`; `{key}` in a value becomes the key index.
    /// Repeat for several descriptors per request.
    #[arg(
        long = "descriptor",
        required = true,
        value_name = "KEY=TEMPLATE[,...]"
    )]
    descriptors: Vec<String>,
    /// Size of the key space: `{key}` takes values 0..N.
    #[arg(long, default_value_t = 1)]
    keys: u64,
    /// Zipf exponent S for a skewed key choice (key 0 hottest); uniform when absent or 0.
    #[arg(long, value_name = "S")]
    zipf: Option<f64>,
    /// Number of concurrent workers (requests in flight at most), at most 10 000.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Real connections shared by the workers, worker `i` using connection `i mod K`. gRPC: K
    /// HTTP/2 channels, requests multiplexed (default: one per target). HTTP: K HTTP/1.1
    /// keep-alive sockets, one request in flight on each, so at most K in flight (default: one
    /// per worker). At most 10 000.
    #[arg(long, value_name = "K")]
    connections: Option<usize>,
    /// Stop after this long (for example `5s`); at most 10 minutes.
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Stop after exactly this many requests (and after 10 s unless `--duration` says otherwise).
    #[arg(long)]
    requests: Option<u64>,
    /// Open loop: send this many requests per second in total (at least 0.01), spread over the
    /// workers.
    #[arg(long, value_name = "R")]
    rate: Option<f64>,
    /// With `--keys 1`: report admitted requests against LIMIT; exit 1 if more were admitted.
    #[arg(long, value_name = "LIMIT")]
    verify: Option<u64>,
    /// Print the final report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Print progress on stderr once a second even when stderr is not a terminal.
    #[arg(long)]
    progress: bool,
    /// Allow a target that is not a loopback address.
    #[arg(long)]
    allow_remote: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Grpc,
    Http,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::Http => "http",
        }
    }
}

/// A descriptor entry whose value may contain `{key}`.
#[derive(Debug, Clone)]
struct EntryTemplate {
    key: String,
    value: String,
}

/// Everything a run needs, checked once.
#[derive(Debug)]
struct Plan {
    protocol: Protocol,
    /// `HOST:PORT` of each target, as given.
    authorities: Vec<String>,
    domain: String,
    descriptors: Vec<Vec<EntryTemplate>>,
    keys: KeySpace,
    concurrency: usize,
    connections: usize,
    duration: Duration,
    requests: Option<u64>,
    /// Open loop: requests per second in total.
    rate: Option<f64>,
}

fn parse_target(target: &str) -> anyhow::Result<(Protocol, String)> {
    let (scheme, rest) = target.split_once("://").with_context(|| {
        format!("target `{target}` is not grpc://HOST:PORT or http://HOST:PORT")
    })?;
    let protocol = match scheme {
        "grpc" => Protocol::Grpc,
        "http" => Protocol::Http,
        other => bail!("target scheme `{other}` is not grpc or http"),
    };
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        bail!("target `{target}` must be SCHEME://HOST:PORT with no path");
    }
    Ok((protocol, authority.to_string()))
}

/// True when every address the authority resolves to is a loopback address.
fn is_loopback(authority: &str) -> anyhow::Result<bool> {
    let addrs: Vec<_> = authority
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve `{authority}` (HOST:PORT expected)"))?
        .collect();
    Ok(!addrs.is_empty()
        && addrs.iter().all(|a| match a.ip() {
            IpAddr::V4(ip) => ip.is_loopback(),
            IpAddr::V6(ip) => {
                ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        }))
}

fn parse_descriptor(text: &str) -> anyhow::Result<Vec<EntryTemplate>> {
    Ok(crate::check::descriptor_entries(text)?
        .into_iter()
        .map(|(key, value)| EntryTemplate { key, value })
        .collect())
}

impl Plan {
    fn new(args: &BenchArgs) -> anyhow::Result<Plan> {
        let mut authorities = Vec::with_capacity(args.targets.len());
        let mut protocols = Vec::with_capacity(args.targets.len());
        for target in &args.targets {
            let (protocol, authority) = parse_target(target)?;
            if !args.allow_remote && !is_loopback(&authority)? {
                bail!(
                    "target `{target}` is not a loopback address; pass --allow-remote to load a remote server"
                );
            }
            protocols.push(protocol);
            authorities.push(authority);
        }
        let protocol = protocols[0];
        if protocols.iter().any(|p| *p != protocol) {
            bail!("every --target must use the same scheme (all grpc:// or all http://)");
        }
        if args.keys == 0 || args.keys > MAX_KEYS {
            bail!("--keys must be between 1 and {MAX_KEYS}");
        }
        if let Some(s) = args.zipf
            && !(s.is_finite() && s >= 0.0)
        {
            bail!("--zipf must be a finite number >= 0");
        }
        let connections = args.connections.unwrap_or(match protocol {
            Protocol::Grpc => authorities.len(),
            Protocol::Http => args.concurrency.max(authorities.len()),
        });
        if args.concurrency == 0 || args.concurrency > MAX_WORKERS {
            bail!("--concurrency must be between 1 and {MAX_WORKERS}");
        }
        if connections == 0 || connections > MAX_WORKERS {
            bail!("--connections must be between 1 and {MAX_WORKERS}");
        }
        if connections < authorities.len() {
            bail!(
                "--connections {connections} cannot reach {} targets: give at least one per target",
                authorities.len()
            );
        }
        let duration = args.duration.unwrap_or(DEFAULT_DURATION);
        if duration > MAX_DURATION {
            bail!("--duration may not exceed 10 minutes");
        }
        if duration.is_zero() {
            bail!("--duration must be positive");
        }
        if args.requests == Some(0) {
            bail!("--requests must be at least 1");
        }
        if let Some(rate) = args.rate
            && !(rate.is_finite() && rate >= MIN_RATE)
        {
            bail!("--rate must be a number of requests per second, at least {MIN_RATE}");
        }
        if args.verify.is_some() && args.keys != 1 {
            bail!("--verify needs a single key (--keys 1)");
        }
        if args.verify == Some(0) {
            bail!("--verify LIMIT must be at least 1, as a rule's limit is");
        }
        if args.domain.is_empty() {
            bail!("--domain must not be empty: the server would refuse every request");
        }
        let descriptors = args
            .descriptors
            .iter()
            .map(|d| parse_descriptor(d))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let values = || descriptors.iter().flatten().map(|e| e.value.as_str());
        if let Some(odd) = values().find(|v| v.replace("{key}", "").contains(['{', '}'])) {
            bail!("descriptor value `{odd}`: the only placeholder is {{key}}");
        }
        if args.keys > 1 && !values().any(|v| v.contains("{key}")) {
            bail!(
                "--keys {} but no --descriptor value has {{key}}: every request would use one key",
                args.keys
            );
        }
        Ok(Plan {
            protocol,
            authorities,
            domain: args.domain.clone(),
            descriptors,
            keys: KeySpace::new(args.keys, args.zipf),
            concurrency: args.concurrency,
            connections,
            duration,
            requests: args.requests,
            rate: args.rate,
        })
    }

    fn grpc_request(&self, key: &str) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: self
                .descriptors
                .iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .iter()
                        .map(|e| Entry {
                            key: e.key.clone(),
                            value: e.value.replace("{key}", key),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: 1,
        }
    }

    /// The JSON body of every HTTP request, with a placeholder for each `{key}` of a value.
    fn http_body(&self) -> anyhow::Result<HttpBody> {
        let texts = || {
            let entries = self.descriptors.iter().flatten();
            std::iter::once(self.domain.as_str())
                .chain(entries.flat_map(|e| [e.key.as_str(), e.value.as_str()]))
        };
        let placeholder = ('\u{E000}'..='\u{F8FF}')
            .find(|c| !texts().any(|t| t.contains(*c)))
            .context("every private-use character is taken: none is left to stand for {key}")?;
        let mut buffer = [0; 4];
        let slot = &*placeholder.encode_utf8(&mut buffer);
        let descriptors: Vec<Value> = self
            .descriptors
            .iter()
            .map(|entries| {
                let entries: Vec<Value> = entries
                    .iter()
                    .map(|e| json!({ "key": e.key, "value": e.value.replace("{key}", slot) }))
                    .collect();
                json!({ "entries": entries })
            })
            .collect();
        Ok(HttpBody {
            template: json!({ "domain": self.domain, "descriptors": descriptors }).to_string(),
            placeholder,
        })
    }
}

/// The JSON body of every HTTP request, built once.
#[derive(Debug)]
struct HttpBody {
    template: String,
    /// Stands for `{key}` in the descriptor values, and nowhere else: a private-use character
    /// the domain, keys and values given do not hold, which JSON escaping leaves as it is and
    /// never produces. A `{key}` in the domain or a descriptor key stays as written, as over
    /// gRPC.
    placeholder: char,
}

impl HttpBody {
    fn with_key(&self, key: &str) -> String {
        self.template.replace(self.placeholder, key)
    }
}

/// Counters shared by the workers and the progress printer.
#[derive(Debug, Default)]
struct Tally {
    /// The `--requests` budget handed out so far.
    issued: AtomicU64,
    done: AtomicU64,
    ok: AtomicU64,
    /// Of `ok`: allowed by the `open` failure posture, counted by nothing (tollgate's
    /// `x-tollgate-degraded: open`: the store did not answer).
    degraded_ok: AtomicU64,
    over_limit: AtomicU64,
    errors: AtomicU64,
    first_error: OnceLock<String>,
    /// Set once every worker is done, or the `--requests` budget is handed out: stops the
    /// open-loop pacer.
    stop: AtomicBool,
}

#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// Allowed; `true` when the `open` failure posture allowed it, counting nothing.
    Ok {
        degraded: bool,
    },
    OverLimit,
    Error,
}

impl Outcome {
    fn allowed(degraded: bool) -> Outcome {
        Outcome::Ok { degraded }
    }
}

impl Tally {
    fn count(&self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Ok { degraded } => {
                if degraded {
                    self.degraded_ok.fetch_add(1, Ordering::Relaxed);
                }
                &self.ok
            }
            Outcome::OverLimit => &self.over_limit,
            Outcome::Error => &self.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    fn error(&self, message: String) -> Outcome {
        let _ = self.first_error.set(message);
        Outcome::Error
    }

    /// Claims one request of the budget; false once the run is over. The last request of a
    /// budget stops the open-loop pacer, so workers waiting for later slots end at once.
    fn claim(&self, budget: Option<u64>, deadline: Instant, now: Instant) -> bool {
        if now >= deadline {
            return false;
        }
        let Some(n) = budget else {
            return true;
        };
        let issued = self.issued.fetch_add(1, Ordering::Relaxed);
        if issued + 1 >= n {
            self.stop.store(true, Ordering::Relaxed);
        }
        issued < n
    }
}

/// One HTTP/1.1 keep-alive socket, reopened when the server has closed it. HTTP/1.1 has no
/// multiplexing, so the lock keeps one request in flight on it; a worker waiting for the lock
/// is waiting for the connection.
#[derive(Debug)]
struct HttpConnection {
    /// `HOST:PORT`, also sent as `Host`.
    authority: String,
    sender: tokio::sync::Mutex<SendRequest<Full<Bytes>>>,
}

#[derive(Debug, Clone)]
enum Client {
    Grpc(RateLimitServiceClient<Channel>),
    Http {
        connection: Arc<HttpConnection>,
        body: Arc<HttpBody>,
    },
}

/// Opens an HTTP/1.1 socket to `authority`.
async fn handshake_http(authority: &str) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::time::timeout(REQUEST_TIMEOUT, tokio::net::TcpStream::connect(authority))
        .await
        .map_err(|_| anyhow::anyhow!("connecting timed out"))??;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // Drives the socket; once it ends (the server closed it), `ready` on the sender fails.
    tokio::spawn(connection);
    Ok(sender)
}

async fn connect_http(authority: &str) -> anyhow::Result<HttpConnection> {
    Ok(HttpConnection {
        authority: authority.to_string(),
        sender: tokio::sync::Mutex::new(handshake_http(authority).await?),
    })
}

/// Sends one `POST /v1/check` and drains the answer; the status code.
/// Whether an answer's `x-tollgate-degraded` says the `open` posture allowed it: counted by
/// nothing. (A `local` posture's answer is tollgate's own count, held against `--verify`.)
fn open_posture(degraded: Option<&[u8]>) -> bool {
    degraded == Some(b"open")
}

/// `POST /v1/check`: the answer's status, and whether it was degraded (tollgate's
/// `x-tollgate-degraded`: a failure posture answered).
async fn post_check(
    connection: &HttpConnection,
    body: String,
) -> anyhow::Result<(StatusCode, bool)> {
    let request = http::Request::post("/v1/check")
        .header(header::HOST, connection.authority.as_str())
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))?;
    let mut sender = connection.sender.lock().await;
    if sender.ready().await.is_err() {
        // The server closed the socket before this request was sent: its idle timeout for
        // keep-alive connections, or a restart. Open another, or every later request on this
        // connection would fail at once, to the end of the run.
        *sender = handshake_http(&connection.authority)
            .await
            .with_context(|| format!("reconnecting to {}", connection.authority))?;
        sender.ready().await?;
    }
    let response = sender.send_request(request).await?;
    let status = response.status();
    let degraded = open_posture(response.headers().get(DEGRADED).map(|v| v.as_bytes()));
    // Read to the end so the connection is ready for the next request.
    response.into_body().collect().await?;
    Ok((status, degraded))
}

async fn connect(plan: &Plan) -> anyhow::Result<Vec<Client>> {
    let mut clients = Vec::with_capacity(plan.connections);
    let body = Arc::new(plan.http_body()?);
    for j in 0..plan.connections {
        let authority = &plan.authorities[j % plan.authorities.len()];
        let client = match plan.protocol {
            Protocol::Grpc => {
                let endpoint = Endpoint::from_shared(format!("http://{authority}"))?
                    .connect_timeout(REQUEST_TIMEOUT)
                    .tcp_nodelay(true);
                let channel = endpoint
                    .connect()
                    .await
                    .with_context(|| format!("could not connect to grpc://{authority}"))?;
                Client::Grpc(RateLimitServiceClient::new(channel))
            }
            Protocol::Http => Client::Http {
                connection: Arc::new(
                    connect_http(authority)
                        .await
                        .with_context(|| format!("could not connect to http://{authority}"))?,
                ),
                body: body.clone(),
            },
        };
        clients.push(client);
    }
    Ok(clients)
}

async fn send(client: &mut Client, plan: &Plan, key: &str, tally: &Tally) -> Outcome {
    match client {
        Client::Grpc(grpc) => {
            let call = grpc.should_rate_limit(plan.grpc_request(key));
            match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
                Err(_) => tally.error("grpc: request timed out".into()),
                Ok(Err(status)) => {
                    tally.error(format!("grpc: {}: {}", status.code(), status.message()))
                }
                Ok(Ok(response)) => match response.get_ref().overall_code() {
                    Code::Ok => Outcome::allowed(open_posture(
                        response.metadata().get(DEGRADED).map(|v| v.as_bytes()),
                    )),
                    Code::OverLimit => Outcome::OverLimit,
                    Code::Unknown => tally.error("grpc: overall_code UNKNOWN".into()),
                },
            }
        }
        Client::Http { connection, body } => {
            let body = body.with_key(key);
            let sent = tokio::time::timeout(REQUEST_TIMEOUT, post_check(connection, body));
            match sent.await {
                Err(_) => tally.error("http: request timed out".into()),
                Ok(Err(e)) => tally.error(format!("http: {e:#}")),
                Ok(Ok((StatusCode::OK, degraded))) => Outcome::allowed(degraded),
                Ok(Ok((StatusCode::TOO_MANY_REQUESTS, _))) => Outcome::OverLimit,
                Ok(Ok((other, _))) => tally.error(format!("http: status {}", other.as_u16())),
            }
        }
    }
}

async fn worker(
    index: usize,
    mut client: Client,
    plan: Arc<Plan>,
    tally: Arc<Tally>,
    schedule: Option<Arc<Schedule>>,
    deadline: Instant,
) -> Histogram {
    let mut histogram = Histogram::default();
    let mut rng = Rng::new(0x5EED ^ (index as u64).wrapping_mul(0x9E37_79B9));
    let mut key = String::new();
    for slot in 0u64.. {
        // Open loop: `late` when this worker's previous request ended after this one was due.
        let late = match &schedule {
            Some(schedule) => match schedule.wait(index, slot).await {
                Some(late) => late,
                // The schedule has no slot left before the deadline.
                None => break,
            },
            None => false,
        };
        let sent_at = now();
        if !tally.claim(plan.requests, deadline, sent_at) {
            break;
        }
        key.clear();
        // Writing into a String cannot fail.
        let _ = write!(key, "{}", plan.keys.sample(&mut rng));
        let outcome = send(&mut client, &plan, &key, &tally).await;
        let finished = now();
        // Open loop: a request made late by the previous answer counts from when it was due,
        // so a slow server is not hidden by the schedule slipping. One that waited for its slot
        // counts from its send: waking the worker is not the server's doing.
        let began = match &schedule {
            Some(schedule) if late => schedule.due(index, slot),
            _ => sent_at,
        };
        histogram.record(finished - began);
        tally.count(outcome);
        if matches!(outcome, Outcome::Error) && !tally.stop.load(Ordering::Relaxed) {
            // See `ERROR_PAUSE`; a pause does not carry the run past its deadline.
            let left = deadline.saturating_duration_since(finished);
            tokio::time::sleep(ERROR_PAUSE.min(left)).await;
        }
    }
    histogram
}

async fn progress(tally: Arc<Tally>, start: Instant) {
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    let mut last = 0;
    loop {
        ticker.tick().await;
        let done = tally.done.load(Ordering::Relaxed);
        crate::stdout::errln!(
            "{:>5.1}s  {done} requests  {} req/s  {} errors",
            start.elapsed().as_secs_f64(),
            done - last,
            tally.errors.load(Ordering::Relaxed),
        );
        last = done;
    }
}

/// What a run measured.
#[derive(Debug)]
struct Report {
    elapsed: Duration,
    requests: u64,
    ok: u64,
    degraded_ok: u64,
    over_limit: u64,
    errors: u64,
    first_error: Option<String>,
    latency: Histogram,
}

async fn run_plan(plan: Plan, show_progress: bool) -> anyhow::Result<Report> {
    let clients = connect(&plan).await?;
    let plan = Arc::new(plan);
    let tally = Arc::new(Tally::default());
    let start = now();
    let deadline = start + plan.duration;
    let ticker = show_progress.then(|| tokio::spawn(progress(tally.clone(), start)));
    let schedule = plan
        .rate
        .map(|rate| Arc::new(Schedule::new(start, rate, plan.concurrency)));
    let pacer = schedule.clone().map(|schedule| {
        let tally = tally.clone();
        tokio::spawn(async move { schedule.run(deadline, &tally.stop).await })
    });
    let workers: Vec<_> = (0..plan.concurrency)
        .map(|i| {
            let client = clients[i % clients.len()].clone();
            tokio::spawn(worker(
                i,
                client,
                plan.clone(),
                tally.clone(),
                schedule.clone(),
                deadline,
            ))
        })
        .collect();
    let mut latency = Histogram::default();
    let mut failed = None;
    for w in workers {
        match w.await {
            Ok(histogram) => latency.merge(&histogram),
            Err(e) => failed = Some(e),
        }
    }
    let elapsed = start.elapsed();
    tally.stop.store(true, Ordering::Relaxed);
    if let Some(t) = ticker {
        t.abort();
    }
    if let Some(pacer) = pacer {
        pacer
            .await
            .context("the open-loop pacer failed")?
            .context("the open-loop pacer's timer failed")?;
    }
    if let Some(e) = failed {
        return Err(e).context("a worker failed");
    }
    let requests = tally.done.load(Ordering::Relaxed);
    // Open loop: the run ends with the last request's answer, not at the end of its slot, so the
    // time measured covers N requests' slots but one; N requests at R a second take N / R.
    // Without this, `--rate 0.5 --duration 2s` reported 1 request in 0.00 s, 400 req/s.
    let elapsed = match plan.rate {
        Some(rate) => Duration::try_from_secs_f64(requests as f64 / rate)
            .map_or(elapsed, |schedule| schedule.max(elapsed)),
        None => elapsed,
    };
    Ok(Report {
        elapsed,
        requests,
        ok: tally.ok.load(Ordering::Relaxed),
        degraded_ok: tally.degraded_ok.load(Ordering::Relaxed),
        over_limit: tally.over_limit.load(Ordering::Relaxed),
        errors: tally.errors.load(Ordering::Relaxed),
        first_error: tally.first_error.get().cloned(),
        latency,
    })
}

fn micros(d: Duration) -> f64 {
    (d.as_nanos() as f64 / 1000.0 * 10.0).round() / 10.0
}

impl Report {
    fn throughput(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// What `--verify` compares with the limit: the admissions the limiter decided, not those
    /// a failure posture let through while the store did not answer (reported beside them).
    fn admitted_by_the_limiter(&self) -> u64 {
        self.ok - self.degraded_ok
    }

    fn to_json(&self, args: &BenchArgs, protocol: Protocol, connections: usize) -> Value {
        let q = |p| micros(self.latency.quantile(p));
        let mut out = json!({
            "target": args.targets.join(","),
            "protocol": protocol.name(),
            "domain": args.domain,
            "keys": args.keys,
            "zipf": args.zipf,
            "concurrency": args.concurrency,
            "connections": connections,
            "rate": args.rate,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "requests": self.requests,
            "ok": self.ok,
            "degraded_ok": self.degraded_ok,
            "over_limit": self.over_limit,
            "errors": self.errors,
            "first_error": self.first_error,
            "throughput_rps": self.throughput(),
            "latency_us": {
                "p50": q(0.5),
                "p90": q(0.9),
                "p99": q(0.99),
                "p99_9": q(0.999),
                "max": micros(self.latency.max()),
            },
        });
        if let Some(limit) = args.verify {
            out["verify"] = json!({
                "limit": limit,
                "admitted": self.admitted_by_the_limiter(),
                "admitted_degraded": self.degraded_ok,
                "passed": self.admitted_by_the_limiter() <= limit,
            });
        }
        out
    }

    fn render(&self, args: &BenchArgs) -> String {
        let q = |p| format!("{:.1}", micros(self.latency.quantile(p)));
        // Whole requests a second, but a slow `--rate` such as 0.5 would show as 0.
        let places = if self.throughput() < 10.0 { 2 } else { 0 };
        let mut out = format!(
            "{} requests in {:.2}s: {:.*} req/s\n\
             latency µs: p50 {}  p90 {}  p99 {}  p99.9 {}  max {:.1}\n\
             OK {}{}  OVER_LIMIT {}  errors {}\n",
            self.requests,
            self.elapsed.as_secs_f64(),
            places,
            self.throughput(),
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            micros(self.latency.max()),
            self.ok,
            match self.degraded_ok {
                0 => String::new(),
                n => format!(" (of which {n} degraded: the open posture answered)"),
            },
            self.over_limit,
            self.errors,
        );
        if let Some(e) = &self.first_error {
            out.push_str(&format!("first error: {e}\n"));
        }
        if let Some(limit) = args.verify {
            let admitted = self.admitted_by_the_limiter();
            let verdict = if admitted <= limit { "ok" } else { "OVER" };
            out.push_str(&format!(
                "verify: admitted {admitted} of limit {limit}: {verdict}\n"
            ));
            if self.degraded_ok > 0 {
                out.push_str(&format!(
                    "verify: {} more admitted by the open posture (the store did not answer), not counted above\n",
                    self.degraded_ok
                ));
            }
        }
        out
    }
}

/// Exit status: 0 done, 1 `--verify` failed or every request failed, 2 could not run.
pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let plan = Plan::new(&args)?;
    let protocol = plan.protocol;
    let connections = plan.connections;
    let show_progress = args.progress || std::io::stderr().is_terminal();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(run_plan(plan, show_progress))?;
    if args.json {
        outln!("{}", report.to_json(&args, protocol, connections));
    } else {
        out!("{}", report.render(&args));
    }
    let verify_failed = args
        .verify
        .is_some_and(|limit| report.admitted_by_the_limiter() > limit);
    let all_failed = report.requests > 0 && report.errors == report.requests;
    Ok(if verify_failed || all_failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_remote_hosts_are_recognised() {
        assert_eq!(
            parse_target("grpc://127.0.0.1:8081").unwrap(),
            (Protocol::Grpc, "127.0.0.1:8081".into())
        );
        assert_eq!(
            parse_target("http://localhost:8080/").unwrap(),
            (Protocol::Http, "localhost:8080".into())
        );
        assert!(parse_target("https://127.0.0.1:1").is_err());
        assert!(parse_target("http://127.0.0.1:1/v1").is_err());
        assert!(is_loopback("127.0.0.1:1").unwrap());
        assert!(is_loopback("[::1]:1").unwrap());
        assert!(!is_loopback("192.0.2.1:1").unwrap());
    }

    /// A plan of one HTTP worker, one key and one `descriptor` template in `domain`.
    fn one_key_plan(domain: &str, descriptor: &str) -> Plan {
        Plan {
            protocol: Protocol::Http,
            authorities: vec!["127.0.0.1:1".into()],
            domain: domain.into(),
            descriptors: vec![parse_descriptor(descriptor).unwrap()],
            keys: KeySpace::new(1, None),
            concurrency: 1,
            connections: 1,
            duration: Duration::from_secs(1),
            requests: None,
            rate: None,
        }
    }

    #[test]
    fn templates_fill_the_key_in_every_value() {
        let plan_body = one_key_plan("api", "user=u{key},plan=free");
        let request = plan_body.grpc_request("42");
        assert_eq!(request.descriptors[0].entries[0].value, "u42");
        assert_eq!(request.descriptors[0].entries[1].value, "free");
        let body: Value =
            serde_json::from_str(&plan_body.http_body().unwrap().with_key("7")).unwrap();
        assert_eq!(body["descriptors"][0]["entries"][0]["value"], "u7");
        assert!(parse_descriptor("novalue").is_err());
        assert!(parse_descriptor("=x").is_err());
    }

    /// `{key}` is a key index in descriptor values only, over HTTP as over gRPC: the domain and
    /// descriptor keys keep it as written.
    #[test]
    fn the_http_body_fills_the_key_in_values_only() {
        // The first private-use character, which the placeholder would otherwise be.
        let plan = one_key_plan("d{key}\u{E000}", "k{key}=v{key}{key},plain=x");
        let body: Value = serde_json::from_str(&plan.http_body().unwrap().with_key("7")).unwrap();
        assert_eq!(body["domain"], "d{key}\u{E000}");
        let entries = &body["descriptors"][0]["entries"];
        assert_eq!(entries[0]["key"], "k{key}");
        assert_eq!(entries[0]["value"], "v77");
        assert_eq!(entries[1]["key"], "plain");
        assert_eq!(entries[1]["value"], "x");
        let grpc = plan.grpc_request("7");
        assert_eq!(grpc.domain, body["domain"]);
        assert_eq!(grpc.descriptors[0].entries[0].key, entries[0]["key"]);
        assert_eq!(grpc.descriptors[0].entries[0].value, entries[0]["value"]);
    }
}
