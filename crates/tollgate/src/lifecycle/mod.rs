//! The policy's life cycle: validated candidates, atomic activation, versions and rollback.
//!
//! Every accepted policy becomes a [`PolicyVersion`]: a sequence number, a content hash and the
//! exact source texts. A candidate (from the config path, a push or a rollback) is parsed and
//! validated completely — including whether the store can decide each limit exactly — before
//! it replaces the running policy in one atomic swap; an invalid candidate changes nothing and
//! its errors are returned with their file, line and column. Counters are keyed by each rule's
//! descriptor path, so unchanged rules keep their counts across any change, and a rule whose
//! limit changed keeps its count against the new limit.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use tracing::{info, warn};

use crate::limiter::Limiter;
use crate::observe::prometheus::{Exposition, Kind};
use crate::policy::sources::sources_hash;
use crate::policy::{Policy, PolicyDefaults, PolicyErrors};

mod candidate;
mod diff;
mod fleet;
mod history;
mod managed;
mod manager;
#[cfg(feature = "redis")]
pub mod sync;
mod version;
mod watch;

pub use diff::diff;
pub use version::{Origin, PolicyVersion};

/// The running policy's sequence number, labelled with its hash.
pub const POLICY_VERSION: &str = "tollgate_policy_version";

/// Policy activation attempts, by result.
pub const POLICY_RELOADS: &str = "tollgate_policy_reloads_total";

/// 1 unless the last activation attempt was rejected.
pub const POLICY_LAST_RELOAD_SUCCESSFUL: &str = "tollgate_policy_last_reload_successful";

/// How many versions are kept for rollback.
pub const KEPT_VERSIONS: usize = 50;

/// Most bytes of source texts the kept versions hold by default (see
/// [`Lifecycle::with_history_max_bytes`]): 50 versions of two 16 MiB files would hold 1.6 GB.
pub const DEFAULT_HISTORY_MAX_BYTES: usize = 64 << 20;

/// Why a rollback did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RollbackError {
    /// The version asked for is not (or no longer) in the history.
    #[error("no kept version {0}")]
    NotKept(u64),
    /// No version before the running one is kept.
    #[error("no earlier version to roll back to")]
    NoEarlier,
    /// The version could not be activated again (its rules do not run on this store).
    #[error("{0}")]
    Rejected(PolicyErrors),
}

/// Why a promotion did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromoteError {
    /// No candidate shadows the running policy.
    #[error("no candidate policy to promote")]
    NoCandidate,
    /// The candidate's texts could not be activated (as when they were set, but the store
    /// or the running policy changed since).
    #[error("{0}")]
    Rejected(PolicyErrors),
}

/// What an activation did.
#[derive(Debug, Clone)]
pub enum Activation {
    /// The candidate became the running policy.
    Activated(Arc<PolicyVersion>),
    /// The candidate's texts equal the running policy's: nothing changed.
    Unchanged(Arc<PolicyVersion>),
    /// Another version became the running one after the caller chose what to activate (see
    /// [`Lifecycle::activate_over`]): nothing changed.
    Superseded(Arc<PolicyVersion>),
}

impl Activation {
    /// The version now running.
    pub fn version(&self) -> &Arc<PolicyVersion> {
        match self {
            Activation::Activated(v) | Activation::Unchanged(v) | Activation::Superseded(v) => v,
        }
    }
}

/// Results of activation attempts, for metrics.
#[derive(Debug, Default)]
struct Counts {
    activated: AtomicU64,
    unchanged: AtomicU64,
    rejected: AtomicU64,
    /// Whether the last attempt was rejected (or its files could not be read).
    last_rejected: AtomicBool,
    /// `last_rejected` when the files became unreadable, for when they can be read again.
    rejected_before_unreadable: AtomicBool,
}

impl Counts {
    /// Counts an attempt that activated or kept a policy in `counter`.
    fn succeed(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
        self.last_rejected.store(false, Ordering::Relaxed);
    }

    /// Counts a rejected attempt.
    fn reject(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        self.last_rejected.store(true, Ordering::Relaxed);
    }

    /// Counts the config files becoming unreadable as a rejected attempt.
    fn unreadable(&self) {
        let before = self.last_rejected.load(Ordering::Relaxed);
        self.rejected_before_unreadable
            .store(before, Ordering::Relaxed);
        self.reject();
    }

    /// The files can be read again: if they are unchanged, nothing else will be attempted, so
    /// the last attempt's result is again the one for them.
    fn readable_again(&self) {
        let before = self.rejected_before_unreadable.load(Ordering::Relaxed);
        self.last_rejected.store(before, Ordering::Relaxed);
    }
}

