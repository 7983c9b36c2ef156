//! Where counters live. One async [`Store`] trait; backends are selected by [`StoreBackend`].

mod memory;
pub mod redis;
mod timed;
mod url;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{Decision, Params};

use crate::policy::{LocalBudget, Posture};
use crate::resilience::BreakerState;

pub use self::redis::{
    CoalesceOptions, LATE_SLACK, MAX_SETTING, RedisOptions, RedisStore, SharedPolicy,
};
pub use memory::MemoryStore;
pub use timed::{timed_store_call, timed_store_call_now};
pub use url::{InvalidStoreUrl, StoreUrl, redact};

/// One limit to charge within a request.
#[derive(Debug, Clone, Copy)]
pub struct Charge<'a> {
    /// Counter key, already injective (see `limiter::keys`).
    pub key: &'a [u8],
    /// The limit.
    pub params: &'a Params,
    /// Weight of the request; 0 checks the limit without charging it (the decision of
    /// [`tollgate_core::check`]: a denial when a cost of 1 would be denied).
    pub cost: u64,
    /// Whether a denial of this charge denies the request (false for shadow-mode rules).
    pub enforce: bool,
    /// A live limit of a `quota_mode` rule: its denial denies the request only when every
    /// quota charge of the request is denied (see [`admitted`]).
    pub quota: bool,
    /// A check (`cost` 0) answers as the counter stands: over only when it is already past
    /// its limit, as envoyproxy/ratelimit answers `hits_addend: 0` ([`tollgate_core::check_as_is`]).
    /// Otherwise a check is over when a cost of 1 would be ([`tollgate_core::check`]).
    pub checks_as_is: bool,
    /// What answers for this charge when the store cannot decide it: its rule's
    /// `on_store_error`, else the server's default posture.
    pub posture: Posture,
    /// The fraction of the limit the `local` posture enforces on this replica: its rule's
    /// `local_share`, else the server's default.
    pub local_share: f64,
    /// Units a replica may reserve of this counter and admit from without the store: its
    /// rule's `local_budget` (a shared store only). Borrowed from the rule: a charge is
    /// copied from layer to layer, and held across the store call.
    pub local_budget: Option<&'a LocalBudget>,
    /// Whether the prefilter may remember a denial of this charge (a shared store only).
    pub prefilterable: bool,
}

impl<'a> Charge<'a> {
    /// An enforced charge of `cost` on `key` under `params`, with the settings of a limit that
    /// sets none: the `open` posture, the whole limit as its local share, no local budget, and
    /// never remembered by the prefilter.
    pub fn new(key: &'a [u8], params: &'a Params, cost: u64) -> Self {
        Charge {
            key,
            params,
            cost,
            enforce: true,
            quota: false,
            checks_as_is: false,
            posture: Posture::Open,
            local_share: 1.0,
            local_budget: None,
            prefilterable: false,
        }
    }
}

impl<'a> Charge<'a> {
    /// This charge in a store call that decides part of its request (one cluster slot, the
    /// slots a partial answer left): a quota limit as one that does not enforce, since whether
    /// its denial denies depends on quota limits outside the call. Allowed, it is charged;
    /// denied, it charges nothing; the caller decides the request with [`admitted`].
    pub fn apart(&self) -> Charge<'a> {
        if self.quota {
            Charge {
                enforce: false,
                quota: false,
                ..*self
            }
        } else {
            *self
        }
    }
}

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

/// A limit a store cannot decide exactly (see [`Store::supports`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

/// Charges of one request kept inline, without a heap allocation, by the limiter's hot path.
pub const INLINE_CHARGES: usize = 4;

/// One decision per charge, inline up to [`INLINE_CHARGES`] (see [`Store::decide`]).
pub type Decisions = SmallVec<[Decision; INLINE_CHARGES]>;

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
    /// The store's settings cannot work (see [`RedisOptions::check`]).
    #[error("invalid store settings: {0}")]
    InvalidOptions(String),
    /// Some of a request's counters could not be decided (`cause`): they live on Redis
    /// Cluster nodes that could not answer, or are new to a memory store at its most keys.
    /// The others were decided without charging anything: `decided[i]` is charge `i`'s
    /// decision as it stands, `None` where it could not be decided. The limiter lets the
    /// failure postures answer for those charges alone and charges the others
    /// ([`Store::apply_before`] `deadline`, the request's).
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

/// The configured backend.
#[derive(Debug)]
pub enum StoreBackend {
    /// In-process, the embedded default.
    Memory(MemoryStore),
    /// Redis or Redis Cluster (shared: a local-budget lease renewal runs as a task of its own).
    Redis(Arc<RedisStore>),
}

impl StoreBackend {
    /// Opens the store named by `url`. `clock` drives the memory store.
    pub async fn open(
        url: &StoreUrl,
        options: RedisOptions,
        clock: crate::clock::SharedClock,
    ) -> Result<Self, StoreError> {
        match url {
            StoreUrl::Memory => Ok(StoreBackend::Memory(MemoryStore::new(clock))),
            _ => {
                let redis = RedisStore::connect(url, options, clock).await?;
                Ok(StoreBackend::Redis(Arc::new(redis)))
            }
        }
    }

    /// Prometheus text for the backend's own counters (Redis: decisions shed for load).
    pub fn render_metrics(&self, out: &mut String) {
        if let StoreBackend::Redis(redis) = self {
            redis.render_metrics(out);
        }
    }

    /// Waits until the store answers, at most `within`. Returns whether it does.
    pub async fn wait_ready(&self, within: Duration) -> bool {
        self.ready_within(within).await.is_ok()
    }

