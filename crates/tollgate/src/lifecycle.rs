//! The policy's life cycle: validated candidates, atomic activation, versions and rollback.
//!
//! Every accepted policy becomes a [`PolicyVersion`]: a sequence number, a content hash and the
//! exact source texts. A candidate (from the config path, a push or a rollback) is parsed and
//! validated completely — including whether the store can decide each limit exactly — before
//! it replaces the running policy in one atomic swap; an invalid candidate changes nothing and
//! its errors are returned with their file, line and column. Counters are keyed by each rule's
//! descriptor path, so unchanged rules keep their counts across any change, and a rule whose
//! limit changed keeps its count against the new limit.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use tollgate_core::Timestamp;
use tracing::{info, warn};

use crate::limiter::Limiter;
use crate::observe::prometheus::{Exposition, Kind};
use crate::policy::sources::{read_settled, relative_names, settled, sources_hash};
use crate::policy::{Policy, PolicyErrors};

/// The running policy's sequence number, labelled with its hash.
pub const POLICY_VERSION: &str = "tollgate_policy_version";

/// Policy activation attempts, by result.
pub const POLICY_RELOADS: &str = "tollgate_policy_reloads_total";

/// 1 unless the last activation attempt was rejected.
pub const POLICY_LAST_RELOAD_SUCCESSFUL: &str = "tollgate_policy_last_reload_successful";

/// How many versions are kept for rollback.
pub const KEPT_VERSIONS: usize = 50;

/// Where a version came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Read from the config path (startup, file change, SIGHUP, reload request).
    File,
    /// Pushed through the admin API (`tollgate policy push`).
    Push,
    /// A rollback to an earlier version's texts.
    Rollback,
    /// Adopted from the version another replica published to the shared store.
    Shared,
}

impl Origin {
    /// Name for the API and logs.
    pub fn name(self) -> &'static str {
        match self {
            Origin::File => "file",
            Origin::Push => "push",
            Origin::Rollback => "rollback",
            Origin::Shared => "shared",
        }
    }
}

/// One accepted policy.
#[derive(Debug)]
pub struct PolicyVersion {
    /// 1, 2, 3... in order of acceptance.
    pub seq: u64,
    /// 16 hex digits of the sources' FNV-1a hash: equal texts give equal hashes.
    pub hash: String,
    /// Where it came from.
    pub origin: Origin,
    /// When it was accepted.
    pub accepted_at: Timestamp,
    /// The `(file name, text)` pairs it was compiled from.
    pub sources: Vec<(String, String)>,
    /// Its rules, for listings.
    pub rules: usize,
    /// For a version a rollback made, the version whose texts it restored: a plain rollback
    /// from it steps back from there, so two in a row go back two versions instead of the
    /// second undoing the first.
    pub restored: Option<u64>,
}

