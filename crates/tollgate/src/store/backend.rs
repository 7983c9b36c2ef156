//! The configured backend: [`StoreBackend`], the enum of the two stores, matched here alone.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Decision, Params};

use super::charge::Charge;
use super::contract::{Answered, Call, Decisions, Granting, Store};
use super::error::{StoreError, Timeout, Unsupported};
use super::memory::MemoryStore;
use super::redis::{RedisOptions, RedisStore};
use super::url::StoreUrl;
use crate::resilience::BreakerState;

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
        Err(last.unwrap_or(StoreError::TimedOut(Timeout::NotReady(within))))
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
        call: Call,
        charges: &[Charge<'_>],
        decisions: &mut Decisions,
    ) -> Result<Answered, StoreError> {
        // The Redis future is boxed: inline it would make every caller's future, and every
        // move of it, over a kilobyte larger, memory store included.
        match self {
            StoreBackend::Memory(m) => {
                decisions.clear();
                m.decide(charges, call.mode.applies(), decisions)?;
                Ok(Answered::Store)
            }
            StoreBackend::Redis(r) => Box::pin(Store::decide(&**r, call, charges, decisions)).await,
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

/// Leases come from Redis: the memory store grants them too, but on one process the hot-keys
/// layer has no use for them, and no other layer takes any yet.
impl Granting for StoreBackend {
    type Grantor = RedisStore;

    fn grantor(&self) -> Option<&Arc<RedisStore>> {
        self.redis()
    }

    fn shared(&self) -> bool {
        self.redis().is_some()
    }
}
