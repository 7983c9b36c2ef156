-- Twin of tollgate_core::fixed_window. Hash state: x = window index (now / period), y = count.
-- No product leaves the 2^53 range: counts are at most limit + cost, times at most now + period.

local fixed_window_decide, fixed_window_expires, fixed_window_refund

-- Builds the twin (see state.lua on why twins are built per call, from helpers passed in).
-- Returns decide, expires, refund.
local function fixed_window_twin(divmod, nonneg)
  -- Returns verdict, remaining, reset_after, retry_after, delay, then the new (x, y) if allowed.
  -- `w`, `count` are nil for an empty (or foreign) state.
  local function decide(w, count, now, limit, period, cost)
    local window, elapsed = divmod(now, period)
    local to_end = period - elapsed
    if w and w == window + 1 then
      -- The clock stepped back into the window before the stored one: decide in the stored
      -- window, durations counted from now (fixed_window::decision_instant).
      window, to_end = w, w * period + period - now
    end
    if w ~= window then
      count = 0
    end
    if cost > limit then
      return 2, nonneg(limit - count), count > 0 and to_end or 0, -1, 0
    end
    local charged = count + cost
    if charged <= limit then
      return 0, limit - charged, charged > 0 and to_end or 0, -1, 0, window, charged
    end
    return 1, nonneg(limit - count), count > 0 and to_end or 0, to_end, 0
  end

  -- State::expires_at.
  local function expires(w, count, period)
    if count == 0 then
      return 0
    end
    return (w + 1) * period
  end

  -- Undoes `cost` charged at `now`: only while the count still belongs to that window.
  -- Returns the new (x, y), or nil when nothing changes.
  local function refund(w, count, now, period, cost)
    local window = divmod(now, period)
    if w == window and count > 0 and cost > 0 then
      return w, nonneg(count - cost)
    end
  end

  return decide, expires, refund
end
