-- Helpers shared by the rate-limit algorithms, included by rl_decide.lua (not run alone).
-- Each algorithm file included after this one registers itself in `algorithms` by kind.
-- One whose state is a string sets `string_state`: rl_decide.lua reads it, and its commit
-- returns the new state and how long it matters (us) for rl_decide.lua to write. Others
-- read and write their own key, and their commit returns nothing.
-- Times are integer microseconds and counts integer units, held in Lua's doubles:
-- every value stays below 2^53, so each one is exact.

-- floor(a / b) for integers a >= 0, b > 0, exact even where a / b rounds up.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- Integers as decimal strings ('%.14g', Lua's default, would round big ones; '%d' formats
-- a C long, exact for every value here). redis.call formats number arguments exactly.
local function fmt(n)
  return string.format('%d', n)
end

-- A TTL in ms covering us microseconds (at least 1 ms), plus the grace period.
local function ttl_ms(us, grace_ms)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  return ms + grace_ms
end

local algorithms = {}