impl PolicyVersion {
    /// `seq-hash`, how versions are shown.
    pub fn label(&self) -> String {
        format!("{}-{}", self.seq, self.hash)
    }
}

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
    Rejected(String),
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
        }
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
        let result = {
            let mut current = self.current.lock();
            if expected.is_some_and(|seq| seq != current.seq) {
                Ok(Activation::Superseded(current.clone()))
            } else {
                self.swap_in(&mut current, sources, origin, None)
            }
        };
        self.settle(&result, origin);
        result
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
    ) -> Result<Activation, PolicyErrors> {
        let hash = sources_hash(&sources);
        // Rolling back to the texts that run is no change either: a new version would only
        // restart the top keys and the hot-key state.
        if current.hash == hash {
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
        if history.len() > KEPT_VERSIONS {
            history.remove(0);
        }
        *current = version.clone();
        Ok(Activation::Activated(version))
    }

    /// Compiles `sources` and checks that the store can decide every limit exactly.
    fn compile(&self, sources: &[(String, String)]) -> Result<Policy, PolicyErrors> {
        let policy = Policy::from_sources(sources)?;
        self.limiter.store().check_policy(&policy)?;
        Ok(policy)
    }

    /// The content hash of the policy files as last read (at start, or by a reload or the file
    /// watcher), whatever version runs.
    pub fn files_hash(&self) -> String {
        self.files_seen.lock().clone()
    }

    /// Re-reads the config path and activates it if it changed.
    pub fn reload(&self) -> Result<Activation, PolicyErrors> {
        let Some(path) = &self.config else {
            return Ok(Activation::Unchanged(self.current()));
        };
        match read_settled(path) {
            Ok(sources) => {
                *self.files_seen.lock() = sources_hash(&sources);
                self.activate(sources, Origin::File)
            }
            Err(errors) => {
                self.counts.reject();
                for e in errors.iter() {
                    warn!(problem = %e, "Cannot read the policy files; the running policy stays");
                }
                Err(errors)
            }
        }
    }

    /// Re-reads the config path and activates it only if the files changed since they were
    /// last read, so that unchanged files never undo a push or a rollback (the file watcher).
    /// `None` when nothing changed, or when the files cannot be read right now (a file
    /// briefly missing mid-swap): the next call tries again.
    pub fn reload_if_files_changed(&self) -> Option<Result<Activation, PolicyErrors>> {
        let path = self.config.as_ref()?;
        // Read once; only files that changed are read a second time to confirm them.
        let read = Policy::read_sources(path).and_then(|first| {
            if sources_hash(&first) == *self.files_seen.lock() {
                return Ok(None);
            }
            settled(path, first).map(Some)
        });
        let sources = match read {
            Ok(read) => {
                if self.unreadable_checks.swap(0, Ordering::Relaxed) >= 2 {
                    self.counts.readable_again();
                }
                self.unreadable_logged.lock().clear();
                read?
            }
            Err(errors) => {
                // Once is a swap in progress; twice in a row is a problem worth a line (and
                // another when the reason changes), and a rejection in the metrics (once per
                // run of failed reads).
                let checks = self.unreadable_checks.fetch_add(1, Ordering::Relaxed);
                if checks == 1 {
                    self.counts.unreadable();
                }
                let reason = errors.to_string();
                let mut logged = self.unreadable_logged.lock();
                if checks >= 1 && *logged != reason {
                    for e in errors.iter() {
                        warn!(problem = %e, "Cannot read the policy files; the running policy stays");
                    }
                    *logged = reason;
                }
                return None;
            }
        };
        let hash = sources_hash(&sources);
        {
            let mut seen = self.files_seen.lock();
            if *seen == hash {
                return None;
            }
            *seen = hash;
        }
        info!(path = %path.display(), "Policy files changed; reloading");
        Some(self.activate(sources, Origin::File))
    }

    /// Returns to version `to`, or to the one before the running one: for a version a rollback
    /// made, the one before the version it restored, so plain rollbacks step back one version
    /// each.
    pub fn rollback(&self, to: Option<u64>) -> Result<Activation, RollbackError> {
        // Chosen and activated under `current`'s lock, which every activation holds from its
        // choice to its swap: two rollbacks at once end where two in a row do (each chose
        // against the same running version, and the second undid the first or failed), and no
        // push lands between a rollback's choice and its activation.
        let result = {
            let mut current = self.current.lock();
            let target = {
                let history = self.history.lock();
                let back_from = current.restored.unwrap_or(current.seq);
                match to {
                    Some(seq) => history.iter().find(|v| v.seq == seq).cloned(),
                    None => history.iter().rev().find(|v| v.seq < back_from).cloned(),
                }
            };
            let target = target.ok_or(match to {
                Some(seq) => RollbackError::NotKept(seq),
                None => RollbackError::NoEarlier,
            })?;
            self.swap_in(
                &mut current,
                target.sources.clone(),
                Origin::Rollback,
                Some(target.seq),
            )
        };
        self.settle(&result, Origin::Rollback);
        result.map_err(|e| RollbackError::Rejected(e.to_string()))
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

/// A line diff of two versions' sources, file by file (`-` removed, `+` added, ` ` kept).
/// Files are paired by their names relative to each version's shared directory; two versions
/// of one file each are compared whatever their names (a push of `new.yaml` over a server
/// started on `policy.yaml`).
pub fn diff(from: &PolicyVersion, to: &PolicyVersion) -> String {
    let mut out = format!("--- version {}\n+++ version {}\n", from.label(), to.label());
    let (old, new) = (named_texts(from), named_texts(to));
    let pairs: Vec<(String, &str, &str)> = match (old.as_slice(), new.as_slice()) {
        ([(a_name, a)], [(b_name, b)]) if a_name != b_name => {
            vec![(format!("{a_name} -> {b_name}"), *a, *b)]
        }
        _ => {
            let mut names: Vec<&str> = old.iter().chain(&new).map(|(n, _)| *n).collect();
            names.sort_unstable();
            names.dedup();
            fn text<'a>(files: &[(&str, &'a str)], name: &str) -> &'a str {
                files
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or("", |(_, t)| *t)
            }
            names
                .into_iter()
                .map(|name| (name.to_owned(), text(&old, name), text(&new, name)))
                .collect()
        }
    };
    for (label, a, b) in pairs {
        if a == b {
            continue;
        }
        let _ = writeln!(out, "@@ {label}");
        let lines = line_diff(a, b);
        if lines.iter().all(|l| l.starts_with(' ')) {
            out.push_str("  (the texts differ only in line endings or the final newline)\n");
            continue;
        }
        for line in around_changes(&lines) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A version's texts by their [`relative_names`].
fn named_texts(version: &PolicyVersion) -> Vec<(&str, &str)> {
    relative_names(&version.sources)
        .into_iter()
        .zip(&version.sources)
        .map(|(name, (_, text))| (name, text.as_str()))
        .collect()
}

/// Unchanged lines kept around each change in [`diff`]; longer runs show as ` ...`.
const DIFF_CONTEXT: usize = 2;

/// The lines of a line diff within [`DIFF_CONTEXT`] of a change, a run of others as one ` ...`.
fn around_changes(lines: &[String]) -> Vec<&str> {
    let mut near = vec![false; lines.len()];
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with(' ') {
            let around = i.saturating_sub(DIFF_CONTEXT)..(i + DIFF_CONTEXT + 1).min(lines.len());
            near[around].fill(true);
        }
    }
    let mut out = Vec::new();
    for (line, near) in lines.iter().zip(near) {
        if near {
            out.push(line.as_str());
        } else if out.last() != Some(&" ...") {
            out.push(" ...");
        }
    }
    out
}

