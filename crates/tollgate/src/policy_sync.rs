//! Sharing the running policy and the runtime overrides through Redis: every replica publishes
//! what it changes itself (a policy it activates from its files, a push or a rollback; an
//! override it sets or deletes, merged with every other replica's changes) and adopts, within
//! one check interval, what the others published. What could not be published (Redis did not
//! answer) is published at a later check. Each replica still validates a policy it adopts.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;
use tollgate_core::Timestamp;
use tracing::{info, warn};

use crate::lifecycle::{Activation, Lifecycle, Origin, PolicyVersion};
use crate::limiter::{Override, OverrideChange};
use crate::store::redis::{POLICY_KEY, SharedOverride, SharedOverrideChange, SharedOverrides};
use crate::store::{RedisStore, SharedPolicy, StoreBackend};

/// Runs until `stop` turns true. Does nothing for the memory store.
pub async fn run(lifecycle: Arc<Lifecycle>, every: Duration, mut stop: watch::Receiver<bool>) {
    let StoreBackend::Redis(store) = lifecycle.limiter().store() else {
        return;
    };
    let mut activated = lifecycle.subscribe();
    let mut overridden = lifecycle.limiter().overrides().subscribe();
    // The `seq` last seen in Redis for each document; `None` until Redis first answered. Any
    // other `seq` is news, lower ones included: a Redis that lost the document (restarted
    // without persistence, failed over to an empty replica) starts counting again from 1.
    let mut policy_seq: Option<u64> = None;
    let mut overrides_seq: Option<u64> = None;
    // A version activated here that could not be published yet.
    let mut unpublished: Option<u64> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // This replica's own changes first: a tick taken before them could adopt another
            // replica's document over an override or version set here and not yet published
            // (the tick also checks that nothing changed here while it read Redis).
            biased;
            Some(version) = activated.recv() => {
                match publish_policy(store, &version).await {
                    Some(seq) => policy_seq = Some(seq),
                    None => unpublished = Some(version.seq),
                }
            }
            Some(()) = overridden.recv() => {
                if let Some(seq) = share_overrides(store, &lifecycle, false).await {
                    overrides_seq = Some(seq);
                }
            }
            _ = tick.tick() => {
                // A version activated here whose publishing failed (Redis was unreachable) is
                // published now, before anything is adopted over it.
                if unpublished.is_some_and(|seq| seq == lifecycle.current().seq) {
                    if let Some(seq) = publish_policy(store, &lifecycle.current()).await {
                        policy_seq = Some(seq);
                        unpublished = None;
                    }
                    continue;
                }
                unpublished = None;
                // A version activated here while the shared one is read is newer than it: the
                // branch above publishes it, and the adoption below only happens over `before`.
                let before = lifecycle.current().seq;
                let Ok(shared) = store.shared_doc(POLICY_KEY).await else {
                    continue; // Redis unreachable: try again at the next tick
                };
                match shared {
                    // Nothing shared yet: this replica's policy becomes the first version.
                    None => policy_seq = publish_policy(store, &lifecycle.current()).await.or(policy_seq),
                    Some(shared) if policy_seq != Some(shared.seq) => {
                        policy_seq = Some(shared.seq);
                        if shared.hash != lifecycle.current().hash {
                            adopt_policy(&lifecycle, &shared, before);
                        }
                    }
                    Some(_) => {}
                }
                // Local changes not shared yet (Redis failed when they were made) go first.
                if lifecycle.limiter().overrides().has_pending() {
                    overrides_seq = share_overrides(store, &lifecycle, false).await.or(overrides_seq);
                    continue;
                }
                match store.shared_overrides().await {
                    // Redis lost them (or none were ever shared): this replica's become the
                    // first, merged with any another replica shares at the same time.
                    Ok(None) if !lifecycle.limiter().overrides().all().is_empty() => {
                        overrides_seq = share_overrides(store, &lifecycle, true).await.or(overrides_seq);
                    }
                    Ok(Some(shared)) if overrides_seq != Some(shared.seq) => {
                        overrides_seq = Some(shared.seq);
                        adopt_overrides(&lifecycle, &shared);
                    }
                    _ => {}
                }
            }
            // Mapped to `()`: the receiver's guard must not live across the other branches' awaits.
            _ = async { let _ = stop.wait_for(|s| *s).await; } => return,
        }
    }
}

async fn publish_policy(store: &RedisStore, version: &PolicyVersion) -> Option<u64> {
    let doc = json!({
        "origin": version.origin.name(),
        "sources": version.sources.iter().map(|(n, t)| json!([n, t])).collect::<Vec<_>>(),
    });
    match store
        .publish_doc(POLICY_KEY, &version.hash, &doc.to_string())
        .await
    {
        Ok(seq) => {
            info!(version = %version.label(), shared_seq = seq, "Published the policy to the other replicas");
            Some(seq)
        }
        Err(e) => {
            warn!(version = %version.label(), error = %e, "Could not publish the policy; other replicas keep theirs");
            None
        }
    }
}

