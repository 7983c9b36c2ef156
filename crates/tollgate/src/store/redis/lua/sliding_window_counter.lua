-- Twin of tollgate_core::sliding_window_counter. Hash state: x = window index, y = current,
-- z = previous.
--
-- Rust tests `charged * period + previous * (period - e) <= limit * period` in u128. With
-- previous * (period - e) = q * period + r (muldivmod, q <= previous), that is exactly
-- `charged + ceil(previous * (period - e) / period) <= limit`, all below 2^53.

local sliding_window_counter_decide, sliding_window_counter_expires
local sliding_window_counter_refund

-- Builds the twin (see state.lua). Returns decide, expires, refund.
local function sliding_window_counter_twin(divmod, muldivmod, nonneg)
  local function reset_after(current, previous, period, to_end)
    if current > 0 then
      return period + to_end
    end
    if previous > 0 then
      return to_end
    end
    return 0
  end

  -- Least elapsed time e in a window with counts (charged, weighed) where the request fits
  -- (`weighed * (period - e) <= (limit - charged) * period`), or nil. When the room is at least
  -- `weighed` the quotient is at least `period` and e is 0, so muldivmod only sees quotients
  -- below `period`.
  local function least_elapsed(limit, period, charged, weighed)
    if charged > limit then
      return nil
    end
    local room = limit - charged
    if weighed == 0 or room >= weighed then
      return 0
    end
    local decayed = muldivmod(room, period, weighed)
    if decayed < 1 then
      return nil
    end
    return period - decayed
  end

  -- Returns verdict, remaining, reset_after, retry_after, delay, then the new (x, y, z) if
  -- allowed. `w`, `cur`, `prev` are nil for an empty (or foreign) state.
  local function decide(w, cur, prev, now, limit, period, cost)
    local window, elapsed = divmod(now, period)
    -- A clock stepped back into the window before the stored one decides at the stored
    -- window's start; its durations are then longer by the step (`late`).
    local late = 0
    if w and w == window + 1 then
      late, window, elapsed = w * period - now, w, 0
    end
    local current, previous = 0, 0
    if w == window then
      current, previous = cur, prev
    elseif w and w + 1 == window then
      previous = cur
    end
    local to_end = period - elapsed
    local q, r = muldivmod(previous, to_end, period)
    local weighted = r > 0 and q + 1 or q
    local wait = to_end + late -- to the end of the window, from now
    local reset = reset_after(current, previous, period, wait)
    if cost > limit then
      return 2, nonneg(limit - current - weighted), reset, -1, 0
    end
    local charged = current + cost
    if charged + weighted <= limit then
      return 0, limit - charged - weighted, reset_after(charged, previous, period, wait), -1, 0,
        window, charged, previous
    end
    local retry
    local e = least_elapsed(limit, period, charged, previous)
    if e and e > elapsed then
      retry = e - elapsed
    else
      e = least_elapsed(limit, period, cost, current)
      if e then
        retry = to_end + e
      else
        retry = period + to_end
      end
    end
    return 1, nonneg(limit - current - weighted), reset, retry + late, 0
  end

  -- State::expires_at.
  local function expires(w, current, previous, period)
    if current > 0 then
      return (w + 2) * period
    end
    if previous > 0 then
      return (w + 1) * period
    end
    return 0
  end

  -- Undoes `cost` charged at `now`: from the window it landed in, which is `previous` once the
  -- window has rolled, and nothing if it is older. Returns the new (x, y, z), or nil.
  local function refund(w, current, previous, now, period, cost)
    if cost <= 0 then
      return nil
    end
    local window = divmod(now, period)
    if w == window and current > 0 then
      return w, nonneg(current - cost), previous
    end
    if w == window + 1 and previous > 0 then
      return w, current, nonneg(previous - cost)
    end
  end

  return decide, expires, refund
end
