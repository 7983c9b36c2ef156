//! An axum service protected by tollgate in-process.
//!
//! ```sh
//! cargo run -p tollgate-client --example protected -- examples/policy.yaml [memory|redis://...]
//! curl -si localhost:3000/ -H 'x-api-key: k1'
//! ```
//!
//! Requests are limited per `x-api-key` header (descriptor key `api_key`) and per client IP
//! (`remote_address`) in domain `api`.

use std::net::SocketAddr;

use axum::{Router, routing::get};
use tollgate::store::StoreUrl;
use tollgate_client::{Descriptors, Embedded, Options, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let policy = args.next().unwrap_or_else(|| "examples/policy.yaml".into());
    let store: StoreUrl = args.next().unwrap_or_else(|| "memory".into()).parse()?;

    let limiter = Embedded::open(&policy, &store, Options::default()).await?;
    let describe = Descriptors::new("api")
        .header("x-api-key", "api_key")
        .client_ip("remote_address");
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(limiter, describe));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
