//! Where counters live. One async [`Store`] trait; backends are selected by [`StoreBackend`].

mod memory;
pub mod redis;
mod url;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{Decision, Params};

pub use self::redis::{
    CoalesceOptions, LATE_SLACK, MAX_SETTING, RedisOptions, RedisStore, SharedPolicy,
};
pub use memory::MemoryStore;
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
}

/// Charges of one request kept inline, without a heap allocation, by the limiter's hot path.
pub const INLINE_CHARGES: usize = 4;

/// One decision per charge, inline up to [`INLINE_CHARGES`] (see [`StoreBackend::decide`]).
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
    /// ([`StoreBackend::apply_before`] `deadline`, the request's).
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
            StoreError::Unavailable(_) | StoreError::NotCalled(_) => true,
            StoreError::Partly { cause, .. } => cause.is_transient(),
            StoreError::InvalidData(_) | StoreError::InvalidOptions(_) => false,
        }
    }
}

/// A place that keeps per-key state and applies a request's charges atomically.
///
/// Contract: `apply` returns one decision per charge, in order. The request is admitted when
/// every charge with `enforce` is allowed; then every allowed charge is committed. Otherwise
/// nothing is committed (all-or-nothing), and an allowed charge answers with its figures as
/// they stand ([`tollgate_core::as_is`]), not as after the charge. Charges on the same key within one request are decided
/// in order, each seeing the ones before it.
pub trait Store: Send + Sync {
    /// Decides and (if admitted) commits all charges of one request.
    fn apply(
        &self,
        charges: &[Charge<'_>],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Decides like [`Store::apply`] without committing anything (for explain).
    fn peek(
        &self,
        charges: &[Charge<'_>],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Number of keys held (for metrics and tests): the memory store counts its entries, expired
    /// ones included until swept; Redis answers `DBSIZE` summed over the primaries, which also
    /// counts the shared policy and any key that is not tollgate's.
    fn key_count(&self) -> impl Future<Output = Result<usize, StoreError>> + Send;
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
        Err(last.unwrap_or_else(|| StoreError::Unavailable(format!("no answer within {within:?}"))))
    }

    /// The state of each circuit breaker, by node (none for the memory store).
    pub fn breakers(&self) -> Vec<(String, crate::resilience::BreakerState)> {
        match self {
            StoreBackend::Memory(_) => Vec::new(),
            StoreBackend::Redis(r) => r.breakers(),
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

    /// Short name for logs and metric labels: `memory` or `redis`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreBackend::Memory(_) => "memory",
            StoreBackend::Redis(_) => "redis",
        }
    }

    /// What `/readyz` calls it: `memory`, `redis` or `redis cluster`.
    pub fn description(&self) -> &'static str {
        match self {
            StoreBackend::Redis(redis) if redis.is_cluster() => "redis cluster",
            other => other.kind(),
        }
    }

    /// [`Store::apply`] when `commit`, else [`Store::peek`], with the decisions written into
    /// `decisions` (cleared first), inline: on the memory store a request of up to
    /// [`INLINE_CHARGES`] warm keys allocates nothing.
    pub async fn decide(
        &self,
        charges: &[Charge<'_>],
        commit: bool,
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        decisions.clear();
        // The Redis futures are boxed: inline they would make every caller's future, and every
        // move of it, over a kilobyte larger, memory store included.
        let answer = match (self, commit) {
            (StoreBackend::Memory(m), _) => return m.decide(charges, commit, decisions),
            (StoreBackend::Redis(r), true) => Box::pin(r.apply(charges)).await,
            (StoreBackend::Redis(r), false) => Box::pin(r.peek(charges)).await,
        };
        decisions.extend(answer?);
        Ok(())
    }

    /// [`Store::apply`] within `deadline`: the charges a request's [`StoreError::Partly`]
    /// answer left to make (the memory store answers at once).
    pub async fn apply_before(
        &self,
        charges: &[Charge<'_>],
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        match self {
            StoreBackend::Memory(m) => m.apply(charges).await,
            StoreBackend::Redis(r) => r.apply_before(charges, deadline).await,
        }
    }

    /// Checks that this store can decide a limit exactly (Redis scripts work on doubles).
    pub fn supports(&self, params: &tollgate_core::Params) -> Result<(), String> {
        match self {
            StoreBackend::Memory(_) => Ok(()),
            StoreBackend::Redis(_) => RedisStore::supports(params),
        }
    }
}

impl Store for StoreBackend {
    async fn apply(&self, charges: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        match self {
            StoreBackend::Memory(m) => m.apply(charges).await,
            StoreBackend::Redis(r) => r.apply(charges).await,
        }
    }

    async fn peek(&self, charges: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        match self {
            StoreBackend::Memory(m) => m.peek(charges).await,
            StoreBackend::Redis(r) => r.peek(charges).await,
        }
    }

    async fn key_count(&self) -> Result<usize, StoreError> {
        match self {
            StoreBackend::Memory(m) => m.key_count().await,
            StoreBackend::Redis(r) => r.key_count().await,
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
