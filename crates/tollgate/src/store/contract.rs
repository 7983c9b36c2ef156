//! The [`Store`] contract: what every backend, and every layer stacked over one, does with a
//! request's charges.

use std::future::Future;
use std::sync::Arc;

use smallvec::SmallVec;
use tollgate_core::{Decision, Params, Timestamp};

use super::charge::Charge;
use super::error::{StoreError, Unsupported};
use crate::policy::Posture;
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

/// One call of a request's charges: whether it commits, and what the layers above a store
/// need to know of the request (a backend reads only the mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// Whether admitted charges are committed.
    pub mode: Mode,
    /// When the request is decided, on the limiter's clock: leases and remembered denials are
    /// held and read at this instant.
    pub now: Timestamp,
    /// The epoch leases and remembered denials are valid in, read before the policy and
    /// overrides the charges come from (see `Limiter::epoch`).
    pub epoch: u64,
    /// How many of the charges, the first ones, are the live policy's; the rest are a shadow
    /// candidate's, which no layer answers for in the store's place (no remembered denial, no
    /// posture: the candidate skips a request it cannot see decided).
    pub live: usize,
}

impl Call {
    /// A call of `mode` whose charges are all live, at instant 0 of epoch 0: for a store alone,
    /// which reads only the mode.
    pub fn plain(mode: Mode) -> Self {
        Call {
            mode,
            now: Timestamp::EPOCH,
            epoch: 0,
            live: usize::MAX,
        }
    }

    /// The live policy's charges among `charges`.
    pub fn live<'s, 'c>(&self, charges: &'s [Charge<'c>]) -> &'s [Charge<'c>] {
        &charges[..self.live.min(charges.len())]
    }

    /// Whether a shadow candidate's charges are in the call.
    pub fn shadowed(&self, charges: &[Charge<'_>]) -> bool {
        self.live < charges.len()
    }
}

/// Per charge: the posture that answered for it, `None` where the store decided.
pub type Degraded = SmallVec<[Option<Posture>; INLINE_CHARGES]>;

/// Who answered a call, beside its decisions.
#[derive(Debug)]
pub enum Answered {
    /// The store decided every charge.
    Store,
    /// A denial the store gave earlier, remembered above it, answered the live charge at
    /// `index`; nothing was decided or charged, and no decisions were filled.
    Remembered { index: usize, denial: Decision },
    /// The failure postures answered because the store could not decide (`cause`): for the
    /// live charges only, each marked in `degraded` with the posture that answered it, `None`
    /// where the store decided it after all.
    Postures {
        degraded: Degraded,
        cause: StoreError,
    },
}

/// Charges of one request kept inline, without a heap allocation, by the limiter's hot path.
pub const INLINE_CHARGES: usize = 4;

/// One decision per charge, inline up to [`INLINE_CHARGES`] (see [`Store::decide`]).
pub type Decisions = SmallVec<[Decision; INLINE_CHARGES]>;

/// A place that keeps per-key state and applies a request's charges atomically: the contract
/// the limiter decides through. The layers of the decision path (`leases::HotKeys`,
/// `resilience::Postures`, [`Timed`](super::Timed)) wrap a store and are stores themselves.
///
/// Contract: [`Store::decide`] gives one decision per charge, in order. The request is
/// admitted when every charge with `enforce` is allowed; then, with [`Mode::Apply`], every
/// allowed charge is committed. Otherwise nothing is committed (all-or-nothing), and an allowed
/// charge answers with its figures as they stand ([`tollgate_core::as_is`]), not as after the
/// charge. Charges on the same key within one request are decided in order, each seeing the
/// ones before it.
pub trait Store: Send + Sync {
    /// Decides all charges of one request into `decisions` (cleared first), committing them
    /// with [`Mode::Apply`] if the request is admitted; answers who decided (a backend, always
    /// the store). Inline: on the memory store a request of up to [`INLINE_CHARGES`] warm keys
    /// allocates nothing.
    fn decide(
        &self,
        call: Call,
        charges: &[Charge<'_>],
        decisions: &mut Decisions,
    ) -> impl Future<Output = Result<Answered, StoreError>> + Send;

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

/// The health methods of a layer (a struct with an `inner` store) that adds none: its inner
/// store's, forwarded. With `apply_before`, that method too: the layer does nothing to the
/// charges a partial answer left to make.
macro_rules! health_of_inner {
    (apply_before) => {
        fn apply_before(
            &self,
            charges: &[$crate::store::Charge<'_>],
            deadline: tokio::time::Instant,
        ) -> impl std::future::Future<
            Output = Result<Vec<tollgate_core::Decision>, $crate::store::StoreError>,
        > + Send {
            self.inner.apply_before(charges, deadline)
        }

        $crate::store::health_of_inner!();
    };
    () => {
        fn supports(
            &self,
            params: &tollgate_core::Params,
        ) -> Result<(), $crate::store::Unsupported> {
            self.inner.supports(params)
        }

        fn key_count(
            &self,
        ) -> impl std::future::Future<Output = Result<usize, $crate::store::StoreError>> + Send {
            self.inner.key_count()
        }

        fn breakers(&self) -> Vec<(String, $crate::resilience::BreakerState)> {
            self.inner.breakers()
        }

        fn kind(&self) -> &'static str {
            self.inner.kind()
        }

        fn description(&self) -> &'static str {
            self.inner.description()
        }
    };
}
pub(crate) use health_of_inner;

/// [`Store::decide`]'s decisions, collected.
async fn decided<S: Store + ?Sized>(
    store: &S,
    charges: &[Charge<'_>],
    mode: Mode,
) -> Result<Vec<Decision>, StoreError> {
    let mut decisions = Decisions::new();
    store
        .decide(Call::plain(mode), charges, &mut decisions)
        .await?;
    Ok(decisions.into_vec())
}

/// A store that can grant leases (see `leases`): reserve units of a counter in one charge, and
/// take back the ones a holder did not use. Both stores do, with one contract (Redis's REFUND
/// script, `tollgate_core::refund`); whether the hot-keys layer leases from one is
/// [`Granting::shared`]'s to say.
pub trait Grants: Store + 'static {
    /// Charges `charge` whole, as a lease's reservation: its decision and the store's instant
    /// of the charge (µs), which a give-back names.
    fn reserve(
        &self,
        charge: Charge<'_>,
    ) -> impl Future<Output = Result<(Decision, i64), StoreError>> + Send;

    /// Takes back `charge.cost` units of a reservation charged at `at`: exactly when nothing
    /// else charged the counter since, never more than was charged, nothing into a counter
    /// made after `at` (the store lost or expired the one charged).
    fn give_back(
        &self,
        charge: Charge<'_>,
        at: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A store, or a stack of layers over one, that may reach a store granting leases, and whether
/// its store is shared. Two questions: the lease engine needs a grantor, the hot-keys layer a
/// shared store as well.
pub trait Granting {
    /// The granting store.
    type Grantor: Grants;

    /// The store that grants leases, if this stack reaches one.
    fn grantor(&self) -> Option<&Arc<Self::Grantor>>;

    /// Whether replicas share this stack's store (Redis), so that keeping hot keys off it
    /// pays: the prefilter and local budgets apply only then. A store of one process (memory)
    /// already decides locally; they would add nothing there, and stay inert. By default, a
    /// stack shares the store it leases from: today only Redis is handed out as a grantor; a
    /// stack that hands out the memory store must answer `false` here.
    fn shared(&self) -> bool {
        self.grantor().is_some()
    }
}
