-- tollgate DECIDE driver for a batch of requests (see decide.lua): concurrent decisions bound
-- for one Redis server share one call. Each request is decided on its own, in order, against
-- the state the requests before it left; all at one `now`.
--
-- ARGV[1]  now as decide_one.lua takes it (a batch past its "<D" writes nothing).
-- ARGV[2]  the number of requests m.
-- then per request: n (its charges), commit ("1" / "0"), then 6 per charge as decide_request
--          takes them. KEYS holds the requests' keys back to back, n per request.
--
-- Returns m replies in order: decide_request's reply, or {-1, message} for a request that
-- failed (a key of a foreign type, or the whole batch late). A failed request wrote nothing;
-- the others are unaffected.

local now, late = decide_now(ARGV[1])
if not now then
  return redis.error_reply(BAD_NOW)
end
local m = tonumber(ARGV[2])
local replies = {}
if late then
  for r = 1, m do
    replies[r] = { -1, LATE }
  end
  return replies
end
local first, arg = 0, 3
for r = 1, m do
  local n = tonumber(ARGV[arg])
  local ok, reply
  if n == 1 then
    ok, reply = pcall(decide_single, first, arg + 2, ARGV[arg + 1] == '1', now)
  else
    ok, reply = pcall(decide_request, first, n, arg + 2, ARGV[arg + 1] == '1', now)
  end
  if ok then
    replies[r] = reply
  else
    replies[r] = { -1, type(reply) == 'table' and reply.err or tostring(reply) }
  end
  first, arg = first + n, arg + 2 + 6 * n
end
return replies