    /// Waits until the store answers, at most `within`; else the last error it gave (a refused
    /// password says so, where "not reachable" would send an operator to the network). Redis
    /// then loads the decision scripts (see [`RedisStore::load_scripts`]); a failure there is
    /// logged, and the first decisions load them instead.
    pub async fn ready_within(&self, within: Duration) -> Result<(), StoreError> {
        let mut last = None;
        let attempts = async {
            loop {
                match self.key_count().await {
                    Ok(_) => return,
                    Err(e) => last = Some(e),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        if tokio::time::timeout(within, attempts).await.is_ok() {
            if let StoreBackend::Redis(redis) = self
                && let Err(e) = redis.load_scripts().await
            {
                tracing::warn!(error = %e, "Could not load the decision scripts ahead of the first decisions");
            }
            return Ok(());
        }
        Err(last.unwrap_or_else(|| StoreError::TimedOut(format!("no answer within {within:?}"))))
    }

    /// The memory store, if that is the backend: it answers in place, and has its own sweep.
    pub fn memory(&self) -> Option<&MemoryStore> {
        match self {
            StoreBackend::Memory(m) => Some(m),
            StoreBackend::Redis(_) => None,
        }
    }

    /// The Redis store, if that is the backend: shared between replicas, so the prefilter and
    /// local budgets apply, and the one that reserves and gives back leases.
    pub fn redis(&self) -> Option<&Arc<RedisStore>> {
        match self {
            StoreBackend::Memory(_) => None,
            StoreBackend::Redis(r) => Some(r),
        }
    }

    /// Checks that this store can decide every limit of `policy` exactly; each problem names
    /// the rule and where it is defined.
    pub fn check_policy(
        &self,
        policy: &crate::policy::Policy,
    ) -> Result<(), crate::policy::PolicyErrors> {
        use crate::policy::{PolicyError, PolicyErrors};
        let problems: Vec<PolicyError> = policy
            .rules()
            .iter()
            .filter_map(|rule| {
                let why = self.supports(rule.limit.as_ref()?).err()?;
                let message = format!(
                    "rule `{}` cannot run on the {} store: {why}",
                    rule.name,
                    self.kind()
                );
                Some(PolicyError::new(Some(rule.location.clone()), message))
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(PolicyErrors(problems))
        }
    }
}

impl Store for StoreBackend {
    async fn decide(
        &self,
        charges: &[Charge<'_>],
        mode: Mode,
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        // The Redis future is boxed: inline it would make every caller's future, and every
        // move of it, over a kilobyte larger, memory store included.
        match self {
            StoreBackend::Memory(m) => {
                decisions.clear();
                m.decide(charges, mode.applies(), decisions)
            }
            StoreBackend::Redis(r) => Box::pin(Store::decide(&**r, charges, mode, decisions)).await,
        }
    }

    async fn apply_before(
        &self,
        charges: &[Charge<'_>],
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        match self {
            StoreBackend::Memory(m) => m.apply(charges).await,
            StoreBackend::Redis(r) => Store::apply_before(&**r, charges, deadline).await,
        }
    }

    fn supports(&self, params: &Params) -> Result<(), Unsupported> {
        match self {
            StoreBackend::Memory(m) => Store::supports(m, params),
            StoreBackend::Redis(r) => Store::supports(&**r, params),
        }
    }

    async fn key_count(&self) -> Result<usize, StoreError> {
        match self {
            StoreBackend::Memory(m) => m.key_count().await,
            StoreBackend::Redis(r) => r.key_count().await,
        }
    }

    fn breakers(&self) -> Vec<(String, BreakerState)> {
        match self {
            StoreBackend::Memory(m) => Store::breakers(m),
            StoreBackend::Redis(r) => Store::breakers(&**r),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            StoreBackend::Memory(m) => m.kind(),
            StoreBackend::Redis(r) => r.kind(),
        }
    }

    fn description(&self) -> &'static str {
        match self {
            StoreBackend::Memory(m) => m.description(),
            StoreBackend::Redis(r) => r.description(),
        }
    }
}

/// Whether a request whose charges got `decisions` is admitted: every enforced charge
/// without [`Charge::quota`] is allowed, and so is at least one quota charge when there are
/// any, as envoyproxy/ratelimit's quota mode answers (a quota charge that does not enforce,
/// a shadow rule's, never counts as over). Then every allowed charge is committed; a denied
/// quota charge charges nothing.
pub fn admitted(charges: &[Charge<'_>], decisions: &[Decision]) -> bool {
    let mut quotas = Quotas::default();
    for (c, d) in charges.iter().zip(decisions) {
        if !quotas.admits(c, d.is_allowed()) {
            return false;
        }
    }
    quotas.satisfied()
}

/// The quota charges of one request seen so far (see [`admitted`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct Quotas {
    /// Whether there is one.
    any: bool,
    /// Whether one of them is allowed (or does not enforce).
    passes: bool,
}

impl Quotas {
    /// Takes in `charge`, allowed or not; false when it denies the request on its own (an
    /// enforced charge without quota mode, denied).
    pub fn admits(&mut self, charge: &Charge<'_>, allowed: bool) -> bool {
        if charge.quota {
            self.any = true;
            self.passes |= allowed || !charge.enforce;
            return true;
        }
        allowed || !charge.enforce
    }

    /// Whether the quota charges taken in let the request through: none, or one allowed.
    pub fn satisfied(self) -> bool {
        !self.any || self.passes
    }
}
