//! The running policy and the runtime overrides, shared through Redis by every replica.
//!
//! The policy is one hash, `tg:{tollgate-policy}:current`, holding the last published version:
//! `seq` (raised by every publish), `hash` (the sources' content hash) and `doc` (the sources as
//! JSON). A replica publishes each version it activates itself and adopts a newer `seq`
//! published by another.
//!
//! The overrides are shared beside it (see [`super::shared_overrides`]).
//!
//! The hash also holds an `epoch`, set when it is created: a hash Redis lost and a replica
//! made again is told apart from the one before even at the same `seq`.
//!
//! The keys' TTL (30 days) is renewed on every publish and every check, so they live as long
//! as some replica runs and never forever.

use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::time::Instant;

use super::error::store_error;
use super::slot;
use super::store::RedisStore;
use super::timeout::within;
use crate::store::{RedisCall, Refusal, StoreError};

/// The running policy.
pub const POLICY_KEY: &str = "tg:{tollgate-policy}:current";
/// Where versions before the merged format kept the overrides, as one list: read once, to carry
/// them over, while the merged hash does not exist yet.
pub const LEGACY_OVERRIDES_KEY: &str = "tg:{tollgate-policy}:overrides";
pub(super) const TTL: Duration = Duration::from_secs(30 * 86_400);

/// Publishes atomically: raise `seq`, store the version, renew the TTL, unless the stored
/// version was accepted later than this one (`accepted_at`, µs): a version published late (its
/// replica lost Redis for a while, or the call was held up) never replaces a newer one.
/// `epoch` is set when the hash is created, so a hash Redis lost and a replica made again never
/// looks like the one before, even at the same `seq`. Returns `{published (1/0), epoch, seq}`.
const PUBLISH: &str = r"
local stored = tonumber(redis.call('HGET', KEYS[1], 'accepted_at') or '0') or 0
if stored > tonumber(ARGV[5]) then
  return {0, redis.call('HGET', KEYS[1], 'epoch') or '', tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')}
end
redis.call('HSETNX', KEYS[1], 'epoch', ARGV[4])
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[1], 'hash', ARGV[1], 'doc', ARGV[2], 'accepted_at', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, redis.call('HGET', KEYS[1], 'epoch'), seq}
";

/// Which publication of a shared document: the hash's `epoch` (new when the hash is made
/// again) and its `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// Set when the hash is created.
    pub epoch: String,
    /// Raised by every change.
    pub seq: u64,
}

/// A random epoch for a hash this call may create.
pub(super) fn fresh_epoch() -> String {
    format!("{:016x}", crate::random::random_u64())
}

/// The published version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedPolicy {
    /// Which publication.
    pub stamp: Stamp,
    /// Content hash of the sources.
    pub hash: String,
    /// The sources, as the JSON the publisher wrote.
    pub doc: String,
}

impl RedisStore {
    pub(super) fn policy_connection(&self) -> Result<ConnectionManager, StoreError> {
        let slot = slot::crc16(b"tollgate-policy") % slot::SLOTS;
        let (node, _) = self
            .topology
            .breaker_for(slot)
            .ok_or(StoreError::NotCalled(Refusal::SlotMapUnknown))?;
        self.connection_to(&node)
    }

    pub(super) async fn policy_call<T: redis::FromRedisValue>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        // Not on the request path: more patience than a decision gets.
        let deadline = Instant::now() + self.options.command_timeout.max(Duration::from_secs(1));
        within(deadline, RedisCall::Policy, async {
            call.await.map_err(store_error)
        })
        .await
    }

    /// Reads `key` with `read`, renewing its TTL in the same round trip when `renew`.
    async fn read<T: redis::FromRedisValue>(
        &self,
        key: &str,
        read: redis::Cmd,
        renew: bool,
    ) -> Result<T, StoreError> {
        let mut connection = self.policy_connection()?;
        let mut pipe = redis::pipe();
        pipe.add_command(read);
        if renew {
            pipe.cmd("PEXPIRE")
                .arg(key)
                .arg(TTL.as_millis() as u64)
                .ignore();
        }
        let (value,): (T,) = self.policy_call(pipe.query_async(&mut connection)).await?;
        Ok(value)
    }

    /// The shared policy, if one was published; renews its TTL.
    pub async fn shared_policy(&self) -> Result<Option<SharedPolicy>, StoreError> {
        self.shared_doc(POLICY_KEY, true).await
    }

    /// The overrides an earlier version shared as one list ([`LEGACY_OVERRIDES_KEY`]), read once
    /// to carry them over: `doc` holds them; the TTL is left to run out.
    pub async fn legacy_overrides(&self) -> Result<Option<SharedPolicy>, StoreError> {
        self.shared_doc(LEGACY_OVERRIDES_KEY, false).await
    }

    async fn shared_doc(&self, key: &str, renew: bool) -> Result<Option<SharedPolicy>, StoreError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(key).arg("seq").arg("hash").arg("doc").arg("epoch");
        let (seq, hash, doc, epoch): (Option<u64>, Option<String>, Option<String>, Option<String>) =
            self.read(key, cmd, renew).await?;
        let (Some(seq), Some(hash), Some(doc)) = (seq, hash, doc) else {
            return Ok(None);
        };
        let epoch = epoch.unwrap_or_default();
        Ok(Some(SharedPolicy {
            stamp: Stamp { epoch, seq },
            hash,
            doc,
        }))
    }

    /// Publishes the policy version `doc` (content hash `hash`) accepted at `accepted_at`;
    /// returns its stamp, or `None` when the shared version was accepted later and stays.
    pub async fn publish_policy(
        &self,
        hash: &str,
        doc: &str,
        accepted_at: tollgate_core::Timestamp,
    ) -> Result<Option<Stamp>, StoreError> {
        let mut connection = self.policy_connection()?;
        let script = redis::Script::new(PUBLISH);
        let mut invocation = script.prepare_invoke();
        invocation
            .key(POLICY_KEY)
            .arg(hash)
            .arg(doc)
            .arg(TTL.as_millis() as u64)
            .arg(fresh_epoch())
            .arg(accepted_at.as_micros());
        let (published, epoch, seq): (i64, String, u64) = self
            .policy_call(invocation.invoke_async(&mut connection))
            .await?;
        Ok((published == 1).then_some(Stamp { epoch, seq }))
    }
}
