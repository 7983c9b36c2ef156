//! Why a body sent to a decision endpoint (`/v1/check`, `/v1/explain`, `/json`) is not a
//! request: each answered as a `400` saying so.

use tollgate::limiter::InvalidRequest;

use crate::json_object::InvalidJson;

/// Why a decision endpoint's body is not a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidBody {
    /// Not the JSON object the endpoint reads.
    #[error(transparent)]
    Json(#[from] InvalidJson),
    /// Read, but not a request tollgate takes.
    #[error("invalid request: {0}")]
    Request(#[from] InvalidRequest),
    /// A `/json` body whose fields envoyproxy/ratelimit's request cannot hold.
    #[error("invalid request: {0}")]
    EnvoyJson(#[from] EnvoyJsonError),
}

/// Why a `/json` body's fields do not fit envoyproxy/ratelimit's request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvoyJsonError {
    /// The field (named) is larger than its `uint32`.
    #[error("{0} does not fit in uint32")]
    NotUint32(&'static str),
    /// A limit's `unit` (as sent) is none of the envoy units.
    #[error("unknown unit `{0}`")]
    UnknownUnit(String),
    /// What was wrong with the descriptor at `index`.
    #[error("descriptor {index}: {why}")]
    Descriptor {
        index: usize,
        why: Box<EnvoyJsonError>,
    },
}
