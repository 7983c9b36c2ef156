-- tollgate DECIDE driver for one request (see decide.lua).
--
-- KEYS[i]  the counter key of charge i. All keys of one call share a hash slot; no other key
--          is touched. The same key may appear more than once.
-- ARGV[1]  "1": commit if admitted; "0": decide only, never write.
-- ARGV[2]  now in microseconds since the epoch, "" to read the server's TIME, or "<D" to read it
--          and write nothing when it is past D (see decide_now).
-- then 6 per charge i, from ARGV[3 + 6 * (i - 1)], as decide_request takes them.
--
-- Returns decide_request's reply, or the LATE error.

exact_begin(KEYS)
local now, late = decide_now(ARGV[2])
if not now then
  return redis.error_reply(BAD_NOW)
end
if late then
  return redis.error_reply(LATE)
end
local out = {}
if #KEYS == 1 then
  if decide_single(out, 1, ARGV, 0, 3, ARGV[1] == '1', now) == 4 then
    -- The short form (see decide_request) written out: DECIDE answers in full.
    out[1], out[2], out[3], out[4], out[5], out[6], out[7], out[8] =
      now, 1, 0, out[2], out[3], -1, 0, out[4]
  end
else
  decide_request(out, 1, ARGV, 0, #KEYS, 3, ARGV[1] == '1', now)
end
return out
