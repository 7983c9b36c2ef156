-- Twin of tollgate_core::leaky_bucket: GCRA's admission (the meter in gcra.lua) plus the delay
-- ceil(backlog / limit). Hash state: x, y = when the queue runs dry, as a scaled pair; z = when
-- it was written; l, p = the limit and period it was written under, as GCRA's.

local leaky_bucket_decide, leaky_bucket_expires, leaky_bucket_refund

-- Builds the twin on the meter (see state.lua). Returns decide, expires, refund.
local function leaky_bucket_twin(ahead, meter, rewind, ceil_us, converted)
  -- The drain time (empty_w, empty_f) was written at `written` under wl per wp µs. Returns
  -- verdict, remaining, reset_after, retry_after, delay, then the new (x, y, z) if allowed.
  local function decide(empty_w, empty_f, written, wl, wp, now, limit, period, burst, cost)
    empty_w, empty_f = converted(empty_w, empty_f, written, wl, wp, limit, period, burst)
    local bw, bf = ahead(empty_w, empty_f, now, limit)
    local verdict, remaining, reset, retry, nw, nf = meter(bw, bf, limit, period, burst, cost)
    if verdict == 0 then
      return 0, remaining, reset, -1, ceil_us(bw, bf), now + nw, nf, now
    end
    return verdict, remaining, reset, retry, 0
  end

  -- State::expires_at: ceil(empty_at_scaled / limit).
  local function expires(empty_w, empty_f)
    return ceil_us(empty_w, empty_f)
  end

  -- Moves the drain time back by the charge's increment, never before the charge instant.
  local function refund(empty_w, empty_f, now, limit, period, burst, cost)
    return rewind(empty_w, empty_f, now, limit, period, burst, cost)
  end

  return decide, expires, refund
end
