-- The packed layout with the batch's reads in one MGET: one call to read every key, then one
-- SET ... PXAT per key charged.
local now = tonumber(ARGV[1])
local period, limit = 1000000, 1000000
local start = now - now % period
local held = redis.call('MGET', unpack(KEYS))
local out = {}
for i = 1, #KEYS do
  local used = 0
  if held[i] then
    local s, n = string.match(held[i], '^(%d+):(%d+)$')
    if tonumber(s) == start then used = tonumber(n) end
  end
  if used < limit then
    local expiry = math.floor((start + period) / 1000) + 1
    redis.call('SET', KEYS[i], start .. ':' .. (used + 1), 'PXAT', expiry)
  end
  out[i] = limit - used - 1
end
return out