/// Adopts the shared policy over version `over`, and only over it: a version activated here
/// since the tick looked is newer, and is published instead.
fn adopt_policy(lifecycle: &Lifecycle, shared: &SharedPolicy, over: u64) {
    let sources: Option<Vec<(String, String)>> = serde_json::from_str::<Value>(&shared.doc)
        .ok()
        .and_then(|doc| {
            doc["sources"]
                .as_array()?
                .iter()
                .map(|pair| Some((pair[0].as_str()?.to_owned(), pair[1].as_str()?.to_owned())))
                .collect()
        });
    let Some(sources) = sources else {
        warn!(
            shared_seq = shared.seq,
            "The shared policy in Redis is unreadable; keeping ours"
        );
        return;
    };
    if let Ok(Activation::Activated(_)) =
        lifecycle.activate_over(sources, Origin::Shared, Some(over))
    {
        info!(shared_seq = shared.seq, hash = %shared.hash, "Adopted the policy another replica published");
    }
}

fn override_json(o: &Override) -> Value {
    json!({
        "id": o.id,
        "domain": o.domain,
        "rule": o.rule,
        "entries": o.entries.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        "requests_per_unit": o.requests_per_unit,
        "period_us": o.period.map(|p| p.as_micros() as u64),
        "expires_at_us": o.expires_at.map(Timestamp::as_micros),
        "reason": o.reason,
    })
}

fn override_from_json(v: &Value) -> Option<Override> {
    Some(Override {
        id: v["id"].as_u64()?,
        domain: v["domain"].as_str()?.to_owned(),
        rule: v["rule"].as_str()?.to_owned(),
        entries: v["entries"]
            .as_array()?
            .iter()
            .map(|pair| Some((pair[0].as_str()?.to_owned(), pair[1].as_str()?.to_owned())))
            .collect::<Option<_>>()?,
        requests_per_unit: v["requests_per_unit"].as_u64()?,
        period: v["period_us"].as_u64().map(Duration::from_micros),
        expires_at: v["expires_at_us"].as_u64().map(Timestamp::from_micros),
        reason: v["reason"].as_str().unwrap_or_default().to_owned(),
    })
}

/// Where an override is stored in the shared hash: its domain, rule and entries.
fn target(o: &Override) -> String {
    json!([o.domain, o.rule, o.entries]).to_string()
}

fn shared_value(o: &Override) -> String {
    let expires = o.expires_at.map_or(0, Timestamp::as_micros);
    format!("{} {expires} {}", o.id, override_json(o))
}

/// Shares the local override changes (with `seed`, every local override: Redis has none) and
/// adopts the merged result. Returns its `seq`; on failure the changes wait for the next tick.
async fn share_overrides(store: &RedisStore, lifecycle: &Lifecycle, seed: bool) -> Option<u64> {
    let overrides = lifecycle.limiter().overrides();
    let pending = overrides.take_pending();
    let mut changes: Vec<SharedOverrideChange> = Vec::new();
    if seed {
        changes.extend(overrides.all().iter().map(|o| {
            SharedOverrideChange::Set(SharedOverride {
                target: target(o),
                value: shared_value(o),
            })
        }));
    }
    changes.extend(pending.iter().map(|change| match change {
        OverrideChange::Set(o) => SharedOverrideChange::Set(SharedOverride {
            target: target(o),
            value: shared_value(o),
        }),
        OverrideChange::Deleted(o) => SharedOverrideChange::Delete {
            target: target(o),
            id: o.id,
        },
    }));
    if changes.is_empty() {
        return None;
    }
    match store
        .merge_overrides(&changes, lifecycle.limiter().clock().now())
        .await
    {
        Ok(shared) => {
            adopt_overrides(lifecycle, &shared);
            Some(shared.seq)
        }
        Err(e) => {
            warn!(error = %e, "Could not share the overrides; trying again at the next check");
            overrides.keep_pending(pending);
            None
        }
    }
}

fn adopt_overrides(lifecycle: &Lifecycle, shared: &SharedOverrides) {
    let mut list = Vec::with_capacity(shared.overrides.len());
    for o in &shared.overrides {
        let parsed = o
            .value
            .splitn(3, ' ')
            .nth(2)
            .and_then(|json| serde_json::from_str::<Value>(json).ok())
            .and_then(|v| override_from_json(&v));
        match parsed {
            Some(parsed) => list.push(parsed),
            None => warn!(target = %o.target, "A shared override in Redis is unreadable; skipped"),
        }
    }
    // The same order on every replica.
    list.sort_by_key(|o| o.id);
    let overrides = lifecycle.limiter().overrides();
    let before = overrides.generation();
    overrides.adopt(list);
    if overrides.generation() != before {
        info!(
            count = overrides.all().len(),
            "Adopted the overrides as shared by every replica"
        );
    }
}
