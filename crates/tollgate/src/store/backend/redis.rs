//! What the Redis variant of [`StoreBackend`] does alone: opening it, its extras (metrics,
//! batching figures, loading the scripts ahead of the first decisions), and granting leases.
//! Built with the `redis` feature.

use std::sync::Arc;

use super::{Extras, StoreBackend};
use crate::clock::SharedClock;
use crate::store::contract::Granting;
use crate::store::redis::{RedisOptions, RedisStore};
use crate::store::{StoreError, StoreUrl};

impl StoreBackend {
    /// Connects to the Redis server or cluster at `url` (any form but memory).
    pub(super) async fn open_redis(
        url: &StoreUrl,
        options: RedisOptions,
        clock: SharedClock,
    ) -> Result<Self, StoreError> {
        let redis = RedisStore::connect(url, options, clock).await?;
        Ok(StoreBackend::Redis(Arc::new(redis)))
    }

    /// The Redis store, if that is the backend: shared between replicas, so the prefilter and
    /// local budgets apply, and the one that reserves and gives back leases.
    pub fn redis(&self) -> Option<&Arc<RedisStore>> {
        match self {
            StoreBackend::Memory(_) => None,
            StoreBackend::Redis(r) => Some(r),
        }
    }
}

impl Extras for RedisStore {
    fn render_metrics(&self, out: &mut String) {
        RedisStore::render_metrics(self, out);
    }

    fn batch_stats(&self) -> Option<(u64, u64)> {
        RedisStore::batch_stats(self)
    }

    async fn warm_up(&self) {
        if let Err(e) = self.load_scripts().await {
            tracing::warn!(error = %e, "Could not load the decision scripts ahead of the first decisions");
        }
    }
}

/// Leases come from Redis: the memory store grants them too, but on one process the hot-keys
/// layer has no use for them, and no other layer takes any yet.
impl Granting for StoreBackend {
    type Grantor = RedisStore;

    fn grantor(&self) -> Option<&Arc<RedisStore>> {
        self.redis()
    }
}
