//! Sharing the running policy and the runtime overrides through Redis: every replica publishes
//! what it changes itself (a policy it activates from its files, a push or a rollback; an
//! override it sets or deletes, merged with every other replica's changes) and adopts, within
//! one check interval, what the others published. What could not be published (Redis did not
//! answer) is published at a later check. Each replica still validates a policy it adopts.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tollgate_core::Timestamp;
use tracing::{info, warn};

use super::{Activation, Lifecycle, Origin, PolicyVersion};
use crate::limiter::{Override, OverrideChange, Target};
use crate::observe::Throttle;
use crate::store::redis::{SharedOverride, SharedOverrideChange, SharedOverrides, Stamp};
use crate::store::{RedisStore, SharedPolicy, StoreBackend, StoreError};

/// While Redis is away every check fails again: one warning per this long, not one per check.
const RETRY_WARNING_EVERY: Duration = Duration::from_secs(10);

/// Failed publishes, shares and reads are each logged once per [`RETRY_WARNING_EVERY`].
static LAST_PUBLISH_WARNING: Throttle = Throttle::new(RETRY_WARNING_EVERY);
static LAST_SHARE_WARNING: Throttle = Throttle::new(RETRY_WARNING_EVERY);
static LAST_READ_WARNING: Throttle = Throttle::new(RETRY_WARNING_EVERY);

/// Whether a warning `throttle` holds may be logged now.
fn due(throttle: &Throttle) -> bool {
    throttle.note(tokio::time::Instant::now()).is_some()
}

/// Runs until `stop` turns true. Does nothing for the memory store.
pub async fn run(lifecycle: Arc<Lifecycle>, every: Duration, stop: watch::Receiver<bool>) {
    let state = Arc::new(tokio::sync::Mutex::new(SyncState::new(&lifecycle)));
    resume(lifecycle, every, stop, state).await;
}

/// What the sync keeps from one check to the next: the subscriptions to this replica's own
/// changes and what it last saw in Redis. Kept apart from a run, so that a run started again
/// after a panic (see [`crate::background`]) resumes from it: with a new subscription, a
/// version activated here meanwhile would be missed, and with nothing seen, the next check
/// would adopt the shared version over one not published yet, as a replica does at its start.
#[derive(Debug)]
pub struct SyncState {
    activated: UnboundedReceiver<Arc<PolicyVersion>>,
    overridden: UnboundedReceiver<()>,
    /// The stamp last seen in Redis for each document; `None` until Redis first answered. Any
    /// other stamp is news: a Redis that lost the document (restarted without persistence,
    /// failed over to an empty replica) makes it again under a new epoch.
    policy_seen: Option<Stamp>,
    overrides_seen: Option<Stamp>,
    /// A version activated here that is not published yet.
    unpublished: Option<u64>,
    /// Whether the shared policy is still to be read for the first time.
    first_look: bool,
    /// Whether the earlier version's list of overrides was looked for (once is enough).
    legacy_read: bool,
    /// Whether this sync only follows the fleet's policy (an embedded limiter): it adopts what
    /// the replicas publish and never publishes its own policy (its overrides are shared).
    follower: bool,
}

impl SyncState {
    /// Subscribes to `lifecycle`'s activations and override changes (there is one subscriber:
    /// a later one takes them over).
    pub fn new(lifecycle: &Lifecycle) -> Self {
        SyncState {
            activated: lifecycle.subscribe(),
            overridden: lifecycle.limiter().overrides().subscribe(),
            policy_seen: None,
            overrides_seen: None,
            unpublished: None,
            first_look: true,
            legacy_read: false,
            follower: false,
        }
    }

    /// [`SyncState::new`] for a limiter that follows the fleet's policy and never publishes
    /// its own (an embedded limiter beside `tollgate serve` replicas): it adopts the shared
    /// policy, pushes and rollbacks, and shares the overrides as a replica does.
    pub fn follower(lifecycle: &Lifecycle) -> Self {
        SyncState {
            follower: true,
            ..SyncState::new(lifecycle)
        }
    }
}

