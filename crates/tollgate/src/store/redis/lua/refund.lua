-- tollgate REFUND: takes back charges a DECIDE call committed (Redis Cluster: a request whose
-- limits span several slots is refunded on the slots that charged when another slot denied).
--
-- KEYS     the keys to refund (the same key may appear more than once).
-- ARGV[1]  the now_us the DECIDE call used when it charged.
-- then 5 per key i, from ARGV[2 + 5 * (i - 1)]: algorithm, limit, period_us, burst, cost.
--
-- Undoes one charge of `cost` made at that instant: exactly when nothing else touched the key
-- since, conservatively otherwise. Fixed window and sliding counter decrement the window the
-- charge landed in (the counter's previous one if the window has rolled, nothing if older);
-- the sliding log takes `cost` back from its entries at that instant (newest first); the token
-- bucket gets the tokens back (capped at burst); GCRA and the leaky bucket move their time
-- back by cost * period, never before the charge instant; a bucket written under another limit
-- or period than the refund's (a reload since the charge) is left alone. A hash made after the charge instant
-- (Redis lost the counter charged and a new one was made) is left alone, as the sliding log
-- has no entries at that instant then. TTLs follow the new state (a state
-- that has expired is deleted). A key of another algorithm is left alone; a key of a foreign
-- Redis type fails the call before anything is written.
--
-- Returns the number of distinct keys whose state changed.

exact_begin(KEYS)
local now = tonumber(ARGV[1])
if not now or now < 0 or now >= TWO52 or fmod(now, 1) ~= 0 then
  return redis.error_reply('ERR tollgate: now must be whole microseconds in [0, 2^52)')
end

local contexts = {}
local opened = {}
for i = 1, #KEYS do
  local a = 5 * i - 3
  local alg, limit, period = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local burst, cost = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  state_build_twin(alg)
  local c = state_context(0, i, alg, contexts, opened)

  -- A hash made after the charge is a counter made anew since (Redis lost the one charged):
  -- taking the charge back from it would credit units other requests used.
  if c.tag == alg and not (c.born and c.born > now) then
    local nx, ny, nz
    if alg == 2 then
      if cost > 0 then
        c.R, c.ep = (c.R or 0) + cost, period
      end
    elseif alg == 1 then
      nx, ny = fixed_window_refund(c.x, c.y, now, period, cost)
    elseif alg == 3 then
      nx, ny, nz = sliding_window_counter_refund(c.x, c.y, c.z, now, period, cost)
    elseif c.l and (c.l ~= limit or c.p ~= period) then
      -- A bucket written under other params since the charge: a reload converted what it had
      -- used, and the charge is no longer one of its units to take back (nothing changes).
    elseif alg == 4 then
      nx, ny, nz = token_bucket_refund(c.x, c.y, c.z, limit, period, burst, cost)
    elseif alg == 5 then
      nx, ny = leaky_bucket_refund(c.x, c.y, now, limit, period, burst, cost)
      nz = c.z
    elseif alg == 6 then
      nx, ny = gcra_refund(c.x, c.y, now, limit, period, burst, cost)
      nz = c.z
    end
    if nx then
      if alg >= 5 and not c.l then
        nz = now -- a state from before the params were recorded: its z was no instant
      end
      if not c.dirty then
        c.oe = state_stored_ms(c, alg)
      end
      c.x, c.y, c.z, c.dirty, c.ep = nx, ny, nz, true, period
      c.l, c.p = limit, period
    end
  end
end

for k = 1, #opened do
  local c = opened[k]
  if c.R and c.base then
    sliding_window_log_refund_prepare(c, now)
  end
end
local refunded = 0
for k = 1, #opened do
  local c = opened[k]
  if c.R and c.base then
    if sliding_window_log_refund_commit(c, now) then
      refunded = refunded + 1
    end
  elseif c.dirty then
    state_commit_hash(c, now)
    refunded = refunded + 1
  end
end
return refunded
