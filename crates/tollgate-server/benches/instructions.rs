//! Decisions to count instructions of, under `valgrind --tool=callgrind`: one path, a fixed
//! number of times, after its setup and a warm-up. `scripts/bench-instructions.sh` runs each path
//! with N and with 2N decisions and divides the difference of the two totals by N, so setup,
//! warm-up, runtime start and exit cancel out.
//!
//! `instructions list` prints the paths; `instructions PATH DECISIONS` decides DECISIONS times;
//! without arguments (`cargo test --benches`) or with `--bench` (`cargo bench`), every path runs
//! once over its keys and must allow every decision.
//!
//! - `limiter/<algorithm>`: `Limiter::check` on the memory store, one descriptor.
//! - `limiter/nested`: the same for a fixed window one level down the policy's tree, under an
//!   exact value: the descriptor `path=/login, k=<value>`, as Envoy's route descriptors read.
//! - `limiter/pair`: a request of two descriptors, `k=<value>` and `j=<value>`, each limited by a
//!   fixed window of its own (the general path, and answers beyond one inline status).
//! - `grpc/memory`, `grpc/noop`: the RLS service's tonic server (`RlsService::into_server`) called
//!   as a tower service with a framed protobuf request, over the limiter or over `AllowAll`; its
//!   answer body and trailers read to the end.
//! - `grpc/memory-budget`: `grpc/memory` behind the gRPC listener's budget of request bytes, as
//!   `serve` runs it: the request body a tonic `Body`, its connection's `ConnectionBytes` in its
//!   extensions (as tonic puts a connection's `ConnectInfo` there), through `ChargeLayer`.
//! - `http/memory`, `http/noop`: the axum router (`http::router`, `http::allow_all_router`)
//!   called with `oneshot` for `POST /v1/check` with a JSON body; its answer body read to the end.
//!
//! No socket anywhere. Every path uses one rule (10 per second on descriptor `k`, fixed window
//! for the handlers), `KEYS` warm keys checked in turn with a 30-byte value each, and a manual
//! clock advanced 1 ms per decision: each key sees one request per simulated second, so every
//! decision is allowed and runs the same code. The handlers and the limiter are built only
//! through public constructors (see [`limiter`], [`lifecycle`]), so the harness runs unchanged
//! across refactors of their insides.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse, rate_limit_response,
};
use http_body_util::{BodyExt, Full};
use prost::Message;
use tollgate::clock::ManualClock;
use tollgate::core::{Algorithm, Timestamp};
use tollgate::lifecycle::Lifecycle;
use tollgate::limiter::{CheckRequest, FailureSettings, Limiter, RequestDescriptor};
use tollgate::policy::Policy;
use tollgate::store::{MemoryStore, StoreBackend};
use tollgate_server::AllowAll;
use tollgate_server::grpc::RlsService;
use tower::ServiceExt;

/// Keys checked in turn. Decision counts are multiples of it, so each key is checked equally.
const KEYS: usize = 1000;
/// Length of each descriptor value (as in the criterion bench `decide`).
const VALUE_LEN: usize = 30;
/// Why a run failed.
type Failure = Box<dyn std::error::Error>;

const GRPC_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

fn paths() -> Vec<String> {
    let mut paths: Vec<String> = Algorithm::ALL
        .iter()
        .map(|a| format!("limiter/{}", a.name()))
        .collect();
    paths.extend(
        [
            "limiter/nested",
            "limiter/pair",
            "grpc/noop",
            "grpc/memory",
            "grpc/memory-budget",
            "http/noop",
            "http/memory",
        ]
        .map(String::from),
    );
    paths
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [list] if list == "list" => {
            for path in paths() {
                println!("{path}");
            }
            ExitCode::SUCCESS
        }
        [path, decisions] => {
            let Ok(decisions) = decisions.parse::<usize>() else {
                eprintln!("DECISIONS must be a number");
                return ExitCode::from(2);
            };
            if decisions % KEYS != 0 {
                eprintln!("DECISIONS must be a multiple of {KEYS}");
                return ExitCode::from(2);
            }
            match run(path, decisions) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{path}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        // `cargo bench` passes `--bench`, `cargo test --benches` nothing: check that every
        // path runs and allows (what the counts rely on), without counting.
        [] => smoke(),
        _ if args.iter().any(|a| a == "--bench") => smoke(),
        _ => {
            eprintln!("usage: instructions list | instructions PATH DECISIONS");
            ExitCode::from(2)
        }
    }
}

