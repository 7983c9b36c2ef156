-- tollgate DECIDE: decides (and, if admitted, commits) every limit of one request.
--
-- KEYS[i]  the counter key of charge i. All keys of one call share a hash slot; no other key
--          is touched. The same key may appear more than once.
-- ARGV[1]  "1": commit if admitted; "0": decide only, never write.
-- ARGV[2]  now in microseconds since the epoch, or "" to read the server's TIME.
-- then 6 per charge i, from ARGV[3 + 6 * (i - 1)]:
--          algorithm (1 fixed_window, 2 sliding_window_log, 3 sliding_window_counter,
--          4 token_bucket, 5 leaky_bucket, 6 gcra), limit, period_us, burst, cost,
--          enforce ("1" / "0").
--
-- Every charge is decided against the current state; charges on the same key are decided in
-- order, each seeing the tentative effect of the earlier ones. The call is admitted when every
-- charge with enforce = 1 is allowed; then, if ARGV[1] is "1", every allowed charge is
-- committed (denied ones consume nothing); otherwise nothing is written. All reads happen
-- before the first write, so an error (a key of a foreign type) leaves every key unchanged.
-- Every key written gets PEXPIREAT at ceil(expires_at / 1000) ms, expires_at being Rust's
-- State::expires_at of the new state; a state already expired at `now` is deleted instead.
--
-- Returns {now_us, admitted (1/0), then per charge: verdict (0 allowed, 1 denied, 2 cost
-- exceeds capacity), remaining, reset_after_us, retry_after_us (-1 when none), delay_us}.
--
-- Storage: see state.lua (hash layout) and each algorithm's file (fields, sliding-log ZSET).

local commit = ARGV[1] == '1'
local now
if ARGV[2] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[2])
end
if not now or now < 0 or now >= TWO52 or fmod(now, 1) ~= 0 then
  return redis.error_reply('ERR tollgate: now must be whole microseconds in [0, 2^52)')
end

local out = { now, 1 }
local contexts = {} -- charge index -> its key's context
local opened = {} -- distinct contexts, in order
local admitted = 1
for i = 1, #KEYS do
  local a = 6 * i - 3
  local alg, limit, period = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local burst, cost = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local key = KEYS[i]
  state_build_twin(alg)
  local c = state_context(i, alg, contexts, opened)

  local verdict, remaining, reset, retry, delay, nx, ny, nz
  if alg == 2 then
    verdict, remaining, reset, retry, delay, nx =
      sliding_window_log_decide(c, now, limit, period, cost)
    if nx then
      sliding_window_log_apply(c, period, cost)
    end
  else
    local x, y, z
    if c.tag == alg then
      x, y, z = c.x, c.y, c.z
    end
    if alg == 1 then
      verdict, remaining, reset, retry, delay, nx, ny =
        fixed_window_decide(x, y, now, limit, period, cost)
    elseif alg == 3 then
      verdict, remaining, reset, retry, delay, nx, ny, nz =
        sliding_window_counter_decide(x, y, z, now, limit, period, cost)
    elseif alg == 4 then
      verdict, remaining, reset, retry, delay, nx, ny, nz =
        token_bucket_decide(x, y, z, now, limit, period, burst, cost)
    elseif alg == 5 then
      verdict, remaining, reset, retry, delay, nx, ny =
        leaky_bucket_decide(x, y, now, limit, period, burst, cost)
    elseif alg == 6 then
      verdict, remaining, reset, retry, delay, nx, ny =
        gcra_decide(x, y, now, limit, period, burst, cost)
    else
      return redis.error_reply('ERR tollgate: unknown algorithm code ' .. tostring(ARGV[a]))
    end
    if nx then
      c.tag, c.x, c.y, c.z = alg, nx, ny, nz
      c.base, c.T, c.dirty, c.ep = false, 0, true, period
    end
  end
  local o = 5 * i - 2
  out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4] = verdict, remaining, reset, retry, delay
  if verdict ~= 0 and ARGV[a + 5] == '1' then
    admitted = 0
  end
end
out[2] = admitted

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
