-- Twin of tollgate_core::gcra, and the meter arithmetic that token_bucket.lua and
-- leaky_bucket.lua share with it. Hash state: x, y = the theoretical arrival time as a scaled
-- pair (tat = x * limit + y, 0 <= y < limit); z = the tolerance it was written under, in whole
-- µs (Params::tolerance_micros; absent in a state written before it was recorded).
--
-- Rust keeps tat_scaled = micros * limit in u128; here it is (whole µs, remainder in 1/limit
-- µs), so now_scaled is (now, 0) for free. The tolerance burst * period and the increment
-- cost * period become pairs through muldivmod; `remaining` needs one more muldivmod.

local meter_ahead, meter_decide, meter_refund, meter_within, meter_capped
local gcra_decide, gcra_expires, gcra_refund

-- Builds the meter (see state.lua). Returns ahead, decide, refund, within, capped.
local function meter_twin(fmod, divmod, muldivmod, ceil_us)
  -- The tolerance burst * period as a pair (whole µs, remainder in 1/limit µs). The last one
  -- is kept: a twin reads it for the state (within, capped), then the meter for the decision,
  -- and a batch's charges mostly share their params.
  local t_limit, t_period, t_burst, t_w, t_f
  local function tolerance(limit, period, burst)
    if limit ~= t_limit or period ~= t_period or burst ~= t_burst then
      t_limit, t_period, t_burst = limit, period, burst
      t_w, t_f = muldivmod(burst, period, limit)
    end
    return t_w, t_f
  end

  -- The scaled instant (w, f) with a remainder >= limit (only after the limit of a live key
  -- changed) carried into whole microseconds.
  local function carried(w, f, limit)
    if f >= limit then
      local q
      q, f = divmod(f, limit)
      w = w + q
    end
    return w, f
  end

  -- How far the scaled instant (w, f) is ahead of `at`: the pair max(w * limit + f - at * limit,
  -- 0). `w` is nil for an empty state.
  local function ahead(w, f, at, limit)
    if not w then
      return 0, 0
    end
    w, f = carried(w, f, limit)
    if w < at then
      return 0, 0
    end
    return w - at, f
  end

  -- floor((tolerance - ahead) / period), 0 once ahead reaches the tolerance: the whole tokens
  -- (free queue units) left.
  local function remaining(aw, af, tw, tf, limit, period)
    local xw, xf = tw - aw, tf - af
    if xf < 0 then
      xw, xf = xw - 1, xf + limit
    end
    if xw < 0 then
      return 0
    end
    local q, r = muldivmod(xw, limit, period)
    local s = r + xf -- below period + limit
    return q + (s - fmod(s, period)) / period
  end

  -- Decides `cost` against a meter whose backlog is `ahead` = (aw, af) scaled units, with room
  -- for burst * period. Returns verdict, remaining, ceil(ahead / limit) (reset), retry_after,
  -- and the new backlog (nw, nf) when allowed.
  local function decide(aw, af, limit, period, burst, cost)
    local tw, tf = tolerance(limit, period, burst)
    if cost > burst then
      return 2, remaining(aw, af, tw, tf, limit, period), ceil_us(aw, af), -1
    end
    local cw, cf = muldivmod(cost, period, limit)
    local nw, nf = aw + cw, af + cf
    if nf >= limit then
      nw, nf = nw + 1, nf - limit
    end
    if nw < tw or (nw == tw and nf <= tf) then
      return 0, remaining(nw, nf, tw, tf, limit, period), ceil_us(nw, nf), -1, nw, nf
    end
    local rw, rf = nw - tw, nf - tf
    if rf < 0 then
      rw, rf = rw - 1, rf + limit
    end
    return 1, remaining(aw, af, tw, tf, limit, period), ceil_us(aw, af), ceil_us(rw, rf)
  end

  -- Moves the scaled instant (w, f) back by cost * period, but not before (floor_w, 0). Returns
  -- the new pair, or nil when nothing changes. A cost above burst moves it no further than
  -- burst does (the instant is never more than burst * period past its floor).
  local function refund(w, f, floor_w, limit, period, burst, cost)
    if cost <= 0 or w < floor_w or (w == floor_w and f == 0) then
      return nil
    end
    if cost > burst then
      cost = burst
    end
    local cw, cf = muldivmod(cost, period, limit)
    local nw, nf = w - cw, f - cf
    if nf < 0 then
      nw, nf = nw - 1, nf + limit
    end
    if nw < floor_w then
      nw, nf = floor_w, 0
    end
    return nw, nf
  end

  -- The instant (w, f), written under a tolerance of z whole µs (nil or 0: not recorded),
  -- moved earlier by however much the current tolerance burst * period (scaled) is smaller, as
  -- tollgate_core::State reads it: never further ahead than the current params can put it.
  -- Returns the pair, and the current tolerance in whole µs (what a write records).
  local function within(w, f, z, limit, period, burst)
    local tw, tf = tolerance(limit, period, burst)
    if not w or not z or z <= tw then
      return w, f, tw
    end
    -- The shift z * limit - (tw * limit + tf), as a pair.
    local sw, sf = z - tw, -tf
    if sf < 0 then
      sw, sf = sw - 1, sf + limit
    end
    w, f = carried(w, f, limit)
    local nw, nf = w - sw, f - sf
    if nf < 0 then
      nw, nf = nw - 1, nf + limit
    end
    if nw < 0 then
      return 0, 0, tw
    end
    return nw, nf, tw
  end

  -- The instant (w, f), no later than `from` plus the tolerance burst * period: a token
  -- bucket's full instant, written at `from` under params with a longer refill, is at most
  -- empty under the current ones. Returns the pair.
  local function capped(w, f, from, limit, period, burst)
    if not w then
      return w, f
    end
    local tw, tf = tolerance(limit, period, burst)
    w, f = carried(w, f, limit)
    local cw = from + tw
    if w > cw or (w == cw and f > tf) then
      return cw, tf
    end
    return w, f
  end

  return ahead, decide, refund, within, capped
end

-- Builds the twin on the meter. Returns decide, expires, refund.
local function gcra_twin(ahead, meter, rewind, ceil_us, within)
  -- Returns verdict, remaining, reset_after, retry_after, delay, then the new (x, y, z) if
  -- allowed.
  local function decide(tat_w, tat_f, tolerance, now, limit, period, burst, cost)
    local tw
    tat_w, tat_f, tw = within(tat_w, tat_f, tolerance, limit, period, burst)
    local aw, af = ahead(tat_w, tat_f, now, limit)
    local verdict, remaining, reset, retry, nw, nf = meter(aw, af, limit, period, burst, cost)
    if verdict == 0 then
      return 0, remaining, reset, -1, 0, now + nw, nf, tw
    end
    return verdict, remaining, reset, retry, 0
  end

  -- State::expires_at: ceil(tat_scaled / limit).
  local function expires(tat_w, tat_f)
    return ceil_us(tat_w, tat_f)
  end

  -- Moves the arrival time back by the charge's increment, never before the charge instant.
  local function refund(tat_w, tat_f, now, limit, period, burst, cost)
    return rewind(tat_w, tat_f, now, limit, period, burst, cost)
  end

  return decide, expires, refund
end
