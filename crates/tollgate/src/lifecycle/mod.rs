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
use tracing::{debug, info, warn};

use crate::limiter::Limiter;
use crate::observe::prometheus::{Exposition, Kind};
use crate::policy::sources::sources_hash;
use crate::policy::{Policy, PolicyDefaults, PolicyErrors};

mod diff;
mod fleet;
mod managed;
mod manager;
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
    /// sync need not publish it again.
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

    /// Drops the oldest versions of `history` while it holds more than [`KEPT_VERSIONS`] or
    /// more than `history_max_bytes` of source texts, except `running` and the version a plain
    /// rollback from it goes to: a rollback right after any change still works.
    fn trim(&self, history: &mut Vec<Arc<PolicyVersion>>, running: &PolicyVersion) {
        // Dropping other versions never changes which one that is.
        let target = rollback_target(history, running).map(|v| v.seq);
        let mut bytes = history
            .iter()
            .map(|v| v.source_bytes())
            .fold(0, usize::saturating_add);
        let mut dropped = 0usize;
        while history.len() > KEPT_VERSIONS || bytes > self.history_max_bytes {
            let Some(oldest) = history
                .iter()
                .position(|v| v.seq != running.seq && Some(v.seq) != target)
            else {
                warn!(
                    bytes,
                    most = self.history_max_bytes,
                    "The running policy version and its rollback target alone hold more than --policy-history-max-bytes; both are kept"
                );
                break;
            };
            bytes = bytes.saturating_sub(history[oldest].source_bytes());
            history.remove(oldest);
            dropped += 1;
        }
        if dropped > 0 {
            debug!(
                dropped,
                kept = history.len(),
                bytes,
                "Oldest policy versions dropped from the history"
            );
        }
    }

    /// Compiles `sources` and checks that the store can decide every limit exactly.
    fn compile(&self, sources: &[(String, String)]) -> Result<Policy, PolicyErrors> {
        let policy = Policy::from_sources_with(sources, self.defaults)?;
        self.limiter.store().check_policy(&policy)?;
        Ok(policy)
    }

    /// Returns to version `to`, or to the one before the running one: for a version a rollback
    /// made, the one before the version it restored, so plain rollbacks step back one version
    /// each.
    pub fn rollback(&self, to: Option<u64>) -> Result<Activation, RollbackError> {
        self.rollback_against(to, None)
    }

    /// [`Lifecycle::rollback`], deciding "unchanged" against `fleet` as
    /// [`Lifecycle::activate_against`] does.
    fn rollback_against(
        &self,
        to: Option<u64>,
        fleet: Option<&str>,
    ) -> Result<Activation, RollbackError> {
        // Chosen and activated under `current`'s lock, which every activation holds from its
        // choice to its swap: two rollbacks at once end where two in a row do (each chose
        // against the same running version, and the second undid the first or failed), and no
        // push lands between a rollback's choice and its activation.
        let result = {
            let mut current = self.current.lock();
            let target = {
                let history = self.history.lock();
                match to {
                    Some(seq) => history.iter().find(|v| v.seq == seq).cloned(),
                    None => rollback_target(&history, &current).cloned(),
                }
            };
            let target = target.ok_or(match to {
                Some(seq) => RollbackError::NotKept(seq),
                None => RollbackError::NoEarlier,
            })?;
            let fleet = Fleet::new(fleet, &target.sources, Origin::Rollback);
            let swapped = self.swap_in(
                &mut current,
                target.sources.clone(),
                fleet.origin,
                Some(target.seq),
                fleet.differs,
            );
            (swapped, fleet)
        };
        let (result, fleet) = result;
        self.settle(&result, fleet.origin);
        fleet.answer(result).map_err(RollbackError::Rejected)
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

/// The version of `history` a plain rollback from `running` goes to: the newest before the
/// running one or, when a rollback made the running one, before the version it restored.
fn rollback_target<'h>(
    history: &'h [Arc<PolicyVersion>],
    running: &PolicyVersion,
) -> Option<&'h Arc<PolicyVersion>> {
    let back_from = running.restored.unwrap_or(running.seq);
    history.iter().rev().find(|v| v.seq < back_from)
}

