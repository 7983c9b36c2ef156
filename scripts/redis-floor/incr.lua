-- envoyproxy/ratelimit's way, in Lua: a key per window, INCRBY, and PEXPIRE on the first hit.
-- Not exact the way tollgate is: a denied request is counted too (the counter overshoots), so
-- a cost above 1 can be refused where it fits, and several limits of one request cannot be
-- charged all or nothing.
local now = tonumber(ARGV[1])
local period, limit = 1000000, 1000000
local start = now - now % period
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i] .. ':' .. start
  local used = redis.call('INCRBY', key, 1)
  if used == 1 then redis.call('PEXPIRE', key, period / 1000) end
  out[i] = limit - used
end
return out
