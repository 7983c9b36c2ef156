-- A packed layout: the window's start and count in one string, read with GET and written with
-- one SET ... PXAT (a write and its expiry in one call).
local now = tonumber(ARGV[1])
local period, limit = 1000000, 1000000
local start = now - now % period
local out = {}
for i = 1, #KEYS do
  local held = redis.call('GET', KEYS[i])
  local used = 0
  if held then
    local s, n = string.match(held, '^(%d+):(%d+)$')
    if tonumber(s) == start then used = tonumber(n) end
  end
  if used < limit then
    local expiry = math.floor((start + period) / 1000) + 1
    redis.call('SET', KEYS[i], start .. ':' .. (used + 1), 'PXAT', expiry)
  end
  out[i] = limit - used - 1
end
return out
