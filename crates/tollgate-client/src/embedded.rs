//! The in-process limiter: the service's [`Limiter`] in the caller's process.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tollgate::limiter::headers::rate_limit_headers;
use tollgate::limiter::{CheckRequest, CheckResponse, FailureSettings, LimitError, Limiter};
use tollgate::policy::{Policy, PolicyErrors};
use tollgate::service::{BuildError, Service, Upkeep};
use tollgate::store::{RedisOptions, StoreError, StoreUrl};

use crate::backend::{Backend, BackendError, Outcome, Verdict};

/// How often an embedded limiter on Redis looks at the fleet's shared policy and overrides by
/// default: `tollgate serve`'s `--policy-sync-interval` default.
pub const DEFAULT_POLICY_SYNC: Duration = Duration::from_millis(500);

/// How [`Embedded::open`] reaches its store and what it answers when the store fails.
#[derive(Debug, Clone)]
pub struct Options {
    /// Redis connection, deadline and breaker settings (ignored by the memory store).
    pub redis: RedisOptions,
    /// Failure posture of limits that do not set `on_store_error`.
    pub failure: FailureSettings,
    /// On Redis, how often the limiter follows the fleet: it adopts the policy the
    /// `tollgate serve` replicas on the same Redis share (pushes, rollbacks, reloads) and
    /// their runtime overrides, and notices Redis losing its data, as a replica does; it
    /// never publishes its own policy. `None` runs no sync: the limiter keeps its own policy
    /// and no overrides. [`DEFAULT_POLICY_SYNC`] by default; ignored by the memory store.
    pub policy_sync: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            redis: RedisOptions::default(),
            failure: FailureSettings::default(),
            policy_sync: Some(DEFAULT_POLICY_SYNC),
        }
    }
}

impl Options {
    /// These options, following the fleet every `every` (`None`: not at all); see
    /// [`Options::policy_sync`].
    pub fn policy_sync(mut self, every: Option<Duration>) -> Self {
        self.policy_sync = every;
        self
    }
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
    /// Rules that this store cannot decide exactly; each problem names the rule and where it
    /// is defined.
    #[error("{problems}")]
    Unsupported {
        /// The store's kind: `redis` (the memory store decides every rule exactly).
        store: &'static str,
        /// Every rule it cannot decide, with its location.
        problems: PolicyErrors,
    },
}

/// A [`Limiter`] running in this process, over the memory store or a Redis shared with
/// tollgate services (the same scripts and keys, so they share one quota).
#[derive(Debug, Clone)]
pub struct Embedded {
    limiter: Arc<Limiter>,
    /// Dropped with the last handle, which ends the upkeep (see [`Embedded::with_policy`]).
    _upkeep: Option<Arc<watch::Sender<bool>>>,
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
        let service = Service::builder(policy, store_url.clone())
            .redis(options.redis)
            .failure(options.failure)
            .build()
            .await
            .map_err(|e| match e {
                BuildError::Store { source, .. } => OpenError::Store(source),
                BuildError::Unsupported { store, problems } => {
                    OpenError::Unsupported { store, problems }
                }
            })?;
        // `tollgate serve`'s sweeps, supervised as its are, for as long as a handle lives:
        // dropping the last one drops the sender, which ends them.
        // On Redis, the policy sync too: it follows the fleet and publishes no policy.
        let (stop, stopped) = watch::channel(false);
        let upkeep = Upkeep {
            sync_every: options.policy_sync,
            sync_follows: true,
            ..Upkeep::default()
        };
        for duty in service.duties(&upkeep, &stopped) {
            let wanted = stopped.clone();
            let wanted = move || wanted.has_changed().is_ok() && !*wanted.borrow();
            tollgate::background::supervise(duty.name, wanted, duty.run);
        }
        Ok(Embedded {
            limiter: service.limiter().clone(),
            _upkeep: Some(Arc::new(stop)),
        })
    }

    /// Wraps a limiter built elsewhere.
    pub fn from_limiter(limiter: Arc<Limiter>) -> Self {
        Embedded {
            limiter,
            _upkeep: None,
        }
    }

    /// The limiter itself, for decisions with the full [`CheckResponse`].
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
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
