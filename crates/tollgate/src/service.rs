//! The composition root: one builder that `tollgate serve` and the embedded client both call.
//!
//! [`Service::builder`] opens the store, checks that it can decide every rule of the policy,
//! and builds the [`Limiter`] and its [`Lifecycle`]. [`Service::duties`] lists the background
//! work the service needs (sweeps, the policy watcher, the Redis policy sync), each a named
//! task for [`crate::background::supervise`]; the caller decides how long they are wanted.
//!
//! ```
//! use tollgate::policy::Policy;
//! use tollgate::service::Service;
//! use tollgate::store::{Store, StoreUrl};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let policy = Policy::from_yaml("p.yaml", "domain: api\ndescriptors: []\n").unwrap();
//! let service = Service::builder(policy, StoreUrl::Memory).build().await.unwrap();
//! assert_eq!(service.limiter().store().kind(), "memory");
//! # });
//! ```

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::clock::{SharedClock, SystemClock};
use crate::lifecycle::Lifecycle;
use crate::limiter::{FailureSettings, Limiter};
use crate::policy::{Policy, PolicyErrors};
#[cfg(feature = "redis")]
use crate::policy_sync::{self, SyncState};
use crate::store::{Granting, RedisOptions, Store, StoreBackend, StoreError, StoreUrl};

/// Why a service could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The store could not be opened (a malformed URL, settings that cannot work).
    #[error("cannot open the store {url}: {source}")]
    Store {
        /// The store, its password redacted.
        url: String,
        /// What went wrong.
        source: StoreError,
    },
    /// Rules this store cannot decide exactly; each problem names the rule and its location.
    #[error("{} rule(s) cannot run on the {store} store", problems.0.len())]
    Unsupported {
        /// `memory` or `redis`.
        store: &'static str,
        /// Every problem, with its location.
        problems: PolicyErrors,
    },
}

/// What a service is built from; see [`Service::builder`].
#[derive(Debug)]
pub struct ServiceBuilder {
    policy: Policy,
    store: StoreUrl,
    redis: RedisOptions,
    failure: FailureSettings,
    memory_max_keys: usize,
    memory_max_bytes: Option<usize>,
    prefilter: bool,
    max_overrides: usize,
    config: Option<PathBuf>,
    sources: Vec<(String, String)>,
    ready_within: Option<Duration>,
    clock: SharedClock,
    managed_by: Option<&'static str>,
    policy_defaults: crate::policy::PolicyDefaults,
    policy_history_max_bytes: usize,
}

impl ServiceBuilder {
    /// Redis connection, deadline, breaker and batching settings (ignored by the memory store).
    pub fn redis(mut self, options: RedisOptions) -> Self {
        self.redis = options;
        self
    }

    /// The server-wide failure posture and `local` share.
    pub fn failure(mut self, settings: FailureSettings) -> Self {
        self.failure = settings;
        self
    }

    /// Most keys the memory store (and the `local` posture's store) holds.
    pub fn memory_max_keys(mut self, max: usize) -> Self {
        self.memory_max_keys = max;
        self
    }

    /// Most bytes the memory store's keys (and the `local` posture's store's) are counted for,
    /// none by default: see [`MemoryStore::with_max_bytes`](crate::store::MemoryStore::with_max_bytes).
    pub fn memory_max_bytes(mut self, max: usize) -> Self {
        self.memory_max_bytes = Some(max);
        self
    }

    /// Whether remembered store denials answer without calling Redis (on by default).
    pub fn prefilter(mut self, on: bool) -> Self {
        self.prefilter = on;
        self
    }

    /// Most runtime overrides in force ([`crate::limiter::DEFAULT_MAX_OVERRIDES`] by default):
    /// a set past it is refused.
    pub fn max_overrides(mut self, max: usize) -> Self {
        self.max_overrides = max;
        self
    }

    /// The file or directory the policy was read from, and its sources as read: reloads read
    /// the path again, and the first version records the sources.
    pub fn config(mut self, path: PathBuf, sources: Vec<(String, String)>) -> Self {
        self.config = Some(path);
        self.sources = sources;
        self
    }

