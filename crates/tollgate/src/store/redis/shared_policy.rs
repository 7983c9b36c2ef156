//! The running policy and the runtime overrides, shared through Redis by every replica.
//!
//! One hash per document (`tg:{tollgate-policy}:current` for the policy,
//! `tg:{tollgate-policy}:overrides` for the overrides) holds the last published version: `seq` (raised by
//! every publish), `hash` (the sources' content hash) and `doc` (the sources as JSON). A replica
//! publishes each version it activates itself and adopts a newer `seq` published by another.
//! The key's TTL (30 days) is renewed on every publish and every check, so it lives as long as
//! some replica runs and never forever.

use std::time::Duration;

use redis::aio::ConnectionManager;

use super::{RedisStore, slot, store_error, unavailable};
use crate::store::StoreError;

/// The running policy.
pub const POLICY_KEY: &str = "tg:{tollgate-policy}:current";
/// The runtime overrides.
pub const OVERRIDES_KEY: &str = "tg:{tollgate-policy}:overrides";
const TTL: Duration = Duration::from_secs(30 * 86_400);

/// Publishes atomically: raise `seq`, store the version, renew the TTL.
const PUBLISH: &str = r"
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[1], 'hash', ARGV[1], 'doc', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return seq
";

/// The published version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedPolicy {
    /// Raised by every publish.
    pub seq: u64,
    /// Content hash of the sources.
    pub hash: String,
    /// The sources, as the JSON the publisher wrote.
    pub doc: String,
}

impl RedisStore {
    fn policy_connection(&self) -> Result<ConnectionManager, StoreError> {
        let slot = slot::crc16(b"tollgate-policy") % slot::SLOTS;
        let (node, _) = self
            .topology
            .breaker_for(slot)
            .ok_or_else(|| StoreError::NotCalled("cluster slot map not known yet".into()))?;
        self.connection_to(&node)
    }

    async fn policy_call<T: redis::FromRedisValue>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        // Not on the request path: more patience than a decision gets.
        let deadline = self.options.command_timeout.max(Duration::from_secs(1));
        match tokio::time::timeout(deadline, call).await {
            Ok(result) => result.map_err(store_error),
            Err(_) => Err(unavailable("redis policy", "deadline exceeded")),
        }
    }

    /// The document last published at `key` ([`POLICY_KEY`] or [`OVERRIDES_KEY`]), if any;
    /// renews its TTL.
    pub async fn shared_doc(&self, key: &str) -> Result<Option<SharedPolicy>, StoreError> {
        let mut connection = self.policy_connection()?;
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(key).arg("seq").arg("hash").arg("doc");
        let (seq, hash, doc): (Option<u64>, Option<String>, Option<String>) =
            self.policy_call(cmd.query_async(&mut connection)).await?;
        let (Some(seq), Some(hash), Some(doc)) = (seq, hash, doc) else {
            return Ok(None);
        };
        let mut renew = redis::cmd("PEXPIRE");
        renew.arg(key).arg(TTL.as_millis() as u64);
        let _: i64 = self.policy_call(renew.query_async(&mut connection)).await?;
        Ok(Some(SharedPolicy { seq, hash, doc }))
    }

    /// Publishes a document at `key`; returns its `seq`.
    pub async fn publish_doc(&self, key: &str, hash: &str, doc: &str) -> Result<u64, StoreError> {
        let mut connection = self.policy_connection()?;
        let script = redis::Script::new(PUBLISH);
        let mut invocation = script.prepare_invoke();
        invocation
            .key(key)
            .arg(hash)
            .arg(doc)
            .arg(TTL.as_millis() as u64);
        self.policy_call(invocation.invoke_async(&mut connection))
            .await
    }
}
