-- tollgate DECIDE, one request: decides (and, if admitted, commits) every limit of it. The
-- drivers (decide_one.lua, decide_batch.lua) read the arguments and call decide_request.
--
-- decide_request(out, base, A, first, n, arg, commit, now): the request's n charges are
-- KEYS[first + i] with 6 arguments each from A[arg + 6 * (i - 1)] (A: the driver's argument
-- strings): algorithm (1 fixed_window, 2 sliding_window_log, 3 sliding_window_counter, 4
-- token_bucket, 5 leaky_bucket, 6 gcra), limit, period_us, burst, cost, flags (the sum of 1
-- enforced, 2 charging up to the limit, 4 quota mode, 8 a check answers as the state stands).
-- A cost of 0 is a check, which charges nothing. commit: write if admitted; now: whole
-- microseconds since the epoch.
--
-- Every charge is decided against the current state; charges on the same key are decided in
-- order, each seeing the tentative effect of the earlier ones. The request is admitted when every
-- enforced charge without quota mode is allowed and, if there are quota-mode charges, one of
-- them is allowed or not enforced; then, if commit, every allowed charge is committed (denied
-- ones consume nothing); otherwise nothing is written, and an allowed charge answers with the
-- figures of a cost of 0 on the state as stored. All reads happen before the first write,
-- so an error (a key of a foreign type, raised as a Redis error table) leaves every key of the
-- request unchanged. Every key written gets PEXPIREAT at ceil(expires_at / 1000) ms, expires_at
-- being Rust's State::expires_at of the new state; a state already expired at `now` is deleted.
--
-- Writes its reply into out from out[base] on, 2 + 6 * n numbers: now_us, admitted (1/0),
-- then per charge: verdict (0 allowed, 1 denied, 2 cost exceeds capacity), remaining,
-- reset_after_us, retry_after_us (-1 when none), delay_us, charged (the units an allowed
-- charge takes, written if the request commits: its cost, or what was left when it charges up
-- to the limit; 0 for a check or a denial). Returns how many numbers it wrote. A driver's
-- reply holds its requests' back to back.
--
-- decide_single(out, base, A, first, arg, commit, now), for a request of one charge, may write
-- instead the short form of its most common answer (admitted, allowed, no retry, no delay):
-- -2, remaining, reset_after_us, charged, and return 4 (decide_batch.lua sends it as it is;
-- decide_one.lua writes it out in full).
--
-- Storage: see state.lua (hash layout) and each algorithm's file (fields, sliding-log ZSET).

-- One charge of `cost` against its key's context c: verdict, remaining, reset, retry, delay,
-- then what to apply when allowed (for the sliding log, true; else the new state's fields; a
-- bucket's is written under this charge's limit and period).
local function decide_charge(c, alg, now, limit, period, burst, cost)
  if alg == 2 then
    return sliding_window_log_decide(c, now, limit, period, cost)
  end
  local x, y, z, l, p
  if c.tag == alg then
    x, y, z, l, p = c.x, c.y, c.z, c.l, c.p
  end
  if alg == 1 then
    return fixed_window_decide(x, y, now, limit, period, cost)
  elseif alg == 3 then
    return sliding_window_counter_decide(x, y, z, now, limit, period, cost)
  elseif alg == 4 then
    return token_bucket_decide(x, y, z, l, p, now, limit, period, burst, cost)
  elseif alg == 5 then
    return leaky_bucket_decide(x, y, z, l, p, now, limit, period, burst, cost)
  elseif alg == 6 then
    return gcra_decide(x, y, z, l, p, now, limit, period, burst, cost)
  end
  error({ err = 'ERR tollgate: unknown algorithm code ' .. tostring(alg) })
end

-- Whether `flags` holds `bit` (1, 2, 4 or 8).
local function has_flag(flags, bit)
  return flags % (bit * 2) >= bit
end

-- The caches below map a text to its number and a number to its text, which never change, so
-- a function library keeps them from call to call (its locals outlive its calls; a table
-- made anew each call cost ~3,000 instructions a decision in inserts and rehashes, measured by
-- scripts/redis-instructions.py). decide_begin empties one that holds more than CACHE_CAP
-- entries, which bounds the memory they hold. Under EVALSHA every call starts them afresh.
local CACHE_CAP = 4096

-- The numbers of the arguments and stored fields, parsed once each: a batch's charges mostly
-- share their params, and equal Lua strings are one object, so a repeated text costs a table
-- look-up. decide_numbers_held counts the entries (a miss that parses to nil stores none).
local decide_numbers, decide_numbers_held = {}, 0
local function decide_number(s)
  local v = decide_numbers[s]
  if v == nil then
    v = tonumber(s)
    if v ~= nil then
      decide_numbers[s], decide_numbers_held = v, decide_numbers_held + 1
    end
  end
  return v
