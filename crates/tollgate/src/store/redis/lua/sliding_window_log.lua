-- Twin of tollgate_core::sliding_window_log. State: a ZSET, one member per admitted entry,
-- score = admission time (µs), member = "%016d:%d" of (S, cost) where S is the total cost of
-- the entries before it. So rank order is time order, S strictly increases with rank (the
-- zero padding makes ties in time sort by S), and the cost of any run of entries is a
-- difference of two S: deciding reads two entries instead of the whole log.
--
-- Invariants kept by every write: entries sorted by (time, S), S(next) = S + cost, 1 <= cost.
-- Expired entries are evicted when an entry is appended; a log that empties restarts S at 0,
-- and S is rewritten from 0 once it passes LOG_REBASE (after ~2^50 admitted units without a
-- quiet period), so S stays below 2^53 and within 16 digits. Rare paths rewrite the surviving
-- log in full: an append behind the newest entry (a clock that ran backwards) and the rebase.
--
-- Entries appended by one call all carry that call's `now`, so they are stored as ONE entry
-- with their summed cost: every decision depends only on the cost admitted at each instant.
--
-- Per-key context `c` (see state.lua): c.tag == 2 and c.base when the stored ZSET counts;
-- c.T = cost appended by earlier charges of this call; cached reads: c.lt/c.lend (newest
-- entry's time and S + cost), c.fp/c.ft/c.fs/c.fc (period, then time, S, cost of the first
-- entry live for it), c.frank (its rank); c.pmin = the shortest period of this call's appends.

local sliding_window_log_set_last, sliding_window_log_decide, sliding_window_log_apply
local sliding_window_log_prepare, sliding_window_log_commit
local sliding_window_log_refund_prepare, sliding_window_log_refund_commit