/// How the fleet's policy bears on one activation.
struct Fleet {
    /// The fleet runs other texts than the candidate's: a new version even if this replica
    /// runs the candidate's texts.
    differs: bool,
    /// The fleet runs the candidate's texts already: adopted (as shared, not published) and
    /// answered as unchanged.
    runs_them: bool,
    /// The origin the activation is recorded with.
    origin: Origin,
}

impl Fleet {
    /// For `sources` activated from `origin`, the fleet running the texts hashed `fleet`.
    fn new(fleet: Option<&str>, sources: &[(String, String)], origin: Origin) -> Self {
        let Some(fleet) = fleet else {
            return Fleet {
                differs: false,
                runs_them: false,
                origin,
            };
        };
        let runs_them = fleet == sources_hash(sources);
        Fleet {
            differs: !runs_them,
            runs_them,
            origin: if runs_them { Origin::Shared } else { origin },
        }
    }

    /// What the command answers: unchanged when the fleet already ran the texts.
    fn answer(&self, result: Result<Activation, PolicyErrors>) -> Result<Activation, PolicyErrors> {
        match result {
            Ok(Activation::Activated(v)) if self.runs_them => Ok(Activation::Unchanged(v)),
            other => other,
        }
    }
}

/// Owns the running policy's history; every change goes through here.
#[derive(Debug)]
pub struct Lifecycle {
    limiter: Arc<Limiter>,
    config: Option<PathBuf>,
    /// Locked after `current` when both are needed (activation), never before it.
    history: Mutex<Vec<Arc<PolicyVersion>>>,
    current: Mutex<Arc<PolicyVersion>>,
    counts: Counts,
    /// The hash of the config files when last read (at start, by a reload or by
    /// [`Lifecycle::reload_if_files_changed`]): files that have not changed since never undo
    /// a push or a rollback.
    files_seen: Mutex<String>,
    /// Consecutive checks of the watcher that could not read the files.
    unreadable_checks: AtomicU64,
    /// Why they could not, as last logged in this run of failed reads (a new reason is logged
    /// again: a file that went from unreadable to missing must not keep the first cause).
    unreadable_logged: Mutex<String>,
    /// Told about every version this replica activates itself (not ones it adopted), so they can
    /// be published to the other replicas.
    published: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Arc<PolicyVersion>>>>,
    /// Set when a source outside tollgate (xDS) is the only writer of the policy.
    managed: manager::Manager,
    /// What the rules of every policy compiled here get for the settings they leave out.
    defaults: PolicyDefaults,
    /// The last version a command published itself (see [`Lifecycle::fleet_activate`]): the
    /// sync need not publish it again. Without Redis nothing is published.
    #[cfg(feature = "redis")]
    published_seq: AtomicU64,
    /// Most bytes of source texts the kept versions hold (see
    /// [`Lifecycle::with_history_max_bytes`]).
    history_max_bytes: usize,
}

impl Lifecycle {
    /// Starts the history with the policy the limiter runs, compiled from `sources` (read from
    /// `config`, which later reloads read again).
    pub fn new(
        limiter: Arc<Limiter>,
        config: Option<PathBuf>,
        sources: Vec<(String, String)>,
    ) -> Self {
        let rules = limiter.policy().rules().len();
        let hash = sources_hash(&sources);
        let first = Arc::new(PolicyVersion {
            seq: 1,
            hash: hash.clone(),
            origin: Origin::File,
            accepted_at: limiter.clock().now(),
            sources,
            rules,
            restored: None,
        });
        Lifecycle {
            limiter,
            config,
            history: Mutex::new(vec![first.clone()]),
            current: Mutex::new(first),
            counts: Counts::default(),
            files_seen: Mutex::new(hash),
            unreadable_checks: AtomicU64::new(0),
            unreadable_logged: Mutex::new(String::new()),
            published: Mutex::new(None),
            managed: manager::Manager::default(),
            defaults: PolicyDefaults::default(),
            #[cfg(feature = "redis")]
            published_seq: AtomicU64::new(0),
            history_max_bytes: DEFAULT_HISTORY_MAX_BYTES,
        }
    }

    /// This life cycle keeping at most `max` bytes of source texts in its versions
    /// ([`PolicyVersion::source_bytes`]), besides at most [`KEPT_VERSIONS`] of them: past
    /// either, the oldest go first. The running version and the one a plain rollback from it
    /// goes to are never dropped, so with only those two left the history may hold more.
    pub fn with_history_max_bytes(mut self, max: usize) -> Self {
        self.history_max_bytes = max;
        self
    }