/// [`run`], from `state` (held by one run at a time).
pub async fn resume(
    lifecycle: Arc<Lifecycle>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
    state: Arc<tokio::sync::Mutex<SyncState>>,
) {
    let StoreBackend::Redis(store) = lifecycle.limiter().store() else {
        return;
    };
    let mut state = state.lock_owned().await;
    let SyncState {
        activated,
        overridden,
        policy_seen,
        overrides_seen,
        unpublished,
        first_look,
        legacy_read,
        follower,
    } = &mut *state;
    let follower = *follower;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let checks = async {
        loop {
            tokio::select! {
                // This replica's own changes first: a tick taken before them could adopt
                // another replica's document over a version set here and not yet published.
                biased;
                Some(version) = activated.recv() => {
                    // A command published it before it answered (see `Lifecycle::fleet_activate`).
                    if version.seq <= lifecycle.published_by_command() {
                        continue;
                    }
                    // Marked before it is tried, so that a run cut short meanwhile (a panic)
                    // leaves it to be published at the next check.
                    *unpublished = Some(version.seq);
                    match publish_policy(store, &lifecycle, &version, rank(&version)).await {
                        Ok(Some(stamp)) => {
                            *policy_seen = Some(stamp);
                            *unpublished = None;
                        }
                        // A version accepted later is shared: the next check adopts it.
                        Ok(None) => {
                            *policy_seen = None;
                            *unpublished = None;
                        }
                        Err(_) => {}
                    }
                }
                Some(()) = overridden.recv() => {
                    let seen = overrides_seen.as_ref();
                    if let Ok(Some(stamp)) = share_overrides(store, &lifecycle, false, seen).await {
                        *overrides_seen = Some(stamp);
                    }
                }
                _ = tick.tick() => {
                    let policy = (&mut *policy_seen, &mut *unpublished, &mut *first_look);
                    sync_policy(store, &lifecycle, policy, follower).await;
                    sync_overrides(store, &lifecycle, overrides_seen, legacy_read).await;
                }
            }
        }
    };
    // Stopping cuts a check short: on a hung Redis each one outlasts the interval, so the next
    // tick would always be ready ahead of the stop, and each call waits its deadline.
    tokio::select! {
        _ = stop.wait_for(|s| *s) => {}
        () = checks => {}
    }
}

/// One check of the shared policy: publishes a version activated here that Redis missed, or
/// adopts one another replica published. At the first look, a replica still on the files it
/// started with publishes them over the shared policy when the fleet's policy was made beside
/// other files (see [`files_are_news`]). A `follower` only adopts.
async fn sync_policy(
    store: &RedisStore,
    lifecycle: &Lifecycle,
    (seen, unpublished, first_look): (&mut Option<Stamp>, &mut Option<u64>, &mut bool),
    follower: bool,
) {
    let current = lifecycle.current();
    // A version activated here whose publishing failed (Redis was unreachable) is published
    // now; Redis keeps the shared one if another replica's was accepted later.
    if unpublished.is_some_and(|seq| seq == current.seq) {
        match publish_policy(store, lifecycle, &current, rank(&current)).await {
            Ok(Some(stamp)) => {
                *seen = Some(stamp);
                *unpublished = None;
                return;
            }
            Ok(None) => *seen = None, // adopted below
            Err(_) => return,         // still unreachable: try again at the next tick
        }
    }
    *unpublished = None;
    // A version activated here while the shared one is read is newer than it: the adoption
    // below only happens over `before`.
    let before = current.seq;
    let shared = match store.shared_policy().await {
        Ok(shared) => shared,
        Err(e) => return read_failed("policy", &e), // try again at the next tick
    };
    if let Some(shared) = &shared
        && !follower
        && *first_look
        && current.seq == 1
        && shared.hash != current.hash
        && files_are_news(lifecycle, shared)
    {
        let now = lifecycle.limiter().clock().now();
        match publish_policy(store, lifecycle, &current, now).await {
            Ok(Some(stamp)) => {
                info!(version = %current.label(), replaced_shared_seq = shared.stamp.seq,
                    "This replica's policy files are not those the fleet's policy was made beside (a deploy changed them): published them as the fleet's policy");
                *seen = Some(stamp);
                *first_look = false;
                return;
            }
            // A version accepted later is shared: adopted below.
            Ok(None) => {}
            // Not adopted over the new files meanwhile: tried again at the next check.
            Err(_) => return,
        }
    }
    *first_look = false;
    // Seen before, and now gone or made again: Redis lost its data, counters included.
    if seen.is_some()
        && shared
            .as_ref()
            .is_none_or(|s| remade(seen.as_ref(), &s.stamp))
    {
        warn!(
            "The shared policy is gone from Redis or was made again: Redis lost its data (restarted without persistence, flushed, or failed over to an empty replica); forgetting remembered denials and local budgets"
        );
        lifecycle.limiter().store_data_lost();
    }
    // Nothing shared yet, or made again since this replica last looked (Redis lost it, and the
    // replica that made it may run an older version): this replica's version goes in, and
    // Redis keeps whichever was accepted later. (A follower waits for a replica to.)
    if !follower
        && shared
            .as_ref()
            .is_none_or(|s| remade(seen.as_ref(), &s.stamp) && s.hash != current.hash)
    {
        match publish_policy(store, lifecycle, &current, rank(&current)).await {
            Ok(Some(stamp)) => *seen = Some(stamp),
            Ok(None) => {
                if let Some(shared) = &shared {
                    *seen = Some(shared.stamp.clone());
                    adopt_policy(lifecycle, shared, before);
                }
            }
            Err(_) => {} // try again at the next tick
        }
    } else if let Some(shared) = shared
        && seen.as_ref() != Some(&shared.stamp)
    {
        *seen = Some(shared.stamp.clone());
        if shared.hash != current.hash {
            adopt_policy(lifecycle, &shared, before);
        }
    }
}

