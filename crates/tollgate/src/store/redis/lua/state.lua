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
-- Fields: key; kind = 'h' (hash or missing) or 'z' (ZSET or missing); born = b; tag, x, y, z = the
-- tentative state (tag 0 = empty, 2 = the sliding log), l, p = the params it was written under; base = the stored ZSET is part of the
-- log; T = cost appended to the log by this call; dirty = a transition was applied; ep = the
-- period of the last charge that applied one (its expires_at sets the TTL, as in Rust).
--
-- Twins are built per call: EVALSHA runs the whole script body on every call, and creating a
-- closure costs ~30 ns plus a walk of the captured-variable list for each variable it captures
-- (Lua 5.1's luaF_findupval), so defining every function of every twin up front cost ~3 µs per
-- call. Each twin is a function without upvalues that takes its helpers as arguments and returns
-- its functions; the drivers build a twin (main-chunk code, no closure) the first time a call
-- meets its algorithm. Keep closures that capture many variables out of the main chunk.

local function state_load_hash(c, reply)
  c.kind = 'h'
  c.tag = tonumber(reply[1]) or 0
  c.x, c.y, c.z = tonumber(reply[2]), tonumber(reply[3]), tonumber(reply[4])
  c.born = tonumber(reply[5])
  c.l, c.p = tonumber(reply[6]), tonumber(reply[7])
end

-- Raises the read error unless the key holds `other` (the other type tollgate writes).
local function state_other_type(c, reply, other)
  if redis.call('TYPE', c.key).ok ~= other then
    error(reply)
  end
end

-- Opens key `key`, reading it the way its first charge's algorithm does (`as_log`), so the
-- common case costs one command.
local function state_open(key, as_log)
  local c = { key = key, kind = 'h', tag = 0, base = false, T = 0, dirty = false }
  if as_log then
    local r = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
    if r.err then
      state_other_type(c, r, 'hash')
      state_load_hash(c, redis.call('HMGET', key, 't', 'x', 'y', 'z', 'b', 'l', 'p'))
    else
      c.kind, c.tag, c.base = 'z', 2, true
      sliding_window_log_set_last(c, r)
    end
  else
    local r = redis.pcall('HMGET', key, 't', 'x', 'y', 'z', 'b', 'l', 'p')
    if r.err then
      state_other_type(c, r, 'zset')
      c.kind, c.tag, c.base = 'z', 2, true
    else
      state_load_hash(c, r)
    end
  end
  return c
end

-- State::expires_at of the context's hash state.
local function state_expires(c)
  local tag = c.tag
  if tag == 1 then
    return fixed_window_expires(c.x, c.y, c.ep)
  elseif tag == 3 then
    return sliding_window_counter_expires(c.x, c.y, c.z, c.ep)
  elseif tag == 4 then
    return token_bucket_expires(c.y, c.z)
  elseif tag == 5 then
    return leaky_bucket_expires(c.x, c.y)
  end
  return gcra_expires(c.x, c.y)
end

-- Writes the context's hash state with its TTL, or deletes the key when the state has already
-- expired at `now` (it then decides exactly like an empty one).
local function state_commit_hash(c, now)
  local key = c.key
  if c.kind == 'z' then
    redis.call('DEL', key) -- a sliding log replaced by this call
  end
  local expires = state_expires(c)
  if expires <= now then
    if c.kind ~= 'z' then
      redis.call('DEL', key)
    end
    return
  end
  -- One HSET: b too when the hash is new (a ZSET it replaces was deleted above).
  local new = not c.born or c.kind == 'z'
  local tag = c.tag
  if tag >= 4 then
    if new then
      redis.call('HSET', key, 't', tag, 'x', c.x, 'y', c.y, 'z', c.z, 'l', c.l, 'p', c.p, 'b',
        int(now))
    else
      redis.call('HSET', key, 't', tag, 'x', c.x, 'y', c.y, 'z', c.z, 'l', c.l, 'p', c.p)
    end
  elseif tag ~= 1 and c.z then
    if new then
      redis.call('HSET', key, 't', c.tag, 'x', c.x, 'y', c.y, 'z', c.z, 'b', int(now))
    else
      redis.call('HSET', key, 't', c.tag, 'x', c.x, 'y', c.y, 'z', c.z)
    end
  elseif new then
    redis.call('HSET', key, 't', c.tag, 'x', c.x, 'y', c.y, 'b', int(now))
  else
    redis.call('HSET', key, 't', c.tag, 'x', c.x, 'y', c.y)
  end
  redis.call('PEXPIREAT', key, int(div_ceil(expires, 1000)))
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
  local key = KEYS[first + i]
  local c
  for j = 1, i - 1 do
    if KEYS[first + j] == key then
      c = contexts[j]
      break
    end
  end
  if not c then
    c = state_open(key, alg == 2)
    opened[#opened + 1] = c
  end
  contexts[i] = c
  return c
end