/// Runs every path for `KEYS` decisions.
fn smoke() -> ExitCode {
    let failed: Vec<String> = paths()
        .into_iter()
        .filter_map(|path| run(&path, KEYS).err().map(|e| format!("{path}: {e}")))
        .collect();
    for f in &failed {
        eprintln!("{f}");
    }
    println!(
        "instructions: {} paths ran, {} failed",
        paths().len(),
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run(path: &str, decisions: usize) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (clock, limiter, sources) = match path.strip_prefix("limiter/") {
        Some(NESTED) => limiter(nested_sources()),
        Some(PAIR) => limiter(pair_sources()),
        Some(name) => {
            let algorithm = Algorithm::ALL
                .into_iter()
                .find(|a| a.name() == name)
                .ok_or_else(|| format!("unknown algorithm `{name}`"))?;
            limiter(sources(algorithm))
        }
        None => limiter(sources(Algorithm::FixedWindow)),
    };
    runtime.block_on(async {
        match path {
            "grpc/noop" => {
                grpc(
                    &clock,
                    RlsService::new(Arc::new(AllowAll::default())),
                    decisions,
                )
                .await
            }
            "grpc/memory" => grpc(&clock, RlsService::new(limiter), decisions).await,
            "grpc/memory-budget" => grpc_budget(&clock, RlsService::new(limiter), decisions).await,
            "http/noop" => {
                http_router(&clock, tollgate_server::http::allow_all_router(), decisions).await
            }
            "http/memory" => {
                let router = tollgate_server::http::router(lifecycle(limiter, sources));
                http_router(&clock, router, decisions).await
            }
            _ if path.starts_with("limiter/") => {
                let shape = match path.strip_prefix("limiter/") {
                    Some(NESTED) => Shape::Nested,
                    Some(PAIR) => Shape::Pair,
                    _ => Shape::Top,
                };
                check(&clock, &limiter, shape, decisions).await
            }
            _ => Err("unknown path (see `list`)".into()),
        }
    })
}

/// The policy of every path: 10 per second of `algorithm` on descriptor `k` of domain `bench`.
fn sources(algorithm: Algorithm) -> Vec<(String, String)> {
    let yaml = format!(
        "domain: bench\ndescriptors:\n  - key: k\n    rate_limit: {{name: r, period: 1s, requests_per_unit: 10, algorithm: {}}}\n",
        algorithm.name()
    );
    vec![("bench.yaml".to_owned(), yaml)]
}

/// The `limiter/nested` path's name and policy: the fixed window of [`sources`] on `k` under
/// `path: /login`.
const NESTED: &str = "nested";

fn nested_sources() -> Vec<(String, String)> {
    let yaml = "domain: bench\ndescriptors:\n  - key: path\n    value: /login\n    descriptors:\n      - key: k\n        rate_limit: {name: r, period: 1s, requests_per_unit: 10, algorithm: fixed_window}\n";
    vec![("bench.yaml".to_owned(), yaml.to_owned())]
}

/// The `limiter/pair` path's name and policy: the fixed window of [`sources`] on `k`, and
/// another on `j`.
const PAIR: &str = "pair";

fn pair_sources() -> Vec<(String, String)> {
    let rule = "rate_limit: {period: 1s, requests_per_unit: 10, algorithm: fixed_window}";
    let yaml =
        format!("domain: bench\ndescriptors:\n  - key: k\n    {rule}\n  - key: j\n    {rule}\n");
    vec![("bench.yaml".to_owned(), yaml)]
}

/// The request of a `limiter/` path.
#[derive(Clone, Copy)]
enum Shape {
    /// `k=<value>`.
    Top,
    /// `path=/login, k=<value>`.
    Nested,
    /// `k=<value>` and `j=<value>`, two descriptors.
    Pair,
}

/// A limiter on the memory store running `sources`, its clock and the store's one manual
/// clock, and the policy's sources.
fn limiter(
    sources: Vec<(String, String)>,
) -> (Arc<ManualClock>, Arc<Limiter>, Vec<(String, String)>) {
    let policy = Policy::from_sources(&sources).expect("bench policy");
    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
        1_700_000_000_000_000,
    )));
    let store = StoreBackend::Memory(MemoryStore::new(clock.clone()));
    let limiter =
        Limiter::with_failure_settings(policy, store, FailureSettings::default(), clock.clone());
    (clock, Arc::new(limiter), sources)
}

/// What `http::router` serves: the limiter's policy life cycle, with no config file.
fn lifecycle(limiter: Arc<Limiter>, sources: Vec<(String, String)>) -> Arc<Lifecycle> {
    Arc::new(Lifecycle::new(limiter, None, sources))
}

fn value(n: usize) -> String {
    format!("{n:0VALUE_LEN$}")
}

/// Runs `decide` for each key once (the warm-up: every key exists and answers its steady
/// state), then `decisions` times over the keys in turn; the manual clock advances 1 ms before
/// each. `decide` says whether the decision was allowed; any other answer fails the run, after
/// the count, so the check costs the same in every decision.
async fn drive<F, Fut>(clock: &ManualClock, decisions: usize, mut decide: F) -> Result<(), Failure>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = bool>,
{
    for n in 0..KEYS {
        clock.advance(Duration::from_millis(1));
        if !decide(n).await {
            return Err(format!("warm-up decision {n} was not allowed").into());
        }
    }
    let mut refused = 0usize;
    for i in 0..decisions {
        clock.advance(Duration::from_millis(1));
        refused += usize::from(!decide(i % KEYS).await);
    }
    match refused {
        0 => Ok(()),
        n => Err(format!("{n} of {decisions} decisions were not allowed").into()),
    }
}