    /// Waits until the store answers, at most `within`, before returning; a store not ready by
    /// then is logged and the service starts anyway (its failure postures answer until it is).
    pub fn ready_within(mut self, within: Duration) -> Self {
        self.ready_within = Some(within);
        self
    }

    /// Makes `source` (`"xDS"`) the only writer of the policy: the life cycle starts from the
    /// builder's policy (the empty one) as its first version, the admin API's writes are
    /// refused, and [`Service::duties`] leaves out the file watcher and the Redis policy sync
    /// (each replica subscribes to the source itself). The source applies its pushes through
    /// [`Lifecycle::apply_managed`].
    pub fn managed_by(mut self, source: &'static str) -> Self {
        self.managed_by = Some(source);
        self
    }

    /// What the rules of every policy this service compiles (reloads, pushes, candidates, a
    /// shared store's versions) get for the settings they leave out. The first policy, given
    /// to [`Service::builder`], must have been compiled with the same defaults.
    pub fn policy_defaults(mut self, defaults: crate::policy::PolicyDefaults) -> Self {
        self.policy_defaults = defaults;
        self
    }

    /// Most bytes of source texts the kept policy versions hold
    /// ([`crate::lifecycle::DEFAULT_HISTORY_MAX_BYTES`] by default; see
    /// [`Lifecycle::with_history_max_bytes`]).
    pub fn policy_history_max_bytes(mut self, max: usize) -> Self {
        self.policy_history_max_bytes = max;
        self
    }

    /// The clock decisions are made with (the system's by default).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Opens the store, checks the policy against it and builds the service.
    pub async fn build(self) -> Result<Service, BuildError> {
        let store = StoreBackend::open(&self.store, self.redis, self.clock.clone())
            .await
            .map_err(|source| BuildError::Store {
                url: self.store.to_string(),
                source,
            })?;
        let store = match store {
            StoreBackend::Memory(memory) => {
                let memory = memory.with_max_keys(self.memory_max_keys);
                StoreBackend::Memory(match self.memory_max_bytes {
                    Some(max) => memory.with_max_bytes(max),
                    None => memory,
                })
            }
            #[cfg(feature = "redis")]
            redis => redis,
        };
        store
            .check_policy(&self.policy)
            .map_err(|problems| BuildError::Unsupported {
                store: store.kind(),
                problems,
            })?;
        if store.memory().is_some() {
            let budgeted = self.policy.rules().iter();
            let budgeted = budgeted.filter(|r| r.local_budget.is_some()).count();
            if budgeted > 0 {
                info!(
                    rules = budgeted,
                    "local_budget has no effect on the memory store (every decision is local already)"
                );
            }
        }
        if let Some(within) = self.ready_within {
            match store.ready_within(within).await {
                Ok(()) => info!(store = %self.store, "Store ready"),
                Err(e) => {
                    // A TLS client waits for a TLS answer a plaintext server never sends: all
                    // it sees is time running out.
                    let tls_silence = self.store.uses_tls() && matches!(e, StoreError::TimedOut(_));
                    let hint = if tls_silence {
                        " (the URL asks for TLS: does the server speak it?)"
                    } else {
                        ""
                    };
                    warn!(store = %self.store, error = %e, "Store not ready yet{hint}; serving with the failure posture and trying again in the background");
                }
            }
        }
        let failure = FailureSettings {
            local_max_keys: self.memory_max_keys,
            local_max_bytes: self.memory_max_bytes,
            ..self.failure
        };
        let limiter = Limiter::with_failure_settings(self.policy, store, failure, self.clock)
            .with_prefilter(self.prefilter)
            .with_max_overrides(self.max_overrides);
        let limiter = Arc::new(limiter);
        let lifecycle = match self.managed_by {
            Some(source) => Lifecycle::managed(limiter.clone(), source),
            None => Lifecycle::new(limiter.clone(), self.config, self.sources),
        }
        .with_policy_defaults(self.policy_defaults)
        .with_history_max_bytes(self.policy_history_max_bytes);
        let lifecycle = Arc::new(lifecycle);
        Ok(Service { limiter, lifecycle })
    }
}