// Shadow candidates: a policy decided beside the running one on real traffic, never enforced,
// until it is promoted or dropped (see [`crate::limiter::Candidate`]).
impl Lifecycle {
    /// Validates `sources` exactly as [`Lifecycle::activate`] does (including whether the store
    /// can decide each limit) and, if valid, makes them the shadow candidate. Setting the texts
    /// already shadowing keeps that candidate and its counts; other texts replace it. An invalid
    /// candidate changes nothing.
    pub fn set_candidate(
        &self,
        sources: Vec<(String, String)>,
    ) -> Result<Arc<crate::limiter::Candidate>, PolicyErrors> {
        let hash = sources_hash(&sources);
        if let Some(same) = self.limiter.candidate().filter(|c| c.hash() == hash) {
            return Ok(same);
        }
        let compiled = self.compile(&sources);
        let policy = match compiled {
            Ok(policy) => policy,
            Err(errors) => {
                for e in errors.iter() {
                    warn!(problem = %e, "Policy candidate rejected; the shadow candidate stays");
                }
                return Err(errors);
            }
        };
        let rules = policy.rules().len();
        let candidate = Arc::new(crate::limiter::Candidate::new(
            policy,
            sources,
            self.limiter.clock().now(),
        ));
        let replaced = self.limiter.set_candidate(Some(candidate.clone()));
        info!(
            candidate = %hash,
            rules,
            replaced = replaced.as_ref().map_or("none", |c| c.hash()),
            "Policy candidate shadowing"
        );
        Ok(candidate)
    }

    /// Activates the shadow candidate's texts (as a push) and clears it.
    pub fn promote(&self) -> Result<Activation, PromoteError> {
        self.promote_against(None)
    }

    /// [`Lifecycle::promote`], deciding "unchanged" against `fleet` as
    /// [`Lifecycle::activate_against`] does.
    fn promote_against(&self, fleet: Option<&str>) -> Result<Activation, PromoteError> {
        let candidate = self.limiter.candidate().ok_or(PromoteError::NoCandidate)?;
        let activation = self
            .activate_against(candidate.sources().to_vec(), Origin::Push, None, fleet)
            .map_err(PromoteError::Rejected)?;
        // A candidate set meanwhile is a different one: it keeps shadowing.
        self.limiter.clear_candidate(&candidate);
        info!(
            candidate = candidate.hash(),
            version = %activation.version().label(),
            "Policy candidate promoted"
        );
        Ok(activation)
    }