/// One check of the shared overrides: shares local changes Redis missed, shares them all again
/// if Redis lost them (or carries over those of an older version's list), or adopts what the
/// other replicas changed.
async fn sync_overrides(
    store: &RedisStore,
    lifecycle: &Lifecycle,
    seen: &mut Option<Stamp>,
    legacy_read: &mut bool,
) {
    let overrides = lifecycle.limiter().overrides();
    if overrides.has_pending()
        && let Ok(Some(stamp)) = share_overrides(store, lifecycle, false, seen.as_ref()).await
    {
        *seen = Some(stamp);
        return;
    }
    // (Changes that could not be shared stay pending, and are kept over what is adopted.)
    let shared = match store.shared_overrides(seen.as_ref()).await {
        Ok(shared) => shared,
        Err(e) => return read_failed("overrides", &e), // try again at the next tick
    };
    // Nothing shared (Redis lost it, or none was ever), or made again since this replica last
    // looked: whoever made it may have known only some of the overrides, so this replica adds
    // all it knows.
    if shared
        .as_ref()
        .is_none_or(|s| remade(seen.as_ref(), &s.stamp))
    {
        if shared.is_none() && overrides.is_empty() && !*legacy_read {
            *legacy_read = carry_over_legacy(store, lifecycle).await;
        }
        match share_overrides(store, lifecycle, true, None).await {
            Ok(Some(stamp)) => *seen = Some(stamp),
            // Nothing to add: take what is shared.
            Ok(None) => {
                if let Some(shared) = &shared {
                    *seen = Some(shared.stamp.clone());
                    adopt_overrides(lifecycle, shared);
                }
            }
            // Not adopted while this replica's own cannot be added: try again next tick.
            Err(_) => {}
        }
    } else if let Some(shared) = shared
        && seen.as_ref() != Some(&shared.stamp)
    {
        *seen = Some(shared.stamp.clone());
        adopt_overrides(lifecycle, &shared);
    }
}

/// A shared document that could not be read: changes made on other replicas do not arrive
/// meanwhile, which is worth a line (once per [`RETRY_WARNING_EVERY`]).
fn read_failed(what: &str, error: &StoreError) {
    if due(&LAST_READ_WARNING) {
        warn!(shared = what, error = %error, "Could not read what the other replicas share; trying again at every check");
    }
}

