//! The client crate: what the embedded limiter refuses to open on, its upkeep, the tower layer,
//! remote clients.
//!
//! One test binary for all of them: each links the whole stack once, not once a file.

mod embedded_open;
mod embedded_upkeep;
mod layer;
mod remote_grpc_headers;
mod remote_unreachable;
