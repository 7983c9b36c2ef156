//! The xDS config source: envoyproxy/ratelimit's `CONFIG_TYPE=GRPC_XDS_SOTW`, as Envoy Gateway
//! runs it. The limits arrive as [`proto::RateLimitConfig`] resources over the aggregated
//! discovery service (state of the world) from a management server, not from files.
//!
//! - [`proto`]: the resource's messages.
//! - `convert`: a resource as a policy source.

mod convert;
pub mod proto;

pub use convert::{ResourceError, policy_source, sources};