/// Whether a shared hash last seen as `seen` was made again since (a new epoch).
fn remade(seen: Option<&Stamp>, now: &Stamp) -> bool {
    seen.is_some_and(|seen| seen.epoch != now.epoch)
}

/// Adopts the overrides a version before the merged format shared as one list. Returns whether
/// Redis answered (the list was read, or there is none).
async fn carry_over_legacy(store: &RedisStore, lifecycle: &Lifecycle) -> bool {
    let legacy = match store.legacy_overrides().await {
        Ok(Some(legacy)) => legacy,
        Ok(None) => return true,
        Err(_) => return false,
    };
    let list: Option<Vec<Override>> = serde_json::from_str::<Vec<OverrideDoc>>(&legacy.doc)
        .ok()
        .map(|docs| docs.into_iter().map(Override::from).collect());
    match list {
        Some(list) if !list.is_empty() => {
            info!(
                count = list.len(),
                "Carried over the overrides an earlier version shared"
            );
            let limiter = lifecycle.limiter();
            limiter.overrides().adopt(list, limiter.clock().now());
        }
        Some(_) => {}
        None => warn!("The earlier version's shared overrides are unreadable; not carried over"),
    }
    true
}

/// Whether the shared policy was made beside policy files other than this replica's: its
/// publisher's files (`files` in the document, the content hash of the files it had read)
/// differ from the ones this replica started with. Then this replica's files are news to the
/// fleet, as when a deploy changed them, and not a restart on the files the fleet already
/// runs beside (where a push or a rollback made on top must survive). A document without the
/// field (an earlier version's) is no news.
fn files_are_news(lifecycle: &Lifecycle, shared: &SharedPolicy) -> bool {
    serde_json::from_str::<FilesField>(&shared.doc)
        .ok()
        .and_then(|doc| doc.files)
        .is_some_and(|files| files != lifecycle.files_hash())
}

/// Where `version` ranks against other publications: when it was accepted, except the version
/// a replica started with, which ranks below every version activated while running (a replica
/// starting after Redis lost the shared policy must not undo the fleet's push).
pub(super) fn rank(version: &PolicyVersion) -> Timestamp {
    if version.seq == 1 {
        Timestamp::from_micros(0)
    } else {
        version.accepted_at
    }
}

/// Publishes `version`, ranked at `rank`, with the hash of the files this replica last read:
/// its stamp, `None` if Redis kept a version ranked later, `Err` if Redis could not be asked
/// (logged here).
pub(super) async fn publish_policy(
    store: &RedisStore,
    lifecycle: &Lifecycle,
    version: &PolicyVersion,
    rank: Timestamp,
) -> Result<Option<Stamp>, StoreError> {
    let doc = PolicyDoc {
        files: Some(lifecycle.files_hash()),
        origin: version.origin.name().to_owned(),
        sources: version.sources.clone(),
    };
    match store.publish_policy(&version.hash, &doc.text(), rank).await {
        Ok(Some(stamp)) => {
            info!(version = %version.label(), shared_seq = stamp.seq, "Published the policy to the other replicas");
            Ok(Some(stamp))
        }
        Ok(None) => {
            info!(version = %version.label(), "Not published: another replica's version, accepted later, is shared");
            Ok(None)
        }
        Err(e) => {
            if due(&LAST_PUBLISH_WARNING) {
                warn!(version = %version.label(), error = %e, "Could not publish the policy; trying again at every check");
            }
            Err(e)
        }
    }
}

/// Adopts the shared policy over version `over`, and only over it: a version activated here
/// since the tick looked is newer, and is published instead.
fn adopt_policy(lifecycle: &Lifecycle, shared: &SharedPolicy, over: u64) {
    let sources = serde_json::from_str::<PolicyDoc>(&shared.doc)
        .ok()
        .map(|doc| doc.sources);
    let Some(sources) = sources else {
        warn!(
            shared_seq = shared.stamp.seq,
            "The shared policy in Redis is unreadable; keeping ours"
        );
        return;
    };
    if let Ok(Activation::Activated(_)) =
        lifecycle.activate_over(sources, Origin::Shared, Some(over))
    {
        info!(shared_seq = shared.stamp.seq, hash = %shared.hash, "Adopted the policy another replica published");
    }
}

