//! The runtime overrides, shared through Redis by every replica.
//!
//! They are one hash, `tg:{tollgate-policy}:overrides:2`, merged rather than replaced: one
//! field per override target (domain, rule and entries) holding `id expires_at set_at json`,
//! and `seq`, raised by every change; of two overrides set for one target, the one set later
//! stays. A replica sends only its own changes (set this target, delete this id), which one
//! script applies, so changes made on different replicas at the same time all survive.
//!
//! Beside the hash, so that a replica reads only what changed since it last looked rather than
//! every override: `:changed`, a sorted set of the targets by the `seq` of their last change;
//! `:expiring`, the targets that expire, by when; and `:logged`, the `seq` of the last change
//! logged in `:changed`. A replica of an earlier version changes the hash without them (it
//! reads and merges the whole hash, as it always did): its change leaves `:logged` behind
//! `seq`, so readers read the whole hash until the next change made by this version logs every
//! target again. Expired overrides are dropped by the merge.
//!
//! Each hash also holds an `epoch`, set when it is created: a hash Redis lost and a replica
//! made again is told apart from the one before even at the same `seq`.

use super::RedisStore;
use super::shared_policy::{Stamp, TTL, fresh_epoch};
use crate::store::StoreError;

/// The runtime overrides (`:2`: merged per target).
const OVERRIDES_KEY: &str = "tg:{tollgate-policy}:overrides:2";
/// Each target by the `seq` of its last change.
const CHANGED_KEY: &str = "tg:{tollgate-policy}:overrides:2:changed";
/// Each target that expires, by its expiry (µs).
const EXPIRING_KEY: &str = "tg:{tollgate-policy}:overrides:2:expiring";
/// The `seq` of the last change logged in [`CHANGED_KEY`].
const LOGGED_KEY: &str = "tg:{tollgate-policy}:overrides:2:logged";

/// What both scripts share: logging a target's change, and the answer, `{{existed, epoch, seq,
/// whole}, {field, value, ...}}`, `whole` 1 when the fields are every override, 0 when they
/// are those changed since `since_seq`, and the targets in `refused` (a merge's changes it did
/// not take), with what each holds now (a value `''` where the target holds nothing now).
const COMMON: &str = r"
local function expires_of(value)
  return tonumber(string.match(value, '^%d+ (%d+) ')) or 0
end
local function log(field, value, seq)
  redis.call('ZADD', KEYS[2], seq, field)
  local e = expires_of(value)
  if e > 0 then
    redis.call('ZADD', KEYS[3], e, field)
  else
    redis.call('ZREM', KEYS[3], field)
  end
end
local function renew(ttl)
  for k = 1, 4 do redis.call('PEXPIRE', KEYS[k], ttl) end
