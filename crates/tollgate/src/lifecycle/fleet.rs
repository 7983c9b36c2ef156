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
//! publishes it when Redis is back. Reading and publishing the fleet's version is in
//! `fleet/redis.rs` (the `redis` feature); without it there is no fleet.

use super::{Activation, Lifecycle, Origin, PromoteError, RollbackError};
use crate::policy::PolicyErrors;

#[cfg(feature = "redis")]
mod redis;

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
}

/// Without the `redis` feature there is no fleet: a command is decided against this replica's
/// version, and nothing is published.
#[cfg(not(feature = "redis"))]
impl Lifecycle {
    /// No fleet's policy to read.
    async fn fleet_hash(&self) -> Option<String> {
        None
    }

    /// Nowhere to publish: the activation as it is.
    async fn publish_now(
        &self,
        result: Result<Activation, PolicyErrors>,
    ) -> Result<Activation, PolicyErrors> {
        result
    }
}
