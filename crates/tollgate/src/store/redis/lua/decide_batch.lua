-- tollgate DECIDE driver for a batch of requests (see decide.lua): concurrent decisions bound
-- for one Redis server share one call. Each request is decided on its own, in order, against
-- the state the requests before it left; all at one `now`.
--
-- decide_batch(keys, ARGV), run by `return decide_batch(KEYS, ARGV)` (decide_batch_eval.lua,
-- for EVALSHA) or registered as a function of a library (FCALL: Redis runs a script's whole
-- body on every EVALSHA, ~70,000 instructions a call for this one, and a library's once).
--
-- keys     the requests' keys back to back, n per request.
-- ARGV[1]  now as decide_one.lua takes it (a batch past its "<D" writes nothing).
-- then one per request: its words separated by single spaces, commit ("1" / "0"), n (its
--          charges), then 6 per charge as decide_request takes them.
--
-- Returns one flat array: the call's now, then each request's reply in order, one of
--   -1 and a message   a request that failed (a key of a foreign type, or the whole batch
--                      late); it wrote nothing, and the others are unaffected;
--   -2, remaining, reset_after_us, charged
--                      the short form of the common answer: one charge, admitted and allowed,
--                      with no retry and no delay (its decide_request reply is now, 1, 0,
--                      remaining, reset_after_us, -1, 0, charged);
--   else its decide_request reply (2 + 6 * n numbers).
--
-- One argument per request rather than 2 + 6 * n, one array rather than one per request, and
-- the short form: Redis spends about 700 instructions on each argument it hands a script,
-- about 450 on each number of a reply and about 3,900 on each table of it besides its elements
-- (it looks for six special fields in each), which together cost more than the deciding. A
-- batch's requests are mostly of one rule, so their words are split once per distinct request
-- text.

-- The reply array, kept from call to call (a function library's locals outlive its calls; under
-- EVALSHA it is made anew each time): a table grows by rehashing, about 1,500 instructions a
-- decision for a batch's 8 numbers each. Redis reads a reply array up to its first nil, which
-- each call puts after its last element; the elements past it are a longer batch's, unread.
local batch_out = {}

-- Each request text's words and plan (decide_plan keeps it in them), split once: both are
-- functions of the text alone, so they are kept from call to call as decide.lua's caches are,
-- and emptied past CACHE_CAP texts.
local words_of, words_held = {}, 0

local function decide_batch(keys, ARGV)
  decide_begin(keys)
  local now, late = decide_now(ARGV[1])
  if not now then
    return redis.error_reply(BAD_NOW)
  end
  local out = batch_out
  out[1] = now
  if late then
    local requests = #ARGV - 1
    for r = 1, requests do
      out[2 * r], out[2 * r + 1] = -1, LATE
    end
    out[2 * requests + 2] = nil
    return out
  end
  local gmatch = string.gmatch
  if words_held > CACHE_CAP then
    words_of, words_held = {}, 0
  end
  local base, first = 2, 0
  for r = 2, #ARGV do
    local text = ARGV[r]
    local A = words_of[text]
    if not A then
      A = {}
      local k = 0
      for word in gmatch(text, '[^ ]+') do
        k = k + 1
        A[k] = word
      end
      words_of[text], words_held = A, words_held + 1
    end
    local n = decide_numbers[A[2]] or decide_number(A[2])
    local ok, written -- the reply's length, or the error raised
    if n == 1 then
      ok, written = pcall(decide_single, out, base, A, first, 3, A[1] == '1', now)
    else
      ok, written = pcall(decide_request, out, base, A, first, n, 3, A[1] == '1', now)
    end
    if ok then
      base = base + written
    else
      -- What the request wrote of its reply goes: the next one's starts after the message.
      for k = base + 2, base + 1 + 6 * n do
        out[k] = nil
      end
      out[base], out[base + 1] = -1, type(written) == 'table' and written.err or tostring(written)
      base = base + 2
    end
    first = first + n
  end
  out[base] = nil
  return out
end
