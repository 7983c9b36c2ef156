//! Why a store could not decide, or cannot decide a limit at all.

use tollgate_core::Decision;

use super::redis::script::InexactInLua;

/// A limit a store cannot decide exactly (see [`Store::supports`](super::Store::supports)).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unsupported {
    /// The Redis scripts, which work on doubles, cannot represent it exactly.
    #[error(transparent)]
    InexactInLua(#[from] InexactInLua),
}

/// Why a store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The backend is unreachable, slow or failing; a retry may succeed. The call may have
    /// been sent, and even applied, before it failed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The call was refused before anything was sent (circuit breaker open, too many calls in
    /// flight, cluster slot map not known yet): the store has not seen it, and a retry may
    /// succeed.
    #[error("store unavailable, not called: {0}")]
    NotCalled(String),
    /// The call was sent and no answer came before its deadline: a store that is down or
    /// overloaded, or one that never answers this client at all (a plaintext server to a TLS
    /// client). The call may have been applied. A retry may succeed.
    #[error("store did not answer in time: {0}")]
    TimedOut(String),
    /// The backend answered something we cannot use (for example a foreign value at our key).
    #[error("store returned invalid data: {0}")]
    InvalidData(String),
    /// The store's settings cannot work (see [`RedisOptions::check`](super::RedisOptions::check)).
    #[error("invalid store settings: {0}")]
    InvalidOptions(String),
    /// Some of a request's counters could not be decided (`cause`): they live on Redis
    /// Cluster nodes that could not answer, or are new to a memory store at its most keys.
    /// The others were decided without charging anything: `decided[i]` is charge `i`'s
    /// decision as it stands, `None` where it could not be decided. The limiter lets the
    /// failure postures answer for those charges alone and charges the others
    /// ([`Store::apply_before`](super::Store::apply_before) `deadline`, the request's).
    #[error("{cause}")]
    Partly {
        decided: Vec<Option<Decision>>,
        cause: Box<StoreError>,
        deadline: tokio::time::Instant,
    },
}

impl StoreError {
    /// Whether retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Unavailable(_) | StoreError::NotCalled(_) | StoreError::TimedOut(_) => true,
            StoreError::Partly { cause, .. } => cause.is_transient(),
            StoreError::InvalidData(_) | StoreError::InvalidOptions(_) => false,
        }
    }
}
