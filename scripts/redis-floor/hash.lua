-- The floor of today's layout: a fixed window per key in a hash, read with HMGET and written
-- with HSET and PEXPIREAT, in the least Lua that decides it (no params, no reply format).
-- KEYS: the batch's keys; ARGV[1]: now (µs). Returns each key's remaining units.
local now = tonumber(ARGV[1])
local period, limit = 1000000, 1000000
local start = now - now % period
local out = {}
for i = 1, #KEYS do
  local held = redis.call('HMGET', KEYS[i], 'c', 's')
  local used = 0
  if tonumber(held[2]) == start then used = tonumber(held[1]) end
  if used < limit then
    redis.call('HSET', KEYS[i], 'c', used + 1, 's', start)
    redis.call('PEXPIREAT', KEYS[i], math.floor((start + period) / 1000) + 1)
  end
  out[i] = limit - used - 1
end
return out
