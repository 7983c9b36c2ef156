-- tollgate DECIDE, one request: decides (and, if admitted, commits) every limit of it. The
-- drivers (decide_one.lua, decide_batch.lua) read the arguments and call decide_request.
--
-- decide_request(first, n, arg, commit, now): the request's n charges are KEYS[first + i] with
-- 6 arguments each from ARGV[arg + 6 * (i - 1)]: algorithm (1 fixed_window, 2
-- sliding_window_log, 3 sliding_window_counter, 4 token_bucket, 5 leaky_bucket, 6 gcra),
-- limit, period_us, burst, cost, flags (the sum of 1 enforced, 2 charging up to the limit, 4
-- quota mode, 8 a check answers as the state stands). A cost of 0 is a check, which charges
-- nothing. commit: write if admitted; now: whole microseconds since the epoch.
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
-- Returns {now_us, admitted (1/0), then per charge: verdict (0 allowed, 1 denied, 2 cost
-- exceeds capacity), remaining, reset_after_us, retry_after_us (-1 when none), delay_us,
-- charged (the units an allowed charge takes, written if the request commits: its cost, or
-- what was left when it charges up to the limit; 0 for a check or a denial)}.
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
  return fmod(flags, bit * 2) >= bit
end

local function decide_request(first, n, arg, commit, now)
  local out = { now, 1 }
  local contexts = {} -- charge index -> its key's context
  local opened = {} -- distinct contexts, in order
  local admitted = 1
  local quotas, quota_passes = false, false
  for i = 1, n do
    local a = arg + 6 * (i - 1)
    local alg, limit, period = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local burst, cost, flags = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
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
      c.tag, c.x, c.y, c.z, c.l, c.p = alg, nx, ny, nz, limit, period
      c.base, c.T, c.dirty, c.ep = false, 0, true, period
    end
    local charged = 0
    if verdict == 0 then
      charged = cost -- what was left, for a charge up to the limit; 0 for a check
    end
    local o = 6 * i - 3
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
  out[2] = admitted

  if admitted == 0 then
    -- Nothing is charged: a limit that allowed its charge answers with its figures as they
    -- stand (tollgate_core::as_is, on the state read afresh: the contexts hold this call's
    -- tentative charges), not as after a charge that is never made.
    for i = 1, n do
      local o = 6 * i - 3
      if out[o] == 0 and out[o + 5] > 0 then
        local a = arg + 6 * (i - 1)
        local alg = tonumber(ARGV[a])
        local c = state_open(KEYS[first + i], alg == 2)
        -- Allowed still, without a retry, even over a state fuller than the limit.
        local _, remaining, reset = decide_charge(c, alg, now, tonumber(ARGV[a + 1]),
          tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), 0)
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
  return out
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