/// A limiter with its policy life cycle: what `tollgate serve` serves and an embedded caller
/// decides with.
#[derive(Debug, Clone)]
pub struct Service {
    limiter: Arc<Limiter>,
    lifecycle: Arc<Lifecycle>,
}

/// How often the background duties run; `None` leaves a duty out.
#[derive(Debug, Clone)]
pub struct Upkeep {
    /// Expired counters leave the in-process stores (and expired overrides go) this often.
    pub sweep_every: Duration,
    /// The policy files are looked at this often, and reloaded when they changed.
    pub watch_every: Option<Duration>,
    /// Each signal it receives reloads the policy files at once (`tollgate serve`'s SIGHUP);
    /// shared by the watcher's runs, registered before anything is announced.
    pub reload_on: Option<ReloadSignal>,
    /// The fleet's shared policy and overrides in Redis are looked at this often.
    pub sync_every: Option<Duration>,
    /// Whether the sync only follows the fleet's policy and never publishes this service's own
    /// (an embedded limiter beside `tollgate serve` replicas; see [`SyncState::follower`]).
    pub sync_follows: bool,
}

impl Default for Upkeep {
    fn default() -> Self {
        Upkeep {
            sweep_every: Duration::from_secs(1),
            watch_every: None,
            reload_on: None,
            sync_every: None,
            sync_follows: false,
        }
    }
}

/// A signal stream that asks for a reload (SIGHUP), held by one run of the watcher at a time.
pub type ReloadSignal = Arc<tokio::sync::Mutex<Option<tokio::signal::unix::Signal>>>;

/// A future a duty runs, boxed: duties differ in type and run once per (re)start.
pub type DutyRun = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One background duty: a name for logs and metrics, and what makes a run of it (called again
/// when a run panicked).
pub struct Duty {
    /// Its name in logs and in `tollgate_background_task_panics_total{task}`.
    pub name: &'static str,
    /// Makes a run; a run ends once `stop` says so (or its sender is gone).
    pub run: Box<dyn FnMut() -> DutyRun + Send>,
}

impl std::fmt::Debug for Duty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Duty").field("name", &self.name).finish()
    }
}

impl Service {
    /// A builder for a service enforcing `policy` over the store at `store`.
    pub fn builder(policy: Policy, store: StoreUrl) -> ServiceBuilder {
        ServiceBuilder {
            policy,
            store,
            redis: RedisOptions::default(),
            failure: FailureSettings::default(),
            memory_max_keys: usize::MAX,
            memory_max_bytes: None,
            prefilter: true,
            max_overrides: crate::limiter::DEFAULT_MAX_OVERRIDES,
            config: None,
            sources: Vec::new(),
            ready_within: None,
            clock: Arc::new(SystemClock::new()),
            managed_by: None,
            policy_defaults: crate::policy::PolicyDefaults::default(),
            policy_history_max_bytes: crate::lifecycle::DEFAULT_HISTORY_MAX_BYTES,
        }
    }

    /// The limiter.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// The policy life cycle: versions, reloads, rollbacks, candidates.
    pub fn lifecycle(&self) -> &Arc<Lifecycle> {
        &self.lifecycle
    }