/// The shared policy document (`doc` of [`SharedPolicy`]): the version's texts, with the hash
/// of the policy files its publisher had read. Its fields are written in this order, which is
/// the order earlier versions wrote them in (they sorted them); documents they wrote are read
/// alike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct PolicyDoc {
    /// The content hash of the files the publisher last read (see [`files_are_news`]); absent
    /// in documents of versions before it.
    #[serde(default)]
    files: Option<String>,
    /// Where the version came from on its publisher ([`Origin::name`]), for people reading Redis.
    #[serde(default)]
    origin: String,
    /// The `(file name, text)` pairs.
    sources: Vec<(String, String)>,
}

impl PolicyDoc {
    /// The document as JSON.
    fn text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Only the `files` field of a [`PolicyDoc`], for a document whose other fields need not parse.
#[derive(Debug, Deserialize)]
struct FilesField {
    #[serde(default)]
    files: Option<String>,
}

/// One override as shared (after the id, expiry and set time of its value in the shared hash,
/// and in the list earlier versions shared). Fields in the order earlier versions wrote them
/// (sorted); `reason` and `set_at_us` may be absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OverrideDoc {
    domain: String,
    entries: Vec<(String, String)>,
    expires_at_us: Option<u64>,
    id: u64,
    period_us: Option<u64>,
    #[serde(default)]
    reason: String,
    requests_per_unit: u64,
    rule: String,
    #[serde(default)]
    set_at_us: u64,
}

impl From<&Override> for OverrideDoc {
    fn from(o: &Override) -> Self {
        OverrideDoc {
            domain: o.domain.clone(),
            entries: o.entries.clone(),
            expires_at_us: o.expires_at.map(Timestamp::as_micros),
            id: o.id,
            period_us: o.period.map(|p| p.as_micros() as u64),
            reason: o.reason.clone(),
            requests_per_unit: o.requests_per_unit,
            rule: o.rule.clone(),
            set_at_us: o.set_at.as_micros(),
        }
    }
}

impl From<OverrideDoc> for Override {
    fn from(doc: OverrideDoc) -> Self {
        Override {
            id: doc.id,
            domain: doc.domain,
            rule: doc.rule,
            entries: doc.entries,
            requests_per_unit: doc.requests_per_unit,
            period: doc.period_us.map(Duration::from_micros),
            expires_at: doc.expires_at_us.map(Timestamp::from_micros),
            set_at: Timestamp::from_micros(doc.set_at_us),
            reason: doc.reason,
        }
    }
}

/// Where an override is stored in the shared hash: its domain, rule and entries.
fn target(o: &Override) -> String {
    serde_json::to_string(&(&o.domain, &o.rule, &o.entries)).unwrap_or_default()
}

/// How long a deleted override's tombstone stays in the shared hash: a set older than the
/// deletion that arrives within it (from a replica that lost Redis for that long) stays deleted.
const TOMBSTONE_LIFE: Duration = Duration::from_secs(24 * 3600);

fn tombstone(o: &Override, deleted_at: Timestamp) -> SharedOverride {
    let expires = deleted_at.saturating_add(TOMBSTONE_LIFE).as_micros();
    SharedOverride {
        target: target(o),
        value: format!("{} {expires} {} -", o.id, deleted_at.as_micros()),
    }
}

fn shared_set(o: &Override) -> SharedOverrideChange {
    let expires = o.expires_at.map_or(0, Timestamp::as_micros);
    let doc = serde_json::to_string(&OverrideDoc::from(o)).unwrap_or_default();
    let value = format!("{} {expires} {} {doc}", o.id, o.set_at.as_micros());
    SharedOverrideChange::Set(SharedOverride {
        target: target(o),
        value,
    })
}

