//! The configured backend: [`StoreBackend`], the enum of the stores, matched here alone. The
//! Redis variant comes with the `redis` feature; what only it does is in `backend/redis.rs`.

use std::future::Future;
#[cfg(feature = "redis")]
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Decision, Params};

use super::charge::Charge;
use super::contract::{Answered, Call, Decisions, Store};
use super::error::{StoreError, Timeout, Unsupported};
use super::memory::MemoryStore;
#[cfg(feature = "redis")]
use super::redis::RedisStore;
use super::redis_options::RedisOptions;
use super::url::StoreUrl;
use crate::resilience::BreakerState;

#[cfg(feature = "redis")]
mod redis;

/// The configured backend. The Redis variant comes with the `redis` feature (hence
/// `non_exhaustive`: a match elsewhere holds in every build).
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreBackend {
    /// In-process, the embedded default.
    Memory(MemoryStore),
    /// Redis or Redis Cluster (shared: a local-budget lease renewal runs as a task of its own).
    #[cfg(feature = "redis")]
    Redis(Arc<RedisStore>),
}

/// `$body` with `$store` bound to the store `$backend` holds, by reference: one arm per
/// backend, the Redis one with the `redis` feature alone.
macro_rules! each {
    ($backend:expr, $store:ident => $body:expr) => {
        match $backend {
            StoreBackend::Memory($store) => $body,
            #[cfg(feature = "redis")]
            StoreBackend::Redis(redis) => {
                let $store: &RedisStore = redis;
                $body
            }
        }
    };
}

/// What a backend does beside the [`Store`] contract; the memory store does none of it.
trait Extras {
    /// Prometheus text for the backend's own counters.
    fn render_metrics(&self, _out: &mut String) {}

    /// Script calls that carried coalesced decisions, and the decisions they carried.
    fn batch_stats(&self) -> Option<(u64, u64)> {
        None
    }

    /// Work done once the store answers, ahead of the first decisions.
    fn warm_up(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

impl Extras for MemoryStore {}

impl StoreBackend {
    /// Opens the store named by `url`. `clock` drives the memory store; `options` are the
    /// Redis stores' (the memory store has none).
    pub async fn open(
        url: &StoreUrl,
        #[cfg_attr(not(feature = "redis"), expect(unused_variables))] options: RedisOptions,
        clock: crate::clock::SharedClock,
    ) -> Result<Self, StoreError> {
        match url {
            StoreUrl::Memory => Ok(StoreBackend::Memory(MemoryStore::new(clock))),
            #[cfg(feature = "redis")]
            _ => Self::open_redis(url, options, clock).await,
        }
    }

    /// Prometheus text for the backend's own counters (Redis: decisions shed for load).
    pub fn render_metrics(&self, out: &mut String) {
        each!(self, store => store.render_metrics(out));
    }

    /// Script calls that carried coalesced decisions to the store, and the decisions they
    /// carried (Redis with coalescing); `None` where decisions are not coalesced.
    pub fn batch_stats(&self) -> Option<(u64, u64)> {
        each!(self, store => Extras::batch_stats(store))
    }

    /// Waits until the store answers, at most `within`. Returns whether it does.
    pub async fn wait_ready(&self, within: Duration) -> bool {
        self.ready_within(within).await.is_ok()
    }

    /// Waits until the store answers, at most `within`; else the last error it gave (a refused
    /// password says so, where "not reachable" would send an operator to the network). Redis
    /// then loads the decision scripts (see `RedisStore::load_scripts`); a failure there is
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
            each!(self, store => store.warm_up().await);
            return Ok(());
        }
        Err(last.unwrap_or(StoreError::TimedOut(Timeout::NotReady(within))))
    }

    /// The memory store, if that is the backend: it answers in place, and has its own sweep.
    pub fn memory(&self) -> Option<&MemoryStore> {
        match self {
            StoreBackend::Memory(m) => Some(m),
            #[cfg(feature = "redis")]
            StoreBackend::Redis(_) => None,
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
            #[cfg(feature = "redis")]
            StoreBackend::Redis(r) => Box::pin(Store::decide(&**r, call, charges, decisions)).await,
        }
    }

    async fn apply_before(
        &self,
        charges: &[Charge<'_>],
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        each!(self, store => Store::apply_before(store, charges, deadline).await)
    }

    fn supports(&self, params: &Params) -> Result<(), Unsupported> {
        each!(self, store => Store::supports(store, params))
    }

    async fn key_count(&self) -> Result<usize, StoreError> {
        each!(self, store => store.key_count().await)
    }

    fn breakers(&self) -> Vec<(String, BreakerState)> {
        each!(self, store => Store::breakers(store))
    }

    fn kind(&self) -> &'static str {
        each!(self, store => store.kind())
    }

    fn description(&self) -> &'static str {
        each!(self, store => store.description())
    }
}

/// Without Redis the one store is the memory store: it grants leases too, but on one process
/// the hot-keys layer has no use for them, and no other layer takes any yet.
#[cfg(not(feature = "redis"))]
impl super::contract::Granting for StoreBackend {
    type Grantor = MemoryStore;

    fn grantor(&self) -> Option<&std::sync::Arc<MemoryStore>> {
        None
    }
}