/// `Limiter::check` of a request of `shape`.
async fn check(
    clock: &ManualClock,
    limiter: &Limiter,
    shape: Shape,
    decisions: usize,
) -> Result<(), Failure> {
    let requests: Vec<CheckRequest> = (0..KEYS)
        .map(|n| {
            let one = |key: &str| RequestDescriptor::new(vec![(key.into(), value(n))], 1, None);
            let descriptors = match shape {
                Shape::Top => vec![one("k")?],
                Shape::Nested => {
                    let entries = vec![("path".into(), "/login".into()), ("k".into(), value(n))];
                    vec![RequestDescriptor::new(entries, 1, None)?]
                }
                Shape::Pair => vec![one("k")?, one("j")?],
            };
            CheckRequest::new("bench".into(), descriptors)
        })
        .collect::<Result<_, _>>()?;
    drive(clock, decisions, |n| {
        let request = &requests[n];
        async move {
            match limiter.check(black_box(request)).await {
                Ok(response) => black_box(response).allowed(),
                Err(_) => false,
            }
        }
    })
    .await
}

/// Each key's request, as a framed protobuf message.
fn grpc_bodies() -> Vec<Bytes> {
    (0..KEYS)
        .map(|n| {
            let message = RateLimitRequest {
                domain: "bench".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "k".into(),
                        value: value(n),
                    }],
                    ..Default::default()
                }],
                hits_addend: 1,
            };
            // gRPC length-prefixed message: not compressed, 4-byte big-endian length.
            let encoded = message.encode_to_vec();
            let mut framed = Vec::with_capacity(5 + encoded.len());
            framed.push(0);
            framed.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
            framed.extend_from_slice(&encoded);
            Bytes::from(framed)
        })
        .collect()
}

/// Whether a gRPC answer is OK and allows the check, once read to the end.
async fn grpc_allowed<B: axum::body::HttpBody>(response: axum::http::Response<B>) -> bool {
    let Ok(collected) = response.into_body().collect().await else {
        return false;
    };
    let ok_status = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .is_some_and(|s| s == "0");
    let bytes = collected.to_bytes();
    let allowed = bytes.len() > 5
        && RateLimitResponse::decode(&bytes[5..])
            .is_ok_and(|r| r.overall_code == rate_limit_response::Code::Ok as i32);
    ok_status && allowed
}

async fn grpc<D: tollgate_server::Decide>(
    clock: &ManualClock,
    service: RlsService<D>,
    decisions: usize,
) -> Result<(), Failure> {
    let server = service.into_server();
    let bodies = grpc_bodies();
    drive(clock, decisions, |n| {
        let request = axum::http::Request::post(GRPC_PATH)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(bodies[n].clone()))
            .expect("gRPC request");
        let server = server.clone();
        async move {
            let Ok(response) = server.oneshot(request).await;
            grpc_allowed(response).await
        }
    })
    .await
}

/// [`grpc`] behind `serve`'s budgets of request bytes (its defaults), one connection's.
async fn grpc_budget<D: tollgate_server::Decide>(
    clock: &ManualClock,
    service: RlsService<D>,
    decisions: usize,
) -> Result<(), Failure> {
    use tollgate_server::listen::{
        CONNECTION_REQUEST_BYTES, ChargeLayer, REQUEST_BYTES, RequestBytes,
    };
    use tower::Layer;
    let budgets = RequestBytes::new(
        CONNECTION_REQUEST_BYTES,
        REQUEST_BYTES,
        tollgate_server::grpc::MAX_MESSAGE,
    );
    let connection = budgets.connection();
    let server = ChargeLayer.layer(service.into_server());
    let bodies = grpc_bodies();
    let result = drive(clock, decisions, |n| {
        let mut request = axum::http::Request::post(GRPC_PATH)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::new(Full::new(bodies[n].clone())))
            .expect("gRPC request");
        request.extensions_mut().insert(connection.clone());
        let server = server.clone();
        async move {
            let Ok(response) = server.oneshot(request).await;
            grpc_allowed(response).await
        }
    })
    .await;
    // Every answered request gave its bytes back.
    match budgets.held() {
        0 => result,
        held => Err(format!("{held} request bytes still held after the run").into()),
    }
}

async fn http_router(
    clock: &ManualClock,
    router: axum::Router,
    decisions: usize,
) -> Result<(), Failure> {
    let bodies: Vec<Bytes> = (0..KEYS)
        .map(|n| {
            Bytes::from(format!(
                r#"{{"domain":"bench","descriptors":[{{"entries":[{{"key":"k","value":"{}"}}]}}]}}"#,
                value(n)
            ))
        })
        .collect();
    drive(clock, decisions, |n| {
        let request = axum::http::Request::post("/v1/check")
            .header("content-type", "application/json")
            .body(Body::from(bodies[n].clone()))
            .expect("HTTP request");
        let router = router.clone();
        async move {
            let Ok(response) = router.oneshot(request).await;
            let allowed = response.status() == axum::http::StatusCode::OK;
            let read = response.into_body().collect().await.is_ok();
            allowed && read
        }
    })
    .await
}