end
local function answer(existed, epoch, seq, since_epoch, since_seq, refused)
  local fields = {}
  if existed == 1 and since_seq ~= '' and since_epoch == epoch then
    local changed = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. since_seq, '+inf')
    local named = {}
    for from = 1, #changed, 1000 do
      local to = math.min(from + 999, #changed)
      local values = redis.call('HMGET', KEYS[1], unpack(changed, from, to))
      for i = from, to do
        fields[#fields + 1] = changed[i]
        fields[#fields + 1] = values[i - from + 1] or ''
        named[changed[i]] = true
      end
    end
    for _, field in ipairs(refused or {}) do
      if not named[field] then
        named[field] = true
        fields[#fields + 1] = field
        fields[#fields + 1] = redis.call('HGET', KEYS[1], field) or ''
      end
    end
    return {{existed, epoch, seq, 0}, fields}
  end
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if all[i] ~= 'seq' and all[i] ~= 'epoch' then
      fields[#fields + 1] = all[i]
      fields[#fields + 1] = all[i + 1]
    end
  end
  return {{existed, epoch, seq, 1}, fields}
end
";

/// Applies override changes (KEYS: the four keys). ARGV: the TTL in ms, the time in µs, an
/// epoch for a new hash, the epoch and `seq` the caller last saw (`''` for none), then per
/// change `S field value` (set the target `field`, unless it holds something set later) or
/// `D field tombstone` (the target's override, if it is still the tombstone's id or there is
/// none, becomes the tombstone, so an older set arriving late cannot bring it back). A value is
/// `id expires_at_us set_at_us json`, `expires_at_us` 0 for none; a tombstone is `id
/// expires_at_us deleted_at_us -`. Values expired at that time are dropped. Answers as
/// [`COMMON`] says, `existed` 0 when the hash had to be made (Redis lost it, or none was ever
/// shared), naming the targets of the changes it refused too: the caller may have seen what
/// refused them already (a read adopted it, with the caller's own change kept over it as not
/// yet shared), and without them it would keep its own change for good.
const MERGE: &str = r"
local existed = redis.call('HEXISTS', KEYS[1], 'seq')
if existed == 0 then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
end
redis.call('HSETNX', KEYS[1], 'epoch', ARGV[3])
local now = tonumber(ARGV[2])
local prev = redis.call('HGET', KEYS[1], 'seq') or '0'
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
if existed == 1 and (redis.call('GET', KEYS[4]) or '') ~= prev then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if all[i] ~= 'seq' and all[i] ~= 'epoch' then log(all[i], all[i + 1], seq) end
  end
end
local function set_at(value)
  return tonumber(string.match(value, '^%d+ %d+ (%d+) '))
end
local refused = {}
for i = 6, #ARGV, 3 do
  local field, value = ARGV[i + 1], ARGV[i + 2]
  local stored = redis.call('HGET', KEYS[1], field)
  local take
  if ARGV[i] == 'S' then
    take = not stored or (set_at(stored) or 0) <= (set_at(value) or 0)
  else
    take = not stored or string.match(stored, '^(%d+) ') == string.match(value, '^(%d+) ')
  end
  if take then
    redis.call('HSET', KEYS[1], field, value)
    log(field, value, seq)
  else
    refused[#refused + 1] = field
  end
end
redis.call('SET', KEYS[4], seq)
for _, field in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  local stored = redis.call('HGET', KEYS[1], field)
  local e = stored and expires_of(stored) or 0
  if e > now then
    redis.call('ZADD', KEYS[3], e, field)
  else
    if e > 0 then
      redis.call('HDEL', KEYS[1], field)
      redis.call('ZREM', KEYS[2], field)
    end
    redis.call('ZREM', KEYS[3], field)
  end
end
renew(ARGV[1])
return answer(existed, redis.call('HGET', KEYS[1], 'epoch'), seq, ARGV[4], ARGV[5], refused)
";

/// Reads the shared overrides (KEYS: the four keys) and renews their TTL. ARGV: the TTL in ms,
/// the epoch and `seq` the caller last saw (`''` for none). Answers as [`COMMON`] says, with
/// no fields when nothing changed since, and `existed` 0 when nothing is shared.
const READ: &str = r"
local head = redis.call('HMGET', KEYS[1], 'seq', 'epoch')
local seq, epoch = head[1], head[2] or ''
if not seq then
  return {{0, '', 0, 1}, {}}
end
renew(ARGV[1])
if epoch == ARGV[2] and seq == ARGV[3] then
  return {{1, epoch, tonumber(seq), 0}, {}}
end
if (redis.call('GET', KEYS[4]) or '') ~= seq then
  return answer(1, epoch, tonumber(seq), '', '')
end
return answer(1, epoch, tonumber(seq), ARGV[2], ARGV[3])
";

/// One override as shared: its target (the hash field) and its value (see [`MERGE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedOverride {
    /// Domain, rule and entries, encoded; one override per target.
    pub target: String,
    /// `id expires_at_us set_at_us json`; empty, in a change, where the target holds nothing
    /// any more.
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

/// The shared overrides as read: the stamp of their last change, and every override or only
/// those changed since the stamp the reader gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedOverrides {
    /// Which change.
    pub stamp: Stamp,
    /// Whether `overrides` is every override stored (else the targets changed since).
    pub whole: bool,
    /// Every override stored, or the targets changed.
    pub overrides: Vec<SharedOverride>,
}

/// A script's answer: `(existed, epoch, seq, whole)` and the fields.
type Answer = ((i64, String, u64, i64), Vec<(String, String)>);

impl SharedOverrides {
    fn from_answer(((existed, epoch, seq, whole), fields): Answer) -> (bool, Self) {
        let overrides = fields
            .into_iter()
            .map(|(target, value)| SharedOverride { target, value })
            .collect();
        let read = SharedOverrides {
            stamp: Stamp { epoch, seq },
            whole: whole == 1,
            overrides,
        };
        (existed == 1, read)
    }
}

/// The arguments naming what the caller last saw.
fn since(seen: Option<&Stamp>) -> (String, String) {
    seen.map_or((String::new(), String::new()), |s| {
        (s.epoch.clone(), s.seq.to_string())
    })
}

impl RedisStore {
    fn overrides_script(&self, body: &str) -> redis::Script {
        redis::Script::new(&format!("{COMMON}{body}"))
    }

    /// The shared overrides, if any were ever shared, renewing their TTL: only the targets
    /// changed since `seen` when Redis can tell them (nothing at all when `seen` is current),
    /// else every override.
    pub async fn shared_overrides(
        &self,
        seen: Option<&Stamp>,
    ) -> Result<Option<SharedOverrides>, StoreError> {
        let mut connection = self.policy_connection()?;
        let script = self.overrides_script(READ);
        let (epoch, seq) = since(seen);
        let mut invocation = script.prepare_invoke();
        invocation
            .key(OVERRIDES_KEY)
            .key(CHANGED_KEY)
            .key(EXPIRING_KEY)
            .key(LOGGED_KEY)
            .arg(TTL.as_millis() as u64)
            .arg(epoch)
            .arg(seq);
        let answer: Answer = self
            .policy_call(invocation.invoke_async(&mut connection))
            .await?;
        let (existed, read) = SharedOverrides::from_answer(answer);
        Ok(existed.then_some(read))
    }

    /// Applies `changes` to the shared overrides, dropping those expired at `now`; returns
    /// whether the hash existed before (false: Redis lost it, or none was ever shared) and
    /// what changed since `seen` (every override when Redis cannot tell).
    pub async fn merge_overrides(
        &self,
        changes: &[SharedOverrideChange],
        now: tollgate_core::Timestamp,
        seen: Option<&Stamp>,
    ) -> Result<(bool, SharedOverrides), StoreError> {
        let mut connection = self.policy_connection()?;
        let script = self.overrides_script(MERGE);
        let (epoch, seq) = since(seen);
        let mut invocation = script.prepare_invoke();
        invocation
            .key(OVERRIDES_KEY)
            .key(CHANGED_KEY)
            .key(EXPIRING_KEY)
            .key(LOGGED_KEY)
            .arg(TTL.as_millis() as u64)
            .arg(now.as_micros())
            .arg(fresh_epoch())
            .arg(epoch)
            .arg(seq);
        for change in changes {
            match change {
                SharedOverrideChange::Set(o) => invocation.arg("S").arg(&o.target).arg(&o.value),
                SharedOverrideChange::Delete(o) => invocation.arg("D").arg(&o.target).arg(&o.value),
            };
        }
        let answer: Answer = self
            .policy_call(invocation.invoke_async(&mut connection))
            .await?;
        Ok(SharedOverrides::from_answer(answer))
    }
}