    /// Stops shadowing; returns the candidate dropped, if there was one.
    pub fn drop_candidate(&self) -> Option<Arc<crate::limiter::Candidate>> {
        let dropped = self.limiter.set_candidate(None);
        if let Some(c) = &dropped {
            info!(candidate = c.hash(), "Policy candidate dropped");
        }
        dropped
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
    fn lifecycle() -> Arc<Lifecycle> {
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

    /// Plain rollbacks step back one version each, whether made one after the other or all at
    /// once: each used to choose the version before the running one, so a second undid the
    /// first, and rollbacks made at once chose the same version (the later ones then failed).
    #[test]
    fn plain_rollbacks_step_back_one_version_each() {
        let lifecycle = lifecycle();
        for n in 2..=7 {
            lifecycle.activate(policy(n), Origin::Push).unwrap();
        }
        let running = |lifecycle: &Lifecycle| lifecycle.current().hash.clone();
        lifecycle.rollback(None).unwrap();
        lifecycle.rollback(None).unwrap();
        assert_eq!(
            running(&lifecycle),
            sources_hash(&policy(5)),
            "two in a row"
        );

        let barrier = Arc::new(std::sync::Barrier::new(3));
        let rollbacks: Vec<_> = (0..3)
            .map(|_| {
                let (lifecycle, barrier) = (lifecycle.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    lifecycle.rollback(None)
                })
            })
            .collect();
        for rollback in rollbacks {
            let done = rollback.join().unwrap();
            assert!(matches!(done, Ok(Activation::Activated(_))), "{done:?}");
        }
        assert_eq!(
            running(&lifecycle),
            sources_hash(&policy(2)),
            "three at once"
        );
        lifecycle.rollback(None).unwrap();
        assert_eq!(running(&lifecycle), sources_hash(&policy(1)));
        assert_eq!(
            lifecycle.rollback(None).unwrap_err(),
            RollbackError::NoEarlier
        );

        // A version reached `--to` steps back from there; a push is stepped back from itself.
        lifecycle.rollback(Some(4)).unwrap();
        lifecycle.rollback(None).unwrap();
        assert_eq!(running(&lifecycle), sources_hash(&policy(3)));
        lifecycle.activate(policy(9), Origin::Push).unwrap();
        lifecycle.rollback(None).unwrap();
        assert_eq!(running(&lifecycle), sources_hash(&policy(3)));
    }

    /// A candidate whose texts become the running policy (promoted on another replica and
    /// adopted from Redis here) stops shadowing; another candidate keeps shadowing.
    #[test]
    fn a_candidate_that_becomes_the_policy_stops_shadowing() {
        let lifecycle = lifecycle();
        lifecycle.set_candidate(policy(3)).unwrap();
        lifecycle.activate(policy(2), Origin::Shared).unwrap();
        assert!(lifecycle.limiter().candidate().is_some(), "another policy");
        lifecycle.activate(policy(3), Origin::Shared).unwrap();
        assert!(lifecycle.limiter().candidate().is_none());
    }

    /// `policy(n)` padded with a comment to `SIZED` bytes of name and text.
    fn sized(n: u32) -> Vec<(String, String)> {
        let mut sources = policy(n);
        let (name, text) = &mut sources[0];
        let pad = SIZED - name.len() - text.len() - 2;
        text.push_str(&format!("#{}\n", "x".repeat(pad)));
        sources
    }

    const SIZED: usize = 1_000;

    /// The sequence numbers kept, oldest first.
    fn kept(lifecycle: &Lifecycle) -> Vec<u64> {
        lifecycle.versions().iter().map(|v| v.seq).collect()
    }

    /// A life cycle keeping `versions` of [`sized`] policies' bytes, running `sized(1)`.
    fn keeping(versions: usize) -> Lifecycle {
        let limiter = lifecycle().limiter().clone();
        limiter.replace_policy(Policy::from_sources(&sized(1)).unwrap());
        Lifecycle::new(limiter, None, sized(1)).with_history_max_bytes(versions * SIZED + SIZED / 2)
    }

    /// Past its bytes the history drops its oldest versions first (it used to keep 50 of any
    /// size: 1.6 GB of two 16 MiB files), but never the running version nor the one a plain
    /// rollback goes to, so a rollback still works after versions were dropped.
    #[test]
    fn a_history_past_its_bytes_drops_the_oldest_first_but_keeps_the_rollback_target() {
        assert_eq!(sized(7)[0].0.len() + sized(7)[0].1.len(), SIZED);
        let lifecycle = keeping(3);
        for n in 2..=4 {
            lifecycle.activate(sized(n), Origin::Push).unwrap();
        }
        assert_eq!(kept(&lifecycle), [2, 3, 4], "the oldest went first");
        let bytes: usize = lifecycle.versions().iter().map(|v| v.source_bytes()).sum();
        assert_eq!(bytes, 3 * SIZED);

        // Back to 3: a plain rollback from there goes to 2, the oldest, which must stay.
        lifecycle.rollback(Some(3)).unwrap();
        assert_eq!(kept(&lifecycle), [2, 4, 5], "3 went instead of 2");
        let back = lifecycle.rollback(None).unwrap();
        assert!(matches!(back, Activation::Activated(ref v) if v.hash == sources_hash(&sized(2))));
        assert_eq!(kept(&lifecycle), [4, 5, 6]);
        assert_eq!(
            lifecycle.rollback(None).unwrap_err(),
            RollbackError::NoEarlier,
            "nothing before 2 is kept"
        );
        assert_eq!(
            lifecycle.rollback(Some(1)).unwrap_err(),
            RollbackError::NotKept(1)
        );
        lifecycle.rollback(Some(4)).unwrap();
        assert_eq!(lifecycle.current().hash, sources_hash(&sized(4)));
    }

    /// Versions larger than the bound on their own: the running one and its rollback target
    /// are kept anyway, and the rollback works.
    #[test]
    fn the_running_version_and_its_rollback_target_outlast_the_bound() {
        let lifecycle = keeping(0);
        lifecycle.activate(sized(2), Origin::Push).unwrap();
        assert_eq!(kept(&lifecycle), [1, 2]);
        lifecycle.activate(sized(3), Origin::Push).unwrap();
        assert_eq!(kept(&lifecycle), [2, 3]);
        lifecycle.rollback(None).unwrap();
        assert_eq!(lifecycle.current().hash, sources_hash(&sized(2)));
        assert_eq!(
            kept(&lifecycle),
            [4],
            "4 restored 2, and nothing before 2 is kept"
        );
        assert_eq!(
            lifecycle.rollback(None).unwrap_err(),
            RollbackError::NoEarlier
        );
    }

    /// Within the bytes, the count still bounds the history.
    #[test]
    fn the_history_keeps_at_most_its_count_of_versions() {
        let lifecycle = lifecycle();
        for n in 2..=60 {
            lifecycle.activate(policy(n), Origin::Push).unwrap();
        }
        assert_eq!(kept(&lifecycle), (11..=60).collect::<Vec<_>>());
    }

    /// An activation takes `current` then `history`; a rollback used to take them the other
    /// way round, and the two racing could deadlock.
    #[test]
    fn rollbacks_racing_activations_finish() {
        let lifecycle = lifecycle();
        let (done, finished) = std::sync::mpsc::channel();
        let pusher = {
            let (lifecycle, done) = (lifecycle.clone(), done.clone());
            std::thread::spawn(move || {
                for n in 0..2000 {
                    lifecycle
                        .activate(policy(2 + n % 50), Origin::Push)
                        .unwrap();
                }
                done.send(()).unwrap();
            })
        };
        let roller = std::thread::spawn(move || {
            for _ in 0..2000 {
                let _ = lifecycle.rollback(None);
            }
            done.send(()).unwrap();
        });
        for _ in 0..2 {
            finished
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("an activation and a rollback deadlocked");
        }
        pusher.join().unwrap();
        roller.join().unwrap();
    }
}