/// Shares the local override changes (with `seed`, every local override as well) and adopts
/// the merged result. Returns its stamp, `None` when there was nothing to send, `Err` when
/// Redis failed (the changes wait for the next tick). `seen` is the stamp last seen: if the
/// hash was made again since, every local override is sent too.
async fn share_overrides(
    store: &RedisStore,
    lifecycle: &Lifecycle,
    seed: bool,
    seen: Option<&Stamp>,
) -> Result<Option<Stamp>, StoreError> {
    let overrides = lifecycle.limiter().overrides();
    let pending = overrides.take_pending();
    let mut changes: Vec<SharedOverrideChange> = Vec::new();
    if seed {
        changes.extend(overrides.all().iter().map(shared_set));
    }
    changes.extend(pending.iter().map(|change| match change {
        OverrideChange::Set(o) => shared_set(o),
        OverrideChange::Deleted(o, at) => SharedOverrideChange::Delete(tombstone(o, *at)),
    }));
    if changes.is_empty() {
        return Ok(None);
    }
    let now = lifecycle.limiter().clock().now();
    let mut merged = store.merge_overrides(&changes, now, seen).await;
    // Redis had lost them (made now, or since this replica last looked): what was sent may
    // be all it holds. Send every override this replica knows, or the others would adopt only
    // the changes and drop the rest.
    if let Ok((existed, shared)) = &merged
        && (!existed || remade(seen, &shared.stamp))
        && !seed
    {
        let all: Vec<SharedOverrideChange> = overrides.all().iter().map(shared_set).collect();
        merged = store.merge_overrides(&all, now, None).await;
    }
    match merged {
        Ok((_, shared)) => {
            adopt_overrides(lifecycle, &shared);
            Ok(Some(shared.stamp))
        }
        Err(e) => {
            if due(&LAST_SHARE_WARNING) {
                warn!(error = %e, "Could not share the overrides; trying again at every check");
            }
            overrides.keep_pending(pending);
            Err(e)
        }
    }
}

/// Adopts what was read from the shared overrides: every override, or the targets changed
/// since this replica last looked.
fn adopt_overrides(lifecycle: &Lifecycle, shared: &SharedOverrides) {
    if !shared.whole {
        return adopt_changes(lifecycle, shared);
    }
    let mut list = Vec::with_capacity(shared.overrides.len());
    for o in &shared.overrides {
        match read_value(o) {
            Value::Held(parsed) => list.push(parsed),
            Value::Nothing => {} // a deleted override's tombstone
            Value::Unreadable => {
                warn!(target = %o.target, "A shared override in Redis is unreadable; skipped");
            }
        }
    }
    // The same order on every replica.
    list.sort_by_key(|o| o.id);
    let overrides = lifecycle.limiter().overrides();
    let before = overrides.generation();
    overrides.adopt(list, lifecycle.limiter().clock().now());
    if overrides.generation() != before {
        info!(
            count = overrides.len(),
            "Adopted the overrides as shared by every replica"
        );
    }
}

/// Adopts the targets the other replicas changed: what each holds now, or nothing.
fn adopt_changes(lifecycle: &Lifecycle, shared: &SharedOverrides) {
    let mut changes = Vec::with_capacity(shared.overrides.len());
    for o in &shared.overrides {
        let Ok(target) = serde_json::from_str::<Target>(&o.target) else {
            warn!(target = %o.target, "A shared override's target in Redis is unreadable; skipped");
            continue;
        };
        let value = match read_value(o) {
            Value::Held(parsed) => Some(parsed),
            Value::Nothing => None,
            Value::Unreadable => {
                warn!(target = %o.target, "A shared override in Redis is unreadable; dropped");
                None
            }
        };
        changes.push((target, value));
    }
    if changes.is_empty() {
        return;
    }
    let limiter = lifecycle.limiter();
    let changed = limiter
        .overrides()
        .adopt_changes(changes, limiter.clock().now());
    if changed > 0 {
        info!(
            changed,
            count = limiter.overrides().len(),
            "Adopted the overrides other replicas changed"
        );
    }
}

/// What a shared value holds.
enum Value {
    Held(Override),
    /// A deleted override's tombstone, or an empty value (the target holds nothing now).
    Nothing,
    Unreadable,
}

