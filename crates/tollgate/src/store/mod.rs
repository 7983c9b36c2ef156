//! Where counters live. One async [`Store`] trait; backends are selected by [`StoreBackend`].

mod memory;

use std::future::Future;

use tollgate_core::{Decision, Params};

pub use memory::MemoryStore;

/// One limit to charge within a request.
#[derive(Debug, Clone, Copy)]
pub struct Charge<'a> {
    /// Counter key, already injective (see `limiter::keys`).
    pub key: &'a [u8],
    /// The limit.
    pub params: &'a Params,
    /// Weight of the request, at least 1.
    pub cost: u64,
    /// Whether a denial of this charge denies the request (false for shadow-mode rules).
    pub enforce: bool,
}

/// Why a store could not decide.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend is unreachable, slow or failing; a retry may succeed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend answered something we cannot use (for example a foreign value at our key).
    #[error("store returned invalid data: {0}")]
    InvalidData(String),
}

impl StoreError {
    /// Whether retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// A place that keeps per-key state and applies a request's charges atomically.
///
/// Contract: `apply` returns one decision per charge, in order. The request is admitted when
/// every charge with `enforce` is allowed; then every allowed charge is committed. Otherwise
/// nothing is committed (all-or-nothing). Charges on the same key within one request are decided
/// in order, each seeing the ones before it.
pub trait Store: Send + Sync {
    /// Decides and (if admitted) commits all charges of one request.
    fn apply(
        &self,
        charges: &[Charge<'_>],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Number of live keys (for metrics and tests).
    fn key_count(&self) -> usize;
}

/// The configured backend.
#[derive(Debug)]
pub enum StoreBackend {
    /// In-process, the embedded default.
    Memory(MemoryStore),
}

impl Store for StoreBackend {
    async fn apply(&self, charges: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        match self {
            StoreBackend::Memory(m) => m.apply(charges).await,
        }
    }

    fn key_count(&self) -> usize {
        match self {
            StoreBackend::Memory(m) => m.key_count(),
        }
    }
}

/// Whether a request whose charges got `decisions` is admitted.
pub fn admitted(charges: &[Charge<'_>], decisions: &[Decision]) -> bool {
    charges
        .iter()
        .zip(decisions)
        .all(|(c, d)| !c.enforce || d.is_allowed())
}
