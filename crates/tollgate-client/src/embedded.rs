//! The in-process limiter: the service's [`Limiter`] in the caller's process.

use std::path::Path;
use std::sync::{Arc, Weak};

use tollgate::clock::SystemClock;
use tollgate::limiter::headers::rate_limit_headers;
use tollgate::limiter::{CheckRequest, CheckResponse, FailureSettings, LimitError, Limiter};
use tollgate::policy::{Policy, PolicyErrors};
use tollgate::store::{RedisOptions, StoreBackend, StoreError, StoreUrl};

use crate::backend::{Backend, BackendError, Outcome, Verdict};

/// How [`Embedded::open`] reaches its store and what it answers when the store fails.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Redis connection, deadline and breaker settings (ignored by the memory store).
    pub redis: RedisOptions,
    /// Failure posture of limits that do not set `on_store_error`.
    pub failure: FailureSettings,
}

/// Why [`Embedded::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The policy is invalid; every problem is listed with its location.
    #[error("invalid policy: {0}")]
    Policy(#[from] PolicyErrors),
    /// The store could not be opened.
    #[error("cannot open the store: {0}")]
    Store(#[from] StoreError),
    /// A rule that this store cannot decide exactly.
    #[error("{0}")]
    Unsupported(String),
}

/// A [`Limiter`] running in this process, over the memory store or a Redis shared with
/// tollgate services (the same scripts and keys, so they share one quota).
#[derive(Debug, Clone)]
pub struct Embedded {
    limiter: Arc<Limiter>,
}

impl Embedded {
    /// Loads the policy at `policy_path` (a file or a directory of `*.yaml`) and opens the
    /// store at `store_url`.
    pub async fn open(
        policy_path: impl AsRef<Path>,
        store_url: &StoreUrl,
        options: Options,
    ) -> Result<Self, OpenError> {
        let policy = Policy::load(policy_path.as_ref())?;
        Self::with_policy(policy, store_url, options).await
    }

    /// Like [`Embedded::open`] with a policy already compiled.
    pub async fn with_policy(
        policy: Policy,
        store_url: &StoreUrl,
        options: Options,
    ) -> Result<Self, OpenError> {
        let clock = Arc::new(SystemClock::new());
        let store = StoreBackend::open(store_url, options.redis, clock.clone()).await?;
        store
            .check_policy(&policy)
            .map_err(|problems| OpenError::Unsupported(problems.to_string()))?;
        let limiter = Arc::new(Limiter::with_failure_settings(
            policy,
            store,
            options.failure,
            clock,
        ));
        let kept = Arc::downgrade(&limiter);
        let alive = kept.clone();
        tollgate::background::supervise(
            "embedded_upkeep",
            move || alive.strong_count() > 0,
            move || maintain(kept.clone()),
        );
        Ok(Self::from_limiter(limiter))
    }

    /// Wraps a limiter built elsewhere.
    pub fn from_limiter(limiter: Arc<Limiter>) -> Self {
        Embedded { limiter }
    }

    /// The limiter itself, for decisions with the full [`CheckResponse`].
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }
}

/// What `tollgate serve`'s sweeps do, for as long as the limiter lives: drops expired
/// counters from the memory stores every second, and gives unused local budgets back to Redis
/// (and forgets cleared denials) every 50 ms. Supervised: a panic is logged and counted, and
/// the task started again (see [`tollgate::background`]).
async fn maintain(limiter: Weak<Limiter>) {
    // Counters every second: every 20th hot-key sweep.
    const COUNTERS_EVERY: u32 = 20;
    let mut tick = tokio::time::interval(Limiter::HOT_KEY_SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u32 = 0;
    loop {
        tick.tick().await;
        let Some(limiter) = limiter.upgrade() else {
            return;
        };
        limiter.sweep_hot_keys().await;
        n = n.wrapping_add(1);
        if n.is_multiple_of(COUNTERS_EVERY) {
            limiter.sweep_expired();
        }
    }
}

/// The verdict for a limiter's response, with the same headers as the HTTP API.
pub fn verdict(response: &CheckResponse) -> Verdict {
    let outcome = if response.allowed() {
        Outcome::Allowed
    } else if response.unavailable() {
        Outcome::Unavailable
    } else {
        Outcome::Limited
    };
    let limit_name = response
        .binding()
        .and_then(|s| s.limit.as_ref())
        .map(|l| l.name().to_owned());
    Verdict {
        outcome,
        headers: rate_limit_headers(response),
        limit_name,
    }
}

impl Backend for Embedded {
    async fn check(&self, request: &CheckRequest) -> Result<Verdict, BackendError> {
        match self.limiter.check(request).await {
            Ok(response) => Ok(verdict(&response)),
            Err(LimitError::Invalid(why)) => Err(BackendError::Invalid(why.to_string())),
        }
    }
}
