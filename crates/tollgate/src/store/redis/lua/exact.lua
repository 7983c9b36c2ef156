-- tollgate: exact integer arithmetic on Lua doubles, shared by every twin.
--
-- Lua numbers are doubles: integers are exact only below 2^53. The Rust core works in u128
-- "scaled" units (micros * limit) that go far past that, so the twins never form those numbers.
-- An instant on the scaled clock is a pair (w, f) meaning w * limit + f with 0 <= f < limit:
-- whole microseconds plus a remainder in 1/limit µs. Products that may pass 2^53 (limit *
-- period reaches ~3.5e25) go through `muldivmod`, whose intermediates all stay below 2^53.
--
-- Bounds the caller guarantees (checked in Rust by `script::fits_lua`, `now` by the driver):
-- now < 2^52 µs, limit and burst <= 1e12, period <= 400 days (< 2^45 µs), and for the
-- meters (token bucket, leaky bucket, GCRA) burst * period / limit <= 2^50 µs. Then every
-- pair's whole part stays below now + 2^51 < 2^53.

-- The call's keys and the standard functions the helpers use, set as each call starts
-- (`exact_begin`): a function library (decide_batch.lua under FCALL) is loaded with no standard
-- library in reach, and its locals outlive its calls. redis_call and redis_pcall are
-- redis.call and redis.pcall, for the hot paths (an upvalue is one step, a global's field two).
local call_keys, fmod, format, sub, redis_call, redis_pcall
local function exact_begin(keys)
  call_keys, fmod, format, sub = keys, math.fmod, string.format, string.sub
  redis_call, redis_pcall = redis.call, redis.pcall
end
local TWO52 = 4503599627370496
local TWO53 = 9007199254740992

-- An integer as decimal digits, for arguments Redis parses as integers or as range bounds
-- (Lua's own number-to-string keeps 14 significant digits: 1800000000000001 -> "1.8e+15").
local function int(x)
  return format('%d', x)
end

-- floor(a / m), a mod m, exactly, for integers 0 <= a < 2^53 and 1 <= m < 2^53: fmod is exact
-- in IEEE arithmetic, and a - r is a multiple of m below 2^53, so the division is exact too.
--
-- Lua's own `a % m` (a - floor(a / m) * m, no function call) is exact when a + m <= 2^53: with
-- k = floor(a / m), the quotient a / m rounds to at least k, and not up to k + 1, which is at
-- least 1/m away while half a unit in the last place there is below (k + 1) / 2^53 <= 1/m.
local function divmod(a, m)
  local r = fmod(a, m)
  return (a - r) / m, r
end

-- ceil(a / m) for the same range.
local function div_ceil(a, m)
  local r = fmod(a, m)
  if r > 0 then
    return (a - r) / m + 1
  end
  return a / m
end

local function nonneg(x)
  if x < 0 then
    return 0
  end
  return x
end

-- floor(a * b / m), a * b mod m for a, b < m <= 2^46: Horner's rule over the base-d digits of
-- b, with d = floor(2^52 / m) >= 64, so each step r * d + a * digit < 2 * m * d <= 2^53.
-- Recursion depth is the number of digits: at most 8.
local horner
horner = function(a, b, m, d)
  if b < d then
    local p = a * b
    local r = fmod(p, m)
    return (p - r) / m, r
  end
  local digit = fmod(b, d)
  local q, r = horner(a, (b - digit) / d, m, d)
  local t = r * d + a * digit
  local r2 = fmod(t, m)
  return q * d + (t - r2) / m, r2
end

-- floor(a * b / m), a * b mod m, exactly, for integers 0 <= a, b < 2^53 and 1 <= m <= 2^46
-- whose quotient is below 2^53.
local function muldivmod(a, b, m)
  local p = a * b
  -- Rounding is monotone and 2^53 is a double: the rounded product is below 2^53 only when
  -- the exact one is, and then it is exact.
  if p < TWO53 then
    local r = fmod(p, m)
    return (p - r) / m, r
  end
  -- a * b = (qa*m + ra) * (qb*m + rb) = (qa*b + ra*qb) * m + ra*rb. Both parts of the quotient
  -- are at most the whole quotient, so below 2^53 and exact.
  local ra = fmod(a, m)
  local rb = fmod(b, m)
  local q = (a - ra) / m * b + ra * ((b - rb) / m)
  p = ra * rb
  if p < TWO53 then
    local r = fmod(p, m)
    return q + (p - r) / m, r
  end
  local q2, r = horner(ra, rb, m, (TWO52 - fmod(TWO52, m)) / m)
  return q + q2, r
end

-- ceil((w * limit + f) / limit): a scaled amount in whole microseconds, rounded up.
local function ceil_us(w, f)
  if f > 0 then
    return w + 1
  end
  return w
end
