//! Redis Cluster routing of our own: one multiplexed connection per node, requests sent
//! straight to the slot's primary.
//!
//! A generic cluster client serialises its recovery: while it reconnects to a dead node, calls
//! for every other node wait too. A rate limiter must not let one dead primary stall the slots
//! of the others, so tollgate keeps the slot map itself ([`Topology`], refreshed from
//! `CLUSTER SLOTS` of any live node every second and at once on a `MOVED`), talks to each node
//! over its own connection, follows up to three `MOVED` redirects per call, and lets each node's circuit
//! breaker decide whether to call it at all.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::Notify;
use tracing::{info, warn};

use super::RedisOptions;
use super::topology::Topology;
use crate::store::{Failure, StoreError};

/// Connections to every node of one cluster.
#[derive(Debug)]
pub(super) struct ClusterRouter {
    /// Seed URLs; the first also gives the scheme and credentials for discovered nodes.
    seeds: Vec<String>,
    nodes: Mutex<HashMap<Arc<str>, ConnectionManager>>,
    pub topology: Arc<Topology>,
    options: RedisOptions,
    refresh_now: Notify,
}

impl ClusterRouter {
    pub fn new(seeds: Vec<String>, topology: Arc<Topology>, options: RedisOptions) -> Self {
        ClusterRouter {
            seeds,
            nodes: Mutex::new(HashMap::new()),
            topology,
            options,
            refresh_now: Notify::new(),
        }
    }

    /// The connection to `node` (`host:port`), opened lazily; it reconnects by itself.
    pub fn connection(&self, node: &str) -> Result<ConnectionManager, StoreError> {
        if let Some(c) = self.nodes.lock().get(node) {
            return Ok(c.clone());
        }
        let url = node_url(&self.seeds[0], node);
        let client = super::client::open_client(url.as_str()).map_err(|source| {
            let node = node.into();
            StoreError::Unavailable(Failure::InvalidNodeAddress { node, source })
        })?;
        let connection =
            ConnectionManager::new_lazy_with_config(client, manager_config(&self.options))
                .map_err(|source| {
                    let node = node.into();
                    StoreError::Unavailable(Failure::CannotConnect { node, source })
                })?;
        self.nodes
            .lock()
            .entry(node.into())
            .or_insert(connection.clone());
        Ok(connection)
    }

    /// Asks for a topology refresh as soon as possible (after a `MOVED`).
    pub fn refresh_soon(&self) {
        self.refresh_now.notify_one();
    }

    /// Reads `CLUSTER SLOTS` from the first node that answers: known primaries first, then the
    /// seeds. Returns whether the map was updated.
    async fn refresh(&self) -> bool {
        let mut candidates = self.topology.primaries();
        for seed in &self.seeds {
            let addr = seed_addr(seed);
            if !candidates.iter().any(|c| **c == *addr) {
                candidates.push(addr.into());
            }
        }
        for node in candidates {
            let Ok(mut connection) = self.connection(&node) else {
                continue;
            };
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("SLOTS");
            let query = cmd.query_async::<redis::Value>(&mut connection);
            if let Ok(Ok(reply)) = tokio::time::timeout(self.options.connect_timeout, query).await
                && self.topology.update(&reply)
            {
                return true;
            }
        }
        false
    }

    /// The primaries' connections (for `DBSIZE`).
    pub fn primary_connections(&self) -> Result<Vec<ConnectionManager>, StoreError> {
        let primaries = self.topology.primaries();
        if primaries.is_empty() {
            return Err(StoreError::Unavailable(Failure::TopologyUnknown));
        }
        primaries.iter().map(|node| self.connection(node)).collect()
    }
}

/// Keeps the slot map fresh until the router is dropped: every second, and at once when asked.
/// A primary that joins the map later (a promoted replica, a node added by resharding) is
/// logged and gets the decision scripts at once, before decisions load them in their deadline.
pub(super) async fn maintain(router: Weak<ClusterRouter>) {
    let mut known = false;
    let mut primaries: Vec<Arc<str>> = Vec::new();
    loop {
        let Some(r) = router.upgrade() else { return };
        let updated = r.refresh().await;
        if updated && !known {
            info!("Learned the Redis cluster's slot map");
        } else if !updated && known {
            warn!("Cannot read the Redis cluster's slot map; keeping the last one");
        }
        if updated {
            let now = r.topology.primaries();
            let joined: Vec<Arc<str>> = now
                .iter()
                .filter(|p| !primaries.contains(p))
                .cloned()
                .collect();
            if known && now != primaries {
                info!(primaries = ?now, joined = ?joined, "The Redis cluster's primaries changed");
                let connections: Vec<_> =
                    joined.iter().filter_map(|p| r.connection(p).ok()).collect();
                if !connections.is_empty() {
                    tokio::spawn(async move {
                        if let Err(e) = super::load::load_scripts_on(connections).await {
                            warn!(error = %e, "Could not load the decision scripts on a new primary");
                        }
                    });
                }
            }
            primaries = now;
        }
        known = updated || known;
        let wait = if known {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(100)
        };
        let notified = async { r.refresh_now.notified().await };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = notified => {}
        }
    }
}

pub(super) fn manager_config(options: &RedisOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        // The outer bound only: a decision's deadline is the store's own (`patience`), which
        // lets a call on a busy server wait its turn past `command_timeout`.
        .set_response_timeout(Some(options.max_wait.max(options.command_timeout)))
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_secs(1))
        // Few retries per command: the deadline and the breaker handle outages.
        .set_number_of_retries(1)
}

/// `host:port` of a seed URL.
fn seed_addr(seed: &str) -> &str {
    let rest = seed.split_once("://").map_or(seed, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// The URL of `node` with the seed's scheme and credentials.
fn node_url(seed: &str, node: &str) -> String {
    let (scheme, rest) = seed.split_once("://").unwrap_or(("redis", seed));
    let auth = rest.rsplit_once('@').map_or("", |(a, _)| a);
    if auth.is_empty() {
        format!("{scheme}://{node}")
    } else {
        format!("{scheme}://{auth}@{node}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovered_nodes_inherit_scheme_and_credentials() {
        assert_eq!(
            node_url("rediss://u:p@a:1", "10.0.0.2:7001"),
            "rediss://u:p@10.0.0.2:7001"
        );
        assert_eq!(node_url("redis://a:1", "b:2"), "redis://b:2");
        assert_eq!(seed_addr("redis://u:p@a:1/0"), "a:1");
        assert_eq!(seed_addr("redis://a:1"), "a:1");
    }
}