    /// The duties this service needs kept, each ending once `stop` says stop or its sender is
    /// dropped: the counter sweep; on Redis the hot-key sweep (it gives every local budget back
    /// when it ends) and, with `sync_every`, the policy sync; with `watch_every` or
    /// `reload_now`, the policy watcher. A policy managed from outside (see
    /// [`ServiceBuilder::managed_by`]) has neither the watcher nor the sync.
    pub fn duties(&self, upkeep: &Upkeep, stop: &watch::Receiver<bool>) -> Vec<Duty> {
        let shared = self.limiter.store().shared();
        let own_policy = self.lifecycle.managed_by().is_none();
        let mut duties = Vec::new();
        let (limiter, every, stop_rx) = (self.limiter.clone(), upkeep.sweep_every, stop.clone());
        duties.push(duty("counter_sweep", move || {
            Box::pin(sweep_counters(limiter.clone(), every, stop_rx.clone()))
        }));
        // Leases and remembered denials exist on Redis only.
        if shared {
            let (limiter, stop_rx) = (self.limiter.clone(), stop.clone());
            duties.push(duty("hot_key_sweep", move || {
                Box::pin(sweep_hot_keys(limiter.clone(), stop_rx.clone()))
            }));
        }
        if own_policy && (upkeep.watch_every.is_some() || upkeep.reload_on.is_some()) {
            let (lifecycle, stop_rx) = (self.lifecycle.clone(), stop.clone());
            let (every, now) = (upkeep.watch_every, upkeep.reload_on.clone());
            duties.push(duty("policy_watcher", move || {
                Box::pin(watch_policy(
                    lifecycle.clone(),
                    every,
                    now.clone(),
                    stop_rx.clone(),
                ))
            }));
        }
        #[cfg(feature = "redis")]
        if own_policy && shared {
            duties.extend(self.policy_sync(upkeep, stop));
        }
        duties
    }

    /// The policy sync, with `sync_every`: on a shared store (Redis), for a service whose
    /// policy is its own.
    #[cfg(feature = "redis")]
    fn policy_sync(&self, upkeep: &Upkeep, stop: &watch::Receiver<bool>) -> Option<Duty> {
        let every = upkeep.sync_every?;
        let (lifecycle, stop_rx) = (self.lifecycle.clone(), stop.clone());
        // Kept across runs: a restarted sync publishes what was activated meanwhile.
        let state = if upkeep.sync_follows {
            SyncState::follower(&self.lifecycle)
        } else {
            SyncState::new(&self.lifecycle)
        };
        let state = Arc::new(tokio::sync::Mutex::new(state));
        Some(duty("policy_sync", move || {
            Box::pin(policy_sync::resume(
                lifecycle.clone(),
                every,
                stop_rx.clone(),
                state.clone(),
            ))
        }))
    }
}

fn duty(name: &'static str, run: impl FnMut() -> DutyRun + Send + 'static) -> Duty {
    Duty {
        name,
        run: Box::new(run),
    }
}

/// Resolves once `stop` says stop, or once its sender is gone.
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Drops expired counters from the in-process stores every `every` until stopped.
async fn sweep_counters(limiter: Arc<Limiter>, every: Duration, stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => limiter.sweep_expired(),
            _ = stopped(stop.clone()) => return,
        }
    }
}

/// Gives unused local budgets back to Redis and forgets cleared denials every
/// [`Limiter::HOT_KEY_SWEEP`]; once stopped, gives every budget back.
async fn sweep_hot_keys(limiter: Arc<Limiter>, stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Limiter::HOT_KEY_SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                limiter.sweep_hot_keys().await;
            }
            _ = stopped(stop.clone()) => break,
        }
    }
    limiter.release_local_budgets().await;
}

/// Reloads the policy files when they change (looked at every `every`) and at once on each
/// signal of `reload_on`, until stopped.
async fn watch_policy(
    lifecycle: Arc<Lifecycle>,
    every: Option<Duration>,
    reload_on: Option<ReloadSignal>,
    stop: watch::Receiver<bool>,
) {
    // Held by one run at a time: a run that panicked let go of it.
    let mut signal = match &reload_on {
        Some(shared) => Some(shared.clone().lock_owned().await),
        None => None,
    };
    let mut tick = tokio::time::interval(every.unwrap_or(Duration::from_secs(3600)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let reload_now = async {
            match signal.as_mut().and_then(|s| s.as_mut()) {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tick.tick() => {
                if every.is_some() {
                    // The life cycle logs a rejected candidate with every problem.
                    let _ = lifecycle.reload_if_files_changed();
                }
            }
            _ = reload_now => {
                info!("SIGHUP: reloading the policy");
                let _ = lifecycle.fleet_reload().await;
            }
            _ = stopped(stop.clone()) => return,
        }
    }
}
