//! The running policy and the runtime overrides, shared through Redis by every replica.
//!
//! The policy is one hash, `tg:{tollgate-policy}:current`, holding the last published version:
//! `seq` (raised by every publish), `hash` (the sources' content hash) and `doc` (the sources as
//! JSON). A replica publishes each version it activates itself and adopts a newer `seq`
//! published by another.
//!
//! The overrides are one hash too, `tg:{tollgate-policy}:overrides:2`, but merged rather than
//! replaced: one field per override target (domain, rule and entries) holding `id expires_at
//! set_at json`, and `seq`, raised by every change; of two overrides set for one target, the
//! one set later stays. A replica sends only its own changes (set this
//! target, delete this id), which one script applies, so changes made on different replicas at
//! the same time all survive. Expired overrides are dropped by the same script.
//!
//! Each hash also holds an `epoch`, set when it is created: a hash Redis lost and a replica
//! made again is told apart from the one before even at the same `seq`.
//!
//! The keys' TTL (30 days) is renewed on every publish and every check, so they live as long
//! as some replica runs and never forever.

use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::time::Instant;

use super::{RedisStore, slot, store_error, within};
use crate::store::StoreError;

/// The running policy.
pub const POLICY_KEY: &str = "tg:{tollgate-policy}:current";
/// The runtime overrides (`:2`: merged per target).
const OVERRIDES_KEY: &str = "tg:{tollgate-policy}:overrides:2";
/// Where versions before the merged format kept the overrides, as one list: read once, to carry
/// them over, while the merged hash does not exist yet.
pub const LEGACY_OVERRIDES_KEY: &str = "tg:{tollgate-policy}:overrides";
const TTL: Duration = Duration::from_secs(30 * 86_400);

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
fn fresh_epoch() -> String {
    format!("{:016x}", crate::random::random_u64())
}

/// Applies override changes and answers `{existed, the whole hash}`, `existed` 0 when the hash
/// had to be made (Redis lost it, or none was ever shared). ARGV: the TTL in ms, the time in µs,
/// an epoch for a new hash, then per change `S field value` (set the target `field`, unless it
/// holds something set later) or `D field tombstone` (the target's override, if it is still the
/// tombstone's id or there is none, becomes the tombstone, so an older set arriving late cannot
/// bring it back). A value is `id expires_at_us set_at_us json`, `expires_at_us` 0 for none; a
/// tombstone is `id expires_at_us deleted_at_us -`. Values expired at that time are dropped.
const MERGE_OVERRIDES: &str = r"
local existed = redis.call('HEXISTS', KEYS[1], 'seq')
redis.call('HSETNX', KEYS[1], 'epoch', ARGV[3])
local now = tonumber(ARGV[2])
local function set_at(value)
  return tonumber(string.match(value, '^%d+ %d+ (%d+) '))
end
for i = 4, #ARGV, 3 do
  local field, value = ARGV[i + 1], ARGV[i + 2]
  if ARGV[i] == 'S' then
    local stored = redis.call('HGET', KEYS[1], field)
    if not stored or (set_at(stored) or 0) <= (set_at(value) or 0) then
      redis.call('HSET', KEYS[1], field, value)
    end
  else
    local stored = redis.call('HGET', KEYS[1], field)
    if not stored or string.match(stored, '^(%d+) ') == string.match(value, '^(%d+) ') then
      redis.call('HSET', KEYS[1], field, value)
    end
  end
end
redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
local all = redis.call('HGETALL', KEYS[1])
local kept = {}
for i = 1, #all, 2 do
  local expires = tonumber(string.match(all[i + 1], '^%d+ (%d+) '))
  if all[i] ~= 'seq' and all[i] ~= 'epoch' and expires and expires > 0 and expires <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    kept[#kept + 1] = all[i]
    kept[#kept + 1] = all[i + 1]
  end
end
return {existed, kept}
";

/// One override as shared: its target (the hash field) and its value (see `MERGE_OVERRIDES`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedOverride {
    /// Domain, rule and entries, encoded; one override per target.
    pub target: String,
    /// `id expires_at_us set_at_us json`.
    pub value: String,
}

/// One change to the shared overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedOverrideChange {
    /// Store this override at its target.
    Set(SharedOverride),
    /// Replace the override at its target with this tombstone, if it is still the tombstone's
    /// id (or there is none).
    Delete(SharedOverride),
}

/// The shared overrides: the stamp of their last change, and every override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedOverrides {
    /// Which change.
    pub stamp: Stamp,
    /// Every override stored.
    pub overrides: Vec<SharedOverride>,
}

impl SharedOverrides {
    /// Reads an `HGETALL` reply; `None` when there is no `seq` (nothing shared).
    fn from_fields(fields: Vec<(String, String)>) -> Option<Self> {
        let (mut seq, mut epoch) = (None, String::new());
        let mut overrides = Vec::with_capacity(fields.len());
        for (field, value) in fields {
            match field.as_str() {
                "seq" => seq = value.parse().ok(),
                "epoch" => epoch = value,
                _ => overrides.push(SharedOverride {
                    target: field,
                    value,
                }),
            }
        }
        Some(SharedOverrides {
            stamp: Stamp { epoch, seq: seq? },
            overrides,
        })
    }
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
        let deadline = Instant::now() + self.options.command_timeout.max(Duration::from_secs(1));
        within(deadline, "redis policy", async {
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

    /// The shared overrides, if any were ever shared; renews their TTL.
    pub async fn shared_overrides(&self) -> Result<Option<SharedOverrides>, StoreError> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(OVERRIDES_KEY);
        let fields: Vec<(String, String)> = self.read(OVERRIDES_KEY, cmd, true).await?;
        Ok(SharedOverrides::from_fields(fields))
    }

    /// Applies `changes` to the shared overrides, dropping those expired at `now`; returns
    /// whether the hash existed before (false: Redis lost it, or none was ever shared) and
    /// them all, changed.
    pub async fn merge_overrides(
        &self,
        changes: &[SharedOverrideChange],
        now: tollgate_core::Timestamp,
    ) -> Result<(bool, SharedOverrides), StoreError> {
        let mut connection = self.policy_connection()?;
        let script = redis::Script::new(MERGE_OVERRIDES);
        let mut invocation = script.prepare_invoke();
        invocation
            .key(OVERRIDES_KEY)
            .arg(TTL.as_millis() as u64)
            .arg(now.as_micros())
            .arg(fresh_epoch());
        for change in changes {
            match change {
                SharedOverrideChange::Set(o) => invocation.arg("S").arg(&o.target).arg(&o.value),
                SharedOverrideChange::Delete(o) => invocation.arg("D").arg(&o.target).arg(&o.value),
            };
        }
        let (existed, fields): (i64, Vec<(String, String)>) = self
            .policy_call(invocation.invoke_async(&mut connection))
            .await?;
        let merged = SharedOverrides::from_fields(fields)
            .ok_or_else(|| StoreError::InvalidData("the merged overrides have no seq".into()))?;
        Ok((existed == 1, merged))
    }
}
