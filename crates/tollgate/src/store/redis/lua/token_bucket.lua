-- Twin of tollgate_core::token_bucket. Hash state: x = updated (µs), y, z = when the bucket is
-- full again, as a scaled pair (full_at = y * l + z = updated * l + missing, where missing =
-- the tokens used times p); l, p = the limit and period it was written under (state.lua).
--
-- Under other params the full instant is converted at `updated` (the meter's `converted`,
-- gcra.lua): the tokens used then, as tokens of the current params, as in Rust. Refilling e µs
-- removes e * limit from `missing`, so missing at `at` is max(full_at - at * limit, 0) and the
-- decision is the meter's with backlog = missing, plus `late` (the clock ran behind `updated`)
-- added to every duration, as in Rust.

local token_bucket_decide, token_bucket_expires, token_bucket_refund

-- Builds the twin on the meter (see state.lua). Returns decide, expires, refund.
local function token_bucket_twin(ahead, meter, rewind, ceil_us, converted)
  -- The state was written under wl per wp µs. Returns verdict, remaining, reset_after,
  -- retry_after, delay, then the new (x, y, z) if allowed.
  local function decide(updated, full_w, full_f, wl, wp, now, limit, period, burst, cost)
    local at = now
    if updated and updated > now then
      at = updated
    end
    local late = at - now
    if updated then
      full_w, full_f = converted(full_w, full_f, updated, wl, wp, limit, period, burst)
    end
    local mw, mf = ahead(full_w, full_f, at, limit)
    local verdict, remaining, reset, retry, nw, nf = meter(mw, mf, limit, period, burst, cost)
    if verdict == 0 then
      return 0, remaining, late + reset, -1, 0, at, at + nw, nf
    end
    if verdict == 1 then
      retry = late + retry
    end
    return verdict, remaining, late + reset, retry, 0
  end

  -- State::expires_at: updated + ceil(missing / limit) = ceil(full_at / limit).
  local function expires(full_w, full_f)
    return ceil_us(full_w, full_f)
  end

  -- Adds the tokens back, capped at burst: full_at moves back, never before `updated`.
  -- Returns the new (x, y, z), or nil.
  local function refund(updated, full_w, full_f, limit, period, burst, cost)
    local nw, nf = rewind(full_w, full_f, updated, limit, period, burst, cost)
    if nw then
      return updated, nw, nf
    end
  end

  return decide, expires, refund
end
