//! Sharing the running policy through Redis: every replica publishes the versions it activates
//! itself (file change, push, rollback) and adopts, within one check interval, a version another
//! replica published. Each replica still validates what it adopts.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::lifecycle::{Lifecycle, Origin, PolicyVersion};
use crate::store::{RedisStore, SharedPolicy, StoreBackend};

/// Runs until `stop` turns true. Does nothing for the memory store.
pub async fn run(lifecycle: Arc<Lifecycle>, every: Duration, mut stop: watch::Receiver<bool>) {
    let StoreBackend::Redis(store) = lifecycle.limiter().store() else {
        return;
    };
    let mut activated = lifecycle.subscribe();
    // The highest `seq` seen in Redis; `None` until Redis first answered.
    let mut last_seq: Option<u64> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            Some(version) = activated.recv() => {
                match publish(store, &version).await {
                    Some(seq) => last_seq = Some(seq),
                    None => warn!(version = %version.label(), "Could not publish the policy to Redis; other replicas keep theirs"),
                }
            }
            _ = tick.tick() => {
                let shared = match store.shared_policy().await {
                    Ok(shared) => shared,
                    Err(_) => continue, // Redis unreachable: try again at the next tick
                };
                match (shared, last_seq) {
                    // Nothing shared yet: this replica's policy becomes the first version.
                    (None, _) => last_seq = publish(store, &lifecycle.current()).await.or(last_seq),
                    (Some(shared), seen) if seen.is_none_or(|s| shared.seq > s) => {
                        last_seq = Some(shared.seq);
                        if shared.hash != lifecycle.current().hash {
                            adopt(&lifecycle, &shared);
                        }
                    }
                    _ => {}
                }
            }
            // Mapped to `()`: the receiver's guard must not live across the other branches' awaits.
            _ = async { let _ = stop.wait_for(|s| *s).await; } => return,
        }
    }
}

async fn publish(store: &RedisStore, version: &PolicyVersion) -> Option<u64> {
    let doc = json!({
        "origin": version.origin.name(),
        "sources": version.sources.iter().map(|(n, t)| json!([n, t])).collect::<Vec<_>>(),
    });
    let seq = store
        .publish_policy(&version.hash, &doc.to_string())
        .await
        .ok()?;
    info!(version = %version.label(), shared_seq = seq, "Published the policy to the other replicas");
    Some(seq)
}

fn adopt(lifecycle: &Lifecycle, shared: &SharedPolicy) {
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
    if lifecycle.activate(sources, Origin::Shared).is_ok() {
        info!(shared_seq = shared.seq, hash = %shared.hash, "Adopted the policy another replica published");
    }
}