end

local function decide_request(out, base, A, first, n, arg, commit, now)
  out[base], out[base + 1] = now, 1
  local contexts = {} -- charge index -> its key's context
  local opened = {} -- distinct contexts, in order
  local admitted = 1
  local quotas, quota_passes = false, false
  for i = 1, n do
    local a = arg + 6 * (i - 1)
    local alg, limit = decide_number(A[a]), decide_number(A[a + 1])
    local period, burst = decide_number(A[a + 2]), decide_number(A[a + 3])
    local cost, flags = decide_number(A[a + 4]), decide_number(A[a + 5])
    state_build_twin(alg)
    local c = state_context(first, i, alg, contexts, opened)

    local verdict, remaining, reset, retry, delay, nx, ny, nz
    if cost == 0 then
      -- A check (tollgate_core::check): the verdict of a cost of 1 (with flag 8, of a cost of
      -- 0: tollgate_core::check_as_is); admitted, the figures of a cost of 0 and no delay.
      -- Nothing is applied.
      local probe = 1
      if has_flag(flags, 8) then
        probe = 0
      end
      verdict, remaining, reset, retry, delay =
        decide_charge(c, alg, now, limit, period, burst, probe)
      if verdict == 0 then
        verdict, remaining, reset, retry = decide_charge(c, alg, now, limit, period, burst, 0)
        delay = 0
      end
    else
      verdict, remaining, reset, retry, delay, nx, ny, nz =
        decide_charge(c, alg, now, limit, period, burst, cost)
      if verdict ~= 0 and has_flag(flags, 2) and cost > 1 then
        -- Charging up to the limit (tollgate_core::decide): decided again for what is left,
        -- at least 1, if that is less than the whole cost.
        local part = remaining
        if part < 1 then
          part = 1
        elseif part > cost then
          part = cost
        end
        if part ~= cost then
          cost = part
          verdict, remaining, reset, retry, delay, nx, ny, nz =
            decide_charge(c, alg, now, limit, period, burst, cost)
        end
      end
    end
    if verdict == 1 and cost > 0 and not has_flag(flags, 2) then
      -- Denied: when earlier charges of this request on the same key were denied too (and so
      -- applied nothing), the request fits only once all of them do, so the retry is the wait
      -- for their sum (as the memory store answers).
      if c.denied then
        local _, _, _, whole = decide_charge(c, alg, now, limit, period, burst, cost + c.denied)
        if whole > retry then
          retry = whole
        end
      end
      c.denied = (c.denied or 0) + cost
    end
    if nx and alg == 2 then
      sliding_window_log_apply(c, period, cost)
    elseif nx then
      if not c.dirty then
        c.oe = state_stored_ms(c, alg)
      end
      c.tag, c.x, c.y, c.z, c.l, c.p = alg, nx, ny, nz, limit, period
      c.base, c.T, c.dirty, c.ep = false, 0, true, period
    end
    local charged = 0
    if verdict == 0 then
      charged = cost -- what was left, for a charge up to the limit; 0 for a check
    end
    local o = base + 6 * i - 4
    out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4] = verdict, remaining, reset, retry, delay
    out[o + 5] = charged
    local enforced = has_flag(flags, 1)
    if has_flag(flags, 4) then
      quotas = true
      quota_passes = quota_passes or verdict == 0 or not enforced
    elseif verdict ~= 0 and enforced then
      admitted = 0
    end
  end
  if quotas and not quota_passes then
    admitted = 0
  end
  out[base + 1] = admitted

  if admitted == 0 then
    -- Nothing is charged: a limit that allowed its charge answers with its figures as they
    -- stand (tollgate_core::as_is, on the state read afresh: the contexts hold this call's
    -- tentative charges), not as after a charge that is never made.
    for i = 1, n do
      local o = base + 6 * i - 4
      if out[o] == 0 and out[o + 5] > 0 then
        local a = arg + 6 * (i - 1)
        local alg = decide_number(A[a])
        local c = state_open(call_keys[first + i], alg)
        -- Allowed still, without a retry, even over a state fuller than the limit.
        local _, remaining, reset = decide_charge(c, alg, now, decide_number(A[a + 1]),
          decide_number(A[a + 2]), decide_number(A[a + 3]), 0)
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = remaining, reset, -1, 0
      end
    end
  end

  if commit and admitted == 1 then
    -- Reads the rare paths need, then the writes: nothing is written before every read is done.
    for k = 1, #opened do
      local c = opened[k]
      if c.dirty and c.tag == 2 then
        sliding_window_log_prepare(c, now)
      end
    end
    for k = 1, #opened do
      local c = opened[k]
      if c.dirty then
        if c.tag == 2 then
          sliding_window_log_commit(c, now)
        else
          state_commit_hash(c, now)
        end
      end
    end
  end
  return 2 + 6 * n
