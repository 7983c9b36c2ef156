-- Twin of tollgate_core::gcra, and the meter arithmetic that token_bucket.lua and
-- leaky_bucket.lua share with it. Hash state: x, y = the theoretical arrival time as a scaled
-- pair (tat = x * l + y, 0 <= y < l); z = when it was written (µs); l, p = the limit and
-- period (µs) it was written under (state.lua). A state written before l and p were recorded
-- (its z was a tolerance) is read as written under the current params.
--
-- Rust keeps tat_scaled = micros * limit in u128; here it is (whole µs, remainder in 1/limit
-- µs), so now_scaled is (now, 0) for free. The tolerance burst * period and the increment
-- cost * period become pairs through muldivmod; `remaining` needs one more muldivmod.

local meter_ahead, meter_decide, meter_refund, meter_converted
local gcra_decide, gcra_expires, gcra_refund

-- Builds the meter (see state.lua). Returns ahead, decide, refund, converted.
local function meter_twin(fmod, divmod, muldivmod, ceil_us)
  -- The tolerance burst * period as a pair (whole µs, remainder in 1/limit µs). The last one
  -- is kept: a twin reads it for the state (converted), then the meter for the decision,
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

  -- The scaled instant (w, f) of a state written at `from` (whole µs) under wl per wp µs, as an
  -- instant of the current params, as tollgate_core::State converts it: its backlog at `from`
  -- (the units used then, a unit being wp scaled units) as units of the current params,
  -- ceil(used * period / wp), capped at the tolerance burst * period, added to `from`. The
  -- identity under the same limit and period when the backlog fits; wl nil (a state written
  -- before the params were recorded) reads as written under the current ones.
  local function converted(w, f, from, wl, wp, limit, period, burst)
    if not w or not wl then
      return w, f
    end
    local tw, tf = tolerance(limit, period, burst)
    w, f = carried(w, f, wl)
    local aw, af = 0, 0
    if w >= from then
      aw, af = w - from, f
    end
    if wl == limit and wp == period then
      if aw > tw or (aw == tw and af > tf) then
        return from + tw, tf
      end
      return w, f
    end
    -- The backlog aw * wl + af: q whole units and s scaled units left over (below wp).
    local q, s = muldivmod(aw, wl, wp)
    s = s + af
    if s >= wp then
      local q2
      q2, s = divmod(s, wp)
      q = q + q2
    end
    if q >= burst then
      return from + tw, tf
    end
    -- q * period + ceil(s * period / wp) scaled units of the current limit, as a pair.
    local qw, qf = muldivmod(q, period, limit)
    local c, m = muldivmod(s, period, wp)
    if m > 0 then
      c = c + 1
    end
    local cw, cf = divmod(c, limit)
    aw, af = qw + cw, qf + cf
    if af >= limit then
      aw, af = aw + 1, af - limit
    end
    if aw > tw or (aw == tw and af > tf) then
      return from + tw, tf
    end
    return from + aw, af
  end

  return ahead, decide, refund, converted
end

-- Builds the twin on the meter. Returns decide, expires, refund.
local function gcra_twin(ahead, meter, rewind, ceil_us, converted)
  -- The TAT (tat_w, tat_f) was written at `written` under wl per wp µs. Returns verdict,
  -- remaining, reset_after, retry_after, delay, then the new (x, y, z) if allowed.
  local function decide(tat_w, tat_f, written, wl, wp, now, limit, period, burst, cost)
    tat_w, tat_f = converted(tat_w, tat_f, written, wl, wp, limit, period, burst)
    local aw, af = ahead(tat_w, tat_f, now, limit)
    local verdict, remaining, reset, retry, nw, nf = meter(aw, af, limit, period, burst, cost)
    if verdict == 0 then
      return 0, remaining, reset, -1, 0, now + nw, nf, now
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
