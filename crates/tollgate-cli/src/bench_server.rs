//! `tollgate bench-server`: a no-op rate-limit server on the same stack as `tollgate serve`.
//!
//! It decodes and validates every request exactly like `serve` (same tonic RLS service, same
//! axum `POST /v1/check` handler and body limit, same socket options and logging setup) and then allows it without
//! a policy or a store. Its throughput is the ceiling `tollgate bench` compares `serve` with; see
//! `docs/benchmarks.md`. A benchmarking aid, never for production.
//!
//! With `--bare` it runs none of tollgate's server code instead: tonic's generated RLS server
//! around a service that answers OK to every request, with tonic's defaults, and an axum route
//! that reads the body of `POST /v1/check` and answers a fixed JSON body, with `axum::serve`'s
//! defaults. That is the floor of the stack: what tonic, h2, hyper and tokio cost by themselves,
//! which the no-op server and `serve` are measured against (`scripts/bench-pinned.sh`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use tollgate_server::AllowAll;
use tollgate_server::grpc::RlsService;
use tracing::{info, warn};

/// How long a stopping bench server waits for its connections, its gRPC keepalive and its
/// HTTP read deadline (`serve`'s defaults).
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(60);
const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);
const HTTP_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Debug, Args)]
pub struct BenchServerArgs {
    /// Address of the HTTP API (`POST /v1/check`, `GET /healthz`).
    #[arg(long, default_value = "127.0.0.1:18090", value_name = "ADDR")]
    http_addr: SocketAddr,
    /// Address of the Envoy RLS v3 gRPC service.
    #[arg(long, default_value = "127.0.0.1:18091", value_name = "ADDR")]
    grpc_addr: SocketAddr,
    /// Log format: `text` or `json`.
    #[arg(long, default_value = "text", value_parser = ["text", "json"], value_name = "FORMAT")]
    log_format: String,
    /// Run no tollgate server code: tonic's RLS server with its defaults answering OK to every
    /// request, and an axum route answering `POST /v1/check` with a fixed JSON body (the floor
    /// the no-op server and `serve` are measured against).
    #[arg(long, env = "TOLLGATE_BENCH_SERVER_BARE")]
    bare: bool,
}

pub fn run(args: BenchServerArgs) -> anyhow::Result<ExitCode> {
    crate::serve::init_logging(&args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(args))
}

async fn serve(args: BenchServerArgs) -> anyhow::Result<ExitCode> {
    if args.bare {
        return bare::serve(args.http_addr, args.grpc_addr).await;
    }
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let http = tollgate_server::listen::bind(args.http_addr, "HTTP")?;
    let grpc = tollgate_server::listen::bind(args.grpc_addr, "gRPC")?;
    // The same lines as `serve`, so scripts and tests find ports chosen with `:0`.
    println!("http listening on {}", http.local_addr()?);
    println!("grpc listening on {}", grpc.local_addr()?);
    warn!(
        "No-op bench server: every request is allowed and nothing is counted; never use it in production"
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = tollgate_server::listen::stopped;
    let http_server = tollgate_server::listen::serve_http(
        http,
        tollgate_server::http::allow_all_router(),
        tollgate_server::listen::Peer::Omitted,
        HTTP_READ_TIMEOUT,
        stop_rx.clone(),
        tollgate_server::listen::Open::default(),
    );
    let limits = tollgate_server::listen::GrpcLimits {
        keepalive: KEEPALIVE,
        keepalive_timeout: KEEPALIVE_TIMEOUT,
        ..Default::default()
    };
    // `serve`'s default budgets of request bytes, so the ceiling pays for them too.
    let request_bytes = tollgate_server::listen::RequestBytes::new(
        tollgate_server::listen::CONNECTION_REQUEST_BYTES,
        tollgate_server::listen::REQUEST_BYTES,
        tollgate_server::grpc::MAX_MESSAGE,
    );
    let grpc_server = tollgate_server::listen::grpc_server(&limits)
        .add_service(RlsService::new(Arc::new(AllowAll::default())).into_server())
        .serve_with_incoming_shutdown(
            tollgate_server::listen::metered(
                tollgate_server::listen::preface_within(
                    tollgate_server::listen::grpc_accepted(grpc),
                    KEEPALIVE_TIMEOUT,
                ),
                &request_bytes,
            ),
            stopped(stop_rx.clone()),
        );
    let http_task = tokio::spawn(http_server);
    let grpc_task = tokio::spawn(grpc_server);

    crate::serve::shutdown_signal(&mut terminate).await;
    info!("Shutting down");
    let _ = stop_tx.send(true);
    let work = async {
        http_task.await?;
        crate::serve::join_server(grpc_task, "gRPC").await
    };
    // A benchmarking aid: a cut drain is logged, and the exit status stays 0.
    let drained = crate::serve::drain(work, DRAIN_LIMIT, &mut terminate).await?;
    if drained != tollgate_server::listen::Drained::Complete {
        warn!(?drained, "Stopping now, with connections still open");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--bare`: the stack without tollgate.
mod bare {
    use std::net::SocketAddr;
    use std::process::ExitCode;

    use axum::body::Bytes;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
        RateLimitService, RateLimitServiceServer,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::{
        RateLimitRequest, RateLimitResponse, rate_limit_response::Code,
    };
    use tracing::{info, warn};

    /// The answer to every `POST /v1/check`: an allowed decision's fields, without headers.
    const ALLOWED: &str = r#"{"allowed":true,"overall_code":"OK","statuses":[{"code":"OK"}]}"#;

    /// Answers every check OK, without looking at it (tonic has decoded it).
    #[derive(Debug, Clone, Copy, Default)]
    struct AllowEverything;

    #[tonic::async_trait]
    impl RateLimitService for AllowEverything {
        async fn should_rate_limit(
            &self,
            _request: tonic::Request<RateLimitRequest>,
        ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
            Ok(tonic::Response::new(RateLimitResponse {
                overall_code: Code::Ok as i32,
                ..Default::default()
            }))
        }
    }

    async fn check(_body: Bytes) -> ([(http::HeaderName, &'static str); 1], &'static str) {
        ([(http::header::CONTENT_TYPE, "application/json")], ALLOWED)
    }

    pub(super) async fn serve(
        http_addr: SocketAddr,
        grpc_addr: SocketAddr,
    ) -> anyhow::Result<ExitCode> {
        let http = tokio::net::TcpListener::bind(http_addr).await?;
        let grpc = tokio::net::TcpListener::bind(grpc_addr).await?;
        println!("http listening on {}", http.local_addr()?);
        println!("grpc listening on {}", grpc.local_addr()?);
        warn!(
            "Bare bench server: no tollgate code, every request is allowed; never use it in production"
        );
        let router = axum::Router::new().route("/v1/check", axum::routing::post(check));
        let http_task = tokio::spawn(async move { axum::serve(http, router).await });
        // What `Server::serve(addr)` does with a listener it binds: TCP_NODELAY on.
        let incoming = tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true));
        let grpc_task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RateLimitServiceServer::new(AllowEverything))
                .serve_with_incoming(incoming),
        );
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            () = crate::serve::shutdown_signal(&mut terminate) => info!("Shutting down"),
            ended = http_task => { ended??; }
            ended = grpc_task => { ended??; }
        }
        Ok(ExitCode::SUCCESS)
    }
}