end

-- The text of a count, made once per value (counts repeat across keys), kept as decide_numbers.
local decide_texts, decide_texts_held = {}, 0
local function decide_text(v)
  local s = decide_texts[v]
  if not s then
    s = int(v)
    decide_texts[v], decide_texts_held = s, decide_texts_held + 1
  end
  return s
end

-- The window index of `now` for `period` and its text, made once per call and period; with
-- them the time to the window's end, and the PEXPIREAT (ms, and its text, each made when first
-- needed) of a fixed window and of a sliding counter counting in it.
local window_period, window_index, window_text, window_to_end
local window_ms, window_ms_text, counter_ms, counter_ms_text
local function decide_window(now, period)
  if period ~= window_period then
    local elapsed
    window_period, window_index, elapsed = period, divmod(now, period)
    window_text, window_to_end = int(window_index), period - elapsed
    window_ms, window_ms_text, counter_ms, counter_ms_text = nil, nil, nil, nil
  end
  return window_index, window_text
end

-- What a lean path (fixed_window_single, ...) leaves decide_single to write: HSET of the first
-- lean_fields entries of state_write (0: none), then PEXPIREAT lean_expire (nil: none). A lean
-- path reads, decides and fills the reply; one that may raise on a state it cannot read (a
-- field that is not a number) runs under pcall, so that the request never sees that error:
-- decide_single then decides it as before. The writes come after, unprotected, so their errors
-- reach the caller as ever.
local lean_fields, lean_expire = 0, nil
--
-- The lean paths plan their writes inline, and the two windows' plans are near-copies on
-- purpose: one shared planning function (nine arguments) cost 718 instructions a fixed-window
-- decision and 650 a sliding-counter one (+1.6%, +1.3%; scripts/redis-instructions.py, one
-- process each), which is more than the copy saves a reader. Change both together.

-- decide_single's fixed window (fixed_window.lua's decide and expires, inlined) for the states
-- it meets most: none, another algorithm's, or a count in the window of `now` or an earlier
-- one; reads t, x, y, p. Returns the length of the reply it wrote (4 for the short form, else
-- 8), with the writes planned (see lean_fields), or false for any other state (the clock stepped back into the window before
-- the stored one; a field missing or not a number), which decide_single then decides. Raises
-- nothing, so decide_single calls it without pcall.
local function fixed_window_single(out, base, key, A, commit, now)
  local r = redis_pcall('HMGET', key, 't', 'x', 'y', 'p')
  local t = r[1]
  if r.err or (t and not r[4]) then
    return false
  end
  local alg_text, limit, period, period_text = A[3], A.limit, A.period, A[5]
  local cost = A.cost
  local window, text = window_index, window_text -- decide_window's, inlined where made
  if period ~= window_period then
    window, text = decide_window(now, period)
  end
  local sx, sy = r[2], r[3]
  local stored = t == alg_text
  local same_period = stored and r[4] == period_text
  local count, old_ms = 0, nil
  if stored then
    if not sx or not sy then
      return false
    end
    if sx == text then
      count = decide_numbers[sy] or decide_number(sy)
      if not count then
        return false
      end
      if same_period then
        old_ms = window_ms or div_ceil((window + 1) * period, 1000)
        window_ms = old_ms
        if count == 0 then
          old_ms = 0
        end
      end
    else
      local x = tonumber(sx)
      if not x or x >= window then
        return false
      end
      local y = decide_numbers[sy] or decide_number(sy)
      if same_period and y then
        old_ms = y == 0 and 0 or div_ceil((x + 1) * period, 1000)
      end
    end
  end
  local verdict, remaining, reset, retry, charged = 0, 0, 0, -1, 0
  local admitted, counted = 1, count + cost
  if cost > limit then
    verdict, remaining = 2, limit - count
  elseif counted <= limit then
    charged, remaining, reset = cost, limit - counted, window_to_end
  else
    verdict, remaining, retry = 1, limit - count, window_to_end
  end
  if verdict ~= 0 then
    if remaining < 0 then
      remaining = 0
    end
    if count > 0 then
      reset = window_to_end
    end
    if A.enforced then
      admitted = 0
    end
  elseif commit then
    -- As decide_single writes: the fields whose text changed, then the TTL unless the key
    -- already expires then.
    local v = decide_texts[counted] or decide_text(counted)
    local w, n = state_write, 0
    if same_period and sx == text then
      if v ~= sy then
        w[1], w[2], n = 'y', v, 2
      end
    else
      if not stored then
        w[1], w[2], w[3], w[4], n = 't', alg_text, 'p', period_text, 4
      elseif not same_period then
        w[1], w[2], n = 'p', period_text, 2
      end
      if not stored or sx ~= text then
        w[n + 1], w[n + 2], n = 'x', text, n + 2
      end
      if not stored or v ~= sy then
        w[n + 1], w[n + 2], n = 'y', v, n + 2
      end
      if not t then
        w[n + 1], w[n + 2], n = 'b', state_int(now, now), n + 2
      end
    end
    lean_fields = n
    local ms = window_ms or div_ceil((window + 1) * period, 1000)
    window_ms = ms
    if ms ~= old_ms then
      if not window_ms_text then
        window_ms_text = int(ms)
      end
      lean_expire = window_ms_text
    end
  end
  if verdict == 0 then
    out[base], out[base + 1], out[base + 2], out[base + 3] = -2, remaining, reset, charged
    return 4
  end
  out[base], out[base + 1], out[base + 2], out[base + 3] = now, admitted, verdict, remaining
  out[base + 4], out[base + 5], out[base + 6], out[base + 7] = reset, retry, 0, charged
  return 8
