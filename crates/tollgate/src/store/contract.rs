//! The [`Store`] contract: what every backend does with a request's charges.

use std::future::Future;

use smallvec::SmallVec;
use tollgate_core::{Decision, Params};

use super::charge::Charge;
use super::error::{StoreError, Unsupported};
use crate::resilience::BreakerState;

/// Whether a store call charges what it admits or only looks (for explain).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Decide, and commit the charges if the request is admitted.
    Apply,
    /// Decide as [`Mode::Apply`] would, committing nothing.
    Peek,
}

impl Mode {
    /// [`Mode::Apply`] when `commit`, else [`Mode::Peek`].
    pub fn of(commit: bool) -> Self {
        if commit { Mode::Apply } else { Mode::Peek }
    }

    /// Whether this call commits.
    pub fn applies(self) -> bool {
        self == Mode::Apply
    }
}

/// Charges of one request kept inline, without a heap allocation, by the limiter's hot path.
pub const INLINE_CHARGES: usize = 4;

/// One decision per charge, inline up to [`INLINE_CHARGES`] (see [`Store::decide`]).
pub type Decisions = SmallVec<[Decision; INLINE_CHARGES]>;

/// A place that keeps per-key state and applies a request's charges atomically: the contract
/// the limiter decides through, which the failure postures and leases layer over.
///
/// Contract: [`Store::decide`] gives one decision per charge, in order. The request is
/// admitted when every charge with `enforce` is allowed; then, with [`Mode::Apply`], every
/// allowed charge is committed. Otherwise nothing is committed (all-or-nothing), and an allowed
/// charge answers with its figures as they stand ([`tollgate_core::as_is`]), not as after the
/// charge. Charges on the same key within one request are decided in order, each seeing the
/// ones before it.
pub trait Store: Send + Sync {
    /// Decides all charges of one request into `decisions` (cleared first), committing them
    /// with [`Mode::Apply`] if the request is admitted. Inline: on the memory store a request
    /// of up to [`INLINE_CHARGES`] warm keys allocates nothing.
    fn decide(
        &self,
        charges: &[Charge<'_>],
        mode: Mode,
        decisions: &mut Decisions,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Decides and commits `charges` within `deadline`: the charges a request's
    /// [`StoreError::Partly`] answer left to make (the memory store answers at once).
    fn apply_before(
        &self,
        charges: &[Charge<'_>],
        deadline: tokio::time::Instant,
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Checks that this store can decide a limit exactly (Redis scripts work on doubles).
    fn supports(&self, params: &Params) -> Result<(), Unsupported>;

    /// Number of keys held (for metrics and tests): the memory store counts its entries, expired
    /// ones included until swept; Redis answers `DBSIZE` summed over the primaries, which also
    /// counts the shared policy and any key that is not tollgate's.
    fn key_count(&self) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Health: the state of each circuit breaker, by node (none for the memory store).
    fn breakers(&self) -> Vec<(String, BreakerState)>;

    /// Health: short name for logs and metric labels, `memory` or `redis`.
    fn kind(&self) -> &'static str;

    /// Health: what `/readyz` calls it, `memory`, `redis` or `redis cluster`.
    fn description(&self) -> &'static str {
        self.kind()
    }

    /// Decides and (if admitted) commits all charges of one request.
    fn apply(
        &self,
        charges: &[Charge<'_>],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        decided(self, charges, Mode::Apply)
    }

    /// Decides like [`Store::apply`] without committing anything (for explain).
    fn peek(
        &self,
        charges: &[Charge<'_>],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        decided(self, charges, Mode::Peek)
    }
}

/// [`Store::decide`]'s decisions, collected.
async fn decided<S: Store + ?Sized>(
    store: &S,
    charges: &[Charge<'_>],
    mode: Mode,
) -> Result<Vec<Decision>, StoreError> {
    let mut decisions = Decisions::new();
    store.decide(charges, mode, &mut decisions).await?;
    Ok(decisions.into_vec())
}
