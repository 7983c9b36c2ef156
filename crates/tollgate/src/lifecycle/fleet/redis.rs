//! The fleet's version, in Redis: read before a command is decided, and the command's new
//! version published before it answers (see the parent module). Built with the `redis` feature.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::warn;

use crate::lifecycle::sync::{publish_policy, rank};
use crate::lifecycle::{Activation, Lifecycle, Origin};
use crate::policy::PolicyErrors;
use crate::store::{RedisStore, StoreBackend};

impl Lifecycle {
    /// The version a command published itself, which the sync need not publish again.
    pub(in crate::lifecycle) fn published_by_command(&self) -> u64 {
        self.published_seq.load(Ordering::Relaxed)
    }

    /// The shared store, when this replica's policy sync runs on one.
    fn fleet_store(&self) -> Option<&RedisStore> {
        self.published.lock().as_ref()?;
        match self.limiter.store() {
            StoreBackend::Redis(store) => Some(store),
            StoreBackend::Memory(_) => None,
        }
    }

    /// The hash of the policy the fleet runs, when there is a fleet and Redis answers.
    pub(super) async fn fleet_hash(&self) -> Option<String> {
        let store = self.fleet_store()?;
        match store.shared_policy().await {
            Ok(shared) => shared.map(|s| s.hash),
            Err(e) => {
                warn!(error = %e, "Could not read the fleet's policy; deciding against this replica's");
                None
            }
        }
    }

    /// Publishes a version the command activated before it answers.
    pub(super) async fn publish_now(
        &self,
        result: Result<Activation, PolicyErrors>,
    ) -> Result<Activation, PolicyErrors> {
        let Ok(Activation::Activated(version)) = &result else {
            return result;
        };
        let Some(store) = self.fleet_store() else {
            return result;
        };
        if version.origin == Origin::Shared {
            return result;
        }
        match publish_policy(store, self, version, rank(version)).await {
            Ok(Some(_)) => {
                self.published_seq.fetch_max(version.seq, Ordering::Relaxed);
                result
            }
            // Another replica's version, accepted later, is what the fleet runs.
            Ok(None) => Ok(Activation::Superseded(Arc::clone(version))),
            // The sync publishes it when Redis answers again.
            Err(_) => result,
        }
    }
}