fn read_value(o: &SharedOverride) -> Value {
    if o.value.is_empty() || o.value.ends_with(" -") {
        return Value::Nothing;
    }
    o.value
        .splitn(4, ' ')
        .nth(3)
        .and_then(|json| serde_json::from_str::<OverrideDoc>(json).ok())
        .map_or(Value::Unreadable, |doc| Value::Held(Override::from(doc)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn an_override(period: Option<Duration>, expires_at: Option<Timestamp>) -> Override {
        Override {
            id: 9_007_199_254_740_991,
            domain: "api".into(),
            rule: "per \"user\"".into(),
            entries: vec![("user".into(), "bob\n".into()), ("plan".into(), "é".into())],
            requests_per_unit: 4,
            period,
            expires_at,
            set_at: Timestamp::from_micros(1_700_000_000_000_001),
            reason: "incident \\ 42".into(),
        }
    }

    /// The documents replicas of earlier versions wrote, built as they built them (`json!`,
    /// whose objects sort their keys): replicas of both versions read what the other writes.
    #[test]
    fn the_wire_documents_are_those_earlier_versions_wrote() {
        for o in [
            an_override(None, None),
            an_override(
                Some(Duration::from_secs(60)),
                Some(Timestamp::from_micros(1_700_000_060_000_000)),
            ),
        ] {
            let earlier = json!({
                "id": o.id,
                "domain": o.domain,
                "rule": o.rule,
                "entries": o.entries.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
                "requests_per_unit": o.requests_per_unit,
                "period_us": o.period.map(|p| p.as_micros() as u64),
                "expires_at_us": o.expires_at.map(Timestamp::as_micros),
                "set_at_us": o.set_at.as_micros(),
                "reason": o.reason,
            })
            .to_string();
            let doc = serde_json::to_string(&OverrideDoc::from(&o)).unwrap();
            assert_eq!(doc, earlier);
            let read: OverrideDoc = serde_json::from_str(&earlier).unwrap();
            assert_eq!(Override::from(read), o);
            assert_eq!(target(&o), json!([o.domain, o.rule, o.entries]).to_string());
        }

        let sources = vec![
            (
                "conf/a.yaml".to_owned(),
                "domain: a\n\"quoted\"\t".to_owned(),
            ),
            ("conf/b.yaml".to_owned(), String::new()),
        ];
        let earlier = json!({
            "origin": "push",
            "sources": sources.iter().map(|(n, t)| json!([n, t])).collect::<Vec<_>>(),
            "files": "0123456789abcdef",
        })
        .to_string();
        let doc = PolicyDoc {
            files: Some("0123456789abcdef".into()),
            origin: "push".into(),
            sources: sources.clone(),
        };
        assert_eq!(doc.text(), earlier);
        assert_eq!(serde_json::from_str::<PolicyDoc>(&earlier).unwrap(), doc);
    }

    /// Fields earlier versions did not write, or wrote as null, read as absent.
    #[test]
    fn documents_without_the_later_fields_are_read() {
        let o: OverrideDoc = serde_json::from_str(
            r#"{"id":3,"domain":"api","rule":"r","entries":[["k","v"]],"requests_per_unit":1,"period_us":null}"#,
        )
        .unwrap();
        let o = Override::from(o);
        assert_eq!(
            (o.reason.as_str(), o.set_at),
            ("", Timestamp::from_micros(0))
        );
        assert_eq!((o.period, o.expires_at), (None, None));
        assert!(serde_json::from_str::<OverrideDoc>(r#"{"id":3}"#).is_err());

        let policy: PolicyDoc =
            serde_json::from_str(r#"{"sources":[["p.yaml","domain: d\n"]]}"#).unwrap();
        assert_eq!(policy.files, None);
        assert_eq!(
            policy.sources,
            [("p.yaml".to_owned(), "domain: d\n".to_owned())]
        );
        let files: FilesField = serde_json::from_str(r#"{"files":"ab","sources":7}"#).unwrap();
        assert_eq!(files.files.as_deref(), Some("ab"));
    }
}