/// Changed lines past which [`line_diff`] stops looking for the shortest diff (its memory grows
/// with their square: about 8 MB here) and shows the rest as all removed, then all added.
const MAX_DIFF_EDITS: usize = 1000;

/// A line diff (` ` kept, `-` removed, `+` added): the common first and last lines, then the
/// shortest edit of the lines between (Myers' algorithm, in time and memory that grow with the
/// lines times the changes, not with the lines squared: a policy of a hundred thousand lines with
/// a few changes diffs at once, within a few MB).
fn line_diff(a: &str, b: &str) -> Vec<String> {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let tail = a[head..]
        .iter()
        .rev()
        .zip(b[head..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (middle_a, middle_b) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    let mut out: Vec<String> = a[..head].iter().map(|l| format!(" {l}")).collect();
    match shortest_edit(middle_a, middle_b) {
        Some(edit) => out.extend(edit),
        None => {
            out.extend(middle_a.iter().map(|l| format!("-{l}")));
            out.extend(middle_b.iter().map(|l| format!("+{l}")));
        }
    }
    out.extend(a[a.len() - tail..].iter().map(|l| format!(" {l}")));
    out
}

/// The shortest edit turning `a` into `b` (Myers, "An O(ND) difference algorithm"), or `None`
/// past [`MAX_DIFF_EDITS`] changed lines.
fn shortest_edit(a: &[&str], b: &[&str]) -> Option<Vec<String>> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    // `v[k + offset]`: how far along `a` the furthest path on diagonal `k` (x - y) reaches.
    let offset = n + m + 1;
    let mut v = vec![0isize; (2 * offset + 1) as usize];
    // Each step's `v` over the diagonals it can read, -(d + 1)..=d + 1, for the way back.
    let mut trace: Vec<Vec<isize>> = Vec::new();
    let at = |k: isize| (k + offset) as usize;
    let mut found = false;
    for d in 0..=(n + m).min(MAX_DIFF_EDITS as isize) {
        trace.push(v[at(-d - 1)..=at(d + 1)].to_vec());
        for k in (-d..=d).step_by(2) {
            let mut x = if k == -d || (k != d && v[at(k - 1)] < v[at(k + 1)]) {
                v[at(k + 1)]
            } else {
                v[at(k - 1)] + 1
            };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[at(k)] = x;
            if x >= n && y >= m {
                found = true;
                break;
            }
        }
        if found {
            break;
        }
    }
    if !found {
        return None;
    }
    // Back from the end, step by step: each step is one removal or addition after a run of
    // kept lines.
    let mut edit = Vec::new();
    let (mut x, mut y) = (n, m);
    for (d, before) in trace.iter().enumerate().rev() {
        let d = d as isize;
        let read = |k: isize| before[(k + d + 1) as usize];
        let k = x - y;
        let from_k = if k == -d || (k != d && read(k - 1) < read(k + 1)) {
            k + 1
        } else {
            k - 1
        };
        let from_x = read(from_k);
        let from_y = from_x - from_k;
        while x > from_x && y > from_y {
            edit.push(format!(" {}", a[x as usize - 1]));
            x -= 1;
            y -= 1;
        }
        if d > 0 {
            if x == from_x {
                edit.push(format!("+{}", b[y as usize - 1]));
            } else {
                edit.push(format!("-{}", a[x as usize - 1]));
            }
        }
        (x, y) = (from_x, from_y);
    }
    edit.reverse();
    Some(edit)
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
    pub fn promote(&self) -> Result<Activation, String> {
        let candidate = self
            .limiter
            .candidate()
            .ok_or_else(|| "no candidate policy to promote".to_owned())?;
        let activation = self
            .activate(candidate.sources().to_vec(), Origin::Push)
            .map_err(|e| e.to_string())?;
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
    use super::*;

    fn named(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect()
    }

    #[test]
    fn the_same_texts_under_differently_spelt_paths_are_the_same_policy() {
        let text = "domain: d\ndescriptors: []\n";
        let file = named(&[("/etc/tollgate/api.yaml", text)]);
        let pushed = named(&[("api.yaml", text)]);
        assert_eq!(sources_hash(&file), sources_hash(&pushed));

        let version = |seq, sources: &[(String, String)]| PolicyVersion {
            seq,
            hash: sources_hash(sources),
            origin: Origin::File,
            accepted_at: Timestamp::from_micros(0),
            sources: sources.to_vec(),
            rules: 0,
            restored: None,
        };
        let changed = named(&[("./api.yaml", "domain: d\ndescriptors: [x]\n")]);
        let d = diff(&version(1, &file), &version(2, &changed));
        assert!(
            d.contains("@@ api.yaml\n domain: d\n-descriptors: []\n+descriptors: [x]"),
            "{d}"
        );

        // One file on each side is compared line by line whatever the names.
        let renamed = named(&[("new.yaml", "domain: d\ndescriptors: [x]\n")]);
        let d = diff(&version(1, &file), &version(3, &renamed));
        assert!(
            d.contains("@@ api.yaml -> new.yaml\n domain: d\n-descriptors: []\n+descriptors: [x]"),
            "{d}"
        );

        // Texts that differ only where lines end say so, not a bare `...`.
        let crlf = named(&[("api.yaml", "domain: d\r\ndescriptors: []")]);
        let d = diff(&version(1, &file), &version(4, &crlf));
        assert!(
            d.ends_with(
                "@@ api.yaml\n  (the texts differ only in line endings or the final newline)\n"
            ),
            "{d}"
        );
    }

    #[test]
    fn a_diff_shows_a_few_lines_around_each_change() {
        let a: Vec<String> = ["a", "b", "c", "d", "e", "f", "g", "h", "i"]
            .iter()
            .map(|l| format!(" {l}"))
            .collect();
        let mut lines = a.clone();
        lines[4] = "-e".to_owned();
        lines.insert(5, "+E".to_owned());
        assert_eq!(
            around_changes(&lines),
            [" ...", " c", " d", "-e", "+E", " f", " g", " ..."]
        );
        assert_eq!(around_changes(&a), [" ..."], "nothing changed");
    }

    #[test]
    fn a_line_diff_shows_what_changed() {
        let d = line_diff("a\nb\nc", "a\nB\nc\nd");
        assert_eq!(d, vec![" a", "-b", "+B", " c", "+d"]);
    }

    /// The reference: the length of a longest common subsequence, by the textbook table.
    fn lcs_len(a: &[&str], b: &[&str]) -> usize {
        let mut table = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for i in (0..a.len()).rev() {
            for j in (0..b.len()).rev() {
                table[i][j] = if a[i] == b[j] {
                    table[i + 1][j + 1] + 1
                } else {
                    table[i + 1][j].max(table[i][j + 1])
                };
            }
        }
        table[0][0]
    }

    /// The texts a diff goes from and to.
    fn sides(diff: &[String]) -> (Vec<&str>, Vec<&str>) {
        let side = |drop: char| {
            diff.iter()
                .filter(|l| !l.starts_with(drop))
                .map(|l| &l[1..])
                .collect()
        };
        (side('+'), side('-'))
    }

    proptest::proptest! {
        /// Any two texts: the diff goes from one to the other, and changes as few lines as the
        /// longest common subsequence allows.
        #[test]
        fn a_line_diff_is_a_shortest_edit(
            a in proptest::collection::vec(0u8..4, 0..40),
            b in proptest::collection::vec(0u8..4, 0..40),
        ) {
            let text = |t: &[u8]| t.iter().map(|c| format!("{c}\n")).collect::<String>();
            let (a, b) = (text(&a), text(&b));
            let (a_lines, b_lines): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
            let diff = line_diff(&a, &b);
            proptest::prop_assert_eq!(sides(&diff), (a_lines.clone(), b_lines.clone()));
            let changed = diff.iter().filter(|l| !l.starts_with(' ')).count();
            let shortest = a_lines.len() + b_lines.len() - 2 * lcs_len(&a_lines, &b_lines);
            proptest::prop_assert_eq!(changed, shortest);
        }
    }

    /// A policy of 120 000 lines with two changes far apart diffs to those two changes (the
    /// table the diff once built would have held 14.4 billion cells).
    #[test]
    fn a_long_policy_diffs_to_its_changes() {
        let a: String = (0..120_000).map(|i| format!("line {i}\n")).collect();
        let b = a
            .replace("line 10\n", "line ten\n")
            .replace("line 110000\n", "");
        let diff = line_diff(&a, &b);
        let changed: Vec<&String> = diff.iter().filter(|l| !l.starts_with(' ')).collect();
        assert_eq!(changed, ["-line 10", "+line ten", "-line 110000"]);
        assert_eq!(sides(&diff), (a.lines().collect(), b.lines().collect()));
    }

    /// Past the edits the shortest diff is looked for within, the lines between the common
    /// first and last ones show as removed, then added: still a diff from one text to the other.
    #[test]
    fn a_diff_of_too_many_changes_shows_the_middle_replaced() {
        let a: String = (0..3000).map(|i| format!("{i}\n")).collect();
        let b: String = (0..3000)
            .map(|i| {
                if i % 2 == 1 && (1..2999).contains(&i) {
                    format!("{i}x\n")
                } else {
                    format!("{i}\n")
                }
            })
            .collect();
        let diff = line_diff(&a, &b);
        assert_eq!(sides(&diff), (a.lines().collect(), b.lines().collect()));
        // "0" is kept; then every line from "1" to "2998" removed, then those of `b` added.
        assert_eq!(diff[0], " 0");
        assert_eq!(diff[1], "-1");
        assert_eq!(diff[2998], "+1x");
        assert_eq!(diff.last().map(String::as_str), Some(" 2999"));
    }

    /// One file allowing `n` per second.
    fn policy(n: u32) -> Vec<(String, String)> {
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

    fn lifecycle_reading(config: Option<PathBuf>) -> Arc<Lifecycle> {
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

    /// Config files that cannot be read change nothing; once they can, the watcher takes them.
    #[test]
    fn unreadable_files_change_nothing_until_they_are_back() {
        let dir = std::env::temp_dir().join(format!("tollgate-lifecycle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.yaml");
        std::fs::write(&file, &policy(1)[0].1).unwrap();
        let lifecycle = lifecycle_reading(Some(dir.clone()));
        std::fs::remove_file(&file).unwrap();
        for _ in 0..3 {
            assert!(lifecycle.reload_if_files_changed().is_none());
        }
        assert!(lifecycle.reload().is_err());
        assert_eq!(lifecycle.current().seq, 1);
        std::fs::write(&file, &policy(2)[0].1).unwrap();
        let taken = lifecycle.reload_if_files_changed().unwrap().unwrap();
        assert!(matches!(taken, Activation::Activated(ref v) if v.seq == 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Each new reason the files cannot be read is logged once: a file that went missing after
    /// holding invalid UTF-8 does not leave the first cause as the last word in the log.
    #[test]
    fn a_new_reason_the_files_cannot_be_read_is_logged_again() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.yaml");
        std::fs::write(&file, &policy(1)[0].1).unwrap();
        let lifecycle = lifecycle_reading(Some(file.clone()));
        let logs = tollgate_testkit::CapturedLogs::default();
        let subscriber = logs.subscriber();
        tracing::subscriber::with_default(subscriber, || {
            std::fs::write(&file, b"domain: \xff\n").unwrap();
            for _ in 0..3 {
                assert!(lifecycle.reload_if_files_changed().is_none());
            }
            std::fs::remove_file(&file).unwrap();
            for _ in 0..3 {
                assert!(lifecycle.reload_if_files_changed().is_none());
            }
        });
        let text = logs.text();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("Cannot read the policy files"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains("UTF-8"), "{}", lines[0]);
        assert!(lines[1].contains("No such file"), "{}", lines[1]);
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