end

-- decide_single's sliding window counter (sliding_window_counter.lua's decide and expires,
-- inlined where the charge is allowed; its decide answers a denial) for the states it meets
-- most: none, another algorithm's, or counts of the window of `now` or earlier ones; reads t,
-- x, y, p, z. Returns a length or false as fixed_window_single does.
local function sliding_window_counter_single(out, base, key, A, commit, now)
  local r = redis_pcall('HMGET', key, 't', 'x', 'y', 'p', 'z')
  local t = r[1]
  if r.err or (t and not r[4]) then
    return false
  end
  local alg_text, limit, period, period_text = A[3], A.limit, A.period, A[5]
  local cost = A.cost
  local window, text = window_index, window_text -- decide_window's, inlined where made
  if period ~= window_period then
    window, text = decide_window(now, period)
  end
  local sx, sy, sz = r[2], r[3], r[5]
  local stored = t == alg_text
  local same_period = stored and r[4] == period_text
  local x, y, z
  local current, previous, old_ms = 0, 0, nil
  if stored then
    if not sx or not sy or not sz then
      return false
    end
    y = decide_numbers[sy] or decide_number(sy)
    z = decide_numbers[sz] or decide_number(sz)
    if not y or not z then
      return false
    end
    if sx == text then
      x, current, previous = window, y, z
    else
      x = tonumber(sx)
      if not x or x >= window then
        return false
      end
      if x + 1 == window then
        previous = y
      end
    end
    if same_period and y and z then
      if y > 0 and x == window then
        old_ms = counter_ms or div_ceil((window + 2) * period, 1000)
        counter_ms = old_ms
      elseif y > 0 then
        old_ms = div_ceil((x + 2) * period, 1000)
      elseif z > 0 then
        old_ms = div_ceil((x + 1) * period, 1000)
      else
        old_ms = 0
      end
    end
  end
  local to_end = window_to_end
  local weighted = 0
  if previous ~= 0 then
    local q, m
    local p = previous * to_end
    if p < TWO52 then
      m = p % period -- exact: p + period <= 2^53 (exact.lua, divmod)
      q = (p - m) / period
    else
      q, m = muldivmod(previous, to_end, period)
    end
    weighted = m > 0 and q + 1 or q
  end
  local counted = current + cost
  if cost > limit or counted + weighted > limit then
    state_build_twin(3)
    local verdict, remaining, reset, retry =
      sliding_window_counter_decide(x, y, z, now, limit, period, cost)
    local admitted = 1
    if A.enforced then
      admitted = 0
    end
    out[base], out[base + 1], out[base + 2], out[base + 3] = now, admitted, verdict, remaining
    out[base + 4], out[base + 5], out[base + 6], out[base + 7] = reset, retry, 0, 0
    return 8
  end
  if commit then
    -- As decide_single writes: the fields whose text changed, then the TTL unless the key
    -- already expires then.
    local v = decide_texts[counted] or decide_text(counted)
    local w, n = state_write, 0
    if same_period and sx == text then
      if v ~= sy then
        w[1], w[2], n = 'y', v, 2
      end
    else
      local vz = decide_texts[previous] or decide_text(previous)
      if not stored then
        w[1], w[2], w[3], w[4], n = 't', alg_text, 'p', period_text, 4
      elseif not same_period then
        w[1], w[2], n = 'p', period_text, 2
      end
      if not stored or sx ~= text then
        w[n + 1], w[n + 2], n = 'x', text, n + 2
      end
      if not stored or v ~= sy then
        w[n + 1], w[n + 2], n = 'y', v, n + 2
      end
      if not stored or vz ~= sz then
        w[n + 1], w[n + 2], n = 'z', vz, n + 2
      end
      if not t then
        w[n + 1], w[n + 2], n = 'b', state_int(now, now), n + 2
      end
    end
    lean_fields = n
    local ms = counter_ms or div_ceil((window + 2) * period, 1000)
    counter_ms = ms
    if ms ~= old_ms then
      if not counter_ms_text then
        counter_ms_text = int(ms)
      end
      lean_expire = counter_ms_text
    end
  end
  out[base], out[base + 1], out[base + 2], out[base + 3] =
    -2, limit - counted - weighted, period + to_end, cost
  return 4