    /// This life cycle compiling every policy with `defaults` (the first one, which the limiter
    /// already runs, must have been compiled with them too).
    pub fn with_policy_defaults(mut self, defaults: PolicyDefaults) -> Self {
        self.defaults = defaults;
        self
    }

    /// A stream of the versions this replica activates on its own (file, push, rollback), for
    /// publishing to a shared store. Replaces any earlier subscriber.
    pub fn subscribe(&self) -> tokio::sync::mpsc::UnboundedReceiver<Arc<PolicyVersion>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *self.published.lock() = Some(tx);
        rx
    }

    /// The limiter whose policy this manages.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// The config path, if the policy came from one.
    pub fn config_path(&self) -> Option<&Path> {
        self.config.as_deref()
    }

    /// The running version.
    pub fn current(&self) -> Arc<PolicyVersion> {
        self.current.lock().clone()
    }

    /// Every kept version, oldest first.
    pub fn versions(&self) -> Vec<Arc<PolicyVersion>> {
        self.history.lock().clone()
    }

    /// The kept version with sequence number `seq`.
    pub fn version(&self, seq: u64) -> Option<Arc<PolicyVersion>> {
        self.history.lock().iter().find(|v| v.seq == seq).cloned()
    }

    /// Validates `sources` completely and, if valid, makes them the running policy.
    pub fn activate(
        &self,
        sources: Vec<(String, String)>,
        origin: Origin,
    ) -> Result<Activation, PolicyErrors> {
        self.activate_over(sources, origin, None)
    }

    /// [`Lifecycle::activate`], only while version `expected` (when given) is the running one:
    /// a caller that chose `sources` from what was running then (a replica adopting the shared
    /// policy) must not undo a version activated meanwhile.
    pub fn activate_over(
        &self,
        sources: Vec<(String, String)>,
        origin: Origin,
        expected: Option<u64>,
    ) -> Result<Activation, PolicyErrors> {
        self.activate_against(sources, origin, expected, None)
    }

    /// [`Lifecycle::activate_over`], deciding "unchanged" against `fleet`, the hash of the
    /// policy the fleet runs (when known): texts this replica runs but the fleet does not are
    /// a new version (to be published over the fleet's), and texts the fleet runs but this
    /// replica has not adopted yet are adopted and answered as unchanged.
    fn activate_against(
        &self,
        sources: Vec<(String, String)>,
        origin: Origin,
        expected: Option<u64>,
        fleet: Option<&str>,
    ) -> Result<Activation, PolicyErrors> {
        let fleet = Fleet::new(fleet, &sources, origin);
        let result = {
            let mut current = self.current.lock();
            if expected.is_some_and(|seq| seq != current.seq) {
                Ok(Activation::Superseded(current.clone()))
            } else {
                self.swap_in(&mut current, sources, fleet.origin, None, fleet.differs)
            }
        };
        self.settle(&result, fleet.origin);
        fleet.answer(result)
    }

    /// Counts, logs and publishes what an activation did, once `current` is unlocked.
    fn settle(&self, result: &Result<Activation, PolicyErrors>, origin: Origin) {
        match result {
            Ok(Activation::Activated(v)) => {
                self.counts.succeed(&self.counts.activated);
                info!(version = %v.label(), origin = origin.name(), rules = v.rules, "Policy activated");
                if origin != Origin::Shared
                    && let Some(tx) = self.published.lock().as_ref()
                {
                    let _ = tx.send(v.clone());
                }
                // A candidate with the texts that now run (promoted on another replica, or
                // pushed as they are) has nothing left to shadow: it would only charge its own
                // counters beside the live ones and keep the prefilter off.
                if let Some(candidate) = self.limiter.candidate().filter(|c| c.hash() == v.hash)
                    && self.limiter.clear_candidate(&candidate)
                {
                    info!(
                        candidate = candidate.hash(),
                        "The policy candidate is now the running policy; it no longer shadows"
                    );
                }
            }
            Ok(Activation::Unchanged(_) | Activation::Superseded(_)) => {
                self.counts.succeed(&self.counts.unchanged);
            }
            Err(errors) => {
                self.counts.reject();
                for e in errors.iter() {
                    warn!(problem = %e, origin = origin.name(), "Policy candidate rejected; the running policy stays");
                }
            }
        }
    }

    /// Makes `sources` the running policy unless they are its texts already; `current` is the
    /// locked running version, which every activation holds from its choice to its swap.
    fn swap_in(
        &self,
        current: &mut Arc<PolicyVersion>,
        sources: Vec<(String, String)>,
        origin: Origin,
        restored: Option<u64>,
        fleet_differs: bool,
    ) -> Result<Activation, PolicyErrors> {
        let hash = sources_hash(&sources);
        // Rolling back to the texts that run is no change either: a new version would only
        // restart the top keys and the hot-key state. Unless the fleet runs other texts: then
        // a new version of these is published over them.
        if current.hash == hash && !fleet_differs {
            return Ok(Activation::Unchanged(current.clone()));
        }
        let policy = self.compile(&sources)?;
        let mut history = self.history.lock();
        let seq = history.last().map_or(1, |v| v.seq + 1);
        let version = Arc::new(PolicyVersion {
            seq,
            hash,
            origin,
            accepted_at: self.limiter.clock().now(),
            rules: policy.rules().len(),
            sources,
            restored,
        });
        self.limiter.replace_policy(policy);
        history.push(version.clone());
        self.trim(&mut history, &version);
        *current = version.clone();
        Ok(Activation::Activated(version))
    }

    /// Compiles `sources` and checks that the store can decide every limit exactly.
    fn compile(&self, sources: &[(String, String)]) -> Result<Policy, PolicyErrors> {
        let policy = Policy::from_sources_with(sources, self.defaults)?;
        self.limiter.store().check_policy(&policy)?;
        Ok(policy)
    }

    /// Appends [`POLICY_VERSION`], [`POLICY_RELOADS`] and [`POLICY_LAST_RELOAD_SUCCESSFUL`] in
    /// Prometheus text format.
    pub fn render_metrics(&self, out: &mut String) {
        let current = self.current();
        let mut text = Exposition::new(out);
        text.family(
            POLICY_VERSION,
            "The running policy version (sequence number), labelled with its hash.",
            Kind::Gauge,
        )
        .sample(&[("hash", current.hash.as_str())], current.seq);
        let mut reloads = text.family(
            POLICY_RELOADS,
            "Policy activation attempts by result.",
            Kind::Counter,
        );
        for (result, count) in [
            ("activated", &self.counts.activated),
            ("unchanged", &self.counts.unchanged),
            ("rejected", &self.counts.rejected),
        ] {
            reloads.sample(&[("result", result)], count.load(Ordering::Relaxed));
        }
        let ok = !self.counts.last_rejected.load(Ordering::Relaxed);
        text.family(
            POLICY_LAST_RELOAD_SUCCESSFUL,
            "1 unless the last reload, push, rollback or adoption was rejected or its files could not be read (the running policy stays).",
            Kind::Gauge,
        )
        .sample(&[], u8::from(ok));
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::Timestamp;

    use super::*;

    /// One file allowing `n` per second.
    pub(super) fn policy(n: u32) -> Vec<(String, String)> {
        vec![(
            "p.yaml".to_owned(),
            format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: {n}}}\n"
            ),
        )]
    }

    /// A life cycle on the memory store, running `policy(1)` as version 1.
    pub(super) fn lifecycle() -> Arc<Lifecycle> {
        lifecycle_reading(None)
    }

    pub(super) fn lifecycle_reading(config: Option<PathBuf>) -> Arc<Lifecycle> {
        use crate::clock::ManualClock;
        use crate::store::{MemoryStore, StoreBackend};

        let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
            1_700_000_000_000_000,
        )));
        let first = Policy::from_sources(&policy(1)).unwrap();
        let limiter = Arc::new(Limiter::new(
            first,
            StoreBackend::Memory(MemoryStore::new(clock)),
        ));
        Arc::new(Lifecycle::new(limiter, config, policy(1)))
    }

    /// An activation chosen against one version (a replica adopting the shared policy) changes
    /// nothing once another runs: a push landing before it activates wins (it used to be
    /// undone). Rolling back to the running texts is no new version.
    #[test]
    fn a_rollback_changes_only_what_it_chose_from() {
        let lifecycle = lifecycle();
        lifecycle.activate(policy(2), Origin::Push).unwrap();
        assert_eq!(lifecycle.current().seq, 2);
        // Chosen against version 2, but version 3 arrived first.
        lifecycle.activate(policy(3), Origin::Push).unwrap();
        let late = lifecycle
            .activate_over(policy(1), Origin::Rollback, Some(2))
            .unwrap();
        assert!(matches!(late, Activation::Superseded(ref v) if v.seq == 3));
        assert_eq!(lifecycle.current().hash, sources_hash(&policy(3)));

        let versions = lifecycle.versions().len();
        let to_running = lifecycle.rollback(Some(3)).unwrap();
        assert!(matches!(to_running, Activation::Unchanged(ref v) if v.seq == 3));
        assert_eq!(lifecycle.versions().len(), versions, "no new version");
        let back = lifecycle.rollback(None).unwrap();
        assert!(matches!(back, Activation::Activated(ref v) if v.hash == sources_hash(&policy(2))));
    }
}
