//! Sharing the running policy and the runtime overrides through Redis: every replica publishes
//! what it changes itself (a policy it activates from its files, a push or a rollback; an
//! override it sets or deletes) and adopts, within one check interval, what another replica
//! published. Each replica still validates a policy it adopts.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;
use tollgate_core::Timestamp;
use tracing::{info, warn};

use crate::lifecycle::{Activation, Lifecycle, Origin, PolicyVersion, sources_hash};
use crate::limiter::Override;
use crate::store::redis::{OVERRIDES_KEY, POLICY_KEY};
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
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // This replica's own changes first: a tick taken before them could adopt another
            // replica's document over an override or version set here and not yet published
            // (the tick also checks that nothing changed here while it read Redis).
            biased;
            Some(version) = activated.recv() => {
                if let Some(seq) = publish_policy(store, &version).await {
                    policy_seq = Some(seq);
                }
            }
            Some(()) = overridden.recv() => {
                if let Some(seq) = publish_overrides(store, &lifecycle).await {
                    overrides_seq = Some(seq);
                }
            }
            _ = tick.tick() => {
                // A change made here while the shared documents are read is newer than them: the
                // branches above publish it; adopting now would overwrite it.
                let overrides = lifecycle.limiter().overrides();
                let before = (lifecycle.current().seq, overrides.generation());
                let Ok(shared) = store.shared_doc(POLICY_KEY).await else {
                    continue; // Redis unreachable: try again at the next tick
                };
                match shared {
                    // Nothing shared yet: this replica's policy becomes the first version.
                    None => policy_seq = publish_policy(store, &lifecycle.current()).await.or(policy_seq),
                    Some(shared)
                        if policy_seq != Some(shared.seq) && lifecycle.current().seq == before.0 =>
                    {
                        policy_seq = Some(shared.seq);
                        if shared.hash != lifecycle.current().hash {
                            adopt_policy(&lifecycle, &shared, before.0);
                        }
                    }
                    Some(_) => {}
                }
                if let Ok(Some(shared)) = store.shared_doc(OVERRIDES_KEY).await
                    && overrides_seq != Some(shared.seq)
                    && overrides.generation() == before.1 {
                        overrides_seq = Some(shared.seq);
                        adopt_overrides(&lifecycle, &shared);
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

async fn publish_overrides(store: &RedisStore, lifecycle: &Lifecycle) -> Option<u64> {
    let all = lifecycle.limiter().overrides().all();
    let doc = Value::Array(all.iter().map(override_json).collect()).to_string();
    let hash = sources_hash(&[(String::new(), doc.clone())]);
    match store.publish_doc(OVERRIDES_KEY, &hash, &doc).await {
        Ok(seq) => Some(seq),
        Err(e) => {
            warn!(error = %e, "Could not publish the overrides; other replicas keep theirs");
            None
        }
    }
}

fn adopt_overrides(lifecycle: &Lifecycle, shared: &SharedPolicy) {
    let list: Option<Vec<Override>> = serde_json::from_str::<Value>(&shared.doc)
        .ok()
        .and_then(|doc| doc.as_array()?.iter().map(override_from_json).collect());
    match list {
        Some(list) => {
            let overrides = lifecycle.limiter().overrides();
            if overrides.all() != list {
                info!(
                    count = list.len(),
                    "Adopted the overrides another replica published"
                );
                overrides.replace_all(list);
            }
        }
        None => warn!(
            shared_seq = shared.seq,
            "The shared overrides in Redis are unreadable; keeping ours"
        ),
    }
}
