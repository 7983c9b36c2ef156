//! Commands (push, reload, rollback, promote) decided against the fleet's policy.
//!
//! A replica sharing its policy through Redis may not have adopted the version another
//! replica published a moment ago. Were a command decided against the replica's own version
//! alone, a push of the texts it still runs would answer "unchanged" and publish nothing, and
//! the fleet would then settle on the other version. Here a command first reads the version
//! the fleet runs (the shared one in Redis): texts the fleet does not run are a new version,
//! published before the command answers, and texts it does run are unchanged (and adopted
//! here at once). So the answer a command returns is what the fleet runs.
//!
//! Without a running policy sync (the memory store, or no sync asked for), or while Redis does
//! not answer, a command is decided against this replica's version as before, and the sync
//! publishes it when Redis is back.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::warn;

use super::sync::{publish_policy, rank};
use super::{Activation, Lifecycle, Origin, PromoteError, RollbackError};
use crate::policy::PolicyErrors;
use crate::store::{RedisStore, StoreBackend};

impl Lifecycle {
    /// [`Lifecycle::activate`] (a push) decided against the fleet's policy; a new version is
    /// published before this returns. [`Activation::Superseded`] when another replica's
    /// version, accepted later, is shared instead.
    pub async fn fleet_activate(
        &self,
        sources: Vec<(String, String)>,
        origin: Origin,
    ) -> Result<Activation, PolicyErrors> {
        let fleet = self.fleet_hash().await;
        let result = self.activate_against(sources, origin, None, fleet.as_deref());
        self.publish_now(result).await
    }

    /// [`Lifecycle::reload`] decided against the fleet's policy.
    pub async fn fleet_reload(&self) -> Result<Activation, PolicyErrors> {
        let fleet = self.fleet_hash().await;
        let result = match self.read_for_reload() {
            Some(Ok(sources)) => {
                self.activate_against(sources, Origin::File, None, fleet.as_deref())
            }
            Some(Err(errors)) => Err(errors),
            None => Ok(Activation::Unchanged(self.current())),
        };
        self.publish_now(result).await
    }

    /// [`Lifecycle::rollback`] decided against the fleet's policy.
    pub async fn fleet_rollback(&self, to: Option<u64>) -> Result<Activation, RollbackError> {
        let fleet = self.fleet_hash().await;
        let result = self.rollback_against(to, fleet.as_deref());
        match result {
            Ok(a) => Ok(self
                .publish_now(Ok(a))
                .await
                .map_err(RollbackError::Rejected)?),
            Err(e) => Err(e),
        }
    }

    /// [`Lifecycle::promote`] decided against the fleet's policy.
    pub async fn fleet_promote(&self) -> Result<Activation, PromoteError> {
        let fleet = self.fleet_hash().await;
        let activation = self.promote_against(fleet.as_deref())?;
        self.publish_now(Ok(activation))
            .await
            .map_err(PromoteError::Rejected)
    }

    /// The version a command published itself, which the sync need not publish again.
    pub(super) fn published_by_command(&self) -> u64 {
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
    async fn fleet_hash(&self) -> Option<String> {
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
    async fn publish_now(
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