-- Builds the twin (see state.lua). Returns set_last, decide, apply, prepare, commit,
-- refund_prepare, refund_commit.
local function sliding_window_log_twin(fmod, format, sub, int, nonneg, div_ceil)
  local LOG_REBASE = 1125899906842624 -- 2^50

  local function member(s, cost)
    return format('%016d:%d', s, cost)
  end

  -- S, cost of a member.
  local function parse(m)
    return tonumber(sub(m, 1, 16)), tonumber(sub(m, 18))
  end

  -- Remembers the newest stored entry from a `ZRANGE key -1 -1 WITHSCORES` reply.
  local function set_last(c, reply)
    c.lread = true
    if reply[1] then
      local s, cost = parse(reply[1])
      c.lt, c.lend = tonumber(reply[2]), s + cost
    end
  end

  local function last(c)
    if not c.lread then
      set_last(c, redis.call('ZRANGE', c.key, '-1', '-1', 'WITHSCORES'))
    end
  end

  -- The oldest stored entry still live for `period` (time > now - period).
  local function first(c, now, period)
    if c.fp == period then
      return
    end
    local r = redis.call('ZRANGEBYSCORE', c.key, '(' .. int(now - period), '+inf',
      'WITHSCORES', 'LIMIT', '0', '1')
    c.fp, c.frank = period, nil
    c.fs, c.fc = parse(r[1])
    c.ft = tonumber(r[2])
  end

  -- Time of the first stored live entry (in log order) by which the stored live cost reaches w,
  -- for 1 <= w <= stored live cost: binary search over ranks for the last entry whose S is below
  -- fs + w (S grows by at least 1 per entry, so it is within w ranks of the first live one).
  local function quantile(c, now, period, w)
    if c.fc >= w then
      return c.ft
    end
    if not c.frank then
      c.frank = redis.call('ZCOUNT', c.key, '-inf', int(now - period))
    end
    local target = c.fs + w
    local lo, hi, t = c.frank, c.frank + w - 1, c.ft
    while lo < hi do
      local mid = hi - (hi - lo - fmod(hi - lo, 2)) / 2 -- rounds up: lo < mid <= hi
      local r = redis.call('ZRANGE', c.key, int(mid), int(mid), 'WITHSCORES')
      if r[1] and tonumber(sub(r[1], 1, 16)) < target then
        lo, t = mid, tonumber(r[2])
      else
        hi = mid - 1
      end
    end
    return t
  end

  -- The instant from which `need` units have expired, in Rust's order: entries sorted by time,
  -- this call's appended cost T at `now` after the stored entries of time <= now.
  local function retry_at(c, now, period, need, stored, t_cost)
    local t1
    if need <= stored then
      t1 = quantile(c, now, period, need)
    end
    if t_cost == 0 or (t1 and t1 < now) then
      return t1
    end
    local by_now = stored -- stored live cost admitted at or before now
    if stored > 0 and c.lt > now then
      local r = redis.call('ZRANGEBYSCORE', c.key, '(' .. int(now), '+inf', 'LIMIT', '0', '1')
      by_now = tonumber(sub(r[1], 1, 16)) - c.fs
    end
    if by_now + t_cost >= need then
      return now
    end
    return quantile(c, now, period, need - t_cost)
  end

  -- Returns verdict, remaining, reset_after, retry_after, delay, then true if allowed with an
  -- entry to append.
  local function decide(c, now, limit, period, cost)
    local t_cost, stored, newest = 0, 0, nil
    -- Stored entries count while live for `period`, and only if an append earlier in this call
    -- has not evicted them (Rust evicts on each append, with that charge's period).
    local window = period
    if c.pmin and c.pmin < window then
      window = c.pmin
    end
    if c.tag == 2 then
      t_cost = c.T
      if t_cost > 0 then
        newest = now
      end
      if c.base then
        last(c)
        if c.lt and c.lt > now - window then
          first(c, now, window)
          stored = c.lend - c.fs
          if not newest or c.lt > newest then
            newest = c.lt
          end
        end
      end
    end
    local used = stored + t_cost
    local remaining = nonneg(limit - used)
    local reset = newest and newest + period - now or 0
    if cost > limit then
      return 2, remaining, reset, -1, 0
    end
    local charged = used + cost
    if charged <= limit then
      if cost == 0 then
        return 0, remaining, reset, -1, 0
      end
      if not newest or newest < now then
        newest = now
      end
      return 0, limit - charged, newest + period - now, -1, 0, true
    end
    local at = retry_at(c, now, window, charged - limit, stored, t_cost)
    return 1, remaining, reset, at + period - now, 0
  end

  -- Applies an admitted append to the context (LogAppend on another algorithm's state starts a
  -- new log).
  local function apply(c, period, cost)
    if c.tag ~= 2 then
      c.tag, c.base, c.T = 2, false, 0
    end
    c.T = c.T + cost
    if not c.pmin or period < c.pmin then
      c.pmin = period
    end
    c.dirty, c.ep = true, period
  end

  -- ZADD of (time, cost) rows in order with S from 0, in slices (unpack has a stack limit).
  local function write_rows(key, times, costs, n)
    local args, k, s = {}, 0, 0
    for j = 1, n do
      args[k + 1], args[k + 2] = int(times[j]), member(s, costs[j])
      k, s = k + 2, s + costs[j]
      if k == 512 or j == n then
        redis.call('ZADD', key, unpack(args, 1, k))
        k = 0
      end
    end
  end

  -- Reads a full-rewrite needs, before anything is written: the surviving entries when the
  -- append lands behind the newest one or S has grown past LOG_REBASE.
  local function prepare(c, now)
    if not c.base then
      return
    end
    last(c)
    local evict_before = now + 1 - c.pmin
    c.keep = c.lt and c.lt >= evict_before
    if c.keep and (c.lt > now or c.lend + c.T > LOG_REBASE) then
      c.rows = redis.call('ZRANGEBYSCORE', c.key, int(evict_before), '+inf', 'WITHSCORES')
    end
  end

  -- Writes the appended entry (evicting expired ones) and the TTL: State::expires_at is the
  -- newest time + period.
  local function commit(c, now)
    local key = c.key
    local newest = now
    if not c.base then
      -- Another algorithm's hash, or a log replaced by one within this call.
      redis.call('DEL', key)
    end
    if c.rows then
      local times, costs, n, placed = {}, {}, 0, false
      local rows = c.rows
      for j = 1, #rows, 2 do
        local t = tonumber(rows[j + 1])
        if not placed and t > now then
          n, placed = n + 1, true
          times[n], costs[n] = now, c.T
        end
        local _, cost = parse(rows[j])
        n = n + 1
        times[n], costs[n] = t, cost
      end
      if not placed then
        n = n + 1
        times[n], costs[n] = now, c.T
      end
      if times[n] > newest then
        newest = times[n]
      end
      redis.call('DEL', key)
      write_rows(key, times, costs, n)
    else
      local s = 0
      if c.base and c.lt then
        redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. int(now + 1 - c.pmin))
        if c.keep then
          s = c.lend
        end
      end
      redis.call('ZADD', key, int(now), member(s, c.T))
    end
    redis.call('PEXPIREAT', key, int(div_ceil(newest + c.ep, 1000)))
  end

  -- REFUND: reads for taking `c.R` units back from the entries at `now` (the newest first).
  local function refund_prepare(c, now)
    last(c)
    if not c.lt or c.lt < now then
      return -- nothing was admitted at `now`
    end
    if c.lt == now then
      c.atnow = redis.call('ZRANGEBYSCORE', c.key, int(now), int(now), 'WITHSCORES')
      c.before = redis.call('ZREVRANGEBYSCORE', c.key, '(' .. int(now), '-inf',
        'WITHSCORES', 'LIMIT', '0', '1')
    else
      c.rows = redis.call('ZRANGE', c.key, '0', '-1', 'WITHSCORES')
    end
  end

  -- REFUND writes. Returns true if anything was taken back.
  local function refund_commit(c, now)
    local key, left = c.key, c.R
    local newest
    if c.atnow then
      -- The entries at `now` are the newest: shrink them from the end, S stays consistent.
      local rows = c.atnow
      newest = now
      for j = #rows - 1, 1, -2 do
        local s, cost = parse(rows[j])
        redis.call('ZREM', key, rows[j])
        if cost > left then
          redis.call('ZADD', key, int(now), member(s, cost - left))
          left = 0
          break
        end
        left = left - cost
        if j == 1 then
          newest = c.before[2] and tonumber(c.before[2])
        end
        if left == 0 then
          break
        end
      end
    elseif c.rows then
      -- Entries after `now` exist (the clock ran backwards since): rewrite the log.
      local rows = c.rows
      local times, costs, n = {}, {}, 0
      for j = 1, #rows, 2 do
        local _, cost = parse(rows[j])
        n = n + 1
        times[n], costs[n] = tonumber(rows[j + 1]), cost
      end
      for j = n, 1, -1 do
        if left > 0 and times[j] == now then
          local take = costs[j] < left and costs[j] or left
          costs[j], left = costs[j] - take, left - take
        end
      end
      if left == c.R then
        return false
      end
      local m = 0
      for j = 1, n do
        if costs[j] > 0 then
          m = m + 1
          times[m], costs[m] = times[j], costs[j]
        end
      end
      redis.call('DEL', key)
      write_rows(key, times, costs, m)
      newest = times[m]
    else
      return false
    end
    if newest and newest + c.ep > now then
      redis.call('PEXPIREAT', key, int(div_ceil(newest + c.ep, 1000)))
    else
      redis.call('DEL', key)
    end
    return true
  end

  return set_last, decide, apply, prepare, commit, refund_prepare, refund_commit
end
