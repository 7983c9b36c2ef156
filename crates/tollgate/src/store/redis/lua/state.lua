-- Per-key context shared by the DECIDE and REFUND drivers: one table per distinct key of a
-- call, holding what was read and the tentative state the call's charges leave behind.
--
-- Hash layout (every algorithm but the sliding log): t = algorithm code, then x, y[, z] as
-- each twin documents; the buckets add l, p = the limit and period (µs) the state was written
-- under, which a decision under other params converts it from (gcra.lua, `converted`). A hash of another algorithm (a policy switched algorithm on a live key)
-- is an empty state, as in Rust; so is a ZSET (a sliding log) read by a hash algorithm and the
-- other way round. Any other Redis type at a key is an error, raised before anything is written.
--
-- A hash also holds b = the instant (µs) it was made, written once: a REFUND of a charge made
-- before it is of a counter Redis has since lost (flushed, restarted empty) and is dropped.
--
-- Every hash also records p = the period (µs) it was written under: its TTL follows from its
-- fields and p, so a write that leaves the expiry where it was skips PEXPIREAT (a window's
-- count within its window, a bucket within the same millisecond). A window hash written
-- before p was recorded gets a PEXPIREAT and its p on its next write.
--
-- Every write leaves both b and p in the hash (a hash made before b was recorded gets it on
-- its next write, as it gets p): a hash that holds p holds b. decide_single relies on that to
-- read one field fewer (each field of an HMGET reply costs Redis ~2,300 instructions); a hash
-- with t but no p may lack b, and goes to decide_request, which reads b.
--
-- Fields: key; kind = 'h' (hash or missing) or 'z' (ZSET or missing); born = b; tag, x, y, z = the
-- tentative state (tag 0 = empty, 2 = the sliding log), l, p = the params it was written under; base = the stored ZSET is part of the
-- log; T = cost appended to the log by this call; dirty = a transition was applied; ep = the
-- period of the last charge that applied one (its expires_at sets the TTL, as in Rust); h = the
-- HMGET reply (the stored fields' text), st = the stored algorithm, oe = the PEXPIREAT (ms)
-- the stored state was written with, when known (state_stored_ms).
--
-- Twins are built per call: EVALSHA runs the whole script body on every call, and creating a
-- closure costs ~30 ns plus a walk of the captured-variable list for each variable it captures
-- (Lua 5.1's luaF_findupval), so defining every function of every twin up front cost ~3 µs per
-- call. Each twin is a function without upvalues that takes its helpers as arguments and returns
-- its functions; the drivers build a twin (main-chunk code, no closure) the first time a call
-- meets its algorithm. Keep closures that capture many variables out of the main chunk.

-- The hash fields a decision reads, in this order: t, x, y, b, p, z, l. A fixed window needs
-- the first 5, a sliding counter 6, the buckets all 7 (`state_fields`).
local function state_fields(alg)
  if alg == 1 then
    return 5
  elseif alg == 3 then
    return 6
  end
  return 7
end

-- The HMGET reply of the first `read` fields (state_fields order) of `key`; an error reply
-- (a key of another type) as redis.pcall gives it.
local function state_hmget(key, read)
  if read == 5 then
    return redis.pcall('HMGET', key, 't', 'x', 'y', 'b', 'p')
  elseif read == 6 then
    return redis.pcall('HMGET', key, 't', 'x', 'y', 'b', 'p', 'z')
  end
  return redis.pcall('HMGET', key, 't', 'x', 'y', 'b', 'p', 'z', 'l')
end

-- Loads an HMGET reply of the first `read` fields (state_fields order), reading the rest when
-- the stored algorithm needs more (a key whose algorithm a policy switched). The reply is kept
-- (c.h): a write leaves out the fields whose text is unchanged.
local function state_load_hash(c, reply, read)
  c.kind, c.h = 'h', reply
  local tag = tonumber(reply[1]) or 0
  c.tag, c.st = tag, tag
  c.born = tonumber(reply[4])
  if tag == 0 then
    return
  end
  if read < 7 and state_fields(tag) > read then
    local rest = redis.call('HMGET', c.key, 'z', 'l')
    reply[6], reply[7] = rest[1], rest[2]
  end
  c.x, c.y, c.p = tonumber(reply[2]), tonumber(reply[3]), tonumber(reply[5])
  c.z, c.l = tonumber(reply[6]), tonumber(reply[7])
end

-- Raises the read error unless the key holds `other` (the other type tollgate writes).
local function state_other_type(c, reply, other)
  if redis.call('TYPE', c.key).ok ~= other then
    error(reply)
  end
end

-- Opens key `key` for a first charge of algorithm `alg`, reading it the way that algorithm does,
-- so the common case costs one command. The table is made with every field it can get, so
-- filling it in never grows it (a table that grows rehashes: about 7,000 instructions a
-- sliding log decision did). A sliding log's context is made with the fields its decisions
-- cache instead of a hash's, as false, which every reader takes as absent (a field set to nil
-- in a constructor holds no slot).
local function state_open(key, alg)
  if alg == 2 then
    local r = redis.pcall('ZRANGE', key, '-1', '-1', 'WITHSCORES')
    if not r.err then
      local c = { key = key, kind = 'z', tag = 2, base = true, T = 0, dirty = false, ep = false,
        denied = false, lread = false, lt = false, lend = false, fp = false, frank = false,
        fs = false, fc = false, ft = false, pmin = false, keep = false, rows = false }
      sliding_window_log_set_last(c, r)
      return c
    end
    local c = { key = key, kind = 'h', tag = 0, base = false, T = 0, dirty = false, x = nil,
      y = nil, z = nil, l = nil, p = nil, born = nil, ep = nil, h = nil, st = nil, oe = nil }
    state_other_type(c, r, 'hash')
    state_load_hash(c, redis.call('HMGET', key, 't', 'x', 'y', 'b', 'p', 'z', 'l'), 7)
    return c
  end
  local c = { key = key, kind = 'h', tag = 0, base = false, T = 0, dirty = false, x = nil,
    y = nil, z = nil, l = nil, p = nil, born = nil, ep = nil, h = nil, st = nil, oe = nil }
  local read = state_fields(alg)
  local r = state_hmget(key, read)
  if r.err then
    state_other_type(c, r, 'zset')
    c.kind, c.tag, c.base = 'z', 2, true
  else
    state_load_hash(c, r, read)
  end
  return c
end

-- State::expires_at of a hash state of algorithm `tag`; `ep` is the period of the charge that
-- wrote it (the windows' expiry depends on it).
local function state_expires_of(tag, x, y, z, ep)
  if tag == 1 then
    return fixed_window_expires(x, y, ep)
  elseif tag == 3 then
    return sliding_window_counter_expires(x, y, z, ep)
  elseif tag == 4 then
    return token_bucket_expires(y, z)
  elseif tag == 5 then
    return leaky_bucket_expires(x, y)
  end
  return gcra_expires(x, y)
end

-- The PEXPIREAT (ms) the key got when its stored state of algorithm `alg` was written, called
-- before the first transition of this call replaces the context's state; nil when unknown. A
-- writer's TTL follows from the state it wrote: for the buckets from their fields; for the
-- windows also from the period, known once a hash records its `p` (older ones do not).
local function state_stored_ms(c, alg)
  local tag = c.tag
  if c.kind ~= 'h' or tag ~= alg or tag == 2 or not c.x or not c.y then
    return nil
  end
  if tag == 1 or tag == 3 then
    if not c.p or (tag == 3 and not c.z) then
      return nil
    end
  elseif tag == 4 and not c.z then
    return nil
  end
  return div_ceil(state_expires_of(tag, c.x, c.y, c.z, c.p), 1000)
end

-- The text of the call's `now`, made once per call.
local state_now_value, state_now_text
local function state_int(v, now)
  if v ~= now then
    return int(v)
  end
  if state_now_value ~= now then
    state_now_value, state_now_text = now, int(now)
  end
  return state_now_text
end

-- Writes the context's hash state with its TTL, or deletes the key when the state has already
-- expired at `now` (it then decides exactly like an empty one). One HSET of the fields whose
-- text changed (all of them, and b, when the hash is new or held another algorithm), then
-- PEXPIREAT unless the key already expires at that instant (`c.oe`, see state_stored_ms).
local state_write = {}
local function state_commit_hash(c, now)
  local key = c.key
  if c.kind == 'z' then
    redis.call('DEL', key) -- a sliding log replaced by this call
  end
  local tag = c.tag
  local expires = state_expires_of(tag, c.x, c.y, c.z, c.ep)
  if expires <= now then
    if c.kind ~= 'z' then
      redis.call('DEL', key)
    end
    return
  end
  -- The stored text of this algorithm's fields, when the hash holds this algorithm.
  local h = c.kind == 'h' and c.st == tag and c.h
  local w, n = state_write, 0
  if not h then
    w[1], w[2], n = 't', tag, 2
  end
  local v = state_int(c.x, now)
  if not h or v ~= h[2] then
    w[n + 1], w[n + 2], n = 'x', v, n + 2
  end
  v = state_int(c.y, now)
  if not h or v ~= h[3] then
    w[n + 1], w[n + 2], n = 'y', v, n + 2
  end
  if tag ~= 1 and c.z then
    v = state_int(c.z, now)
    if not h or v ~= h[6] then
      w[n + 1], w[n + 2], n = 'z', v, n + 2
    end
  end
  if c.p then
    v = state_int(c.p, now)
    if not h or v ~= h[5] then
      w[n + 1], w[n + 2], n = 'p', v, n + 2
    end
  end
  if tag >= 4 and c.l then
    v = state_int(c.l, now)
    if not h or v ~= h[7] then
      w[n + 1], w[n + 2], n = 'l', v, n + 2
    end
  end
  if not c.born or c.kind == 'z' then
    w[n + 1], w[n + 2], n = 'b', state_int(now, now), n + 2
  end
  if n > 0 then
    redis.call('HSET', key, unpack(w, 1, n))
  end
  local ms = div_ceil(expires, 1000)
  if ms ~= c.oe then
    redis.call('PEXPIREAT', key, int(ms))
  end
end

-- Builds the twin of algorithm `alg` the first time a call meets it: Redis re-creates a script's
-- functions on every call, so only the algorithms a call uses are built.
local function state_build_twin(alg)
  if alg == 1 then
    if not fixed_window_decide then
      fixed_window_decide, fixed_window_expires, fixed_window_refund =
        fixed_window_twin(divmod, nonneg)
    end
  elseif alg == 2 then
    if not sliding_window_log_decide then
      sliding_window_log_set_last, sliding_window_log_decide, sliding_window_log_apply,
        sliding_window_log_prepare, sliding_window_log_commit,
        sliding_window_log_refund_prepare, sliding_window_log_refund_commit =
        sliding_window_log_twin(fmod, format, sub, int, nonneg, div_ceil)
    end
  elseif alg == 3 then
    if not sliding_window_counter_decide then
      sliding_window_counter_decide, sliding_window_counter_expires,
        sliding_window_counter_refund = sliding_window_counter_twin(divmod, muldivmod, nonneg)
    end
  elseif alg == 4 or alg == 5 or alg == 6 then
    if not meter_decide then
      meter_ahead, meter_decide, meter_refund, meter_converted =
        meter_twin(fmod, divmod, muldivmod, ceil_us)
    end
    if alg == 4 and not token_bucket_decide then
      token_bucket_decide, token_bucket_expires, token_bucket_refund =
        token_bucket_twin(meter_ahead, meter_decide, meter_refund, ceil_us, meter_converted)
    elseif alg == 5 and not leaky_bucket_decide then
      leaky_bucket_decide, leaky_bucket_expires, leaky_bucket_refund =
        leaky_bucket_twin(meter_ahead, meter_decide, meter_refund, ceil_us, meter_converted)
    elseif alg == 6 and not gcra_decide then
      gcra_decide, gcra_expires, gcra_refund =
        gcra_twin(meter_ahead, meter_decide, meter_refund, ceil_us, meter_converted)
    end
  end
end

-- The context of charge i, whose key is KEYS[first + i]: the one an earlier charge of the same
-- request opened for the same key, or a new one (recorded in `opened`). Stored in contexts[i].
local function state_context(first, i, alg, contexts, opened)
  local key = call_keys[first + i]
  local c
  for j = 1, i - 1 do
    if call_keys[first + j] == key then
      c = contexts[j]
      break
    end
  end
  if not c then
    c = state_open(key, alg)
    opened[#opened + 1] = c
  end
  contexts[i] = c
  return c
end