end


-- ceil(a / 1000) for an integer 0 <= a < 2^53 - 1000, by `%` (exact there: exact.lua, divmod).
local function ms_of(a)
  local r = a % 1000
  if r > 0 then
    return (a - r) / 1000 + 1
  end
  return a / 1000
end

-- decide_single's meters (gcra.lua's, token_bucket.lua's and leaky_bucket.lua's decide on the
-- meter, inlined where the charge is allowed; the twin answers a denial) for the states they
-- meet most: none, another algorithm's, or one written under the same limit and period; reads
-- t, x, y, p, z, l. Returns a length or false as fixed_window_single does, false for a state
-- written under other params (which the twin converts), a remainder carried past the limit or
-- a state that expires as written. Raises on a field that is not a number (`+ 0` is one
-- conversion where tonumber makes two), which decide_single's pcall turns into the same
-- fallback.
--
-- GCRA and the leaky bucket keep x, y = the instant (TAT; when the queue is dry) as a pair, z
-- = when written; the token bucket x = updated, y, z = when it is full again. The meter runs
-- on the backlog ahead of `at` (now; for the bucket, the later of now and updated, `late`
-- being added to its durations), capped at the tolerance from when the state was written.
local function meter_single(out, base, key, A, commit, now)
  local r = redis_pcall('HMGET', key, 't', 'x', 'y', 'p', 'z', 'l')
  local t = r[1]
  if r.err or (t and not r[4]) then
    return false
  end
  local alg_text, limit_text, period_text = A[3], A[4], A[5]
  local stored = t == alg_text
  if stored and (r[4] ~= period_text or r[6] ~= limit_text) then
    return false
  end
  local alg, limit, period, burst, cost = A.alg, A.limit, A.period, A.burst, A.cost
  -- The tolerance burst * period and the increment cost * period as pairs, once per plan.
  local tw, tf, cw, cf = A.tw, A.tf, A.cw, A.cf
  if not tw then
    tw, tf = muldivmod(burst, period, limit)
    cw, cf = muldivmod(cost, period, limit)
    A.tw, A.tf, A.cw, A.cf = tw, tf, cw, cf
  end
  local bucket = alg == 4
  local sx, sy, sz = r[2], r[3], r[5]
  local x, y, z, old_ms
  local at = now
  local aw, af = 0, 0 -- the backlog ahead of `at` (the meter's `ahead`)
  if stored then
    -- The remainder of a pair (the bucket's z, the others' y) often repeats: cached.
    local w, f, from
    if bucket then
      z = decide_numbers[sz]
      if not z then
        z = sz + 0
        decide_numbers[sz], decide_numbers_held = z, decide_numbers_held + 1
      end
      x, y = sx + 0, sy + 0
      w, f, from = y, z, x
      if x > now then
        at = x
      end
    else
      y = decide_numbers[sy]
      if not y then
        y = sy + 0
        decide_numbers[sy], decide_numbers_held = y, decide_numbers_held + 1
      end
      x, z = sx + 0, sz + 0
      w, f, from = x, y, z
    end
    if f >= limit then
      return false
    end
    old_ms = ms_of(f > 0 and w + 1 or w)
    -- `converted` under the same params: the backlog when written, capped at the tolerance.
    if w >= from then
      local bw = w - from
      if bw > tw or (bw == tw and f > tf) then
        w, f = from + tw, tf
      end
    end
    if w >= at then
      aw, af = w - at, f
    end
  end
  local nw, nf = aw + cw, af + cf
  if nf >= limit then
    nw, nf = nw + 1, nf - limit
  end
  if cost > burst or nw > tw or (nw == tw and nf > tf) then
    state_build_twin(alg)
    local l, p
    if stored then
      l, p = limit, period
    end
    local verdict, remaining, reset, retry, delay
    if alg == 6 then
      verdict, remaining, reset, retry, delay =
        gcra_decide(x, y, z, l, p, now, limit, period, burst, cost)
    elseif bucket then
      verdict, remaining, reset, retry, delay =
        token_bucket_decide(x, y, z, l, p, now, limit, period, burst, cost)
    else
      verdict, remaining, reset, retry, delay =
        leaky_bucket_decide(x, y, z, l, p, now, limit, period, burst, cost)
    end
    local admitted = 1
    if A.enforced then
      admitted = 0
    end
    out[base], out[base + 1], out[base + 2], out[base + 3] = now, admitted, verdict, remaining
    out[base + 4], out[base + 5], out[base + 6], out[base + 7] = reset, retry, delay, 0
    return 8
  end
  -- The meter's `remaining` of the new backlog: floor((tolerance - backlog) / period).
  local remaining = 0
  local xw, xf = tw - nw, tf - nf
  if xf < 0 then
    xw, xf = xw - 1, xf + limit
  end
  if xw >= 0 then
    local q, m
    local p = xw * limit
    if p < TWO52 then
      m = p % period
      q = (p - m) / period
    else
      q, m = muldivmod(xw, limit, period)
    end
    local sum = m + xf -- below period + limit
    remaining = q + (sum - sum % period) / period
  end
  local reset = nf > 0 and nw + 1 or nw
  local delay = 0
  if bucket then
    reset = reset + at - now
  elseif alg == 5 then
    delay = af > 0 and aw + 1 or aw
  end
  if commit then
    -- As decide_single writes: the fields whose text changed, then the TTL unless the key
    -- already expires then. The new state: (x, y, z) = (at, at + nw, nf) for the bucket,
    -- (now + nw, nf, now) for the others.
    local ew = at + nw
    local expires = nf > 0 and ew + 1 or ew
    if expires <= now then
      return false -- deleted, not written: decide_single does it
    end
    local w, n = state_write, 0
    if not stored then
      w[1], w[2], w[3], w[4], n = 't', alg_text, 'p', period_text, 4
    end
    local vx, vy, vz
    if bucket then
      vx, vy, vz = state_int(at, now), int(ew), decide_texts[nf] or decide_text(nf)
    else
      vx, vy, vz = state_int(ew, now), decide_texts[nf] or decide_text(nf), state_int(now, now)
    end
    if not stored or vx ~= sx then
      w[n + 1], w[n + 2], n = 'x', vx, n + 2
    end
    if not stored or vy ~= sy then
      w[n + 1], w[n + 2], n = 'y', vy, n + 2
    end
    if not stored or vz ~= sz then
      w[n + 1], w[n + 2], n = 'z', vz, n + 2
    end
    if not stored then
      w[n + 1], w[n + 2], n = 'l', limit_text, n + 2
    end
    if not t then
      w[n + 1], w[n + 2], n = 'b', state_int(now, now), n + 2
    end
    lean_fields = n
    local ms = ms_of(expires)
    if ms ~= old_ms then
      lean_expire = int(ms)
    end
  end
  if delay == 0 then
    out[base], out[base + 1], out[base + 2], out[base + 3] = -2, remaining, reset, cost
    return 4
  end
  out[base], out[base + 1], out[base + 2], out[base + 3] = now, 1, 0, remaining
  out[base + 4], out[base + 5], out[base + 6], out[base + 7] = reset, -1, delay, cost
  return 8
end

-- Flags that leave a one-charge request of a cost to decide_single: any sum of enforced (1),
-- quota mode (4), which for one charge decide nothing more, and "a check answers as the
-- state stands" (8), which only a check (cost 0) reads. The value is whether it is enforced.
local single_flags = {
  ['0'] = false, ['4'] = false, ['8'] = false, ['12'] = false,
  ['1'] = true, ['5'] = true, ['9'] = true, ['13'] = true,
}

-- The plan of the one-charge request A (its words; the charge's from A[arg]), made once per
-- call and request text: whether decide_single decides it (a hash algorithm, cost >= 1, flags
-- of single_flags), its numbers, and its algorithm's lean path (or false). Kept in A: alg,
-- limit, period, burst, cost, enforced, single, lean, protect (the lean path may raise: run it
-- under pcall). Returns lean.
local function decide_plan(A, arg)
  local alg_text, enforced = A[arg], single_flags[A[arg + 5]]
  local alg = decide_numbers[alg_text] or decide_number(alg_text)
  local cost = decide_numbers[A[arg + 4]] or decide_number(A[arg + 4])
  local single = not (alg == 2 or not alg or alg < 1 or alg > 6 or alg % 1 ~= 0 or not cost
    or cost < 1 or enforced == nil)
  local lean = false
  if single then
    A.alg, A.cost = alg, cost
    A.limit = decide_numbers[A[arg + 1]] or decide_number(A[arg + 1])
    A.period = decide_numbers[A[arg + 2]] or decide_number(A[arg + 2])
    A.burst = decide_numbers[A[arg + 3]] or decide_number(A[arg + 3])
    A.enforced = enforced
    if arg == 3 then -- the lean paths read the words where both drivers put them
      if alg == 1 then
        lean = fixed_window_single
      elseif alg == 3 then
        lean = sliding_window_counter_single
      else
        lean = meter_single
        A.protect = true
      end
    end
  end
  A.single, A.lean = single, lean
  return lean
end

-- decide_request for the common request: one charge of a hash algorithm, cost >= 1, flags of
-- single_flags, which for a single charge of a cost decide nothing more. Same
-- decisions, reads and writes, in fewer steps: no per-key context, the stored fields compared
-- as text (equal Lua strings are one object), parsed only where the arithmetic needs them,
-- and written only where their text changes. Its algorithm's lean path (decide_plan) decides
-- the states a key meets most, under pcall, and this writes what it planned; a state the lean
-- path declines (or cannot read) is decided below, from a fresh read. Any other request, or a
-- key that holds no hash, goes to decide_request (nothing has been written by then). Returns
-- the length of the reply it wrote: 4 for the short form (see decide_request), else 8.
local function decide_single(out, base, A, first, arg, commit, now)
  local lean = A.lean
  if lean == nil then
    lean = decide_plan(A, arg)
  end
  if not A.single then
    return decide_request(out, base, A, first, 1, arg, commit, now)
  end
  local key = call_keys[first + 1]
  if lean then
    lean_fields, lean_expire = 0, nil
    local ok, done
    if A.protect then
      ok, done = pcall(lean, out, base, key, A, commit, now)
    else
      ok, done = true, lean(out, base, key, A, commit, now)
    end
    if ok and done then
      local n, w = lean_fields, state_write
      if n == 2 then
        redis_call('HSET', key, w[1], w[2])
      elseif n > 0 then
        redis_call('HSET', key, unpack(w, 1, n))
      end
      if lean_expire then
        redis_call('PEXPIREAT', key, lean_expire)
      end
      return done
    end
  end
  local alg_text, alg, cost = A[arg], A.alg, A.cost
  local limit_text, period_text = A[arg + 1], A[arg + 2]
  local limit, period, burst = A.limit, A.period, A.burst
  -- t, x, y, p[, z[, l]], not b: every write leaves a hash with both, so a hash with p has b
  -- (state.lua), and one with t but no p (written before p was recorded) goes to decide_request.
  local r
  if alg == 1 then
    r = redis.pcall('HMGET', key, 't', 'x', 'y', 'p')
  elseif alg == 3 then
    r = redis.pcall('HMGET', key, 't', 'x', 'y', 'p', 'z')
  else
    r = redis.pcall('HMGET', key, 't', 'x', 'y', 'p', 'z', 'l')
  end
  if r.err or (r[1] and not r[4]) then
    return decide_request(out, base, A, first, 1, arg, commit, now)
  end
  state_build_twin(alg)
  -- The stored state, when it is of this algorithm (else the key decides as empty).
  local stored = r[1] == alg_text
  local x, y, z, l, p
  local verdict, remaining, reset, retry, delay, nx, ny, nz
  if alg == 1 or alg == 3 then
    local window, text = decide_window(now, period)
    if stored then
      if r[2] == text then
        x = window
      else
        x = tonumber(r[2])
      end
      y = decide_numbers[r[3]] or decide_number(r[3])
      if alg == 3 then
        z = decide_numbers[r[5]] or decide_number(r[5])
      end
    end
    if alg == 1 then
      verdict, remaining, reset, retry, delay, nx, ny =
        fixed_window_decide(x, y, now, limit, period, cost)
    else
      verdict, remaining, reset, retry, delay, nx, ny, nz =
        sliding_window_counter_decide(x, y, z, now, limit, period, cost)
    end
  else
    if stored then
      -- The remainder of a scaled pair (the bucket's z, the others' y) often repeats.
      x = tonumber(r[2])
      if alg == 4 then
        y, z = tonumber(r[3]), decide_numbers[r[5]] or decide_number(r[5])
      else
        y, z = decide_numbers[r[3]] or decide_number(r[3]), tonumber(r[5])
      end
      if r[6] == limit_text then
        l = limit
      else
        l = tonumber(r[6])
      end
      if r[4] == period_text then
        p = period
      else
        p = tonumber(r[4])
      end
    end
    if alg == 4 then
      verdict, remaining, reset, retry, delay, nx, ny, nz =
        token_bucket_decide(x, y, z, l, p, now, limit, period, burst, cost)
    elseif alg == 5 then
      verdict, remaining, reset, retry, delay, nx, ny, nz =
        leaky_bucket_decide(x, y, z, l, p, now, limit, period, burst, cost)
    else
      verdict, remaining, reset, retry, delay, nx, ny, nz =
        gcra_decide(x, y, z, l, p, now, limit, period, burst, cost)
    end
  end
  local admitted, charged = 1, 0
  if verdict == 0 then
    charged = cost
  elseif A.enforced then
    admitted = 0
  end
  if commit and verdict == 0 then
    local expires = state_expires_of(alg, nx, ny, nz, period)
    if expires <= now then
      redis.call('DEL', key)
    else
      -- As state_commit_hash: the fields whose text changed, then the TTL unless the key
      -- already expires then (the stored state's expiry, known for a window once its hash
      -- records the period).
      local w, n, v = state_write, 0, nil
      local old_ms
      if not stored then
        w[1], w[2], w[3], w[4], n = 't', alg_text, 'p', period_text, 4
      elseif r[4] ~= period_text then
        w[1], w[2], n = 'p', period_text, 2
      elseif x and y and (alg ~= 3 or z) and (alg ~= 4 or z) then
        old_ms = div_ceil(state_expires_of(alg, x, y, z, period), 1000)
      end
      if alg == 1 or alg == 3 then
        v = nx == window_index and window_text or int(nx)
      else
        v = state_int(nx, now)
      end
      if not stored or v ~= r[2] then
        w[n + 1], w[n + 2], n = 'x', v, n + 2
      end
      if alg == 4 then
        v = int(ny)
      else
        v = decide_text(ny)
      end
      if not stored or v ~= r[3] then
        w[n + 1], w[n + 2], n = 'y', v, n + 2
      end
      if alg ~= 1 then
        if alg == 3 or alg == 4 then
          v = decide_text(nz)
        else
          v = state_int(nz, now)
        end
        if not stored or v ~= r[5] then
          w[n + 1], w[n + 2], n = 'z', v, n + 2
        end
        if alg >= 4 and (not stored or r[6] ~= limit_text) then
          w[n + 1], w[n + 2], n = 'l', limit_text, n + 2
        end
      end
      if not r[1] then -- no hash: no b either
        w[n + 1], w[n + 2], n = 'b', state_int(now, now), n + 2
      end
      if n > 0 then
        redis.call('HSET', key, unpack(w, 1, n))
      end
      local ms = div_ceil(expires, 1000)
      if ms ~= old_ms then
        redis.call('PEXPIREAT', key, int(ms))
      end
    end
  end
  out[base], out[base + 1], out[base + 2], out[base + 3] = now, admitted, verdict, remaining
  out[base + 4], out[base + 5], out[base + 6], out[base + 7] = reset, retry, delay, charged
  return 8
end

-- `now` from a driver's argument: whole microseconds (tests); "" for the server's TIME; or "<D"
-- for the server's TIME, with D the last server instant (whole microseconds) at which the
-- call may still write. Returns nil when the argument is malformed; else now, and whether the
-- call runs after D (then it must write nothing: its caller has given up on it).
local function decide_now(v)
  local now, not_after
  if v == '' or sub(v, 1, 1) == '<' then
    local time = redis.call('TIME')
    now = tonumber(time[1]) * 1000000 + tonumber(time[2])
    if v ~= '' then
      not_after = tonumber(sub(v, 2))
      if not not_after then
        return nil
      end
    end
  else
    now = tonumber(v)
  end
  if not now or now < 0 or now >= TWO52 or fmod(now, 1) ~= 0 then
    return nil
  end
  return now, not_after ~= nil and now > not_after
end

local LATE = 'ERR tollgate: late: the call reached Redis after its deadline; nothing was written'
local BAD_NOW = 'ERR tollgate: now must be "", whole microseconds in [0, 2^52), or "<" and whole microseconds'

-- Starts a call: its keys, no values of the last call's `now`, and the caches of texts and
-- numbers emptied where they hold more than CACHE_CAP entries.
local function decide_begin(keys)
  exact_begin(keys)
  window_period, state_now_value = nil, nil
  if decide_numbers_held > CACHE_CAP then
    decide_numbers, decide_numbers_held = {}, 0
  end
  if decide_texts_held > CACHE_CAP then
    decide_texts, decide_texts_held = {}, 0
  end
end
