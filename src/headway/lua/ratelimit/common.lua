-- The rate-limit library script: included by ratelimit/decide.lua, decide_one.lua and
-- lease.lua, after clock.lua (never run alone).
-- NEEDS    from clock: server_now_us
-- DEFINES (locals every later part of the script may use, and nothing else):
--   call_clock(arg)       now (us) and grace_ms of a call whose clock argument (ARGV[1];
--                         decide_one.lua's ARGV[4], or "" when absent) is arg: "" reads
--                         the server's TIME, grace 0 (always, in production); an integer
--                         of us is the differential tests' clock, and every TTL then gets
--                         a 60 s grace, as that clock is not Redis's
--   idiv(a, b)            floor(a / b) for integers a >= 0, b > 0, exact
--   fmt(n)                an integer as an exact decimal string
--   ttl_ms(us, grace_ms)  a TTL in ms covering us microseconds (>= 1 ms), plus grace_ms
--   algorithms            the registry: each algorithm fragment sets algorithms[kind] (its
--                         kind in ratelimit/algorithms.py) to a table with
--     string_state        true if its state is a string decide.lua reads and writes;
--                         else it reads and writes its own key itself
--     check(state, key, now, cost, a, b, charging)  the answer, without writing, as
--                         values: ok, remaining, reset, retry, remaining_after,
--                         reset_after, then up to three values x, y, z its commit takes.
--                         remaining and reset are before the charge, the _after ones
--                         after it (only read when ok); retry is 0 when ok. charging
--                         (decide_one.lua's charged call) says an admitting answer is
--                         reported after the charge only, so reset may be left out then.
--     commit(key, now, cost, a, b, x, y, z, grace_ms)  charge, given what check found:
--                         for a string state, returns the state to write, the TTL to
--                         give its key (us: at least as long as the state matters), and
--                         whether the key's TTL may be kept (decide_one.lua then writes
--                         with KEEPTTL): true when it covers the state already (a charge
--                         in the same window set it), a number of us when it does if
--                         PTTL still covers them (decide_one.lua asks), false to set it;
--                         nothing otherwise.
-- Values, not tables: a decision allocates as little as it can, as every allocation is
-- server time (made, then collected).
-- Times are integer microseconds and counts integer units, held in Lua's doubles:
-- every value stays below 2^53, so each one is exact.
-- Numeric strings (ARGV, stored states) become numbers by arithmetic (`s + 0`), the same
-- conversion as tonumber without a function call: ~900 server instructions fewer each.

local function call_clock(arg)
  if arg == '' then return server_now_us(), 0 end
  return arg + 0, 60000
end

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
